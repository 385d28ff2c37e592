// sluice/yaml/reloading_engine.hpp — an engine that follows its YAML config file: reloads when the
// file changes (poll) or when told to (reload), keeps serving the last good generation when the
// new file is invalid, and keeps the state of every unchanged rule.
//
//   auto holder = sluice::yaml::ReloadingEngine<>::create("gateway.yaml");
//   if (!holder.ok()) return holder.status();            // the first load must succeed
//   // request threads:
//   std::shared_ptr<const sluice::RateLimitEngine> engine = (*holder)->current();
//   auto route = engine->match_route(listener, path);     // views into *engine's config
//   sluice::Evaluation e = engine->evaluate({... .route = route->route ...});
//   // a timer thread, or on SIGHUP (handled outside the signal handler):
//   if (absl::Status s = (*holder)->poll().status(); !s.ok()) log(s);   // or reload()
//
// Or let the holder do both on a thread of its own, stopped and joined by its destructor:
//
//   auto holder = sluice::yaml::ReloadingEngine<>::create(
//       "gateway.yaml", {.poll_interval = std::chrono::seconds(5), .reload_signal = SIGHUP});
//
// With `poll_interval` the thread calls poll() on that interval; with `reload_signal` the holder
// installs a handler for the signal that only writes a byte to a pipe (async-signal-safe), and
// the thread calls reload() when it reads it; `request_reload()` does the same from code. Errors
// go where every reload's go: EngineStats::failed_reloads and the event hook (ReloadEvent). A
// successful reload's ReloadEvent is reported while the new generation is compiled, a moment
// before `current()` returns it. One holder per process may take a signal; its destructor gives
// the signal its previous handling.
//
// Lifetimes: `current()` returns a shared_ptr to one immutable generation. Everything an engine
// hands out by view (match_route's route and service, consumer_for's name, rule labels) points
// into that generation, so hold the shared_ptr for the whole request and take every view from
// it: a reload publishes a new generation but the one a request holds lives until its last
// holder lets go. Never keep a view past the shared_ptr it came from.
//
// Freeing a replaced generation: the holder frees it, on a reloading thread or its own, never a
// request, which would otherwise pay for destroying it (its rules, its backend and, in memory, the
// state of every key of each rule the reload removed or changed) before it could answer. Nothing
// waits for it: a reload publishes the new generation and returns; the request that lets go of the
// old one last only hands it back (one atomic exchange: no lock, no destructor, no system call).
// The holder frees what has been handed back at the start of every `reload()` and `poll()`, right
// after a reload publishes (so a generation no request holds is freed by the reload that replaced
// it), and on every wake of its thread: so a replaced generation is freed at most one poll
// interval after its last request let go (with a reload_signal and no poll_interval the thread
// wakes every second while one is held; with no thread, at the next reload() or poll()). A
// generation that requests hold across several reloads waits with the others, one small handle
// each, and its memory stays until they let go, as any held generation's does. When the holder is
// destroyed, a replaced or current generation that a request still holds is freed by its last
// holder.
//
// Reload: the file is read once (at most kMaxConfigBytes) and loaded with load_config; the new
// generation is compiled with `engine->reload(config)`, so rules whose fingerprint is unchanged
// keep their buckets and counters (a spent budget stays spent); a rule whose only change is its
// rates, burst or windows keeps each key's spent share (BasicRateLimitEngine::reload); other
// changed rules start fresh.
// When the file cannot be read or is invalid, the current generation keeps serving, the error is
// returned, counted in EngineStats::failed_reloads and reported to the event hook (ReloadEvent).
// `poll()` reloads only when the file's content (its size and 128-bit hash) differs from the last
// content loaded or rejected, so a broken file is reported once, not on every poll, and touching
// a file without changing it reloads nothing. A file that cannot be read (e.g. missing) is
// reported on every poll until it can.
//
// A file being written: writers should replace the file atomically (write a temporary file,
// rename it over this one). For those that do not, `poll()` loads a change only once the file's
// size, modification time and content have stayed the same for Options::settle (default 1 s,
// timed by `SettleClock`), and every load refuses (FailedPrecondition, reported like an invalid
// file) a config that enforces no rule (sluice::enforced_rule_count: dry-run rules only report)
// unless it says `limits_nothing: true`: a prefix of a config is often valid YAML that attaches
// nothing, or only a dry-run bundle. `reload()` loads the file as it is now, without the settle
// interval, unless it changed while it was read (Unavailable: a writer is at work). Paths through
// symlinks are followed on every read, so a Kubernetes ConfigMap's `..data` swap is picked up.
// Every error names the file first, as load_config_file does: quoted, with each byte outside
// printable ASCII as \xNN, when its path is not printable ASCII.
//
// What adapters need: an adapter created over the holder (`HttplibLimiter<>::create(holder, ...)`,
// `GrpcRateLimiter::create(options, holder)`) registers the listener and unknown consumer it was
// given (`require`, sluice/config_requirement.hpp), and every load refuses (FailedPrecondition,
// reported like an invalid file) a config that lacks one while that adapter lives: serving it
// would let every request of the adapter's listener pass, or refuse every unknown credential.
//
// Thread-safety: `current()` may be called from any thread at any time and never waits for a
// reload: a reload reads and compiles off to the side and publishes by swapping one pointer.
// The pointer is guarded by a spin bit held only for a reference-count increment (reader) or a
// pointer swap (reload); the old generation is retired after the bit is dropped. No mutex, no
// system call, and no wait when a request lets go of a replaced generation last. This is the design
// of libstdc++'s std::atomic<std::shared_ptr>, written out because libstdc++ 12's reader drops its
// bit with a relaxed store, which leaves its pointer read unordered before the next writer's store
// (ThreadSanitizer reports it as a data race). `reload()`, `poll()` and `request_reload()` may be
// called from any thread, including one that holds a generation (a request serving an admin
// endpoint); `reload()`, `poll()` and `require()` are serialized by a mutex that the request path
// never takes (so the event hook, which a reload calls under it, must not call them).
// Complexity: a reload is linear in the file and the config (and the requirements registered);
// freeing what was handed back is linear in the replaced generations still held, plus their
// destructors.
#ifndef SLUICE_YAML_RELOADING_ENGINE_HPP_
#define SLUICE_YAML_RELOADING_ENGINE_HPP_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "sluice/clock.hpp"
#include "sluice/config_requirement.hpp"
#include "sluice/detail/adapter_identity.hpp"
#include "sluice/detail/mutex.hpp"
#include "sluice/detail/retirement.hpp"
#include "sluice/detail/spin_lock.hpp"
#include "sluice/detail/text.hpp"
#include "sluice/detail/xxhash.hpp"
#include "sluice/engine.hpp"
#include "sluice/engine_events.hpp"
#include "sluice/yaml/detail/config_file.hpp"
#include "sluice/yaml/detail/wake_pipe.hpp"
#include "sluice/yaml/load_config.hpp"

