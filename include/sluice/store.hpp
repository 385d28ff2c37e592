// sluice/store.hpp — the sharded keyed store under every in-memory limiter.
//
// A `ShardedStore<Cell>` maps key digests to small fixed-size cells (a GCRA TAT per window, a
// fixed-window counter per window). It has a compile-time number of shards, each with its own
// lock and its own cuckoo hash table, and a hard bound on keys per shard, so the memory of a
// store is bounded by the same number on every machine and under any key spray:
//
//   sluice::ShardedStore<MyCell> store({.max_keys_per_shard = 4096});
//   sluice::KeyDigest key = store.digest("203.0.113.7");
//   bool allowed = store.update(
//       key, now_ns,
//       [&](MyCell& cell, std::int64_t now) { return cell.try_take(now); },
//       [](sluice::StoreFull) { return false; });
//
// Bound: at most kStoreShards × max_keys_per_shard keys for the lifetime of the store.
//
// Table: each key has two candidate buckets of two slots (one 64-byte cache line for a 16-byte
// cell), from the two halves of its digest; a lookup reads the first, then the second (about
// 1.3 lines per hit at 1M keys). An insert moves residents to their other bucket along a path
// found by a bounded search, so a cell may move when another key is inserted. A table is grown
// by half before it passes 17/20 load.
//
// Overflow (a new key arrives at a full shard), inline under the shard lock the check holds:
//   1. every idle cell is dropped (idle = indistinguishable from a fresh cell; no decision
//      changes);
//   2. kEvict: if more than cap/2 cells remain, live cells are evicted in ascending order of
//      (time until fresh, digest) down to cap/2 — one-shot keys go first, keys under enforcement
//      stay. A sweep costs O(cap) and is followed by at least cap/2 inserts: amortized O(1).
//      kRejectNewKeys: nothing live is evicted. The shard keeps an index of its keys by the time
//      each cell goes idle (a min-heap of lower bounds, at least one entry per cell), so it never
//      scans: a new key at a full shard takes the place of one idle cell, and is refused only
//      when no cell is idle, with the exact time until the earliest one goes idle. A cell updated
//      since its entry was made is re-indexed when its entry comes up, paid for by those updates.
//      A removed key's entry stays until it comes up; past cap/2 such entries the index is
//      rebuilt from the table, O(capacity) after at least cap/2 removals. Fewer than 4 cells or
//      slots examined per insert (one index entry plus at most 40/17 of a rebuild), one per
//      denial, plus one per cell updated since its entry was made.
//
// Collisions: an insert does bounded work whatever the digests. A key whose two buckets stay
// full under every move the search tries goes to a stash of a few slots per shard; with the
// stash full, a table that can grow grows. Only at the largest table (a case that takes many
// keys sharing both buckets, which takes knowing the store's seed) is the key treated as at a
// full shard, among the cells of its two buckets only: kEvict evicts the one a sweep would
// evict first and takes its slot; kRejectNewKeys takes the slot of an idle one, else refuses
// the key until the earliest of them goes idle. Keys already tracked are never lost.
//
// Removal: `update_removing_idle` removes a key whose update left its cell idle (a reset, the
// last concurrency permit given back), so its room is free at once.
//
// Time: integer nanoseconds since the clock's epoch, in [-2^62, 2^62). Each shard remembers the
// latest time it has seen and clamps earlier readings to it, so a clock that steps back never
// replenishes anything.
//
// Memory per tracked key, at capacity: ≤ 20/17 slots, plus 8 per shard (a slot is the 16-byte
// digest plus the cell), 37.6 bytes for a one-window GCRA cell; kRejectNewKeys adds ≤ 3/2
// idle-index entries of 24 bytes (73.6 bytes in all). At 1M keys in a default store: 39.5 bytes of
// tables per key, 39.8 of resident memory. Tables of 1 KiB and more are mapped from the kernel in
// whole pages (detail/store_table.hpp), so an outgrown table is returned at once and resident
// memory follows the tables.
//
// Thread-safety: every member function may be called concurrently. A check takes exactly one
// shard lock for O(1) expected work (a waiter for a shard lock sleeps rather than spins, so a
// flood on one key leaves its holder the core and the cache lines); `stats()` and `shard_sizes()`
// read atomics and take no lock. Checking an existing key costs the same under both policies and
// allocates nothing; inserts allocate only when a shard's table grows or its stash takes a key.
#ifndef SLUICE_STORE_HPP_
#define SLUICE_STORE_HPP_

