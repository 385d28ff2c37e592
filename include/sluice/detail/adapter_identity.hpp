// Internal: what the request adapters (sluice/httplib.hpp, sluice/grpc.hpp) share about who a
// request comes from. The trusted proxies are the config's (`gateway.trusted_proxies`), read from
// the engine generation that evaluates the request, so they follow every reload; trusted proxies
// an adapter is also given in code may only repeat them, and are checked when it is created, as
// are the listener it serves and the consumer it gives unknown credentials.
#ifndef SLUICE_DETAIL_ADAPTER_IDENTITY_HPP_
#define SLUICE_DETAIL_ADAPTER_IDENTITY_HPP_

#include <algorithm>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "sluice/client_address.hpp"
#include "sluice/credential_resolver.hpp"
#include "sluice/detail/forwarded.hpp"
#include "sluice/detail/text.hpp"

namespace sluice::detail {

// The client of a request from `peer` with these forwarding headers: behind the trusted proxies
// of `engine`'s config, reading the hop list as `headers` says. O(header bytes + hops × proxies).
template <class Engine>
ClientAddress resolve_client(const Engine& engine, const ClientAddress& peer,
                             std::string_view forwarded, std::string_view x_forwarded_for,
                             ProxyHeaders headers) noexcept {
  return engine.client_addresses().resolve(peer, forwarded, x_forwarded_for, headers);
}

// "[10.0.0.0/8, 2001:db8::/32]": canonical, sorted, without repeats.
inline std::string network_list(std::span<const Cidr> networks) {
  std::vector<std::string> texts;
  for (const Cidr& cidr : networks) texts.push_back(cidr.to_string());
  std::sort(texts.begin(), texts.end());
  texts.erase(std::unique(texts.begin(), texts.end()), texts.end());
  return absl::StrCat("[", absl::StrJoin(texts, ", "), "]");
}

// OK when `given` (the trusted proxies an adapter was handed in code, called `given_name` in the
// message) is empty or names the same networks as `engine`'s gateway.trusted_proxies, in any
// order. Otherwise InvalidArgument naming both lists and the fix; FailedPrecondition when there
// is no engine to compare with. O(networks × log networks).
template <class Engine>
absl::Status check_trusted_proxies(const Engine* engine, std::span<const Cidr> given,
                                   absl::string_view given_name) {
  if (given.empty()) return absl::OkStatus();
  if (engine == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(given_name, " ", network_list(given),
                     ": there is no engine to check them against; set the proxies in the config's "
                     "gateway.trusted_proxies instead"));
  }
  const std::span<const Cidr> config = engine->client_addresses().trusted_networks();
  const std::string given_text = network_list(given);
  const std::string config_text = network_list(config);
  if (given_text == config_text) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      given_name, " ", given_text, " contradict the config's gateway.trusted_proxies ", config_text,
      ": the adapter takes its trusted proxies from the config and follows its reloads; set them "
      "in gateway.trusted_proxies and give the adapter none"));
}

// OK when the names an adapter was given are its config's: `listener` (the one it serves)
// and `unknown_consumer` (what unknown credentials get) are each empty or one of `engine`'s
// config's listeners and consumers, or there is no engine to check against (such an adapter
// answers every request as unavailable). Otherwise InvalidArgument naming the setting and the
// fix: a listener's bundles and routes would never apply to the adapter's requests, which would
// pass them all; every unknown credential would be refused instead of limited. O(1).
template <class Engine>
absl::Status check_config_names(const Engine* engine, std::string_view listener,
                                std::string_view unknown_consumer) {
  if (engine == nullptr) return absl::OkStatus();
  if (!listener.empty() && !engine->has_listener(listener)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the adapter's listener ", quoted(listener),
                     " is none of the config's listeners, so no listener's bundles and no route "
                     "on a listener would apply to its requests; name one of the config's "
                     "listeners (listeners[].name), or none"));
  }
  if (!unknown_consumer.empty() && !engine->consumer_named(unknown_consumer)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the adapter's unknown consumer ", quoted(unknown_consumer),
        " is none of the config's consumers, so every unknown credential would be refused "
        "instead of limited as that consumer's; name one of the config's consumers "
        "(consumers[].name), or none to refuse unknown credentials"));
  }
  return absl::OkStatus();
}

// What an adapter reads for a credential it cannot read one way only (its header or metadata
// entry sent more than once, or `Bearer` followed by whitespace other than one space): it is no
// consumer's and is never looked up, and the request is limited by address and then refused as
// an unknown credential's. Never an anonymous request, and never the unknown consumer's either:
// the service may read the value as a known key (the first of two entries, say), which would
// then escape that key's limits to the anonymous ones or the unknown consumer's bucket by
// address. The NUL byte keeps it apart from every credential a config can hold.
inline constexpr char kAmbiguousCredentialText[] = "\0sluice: ambiguous credential";
inline constexpr std::string_view kAmbiguousCredential(kAmbiguousCredentialText,
                                                       sizeof(kAmbiguousCredentialText) - 1);

// `value` after `prefix` (compared ignoring ASCII case), byte for byte; none when `value` does not
// start with it or nothing follows. O(prefix size).
inline std::optional<std::string_view> after_prefix(std::string_view value,
                                                    std::string_view prefix) noexcept {
  if (value.size() <= prefix.size() ||
      !absl::StartsWithIgnoreCase(absl::string_view(value.data(), prefix.size()),
                                  absl::string_view(prefix.data(), prefix.size()))) {
    return std::nullopt;
  }
  return value.substr(prefix.size());
}

