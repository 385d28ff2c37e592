// sluice/envoy/load_config.hpp — the reference rate limit service's YAML files, with sluice's
// extensions, into a sluice::envoy::ServiceConfig.
//
//   absl::StatusOr<sluice::envoy::ServiceConfig> config =
//       sluice::envoy::load_config_directory("/etc/ratelimit/config");
//   if (!config.ok()) std::cerr << config.status().message();  // "edge.yaml:7:18: ..."
//
// A directory holds one file per domain: every file whose name ends in `.yaml` or `.yml` (not
// hidden, not in subdirectories), loaded in name order; two files of one domain are an error, and
// so is such an entry that is not a readable regular file (a broken symlink, a device).
// The reference's format loads unchanged (docs/envoy.md), except that a `replaces` entry must name
// a limit of its domain (one that does not could replace nothing, so a typo is refused):
//
//   domain: edge
//   descriptors:
//     - key: remote_address            # no value: any address, each counted apart
//       rate_limit: {unit: second, requests_per_unit: 10}
//     - key: path
//       value: /login
//       shadow_mode: true
//       rate_limit: {name: login, unit: minute, requests_per_unit: 5, replaces: [{name: x}]}
//
// sluice's extensions, in `rate_limit` (and in each element of `stacked`):
//   period: 90s | 5m | 2h | 1d | 500ms   instead of `unit`: any window length
//   burst: N                             the bucket (default requests_per_unit)
//   algorithm: gcra | fixed_window       gcra (the default) is smooth; fixed_window counts
//                                        requests_per_unit per window (burst: absent or equal)
//   stacked: [{requests_per_unit, unit | period, burst}, ...]   more windows, all must admit
// `detailed_metric` is accepted and has no effect.
//
// Errors: InvalidArgument "<file>:<line>:<column>: <where>: <what>"; NotFound etc. when a file or
// the directory cannot be read. A value from a file, and a file's path unless it is printable
// ASCII (the directory's too), appear quoted and escaped (\xNN), so that no file can forge or
// break a log line. Files are bounded like sluice's other YAML (sluice/yaml/limits.hpp).
// Thread-safety: reentrant. Complexity: linear in the files.
#ifndef SLUICE_ENVOY_LOAD_CONFIG_HPP_
#define SLUICE_ENVOY_LOAD_CONFIG_HPP_

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <new>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "sluice/detail/text.hpp"
#include "sluice/detail/window_ranges.hpp"
#include "sluice/envoy/config.hpp"
#include "sluice/envoy/detail/compiled_limits.hpp"
#include "sluice/yaml/detail/config_file.hpp"
#include "sluice/yaml/detail/error.hpp"
#include "sluice/yaml/detail/nesting.hpp"
#include "sluice/yaml/detail/node_reader.hpp"
#include "sluice/yaml/detail/one_document.hpp"
#include "sluice/yaml/limits.hpp"
#include "yaml-cpp/yaml.h"

namespace sluice::envoy {

namespace detail {

using yaml::detail::fail;
using yaml::detail::Field;

class DomainReader : public yaml::detail::NodeReader {
 public:
  DomainConfig read(const YAML::Node& root) {
    DomainConfig out;
    const std::vector<Field> fs = fields(root, "", {"domain", "descriptors", "limits_nothing"});
    for (const Field& f : fs) {
      if (f.key == "domain") out.domain = read_string(f.value, f.path);
      if (f.key == "descriptors") out.descriptors = read_level(f.value, f.path);
      if (f.key == "limits_nothing") out.limits_nothing = read_bool(f.value, f.path);
    }
    if (out.domain.empty()) fail(root.Mark(), "domain", "a config file needs a non-empty domain");
    return out;
  }

 private:
  std::vector<DescriptorConfig> read_level(const YAML::Node& node, const std::string& path) {
    if (node.IsNull()) return {};
    std::vector<DescriptorConfig> level =
        read_list<DescriptorConfig>(node, path, &DomainReader::read_descriptor);
    // (key, value) -> its first index: linear, however many descriptors one level has.
    absl::flat_hash_map<std::pair<std::string_view, std::string_view>, std::size_t> first;
    for (std::size_t i = 0; i < level.size(); ++i) {
      const auto [it, inserted] = first.try_emplace({level[i].key, level[i].value}, i);
      if (!inserted) {
        const std::string at = yaml::detail::element(path, i);
        fail(mark_of(at), at,
             absl::StrCat("duplicate descriptor: ", yaml::detail::element(path, it->second),
                          " has the same key and value"));
      }
    }
    return level;
  }

