// sluice/credential_resolver.hpp — who owns an API key, asked of the service's own store, with a
// bounded cache in front of it.
//
// The config's `consumers[].credentials` suit a handful of fixed tokens. A service with many API
// keys keeps them in its own store (a database table, an auth service); `CredentialResolver` asks
// that store which consumer a key belongs to, and caches the answer, known or unknown, for a
// bounded time in a bounded number of entries:
//
//   auto resolver = sluice::CredentialResolver<>::create(
//       [&db](std::string_view key) -> absl::StatusOr<std::optional<std::string>> {
//         return db.consumer_of_api_key(key);   // e.g. "customer"; nullopt: no such key
//       },
//       {.max_entries = 100'000, .known_ttl = std::chrono::minutes(5),
//        .unknown_ttl = std::chrono::seconds(30)});
//   if (!resolver.ok()) return resolver.status();
//   options.consumer_of = *resolver;   // HttplibLimiter::Options or GrpcRateLimiter::Options
//
// The consumer a key resolves to names one of the config's `consumers` (a consumer class such as
// `customer` or `gold`, whose bundles then apply); its `credential` rules key each API key on its
// own. A name the loaded config does not define is treated as a failed lookup (limited by
// address, then refused as the store being unavailable): its bundles are nowhere to apply. What an
// unknown key gets is the adapter's choice (`unknown_consumer`): a refusal, or a consumer class of
// its own; never the anonymous caller's buckets, and never a bucket of the key's own, so a client
// that sprays random keys cannot pick where it is counted.
//
// Keys are compared byte for byte: a store whose lookup ignores case (or trims) answers for every
// spelling of a key, and each spelling is then a key, and a bucket, of its own in `credential`
// rules; make the lookup exact. Every request whose key is not cached asks the store, a request
// its limits then deny included, so a client that makes up keys costs one lookup per request,
// however many of them its address's limits deny: the limits bound what reaches the service, not
// the lookups. Let the lookup refuse a key of the wrong shape (length, alphabet, checksum)
// without a query, and keep the store's own capacity in mind.
//
// Bounds: at most `max_entries` keys are cached (least recently used goes first; an unknown key
// takes room only from other unknown keys, never from a known one). A key is cached as a 128-bit
// digest under a seed of the resolver's own (sluice/key.hpp), never as its bytes: the cache holds
// no secret, and at most max_entries × (consumer name + ~250) bytes whatever keys clients send,
// the longest included. A key longer than kMaxCredentialBytes is unknown without asking the store,
// and is not cached. A lookup error is passed on and never cached.
//
// Thread-safety: `resolve` (and `operator()`) may run on any number of threads at once; the
// cache is split into shards, each behind its own mutex, and the store's lookup runs without any
// lock held (two threads that miss on one key may both ask the store). Copies share one cache.
// Complexity: O(key bytes) per call (one digest), plus one lookup on a miss. Time is integer
// nanoseconds from `Clock` (a ManualClock in tests); no floating point, no exceptions thrown here.
#ifndef SLUICE_CREDENTIAL_RESOLVER_HPP_
#define SLUICE_CREDENTIAL_RESOLVER_HPP_

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <functional>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "sluice/clock.hpp"
#include "sluice/detail/mutex.hpp"
#include "sluice/key.hpp"
#include "sluice/policy/model.hpp"

