// sluice/yaml.hpp — loads a gateway policy config from YAML into the S8 structs
// (sluice/policy.hpp).
//
// Target `sluice::yaml` (links yaml-cpp). The layout mirrors the structs, one YAML key per member:
//
//   policies:
//     - name: public-api-limits
//       rate_limits:
//         - { name: per-ip, selector: [ip], requests_per: { s: 10, minute: 600 }, burst: 20 }
//   routes:
//     - { name: public, service: api-svc, path_prefix: /v1, policies: [public-api-limits] }
//   services:
//     - { name: api-svc }
//
//   absl::StatusOr<sluice::PolicyConfig> config = sluice::yaml::load_config_file("gateway.yaml");
//   if (!config.ok()) {
//     // s: 0 gives "gateway.yaml:4:60: policies[0].rate_limits[0].requests_per.s: must be > 0"
//     std::cerr << config.status().message() << '\n';
//     return 1;
//   }
//   auto engine = sluice::RateLimitEngine::create(*config);
//
// Every error is InvalidArgument with one message of the form `<line>:<column>: <where>: <what>`
// (1-based line and column of the offending node; `load_config_file` puts `<file>:` in front):
// <where> is the path of the value as validate() spells it (`policies[0].rate_limits[1].burst`),
// `(root)` for the document itself, or `invalid YAML` for a syntax error. Unknown keys are errors
// (a typo must never drop a limit silently), and so are duplicate keys, wrong types, negative or
// fractional numbers, a second YAML document, and everything `sluice::validate` rejects. Values
// are echoed only where they are not secrets (never a credential), quoted and escaped.
//
// Untrusted input: a config is at most kMaxConfigBytes, and at most kMaxConfigNodes nodes are read
// (aliases count each time they are used, so an alias bomb is rejected early); yaml-cpp itself
// rejects nesting deeper than its DepthGuard limit (2000) with a syntax error. The loader walks
// the document by its schema, never by recursion over arbitrary nodes. yaml-cpp reports errors
// with exceptions; every exception is caught here, none crosses this API.
//
// Units: rates are requests per window; `rate_limit.window_seconds` is whole seconds.
// Thread-safety: every function is reentrant (no shared state).
#ifndef SLUICE_YAML_HPP_
#define SLUICE_YAML_HPP_

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <initializer_list>
#include <limits>
#include <new>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "sluice/policy.hpp"
#include "yaml-cpp/eventhandler.h"
#include "yaml-cpp/yaml.h"

namespace sluice::yaml {

// The largest config accepted, in bytes.
inline constexpr std::size_t kMaxConfigBytes = std::size_t{2} << 20;  // 2 MiB
// The most YAML nodes the loader reads from one config (each use of an alias counts).
inline constexpr std::size_t kMaxConfigNodes = 250'000;

namespace yaml_internal {

// 1-based, as editors count.
struct Position {
  int line = 1;
  int column = 1;
};

inline Position position_of(const YAML::Mark& mark) {
  if (mark.is_null() || mark.line < 0 || mark.column < 0) return {};
  return {mark.line + 1, mark.column + 1};
}

inline std::string format_error(Position at, std::string_view where, std::string_view what) {
  std::string out = std::to_string(at.line) + ":" + std::to_string(at.column) + ": ";
  out.append(where.empty() ? std::string_view("(root)") : where);
  out.append(": ");
  out.append(what);
  return out;
}

// Thrown by the loader only; load_config turns it into a Status.
struct LoadError {
  Position at;
  std::string where;
  std::string what;
};

// A scalar's text for an error message: quoted, escaped, at most 40 bytes of it.
inline std::string echo(std::string_view text) {
  constexpr std::size_t kMaxEcho = 40;
  if (text.size() <= kMaxEcho) return sluice::detail::quoted(text);
  return sluice::detail::quoted(text.substr(0, kMaxEcho)) + "...";
}

// `text` with every byte outside printable ASCII (and `\`) written as \xNN.
inline std::string printable(std::string_view text) {
  constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte >= 0x20 && byte <= 0x7e && c != '\\') {
      out.push_back(c);
    } else {
      out += "\\x";
      out.push_back(kHex[byte >> 4]);
      out.push_back(kHex[byte & 0xf]);
    }
  }
  return out;
}