#include <algorithm>
#include <array>
#include <atomic>
#include <cassert>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/base/attributes.h"
#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "sluice/detail/shard_lock.hpp"
#include "sluice/detail/store_table.hpp"
#include "sluice/key.hpp"

namespace sluice {

// Shards per store. Fixed at compile time, not derived from the CPU count, so that the key bound
// kStoreShards × max_keys_per_shard is the same on every machine.
inline constexpr std::size_t kStoreShards = 64;
static_assert((kStoreShards & (kStoreShards - 1)) == 0, "kStoreShards must be a power of two");

// Default cap per shard: 16384 keys, so a store tracks at most 1,048,576 keys by default
// (about 38 MiB of tables for one-window GCRA cells at full capacity).
inline constexpr std::size_t kDefaultMaxKeysPerShard = 16384;

// What a full shard does with a new key.
enum class Overflow {
  kEvict,  // fail-open for the evicted key: drop idle cells, then evict the cheapest live ones
  kRejectNewKeys,  // fail-closed: drop idle cells; if still full, deny the new key
                   // (Reason::kStoreFull)
};

// Largest cap per shard: 2^32 keys (2^38 per store, far beyond any memory), small enough that no
// table size or byte count derived from it can overflow.
inline constexpr std::size_t kMaxKeysPerShard = std::size_t{1} << 32;

struct StoreOptions {
  std::size_t max_keys_per_shard = kDefaultMaxKeysPerShard;  // in [2, kMaxKeysPerShard]
  Overflow overflow = Overflow::kEvict;
  std::optional<std::uint64_t> seed;  // fixed digest seed (tests); random when empty
};

// InvalidArgument unless 2 ≤ max_keys_per_shard ≤ kMaxKeysPerShard. The limiters' `create` checks
// this; a ShardedStore constructed directly clamps the cap into that range instead.
inline absl::Status validate(const StoreOptions& options) {
  if (options.max_keys_per_shard < 2 || options.max_keys_per_shard > kMaxKeysPerShard) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_keys_per_shard must be in [2, 2^32], got ", options.max_keys_per_shard));
  }
  return absl::OkStatus();
}

// Monotonic counters, summed over shards; read without locks (each value is exact, the set of
// them is not a snapshot while checks run).
struct StoreStats {
  std::uint64_t size = 0;              // keys tracked now
  std::uint64_t idle_reclaimed = 0;    // idle cells dropped by sweeps
  std::uint64_t live_evicted = 0;      // live cells evicted: keys handed a fresh bucket (fail-open)
  std::uint64_t capacity_denials = 0;  // new keys denied by kRejectNewKeys
  friend bool operator==(const StoreStats&, const StoreStats&) = default;
};

// What a full kRejectNewKeys shard answers for a new key.
struct StoreFull {
  std::int64_t retry_after_ns;  // until the earliest cell of the shard goes idle (≥ 1)
};

// A cell type the store can hold: a trivially copyable value whose default value is "fresh", that
// can say whether it is idle (indistinguishable from fresh) at a time and how long until it is.
// The store relies on: a cell left alone stays idle once idle, it is idle at
// now + time_until_fresh(now), and an update never makes it go idle sooner (the limiters' cells
// only move forward). An update that breaks the last rule only delays reclaiming that cell.
// Under kRejectNewKeys a lower bound suffices (the idle index orders cells by it and then asks the
// cell itself); a cell whose updates can make it idle early (concurrency permits given back) is
// updated with update_removing_idle and reports the earliest time it could go idle.
template <class C>
concept StoreCell = std::is_trivially_copyable_v<C> && std::default_initializable<C> &&
    requires(const C& cell, std::int64_t now) {
  { cell.idle(now) } -> std::same_as<bool>;
  { cell.time_until_fresh(now) } -> std::same_as<std::int64_t>;  // ns, ≥ 0
};

