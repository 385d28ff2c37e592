// libFuzzer target for sluice::yaml::load_config: arbitrary bytes in, never a crash, a hang, a
// leak or undefined behaviour out. Built only with clang (SLUICE_BUILD_FUZZERS, preset `fuzz`):
//   build/fuzz/tests/fuzz/yaml_fuzz -max_total_time=60 -dict=tests/fuzz/yaml.dict
//       build/fuzz/corpus tests/fuzz/corpus
// Beyond not crashing, it checks the loader's contract on every input:
// - an accepted config passes sluice::validate and compiles into a RateLimitEngine that can
//   evaluate a request;
// - a rejected config is InvalidArgument (or ResourceExhausted) with a message that starts with
//   "<line>:<column>: " and holds printable ASCII only (config text cannot forge log lines).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "sluice/engine.hpp"
#include "sluice/yaml.hpp"

namespace {

[[noreturn]] void violated(const char* what, std::string_view detail) {
  std::fprintf(stderr, "yaml_fuzz: %s: %.*s\n", what, static_cast<int>(detail.size()),
               detail.data());
  std::abort();
}

bool starts_with_position(std::string_view message) {
  auto digits = [&message]() {
    std::size_t n = 0;
    while (n < message.size() && message[n] >= '0' && message[n] <= '9') ++n;
    message.remove_prefix(n);
    return n > 0;
  };
  if (!digits() || !message.starts_with(':')) return false;
  message.remove_prefix(1);
  return digits() && message.starts_with(": ");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<sluice::PolicyConfig> config = sluice::yaml::load_config(text);
  if (!config.ok()) {
    const absl::Status& status = config.status();
    const std::string_view message(status.message().data(), status.message().size());
    if (status.code() == absl::StatusCode::kResourceExhausted) return 0;
    if (status.code() != absl::StatusCode::kInvalidArgument) violated("unexpected code", message);
    if (!starts_with_position(message)) violated("no line:column", message);
    for (char c : message) {
      if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) > 0x7e) {
        violated("non-printable byte in the message", message);
      }
    }
    return 0;
  }
  if (absl::Status s = sluice::validate(*config); !s.ok()) {
    violated("accepted but invalid", std::string_view(s.message().data(), s.message().size()));
  }
  absl::StatusOr<sluice::RateLimitEngine> engine = sluice::RateLimitEngine::create(*config);
  if (!engine.ok()) violated("accepted but does not compile", "");
  const auto route = engine->match_route("public", "/v1/items");
  sluice::RequestContext request{.client_ip = "192.0.2.1", .path = "/v1/items"};
  if (route) {
    request.route = route->route;
    request.service = route->service;
  }
  (void)engine->evaluate(request);
  return 0;
}
