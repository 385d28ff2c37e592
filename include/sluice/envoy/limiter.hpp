// sluice/envoy/limiter.hpp — Envoy's ShouldRateLimit decided over an engine backend: a domain's
// descriptors matched against a ServiceConfig and counted all-or-nothing.
//
//   auto limiter = sluice::envoy::Limiter::create(config);  // in memory, one replica
//   if (!limiter.ok()) return limiter.status();             // InvalidArgument naming the limit
//   sluice::envoy::Response response;
//   absl::Status s = (*limiter)->should_rate_limit(request, response);  // InvalidArgument: bounds
//   (*limiter)->reload(next_config);  // unchanged limits keep their counters; never waits
//   (*limiter)->collect_replaced();   // on each poll: frees what calls have let go of since
//
// Semantics (the descriptor walk is in sluice/envoy/config.hpp):
// - Hits: a descriptor adds its own `hits_addend` if set, else the request's (0 there counts
//   as 1). A descriptor's own 0 checks its limit without adding a hit: OK unless the limit is
//   over as it stands (a limit of 0 always is). Descriptors on the same counter (same limit and
//   entries) are decided once, hits summed.
// - A descriptor with a `limit` override is counted by that limit alone, under a counter of its
//   own (per domain, entries and override), whether or not a configured limit matches; an
//   override never runs in shadow mode. Overrides need a known domain, like every limit. Once
//   RequestBounds::max_overrides have counters, a descriptor with another one is decided by the
//   configured limits, as without an override (counted in ignored_overrides()); so is one the
//   backend cannot hold (over Redis, a window that refills in over 2^52 ns: a yearly one), and
//   one of unknown unit (UNKNOWN, or a value Envoy's enum lacks), which takes no place.
// - A matched limit whose name another matched limit of the same request `replaces` does not
//   apply. An `unlimited` limit applies and never limits (remaining 2^32-1).
// - All or nothing: the enforcing limits of a request are decided together under all their
//   locks (one Redis script on Redis); if any of them denies, the request is OVER_LIMIT and
//   nothing is consumed on any descriptor. Each descriptor then reports its own code and its
//   state as it stands (not reduced by this request). Hits above a limit's burst, or a limit of
//   0 requests, deny without consuming anything.
// - Shadow mode limits are decided after the enforcing ones: they consume when the request is
//   admitted and their bucket has room, never deny, and always report OK. When the backend
//   failed the call (outside the local failure mode) they count nothing: one wait per call.
// - An unknown domain, or a descriptor no limit matches, answers OK without a limit.
// - Backend failures (Options::on_backend_error): kFailOpen admits, kFailClosed denies every
//   enforcing limit. kLocal decides the call in process instead, all or nothing as ever, on this
//   replica's share of every limit (requests and burst scaled to max(1, floor(n × permille /
//   1000)), same periods), kept for the limiter's life and across reloads like the engine's
//   local mode (sluice/engine.hpp); after a failure, calls are decided locally at once and one
//   call per `local_retry_interval` tries the backend again, until it answers. Such a response
//   has `degraded` set. The local share's clock is the backend options' `clock` if they have
//   one, else the steady clock.
//
// Freeing a replaced configuration: a reload publishes the new generation by swapping one pointer
// and returns; it never waits for the calls still deciding on the one it replaced. The call that
// lets go of that generation last only hands it back (one atomic exchange: no lock, no
// destructor), and the limiter frees it on a reloading thread, never a call's: at the end of every
// reload() (so one no call holds is freed by the reload that replaced it) and on every
// collect_replaced(), which whoever reloads calls on each poll of its configuration. One that
// calls hold across several reloads waits with the others, one small handle each; when the
// limiter is destroyed, one a call still holds is freed by its last holder.
//
// Thread-safety: should_rate_limit and stats may be called concurrently from any threads, and
// concurrently with reload and collect_replaced, which calls never wait for; those two may be
// called from any thread, including one with a call in progress, and never wait for a call.
// Complexity: O(descriptors × entries) lookups plus one backend call, one more when the request
// has shadow mode limits. A denied request reports its limits as they stand from that one call
// where the backend can (StandingBackend: in memory, Redis and Redis Cluster in the one script
// call, PostgreSQL with a second statement of its own); over another backend it costs a second
// call, a peek at cost 0. docs/envoy.md lists what a denied call costs per backend.
#ifndef SLUICE_ENVOY_LIMITER_HPP_
#define SLUICE_ENVOY_LIMITER_HPP_

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "sluice/decision.hpp"
#include "sluice/detail/mutex.hpp"
#include "sluice/detail/retirement.hpp"
#include "sluice/detail/spin_lock.hpp"
#include "sluice/detail/text.hpp"
#include "sluice/engine.hpp"
#include "sluice/engine/backend.hpp"
#include "sluice/engine/local_share.hpp"
#include "sluice/envoy/config.hpp"
#include "sluice/envoy/detail/compiled_limits.hpp"
#include "sluice/envoy/request.hpp"
#include "sluice/http_fields.hpp"
#include "sluice/key.hpp"
#include "sluice/policy.hpp"