  DescriptorConfig read_descriptor(const YAML::Node& node, const std::string& path) {
    DescriptorConfig out;
    const std::vector<Field> fs =
        fields(node, path,
               {"key", "value", "rate_limit", "descriptors", "shadow_mode", "detailed_metric"});
    require(node, path, fs, "key");
    for (const Field& f : fs) {
      if (f.key == "key") out.key = read_string(f.value, f.path);
      if (f.key == "value") out.value = read_string(f.value, f.path);
      if (f.key == "rate_limit") out.rate_limit = read_limit(f.value, f.path);
      if (f.key == "descriptors") out.descriptors = read_level(f.value, f.path);
      if (f.key == "shadow_mode") out.shadow_mode = read_bool(f.value, f.path);
      if (f.key == "detailed_metric") read_bool(f.value, f.path);
    }
    if (out.key.empty()) fail(node.Mark(), path + ".key", "a descriptor's key must not be empty");
    return out;
  }

  Limit read_limit(const YAML::Node& node, const std::string& path) {
    Limit out;
    const std::vector<Field> fs = fields(node, path,
                                         {"unit", "requests_per_unit", "unlimited", "name",
                                          "replaces", "period", "burst", "algorithm", "stacked"});
    bool has_rate = false;
    for (const Field& f : fs) {
      if (f.key == "unlimited") out.unlimited = read_bool(f.value, f.path);
      if (f.key == "name") out.name = read_string(f.value, f.path);
      if (f.key == "replaces") out.replaces = read_replaces(f.value, f.path);
      if (f.key == "algorithm") out.algorithm = read_algorithm(f.value, f.path);
      if (f.key == "stacked") {
        for (GcraWindow w : read_list<GcraWindow>(f.value, f.path, &DomainReader::read_window)) {
          out.windows.push_back(w);
        }
      }
      has_rate = has_rate || f.key == "unit" || f.key == "period" || f.key == "requests_per_unit";
    }
    if (out.unlimited) {
      if (has_rate || !out.windows.empty()) {
        fail(node.Mark(), path, "an unlimited limit must not have a unit, period or rate");
      }
    } else {
      out.windows.insert(out.windows.begin(), window_of(node, path, fs));
    }
    if (out.algorithm == Algorithm::kFixedWindow) check_fixed_bursts(out, node, path);
    for (const std::string& r : out.replaces) {
      if (r == out.name) {
        fail(mark_of(path + ".replaces"), path + ".replaces", "a limit must not replace itself");
      }
    }
    return out;
  }

  GcraWindow read_window(const YAML::Node& node, const std::string& path) {
    return window_of(node, path,
                     fields(node, path, {"unit", "requests_per_unit", "period", "burst"}));
  }

  // requests_per_unit per unit (or period), with its burst.
  GcraWindow window_of(const YAML::Node& node, const std::string& path,
                       const std::vector<Field>& fs) {
    GcraWindow w;
    bool has_unit = false;
    for (const Field& f : fs) {
      if (f.key == "requests_per_unit") w.requests = read_bounded(f.value, f.path);
      if (f.key == "burst") w.burst = read_bounded(f.value, f.path);
      if (f.key == "unit" || f.key == "period") {
        if (has_unit) fail(f.value.Mark(), f.path, "set either unit or period, not both");
        has_unit = true;
        w.period = f.key == "unit" ? unit_period(read_unit(f.value, f.path))
                                   : read_period(f.value, f.path);
      }
    }
    require(node, path, fs, "requests_per_unit");
    if (!has_unit) fail(node.Mark(), path, R"(missing required key "unit" (or "period"))");
    if (w.burst != 0 && w.requests == 0) {
      fail(node.Mark(), path + ".burst", "a limit of 0 requests admits nothing; drop its burst");
    }
    // The other bounds hold by construction (counts below 2^32, periods up to 400 days).
    if (w.requests != 0 &&
        !sluice::detail::check_gcra_window(w, sluice::detail::kGcraRange, path).ok()) {
      fail(node.Mark(), path,
           absl::StrCat("burst × period / requests_per_unit (the time an empty bucket takes to "
                        "refill) must be at most ",
                        sluice::detail::bound_text(sluice::detail::kGcraRange.max_refill),
                        " ns, about 36 years"));
    }
    return w;
  }

  std::uint64_t read_bounded(const YAML::Node& node, const std::string& path) {
    const std::uint64_t n = read_count(node, path);
    if (n > std::numeric_limits<std::uint32_t>::max()) {
      fail(node.Mark(), path, absl::StrCat("at most ", std::numeric_limits<std::uint32_t>::max()));
    }
    return n;
  }

  Unit read_unit(const YAML::Node& node, const std::string& path) {
    return read_enum(node, path, "unit", "second, minute, hour, day, month or year",
                     [](const std::string& text) { return parse_unit(text); });
  }

  Algorithm read_algorithm(const YAML::Node& node, const std::string& path) {
    return read_enum(node, path, "algorithm", "gcra or fixed_window",
                     [](std::string_view text) { return parse_algorithm(text); });
  }

  // A fixed window has no bucket beyond its count: each window's burst is absent or equal to
  // its requests_per_unit.
  void check_fixed_bursts(const Limit& limit, const YAML::Node& node, const std::string& path) {
    for (const GcraWindow& w : limit.windows) {
      if (w.burst != 0 && w.burst != w.requests) {
        fail(node.Mark(), path,
             absl::StrCat("a fixed_window limit's burst must equal its requests_per_unit (",
                          w.requests, "), or be absent"));
      }
    }
  }

