// Internal: a shared, published object that the thread retiring it frees, never its last reader.
//
// A published configuration is read through shared_ptr copies; replacing it must not leave its
// destructor (possibly large: tables, stores, every key's state) to whichever reader lets go
// last, since that reader is a request. make_retirable() makes such an object; retire() is what
// the publisher calls after swapping it out: it waits until every reader has let go, then
// destroys the object on the calling thread.
//
//   std::shared_ptr<const Table> table = sluice::detail::make_retirable(std::move(built));
//   ... readers copy `table`; later the publisher swaps in the next one ...
//   sluice::detail::retire(std::move(old_table));  // waits for its readers, frees it here
//
// The reader that lets go last only hands the object back: one atomic store and a wake, no lock
// and no destructor. An object never retired is freed by its last holder, as usual.
//
// Thread-safety: retire() once per object, after no new reference can be taken (the object is no
// longer published); the caller must hold no other reference, or it waits for itself.
#ifndef SLUICE_DETAIL_RETIREMENT_HPP_
#define SLUICE_DETAIL_RETIREMENT_HPP_

#include <atomic>
#include <memory>
#include <utility>

namespace sluice::detail {

// Shared by an object's deleter and the thread that retires it.
struct RetirementSlot {
  std::atomic<bool> retiring{false};              // set before the retiring thread lets go
  std::atomic<const void*> handed_back{nullptr};  // the object, once its last holder let go
};

template <class T>
struct RetirableDeleter {
  std::shared_ptr<RetirementSlot> slot;

  void operator()(const T* object) const {
    if (!slot->retiring.load(std::memory_order_acquire)) {
      delete object;
      return;
    }
    const std::shared_ptr<RetirementSlot> keep = slot;  // alive until the wake below returns
    keep->handed_back.store(object, std::memory_order_release);
    keep->handed_back.notify_one();
  }
};

template <class T>
std::shared_ptr<const T> make_retirable(std::unique_ptr<T> object) {
  return std::shared_ptr<const T>(object.release(),
                                  RetirableDeleter<T>{std::make_shared<RetirementSlot>()});
}

// Lets go of `object` and, once every other holder has too, destroys it on this thread. The wait
// lasts as long as the longest reader that still holds it.
template <class T>
void retire(std::shared_ptr<const T> object) {
  if (object == nullptr) {
    return;
  }
  const RetirableDeleter<T>* deleter = std::get_deleter<RetirableDeleter<T>>(object);
  if (deleter == nullptr) {  // not made by make_retirable: freed by its last holder
    return;
  }
  const std::shared_ptr<RetirementSlot> slot = deleter->slot;
  slot->retiring.store(true, std::memory_order_release);
  object.reset();  // ordered before the last holder's deleter by the reference count
  slot->handed_back.wait(nullptr, std::memory_order_acquire);
  delete static_cast<const T*>(slot->handed_back.load(std::memory_order_acquire));
}

}  // namespace sluice::detail

#endif  // SLUICE_DETAIL_RETIREMENT_HPP_