namespace sluice {

// The consumer that owns an API key (nullopt: no one), or an error of the store.
using ConsumerLookup =
    std::function<absl::StatusOr<std::optional<std::string>>(std::string_view credential)>;

struct CredentialCacheOptions {
  std::size_t max_entries = 65'536;                                 // keys cached at most; >= 1
  std::chrono::nanoseconds known_ttl = std::chrono::minutes(5);     // a key's consumer; > 0
  std::chrono::nanoseconds unknown_ttl = std::chrono::seconds(30);  // "no such key"; >= 0
};

// What a request adapter (sluice/httplib.hpp, sluice/grpc.hpp) made of a request's credential.
enum class CredentialStatus {
  kNone,          // the request presented none: limited as an anonymous caller (by address)
  kKnown,         // it belongs to a consumer, and keys that consumer's `credential` rules
  kUnknown,       // no one owns it: the adapter's unknown consumer, or refused (HTTP 401); a
                  // credential sent twice (ambiguous) is always refused
  kLookupFailed,  // the lookup failed, or named a consumer the config lacks: limited by address,
                  // then answered 503
};

template <Clock C = SteadyClock>
class CredentialResolver {
 public:
  // InvalidArgument for an empty lookup, max_entries 0, known_ttl <= 0 or unknown_ttl < 0. The
  // digest seed is random.
  static absl::StatusOr<CredentialResolver> create(ConsumerLookup lookup,
                                                   CredentialCacheOptions options = {},
                                                   C clock = C{}) {
    if (!lookup) return absl::InvalidArgumentError("CredentialResolver: the lookup is empty");
    if (options.max_entries == 0) {
      return absl::InvalidArgumentError("CredentialResolver: max_entries must be at least 1");
    }
    if (options.known_ttl.count() <= 0 || options.unknown_ttl.count() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("CredentialResolver: known_ttl must be > 0 and unknown_ttl >= 0 (got ",
                       options.known_ttl.count(), " ns and ", options.unknown_ttl.count(), " ns)"));
    }
    return CredentialResolver(
        std::make_shared<State>(std::move(lookup), options, std::move(clock), KeyHasher()));
  }

  // The consumer of `credential`: from the cache while its answer is fresh, else from the lookup
  // (then cached). nullopt: unknown. An error of the lookup is returned and not cached.
  absl::StatusOr<std::optional<std::string>> resolve(std::string_view credential) const {
    if (credential.empty() || credential.size() > kMaxCredentialBytes) return std::nullopt;
    State& state = *state_;
    const KeyDigest digest = state.hasher(credential);
    Shard& shard = state.shard_for(digest);
    const std::chrono::nanoseconds now = state.clock.now();
    if (std::optional<std::optional<std::string>> hit = shard.find(digest, now)) {
      return *std::move(hit);
    }
    absl::StatusOr<std::optional<std::string>> answer = state.lookup(credential);
    if (!answer.ok()) return answer;
    const std::chrono::nanoseconds ttl = answer->has_value() ? state.known_ttl : state.unknown_ttl;
    if (ttl.count() > 0) shard.store(digest, *answer, now + ttl, state.per_shard);
    return answer;
  }
  absl::StatusOr<std::optional<std::string>> operator()(std::string_view credential) const {
    return resolve(credential);
  }

  // Keys cached now, fresh or not yet evicted. O(shards).
  std::size_t size() const {
    std::size_t total = 0;
    for (Shard& shard : state_->shards) total += shard.size();
    return total;
  }
  // Forgets every cached answer (e.g. after keys were revoked). O(entries).
  void clear() const {
    for (Shard& shard : state_->shards) shard.clear();
  }

 private:
  static constexpr std::size_t kShards = 16;

  struct Entry {
    KeyDigest credential;  // the key's digest: its bytes are never kept
    std::optional<std::string> consumer;
    std::chrono::nanoseconds expires{0};  // on the resolver's clock
  };
  // Digests are seeded XXH3: their low half is a hash already (the high half picks the shard).
  struct DigestHash {
    std::size_t operator()(const KeyDigest& digest) const noexcept {
      return static_cast<std::size_t>(digest.low);
    }
  };

