// Internal: the right to act once on a booking (a reservation, a receipt), shared by every
// limiter that books: in memory (sluice/gcra.hpp, sluice/direct_gcra.hpp, the engine's
// settlement) and over Redis (sluice/redis/limiter.hpp).
#ifndef SLUICE_DETAIL_OPEN_FLAG_HPP_
#define SLUICE_DETAIL_OPEN_FLAG_HPP_

#include <utility>

namespace sluice::detail {

// Whether a booking (a reservation, a receipt) may still be given back or settled. Moving it
// moves the right and clears it in the source, so a booking is acted on at most once; copies are
// not allowed. The limiters' Reservation and Receipt types hold one, and so are move-only.
class OpenFlag {
 public:
  OpenFlag() = default;
  OpenFlag(OpenFlag&& other) noexcept : open_(std::exchange(other.open_, false)) {}
  OpenFlag& operator=(OpenFlag&& other) noexcept {
    open_ = std::exchange(other.open_, false);
    return *this;
  }
  OpenFlag(const OpenFlag&) = delete;
  OpenFlag& operator=(const OpenFlag&) = delete;
  ~OpenFlag() = default;

  bool is_open() const noexcept { return open_; }
  void open() noexcept { open_ = true; }
  // Closes it; true iff it was open.
  bool take() noexcept { return std::exchange(open_, false); }

 private:
  bool open_ = false;
};

}  // namespace sluice::detail

#endif  // SLUICE_DETAIL_OPEN_FLAG_HPP_