// The shards a multi-key operation touches, across any number of stores: add every key, then
// hold them all with HeldShardLocks. Value type; no allocation while the keys fall in at most 8
// distinct shards. Adding is O(distinct shards so far) up to 8, O(1) after.
class ShardLockSet {
 public:
  template <class Store>
  void add(const Store& store, const KeyDigest& d) {
    detail::ShardLock* const lock = &store.shards_[Store::shard_index(d)].lock;
    if (!spilled_.empty()) {
      spilled_.push_back(lock);
      return;
    }
    // Inline, the locks are kept sorted and distinct as they come: an insertion that skips a
    // repeat. Sorting later instead read the first two back as one 16-byte load of two 8-byte
    // stores, a store-forwarding stall on every request (about 3 ns measured).
    std::size_t at = size_;
    while (at > 0 && kLess(lock, inline_[at - 1])) --at;
    if (at > 0 && inline_[at - 1] == lock) return;
    if (size_ == kInline) {
      spilled_.assign(inline_, inline_ + kInline);
      spilled_.push_back(lock);
      return;
    }
    for (std::size_t j = size_; j > at; --j) inline_[j] = inline_[j - 1];
    inline_[at] = lock;
    ++size_;
  }

 private:
  friend class HeldShardLocks;
  static constexpr std::size_t kInline = 8;
  // A total order even over locks of different stores, as `<` is not.
  static constexpr std::less<detail::ShardLock*> kLess{};

  // The locks, ascending and distinct: kept so inline, sorted here once past 8.
  ABSL_ATTRIBUTE_ALWAYS_INLINE std::span<detail::ShardLock* const> sorted_locks() {
    if (ABSL_PREDICT_TRUE(spilled_.empty())) return {inline_, size_};
    return sort_spilled();
  }
  std::span<detail::ShardLock* const> sort_spilled() {
    std::sort(spilled_.begin(), spilled_.end(), kLess);
    spilled_.erase(std::unique(spilled_.begin(), spilled_.end()), spilled_.end());
    return spilled_;
  }

  // The first 8 locks, while not spilled. Uninitialized: only [0, size_) is read, and clearing
  // the slots on every request (a block clear) cost more than the rest of the lock set.
  detail::ShardLock* inline_[kInline];
  std::size_t size_ = 0;                     // of inline_, at most kInline
  std::vector<detail::ShardLock*> spilled_;  // every lock, once more than 8 distinct ones came
};

// Holds every lock of a ShardLockSet for its lifetime: each distinct lock once, taken in ascending
// address order — the one global order, so that concurrent multi-key operations cannot deadlock —
// and released in reverse. ShardedStore::update_locked requires one, so no code can reach a cell
// of a multi-key operation without holding its lock. Not copyable or movable; `set` (sorted and
// made distinct in place) must outlive it.
class HeldShardLocks {
 public:
  ABSL_ATTRIBUTE_ALWAYS_INLINE explicit HeldShardLocks(ShardLockSet& set)
      ABSL_NO_THREAD_SAFETY_ANALYSIS : locks_(set.sorted_locks()) {
    for (detail::ShardLock* lock : locks_) lock->lock();
  }
  ABSL_ATTRIBUTE_ALWAYS_INLINE ~HeldShardLocks() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    for (auto it = locks_.rbegin(); it != locks_.rend(); ++it) (*it)->unlock();
  }
  HeldShardLocks(const HeldShardLocks&) = delete;
  HeldShardLocks& operator=(const HeldShardLocks&) = delete;

  bool holds(const detail::ShardLock& lock) const noexcept {
    return std::binary_search(locks_.begin(), locks_.end(), &lock,
                              std::less<const detail::ShardLock*>());
  }

 private:
  std::span<detail::ShardLock* const> locks_;  // the set's: sorted, distinct
};

template <StoreCell Cell>
class ShardedStore {
 public:
  // One table entry: the 16-byte digest and the cell side by side.
  using Slot = detail::StoreSlot<Cell>;

  explicit ShardedStore(StoreOptions options = {})
      : options_(normalized(options)),
        hasher_(options.seed ? KeyHasher(*options.seed) : KeyHasher()),
        shards_(std::make_unique<Shard[]>(kStoreShards)) {}

  const StoreOptions& options() const noexcept { return options_; }
  std::uint64_t seed() const noexcept { return hasher_.seed(); }
  KeyDigest digest(std::string_view key) const noexcept { return hasher_(key); }
  static std::size_t shard_index(const KeyDigest& d) noexcept {
    return static_cast<std::size_t>(d.high & (kStoreShards - 1));
  }