  // One shard: its known and its unknown keys, each in recency order (most recent first),
  // indexed by credential. An unknown key takes room only from unknown keys, so keys a client
  // makes up cannot push the known ones out.
  class Shard {
   public:
    std::optional<std::optional<std::string>> find(const KeyDigest& credential,
                                                   std::chrono::nanoseconds now) {
      detail::MutexLock lock(mutex_);
      const auto it = index_.find(credential);
      if (it == index_.end()) return std::nullopt;
      std::list<Entry>& order = order_of(*it->second);
      if (it->second->expires <= now) {
        order.erase(it->second);
        index_.erase(it);
        return std::nullopt;
      }
      order.splice(order.begin(), order, it->second);
      return it->second->consumer;
    }
    void store(const KeyDigest& credential, const std::optional<std::string>& consumer,
               std::chrono::nanoseconds expires, std::size_t capacity) {
      detail::MutexLock lock(mutex_);
      if (const auto it = index_.find(credential); it != index_.end()) {
        order_of(*it->second).erase(it->second);
        index_.erase(it);
      }
      while (known_.size() + unknown_.size() >= capacity) {
        std::list<Entry>& victims = unknown_.empty() ? known_ : unknown_;
        if (!consumer && &victims == &known_) return;  // no room an unknown key may take
        index_.erase(victims.back().credential);
        victims.pop_back();
      }
      std::list<Entry>& order = consumer ? known_ : unknown_;
      order.push_front(Entry{credential, consumer, expires});
      index_.emplace(credential, order.begin());
    }
    std::size_t size() {
      detail::MutexLock lock(mutex_);
      return known_.size() + unknown_.size();
    }
    void clear() {
      detail::MutexLock lock(mutex_);
      index_.clear();
      known_.clear();
      unknown_.clear();
    }

   private:
    std::list<Entry>& order_of(const Entry& entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
      return entry.consumer ? known_ : unknown_;
    }

    detail::Mutex mutex_;
    std::list<Entry> known_ ABSL_GUARDED_BY(mutex_);
    std::list<Entry> unknown_ ABSL_GUARDED_BY(mutex_);
    absl::flat_hash_map<KeyDigest, typename std::list<Entry>::iterator, DigestHash> index_
        ABSL_GUARDED_BY(mutex_);
  };

  struct State {
    State(ConsumerLookup lookup_in, const CredentialCacheOptions& options, C clock_in,
          KeyHasher hasher_in)
        : lookup(std::move(lookup_in)),
          clock(std::move(clock_in)),
          hasher(hasher_in),
          known_ttl(options.known_ttl),
          unknown_ttl(options.unknown_ttl),
          // The bound holds in total: each shard keeps its share, at least one entry.
          per_shard(std::max<std::size_t>(1, options.max_entries / kShards)),
          shard_count(std::min(kShards, options.max_entries)) {}
    Shard& shard_for(const KeyDigest& credential) { return shards[credential.high % shard_count]; }
    ConsumerLookup lookup;
    C clock;
    KeyHasher hasher;
    std::chrono::nanoseconds known_ttl, unknown_ttl;
    std::size_t per_shard;
    std::size_t shard_count;  // shards in use: fewer than kShards when max_entries is small
    std::array<Shard, kShards> shards;
  };

  explicit CredentialResolver(std::shared_ptr<State> state) : state_(std::move(state)) {}

  std::shared_ptr<State> state_;
};

// A lookup that trusts the credential as presented: every non-empty value belongs to `consumer`,
// so `credential` rules key each distinct value on its own. Only for a header the operator trusts
// (set by an authenticating proxy in front, which strips the client's own): a client that can set
// the header picks its own bucket. Pass it as the adapter's `consumer_of`, without a cache.
inline ConsumerLookup trust_credential_as(std::string consumer) {
  return [consumer = std::move(consumer)](
             std::string_view credential) -> absl::StatusOr<std::optional<std::string>> {
    if (credential.empty() || credential.size() > kMaxCredentialBytes) return std::nullopt;
    return consumer;
  };
}

}  // namespace sluice

#endif  // SLUICE_CREDENTIAL_RESOLVER_HPP_