// What a node is, for "expected ..., got <what>". Scalars are echoed only when `echo_scalar`.
inline std::string describe(const YAML::Node& node, bool echo_scalar) {
  switch (node.Type()) {
    case YAML::NodeType::Null:
      return "null";
    case YAML::NodeType::Sequence:
      return "a sequence";
    case YAML::NodeType::Map:
      return "a mapping";
    case YAML::NodeType::Scalar:
      if (!echo_scalar) return "a scalar";
      return node.Tag() == "!" ? "the string " + echo(node.Scalar()) : echo(node.Scalar());
    case YAML::NodeType::Undefined:
      break;
  }
  return "nothing";
}

// Levenshtein distance, for "did you mean"; long inputs are not worth comparing.
inline std::size_t edit_distance(std::string_view a, std::string_view b) {
  if (a.size() > 64 || b.size() > 64) return std::numeric_limits<std::size_t>::max();
  std::array<std::size_t, 65> row{};
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

using Keys = std::initializer_list<std::string_view>;

inline std::string unknown_key_message(std::string_view key, Keys allowed) {
  std::string out = "unknown key " + echo(key);
  std::string_view best;
  std::size_t best_distance = 3;  // suggest only within 2 edits, and less than half the word
  for (std::string_view candidate : allowed) {
    const std::size_t d = edit_distance(key, candidate);
    if (d < best_distance && 2 * d < candidate.size()) {
      best = candidate;
      best_distance = d;
    }
  }
  if (!best.empty()) return out + " (did you mean \"" + std::string(best) + "\"?)";
  out += " (expected one of ";
  bool first = true;
  for (std::string_view candidate : allowed) {
    if (!first) out += ", ";
    out += candidate;
    first = false;
  }
  return out + ")";
}

inline std::string member(const std::string& path, std::string_view name) {
  if (path.empty()) return std::string(name);
  return path + "." + std::string(name);
}

inline std::string element(const std::string& path, std::size_t i) {
  return path + "[" + std::to_string(i) + "]";
}

// Sees where each document starts, without building it.
class DocumentStart final : public YAML::EventHandler {
 public:
  std::optional<YAML::Mark> mark;

  void OnDocumentStart(const YAML::Mark& at) override { mark = at; }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t,
                const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}
};

// Fails unless `text` holds exactly one document. Not YAML::LoadAll: in yaml-cpp 0.7 it loops
// forever, allocating, on input such as "," (jbeder/yaml-cpp#1040, fixed upstream by #1319),
// because the parser hands out the same empty document again and again without consuming the
// token. Here a document that starts where the previous one started is that stuck parser, and
// is reported as a syntax error at the token it cannot consume.
inline void expect_one_document(const std::string& text) {
  std::istringstream in(text);
  YAML::Parser parser(in);
  std::array<DocumentStart, 3> documents;
  std::size_t count = 0;
  while (count < documents.size() && parser.HandleNextDocument(documents[count])) {
    const std::optional<YAML::Mark>& start = documents[count].mark;
    if (count > 0 && start && documents[count - 1].mark &&
        start->pos == documents[count - 1].mark->pos) {
      const auto pos = static_cast<std::size_t>(std::max(start->pos, 0));
      throw LoadError{position_of(*start), "invalid YAML",
                      "unexpected " + (pos < text.size()
                                           ? "character \"" + printable(text.substr(pos, 1)) + "\""
                                           : std::string("end of input"))};
    }
    ++count;
  }
  if (count == 0) throw LoadError{{}, "", "expected a mapping, got an empty document"};
  if (count > 1 && documents[1].mark) {
    throw LoadError{position_of(*documents[1].mark), "",
                    "expected one YAML document, got another one here"};
  }
}

// One key of a mapping, already checked against the allowed keys.
struct Field {
  std::string key;
  std::string path;  // the value's path
  YAML::Node value;
};

// Reads a YAML document by the schema of PolicyConfig, remembering where every value it read
// sits, so that validate()'s paths can be mapped back to a line and column.
class Loader {
 public:
  PolicyConfig load(const YAML::Node& root) {
    PolicyConfig config;
    for (const Field& f : fields(
             root, "",
             {"policies", "routes", "services", "listeners", "consumers", "gateway", "engine"})) {
      if (f.key == "policies") {
        config.policies = read_list<Bundle>(f.value, f.path, &Loader::read_bundle);
      } else if (f.key == "routes") {
        config.routes = read_list<Route>(f.value, f.path, &Loader::read_route);
      } else if (f.key == "services") {
        config.services = read_list<Service>(f.value, f.path, &Loader::read_service);
      } else if (f.key == "listeners") {
        config.listeners = read_list<Listener>(f.value, f.path, &Loader::read_listener);
      } else if (f.key == "consumers") {
        config.consumers = read_list<Consumer>(f.value, f.path, &Loader::read_consumer);
      } else if (f.key == "gateway") {
        config.gateway = read_gateway(f.value, f.path);
      } else {
        config.engine = read_engine(f.value, f.path);
      }
    }
    return config;
  }