namespace sluice::yaml {

template <class Engine = RateLimitEngine, Clock SettleClock = SteadyClock>
class ReloadingEngine {
 public:
  struct Options {
    typename Engine::BackendOptions backend{};
    typename Engine::Observer observer{};
    EngineEventHook on_event{};  // also receives every reload's outcome
    // poll() loads a changed file only once its size, modification time and content have stayed
    // the same for this long (0: at once).
    std::chrono::nanoseconds settle = std::chrono::seconds(1);
    SettleClock clock{};  // measures `settle`
    // > 0: a thread of the holder's calls poll() on this interval (ms resolution).
    std::chrono::milliseconds poll_interval{0};
    // Non-zero (e.g. SIGHUP): that signal makes the holder's thread reload (see above).
    int reload_signal = 0;
  };

  // Loads `path` and compiles the first generation; its errors are load_config_file's, the
  // engine's (after "<path>: "), or FailedPrecondition for a config that attaches no rule without
  // saying `limits_nothing: true` (nothing is served without a first good config).
  static absl::StatusOr<std::unique_ptr<ReloadingEngine>> create(std::string path,
                                                                 Options options = {}) {
    absl::StatusOr<std::string> text = detail::read_config_file(path);
    if (!text.ok()) return text.status();
    const std::string shown = sluice::detail::plain_or_quoted(path);
    absl::StatusOr<PolicyConfig> config = load(shown, *text);
    if (!config.ok()) return config.status();
    if (absl::Status s = check_attaches_a_rule(shown, *config, std::nullopt); !s.ok()) return s;
    auto engine =
        Engine::create(*config, std::move(options.backend), options.observer, options.on_event);
    if (!engine.ok()) {  // e.g. a backend section naming a backend this build does not include
      return absl::Status(engine.status().code(),
                          absl::StrCat(shown, ": ", engine.status().message()));
    }
    absl::StatusOr<detail::WakePipe> wake = detail::WakePipe::create();
    if (!wake.ok()) return wake.status();
    std::unique_ptr<ReloadingEngine> holder(new ReloadingEngine(
        std::move(path), retirable(*std::move(engine)), version_of(*text),
        enforced_rule_count(*config), options.settle, std::move(options.clock), *std::move(wake)));
    if (absl::Status s = holder->start(options.poll_interval, options.reload_signal); !s.ok()) {
      return s;
    }
    return holder;
  }

