// sluice/store.hpp — the sharded keyed store under every in-memory limiter.
//
// A `ShardedStore<Cell>` maps key digests to small fixed-size cells (a GCRA TAT per window, a
// fixed-window counter per window). It has a compile-time number of shards, each with its own
// lock and its own open-addressing table, and a hard bound on keys per shard, so the memory of a
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
// Overflow (a new key arrives at a full shard), inline under the shard lock the check holds:
//   1. every idle cell is dropped (idle = indistinguishable from a fresh cell; no decision
//      changes);
//   2. kEvict: if more than cap/2 cells remain, live cells are evicted in ascending order of
//      (time until fresh, digest) down to cap/2 — one-shot keys go first, keys under enforcement
//      stay. A sweep costs O(cap) and is followed by at least cap/2 inserts: amortized O(1).
//      kRejectNewKeys: nothing live is evicted. The shard keeps an index of its cells by the time
//      each goes idle (a min-heap of lower bounds, one entry per cell), so it never scans: a new
//      key at a full shard takes the place of one idle cell, and is refused only when no cell is
//      idle, with the exact time until the earliest one goes idle. A cell updated since its entry
//      was made is re-indexed when its entry comes up, paid for by those updates. A removed key
//      leaves a marker that later inserts reuse; a table that markers would take past 7/8 load is
//      rebuilt without them, O(capacity) after at least 3/4·cap removals. Fewer than 4 cells or
//      slots examined per insert (one index entry plus at most 8/3 of a rebuild), one per denial,
//      plus one per cell updated since its entry was made.
//
// Removal: `update_removing_idle` removes a key whose update left its cell idle (a reset, the
// last concurrency permit given back), so its room is free at once.
//
// Time: integer nanoseconds since the clock's epoch, in [-2^62, 2^62). Each shard remembers the
// latest time it has seen and clamps earlier readings to it, so a clock that steps back never
// replenishes anything.
//
// Memory per tracked key, at capacity: kEvict ≤ 4/3 slots (a slot is the 16-byte digest plus the
// cell); kRejectNewKeys ≤ 2 slots plus 16 bytes of idle index (80 bytes for a one-window GCRA
// cell), the room its cheap removals need.
//
// Thread-safety: every member function may be called concurrently. A check takes exactly one
// shard lock for O(1) expected work (a waiter for a shard lock sleeps rather than spins, so a
// flood on one key leaves its holder the core and the cache lines); `stats()` and `shard_sizes()`
// read atomics and take no lock. Checking an existing key costs the same under both policies and
// allocates nothing; inserts allocate only when a shard's table grows.
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
#include <new>
#include <optional>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/base/attributes.h"
#include "absl/base/thread_annotations.h"
#include "absl/container/inlined_vector.h"
#include "absl/numeric/int128.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "sluice/detail/shard_lock.hpp"
#include "sluice/key.hpp"

namespace sluice {

// Shards per store. Fixed at compile time, not derived from the CPU count, so that the key bound
// kStoreShards × max_keys_per_shard is the same on every machine.
inline constexpr std::size_t kStoreShards = 64;
static_assert((kStoreShards & (kStoreShards - 1)) == 0, "kStoreShards must be a power of two");

// Default cap per shard: 16384 keys, so a store tracks at most 1,048,576 keys by default
// (about 40 MiB for one-window GCRA cells at full capacity).
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
// hold them all with HeldShardLocks. Value type; cheap for up to 8 keys (no allocation).
class ShardLockSet {
 public:
  template <class Store>
  void add(const Store& store, const KeyDigest& d) {
    locks_.push_back(&store.shards_[Store::shard_index(d)].lock);
  }

 private:
  friend class HeldShardLocks;
  absl::InlinedVector<detail::ShardLock*, 8> locks_;
};

// Holds every lock of a ShardLockSet for its lifetime: each distinct lock once, taken in ascending
// address order — the one global order, so that concurrent multi-key operations cannot deadlock —
// and released in reverse. ShardedStore::update_locked requires one, so no code can reach a cell
// of a multi-key operation without holding its lock. Not copyable or movable; `set` (sorted and
// made distinct in place) must outlive it.
class HeldShardLocks {
 public:
  explicit HeldShardLocks(ShardLockSet& set) ABSL_NO_THREAD_SAFETY_ANALYSIS : locks_(set.locks_) {
    std::sort(locks_.begin(), locks_.end());
    locks_.erase(std::unique(locks_.begin(), locks_.end()), locks_.end());
    for (detail::ShardLock* lock : locks_) lock->lock();
  }
  ~HeldShardLocks() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    for (auto it = locks_.rbegin(); it != locks_.rend(); ++it) (*it)->unlock();
  }
  HeldShardLocks(const HeldShardLocks&) = delete;
  HeldShardLocks& operator=(const HeldShardLocks&) = delete;