  // "<integer><ms|s|m|h|d>", 1 ns up to 400 days.
  std::chrono::nanoseconds read_period(const YAML::Node& node, const std::string& path) {
    const std::string text = read_string(node, path);
    std::uint64_t n = 0;
    const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), n);
    const std::string_view suffix(end, static_cast<std::size_t>(text.data() + text.size() - end));
    std::uint64_t scale = 0;
    for (const auto& [name, ns] : kPeriodUnits) {
      if (suffix == name) scale = ns;
    }
    constexpr std::uint64_t kMaxNs = 400ULL * 86400 * 1'000'000'000;
    if (error != std::errc() || end == text.data() || scale == 0 || n == 0 || n > kMaxNs / scale) {
      fail(node.Mark(), path,
           absl::StrCat("expected a period such as 90s, 5m, 2h or 1d (at most 400d), got ",
                        yaml::detail::echo(text)));
    }
    return std::chrono::nanoseconds(static_cast<std::int64_t>(n * scale));
  }

  static constexpr std::pair<std::string_view, std::uint64_t> kPeriodUnits[] = {
      {"ms", 1'000'000},
      {"s", 1'000'000'000},
      {"m", 60'000'000'000},
      {"h", 3'600'000'000'000},
      {"d", 86'400'000'000'000}};

  std::vector<std::string> read_replaces(const YAML::Node& node, const std::string& path) {
    return read_list<std::string>(node, path, &DomainReader::read_replaced);
  }

  std::string read_replaced(const YAML::Node& node, const std::string& path) {
    const std::vector<Field> fs = fields(node, path, {"name"});
    require(node, path, fs, "name");
    std::string name = read_string(fs.front().value, fs.front().path);
    if (name.empty()) fail(node.Mark(), path, "a replaces entry must name a limit");
    return name;
  }
};

}  // namespace detail

// One file's text (`source` names it in messages).
inline absl::StatusOr<DomainConfig> load_domain_config(std::string_view text,
                                                       std::string_view source) {
  using yaml::detail::format_error;
  const std::string prefix =
      source.empty() ? "" : absl::StrCat(sluice::detail::plain_or_quoted(source), ":");
  if (text.size() > yaml::kMaxConfigBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        prefix, format_error({}, "", absl::StrCat("more than ", yaml::kMaxConfigBytes, " bytes"))));
  }
  try {
    const std::string copy(text);
    yaml::detail::check_nesting(copy);
    yaml::detail::expect_one_document(copy);
    detail::DomainReader reader;
    DomainConfig out = reader.read(YAML::Load(copy));
    out.source = std::string(source);
    return out;
  } catch (const yaml::detail::LoadError& e) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, format_error(e.at, e.where, e.what)));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, format_error(yaml::detail::position_of(e.mark), "invalid YAML",
                                          sluice::detail::escaped(e.msg))));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError("out of memory while loading the config");
  }
}

// Every `.yaml` / `.yml` file of `directory`, in name order; the result also compiles (a
// configuration that loads here is accepted by the in-memory limiter; over Redis a limit must
// also refill within 2^52 ns, sluice/redis/limit.hpp).
inline absl::StatusOr<ServiceConfig> load_config_directory(const std::string& directory) {
  std::error_code error;  // the directory's
  std::vector<std::string> paths;
  for (std::filesystem::directory_iterator it(directory, error), end; !error && it != end;
       it.increment(error)) {
    const std::string name = it->path().filename().string();
    const bool yaml = name.ends_with(".yaml") || name.ends_with(".yml");
    // Every such entry but a subdirectory is read, so that one that is no file (a broken
    // symlink, a device) fails the load by its name instead of dropping its domain's limits.
    std::error_code ignored;  // an entry it cannot stat is read, and reading it names the error
    if (yaml && !name.starts_with(".") && !it->is_directory(ignored)) {
      paths.push_back(it->path().string());
    }
  }
  if (error) {
    return absl::NotFoundError(
        absl::StrCat(sluice::detail::plain_or_quoted(directory), ": ", error.message()));
  }
  std::sort(paths.begin(), paths.end());
  ServiceConfig config;
  for (const std::string& path : paths) {
    absl::StatusOr<std::string> text = yaml::detail::read_config_file(path);
    if (!text.ok()) return text.status();
    absl::StatusOr<DomainConfig> domain = load_domain_config(*text, path);
    if (!domain.ok()) return domain.status();
    config.domains.push_back(*std::move(domain));
  }
  if (absl::Status s = detail::CompiledLimits::compile(config).status(); !s.ok()) return s;
  return config;
}

}  // namespace sluice::envoy

#endif  // SLUICE_ENVOY_LOAD_CONFIG_HPP_