namespace sluice::envoy {

// The longest name a configured limit may have (Limit::name), in bytes; `create` and `reload`
// refuse a longer one, or one with a control byte (InvalidArgument).
inline constexpr std::size_t kMaxLimitNameBytes = 256;

// Bounds on what one request may carry; a request beyond them is refused with InvalidArgument
// before anything is looked up or allocated for it. They bound what the proxy's configuration
// decides (the domain, how many descriptors and entries, the keys), never what a client sends:
// entry values (a path, a header) may be as long as the gRPC message allows, so that no client
// can turn its whole request into an error, which a proxy that fails open admits. `create` and
// `reload` refuse (InvalidArgument) a configuration with a domain or key longer, or a descriptor
// nested deeper than max_entries, since no call could match it.
struct RequestBounds {
  std::size_t max_domain_bytes = 256;
  std::size_t max_descriptors = 64;
  std::size_t max_entries = 32;  // per descriptor
  std::size_t max_key_bytes = 256;
  // Distinct (requests_per_unit, unit) overrides with counters or refused by the backend, over
  // the limiter's life; a descriptor with a new override beyond them is decided as if it had
  // none (configured limits).
  std::size_t max_overrides = 64;
};

// One limit's counters over the limiter's life (kept across reloads: a configured limit's by
// label, an override's by its rate): hits counted once per request that reached the limit, as in
// the reference service. Every limit's label is its own.
struct LimitStats {
  std::string label{};
  std::uint64_t total_hits = 0;
  std::uint64_t over_limit = 0;    // hits of requests this limit denied
  std::uint64_t near_limit = 0;    // admitted hits that left less than a fifth of the burst
  std::uint64_t within_limit = 0;  // admitted hits
  std::uint64_t shadow_mode = 0;   // hits a shadow mode limit would have denied
  friend bool operator==(const LimitStats&, const LimitStats&) = default;
};

template <EngineBackend Backend>
class BasicLimiter {
  using LocalClock = typename sluice::detail::LocalClockOf<typename Backend::Options>::type;

 public:
  struct Options {
    RequestBounds bounds{};
    // When the backend fails: kFailOpen answers OK, kFailClosed OVER_LIMIT, kLocal decides on
    // this replica's share of every limit in process (see the file comment).
    FailureMode on_backend_error = FailureMode::kFailOpen;
    // kLocal: the permille of every limit this replica enforces alone (1 ... 1000; required).
    std::uint64_t local_share_permille = 0;
    // kLocal: after a failure, at most one call per interval tries the backend (0 < it <= 1 h).
    std::chrono::milliseconds local_retry_interval{1000};
    bool response_headers = false;  // fill Response::headers
    typename Backend::Options backend{};
  };

  static absl::StatusOr<std::unique_ptr<BasicLimiter>> create(const ServiceConfig& config,
                                                              Options options = {}) {
    if (options.on_backend_error == FailureMode::kLocal) {
      if (options.local_share_permille == 0 || options.local_share_permille > 1000) {
        return absl::InvalidArgumentError(
            absl::StrCat("the local failure mode needs local_share_permille in [1, 1000], got ",
                         options.local_share_permille));
      }
      if (options.local_retry_interval.count() <= 0 ||
          options.local_retry_interval > std::chrono::hours(1)) {
        return absl::InvalidArgumentError("local_retry_interval must be in (0, 1 h]");
      }
    }
    std::unique_ptr<BasicLimiter> limiter(new BasicLimiter(std::move(options)));
    if (absl::Status s = limiter->reload(config); !s.ok()) return s;
    return limiter;
  }

  BasicLimiter(const BasicLimiter&) = delete;
  BasicLimiter& operator=(const BasicLimiter&) = delete;

  // Decides `request` into `response` (cleared first). InvalidArgument when the request breaks
  // the bounds or the protocol (empty domain, no descriptors, a descriptor without entries, an
  // empty key); a backend failure is decided by the failure mode.
  absl::Status should_rate_limit(const Request& request, Response& response) const {
    response.overall_code = Code::kOk;
    response.statuses.clear();
    response.retry_after = std::chrono::nanoseconds(0);
    response.backend_failed = false;
    response.degraded = false;
    response.headers.clear();
    if (absl::Status s = validate(request); !s.ok()) return s;
    response.statuses.assign(request.descriptors.size(), DescriptorStatus{});
    absl::StatusOr<std::shared_ptr<const Generation>> gen = generation_for(request);
    if (!gen.ok()) return gen.status();
    if (!(*gen)->limits->has_domain(request.domain)) {
      unknown_domain_calls_.fetch_add(1, std::memory_order_relaxed);
    }
    Plan plan = make_plan(**gen, request);
    if (plan.ignored_overrides != 0) {
      ignored_overrides_.fetch_add(plan.ignored_overrides, std::memory_order_relaxed);
    }
    decide(**gen, plan, response);
    return absl::OkStatus();
  }

  // Compiles `config` and publishes it. Every limit whose place in the tree and windows are
  // unchanged keeps its counters; one whose windows changed carries each key's spent share (the
  // in-memory backend); overrides keep theirs. On error the running configuration stays.
  // FailedPrecondition when `config` has no limit that can deny (none, or only shadow mode and
  // unlimited ones) while the running one has, unless a domain says `limits_nothing`, and when a
  // domain has none left that can deny while its running version has, unless that domain says
  // `limits_nothing`: a file read while it is being written often looks like that.
  //
  // Returns without waiting for the calls still deciding on the configuration it replaced. No
  // call pays for freeing that one (its tables, and the counters of every limit the reload
  // removed): it is freed here if no call holds it, else by a later reload() or
  // collect_replaced() once its calls have let go (see the file comment).
  absl::Status reload(const ServiceConfig& config) {
    if (absl::Status s = check_within_bounds(config, options_.bounds); !s.ok()) return s;
    absl::StatusOr<detail::CompiledLimits> compiled = detail::CompiledLimits::compile(config);
    if (!compiled.ok()) return compiled.status();
    absl::StatusOr<std::shared_ptr<const Generation>> replaced =
        replace(config, *std::move(compiled));
    if (!replaced.ok()) return replaced.status();
    sluice::detail::MutexLock lock(retired_mutex_);
    replaced_.push_back(sluice::detail::retire_later(*std::move(replaced)));
    collect_replaced_locked();
    return absl::OkStatus();
  }

