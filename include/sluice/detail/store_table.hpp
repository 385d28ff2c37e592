// Internal: the table of one ShardedStore shard (sluice/store.hpp) — a bucketed two-choice cuckoo
// hash table of (digest, cell) slots.
//
// A key may live in one of two buckets, chosen by the two halves of its digest; a bucket is two
// slots, one 64-byte cache line for a 16-byte cell. A lookup reads the first bucket, then the
// second, then the stash (a few slots for the rare key no bucket can take). An insert takes a
// free slot of either bucket, else moves residents to their other bucket along the shortest
// path a breadth-first search of at most kMaxMoveSearch buckets finds, else takes a stash slot,
// else fails: bounded work whatever digests it is given. Keys whose digests share both buckets
// (which takes knowing the store's seed) fill at most two buckets and the stash; the store
// decides what a failed insert means (sluice/store.hpp, "Collisions").
//
// Moves relocate slots: a pointer to a slot is valid until the next insert or erase.
// Not thread-safe: the shard lock guards the table.
#ifndef SLUICE_DETAIL_STORE_TABLE_HPP_
#define SLUICE_DETAIL_STORE_TABLE_HPP_

#include <algorithm>
#include <array>
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/base/attributes.h"
#include "absl/numeric/int128.h"
#include "sluice/key.hpp"

#if defined(__unix__) || defined(__APPLE__)
#include <sys/mman.h>
#endif

namespace sluice::detail {

// One table entry: the digest and the cell side by side, so that a check on a key touches one
// cache line in the common case. An empty (all-zero) digest marks an empty slot; a slot whose
// bytes are all zero is empty.
template <class Cell>
struct StoreSlot {
  KeyDigest digest;
  Cell cell;
};

template <class Cell>
class StoreTable {
 public:
  using Slot = StoreSlot<Cell>;
  static constexpr std::size_t kSlotsPerBucket = 2;
  // Stash slots that inserts may fill; a rebuild may fill more (never losing a key).
  static constexpr std::size_t kStashSlots = 4;
  // Buckets an insert's move search visits at most.
  static constexpr std::size_t kMaxMoveSearch = 256;
  // Odd: the second bucket comes from the digest's high half times this (second_bucket).
  static constexpr std::uint64_t kSecondBucketMultiplier = 0x9e3779b97f4a7c15ULL;

  // A table of at least `buckets` ≥ 1 empty buckets and at most `most` ≥ `buckets`: a mapped
  // table fills its last page, up to `most`.
  StoreTable(std::size_t buckets, std::size_t most)
      : buckets_(allocate(rounded(buckets, most))), bucket_count_(rounded(buckets, most)) {}

  std::size_t size() const noexcept { return size_; }
  std::size_t bucket_count() const noexcept { return bucket_count_; }
  std::size_t slot_count() const noexcept { return bucket_count_ * kSlotsPerBucket; }
  std::size_t stash_size() const noexcept { return stash_.size(); }
  // Bytes held: the buckets and the stash.
  std::size_t bytes() const noexcept {
    return bucket_count_ * sizeof(Bucket) + stash_.capacity() * sizeof(Slot);
  }

  // The slot of `d` (not empty), or nullptr. Both buckets and the stash, in that order.
  ABSL_ATTRIBUTE_ALWAYS_INLINE Slot* find(const KeyDigest& d) noexcept {
    Bucket& first = buckets_[first_bucket(d)];
    if (first.slots[0].digest == d) return &first.slots[0];
    if (first.slots[1].digest == d) return &first.slots[1];
    Bucket& second = buckets_[second_bucket(d)];
    if (second.slots[0].digest == d) return &second.slots[0];
    if (second.slots[1].digest == d) return &second.slots[1];
    return stash_.empty() ? nullptr : find_in_stash(d);
  }
  const Slot* find(const KeyDigest& d) const noexcept {
    return const_cast<StoreTable*>(this)->find(d);
  }

  // Inserts absent key `d` with `cell`: the slot it went to, or nullptr when neither bucket nor
  // any move the search finds frees a slot and the stash is full (nothing changed then).
  Slot* insert(const KeyDigest& d, const Cell& cell) {
    assert(!d.empty() && find(d) == nullptr);
    if (Slot* slot = move_to_free_slot(d)) return fill(*slot, d, cell);
    if (stash_.size() >= kStashSlots) return nullptr;
    stash_.push_back(Slot{});
    return fill(stash_.back(), d, cell);
  }

