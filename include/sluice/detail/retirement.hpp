// Internal: a shared, published object that the thread retiring it frees, never its last reader.
//
// A published configuration is read through shared_ptr copies; replacing it must not leave its
// destructor (possibly large: tables, stores, every key's state) to whichever reader lets go
// last, since that reader is a request. make_retirable() makes such an object; the publisher,
// after swapping it out, retires it with retire_later(), which returns at once with a Retired
// handle. Its collect() destroys the object on the calling thread if every reader has let go by
// then (true), or does nothing (false): the publisher calls it again later, e.g. at its next
// reload or on a timer. A handle dropped before its object was collected abandons it: the object
// goes back to ordinary shared_ptr ownership, and whoever lets go last frees it. Nothing waits:
// a publisher that waited for its readers would wait for itself whenever it held one.
//
//   std::shared_ptr<const Table> table = sluice::detail::make_retirable(std::move(built));
//   ... readers copy `table`; later the publisher swaps in the next one ...
//   retired.push_back(sluice::detail::retire_later(std::move(old_table)));  // no wait
//   ... later, on the publisher's thread, drop each handle whose collect() returns true ...
//
// The reader that lets go last only hands the object back: one atomic exchange, no lock and no
// destructor. An object never retired is freed by its last
// holder, as usual.
//
// Thread-safety: retire one object once, after no new reference can be taken
// (the object is no longer published). A Retired handle is used by one thread at a time; its
// collect() and abandon() may race with the object's last reader on any thread.
#ifndef SLUICE_DETAIL_RETIREMENT_HPP_
#define SLUICE_DETAIL_RETIREMENT_HPP_

#include <atomic>
#include <memory>
#include <utility>

namespace sluice::detail {

// Shared by an object's deleter and the thread that retires it. Who frees the object is decided
// by one exchange on `state`, whichever of the last reader and the retiring side comes second:
//   kFreedByLastHolder  not retired, or abandoned: the last reader frees it;
//   nullptr             retired by retire_later(), collected by its Retired handle;
//   the object          handed back by its last reader, for the retiring side to free.
// Every exchange on it is acq_rel: the side that frees the object acquires the other side's
// release, so the free follows everything the other side did with it.
struct RetirementSlot {
  // The address of no retirable object.
  static constexpr char kTag = 0;
  static constexpr const void* kFreedByLastHolder = &kTag;

  std::atomic<const void*> state{kFreedByLastHolder};
};

template <class T>
struct RetirableDeleter {
  std::shared_ptr<RetirementSlot> slot;

  // Runs on the last holder's thread.
  void operator()(const T* object) const {
    if (slot->state.exchange(object, std::memory_order_acq_rel) ==
        RetirementSlot::kFreedByLastHolder) {
      delete object;
    }
  }
};

template <class T>
std::shared_ptr<const T> make_retirable(std::unique_ptr<T> object) {
  return std::shared_ptr<const T>(object.release(),
                                  RetirableDeleter<T>{std::make_shared<RetirementSlot>()});
}

// The slot of an object made by make_retirable, or null (freed by its last holder).
template <class T>
std::shared_ptr<RetirementSlot> retirement_slot_of(const std::shared_ptr<const T>& object) {
  const RetirableDeleter<T>* deleter = std::get_deleter<RetirableDeleter<T>>(object);
  return deleter == nullptr ? nullptr : deleter->slot;
}

// A retired object not freed yet: collect() frees it on the calling thread once its readers have
// let go; dropping the handle first abandons it to its last reader.
template <class T>
class Retired {
 public:
  explicit Retired(std::shared_ptr<RetirementSlot> slot) : slot_(std::move(slot)) {}
  Retired(Retired&& other) noexcept = default;
  Retired& operator=(Retired&& other) noexcept {
    if (this != &other) {
      abandon();
      slot_ = std::move(other.slot_);
    }
    return *this;
  }
  ~Retired() { abandon(); }

  // Frees the object here if its last reader has handed it back: true once nothing is left for
  // this handle to free, false while some reader still holds the object. One atomic load.
  bool collect() {
    if (slot_ == nullptr) {
      return true;
    }
    const void* state = slot_->state.load(std::memory_order_acquire);
    if (state == nullptr) {
      return false;
    }
    delete static_cast<const T*>(state);
    slot_.reset();
    return true;
  }

  // Gives the object back to ordinary shared_ptr ownership: freed here if it was handed back
  // already, else by its last reader.
  void abandon() {
    if (slot_ == nullptr) {
      return;
    }
    const void* state =
        slot_->state.exchange(RetirementSlot::kFreedByLastHolder, std::memory_order_acq_rel);
    if (state != nullptr) {
      delete static_cast<const T*>(state);
    }
    slot_.reset();
  }

 private:
  std::shared_ptr<RetirementSlot> slot_;  // null once collected or abandoned
};

// Lets go of `object` without waiting; the handle frees it once every other holder has let go
// (see Retired). An object not made by make_retirable is freed by its last holder: the handle
// has nothing to collect.
template <class T>
Retired<T> retire_later(std::shared_ptr<const T> object) {
  std::shared_ptr<RetirementSlot> slot = retirement_slot_of(object);
  if (slot != nullptr) {
    // Ordered before the last holder's deleter by the reference count, which `reset` releases.
    // If this is the last reference, the deleter runs here and hands the object back at once.
    slot->state.store(nullptr, std::memory_order_relaxed);
    object.reset();
  }
  return Retired<T>(std::move(slot));
}

}  // namespace sluice::detail

#endif  // SLUICE_DETAIL_RETIREMENT_HPP_