// The credential in one header or metadata value, read the same way by both adapters, so that a
// secret has one spelling that reaches the lookup (a view into `value`):
// - spaces and tabs around the value are no part of it (HTTP field values; cpp-httplib drops
//   them, gRPC metadata keeps them);
// - a value with a control byte other than a tab (NUL, CR, LF, DEL) is kAmbiguousCredential: a
//   C string ends at a NUL, so a service may read "key\0x" (cpp-httplib decodes "%00" in a
//   header) as "key", and such a key must not escape its limits;
// - `prefix` "" takes the whole value; none when it is empty;
// - `prefix` a scheme and a space ("Bearer "): the scheme in any case, one or more spaces (RFC
//   6750), then the token; none for another scheme with its parameters ("Basic dXNlcg==").
//   Other whitespace after the scheme, or inside the token ("Bearer\tk", "Bearer k1 k2"), is
//   kAmbiguousCredential: a service that splits on whitespace reads a key there, which must not
//   escape its limits. So is a value without whitespace ("k", "Bearer"): a service that strips
//   the scheme only where it is present reads it as the token;
// - any other `prefix` is compared ignoring case, and the rest is the credential.
// O(value size); no allocation.
inline std::optional<std::string_view> credential_in(std::string_view value,
                                                     std::string_view prefix) noexcept {
  while (!value.empty() && optional_whitespace(value.front())) value.remove_prefix(1);
  while (!value.empty() && optional_whitespace(value.back())) value.remove_suffix(1);
  if (std::any_of(value.begin(), value.end(), [](char c) {
        const auto byte = static_cast<unsigned char>(c);
        return (byte < 0x20 && c != '\t') || byte == 0x7f;
      })) {
    return kAmbiguousCredential;
  }
  if (!prefix.ends_with(' ')) return after_prefix(value, prefix);
  std::optional<std::string_view> rest =
      after_prefix(value, prefix.substr(0, prefix.find_last_not_of(' ') + 1));
  const auto space = [](char c) { return absl::ascii_isspace(static_cast<unsigned char>(c)); };
  if (!value.empty() && std::none_of(value.begin(), value.end(), space)) {
    return kAmbiguousCredential;  // a bare token, or the scheme alone
  }
  if (!rest || !space(rest->front())) return std::nullopt;  // another scheme ("Bearerish k")
  rest->remove_prefix(rest->find_first_not_of(' '));        // value ends in no space
  if (std::any_of(rest->begin(), rest->end(), space)) return kAmbiguousCredential;
  return rest;
}

// A request's credential as the engine sees it: `credential` keys `credential` rules (set only
// when known), `consumer` names the consumer whose bundles apply.
struct CredentialIdentity {
  std::optional<std::string_view> credential{};
  std::optional<std::string_view> consumer{};
  CredentialStatus status = CredentialStatus::kNone;
};

// Who a request's credential says it is, as both adapters decide it. `storage` receives the
// consumer name the lookup answered; `consumer` views a name the engine holds, valid while the
// caller holds the engine.
// - no credential: kNone, nothing set;
// - no lookup: the config's consumers[].credentials (`engine.consumer_for`);
// - a lookup (`consumer_of`, e.g. a CredentialResolver): the consumer it names; its credential
//   keys `credential` rules; an error, or a consumer the config does not define: kLookupFailed,
//   nothing set;
// - unknown: kUnknown, and `consumer` is the config's consumer `unknown_consumer` when it is
//   non-empty and the config has one, without the credential (its rules key the address, so a
//   client cannot pick a bucket per key); otherwise nothing set, and the adapter refuses it;
// - ambiguous (kAmbiguousCredential): kUnknown, nothing set, whatever `unknown_consumer` says:
//   the adapter refuses it.
template <class Engine>
CredentialIdentity identify_credential(const Engine& engine,
                                       std::optional<std::string_view> credential,
                                       const ConsumerLookup& consumer_of,
                                       std::string_view unknown_consumer,
                                       std::optional<std::string>& storage) {
  CredentialIdentity out;
  if (!credential || credential->empty()) return out;
  if (*credential == kAmbiguousCredential) {
    out.status = CredentialStatus::kUnknown;  // asked of no one, and refused
    return out;
  }
  if (!consumer_of) {
    out.consumer = engine.consumer_for(*credential);
  } else {
    absl::StatusOr<std::optional<std::string>> answer = consumer_of(*credential);
    if (!answer.ok()) {
      out.status = CredentialStatus::kLookupFailed;
      return out;
    }
    storage = *std::move(answer);
    if (storage && !storage->empty()) {
      // A consumer the config does not define has no bundles here: keyed by its credential,
      // the request would escape every limit of its class. The store and the config disagree,
      // so the answer cannot be used: as if the store had failed.
      out.consumer = engine.consumer_named(*storage);
      if (!out.consumer) {
        out.status = CredentialStatus::kLookupFailed;
        return out;
      }
    }
  }
  if (out.consumer) {
    out.credential = credential;
    out.status = CredentialStatus::kKnown;
    return out;
  }
  out.status = CredentialStatus::kUnknown;
  if (!unknown_consumer.empty()) out.consumer = engine.consumer_named(unknown_consumer);
  return out;
}

}  // namespace sluice::detail

#endif  // SLUICE_DETAIL_ADAPTER_IDENTITY_HPP_