  // insert for a rebuild: a key no bucket takes goes to the stash, past its bound if need be.
  void insert_rebuilt(const Slot& slot) {
    if (Slot* free = move_to_free_slot(slot.digest)) {
      fill(*free, slot.digest, slot.cell);
      return;
    }
    stash_.push_back(Slot{});
    fill(stash_.back(), slot.digest, slot.cell);
  }

  // Removes every key, keeping the buckets' memory.
  void clear() noexcept {
    std::memset(static_cast<void*>(buckets_.get()), 0, bucket_count_ * sizeof(Bucket));
    stash_.clear();
    size_ = 0;
  }

  // Removes the key at `slot` (a pointer find or insert returned).
  void erase(Slot* slot) noexcept {
    --size_;
    if (stash_.data() <= slot && slot < stash_.data() + stash_.size()) {
      *slot = stash_.back();
      stash_.pop_back();
      return;
    }
    *slot = Slot{};
  }

  // The slots of `d`'s two buckets that hold keys (for a key the table cannot take).
  template <class Fn>
  void for_each_in_buckets(const KeyDigest& d, Fn&& fn) {
    const std::size_t first = first_bucket(d);
    const std::size_t second = second_bucket(d);
    for (std::size_t b : {first, second}) {
      for (Slot& slot : buckets_[b].slots) {
        if (!slot.digest.empty()) fn(slot);
      }
      if (first == second) return;
    }
  }

  // Calls `fn(Slot&)` for every slot that holds a key.
  template <class Fn>
  void for_each(Fn&& fn) {
    for (std::size_t b = 0; b < bucket_count_; ++b) {
      for (Slot& slot : buckets_[b].slots) {
        if (!slot.digest.empty()) fn(slot);
      }
    }
    for (Slot& slot : stash_) fn(slot);
  }
  template <class Fn>
  void for_each(Fn&& fn) const {
    const_cast<StoreTable*>(this)->for_each([&](const Slot& slot) { fn(slot); });
  }

 private:
  // A bucket is one cache line when its slots are 32 bytes (the table is line-aligned).
  struct Bucket {
    std::array<Slot, kSlotsPerBucket> slots;
  };
  static_assert(std::is_trivially_copyable_v<Slot> && std::is_trivially_destructible_v<Bucket>);

  static constexpr std::align_val_t kAlignment{64};
  // Tables of 1 KiB or more are mapped from the kernel directly, in whole pages, rather than taken
  // from malloc, because of what resident memory measured at 1M keys: glibc raises its mmap
  // threshold after an mmapped chunk is freed, so a store's later (larger) tables came from the
  // heap and the outgrown ones stayed resident (41.2 bytes of RSS per key for 39.5 of tables).
  // Mapping tables of 64 KiB and more left 41.1 (the outgrown smaller tables stayed in the heap),
  // of 16 KiB and more 40.6, of 4 KiB 40.0; of 1 KiB, each rounded up to whole pages (which the
  // kernel maps anyway), 39.8 for 39.6 of tables. Mapped, an outgrown table is returned whole,
  // and its pages come zeroed (an empty table is all zeros). Should the kernel refuse a mapping
  // (e.g. its map count limit), the table comes from operator new instead.
  static constexpr std::size_t kMapBytes = 1024;
  static constexpr std::size_t kPageBytes = 4096;  // a multiple of it on every POSIX system here

  // The buckets a table of at least `buckets` and at most `most` gets.
  static std::size_t rounded(std::size_t buckets, std::size_t most) noexcept {
#if defined(__unix__) || defined(__APPLE__)
    const std::size_t bytes = buckets * sizeof(Bucket);
    if (bytes >= kMapBytes) {
      return std::min(most, (bytes + kPageBytes - 1) / kPageBytes * kPageBytes / sizeof(Bucket));
    }
#endif
    (void)most;
    return buckets;
  }

  struct Release {
    std::size_t bytes;
    bool mapped;
    void operator()(Bucket* p) const noexcept {
#if defined(__unix__) || defined(__APPLE__)
      if (mapped) {
        munmap(p, bytes);
        return;
      }
#endif
      ::operator delete(p, kAlignment);
    }
  };
  using Buckets = std::unique_ptr<Bucket[], Release>;

  static Buckets allocate(std::size_t buckets) {
    const std::size_t bytes = buckets * sizeof(Bucket);
#if defined(__unix__) || defined(__APPLE__)
    if (bytes >= kMapBytes) {
      void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p != MAP_FAILED) {  // page-aligned, zeroed; Bucket is an implicit-lifetime type
        return Buckets(static_cast<Bucket*>(p), Release{bytes, true});
      }
    }
#endif
    void* p = ::operator new(bytes, kAlignment);
    std::memset(p, 0, bytes);
    return Buckets(static_cast<Bucket*>(p), Release{bytes, false});
  }

