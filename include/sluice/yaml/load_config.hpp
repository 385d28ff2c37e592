// sluice/yaml/load_config.hpp — loads a gateway policy config from YAML into the structs of
// sluice/policy.hpp (sluice::PolicyConfig).
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
// Untrusted input: the limits of sluice/yaml/limits.hpp bound the bytes and nodes read. The
// loader walks the document by its schema, never by recursion over arbitrary nodes. yaml-cpp
// reports errors with exceptions; every exception is caught here, none crosses this API.
//
// Units: rates are requests per window; `rate_limit.window_seconds` is whole seconds.
// Thread-safety: every function is reentrant (no shared state). Complexity: linear in the text.
#ifndef SLUICE_YAML_LOAD_CONFIG_HPP_
#define SLUICE_YAML_LOAD_CONFIG_HPP_

#include <exception>
#include <new>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "sluice/detail/text.hpp"
#include "sluice/policy.hpp"
#include "sluice/yaml/detail/config_file.hpp"
#include "sluice/yaml/detail/config_reader.hpp"
#include "sluice/yaml/detail/error.hpp"
#include "sluice/yaml/limits.hpp"
#include "yaml-cpp/yaml.h"

namespace sluice::yaml {

// Parses `text` as one YAML document in the gateway layout (docs/configuration.md), then runs
// sluice::validate. Errors: InvalidArgument "<line>:<column>: <where>: <what>" (see above);
// ResourceExhausted when memory runs out; never throws.
inline absl::StatusOr<PolicyConfig> load_config(std::string_view text) {
  if (text.size() > kMaxConfigBytes) {
    return absl::InvalidArgumentError(
        detail::format_error({}, "",
                             absl::StrCat("the config is ", text.size(), " bytes, more than the ",
                                          kMaxConfigBytes, " supported")));
  }
  try {
    return detail::read_and_validate(std::string(text));
  } catch (const detail::LoadError& e) {
    return absl::InvalidArgumentError(detail::format_error(e.at, e.where, e.what));
  } catch (const YAML::Exception& e) {
    // yaml-cpp's messages can carry a byte of the input ("unknown escape character: ...").
    return absl::InvalidArgumentError(detail::format_error(
        detail::position_of(e.mark), "invalid YAML", sluice::detail::escaped(e.msg)));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError("out of memory while loading the config");
  } catch (const std::exception& e) {
    return absl::InternalError(
        absl::StrCat("unexpected error while loading the config: ", e.what()));
  } catch (...) {
    return absl::InternalError("unexpected error while loading the config");
  }
}

// Reads the file at `path` (at most kMaxConfigBytes) and loads it; every InvalidArgument message
// starts with "<path>:" (e.g. "gateway.yaml:3:9: ..."; a path with a byte that is not printable
// ASCII is quoted and escaped, "\"a\\x0ab.yaml\":3:9: ..."). NotFound / PermissionDenied /
// Unavailable when the file cannot be read; FailedPrecondition, at once, when `path` (after
// symlinks) is not a regular file (a FIFO would otherwise wait for a writer).
inline absl::StatusOr<PolicyConfig> load_config_file(const std::string& path) {
  absl::StatusOr<std::string> text = detail::read_config_file(path);
  if (!text.ok()) return text.status();
  absl::StatusOr<PolicyConfig> config = load_config(*text);
  if (!config.ok() && config.status().code() == absl::StatusCode::kInvalidArgument) {
    return absl::InvalidArgumentError(
        absl::StrCat(sluice::detail::plain_or_quoted(path), ":", config.status().message()));
  }
  return config;
}

}  // namespace sluice::yaml

#endif  // SLUICE_YAML_LOAD_CONFIG_HPP_