  // validate()'s message ("<path> must ..." or "<path>: ...") with the position of the deepest
  // value on that path that the loader read.
  std::string relocate(std::string_view message) const {
    std::size_t n = 0;
    while (n < message.size() && is_path_char(message[n])) ++n;
    std::string path(message.substr(0, n));
    std::string_view what = message.substr(n);
    if (what.starts_with(": ")) {
      what.remove_prefix(2);
    } else if (what.starts_with(' ')) {
      what.remove_prefix(1);
    }
    return format_error(locate(path), path, what);
  }

 private:
  static bool is_path_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '.' || c == '[' || c == ']';
  }

  Position locate(std::string path) const {
    while (true) {
      if (auto it = marks_.find(path); it != marks_.end()) return position_of(it->second);
      if (path.empty()) return {};
      if (path.back() == ']') {
        path.erase(path.rfind('['));
      } else {
        const std::size_t dot = path.rfind('.');
        path.erase(dot == std::string::npos ? 0 : dot);
      }
    }
  }

  [[noreturn]] static void fail(const YAML::Mark& mark, std::string where, std::string what) {
    throw LoadError{position_of(mark), std::move(where), std::move(what)};
  }

  YAML::Mark mark_of(const std::string& path) const {
    auto it = marks_.find(path);
    return it == marks_.end() ? YAML::Mark() : it->second;
  }

  // Every node read goes through here: counted, and its position remembered.
  void visit(const YAML::Node& node, const std::string& path) {
    if (++nodes_ > kMaxConfigNodes) {
      fail(node.Mark(), path,
           "the config has more than " + std::to_string(kMaxConfigNodes) +
               " nodes (each use of an alias counts)");
    }
    marks_.emplace(path, node.Mark());
  }

  std::vector<Field> fields(const YAML::Node& node, const std::string& path, Keys allowed) {
    visit(node, path);
    if (!node.IsMap()) {
      fail(mark_of(path), path, "expected a mapping, got " + describe(node, false));
    }
    std::vector<Field> out;
    for (auto it = node.begin(); it != node.end(); ++it) {
      const YAML::Node key = it->first;
      visit(key, path);
      if (!key.IsScalar()) {
        fail(key.Mark(), path, "expected a string key, got " + describe(key, false));
      }
      const std::string& name = key.Scalar();
      if (std::find(allowed.begin(), allowed.end(), name) == allowed.end()) {
        fail(key.Mark(), path, unknown_key_message(name, allowed));
      }
      for (const Field& f : out) {
        if (f.key == name) fail(key.Mark(), path, "duplicate key " + echo(name));
      }
      Field field{name, member(path, name), it->second};
      // yaml-cpp places an empty value at the next token; the key is where the reader looks.
      if (field.value.IsNull()) marks_.emplace(field.path, key.Mark());
      out.push_back(std::move(field));
    }
    return out;
  }

  static void require(const YAML::Node& node, const std::string& path,
                      const std::vector<Field>& fields, std::string_view key) {
    for (const Field& f : fields) {
      if (f.key == key) return;
    }
    fail(node.Mark(), path, "missing required key \"" + std::string(key) + "\"");
  }

  template <class T>
  std::vector<T> read_list(const YAML::Node& node, const std::string& path,
                           T (Loader::*read)(const YAML::Node&, const std::string&)) {
    visit(node, path);
    if (!node.IsSequence()) {
      fail(mark_of(path), path, "expected a sequence, got " + describe(node, false));
    }
    std::vector<T> out;
    std::size_t i = 0;
    for (auto it = node.begin(); it != node.end(); ++it, ++i) {
      out.push_back((this->*read)(*it, element(path, i)));
    }
    return out;
  }

  std::string read_string(const YAML::Node& node, const std::string& path) {
    visit(node, path);
    if (!node.IsScalar()) {
      fail(mark_of(path), path, "expected a string, got " + describe(node, false));
    }
    return node.Scalar();
  }

  std::vector<std::string> read_strings(const YAML::Node& node, const std::string& path) {
    return read_list<std::string>(node, path, &Loader::read_string);
  }

  // A plain (unquoted) decimal integer in 0 ... 2^64-1; the ranges are validate()'s business.
  std::uint64_t read_count(const YAML::Node& node, const std::string& path) {
    visit(node, path);
    constexpr std::string_view kExpected = "expected a non-negative integer, got ";
    if (!node.IsScalar()) fail(mark_of(path), path, std::string(kExpected) + describe(node, false));
    if (node.Tag() != "?" && node.Tag() != "tag:yaml.org,2002:int") {
      fail(mark_of(path), path, std::string(kExpected) + describe(node, true));
    }
    const std::string& text = node.Scalar();
    constexpr std::uint64_t kMax = std::numeric_limits<std::uint64_t>::max();
    std::uint64_t value = 0;
    for (char c : text) {
      if (c < '0' || c > '9') fail(mark_of(path), path, std::string(kExpected) + echo(text));
      const auto digit = static_cast<std::uint64_t>(c - '0');
      if (value > (kMax - digit) / 10) {
        fail(mark_of(path), path,
             echo(text) + " is out of range (at most " + std::to_string(kMax) + ")");
      }
      value = value * 10 + digit;
    }
    if (text.empty()) fail(mark_of(path), path, std::string(kExpected) + echo(text));
    return value;
  }

  bool read_bool(const YAML::Node& node, const std::string& path) {
    visit(node, path);
    constexpr std::string_view kExpected = "expected true or false, got ";
    if (!node.IsScalar() || node.Tag() != "?") {
      fail(mark_of(path), path, std::string(kExpected) + describe(node, true));
    }
    const std::string& text = node.Scalar();
    if (text == "true" || text == "True" || text == "TRUE") return true;
    if (text == "false" || text == "False" || text == "FALSE") return false;
    fail(mark_of(path), path, std::string(kExpected) + echo(text));
  }

  // A scalar that `parse` turns into an enum value; `expected` lists the spellings.
  template <class Parse>
  auto read_enum(const YAML::Node& node, const std::string& path, std::string_view noun,
                 std::string_view expected, Parse parse) {
    visit(node, path);
    if (!node.IsScalar()) {
      fail(mark_of(path), path,
           "expected " + std::string(noun) + " (" + std::string(expected) + "), got " +
               describe(node, false));
    }
    auto value = parse(node.Scalar());
    if (!value.has_value()) {
      fail(mark_of(path), path,
           "unknown " + std::string(noun) + " " + echo(node.Scalar()) + " (expected " +
               std::string(expected) + ")");
    }
    return *value;
  }

  Selector read_selector(const YAML::Node& node, const std::string& path) {
    return read_enum(node, path, "selector", "ip, credential or route",
                     [](std::string_view s) { return parse_selector(s); });
  }

  Rule read_rule(const YAML::Node& node, const std::string& path) {
    Rule rule;
    const std::vector<Field> fs = fields(node, path, {"name", "selector", "requests_per", "burst"});
    require(node, path, fs, "selector");
    require(node, path, fs, "requests_per");
    for (const Field& f : fs) {
      if (f.key == "name") {
        rule.name = read_string(f.value, f.path);
      } else if (f.key == "selector") {
        rule.selector = read_list<Selector>(f.value, f.path, &Loader::read_selector);
      } else if (f.key == "requests_per") {
        for (const Field& w : fields(f.value, f.path, {"s", "minute", "hour"})) {
          const std::uint64_t requests = read_count(w.value, w.path);
          if (w.key == "s") {
            rule.requests_per.s = requests;
          } else if (w.key == "minute") {
            rule.requests_per.minute = requests;
          } else {
            rule.requests_per.hour = requests;
          }
        }
      } else {
        rule.burst = read_count(f.value, f.path);
      }
    }
    return rule;
  }

  LegacyRateLimit read_legacy(const YAML::Node& node, const std::string& path) {
    LegacyRateLimit legacy;
    const std::vector<Field> fs = fields(node, path, {"requests", "window_seconds"});
    require(node, path, fs, "requests");
    require(node, path, fs, "window_seconds");
    for (const Field& f : fs) {
      (f.key == "requests" ? legacy.requests : legacy.window_seconds) = read_count(f.value, f.path);
    }
    return legacy;
  }

  Bundle read_bundle(const YAML::Node& node, const std::string& path) {
    Bundle bundle;
    const std::vector<Field> fs =
        fields(node, path, {"name", "rate_limits", "rate_limit", "dry_run"});
    require(node, path, fs, "name");
    for (const Field& f : fs) {
      if (f.key == "name") {
        bundle.name = read_string(f.value, f.path);
      } else if (f.key == "rate_limits") {
        bundle.rate_limits = read_list<Rule>(f.value, f.path, &Loader::read_rule);
      } else if (f.key == "rate_limit") {
        bundle.rate_limit = read_legacy(f.value, f.path);
      } else {
        bundle.dry_run = read_bool(f.value, f.path);
      }
    }
    return bundle;
  }

  // `match: {path: {type: prefix, value: /v1}}`, the long form of `path_prefix: /v1`.
  std::string read_match(const YAML::Node& node, const std::string& path,
                         const std::string& prefix_path) {
    const std::vector<Field> fs = fields(node, path, {"path"});
    require(node, path, fs, "path");
    const Field& p = fs.front();
    const std::vector<Field> ps = fields(p.value, p.path, {"type", "value"});
    require(p.value, p.path, ps, "type");
    require(p.value, p.path, ps, "value");
    std::string prefix;
    for (const Field& f : ps) {
      if (f.key == "type") {
        read_enum(f.value, f.path, "match type", "prefix", [](std::string_view s) {
          return s == "prefix" ? std::optional(0) : std::nullopt;
        });
      } else {
        prefix = read_string(f.value, f.path);
        marks_.emplace(prefix_path, f.value.Mark());  // validate() calls it path_prefix
      }
    }
    return prefix;
  }

  Route read_route(const YAML::Node& node, const std::string& path) {
    Route route;
    const std::vector<Field> fs =
        fields(node, path, {"name", "service", "listener", "path_prefix", "match", "policies"});
    require(node, path, fs, "name");
    const Field* prefix = nullptr;
    const Field* match = nullptr;
    for (const Field& f : fs) {
      if (f.key == "name") {
        route.name = read_string(f.value, f.path);
      } else if (f.key == "service") {
        route.service = read_string(f.value, f.path);
      } else if (f.key == "listener") {
        route.listener = read_string(f.value, f.path);
      } else if (f.key == "path_prefix") {
        prefix = &f;
        route.path_prefix = read_string(f.value, f.path);
      } else if (f.key == "match") {
        match = &f;
        route.path_prefix = read_match(f.value, f.path, member(path, "path_prefix"));
      } else {
        route.policies = read_strings(f.value, f.path);
      }
    }
    if (prefix != nullptr && match != nullptr) {
      const Field* later = prefix->value.Mark().pos > match->value.Mark().pos ? prefix : match;
      fail(later->value.Mark(), later->path, "path_prefix and match both set the route's path");
    }
    return route;
  }

  Service read_service(const YAML::Node& node, const std::string& path) {
    Service service;
    const std::vector<Field> fs = fields(node, path, {"name", "policies"});
    require(node, path, fs, "name");
    for (const Field& f : fs) {
      if (f.key == "name") {
        service.name = read_string(f.value, f.path);
      } else {
        service.policies = read_strings(f.value, f.path);
      }
    }
    return service;
  }

  Listener read_listener(const YAML::Node& node, const std::string& path) {
    Listener listener;
    const std::vector<Field> fs = fields(node, path, {"name", "policies"});
    require(node, path, fs, "name");
    for (const Field& f : fs) {
      if (f.key == "name") {
        listener.name = read_string(f.value, f.path);
      } else {
        listener.policies = read_strings(f.value, f.path);
      }
    }
    return listener;
  }

  Consumer read_consumer(const YAML::Node& node, const std::string& path) {
    Consumer consumer;
    const std::vector<Field> fs = fields(node, path, {"name", "credentials", "policies"});
    require(node, path, fs, "name");
    for (const Field& f : fs) {
      if (f.key == "name") {
        consumer.name = read_string(f.value, f.path);
      } else if (f.key == "credentials") {
        consumer.credentials = read_strings(f.value, f.path);
      } else {
        consumer.policies = read_strings(f.value, f.path);
      }
    }
    return consumer;
  }

  Gateway read_gateway(const YAML::Node& node, const std::string& path) {
    Gateway gateway;
    for (const Field& f : fields(node, path, {"global_policies", "exempt_paths"})) {
      (f.key == "global_policies" ? gateway.global_policies : gateway.exempt_paths) =
          read_strings(f.value, f.path);
    }
    return gateway;
  }

  EngineOptions read_engine(const YAML::Node& node, const std::string& path) {
    EngineOptions engine;
    for (const Field& f : fields(node, path, {"consumption", "on_backend_error"})) {
      if (f.key == "consumption") {
        engine.consumption =
            read_enum(f.value, f.path, "consumption mode", "all_or_nothing or every_rule",
                      [](std::string_view s) { return parse_consumption_mode(s); });
      } else {
        engine.on_backend_error =
            read_enum(f.value, f.path, "failure mode", "fail_open or fail_closed",
                      [](std::string_view s) { return parse_failure_mode(s); });
      }
    }
    return engine;
  }

  std::size_t nodes_ = 0;
  std::unordered_map<std::string, YAML::Mark> marks_;  // value path -> where it starts
};

}  // namespace yaml_internal