  // A key's buckets, by multiply-shift, so any bucket count works: the first from the low half of
  // its digest, the second from the high half multiplied by an odd constant. The high half alone
  // would not do: digests are ordered by it (a sweep keeps the largest among equally fresh
  // cells), so the survivors of a sweep would all have second buckets in the table's top part;
  // the product's top bits depend on all of the half's bits but the shard index, constant here.
  std::size_t first_bucket(const KeyDigest& d) const noexcept { return bucket_of(d.low); }
  std::size_t second_bucket(const KeyDigest& d) const noexcept {
    return bucket_of(d.high * kSecondBucketMultiplier);
  }
  std::size_t bucket_of(std::uint64_t bits) const noexcept {
    return static_cast<std::size_t>(absl::Uint128High64(absl::uint128(bits) * bucket_count_));
  }
  std::size_t other_bucket(const KeyDigest& d, std::size_t bucket) const noexcept {
    const std::size_t first = first_bucket(d);
    return first == bucket ? second_bucket(d) : first;
  }

  ABSL_ATTRIBUTE_NOINLINE Slot* find_in_stash(const KeyDigest& d) noexcept {
    for (Slot& slot : stash_) {
      if (slot.digest == d) return &slot;
    }
    return nullptr;
  }

  Slot* fill(Slot& slot, const KeyDigest& d, const Cell& cell) noexcept {
    slot = Slot{d, cell};
    ++size_;
    return &slot;
  }

  // A bucket the search reached, and how: the resident of slot `slot` of node `parent`'s
  // bucket has this bucket as its other one.
  struct Node {
    std::size_t bucket;
    std::size_t parent;  // kRoot for the key's own buckets
    std::size_t slot;
  };
  static constexpr std::size_t kRoot = ~std::size_t{0};

  // A free slot in one of `d`'s buckets, made by moving residents along the shortest path the
  // breadth-first search finds (a bucket already on a node's path is not visited again from it,
  // so a path never reuses a slot), or nullptr.
  Slot* move_to_free_slot(const KeyDigest& d) noexcept {
    std::array<Node, kMaxMoveSearch> nodes;
    std::size_t count = 0;
    const auto on_path = [&](std::size_t bucket, std::size_t node) {
      for (; node != kRoot; node = nodes[node].parent) {
        if (nodes[node].bucket == bucket) return true;
      }
      return false;
    };
    nodes[count++] = Node{first_bucket(d), kRoot, 0};
    if (const std::size_t second = second_bucket(d); second != nodes[0].bucket) {
      nodes[count++] = Node{second, kRoot, 0};
    }
    for (std::size_t at = 0; at < count; ++at) {
      Bucket& bucket = buckets_[nodes[at].bucket];
      for (std::size_t s = 0; s < kSlotsPerBucket; ++s) {
        if (bucket.slots[s].digest.empty()) return shift_along(nodes, at, s);
      }
      for (std::size_t s = 0; s < kSlotsPerBucket && count < kMaxMoveSearch; ++s) {
        const std::size_t next = other_bucket(bucket.slots[s].digest, nodes[at].bucket);
        if (!on_path(next, at)) {
          prefetch(&buckets_[next]);  // a level's buckets are read after it is queued: overlap
          nodes[count++] = Node{next, at, s};
        }
      }
    }
    return nullptr;
  }

  static void prefetch([[maybe_unused]] const void* line) noexcept {
#if defined(__GNUC__)
    __builtin_prefetch(line);
#endif
  }

  // Moves each resident on the path to node `at` one step toward free slot `free` of its
  // bucket, from the end; returns the root slot thus freed.
  Slot* shift_along(const std::array<Node, kMaxMoveSearch>& nodes, std::size_t at,
                    std::size_t free) noexcept {
    Slot* hole = &buckets_[nodes[at].bucket].slots[free];
    for (std::size_t n = at; nodes[n].parent != kRoot; n = nodes[n].parent) {
      Slot* from = &buckets_[nodes[nodes[n].parent].bucket].slots[nodes[n].slot];
      *hole = *from;
      hole = from;
    }
    return hole;
  }

  Buckets buckets_;
  std::size_t bucket_count_;
  std::size_t size_ = 0;
  std::vector<Slot> stash_;
};

}  // namespace sluice::detail

#endif  // SLUICE_DETAIL_STORE_TABLE_HPP_
