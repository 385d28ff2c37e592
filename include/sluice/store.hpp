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
//      kRejectNewKeys: nothing live is evicted; the new key gets a capacity denial carrying the
//      time until the earliest cell goes idle. Until that time no further sweep is attempted, so
//      denials cost O(1).
//
// Time: integer nanoseconds since the clock's epoch, in [-2^62, 2^62). Each shard remembers the
// latest time it has seen and clamps earlier readings to it, so a clock that steps back never
// replenishes anything.
//
// Thread-safety: every member function may be called concurrently. A check takes exactly one
// shard lock for O(1) expected work; `stats()` and `shard_sizes()` read atomics and take no lock.
// Checking an existing key allocates nothing; inserts allocate only when a shard's table grows.
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

#include "absl/base/thread_annotations.h"
#include "absl/container/inlined_vector.h"
#include "absl/numeric/int128.h"
#include "sluice/detail/spin_lock.hpp"
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

struct StoreOptions {
  std::size_t max_keys_per_shard = kDefaultMaxKeysPerShard;  // ≥ 2
  Overflow overflow = Overflow::kEvict;
  std::optional<std::uint64_t> seed;  // fixed digest seed (tests); random when empty
};

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
  absl::InlinedVector<detail::SpinLock*, 8> locks_;
};