  ReloadingEngine(const ReloadingEngine&) = delete;
  ReloadingEngine& operator=(const ReloadingEngine&) = delete;
  // Stops and joins the holder's thread (a reload in progress finishes first) and gives the reload
  // signal back. Frees each replaced generation that no request holds any more; one that a request
  // still holds is freed by its last holder, as the current one is.
  ~ReloadingEngine() {
    if (thread_.joinable()) {
      wake_.notify(detail::kWakeStop);
      thread_.join();
    }
    if (signal_ != 0) detail::release_reload_signal(signal_, previous_action_);
    sluice::detail::MutexLock lock(reload_mutex_);
    collect_replaced();
    replaced_.clear();  // abandons the rest to their last holders
  }

  // The generation serving now; hold it for the whole request (see Lifetimes above).
  std::shared_ptr<const Engine> current() const noexcept {
    sluice::detail::SpinLockHolder hold(current_lock_);
    return current_;
  }

  // Reads the file and publishes a new generation from it, whether or not it changed; the one it
  // replaced is freed here if no request holds it, else later (see above). On error the current
  // generation keeps serving and the error is returned, counted and reported.
  absl::Status reload() {
    sluice::detail::MutexLock lock(reload_mutex_);
    collect_replaced();
    absl::StatusOr<detail::ConfigSnapshot> file = detail::read_config_snapshot(path_);
    if (!file.ok()) return fail(file.status());
    if (!file->steady) {
      return fail(absl::UnavailableError(
          absl::StrCat(shown_path_,
                       ": the file changed while it was read, so it is still being written; "
                       "reload again once it is complete, or replace it atomically (write a "
                       "temporary file, then rename it over this one)")));
    }
    return reload_from(file->text);
  }

  // Reloads if the file's content changed since the last load (or rejected load) and has since
  // stayed the same (size, modification time and content) for Options::settle: true if a new
  // generation was published, false if nothing changed or the change is still settling, the
  // error if the changed file was bad (reported once per content).
  absl::StatusOr<bool> poll() {
    sluice::detail::MutexLock lock(reload_mutex_);
    collect_replaced();
    absl::StatusOr<detail::ConfigSnapshot> file = detail::read_config_snapshot(path_);
    if (!file.ok()) return fail(file.status());
    const Version version = version_of(file->text);
    if (version == seen_) {
      settling_.reset();
      return false;
    }
    if (!settled(*file, version)) return false;
    settling_.reset();
    absl::Status status = reload_from(file->text);
    if (!status.ok()) return status;
    return true;
  }

  // Asks the holder's thread to reload() soon, without waiting for it; with no thread
  // (poll_interval 0 and no reload_signal), reloads on this thread. Its outcome is reported as
  // every reload's.
  void request_reload() {
    if (thread_.joinable()) {
      wake_.notify(detail::kWakeReload);
    } else {
      (void)reload();
    }
  }

  // Registers what an adapter serving from this holder needs of every config (see "What adapters
  // need" above): checked now against the generation serving (InvalidArgument naming the setting
  // and the fix when it lacks a name; nothing is registered), then against every config a reload
  // or poll would load, which is refused while the returned handle or a copy of it is held.
  // Serialized with reloads, so none slips in between the check and the registration.
  // O(requirements registered).
  absl::StatusOr<RequirementHandle> require(ConfigRequirement requirement) {
    sluice::detail::MutexLock lock(reload_mutex_);
    const std::shared_ptr<const Engine> engine = current();
    if (absl::Status s = sluice::detail::check_config_names(engine.get(), requirement.listener,
                                                            requirement.unknown_consumer);
        !s.ok()) {
      return s;
    }
    std::erase_if(requirements_, [](const auto& registered) { return registered.expired(); });
    auto handle = std::make_shared<const ConfigRequirement>(std::move(requirement));
    requirements_.push_back(handle);
    return handle;
  }