  // Runs `fn(Cell&, std::int64_t now)` on the key's cell under its shard lock and returns its
  // result; `now` is the clamped time. An absent key is given a fresh cell; the cell is stored only
  // if `fn` leaves it non-idle (so peeks and denials of new keys store nothing). If the store
  // refuses the new key (kRejectNewKeys, shard full of live cells), returns `on_full(StoreFull)`
  // instead and nothing changes.
  template <class Fn, class OnFull>
  ABSL_ATTRIBUTE_ALWAYS_INLINE std::invoke_result_t<Fn&, Cell&, std::int64_t> update(
      KeyDigest d, std::int64_t now, Fn&& fn, OnFull&& on_full) {
    Shard& shard = shards_[shard_index(d)];
    detail::ShardLockHolder hold(shard.lock);
    return update_in(shard, d, now, fn, on_full);
  }

  // As `update`, and then, if the key was tracked and `fn` left its cell idle, the key is removed
  // at once, so its room is free for a new key without waiting for a sweep (a reset, or the last
  // permit of a concurrency limit given back). Same cost as `update`, plus O(1) for a removal;
  // under kRejectNewKeys a removal leaves a stale idle-index entry, and the index is rebuilt
  // without them (O(capacity)) after at least cap/2 of them.
  template <class Fn, class OnFull>
  std::invoke_result_t<Fn&, Cell&, std::int64_t> update_removing_idle(const KeyDigest& d,
                                                                      std::int64_t now, Fn&& fn,
                                                                      OnFull&& on_full) {
    Shard& shard = shards_[shard_index(d)];
    detail::ShardLockHolder hold(shard.lock);
    now = shard.clamp(now);
    Slot* slot = shard.table.find(d);
    if (slot == nullptr) return update_in(shard, d, now, fn, on_full);
    auto result = rejects() ? update_indexed(shard, *slot, now, fn) : fn(slot->cell, now);
    if (slot->cell.idle(now)) remove(shard, slot);
    return result;
  }

  // Multi-key transactions (the policy engine decides several keys, possibly of several stores,
  // atomically): collect every key's shard in a ShardLockSet, hold them all with HeldShardLocks,
  // then call `update_locked`, which is `update` under the held locks.
  template <class Fn, class OnFull>
  std::invoke_result_t<Fn&, Cell&, std::int64_t> update_locked(const HeldShardLocks& held,
                                                               const KeyDigest& d, std::int64_t now,
                                                               Fn&& fn, OnFull&& on_full)
      ABSL_NO_THREAD_SAFETY_ANALYSIS {  // `held` holds the lock: a dynamic set, checked below
    Shard& shard = shards_[shard_index(d)];
    assert(held.holds(shard.lock));
    (void)held;
    return update_in(shard, d, now, fn, on_full);
  }

  // The cell of tracked key `d` under the held locks, or nullptr when it is absent (nothing is
  // inserted); `now` becomes the shard's clamped time. O(1). The pointer stays valid while `held`
  // holds the shard lock and no key is inserted into or removed from this store: an insert may
  // move cells to their other bucket (callers insert only after their last use of it).
  // Always inlined: the hot all-or-nothing check calls it per key, and with a second caller
  // (a request repeating a key) GCC 12 stopped inlining it there (+25 instructions per request).
  ABSL_ATTRIBUTE_ALWAYS_INLINE Cell* find_locked(const HeldShardLocks& held, const KeyDigest& d,
                                                 std::int64_t& now)
      ABSL_NO_THREAD_SAFETY_ANALYSIS {  // `held` holds the lock: a dynamic set, checked below
    Shard& shard = shards_[shard_index(d)];
    assert(held.holds(shard.lock));
    (void)held;
    now = shard.clamp(now);
    Slot* slot = shard.table.find(d);
    return slot == nullptr ? nullptr : &slot->cell;
  }

  // Removes the key if it is tracked (its next update starts from a fresh cell) and counts it
  // as forgotten if its cell was not idle at `now`. O(1); takes the shard lock.
  void forget(const KeyDigest& d, std::int64_t now) {
    Shard& shard = shards_[shard_index(d)];
    detail::ShardLockHolder hold(shard.lock);
    now = shard.clamp(now);
    Slot* slot = shard.table.find(d);
    if (slot == nullptr) return;
    if (!slot->cell.idle(now)) Shard::bump(shard.forgotten, 1);
    remove(shard, slot);
  }

