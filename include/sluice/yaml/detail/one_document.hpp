// Internal to sluice::yaml: checks that a config holds exactly one YAML document, within the node
// and nesting limits, before it is built. Thread-safety: stateless functions. O(n) in the text's
// length.
#ifndef SLUICE_YAML_DETAIL_ONE_DOCUMENT_HPP_
#define SLUICE_YAML_DETAIL_ONE_DOCUMENT_HPP_

#include <algorithm>
#include <array>
#include <cstddef>
#include <optional>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "sluice/detail/text.hpp"
#include "sluice/yaml/detail/error.hpp"
#include "sluice/yaml/limits.hpp"
#include "yaml-cpp/eventhandler.h"
#include "yaml-cpp/yaml.h"

namespace sluice::yaml::detail {

// Sees where each document starts, without building it, and holds it to the limits: counts its
// nodes (an alias as one) against kMaxConfigNodes, since yaml-cpp builds a node in some 500
// bytes (a 2 MiB config of one-letter list items would take some 500 MB before a reader counted
// one); and its nesting against kMaxNestingDepth as the parser opens each collection, before it
// descends into it, so that the parser's recursion stops there whatever the text check missed.
class DocumentStart final : public YAML::EventHandler {
 public:
  std::optional<YAML::Mark> mark;

  void OnDocumentStart(const YAML::Mark& at) override { mark = at; }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& at, YAML::anchor_t) override { count(at); }
  void OnAlias(const YAML::Mark& at, YAML::anchor_t) override { count(at); }
  void OnScalar(const YAML::Mark& at, const std::string&, YAML::anchor_t,
                const std::string&) override {
    count(at);
  }
  void OnSequenceStart(const YAML::Mark& at, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {
    open(at);
  }
  void OnSequenceEnd() override { --depth_; }
  void OnMapStart(const YAML::Mark& at, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {
    open(at);
  }
  void OnMapEnd() override { --depth_; }

 private:
  void count(const YAML::Mark& at) {
    if (++nodes_ > kMaxConfigNodes) fail(at, "", too_many_nodes_message());
  }
  void open(const YAML::Mark& at) {
    count(at);
    if (++depth_ > kMaxNestingDepth) fail(at, "", nests_too_deep_message());
  }

  std::size_t nodes_ = 0;
  std::size_t depth_ = 0;  // collections open
};

// The syntax error for a parser that cannot consume the token at `start`.
[[noreturn]] inline void fail_stuck_parser(const std::string& text, const YAML::Mark& start) {
  const auto pos = static_cast<std::size_t>(std::max(start.pos, 0));
  fail(start, "invalid YAML",
       pos < text.size()
           ? absl::StrCat("unexpected character ", sluice::detail::quoted(text.substr(pos, 1)))
           : std::string("unexpected end of input"));
}

// Throws LoadError unless `text` holds exactly one document within kMaxConfigNodes nodes and
// kMaxNestingDepth levels. Not YAML::LoadAll: in yaml-cpp 0.7 it loops forever, allocating, on
// input such as "," (jbeder/yaml-cpp#1040, fixed upstream by #1319), because the parser hands out
// the same empty document again and again without consuming the token. Here a document that starts
// where the previous one started is that stuck parser, and is reported as a syntax error at the
// token it cannot consume.
inline void expect_one_document(const std::string& text) {
  std::istringstream in(text);
  YAML::Parser parser(in);
  std::array<DocumentStart, 3> documents;
  std::size_t count = 0;
  while (count < documents.size() && parser.HandleNextDocument(documents[count])) {
    const std::optional<YAML::Mark>& start = documents[count].mark;
    if (count > 0 && start && documents[count - 1].mark &&
        start->pos == documents[count - 1].mark->pos) {
      fail_stuck_parser(text, *start);
    }
    ++count;
  }
  if (count == 0) throw LoadError{{}, "", "expected a mapping, got an empty document"};
  if (count > 1 && documents[1].mark) {
    fail(*documents[1].mark, "", "expected one YAML document, got another one here");
  }
}

}  // namespace sluice::yaml::detail

#endif  // SLUICE_YAML_DETAIL_ONE_DOCUMENT_HPP_
