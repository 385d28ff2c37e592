// sluice/detail/coalescer.hpp — concurrent single-key checks to one server as few calls.
// Internal: the Redis and PostgreSQL clients pass each single-key check through one of their own
// (redis::ClientOptions::coalesce, postgres::ClientOptions::coalesce).
//
// Up to `max_in_flight` calls are in flight at once (each on a pooled connection of its own). A
// check that finds fewer in flight is sent at once, by its own thread, as a call of its own; one
// that finds them all in flight queues. When a call returns, its leader hands the lead to the
// oldest queued check, which takes up to `max_batch` queued checks of its group (`Group`
// compares equal: for Redis the time the checks are decided at, for PostgreSQL also the limit
// and the cost) that do not `Conflict` with a member already taken (PostgreSQL: the same key)
// and sends them as one call with `send`; then the returning leader hands each member its
// result. No thread of its own.
//
// Order: the checks of one call are decided in queue order (a key repeated in it sees the
// earlier occurrences). Calls in flight at once are decided by the server in the order they
// reach it, as concurrent uncoalesced checks are: each check still takes effect once, between
// its start and its return.
//
//   sluice::detail::Coalescer<Item, Group> coalescer(64, 4);
//   absl::StatusOr<sluice::Decision> d = coalescer.check(item, group, deadline,
//       [&](std::span<const Item> items, const Group& group, sluice::detail::CoalescerDeadline by,
//           std::span<absl::StatusOr<sluice::Decision>> results) { /* one call, by `by` */ });
//
// Deadlines: every check brings its own. A queued check whose deadline passes leaves the queue
// with DeadlineExceeded, never sent (it consumed nothing); a batch is sent with the earliest
// deadline of its members, so no member waits past its own. A call that may have run is never
// sent again: its members get its error.
// Memory: the queue holds one entry per blocked caller (allocated by its check, shared with
// whoever takes it out of the queue), so it is bounded by the number of threads checking at
// once, each for at most its deadline; a batch holds at most `max_batch` items.
// Locks: the queue's lock guards only the queue. Each waiting check sleeps on an event of its
// own (event.hpp: one futex wake to hand it its result or the lead), so handing out a batch's
// results does not make its members contend for the queue or for any lock.
// Complexity: a check joins in O(1), leaves or leads in O(queued checks).
// Thread-safety: thread-safe. `send` runs on the leading caller's thread, under no lock.
#ifndef SLUICE_DETAIL_COALESCER_HPP_
#define SLUICE_DETAIL_COALESCER_HPP_

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "sluice/decision.hpp"
#include "sluice/detail/event.hpp"
#include "sluice/detail/mutex.hpp"

namespace sluice::detail {

using CoalescerDeadline = std::chrono::steady_clock::time_point;

// Never conflicts: any two checks of one group may share a call.
struct NoConflict {
  template <class Item>
  bool operator()(const Item& /*a*/, const Item& /*b*/) const noexcept {
    return false;
  }
};

template <class Item, class Group, class Conflict = NoConflict>
class Coalescer {
 public:
  using Deadline = CoalescerDeadline;

  // `max_batch` ≥ 1: the most checks one call carries; `max_in_flight` ≥ 1: the most calls in
  // flight at once.
  explicit Coalescer(std::size_t max_batch, std::size_t max_in_flight = 1)
      : max_batch_(std::max<std::size_t>(max_batch, 1)),
        max_in_flight_(std::max<std::size_t>(max_in_flight, 1)) {}
  Coalescer(const Coalescer&) = delete;
  Coalescer& operator=(const Coalescer&) = delete;

  // Decides `item` of `group` by `deadline`, alone or in a batch: `send(items, group, deadline,
  // results)` makes one call for a batch and fills one result per item. What `item` points to
  // must stay valid until it returns (it does: it blocks).
  template <class Send>
  absl::StatusOr<Decision> check(const Item& item, const Group& group, Deadline deadline,
                                 Send&& send) {
    if (claim()) {
      return send_alone(item, group, deadline, send);
    }
    const WaiterPtr me = std::make_shared<Waiter>(item, group, deadline);
    if (join(me)) {
      return send_alone(item, group, deadline, send);  // a call returned since claim()
    }
    if (std::optional<absl::StatusOr<Decision>> done = wait(*me)) {
      return *std::move(done);  // decided in another's batch, or out of time while queued
    }
    if (std::chrono::steady_clock::now() >= deadline) {  // handed the lead too late to use it
      hand_lead(pass_lead(0));
      return expired();
    }
    return lead(me, send);
  }