  // How many live cells the key's shard has dropped so far: keys forgotten (`forget`) while not
  // idle, and live evictions. A caller that holds a record of a key's state checks, under the
  // shard lock (from inside an update), that this did not change before trusting the record.
  std::uint64_t forgotten_in_shard(const KeyDigest& d) const noexcept {
    return shards_[shard_index(d)].forgotten.load(std::memory_order_relaxed);
  }

  // A copy of the key's cell, if the key is tracked. Takes the shard lock.
  std::optional<Cell> find(const KeyDigest& d) const {
    Shard& shard = shards_[shard_index(d)];
    detail::ShardLockHolder hold(shard.lock);
    const Slot* slot = shard.table.find(d);
    if (slot == nullptr) return std::nullopt;
    return slot->cell;
  }

  // Calls `each(const KeyDigest&, const Cell&)` for every tracked cell not idle at `now`, one
  // shard at a time under its lock (for copying a store's state into another: `each` must not use
  // this store). O(capacity) per shard.
  template <class Each>
  void for_each_live(std::int64_t now, Each&& each) const {
    for (std::size_t i = 0; i < kStoreShards; ++i) {
      Shard& shard = shards_[i];
      detail::ShardLockHolder hold(shard.lock);
      shard.table.for_each([&](const Slot& slot) {
        if (!slot.cell.idle(now)) each(slot.digest, slot.cell);
      });
    }
  }

  // Sums of the shards' counters. Lock-free.
  StoreStats stats() const noexcept {
    StoreStats s;
    for (std::size_t i = 0; i < kStoreShards; ++i) {
      const Shard& shard = shards_[i];
      s.size += shard.size.load(std::memory_order_relaxed);
      s.idle_reclaimed += shard.idle_reclaimed.load(std::memory_order_relaxed);
      s.live_evicted += shard.live_evicted.load(std::memory_order_relaxed);
      s.capacity_denials += shard.capacity_denials.load(std::memory_order_relaxed);
    }
    return s;
  }

  // Keys per shard. Lock-free.
  std::array<std::size_t, kStoreShards> shard_sizes() const noexcept {
    std::array<std::size_t, kStoreShards> sizes{};
    for (std::size_t i = 0; i < kStoreShards; ++i) {
      sizes[i] = shards_[i].size.load(std::memory_order_relaxed);
    }
    return sizes;
  }

  // Cells and slots examined to make room for new keys so far (for amortization checks): every
  // slot a sweep or an idle-index rebuild scans, and every idle-index entry whose cell is
  // checked. Lookups and placement (the bounded move search) are not counted. Lock-free.
  std::uint64_t sweep_work() const noexcept {
    std::uint64_t work = 0;
    for (std::size_t i = 0; i < kStoreShards; ++i) {
      work += shards_[i].examined.load(std::memory_order_relaxed);
    }
    return work;
  }

  // Bytes held by the shards' tables (buckets and stashes). Lock-free.
  std::size_t table_bytes() const noexcept {
    std::size_t bytes = 0;
    for (std::size_t i = 0; i < kStoreShards; ++i) {
      bytes += shards_[i].capacity_bytes.load(std::memory_order_relaxed);
    }
    return bytes;
  }

 private:
  friend class ShardLockSet;

  using Table = detail::StoreTable<Cell>;
  static constexpr std::size_t kInitialBuckets = 4;
  // A table grows (by half) before an insert would take it past this load (17/20); a grown table
  // is thus at least 17/30 full, and it never grows past what max_keys_per_shard needs.
  static constexpr std::size_t kLoadNumerator = 17;
  static constexpr std::size_t kLoadDenominator = 20;

  // When a cell goes idle (ns, lower bound) and which key it is (cells move between slots).
  struct IdleEntry {
    std::int64_t idle_at = 0;
    KeyDigest digest;
  };
  static bool later(const IdleEntry& a, const IdleEntry& b) { return a.idle_at > b.idle_at; }

  struct alignas(64) Shard {
    detail::ShardLock lock;
    std::int64_t latest ABSL_GUARDED_BY(lock) = std::numeric_limits<std::int64_t>::min();
    Table table ABSL_GUARDED_BY(lock){kInitialBuckets, kInitialBuckets};
    // kRejectNewKeys: a min-heap (by idle_at) with at least one entry per cell, whose idle_at is
    // at most the time the cell goes idle; entries of removed keys stay until they come up or
    // the index is rebuilt. Empty under kEvict.
    std::vector<IdleEntry> idle_index ABSL_GUARDED_BY(lock);