  // Frees, on this thread, each configuration a reload replaced whose calls have all let go; how
  // many are still held by calls. Call it where the configuration is polled, on every poll (and
  // about once a second while it returns more than 0), not from a call: a call must not pay for
  // freeing a configuration.
  std::size_t collect_replaced() {
    sluice::detail::MutexLock lock(retired_mutex_);
    return collect_replaced_locked();
  }

  // What one request may carry (Options::bounds).
  const RequestBounds& bounds() const { return options_.bounds; }

  // Calls whose backend failed (decided by the failure mode), over the limiter's life.
  std::uint64_t backend_errors() const { return backend_errors_.load(std::memory_order_relaxed); }
  FailureMode failure_mode() const { return options_.on_backend_error; }
  // Backend calls decided on the local share (kLocal), over the limiter's life.
  std::uint64_t local_decisions() const { return local_decisions_.load(std::memory_order_relaxed); }
  // Descriptors whose override was decided as if absent: RequestBounds::max_overrides others
  // had counters already, the backend could not hold it, or its unit was unknown. Over the
  // limiter's life.
  std::uint64_t ignored_overrides() const {
    return ignored_overrides_.load(std::memory_order_relaxed);
  }
  // Calls whose domain no configuration file names (answered OK, limiting nothing: a domain
  // misspelt in Envoy's configuration or in a file). Over the limiter's life.
  std::uint64_t unknown_domain_calls() const {
    return unknown_domain_calls_.load(std::memory_order_relaxed);
  }

  // Every limit's counters, configured limits first, in configuration order.
  std::vector<LimitStats> stats() const {
    std::shared_ptr<const Generation> gen = current();
    std::vector<LimitStats> out;
    for (std::size_t i = 0; i < gen->counters.size(); ++i) {
      const Counters& c = *gen->counters[i];
      out.push_back({.label = gen->rule(i).label,
                     .total_hits = c.total_hits.load(),
                     .over_limit = c.over_limit.load(),
                     .near_limit = c.near_limit.load(),
                     .within_limit = c.within_limit.load(),
                     .shadow_mode = c.shadow_mode.load()});
    }
    return out;
  }

 private:
  struct Counters {
    std::atomic<std::uint64_t> total_hits{0}, over_limit{0}, near_limit{0}, within_limit{0},
        shadow_mode{0};
  };

  // One published configuration: the compiled limits, the overrides seen so far (their backend
  // rules follow the limits'), the backend over all of them and every rule's counters.
  struct Generation {
    std::shared_ptr<const detail::CompiledLimits> limits;
    std::vector<detail::LimitRule> overrides;
    absl::flat_hash_map<std::uint64_t, std::size_t> override_index;  // override_id -> overrides
    std::vector<CompiledRule> backend_rules;
    mutable Backend backend;  // check_rules is thread-safe; the engine holds its backend alike
    std::vector<std::shared_ptr<Counters>> counters;  // limits' rules, then overrides
    std::unique_ptr<const sluice::detail::LocalShare<LocalClock>> local;  // kLocal only

    // Overrides the backend refused (decided as absent), by override_id.
    absl::flat_hash_set<std::uint64_t> refused_overrides{};

    const detail::LimitRule& rule(std::size_t i) const {
      return i < limits->rule_count() ? limits->rule(i) : overrides[i - limits->rule_count()];
    }
    // Whether override `id` needs no new generation: it has a counter, was refused, or the
    // bound is reached (make_plan then decides it as absent).
    bool settled(std::uint64_t id, std::size_t max_overrides) const {
      return override_index.contains(id) || refused_overrides.contains(id) ||
             overrides.size() + refused_overrides.size() >= max_overrides;
    }
  };

  // A descriptor as it will be decided: its rule (index into Generation::rule) and hits.
  struct Step {
    std::size_t rule = detail::kNone;
    std::uint64_t hits = 1;
    bool never_fits = false;  // a limit of 0, or more hits than the burst
  };
  struct Plan {
    absl::InlinedVector<Step, 8> steps;
    absl::InlinedVector<std::string, 8> keys;  // counter keys, per step
    std::uint64_t ignored_overrides = 0;       // overrides without counters, decided as absent
  };

  explicit BasicLimiter(Options options) : options_(std::move(options)) {}

  static std::uint64_t override_id(const LimitOverride& o) {
    return (std::uint64_t{o.requests_per_unit} << 8) | static_cast<std::uint64_t>(o.unit);
  }

  std::shared_ptr<const Generation> current() const {
    sluice::detail::SpinLockHolder hold(current_lock_);
    return current_;
  }

  // Publishes `next`; the generation it replaced, for the caller to let go of outside the spin
  // lock (or to retire).
  std::shared_ptr<const Generation> publish(std::shared_ptr<const Generation> next) const {
    sluice::detail::SpinLockHolder hold(current_lock_);
    std::swap(current_, next);
    return next;
  }

  std::size_t collect_replaced_locked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(retired_mutex_) {
    std::erase_if(replaced_, [](sluice::detail::Retired<Generation>& r) { return r.collect(); });
    return replaced_.size();
  }