  // Checks waiting to be sent now.
  std::size_t queued() const {
    sluice::detail::MutexLock lock(mu_);
    return queue_.size();
  }
  // Checks that went out in one call together with at least one other check.
  std::uint64_t coalesced_checks() const {
    sluice::detail::MutexLock lock(mu_);
    return coalesced_;
  }
  // Calls made (each carrying one check or a batch).
  std::uint64_t calls() const {
    sluice::detail::MutexLock lock(mu_);
    return calls_;
  }
  // The most calls that were in flight at once (never more than max_in_flight).
  std::size_t peak_in_flight() const {
    sluice::detail::MutexLock lock(mu_);
    return peak_in_flight_;
  }

 private:
  enum class Phase { kWaiting, kLead, kDone };

  // One caller's check. Others reach it only through the queue, or as a member of the batch or
  // the next leader they took out of it; they share it with its caller, so it lives until they
  // have set its event. Whoever takes it out of the queue writes `phase` (and `result`) and then
  // sets `signaled`, once; its caller reads them only after it has seen the event set.
  struct Waiter {
    Waiter(const Item& i, const Group& g, Deadline d) : item(i), group(g), deadline(d) {}

    const Item item;
    const Group group;
    const Deadline deadline;
    sluice::detail::Event signaled;
    Phase phase = Phase::kWaiting;
    absl::StatusOr<Decision> result;  // written before phase becomes kDone
  };
  using WaiterPtr = std::shared_ptr<Waiter>;

  // True if fewer than max_in_flight calls were in flight (then nothing is queued): the caller
  // now holds one of the places in flight and sends its check at once.
  bool claim() {
    sluice::detail::MutexLock lock(mu_);
    return claim_locked();
  }
  bool claim_locked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (in_flight_ >= max_in_flight_) {
      return false;
    }
    ++in_flight_;
    peak_in_flight_ = std::max(peak_in_flight_, in_flight_);
    return true;
  }

  // claim(), or else `me` is queued (false).
  bool join(const WaiterPtr& me) {
    sluice::detail::MutexLock lock(mu_);
    if (claim_locked()) {
      return true;
    }
    queue_.push_back(me);
    return false;
  }

  // A check that found a place in flight: sent alone, with nothing allocated (a lone caller's
  // every check). Checks that queue meanwhile go out with the next call a returning leader hands
  // on, as they would if they had queued a moment later.
  template <class Send>
  absl::StatusOr<Decision> send_alone(const Item& item, const Group& group, Deadline deadline,
                                      Send& send) {
    absl::StatusOr<Decision> result = no_result();
    send(std::span<const Item>(&item, 1), group, deadline,
         std::span<absl::StatusOr<Decision>>(&result, 1));
    hand_lead(pass_lead(1));
    return result;
  }

  // `me`'s result once it is done (decided in a batch, or out of time while queued); nullopt
  // once it is handed the lead.
  std::optional<absl::StatusOr<Decision>> wait(Waiter& me) {
    if (!me.signaled.wait_until(me.deadline)) {
      if (leave(me)) {
        return absl::StatusOr<Decision>(expired());
      }
      // Taken out of the queue already: into a batch, whose deadline is at most ours, or to lead.
      me.signaled.wait_until(Deadline::max());
    }
    if (me.phase == Phase::kLead) {
      return std::nullopt;
    }
    return std::move(me.result);
  }

  // Out of time while queued: true if `me` was still queued, and now has left the queue.
  bool leave(Waiter& me) {
    sluice::detail::MutexLock lock(mu_);
    const auto at = std::find_if(queue_.begin(), queue_.end(),
                                 [&me](const WaiterPtr& w) { return w.get() == &me; });
    if (at == queue_.end()) {
      return false;
    }
    queue_.erase(at);
    return true;
  }