    // Written under the lock, read without it.
    std::atomic<std::uint64_t> size{0};
    std::atomic<std::uint64_t> idle_reclaimed{0};
    std::atomic<std::uint64_t> live_evicted{0};
    std::atomic<std::uint64_t> forgotten{0};  // live cells dropped: evictions and forget()
    std::atomic<std::uint64_t> capacity_denials{0};
    std::atomic<std::uint64_t> examined{0};
    std::atomic<std::size_t> capacity_bytes{kInitialBuckets * 2 * sizeof(Slot)};

    std::int64_t clamp(std::int64_t now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(lock) {
      if (now <= latest) return latest;  // no store: a repeated reading leaves the line clean
      latest = now;
      return now;
    }

    // The counters that follow the table, after it changed.
    void publish() ABSL_EXCLUSIVE_LOCKS_REQUIRED(lock) {
      size.store(table.size(), std::memory_order_relaxed);
      capacity_bytes.store(table.bytes(), std::memory_order_relaxed);
    }

    static void bump(std::atomic<std::uint64_t>& counter, std::uint64_t by) {
      counter.store(counter.load(std::memory_order_relaxed) + by, std::memory_order_relaxed);
    }
  };

  static StoreOptions normalized(StoreOptions options) {
    options.max_keys_per_shard =
        std::clamp<std::size_t>(options.max_keys_per_shard, 2, kMaxKeysPerShard);
    return options;
  }

  bool rejects() const noexcept { return options_.overflow == Overflow::kRejectNewKeys; }

  // Room for cap keys at 17/20 load, plus 8 slots that keep small tables below it (a table of a
  // few buckets fills its stash sooner): at most 2^33 buckets.
  std::size_t max_buckets() const noexcept {
    const std::size_t slots =
        (options_.max_keys_per_shard * kLoadDenominator + kLoadNumerator - 1) / kLoadNumerator + 8;
    return (slots + 1) / 2;
  }

  // When `cell` goes idle, if it is not idle at `now` (> now, saturated).
  static std::int64_t idle_at(const Cell& cell, std::int64_t now) {
    const std::int64_t wait = std::max<std::int64_t>(cell.time_until_fresh(now), 1);
    return now > 0 && wait > std::numeric_limits<std::int64_t>::max() - now
               ? std::numeric_limits<std::int64_t>::max()
               : now + wait;
  }

  template <class Fn, class OnFull>
  ABSL_ATTRIBUTE_ALWAYS_INLINE std::invoke_result_t<Fn&, Cell&, std::int64_t> update_in(
      Shard& shard, KeyDigest d, std::int64_t now, Fn& fn, OnFull& on_full)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(shard.lock) {
    now = shard.clamp(now);
    if (Slot* slot = shard.table.find(d)) {
      if (ABSL_PREDICT_FALSE(rejects())) return update_indexed(shard, *slot, now, fn);
      return fn(slot->cell, now);
    }
    return update_new(shard, d, now, fn, on_full);
  }

  // update_in for a tracked key under kRejectNewKeys. remove_idle relies on each cell having an
  // index entry no later than when it goes idle; an update that brings that time forward (an
  // attempt that succeeded, a permit given back) adds an entry at the new time. The entry it had
  // stays behind, stale once the cell goes (rebuild_index drops those past cap/2).
  template <class Fn>
  ABSL_ATTRIBUTE_NOINLINE std::invoke_result_t<Fn&, Cell&, std::int64_t> update_indexed(
      Shard& shard, Slot& slot, std::int64_t now, Fn& fn)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(shard.lock) {
    const std::int64_t before = slot.cell.idle(now) ? now : idle_at(slot.cell, now);
    auto result = fn(slot.cell, now);
    const std::int64_t after = slot.cell.idle(now) ? now : idle_at(slot.cell, now);
    if (after < before) {
      shard.idle_index.push_back({after, slot.digest});
      std::push_heap(shard.idle_index.begin(), shard.idle_index.end(), later);
      const std::size_t cap = options_.max_keys_per_shard;
      if (shard.idle_index.size() > cap + cap / 2) rebuild_index(shard, now);
    }
    return result;
  }