  const std::string& path() const noexcept { return path_; }

 private:
  // What poll compares: the content's size and 128-bit hash.
  struct Version {
    std::uint64_t size = 0;
    std::uint64_t hash_low = 0;
    std::uint64_t hash_high = 0;
    friend bool operator==(const Version&, const Version&) = default;
  };

  // A changed file as poll() first saw it, and when (SettleClock time).
  struct Settling {
    Version version;
    detail::FileStamp stamp;
    std::chrono::nanoseconds since{};
  };

  ReloadingEngine(std::string path, std::shared_ptr<const Engine> first, Version version,
                  std::size_t enforced, std::chrono::nanoseconds settle, SettleClock clock,
                  detail::WakePipe wake)
      : path_(std::move(path)),
        shown_path_(sluice::detail::plain_or_quoted(path_)),
        settle_(settle),
        clock_(std::move(clock)),
        current_(std::move(first)),
        seen_(version),
        enforced_(enforced),
        wake_(std::move(wake)) {}

  // While a replaced generation is held and the thread has no poll interval, it wakes this often
  // to free the generation once its requests let go.
  static constexpr std::chrono::milliseconds kCollectInterval{1000};

  // The thread, when an interval or a signal asks for one. Outcomes are reported by fail() and
  // Engine::reload, so the thread drops the returned statuses. Every wake frees what requests
  // have handed back.
  absl::Status start(std::chrono::milliseconds interval, int signal) {
    if (interval.count() <= 0 && signal == 0) return absl::OkStatus();
    if (signal != 0) {
      if (absl::Status s = detail::take_reload_signal(signal, wake_, previous_action_); !s.ok()) {
        return s;
      }
      signal_ = signal;
    }
    thread_ = std::thread([this, interval] {
      bool held = false;  // a replaced generation waits for its requests
      for (;;) {
        const bool polling = interval.count() > 0;
        const detail::Wakeups woke = wake_.wait(polling || !held ? interval : kCollectInterval);
        if (woke.stop) return;
        if (woke.reload) {
          (void)reload();
        } else if (woke.timed_out && polling) {
          (void)poll();
        }
        sluice::detail::MutexLock lock(reload_mutex_);
        held = collect_replaced() > 0;
      }
    });
    return absl::OkStatus();
  }

  static Version version_of(const std::string& text) {
    const XXH128_hash_t hash = XXH3_128bits(text.data(), text.size());
    return {.size = text.size(), .hash_low = hash.low64, .hash_high = hash.high64};
  }

  // load_config with the file name (`shown_path`: plain_or_quoted) in front of its positions, as
  // load_config_file writes them.
  static absl::StatusOr<PolicyConfig> load(const std::string& shown_path, const std::string& text) {
    absl::StatusOr<PolicyConfig> config = load_config(text);
    if (!config.ok() && config.status().code() == absl::StatusCode::kInvalidArgument) {
      return absl::InvalidArgumentError(absl::StrCat(shown_path, ":", config.status().message()));
    }
    return config;
  }

  // Whether `file` (changed, as `version`) has looked the same since poll() first saw it so, at
  // least settle_ ago. A file that changed while it was read starts no interval.
  bool settled(const detail::ConfigSnapshot& file, const Version& version)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(reload_mutex_) {
    if (!file.steady) {
      settling_.reset();
      return false;
    }
    const std::chrono::nanoseconds now = clock_.now();
    if (!settling_ || settling_->version != version || settling_->stamp != file.stamp) {
      settling_ = Settling{.version = version, .stamp = file.stamp, .since = now};
    }
    return now - settling_->since >= settle_;
  }

  absl::Status reload_from(const std::string& text) ABSL_EXCLUSIVE_LOCKS_REQUIRED(reload_mutex_) {
    seen_ = version_of(text);
    absl::StatusOr<PolicyConfig> config = load(shown_path_, text);
    if (!config.ok()) return fail(config.status());
    if (absl::Status s = check_attaches_a_rule(shown_path_, *config, enforced_); !s.ok()) {
      return fail(s);
    }
    if (absl::Status s = check_requirements(*config); !s.ok()) return fail(s);
    // Engine::reload counts and reports its own outcome.
    absl::StatusOr<Engine> next = current()->reload(*config);
    if (!next.ok()) return next.status();
    enforced_ = enforced_rule_count(*config);
    std::shared_ptr<const Engine> published = retirable(*std::move(next));
    {
      sluice::detail::SpinLockHolder hold(current_lock_);
      current_.swap(published);
    }
    // The old one: freed now if no request holds it, else once they let go (collect_replaced).
    replaced_.push_back(sluice::detail::retire_later(std::move(published)));
    collect_replaced();
    return absl::OkStatus();
  }