  // Sends `me` and the queued checks of its time (up to max_batch in all) as one call, passes the
  // lead on (the next call goes out while this one's members wake), then hands each member its
  // result.
  template <class Send>
  absl::StatusOr<Decision> lead(const WaiterPtr& me, Send& send) {
    std::vector<WaiterPtr> batch = {me};
    std::vector<WaiterPtr> late;
    take_batch(*me, batch, late);
    for (const WaiterPtr& w : late) finish(*w, expired());
    std::vector<Item> items;
    items.reserve(batch.size());
    Deadline by = me->deadline;
    for (const WaiterPtr& w : batch) {
      items.push_back(w->item);
      by = std::min(by, w->deadline);
    }
    std::vector<absl::StatusOr<Decision>> results(batch.size(), no_result());
    send(std::span<const Item>(items), me->group, by, std::span<absl::StatusOr<Decision>>(results));
    hand_lead(pass_lead(batch.size()));
    for (std::size_t i = 1; i < batch.size(); ++i) finish(*batch[i], std::move(results[i]));
    return std::move(results[0]);
  }

  // Moves the queued checks of `leader`'s group (up to max_batch - 1) that conflict with no
  // member into `batch`, in queue order, and those already out of time into `late`.
  void take_batch(const Waiter& leader, std::vector<WaiterPtr>& batch,
                  std::vector<WaiterPtr>& late) {
    const auto now = std::chrono::steady_clock::now();
    sluice::detail::MutexLock lock(mu_);
    std::erase_if(queue_, [&](const WaiterPtr& w) {
      if (w->deadline <= now) {
        late.push_back(w);
        return true;
      }
      if (batch.size() < max_batch_ && w->group == leader.group &&
          std::none_of(batch.begin(), batch.end(),
                       [&](const WaiterPtr& m) { return conflict_(m->item, w->item); })) {
        batch.push_back(w);
        return true;
      }
      return false;
    });
  }

  // A call of `sent` checks has returned (0: none was sent): the oldest queued check is the next
  // leader (returned) and takes its place in flight, or one call fewer is in flight (nullptr).
  WaiterPtr pass_lead(std::size_t sent) {
    sluice::detail::MutexLock lock(mu_);
    calls_ += sent > 0 ? 1 : 0;
    coalesced_ += sent > 1 ? sent : 0;
    if (queue_.empty()) {
      --in_flight_;
      return nullptr;
    }
    WaiterPtr next = std::move(queue_.front());
    queue_.pop_front();
    return next;
  }

  // The caller holds `next` (or a share of `w`), so it outlives the event's wake-up.
  static void hand_lead(const WaiterPtr& next) {
    if (next == nullptr) {
      return;
    }
    next->phase = Phase::kLead;
    next->signaled.set();
  }

  static void finish(Waiter& w, absl::StatusOr<Decision>&& result) {
    w.result = std::move(result);
    w.phase = Phase::kDone;
    w.signaled.set();
  }

  // What a check whose `send` filled no result gets. One status shared by every copy (a copy
  // takes a reference), so that a lone check allocates nothing for it.
  static const absl::Status& no_result() {
    static const absl::Status* const status =
        new absl::Status(absl::InternalError("sluice: no result for a coalesced check"));
    return *status;
  }

  static absl::Status expired() {
    return absl::DeadlineExceededError(
        "sluice: the call's timeout passed while the check waited to be sent");
  }

  const std::size_t max_batch_;
  [[no_unique_address]] const Conflict conflict_{};
  const std::size_t max_in_flight_;
  mutable sluice::detail::Mutex mu_;
  std::deque<WaiterPtr> queue_ ABSL_GUARDED_BY(mu_);  // oldest first; empty unless all in flight
  // Calls in flight or being prepared (each by its leader), at most max_in_flight_.
  std::size_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  std::size_t peak_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  std::uint64_t calls_ ABSL_GUARDED_BY(mu_) = 0;
  std::uint64_t coalesced_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace sluice::detail

#endif  // SLUICE_DETAIL_COALESCER_HPP_