  // update_in for an absent key. Out of line, so that the existing-key path above keeps the
  // digest in registers (copying it for this path made GCC move it through a 16-byte stack slot
  // on every check, a store-forwarding stall).
  template <class Fn, class OnFull>
  ABSL_ATTRIBUTE_NOINLINE std::invoke_result_t<Fn&, Cell&, std::int64_t> update_new(
      Shard& shard, KeyDigest d, std::int64_t now, Fn& fn, OnFull& on_full)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(shard.lock) {
    Cell cell{};
    auto result = fn(cell, now);
    if (cell.idle(now)) return result;
    if (auto full = insert(shard, d, cell, now)) return on_full(*full);
    return result;
  }

  // Stores `cell` for absent key `d`. Makes room first when the shard is full. Returns the
  // denial when the store refuses the key.
  std::optional<StoreFull> insert(Shard& shard, const KeyDigest& d, const Cell& cell,
                                  std::int64_t now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(shard.lock) {
    if (shard.table.size() >= options_.max_keys_per_shard) {
      if (rejects()) {
        if (auto full = remove_idle(shard, now)) {
          Shard::bump(shard.capacity_denials, 1);
          return full;
        }
      } else {
        sweep(shard, now);
      }
    }
    if (auto full = place(shard, d, cell, now)) return full;
    shard.publish();
    if (rejects()) {
      shard.idle_index.push_back({idle_at(cell, now), d});
      std::push_heap(shard.idle_index.begin(), shard.idle_index.end(), later);
      // Stale entries left by removals (at most one each) past cap/2: rebuild the index.
      const std::size_t cap = options_.max_keys_per_shard;
      if (shard.idle_index.size() > cap + cap / 2) rebuild_index(shard, now);
    }
    return std::nullopt;
  }

  // Puts `cell` for absent key `d` in the table, growing it first if the key would take it past
  // 17/20 load, and again while the table cannot take the key and can grow. A key the largest
  // table cannot take is a collision (collide).
  std::optional<StoreFull> place(Shard& shard, const KeyDigest& d, const Cell& cell,
                                 std::int64_t now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(shard.lock) {
    const std::size_t limit = shard.table.slot_count() * kLoadNumerator / kLoadDenominator;
    if (shard.table.size() + 1 > limit && shard.table.bucket_count() < max_buckets()) grow(shard);
    while (shard.table.insert(d, cell) == nullptr) {
      if (shard.table.bucket_count() >= max_buckets()) return collide(shard, d, cell, now);
      grow(shard);
    }
    return std::nullopt;
  }

  // A key whose two buckets stay full whatever the move search tries, with the stash full, at
  // the largest table (which takes many keys sharing both buckets: digests chosen with the
  // store's seed). As at a full shard, but among the cells of its two buckets only: kEvict
  // evicts the first in (idle, time until fresh, digest) order and takes its slot;
  // kRejectNewKeys takes the slot of an idle one, else refuses the key until the earliest goes
  // idle. O(1).
  std::optional<StoreFull> collide(Shard& shard, const KeyDigest& d, const Cell& cell,
                                   std::int64_t now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(shard.lock) {
    Slot* cheapest = nullptr;
    std::int64_t least = 0;  // -1 for an idle cell, else its time until fresh
    shard.table.for_each_in_buckets(d, [&](Slot& slot) {
      const std::int64_t wait = slot.cell.idle(now) ? -1 : slot.cell.time_until_fresh(now);
      if (cheapest == nullptr || wait < least ||
          (wait == least && slot.digest < cheapest->digest)) {
        cheapest = &slot;
        least = wait;
      }
    });
    const bool idle = least < 0;
    if (!idle && rejects()) {
      Shard::bump(shard.capacity_denials, 1);
      return StoreFull{idle_at(cheapest->cell, now) - now};
    }
    Shard::bump(idle ? shard.idle_reclaimed : shard.live_evicted, 1);
    if (!idle) Shard::bump(shard.forgotten, 1);
    shard.table.erase(cheapest);  // now a free slot of one of d's buckets: insert takes it
    [[maybe_unused]] const Slot* placed = shard.table.insert(d, cell);
    assert(placed != nullptr);
    return std::nullopt;
  }

  // Removes the key at `slot`. Under kRejectNewKeys its idle-index entry stays behind, stale;
  // remove_idle skips it.
  void remove(Shard& shard, Slot* slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(shard.lock) {
    shard.table.erase(slot);
    shard.publish();
  }

  // kRejectNewKeys at a full shard: removes one idle cell, or returns the exact wait until the
  // earliest cell goes idle. Pops index entries that are due; an entry whose cell was updated
  // since it was made (so is not idle yet) is pushed again with the cell's current idle time, so
  // the top entry is exact when nothing is idle. Each entry examined counts one.
  std::optional<StoreFull> remove_idle(Shard& shard, std::int64_t now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(shard.lock) {
    std::vector<IdleEntry>& heap = shard.idle_index;
    while (true) {
      const IdleEntry top = heap.front();
      Shard::bump(shard.examined, 1);
      std::pop_heap(heap.begin(), heap.end(), later);
      Slot* slot = shard.table.find(top.digest);
      if (slot == nullptr) {  // stale: its key was removed
        heap.pop_back();
        continue;
      }
      if (slot->cell.idle(now)) {
        heap.pop_back();
        remove(shard, slot);
        Shard::bump(shard.idle_reclaimed, 1);
        return std::nullopt;
      }
      const std::int64_t at = idle_at(slot->cell, now);
      heap.back().idle_at = at;
      std::push_heap(heap.begin(), heap.end(), later);
      if (at == top.idle_at) return StoreFull{at - now};
    }
  }

  // Rebuilds the idle index from the table: one entry per cell, with its exact idle time.
  void rebuild_index(Shard& shard, std::int64_t now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(shard.lock) {
    Shard::bump(shard.examined, shard.table.slot_count());
    // Filled outside the index (the lambda does not hold the lock as far as the thread-safety
    // analysis can tell), keeping its memory.
    std::vector<IdleEntry> heap;
    heap.swap(shard.idle_index);
    heap.clear();
    shard.table.for_each([&](const Slot& slot) {
      heap.push_back({slot.cell.idle(now) ? now : idle_at(slot.cell, now), slot.digest});
    });
    std::make_heap(heap.begin(), heap.end(), later);
    heap.swap(shard.idle_index);
  }

  void grow(Shard& shard) ABSL_EXCLUSIVE_LOCKS_REQUIRED(shard.lock) {
    const std::size_t buckets = shard.table.bucket_count();
    Table table(std::min(buckets + buckets / 2, max_buckets()), max_buckets());
    shard.table.for_each([&](const Slot& slot) { table.insert_rebuilt(slot); });
    shard.table = std::move(table);
    shard.publish();
  }

  // kEvict at a full shard: drops idle cells, then evicts live cells down to cap/2 in ascending
  // (time until fresh, digest) order. O(capacity).
  void sweep(Shard& shard, std::int64_t now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(shard.lock) {
    struct Candidate {
      std::int64_t time_until_fresh = 0;
      Slot slot{};
    };
    thread_local std::vector<Candidate> live;
    live.clear();
    std::uint64_t idle = 0;
    shard.table.for_each([&](const Slot& slot) {
      if (slot.cell.idle(now)) {
        ++idle;
      } else {
        live.push_back({std::max<std::int64_t>(slot.cell.time_until_fresh(now), 1), slot});
      }
    });
    Shard::bump(shard.examined, shard.table.slot_count());
    Shard::bump(shard.idle_reclaimed, idle);

    const std::size_t keep = options_.max_keys_per_shard / 2;
    if (live.size() > keep) {
      auto cheaper = [](const Candidate& a, const Candidate& b) {
        if (a.time_until_fresh != b.time_until_fresh) {
          return a.time_until_fresh < b.time_until_fresh;
        }
        return a.slot.digest < b.slot.digest;
      };
      auto evicted = static_cast<std::ptrdiff_t>(live.size() - keep);
      std::nth_element(live.begin(), live.begin() + evicted, live.end(), cheaper);
      live.erase(live.begin(), live.begin() + evicted);
      Shard::bump(shard.live_evicted, static_cast<std::uint64_t>(evicted));
      Shard::bump(shard.forgotten, static_cast<std::uint64_t>(evicted));
    }
    shard.table.clear();  // in place: a fresh table would fault in every page again
    for (const Candidate& c : live) shard.table.insert_rebuilt(c.slot);
    shard.publish();
  }

  StoreOptions options_;
  KeyHasher hasher_;
  std::unique_ptr<Shard[]> shards_;
};

}  // namespace sluice

#endif  // SLUICE_STORE_HPP_