// Parses `text` as one YAML document in the gateway layout (docs/configuration.md), then runs
// sluice::validate. Errors: InvalidArgument "<line>:<column>: <where>: <what>" (see above);
// ResourceExhausted when memory runs out; never throws.
inline absl::StatusOr<PolicyConfig> load_config(std::string_view text) {
  using namespace yaml_internal;
  if (text.size() > kMaxConfigBytes) {
    return absl::InvalidArgumentError(
        format_error({}, "",
                     "the config is " + std::to_string(text.size()) + " bytes, more than the " +
                         std::to_string(kMaxConfigBytes) + " supported"));
  }
  try {
    const std::string owned(text);
    expect_one_document(owned);
    Loader loader;
    PolicyConfig config = loader.load(YAML::Load(owned));
    if (absl::Status s = validate(config); !s.ok()) {
      return absl::InvalidArgumentError(
          loader.relocate(std::string_view(s.message().data(), s.message().size())));
    }
    return config;
  } catch (const LoadError& e) {
    return absl::InvalidArgumentError(format_error(e.at, e.where, e.what));
  } catch (const YAML::Exception& e) {
    // yaml-cpp's messages can carry a byte of the input ("unknown escape character: ...").
    return absl::InvalidArgumentError(
        format_error(position_of(e.mark), "invalid YAML", printable(e.msg)));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError("out of memory while loading the config");
  } catch (const std::exception& e) {
    return absl::InternalError(std::string("unexpected error while loading the config: ") +
                               e.what());
  } catch (...) {
    return absl::InternalError("unexpected error while loading the config");
  }
}