  bool holds(const detail::ShardLock& lock) const noexcept {
    return std::binary_search(locks_.begin(), locks_.end(), &lock,
                              std::less<const detail::ShardLock*>());
  }

 private:
  absl::InlinedVector<detail::ShardLock*, 8>& locks_;  // the set's: sorted, distinct
};

template <StoreCell Cell>
class ShardedStore {
 public:
  // One table entry: the digest and the cell side by side, so that a check on a key touches one
  // cache line in the common case. An empty digest marks an empty slot.
  struct Slot {
    KeyDigest digest;
    Cell cell;
  };

  explicit ShardedStore(StoreOptions options = {})
      : options_(normalized(options)),
        hasher_(options.seed ? KeyHasher(*options.seed) : KeyHasher()),
        shards_(std::make_unique<Shard[]>(kStoreShards)) {
    for (std::size_t i = 0; i < kStoreShards; ++i) {
      Shard& shard = shards_[i];
      detail::ShardLockHolder hold(shard.lock);
      rebuild_keys(shard, kInitialCapacity, std::numeric_limits<std::int64_t>::min());
    }
  }

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
  // without them (O(capacity)) after at least cap/4 of them.
  template <class Fn, class OnFull>
  std::invoke_result_t<Fn&, Cell&, std::int64_t> update_removing_idle(const KeyDigest& d,
                                                                      std::int64_t now, Fn&& fn,
                                                                      OnFull&& on_full) {
    Shard& shard = shards_[shard_index(d)];
    detail::ShardLockHolder hold(shard.lock);
    now = shard.clamp(now);
    const std::size_t index = shard.probe(d);
    Slot& slot = shard.slots[index];
    if (slot.digest.empty()) return update_in(shard, d, now, fn, on_full);
    auto result = fn(slot.cell, now);
    if (slot.cell.idle(now)) remove(shard, index);
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
  // inserted); `now` becomes the shard's clamped time. The pointer stays valid while `held` holds
  // the shard lock and nothing is inserted into this store. O(1) expected.
  Cell* find_locked(const HeldShardLocks& held, const KeyDigest& d, std::int64_t& now)
      ABSL_NO_THREAD_SAFETY_ANALYSIS {  // `held` holds the lock: a dynamic set, checked below
    Shard& shard = shards_[shard_index(d)];
    assert(held.holds(shard.lock));
    (void)held;
    now = shard.clamp(now);
    Slot& slot = shard.slots[shard.probe(d)];
    return slot.digest.empty() ? nullptr : &slot.cell;
  }

  // Removes the key if it is tracked (its next update starts from a fresh cell) and counts it
  // as forgotten if its cell was not idle at `now`. O(1) plus a probe; takes the shard lock.
  void forget(const KeyDigest& d, std::int64_t now) {
    Shard& shard = shards_[shard_index(d)];
    detail::ShardLockHolder hold(shard.lock);
    now = shard.clamp(now);
    const std::size_t index = shard.probe(d);
    Slot& slot = shard.slots[index];
    if (slot.digest.empty()) return;
    if (!slot.cell.idle(now)) Shard::bump(shard.forgotten, 1);
    remove(shard, index);
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
    const Slot& slot = shard.slots[shard.probe(d)];
    if (slot.digest.empty()) return std::nullopt;  // the probe never stops at a removed slot
    return slot.cell;
  }

  // Calls `each(const KeyDigest&, const Cell&)` for every tracked cell not idle at `now`, one
  // shard at a time under its lock (for copying a store's state into another: `each` must not use
  // this store). O(capacity) per shard.
  template <class Each>
  void for_each_live(std::int64_t now, Each&& each) const {
    for (std::size_t i = 0; i < kStoreShards; ++i) {
      Shard& shard = shards_[i];
      detail::ShardLockHolder hold(shard.lock);
      for (std::size_t j = 0; j < shard.capacity; ++j) {
        const Slot& slot = shard.slots[j];
        if (holds_key(slot) && !slot.cell.idle(now)) each(slot.digest, slot.cell);
      }
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
  // slot a sweep or a rebuild without removed markers scans, and every idle-index entry whose
  // cell is checked. Lookups and placement probes are not counted. Lock-free.
  std::uint64_t sweep_work() const noexcept {
    std::uint64_t work = 0;
    for (std::size_t i = 0; i < kStoreShards; ++i) {
      work += shards_[i].examined.load(std::memory_order_relaxed);
    }
    return work;
  }

  // Bytes held by the shards' tables. Lock-free.
  std::size_t table_bytes() const noexcept {
    std::size_t bytes = 0;
    for (std::size_t i = 0; i < kStoreShards; ++i) {
      bytes += shards_[i].capacity_bytes.load(std::memory_order_relaxed);
    }
    return bytes;
  }

 private:
  friend class ShardLockSet;

  // Slot tables are aligned to cache lines so that a slot whose size divides 64 never straddles
  // two.
  static constexpr std::align_val_t kTableAlignment{64};
  static constexpr std::size_t kInitialCapacity = 8;
  struct TableDeleter {
    void operator()(Slot* p) const noexcept { ::operator delete(p, kTableAlignment); }
  };
  using Table = std::unique_ptr<Slot[], TableDeleter>;

  static Table allocate_table(std::size_t capacity) {
    static_assert(std::is_trivially_destructible_v<Slot>);
    auto* raw = static_cast<Slot*>(::operator new(capacity * sizeof(Slot), kTableAlignment));
    std::uninitialized_value_construct_n(raw, capacity);
    return Table(raw);
  }

  // When a cell goes idle (ns, lower bound) and where it is.
  struct IdleEntry {
    std::int64_t idle_at;
    std::size_t index;
  };
  static bool later(const IdleEntry& a, const IdleEntry& b) { return a.idle_at > b.idle_at; }

  // A removed key's slot: lookups probe past it, inserts reuse it. Never a hasher's output.
  static constexpr KeyDigest kRemoved{0, 1};
  static bool holds_key(const Slot& slot) {
    return !slot.digest.empty() && slot.digest != kRemoved;
  }

  // A shard's table is kept at most 3/4 full and grown by half, so a grown table is at least half
  // full; it never grows past what max_keys_per_shard needs. Removed markers (kRejectNewKeys) may
  // take a table at its largest size to 7/8.
  struct alignas(64) Shard {
    detail::ShardLock lock;
    std::int64_t latest ABSL_GUARDED_BY(lock) = std::numeric_limits<std::int64_t>::min();
    Slot* slots ABSL_GUARDED_BY(lock) = nullptr;
    std::size_t capacity ABSL_GUARDED_BY(lock) = 0;
    std::size_t count ABSL_GUARDED_BY(lock) = 0;
    std::size_t removed ABSL_GUARDED_BY(lock) = 0;  // slots marked kRemoved
    Table table ABSL_GUARDED_BY(lock);
    // kRejectNewKeys: a min-heap (by idle_at) with one entry per cell, whose idle_at is at most
    // the time the cell goes idle. Empty under kEvict.
    std::vector<IdleEntry> idle_index ABSL_GUARDED_BY(lock);

    // Written under the lock, read without it.
    std::atomic<std::uint64_t> size{0};
    std::atomic<std::uint64_t> idle_reclaimed{0};
    std::atomic<std::uint64_t> live_evicted{0};
    std::atomic<std::uint64_t> forgotten{0};  // live cells dropped: evictions and forget()
    std::atomic<std::uint64_t> capacity_denials{0};
    std::atomic<std::uint64_t> examined{0};
    std::atomic<std::size_t> capacity_bytes{0};

    std::int64_t clamp(std::int64_t now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(lock) {
      if (now <= latest) return latest;  // no store: a repeated reading leaves the line clean
      latest = now;
      return now;
    }

    // Always inline: out of line, GCC passes the digest through a stack slot as two 8-byte stores
    // read back as one 16-byte load, a store-forwarding stall on every check.
    ABSL_ATTRIBUTE_ALWAYS_INLINE std::size_t probe(const KeyDigest& d) const
        ABSL_EXCLUSIVE_LOCKS_REQUIRED(lock) {
      return probe_in(slots, capacity, d);
    }

    static void bump(std::atomic<std::uint64_t>& counter, std::uint64_t by) {
      counter.store(counter.load(std::memory_order_relaxed) + by, std::memory_order_relaxed);
    }
  };

  // Index of `d`'s slot in a table, or of the empty slot where it would go. Linear probing from a
  // multiply-shift start (any table size works); the table always has an empty slot.
  ABSL_ATTRIBUTE_ALWAYS_INLINE static std::size_t probe_in(const Slot* slots, std::size_t capacity,
                                                           const KeyDigest& d) {
    auto i = static_cast<std::size_t>(absl::Uint128High64(absl::uint128(d.low) * capacity));
    while (true) {
      const KeyDigest& at = slots[i].digest;
      if (at == d || at.empty()) return i;
      if (++i == capacity) i = 0;
    }
  }

  static StoreOptions normalized(StoreOptions options) {
    options.max_keys_per_shard =
        std::clamp<std::size_t>(options.max_keys_per_shard, 2, kMaxKeysPerShard);
    return options;
  }

  bool rejects() const noexcept { return options_.overflow == Overflow::kRejectNewKeys; }

  // kEvict: room for cap keys at 3/4 load. kRejectNewKeys: 2·cap, so that removed markers can
  // accumulate to 3/4·cap before a rebuild. At most 2^33 slots.
  std::size_t max_capacity() const noexcept {
    const std::size_t cap = options_.max_keys_per_shard;
    return rejects() ? 2 * cap : cap * 4 / 3 + 1;
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
    const std::size_t index = shard.probe(d);
    Slot& slot = shard.slots[index];
    if (!slot.digest.empty()) return fn(slot.cell, now);
    return update_new(shard, d, now, fn, on_full, index);
  }

  // update_in for an absent key whose probe ended at empty slot `index`. Out of line, so that the
  // existing-key path above keeps the digest in registers (copying it for this path made GCC move
  // it through a 16-byte stack slot on every check, a store-forwarding stall).
  template <class Fn, class OnFull>
  ABSL_ATTRIBUTE_NOINLINE std::invoke_result_t<Fn&, Cell&, std::int64_t> update_new(
      Shard& shard, KeyDigest d, std::int64_t now, Fn& fn, OnFull& on_full, std::size_t index)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(shard.lock) {
    Cell cell{};
    auto result = fn(cell, now);
    if (cell.idle(now)) return result;
    if (auto full = insert(shard, d, cell, now, index)) return on_full(*full);
    return result;
  }

  // Places `cell` for absent key `d`, whose probe ended at empty slot `index`. Makes room first
  // when the shard is full. Returns the denial when the store refuses the key.
  std::optional<StoreFull> insert(Shard& shard, const KeyDigest& d, const Cell& cell,
                                  std::int64_t now, std::size_t index)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(shard.lock) {
    if (shard.count >= options_.max_keys_per_shard) {
      if (rejects()) {
        if (auto full = remove_idle(shard, now)) {
          Shard::bump(shard.capacity_denials, 1);
          return full;
        }
      } else {
        sweep(shard, now);
        index = shard.probe(d);
      }
    }
    index = place(shard, d, index, now);
    shard.slots[index] = Slot{d, cell};
    ++shard.count;
    shard.size.store(shard.count, std::memory_order_relaxed);
    if (rejects()) {
      shard.idle_index.push_back({idle_at(cell, now), index});
      std::push_heap(shard.idle_index.begin(), shard.idle_index.end(), later);
      // Stale entries left by removals (at most one each) past cap/4: rebuild the index.
      const std::size_t cap = options_.max_keys_per_shard;
      if (shard.idle_index.size() > cap + cap / 4) {
        Shard::bump(shard.examined, shard.capacity);
        rebuild_keys(shard, shard.capacity, now);
      }
    }
    return std::nullopt;
  }

  // The slot for absent key `d` whose probe ended at empty slot `index`: the first removed slot on
  // its probe path, else `index` after growing a table that would pass 3/4 load, or rebuilding
  // without removed markers a largest table that would pass 7/8 load. With at most cap keys in
  // 2·cap slots, such a rebuild (2·cap slots examined) follows at least 3/4·cap removals.
  std::size_t place(Shard& shard, const KeyDigest& d, std::size_t index, std::int64_t now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(shard.lock) {
    if (shard.removed > 0) {
      auto i = static_cast<std::size_t>(absl::Uint128High64(absl::uint128(d.low) * shard.capacity));
      for (; i != index; i = (i + 1 == shard.capacity) ? 0 : i + 1) {
        if (shard.slots[i].digest == kRemoved) {
          --shard.removed;
          return i;
        }
      }
    }
    const std::size_t used = shard.count + shard.removed + 1;
    if (used <= shard.capacity * 3 / 4) return index;
    const bool can_grow = shard.capacity < max_capacity();
    // Rebuild at the same size when markers, not keys, fill the table: below the largest size,
    // keys removed as fast as they come (at most half the slots hold keys; after at least
    // capacity/4 − 1 removals); at the largest size, markers past 7/8 (one slot stays empty).
    const bool markers_fill =
        can_grow ? shard.count + 1 <= shard.capacity / 2 : used > shard.capacity / 8 * 7;
    if (markers_fill) {
      Shard::bump(shard.examined, shard.capacity);
      rebuild_keys(shard, shard.capacity, now);
    } else if (can_grow) {
      grow(shard, now);
    } else {
      return index;
    }
    return shard.probe(d);
  }

  // Removes the key at `index` (its slot becomes a removed marker). Under kRejectNewKeys its
  // idle-index entry stays behind, stale; remove_idle skips it.
  void remove(Shard& shard, std::size_t index) ABSL_EXCLUSIVE_LOCKS_REQUIRED(shard.lock) {
    shard.slots[index] = Slot{kRemoved, Cell{}};
    --shard.count;
    ++shard.removed;
    shard.size.store(shard.count, std::memory_order_relaxed);
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
      Slot& slot = shard.slots[top.index];
      Shard::bump(shard.examined, 1);
      std::pop_heap(heap.begin(), heap.end(), later);
      if (!holds_key(slot)) {  // stale: its key was removed by update_removing_idle
        heap.pop_back();
        continue;
      }
      if (slot.cell.idle(now)) {
        heap.pop_back();
        slot = Slot{kRemoved, Cell{}};
        --shard.count;
        ++shard.removed;
        shard.size.store(shard.count, std::memory_order_relaxed);
        Shard::bump(shard.idle_reclaimed, 1);
        return std::nullopt;
      }
      const std::int64_t at = idle_at(slot.cell, now);
      heap.back().idle_at = at;
      std::push_heap(heap.begin(), heap.end(), later);
      if (at == top.idle_at) return StoreFull{at - now};
    }
  }

  void grow(Shard& shard, std::int64_t now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(shard.lock) {
    rebuild_keys(shard, std::min(shard.capacity + shard.capacity / 2, max_capacity()), now);
  }

  // Rebuilds the table at `capacity` slots with the same keys, without removed markers, and
  // (kRejectNewKeys) the idle index with every cell's exact idle time.
  void rebuild_keys(Shard& shard, std::size_t capacity, std::int64_t now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(shard.lock) {
    const Slot* old_slots = shard.slots;
    const std::size_t old_capacity = shard.capacity;
    std::vector<IdleEntry> heap;  // filled outside the guarded member, then swapped in
    heap.swap(shard.idle_index);
    heap.clear();
    if (rejects()) heap.reserve(std::min(capacity * 3 / 4, options_.max_keys_per_shard));
    rebuild(shard, capacity, [&](auto&& keep) {
      for (std::size_t i = 0; i < old_capacity; ++i) {
        const Slot& slot = old_slots[i];
        if (!holds_key(slot)) continue;
        const std::size_t index = keep(slot);
        if (rejects()) heap.push_back({slot.cell.idle(now) ? now : idle_at(slot.cell, now), index});
      }
    });
    std::make_heap(heap.begin(), heap.end(), later);
    shard.idle_index.swap(heap);
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
    for (std::size_t i = 0; i < shard.capacity; ++i) {
      const Slot& slot = shard.slots[i];
      if (!holds_key(slot)) continue;
      if (slot.cell.idle(now)) {
        ++idle;
      } else {
        live.push_back({std::max<std::int64_t>(slot.cell.time_until_fresh(now), 1), slot});
      }
    }
    Shard::bump(shard.examined, shard.capacity);
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
    rebuild(shard, shard.capacity, [&](auto&& keep_slot) {
      for (const Candidate& c : live) keep_slot(c.slot);
    });
  }

  // Replaces the shard's table by one of `capacity` slots holding the slots that `each` yields
  // (each passed to `keep`, which returns where it went).
  template <class Each>
  void rebuild(Shard& shard, std::size_t capacity, Each&& each)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(shard.lock) {
    Table table = allocate_table(capacity);
    std::size_t count = 0;
    each([&](const Slot& slot) {
      const std::size_t index = probe_in(table.get(), capacity, slot.digest);
      table[index] = slot;
      ++count;
      return index;
    });
    shard.table = std::move(table);
    shard.slots = shard.table.get();
    shard.capacity = capacity;
    shard.count = count;
    shard.removed = 0;
    shard.size.store(count, std::memory_order_relaxed);
    shard.capacity_bytes.store(capacity * sizeof(Slot), std::memory_order_relaxed);
  }

  StoreOptions options_;
  KeyHasher hasher_;
  std::unique_ptr<Shard[]> shards_;
};

}  // namespace sluice

#endif  // SLUICE_STORE_HPP_