  // A file read while it is being written often has no limit yet, and would stop limiting by
  // accident: FailedPrecondition when `next` has no limit that can deny while `running` has,
  // unless a domain says `limits_nothing`, or when a domain of both has none left that can while
  // it had, unless that domain says `limits_nothing`. A domain whose file is gone may go.
  static absl::Status check_still_limits(const ServiceConfig& config,
                                         const detail::CompiledLimits& next,
                                         const detail::CompiledLimits& running) {
    const bool on_purpose = std::any_of(config.domains.begin(), config.domains.end(),
                                        [](const DomainConfig& d) { return d.limits_nothing; });
    if (!on_purpose && next.enforcing_rule_count() == 0 && running.enforcing_rule_count() > 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the new configuration has no limit that can deny a request, where the running one has ",
          running.enforcing_rule_count(),
          ", so it would limit nothing; if a file is still being written, replace it atomically "
          "instead (write a temporary file, then rename it over this one); to remove every limit "
          "on purpose, add `limits_nothing: true` to a domain file"));
    }
    for (const DomainConfig& d : config.domains) {
      const std::size_t had = running.enforcing_rule_count(d.domain);
      if (d.limits_nothing || had == 0 || next.enforcing_rule_count(d.domain) > 0) continue;
      return absl::FailedPreconditionError(absl::StrCat(
          d.source.empty() ? "" : absl::StrCat(sluice::detail::plain_or_quoted(d.source), ": "),
          "domain ", sluice::detail::quoted(d.domain),
          " has no limit that can deny a request, where the running one has ", had,
          ", so it would limit none of its calls; if the file is still being written, replace it "
          "atomically instead (write a temporary file, then rename it over this one); to remove "
          "every limit of the domain on purpose, add `limits_nothing: true` to its file"));
    }
    return absl::OkStatus();
  }

  // reload() under the reload mutex: publishes `compiled`; the generation it replaced (nullptr
  // for the first).
  absl::StatusOr<std::shared_ptr<const Generation>> replace(const ServiceConfig& config,
                                                            detail::CompiledLimits compiled) {
    sluice::detail::MutexLock lock(reload_mutex_);
    std::shared_ptr<const Generation> now = current();
    if (now != nullptr) {
      if (absl::Status s = check_still_limits(config, compiled, *now->limits); !s.ok()) return s;
    }
    auto limits = std::make_shared<const detail::CompiledLimits>(std::move(compiled));
    absl::StatusOr<std::shared_ptr<const Generation>> next =
        build(limits, now ? now->overrides : std::vector<detail::LimitRule>{},
              now ? now->refused_overrides : absl::flat_hash_set<std::uint64_t>{}, now.get());
    if (!next.ok()) return next.status();
    now.reset();  // publish() returns the only other reference reload() keeps
    return publish(*std::move(next));
  }

  absl::Status validate(const Request& request) const {
    const RequestBounds& b = options_.bounds;
    if (request.domain.empty()) return invalid("the domain must not be empty");
    if (request.domain.size() > b.max_domain_bytes) {
      return invalid(absl::StrCat("the domain is longer than ", b.max_domain_bytes, " bytes"));
    }
    if (request.descriptors.empty()) return invalid("a request needs at least one descriptor");
    if (request.descriptors.size() > b.max_descriptors) {
      return invalid(absl::StrCat("more than ", b.max_descriptors, " descriptors"));
    }
    for (std::size_t i = 0; i < request.descriptors.size(); ++i) {
      const Descriptor& d = request.descriptors[i];
      const std::string at = absl::StrCat("descriptors[", i, "]");
      if (d.entries.empty()) return invalid(absl::StrCat(at, " has no entries"));
      if (d.entries.size() > b.max_entries) {
        return invalid(absl::StrCat(at, " has more than ", b.max_entries, " entries"));
      }
      for (const Entry& e : d.entries) {
        if (e.key.empty()) return invalid(absl::StrCat(at, " has an entry with an empty key"));
        if (e.key.size() > b.max_key_bytes) {
          return invalid(
              absl::StrCat(at, " has an entry key longer than ", b.max_key_bytes, " bytes"));
        }
      }
    }
    return absl::OkStatus();
  }

  static absl::Status invalid(const std::string& what) { return absl::InvalidArgumentError(what); }

  // A domain or key longer than a call may carry, or a descriptor nested deeper than a call's
  // entries reach, matches no call: validate() refuses every call that names it, and a proxy that
  // fails open (Envoy's default) admits those calls, so its limits would limit nothing. Refused
  // where it is configured instead. O(descriptors).
  static absl::Status check_within_bounds(const ServiceConfig& config, const RequestBounds& b) {
    for (const DomainConfig& d : config.domains) {
      const std::string source =
          d.source.empty() ? "" : absl::StrCat(sluice::detail::plain_or_quoted(d.source), ": ");
      if (d.domain.size() > b.max_domain_bytes) {
        return invalid(absl::StrCat(
            source, "domain ", sluice::detail::quoted_prefix(d.domain, 64), " is ", d.domain.size(),
            " bytes, more than a call's domain may have (max_domain_bytes ", b.max_domain_bytes,
            "), so no call can match it; shorten it or raise the bound"));
      }
      if (absl::Status s = check_descriptors_within(d.descriptors, source, "descriptors", 1, b);
          !s.ok()) {
        return s;
      }
    }
    return absl::OkStatus();
  }

  // A limit's name is repeated in every status and RateLimit field that names it: at most
  // kMaxLimitNameBytes, so that 64 of them cannot make an answer past gRPC's message limit (a
  // failed call, which a proxy that fails open admits), and no control byte, which would break
  // those fields.
  static absl::Status check_limit_name(std::string_view name, const std::string& source,
                                       const std::string& at) {
    const bool control = std::any_of(name.begin(), name.end(), [](char c) {
      const auto byte = static_cast<unsigned char>(c);
      return byte < 0x20 || byte == 0x7f;
    });
    if (name.size() <= kMaxLimitNameBytes && !control) return absl::OkStatus();
    return invalid(
        absl::StrCat(source, at, ".rate_limit.name ", sluice::detail::quoted_prefix(name, 64), ": ",
                     control ? "holds a control byte"
                             : absl::StrCat(name.size(), " bytes, more than ", kMaxLimitNameBytes),
                     "; every answer that names the limit repeats it"));
  }

  // check_within_bounds for the descriptors at `depth` (1: a domain's own) under `path`.
  static absl::Status check_descriptors_within(const std::vector<DescriptorConfig>& descriptors,
                                               const std::string& source, const std::string& path,
                                               std::size_t depth, const RequestBounds& b) {
    for (std::size_t i = 0; i < descriptors.size(); ++i) {
      const DescriptorConfig& c = descriptors[i];
      const std::string at = absl::StrCat(path, "[", i, "]");
      if (c.key.size() > b.max_key_bytes) {
        return invalid(absl::StrCat(
            source, at, ".key: ", c.key.size(), " bytes, more than a call's entry key may have ",
            "(max_key_bytes ", b.max_key_bytes, "), so no call can match it; shorten it or raise ",
            "the bound"));
      }
      if (c.rate_limit) {
        if (absl::Status s = check_limit_name(c.rate_limit->name, source, at); !s.ok()) return s;
      }
      if (depth > b.max_entries) {
        return invalid(absl::StrCat(source, at, ": nested ", depth,
                                    " deep, deeper than a call's descriptor has entries "
                                    "(max_entries ",
                                    b.max_entries, "), so no call can reach it"));
      }
      if (absl::Status s = check_descriptors_within(c.descriptors, source,
                                                    absl::StrCat(at, ".descriptors"), depth + 1, b);
          !s.ok()) {
        return s;
      }
    }
    return absl::OkStatus();
  }

  // The current generation, after publishing one with every override of `request` it lacks (or,
  // for one the backend refuses, one that remembers the refusal: decided as absent from then on,
  // without building again). Settled overrides take no lock.
  absl::StatusOr<std::shared_ptr<const Generation>> generation_for(const Request& request) const {
    std::shared_ptr<const Generation> gen = current();
    if (!gen->limits->has_domain(request.domain)) return gen;
    const std::size_t max = options_.bounds.max_overrides;
    for (const Descriptor& d : request.descriptors) {
      // An unknown unit has no period: make_plan decides it as absent, as a refused one.
      if (!d.limit || unit_period(d.limit->unit).count() == 0 ||
          gen->settled(override_id(*d.limit), max)) {
        continue;
      }
      sluice::detail::MutexLock lock(reload_mutex_);
      gen = current();
      const std::uint64_t id = override_id(*d.limit);
      if (gen->settled(id, max)) continue;
      std::vector<detail::LimitRule> overrides = gen->overrides;
      overrides.push_back(detail::CompiledLimits::override_rule(*d.limit).first);
      absl::StatusOr<std::shared_ptr<const Generation>> next =
          build(gen->limits, std::move(overrides), gen->refused_overrides, gen.get());
      if (!next.ok()) {  // the backend cannot hold it: the same generation, remembering that
        absl::flat_hash_set<std::uint64_t> refused = gen->refused_overrides;
        refused.insert(id);
        next = build(gen->limits, gen->overrides, std::move(refused), gen.get());
      }
      if (!next.ok()) return next.status();
      gen = *next;
      // The generation replaced shares its limits and every counter state with `gen`: what the
      // last holder frees is a few tables the size of the rule count.
      publish(gen);
    }
    return gen;
  }

  // A generation over `limits` and `overrides`, sharing `previous`'s state where it can.
  absl::StatusOr<std::shared_ptr<const Generation>> build(
      std::shared_ptr<const detail::CompiledLimits> limits,
      std::vector<detail::LimitRule> overrides, absl::flat_hash_set<std::uint64_t> refused,
      const Generation* previous) const {
    std::vector<CompiledRule> rules = limits->backend_rules();
    absl::flat_hash_map<std::uint64_t, std::size_t> index;
    for (std::size_t i = 0; i < overrides.size(); ++i) {
      const GcraWindow& w = overrides[i].windows.front();
      const LimitOverride o{.requests_per_unit = static_cast<std::uint32_t>(w.requests),
                            .unit = override_unit(w.period)};
      index.emplace(override_id(o), i);
      overrides[i].label = overrides[i].name = limits->override_label(o);
      if (overrides[i].admits_nothing) continue;
      overrides[i].backend_rule = rules.size();
      rules.push_back(detail::CompiledLimits::override_rule(o).second);
      rules.back().label = overrides[i].label;
    }
    absl::StatusOr<Backend> backend =
        Backend::create(rules, previous ? &previous->backend : nullptr, options_.backend);
    if (!backend.ok()) return backend.status();
    auto gen = std::make_unique<Generation>(Generation{std::move(limits),
                                                       std::move(overrides),
                                                       std::move(index),
                                                       std::move(rules),
                                                       *std::move(backend),
                                                       {},
                                                       {},
                                                       std::move(refused)});
    carry_counters(*gen, previous);
    if (options_.on_backend_error == FailureMode::kLocal) {
      auto local = sluice::detail::LocalShare<LocalClock>::create(
          gen->backend_rules, options_.local_share_permille,
          sluice::detail::LocalClockOf<typename Backend::Options>::get(options_.backend),
          options_.local_retry_interval, previous != nullptr ? previous->local.get() : nullptr);
      if (!local.ok()) return local.status();
      gen->local = *std::move(local);
    }
    return sluice::detail::make_retirable(std::move(gen));
  }

  // Each rule's counters: a configured limit keeps those of `previous`'s limit of the same
  // label, an override those of the same rate. An override's label depends on the configured
  // limits (CompiledLimits::override_label), so matching overrides by label could hand one's
  // counters to the other after a reload.
  static void carry_counters(Generation& gen, const Generation* previous) {
    absl::flat_hash_map<absl::string_view, std::shared_ptr<Counters>> by_label;
    absl::flat_hash_map<std::uint64_t, std::shared_ptr<Counters>> by_override;
    if (previous != nullptr) {
      const std::size_t n = previous->limits->rule_count();
      for (std::size_t i = 0; i < n; ++i) {
        by_label.emplace(previous->limits->rule(i).label, previous->counters[i]);
      }
      for (const auto& [id, j] : previous->override_index) {
        by_override.emplace(id, previous->counters[n + j]);
      }
    }
    const std::size_t n = gen.limits->rule_count();
    gen.counters.resize(n + gen.overrides.size());
    for (std::size_t i = 0; i < n; ++i) {
      auto it = by_label.find(gen.limits->rule(i).label);
      gen.counters[i] = it != by_label.end() ? it->second : std::make_shared<Counters>();
    }
    for (const auto& [id, j] : gen.override_index) {
      auto it = by_override.find(id);
      gen.counters[n + j] = it != by_override.end() ? it->second : std::make_shared<Counters>();
    }
  }

  static Unit override_unit(std::chrono::nanoseconds period) {
    for (Unit u :
         {Unit::kSecond, Unit::kMinute, Unit::kHour, Unit::kDay, Unit::kMonth, Unit::kYear}) {
      if (unit_period(u) == period) return u;
    }
    return Unit::kUnknown;
  }

  // Each descriptor's rule (after overrides and `replaces`), hits and counter key.
  static Plan make_plan(const Generation& gen, const Request& request) {
    Plan plan;
    plan.steps.resize(request.descriptors.size());
    plan.keys.resize(request.descriptors.size());
    absl::flat_hash_set<absl::string_view> replaced;
    for (std::size_t i = 0; i < request.descriptors.size(); ++i) {
      const Descriptor& d = request.descriptors[i];
      Step& step = plan.steps[i];
      // The request's 0 is its protocol default, 1; a descriptor's own 0 is set on purpose.
      step.hits = d.hits_addend ? *d.hits_addend : std::max<std::uint64_t>(1, request.hits_addend);
      if (!gen.limits->has_domain(request.domain)) continue;
      const auto over =
          d.limit ? gen.override_index.find(override_id(*d.limit)) : gen.override_index.end();
      if (d.limit && over == gen.override_index.end()) ++plan.ignored_overrides;
      step.rule = over != gen.override_index.end() ? gen.limits->rule_count() + over->second
                                                   : gen.limits->match(request.domain, d.entries);
      if (step.rule == detail::kNone) continue;
      const detail::LimitRule& rule = gen.rule(step.rule);
      for (const std::string& name : rule.replaces) replaced.insert(name);
      step.never_fits = rule.admits_nothing || step.hits > rule.max_hits;
      std::string& key = plan.keys[i];
      key.push_back(rule.key_tag);
      append_key_part(key, request.domain);
      for (const Entry& e : d.entries) {
        append_key_part(key, e.key);
        append_key_part(key, e.value);
      }
    }
    for (Step& step : plan.steps) {
      if (step.rule != detail::kNone && gen.rule(step.rule).named &&
          replaced.contains(gen.rule(step.rule).name)) {
        step.rule = detail::kNone;
      }
    }
    return plan;
  }

  enum class Group { kEnforcing, kShadow };

  bool in_group(const Generation& gen, const Step& step, Group group) const {
    if (step.rule == detail::kNone) return false;
    const detail::LimitRule& rule = gen.rule(step.rule);
    return !rule.unlimited && rule.shadow == (group == Group::kShadow);
  }

  void decide(const Generation& gen, const Plan& plan, Response& response) const {
    const std::size_t n = plan.steps.size();
    absl::InlinedVector<Decision, 8> decisions(n);
    absl::InlinedVector<bool, 8> denied(n, false);
    const bool over = decide_enforcing(gen, plan, decisions, denied, response);
    // A backend that just failed this call would keep it waiting again for limits that never
    // decide it (the local share, when there is one, answers at once).
    if (!response.backend_failed || gen.local != nullptr) decide_shadow(gen, plan, over, decisions);
    std::size_t binding = n;  // the descriptor the headers describe
    for (std::size_t i = 0; i < n; ++i) {
      const Step& step = plan.steps[i];
      DescriptorStatus& status = response.statuses[i];
      if (step.rule == detail::kNone) continue;
      const detail::LimitRule& rule = gen.rule(step.rule);
      if (rule.unlimited) {
        status.limit_remaining = std::numeric_limits<std::uint32_t>::max();
        count(gen, step, Decision{.remaining = status.limit_remaining}, false, over);
        continue;
      }
      const Decision& d = decisions[i];
      status.current_limit = detail::report(rule, d.binding_window);
      status.limit_remaining = static_cast<std::uint32_t>(
          std::min<std::uint64_t>(d.remaining, std::numeric_limits<std::uint32_t>::max()));
      status.duration_until_reset = d.reset_after;
      status.code = denied[i] && !rule.shadow ? Code::kOverLimit : Code::kOk;
      count(gen, step, d, denied[i], over);
      if (!rule.shadow && binds_before(i, binding, decisions, denied)) binding = i;
    }
    if (over) response.overall_code = Code::kOverLimit;
    if (options_.response_headers && binding != n) {
      add_headers(gen.rule(plan.steps[binding].rule), decisions[binding], response);
    }
  }

  // Whether descriptor `i` describes the request better than `binding`: the first denying one,
  // else the one with the least remaining.
  static bool binds_before(std::size_t i, std::size_t binding, std::span<const Decision> decisions,
                           std::span<const bool> denied) {
    if (binding == decisions.size()) return true;
    if (denied[i] != denied[binding]) return denied[i];
    return !denied[i] && decisions[i].remaining < decisions[binding].remaining;
  }

  // RateLimit-Policy and RateLimit for the binding limit's binding window; Retry-After.
  static void add_headers(const detail::LimitRule& rule, const Decision& d, Response& response) {
    const GcraWindow& w = rule.windows[std::min(d.binding_window, rule.windows.size() - 1)];
    response.headers.push_back(ratelimit_policy_field(
        QuotaPolicy{.name = rule.name, .quota = w.burst, .window = w.period}));
    ServiceLimit limit = service_limit(rule.name, d);
    if (response.overall_code == Code::kOverLimit && d.allowed()) {
      limit.effective_window = std::chrono::seconds(retry_after_seconds(response.retry_after));
    }
    response.headers.push_back(ratelimit_field(limit));
    if (response.overall_code == Code::kOverLimit) {
      response.headers.push_back(retry_after_field(response.retry_after));
    }
  }

  // One backend call's keys. Descriptors of one group with the same limit and entries share one
  // key whose cost is the sum of their hits: decided once, so that together they cannot take
  // more than the bucket holds.
  struct Batch {
    absl::InlinedVector<RuleKey, 8> keys;
    absl::InlinedVector<std::uint64_t, 8> max_hits;  // per key: more never fits
    absl::InlinedVector<std::size_t, 8> key_of;      // per descriptor: its key, or kNone
  };

  Batch collect(const Generation& gen, const Plan& plan, Group group) const {
    Batch b;
    b.key_of.assign(plan.steps.size(), detail::kNone);
    for (std::size_t i = 0; i < plan.steps.size(); ++i) {
      const Step& step = plan.steps[i];
      if (!in_group(gen, step, group)) continue;
      const detail::LimitRule& rule = gen.rule(step.rule);
      if (rule.backend_rule == detail::kNone) continue;  // admits nothing: no counter
      std::size_t j = 0;
      while (j < b.keys.size() &&
             (b.keys[j].rule != rule.backend_rule || b.keys[j].key != plan.keys[i])) {
        ++j;
      }
      if (j == b.keys.size()) {
        b.keys.push_back({.rule = rule.backend_rule, .key = plan.keys[i], .cost = 0});
        b.max_hits.push_back(rule.max_hits);
      }
      std::uint64_t& cost = b.keys[j].cost;
      cost = cost > std::numeric_limits<std::uint64_t>::max() - step.hits
                 ? std::numeric_limits<std::uint64_t>::max()
                 : cost + step.hits;
      b.key_of[i] = j;
    }
    return b;
  }

  // The enforcing limits, all or nothing; true if the request is over limit. `denied` marks the
  // descriptors that deny it; `decisions` holds each one's state (unchanged when over limit).
  bool decide_enforcing(const Generation& gen, const Plan& plan, std::span<Decision> decisions,
                        std::span<bool> denied, Response& response) const {
    Batch b = collect(gen, plan, Group::kEnforcing);
    bool never_fits = false;
    for (std::size_t i = 0; i < plan.steps.size(); ++i) {
      const std::size_t j = b.key_of[i];
      const bool cannot = in_group(gen, plan.steps[i], Group::kEnforcing) &&
                          (j == detail::kNone ? gen.rule(plan.steps[i].rule).admits_nothing
                                              : b.keys[j].cost > b.max_hits[j]);
      denied[i] = cannot;
      never_fits = never_fits || cannot;
    }
    if (b.keys.empty()) return never_fits;
    absl::InlinedVector<Decision, 8> out(b.keys.size());
    if (!never_fits) {
      // A backend that reports a denied request's limits as they stand answers in this call.
      constexpr Mode kMode = StandingBackend<Backend> ? Mode::kAsTheyStand : Mode::kAllOrNothing;
      if (!call(gen, b.keys, kMode, out, response)) return fail(gen, plan, decisions, denied);
      bool all = true;
      for (std::size_t i = 0; i < plan.steps.size(); ++i) {
        if (b.key_of[i] == detail::kNone) continue;
        const Decision& d = out[b.key_of[i]];
        decisions[i] = d;
        if (d.allowed()) continue;
        all = false;
        denied[i] = true;
        response.retry_after = std::max(response.retry_after, d.retry_after);
      }
      if (all) return false;
      if constexpr (StandingBackend<Backend>) return true;  // `out` held them as they stand
    }
    return report_unchanged(gen, plan, b, never_fits, decisions, denied, response);
  }

  // Over limit: nothing was consumed. Each descriptor reports its limit as it stands (a peek at
  // cost 0: a second call, unless the backend answered it in the first, StandingBackend); when
  // nothing was decided (a hit that never fits), its code says whether its own hits would have
  // fitted.
  bool report_unchanged(const Generation& gen, const Plan& plan, Batch& b, bool never_fits,
                        std::span<Decision> decisions, std::span<bool> denied,
                        Response& response) const {
    const absl::InlinedVector<RuleKey, 8> wanted = b.keys;
    for (RuleKey& k : b.keys) k.cost = 0;
    absl::InlinedVector<Decision, 8> out(b.keys.size());
    if (!call(gen, b.keys, Mode::kAllOrNothing, out, response)) return true;
    for (std::size_t i = 0; i < plan.steps.size(); ++i) {
      const std::size_t j = b.key_of[i];
      if (j == detail::kNone || !in_group(gen, plan.steps[i], Group::kEnforcing)) continue;
      if (!denied[i]) {
        decisions[i] = out[j];
        denied[i] = never_fits && out[j].remaining < wanted[j].cost;
      } else if (never_fits) {  // no decision was taken: report the peek
        decisions[i] = out[j];
      }
    }
    return true;
  }

  // Shadow mode limits: consume where they have room when the request was admitted; else a peek.
  void decide_shadow(const Generation& gen, const Plan& plan, bool over,
                     std::span<Decision> decisions) const {
    Batch b = collect(gen, plan, Group::kShadow);
    if (b.keys.empty()) return;
    for (std::size_t j = 0; j < b.keys.size(); ++j) {
      if (over || b.keys[j].cost > b.max_hits[j]) b.keys[j].cost = 0;
    }
    absl::InlinedVector<Decision, 8> out(b.keys.size());
    Response ignored;
    if (!call(gen, b.keys, Mode::kEveryRule, out, ignored)) return;
    for (std::size_t i = 0; i < plan.steps.size(); ++i) {
      if (b.key_of[i] != detail::kNone) decisions[i] = out[b.key_of[i]];
    }
  }

  // How one backend call decides its keys: a ConsumptionMode, or all or nothing with a denied
  // request's admitting keys reported as they stand (StandingBackend).
  enum class Mode { kAllOrNothing, kEveryRule, kAsTheyStand };

  // One backend call; false when it failed and the failure mode decides (fail open or closed).
  // In the local mode a failing backend is skipped or, when the call fails, decided around on
  // the local share.
  bool call(const Generation& gen, std::span<const RuleKey> keys, Mode mode,
            std::span<Decision> out, Response& response) const {
    if (gen.local != nullptr && !gen.local->should_call()) {
      return call_local(gen, keys, mode, out, response);
    }
    const absl::Status s = check(gen.backend, keys, mode, out);
    if (s.ok()) {
      if (gen.local != nullptr) gen.local->record_success();
      return true;
    }
    response.backend_failed = true;
    backend_errors_.fetch_add(1, std::memory_order_relaxed);
    if (gen.local == nullptr) return false;
    gen.local->record_failure();
    return call_local(gen, keys, mode, out, response);
  }

  static absl::Status check(Backend& backend, std::span<const RuleKey> keys, Mode mode,
                            std::span<Decision> out) {
    if constexpr (StandingBackend<Backend>) {
      if (mode == Mode::kAsTheyStand) return backend.check_rules_as_they_stand(keys, out);
    }
    return backend.check_rules(keys, consumption(mode), out);
  }

  static ConsumptionMode consumption(Mode mode) {
    return mode == Mode::kEveryRule ? ConsumptionMode::kEveryRule : ConsumptionMode::kAllOrNothing;
  }

  bool call_local(const Generation& gen, std::span<const RuleKey> keys, Mode mode,
                  std::span<Decision> out, Response& response) const {
    response.degraded = true;
    local_decisions_.fetch_add(1, std::memory_order_relaxed);
    const auto label = [&](std::size_t r) { return std::string_view(gen.backend_rules[r].label); };
    return (mode == Mode::kAsTheyStand ? gen.local->check_as_they_stand(keys, out, label)
                                       : gen.local->check(keys, consumption(mode), out, label))
        .ok();
  }

  // The backend failed: every enforcing limit admits (fail open) or denies (fail closed).
  bool fail(const Generation& gen, const Plan& plan, std::span<Decision> decisions,
            std::span<bool> denied) const {
    const bool closed = options_.on_backend_error == FailureMode::kFailClosed;
    for (std::size_t i = 0; i < plan.steps.size(); ++i) {
      if (!in_group(gen, plan.steps[i], Group::kEnforcing)) continue;
      decisions[i] = Decision{.reason = closed ? Reason::kQuotaExceeded : Reason::kAllowed};
      denied[i] = closed;
    }
    return closed;
  }

  // The reference service's counters: every hit counts; near limit is within the last fifth.
  static void count(const Generation& gen, const Step& step, const Decision& d, bool denied,
                    bool over) {
    Counters& c = *gen.counters[step.rule];
    add(c.total_hits, step.hits);
    if (gen.rule(step.rule).shadow) {
      if (!d.allowed() || step.never_fits) add(c.shadow_mode, step.hits);
      return;
    }
    if (denied) {
      add(c.over_limit, step.hits);
    } else if (!over) {
      add(c.within_limit, step.hits);
      if (d.remaining * 5 < d.limit) add(c.near_limit, step.hits);
    }
  }

  // counter += hits, stopping at 2^64 - 1: a request's hits_addend is the client's to choose,
  // and a counter that wrapped would read as a small number.
  static void add(std::atomic<std::uint64_t>& counter, std::uint64_t hits) {
    std::uint64_t now = counter.load(std::memory_order_relaxed);
    std::uint64_t next = 0;
    do {
      next = hits > std::numeric_limits<std::uint64_t>::max() - now
                 ? std::numeric_limits<std::uint64_t>::max()
                 : now + hits;
    } while (next != now && !counter.compare_exchange_weak(now, next, std::memory_order_relaxed));
  }

  const Options options_;
  mutable std::atomic<std::uint64_t> backend_errors_{0};
  mutable std::atomic<std::uint64_t> local_decisions_{0};
  mutable std::atomic<std::uint64_t> ignored_overrides_{0};
  mutable std::atomic<std::uint64_t> unknown_domain_calls_{0};
  mutable sluice::detail::SpinLock current_lock_;
  mutable std::shared_ptr<const Generation> current_ ABSL_GUARDED_BY(current_lock_);
  mutable sluice::detail::Mutex reload_mutex_;  // serializes publishers; never taken to read
  // Guards replaced_; taken by reload() and collect_replaced() only, never by a call, so that no
  // call (not even one publishing an override under reload_mutex_) waits for a destructor.
  sluice::detail::Mutex retired_mutex_;
  // Configurations reloads replaced, not freed yet: those calls still hold, and any handed back
  // since the last collect. Dropping one abandons it to its last holder (the limiter's
  // destructor: freed there if handed back already).
  std::vector<sluice::detail::Retired<Generation>> replaced_ ABSL_GUARDED_BY(retired_mutex_);
};

using Limiter = BasicLimiter<InMemoryBackend<>>;

}  // namespace sluice::envoy

#endif  // SLUICE_ENVOY_LIMITER_HPP_