// Holds every lock of a ShardLockSet for its lifetime: each distinct lock once, taken in ascending
// address order — the one global order, so that concurrent multi-key operations cannot deadlock —
// and released in reverse. ShardedStore::update_locked requires one, so no code can reach a cell
// of a multi-key operation without holding its lock. Not copyable or movable.
class HeldShardLocks {
 public:
  explicit HeldShardLocks(ShardLockSet set) ABSL_NO_THREAD_SAFETY_ANALYSIS
      : locks_(std::move(set.locks_)) {
    std::sort(locks_.begin(), locks_.end());
    locks_.erase(std::unique(locks_.begin(), locks_.end()), locks_.end());
    for (detail::SpinLock* lock : locks_) lock->lock();
  }
  ~HeldShardLocks() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    for (auto it = locks_.rbegin(); it != locks_.rend(); ++it) (*it)->unlock();
  }
  HeldShardLocks(const HeldShardLocks&) = delete;
  HeldShardLocks& operator=(const HeldShardLocks&) = delete;

  bool holds(const detail::SpinLock& lock) const noexcept {
    return std::binary_search(locks_.begin(), locks_.end(), &lock,
                              std::less<const detail::SpinLock*>());
  }

 private:
  absl::InlinedVector<detail::SpinLock*, 8> locks_;  // sorted, distinct
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
      detail::SpinLockHolder hold(shard.lock);
      rebuild(shard, kInitialCapacity, [](auto&&) {});
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
  std::invoke_result_t<Fn&, Cell&, std::int64_t> update(const KeyDigest& d, std::int64_t now,
                                                        Fn&& fn, OnFull&& on_full) {
    Shard& shard = shards_[shard_index(d)];
    detail::SpinLockHolder hold(shard.lock);
    return update_in(shard, d, now, fn, on_full);
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

  // A copy of the key's cell, if the key is tracked. Takes the shard lock.
  std::optional<Cell> find(const KeyDigest& d) const {
    Shard& shard = shards_[shard_index(d)];
    detail::SpinLockHolder hold(shard.lock);
    const Slot& slot = shard.slots[shard.probe(d)];
    if (slot.digest.empty()) return std::nullopt;
    return slot.cell;
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

  // Slots examined by overflow sweeps so far (for amortization checks). Lock-free.
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

  // A shard's table is kept at most 3/4 full and grown by half, so a grown table is at least half
  // full; it never grows past what max_keys_per_shard needs.
  struct alignas(64) Shard {
    detail::SpinLock lock;
    std::int64_t latest ABSL_GUARDED_BY(lock) = std::numeric_limits<std::int64_t>::min();
    Slot* slots ABSL_GUARDED_BY(lock) = nullptr;
    std::size_t capacity ABSL_GUARDED_BY(lock) = 0;
    std::size_t count ABSL_GUARDED_BY(lock) = 0;
    // kRejectNewKeys: no sweep can free a slot before this time (ns).
    std::int64_t next_idle ABSL_GUARDED_BY(lock) = std::numeric_limits<std::int64_t>::min();
    Table table ABSL_GUARDED_BY(lock);

    // Written under the lock, read without it.
    std::atomic<std::uint64_t> size{0};
    std::atomic<std::uint64_t> idle_reclaimed{0};
    std::atomic<std::uint64_t> live_evicted{0};
    std::atomic<std::uint64_t> capacity_denials{0};
    std::atomic<std::uint64_t> examined{0};
    std::atomic<std::size_t> capacity_bytes{0};

    std::int64_t clamp(std::int64_t now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(lock) {
      if (now < latest) return latest;
      latest = now;
      return now;
    }

    std::size_t probe(const KeyDigest& d) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(lock) {
      return probe_in(slots, capacity, d);
    }

    static void bump(std::atomic<std::uint64_t>& counter, std::uint64_t by) {
      counter.store(counter.load(std::memory_order_relaxed) + by, std::memory_order_relaxed);
    }
  };

  // Index of `d`'s slot in a table, or of the empty slot where it would go. Linear probing from a
  // multiply-shift start (any table size works); the table always has an empty slot.
  static std::size_t probe_in(const Slot* slots, std::size_t capacity, const KeyDigest& d) {
    auto i = static_cast<std::size_t>(absl::Uint128High64(absl::uint128(d.low) * capacity));
    while (true) {
      const KeyDigest& at = slots[i].digest;
      if (at == d || at.empty()) return i;
      if (++i == capacity) i = 0;
    }
  }

  static StoreOptions normalized(StoreOptions options) {
    options.max_keys_per_shard = std::max<std::size_t>(options.max_keys_per_shard, 2);
    return options;
  }

  std::size_t max_capacity() const noexcept { return options_.max_keys_per_shard * 4 / 3 + 1; }

  template <class Fn, class OnFull>
  std::invoke_result_t<Fn&, Cell&, std::int64_t> update_in(Shard& shard, const KeyDigest& d,
                                                           std::int64_t now, Fn& fn,
                                                           OnFull& on_full)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(shard.lock) {
    now = shard.clamp(now);
    std::size_t index = shard.probe(d);
    Slot& slot = shard.slots[index];
    if (!slot.digest.empty()) return fn(slot.cell, now);

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
    const std::size_t cap = options_.max_keys_per_shard;
    if (shard.count >= cap) {
      if (options_.overflow == Overflow::kRejectNewKeys && now < shard.next_idle) {
        Shard::bump(shard.capacity_denials, 1);
        return StoreFull{shard.next_idle - now};
      }
      sweep(shard, now);
      if (shard.count >= cap) {
        Shard::bump(shard.capacity_denials, 1);
        return StoreFull{shard.next_idle - now};
      }
      index = shard.probe(d);
    }
    if (shard.count + 1 > shard.capacity * 3 / 4 && shard.capacity < max_capacity()) {
      grow(shard);
      index = shard.probe(d);
    }
    shard.slots[index] = Slot{d, cell};
    ++shard.count;
    shard.size.store(shard.count, std::memory_order_relaxed);
    return std::nullopt;
  }

  void grow(Shard& shard) ABSL_EXCLUSIVE_LOCKS_REQUIRED(shard.lock) {
    const Slot* old_slots = shard.slots;
    const std::size_t old_capacity = shard.capacity;
    rebuild(shard, std::min(old_capacity + old_capacity / 2, max_capacity()), [&](auto&& keep) {
      for (std::size_t i = 0; i < old_capacity; ++i) {
        if (!old_slots[i].digest.empty()) keep(old_slots[i]);
      }
    });
  }

  // Drops idle cells; under kEvict, then evicts live cells down to cap/2 in ascending
  // (time until fresh, digest) order. O(capacity).
  void sweep(Shard& shard, std::int64_t now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(shard.lock) {
    struct Candidate {
      std::int64_t time_until_fresh = 0;
      Slot slot{};
    };
    thread_local std::vector<Candidate> live;
    live.clear();
    std::uint64_t idle = 0;
    std::int64_t earliest = std::numeric_limits<std::int64_t>::max();
    for (std::size_t i = 0; i < shard.capacity; ++i) {
      const Slot& slot = shard.slots[i];
      if (slot.digest.empty()) continue;
      if (slot.cell.idle(now)) {
        ++idle;
      } else {
        std::int64_t ttf = std::max<std::int64_t>(slot.cell.time_until_fresh(now), 1);
        earliest = std::min(earliest, ttf);
        live.push_back({ttf, slot});
      }
    }
    Shard::bump(shard.examined, shard.capacity);
    Shard::bump(shard.idle_reclaimed, idle);

    const std::size_t keep = options_.max_keys_per_shard / 2;
    if (options_.overflow == Overflow::kEvict && live.size() > keep) {
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
    }
    shard.next_idle = live.empty() ? now : now + earliest;
    rebuild(shard, shard.capacity, [&](auto&& keep_slot) {
      for (const Candidate& c : live) keep_slot(c.slot);
    });
  }

  // Replaces the shard's table by one of `capacity` slots holding the slots that `each` yields.
  template <class Each>
  void rebuild(Shard& shard, std::size_t capacity, Each&& each)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(shard.lock) {
    Table table = allocate_table(capacity);
    std::size_t count = 0;
    each([&](const Slot& slot) {
      table[probe_in(table.get(), capacity, slot.digest)] = slot;
      ++count;
    });
    shard.table = std::move(table);
    shard.slots = shard.table.get();
    shard.capacity = capacity;
    shard.count = count;
    shard.size.store(count, std::memory_order_relaxed);
    shard.capacity_bytes.store(capacity * sizeof(Slot), std::memory_order_relaxed);
  }

  StoreOptions options_;
  KeyHasher hasher_;
  std::unique_ptr<Shard[]> shards_;
};

}  // namespace sluice

#endif  // SLUICE_STORE_HPP_