  // A generation whose last request only hands it back to the holder, which frees it.
  static std::shared_ptr<const Engine> retirable(Engine engine) {
    return sluice::detail::make_retirable(std::make_unique<Engine>(std::move(engine)));
  }

  // Frees each replaced generation whose requests have all let go; how many are still held.
  std::size_t collect_replaced() ABSL_EXCLUSIVE_LOCKS_REQUIRED(reload_mutex_) {
    for (auto it = replaced_.begin(); it != replaced_.end();) {
      if (it->collect()) {
        it = replaced_.erase(it);
      } else {
        ++it;
      }
    }
    return replaced_.size();
  }

  // A config that enforces no rule is what a file read while being written often is (a prefix
  // that ends before the first attachment, or after only a dry-run one, is valid YAML): refused
  // unless it says so.
  static absl::Status check_attaches_a_rule(const std::string& shown_path,
                                            const PolicyConfig& config,
                                            std::optional<std::size_t> running) {
    if (config.limits_nothing || enforced_rule_count(config) > 0) return absl::OkStatus();
    const std::size_t dry_run = attached_rule_count(config);
    return absl::FailedPreconditionError(absl::StrCat(
        shown_path, ": this config attaches no rule",
        dry_run > 0 ? absl::StrCat(" that is enforced (only ", dry_run, " dry-run)") : "",
        running ? absl::StrCat(", where the running one enforces ", *running) : "",
        ", so it would limit nothing; if the file is still being written, replace it atomically "
        "instead (write a temporary file, then rename it over this one); to remove every rule on "
        "purpose, add `limits_nothing: true`"));
  }

  // The first name a registered adapter needs that `config` lacks, after "<path>: ".
  absl::Status check_requirements(const PolicyConfig& config)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(reload_mutex_) {
    for (const std::weak_ptr<const ConfigRequirement>& registered : requirements_) {
      const RequirementHandle requirement = registered.lock();
      if (!requirement) continue;  // its adapter is gone
      if (absl::Status s = check_requirement(config, *requirement); !s.ok()) {
        return absl::Status(s.code(), absl::StrCat(shown_path_, ": ", s.message()));
      }
    }
    return absl::OkStatus();
  }

  absl::Status fail(absl::Status status) {
    current()->report_failed_reload(status);
    return status;
  }

  const std::string path_;
  // path_ as messages show it: quoted and escaped unless it is printable ASCII, so that a file
  // name with a line feed or a terminal escape can neither forge nor hide a log line.
  const std::string shown_path_;
  const std::chrono::nanoseconds settle_;
  const SettleClock clock_;
  mutable sluice::detail::SpinLock current_lock_;
  std::shared_ptr<const Engine> current_ ABSL_GUARDED_BY(current_lock_);
  sluice::detail::Mutex reload_mutex_;  // serializes reload and poll; never taken by current()
  Version seen_ ABSL_GUARDED_BY(reload_mutex_);  // the content last loaded or rejected
  std::optional<Settling> settling_ ABSL_GUARDED_BY(reload_mutex_);  // a change not loaded yet
  std::size_t enforced_ ABSL_GUARDED_BY(reload_mutex_);  // enforced_rule_count of the running one
  // What live adapters need of every config (require); an expired one's adapter is gone.
  std::vector<std::weak_ptr<const ConfigRequirement>> requirements_ ABSL_GUARDED_BY(reload_mutex_);
  // Replaced generations not freed yet: those some request still holds, and any handed back since
  // the last collect_replaced(). Grows only while requests hold generations across reloads.
  std::vector<sluice::detail::Retired<Engine>> replaced_ ABSL_GUARDED_BY(reload_mutex_);
  detail::WakePipe wake_;                // wakes thread_
  int signal_ = 0;                       // the reload signal taken, if any
  struct sigaction previous_action_ {};  // its handling before
  std::thread thread_;                   // polls and reloads, if started
};

}  // namespace sluice::yaml

#endif  // SLUICE_YAML_RELOADING_ENGINE_HPP_