// Reads the file at `path` (at most kMaxConfigBytes) and loads it; every InvalidArgument message
// starts with "<path>:" (e.g. "gateway.yaml:3:9: ..."). NotFound / PermissionDenied / Unavailable
// when the file cannot be read.
inline absl::StatusOr<PolicyConfig> load_config_file(const std::string& path) {
  auto io_error = [&](std::string_view what) {
    const int error = errno;
    std::string message = path + ": " + std::string(what) + ": " +
                          std::error_code(error, std::generic_category()).message();
    if (error == ENOENT) return absl::NotFoundError(message);
    if (error == EACCES) return absl::PermissionDeniedError(message);
    return absl::UnavailableError(message);
  };
  std::string text;
  try {
    errno = 0;
    std::ifstream in(path, std::ios::binary);
    if (!in) return io_error("cannot open the config file");
    std::array<char, 16384> chunk{};
    while (in && text.size() <= kMaxConfigBytes) {
      in.read(chunk.data(), chunk.size());
      text.append(chunk.data(), static_cast<std::size_t>(in.gcount()));
    }
    if (in.bad()) return io_error("cannot read the config file");
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(path + ": out of memory while reading the config file");
  } catch (...) {
    return absl::UnavailableError(path + ": cannot read the config file");
  }
  if (text.size() > kMaxConfigBytes) {
    return absl::InvalidArgumentError(
        path + ":" +
        yaml_internal::format_error(
            {}, "", "the config is more than " + std::to_string(kMaxConfigBytes) + " bytes"));
  }
  absl::StatusOr<PolicyConfig> config = load_config(text);
  if (!config.ok() && config.status().code() == absl::StatusCode::kInvalidArgument) {
    return absl::InvalidArgumentError(path + ":" + std::string(config.status().message()));
  }
  return config;
}

}  // namespace sluice::yaml

#endif  // SLUICE_YAML_HPP_
