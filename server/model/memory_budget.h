// Accounting of the memory held for weights against --weight-memory-bytes.
// A Reservation is the RAII share of the budget one stored tensor holds: it is
// released when the tensor is freed, so an old weight version still read by an
// in-flight request stays counted until that request lets go of it.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace mxserve {

class MemoryBudget {
 public:
  explicit MemoryBudget(uint64_t limit_bytes) : limit_(limit_bytes) {}

  // RESOURCE_EXHAUSTED, saying what needed the bytes, when they do not fit even
  // after the reclaimer freed what it could.
  absl::Status Reserve(uint64_t bytes, absl::string_view what);
  // True when `bytes` more fit now, after asking the reclaimer if they did not.
  bool MakeRoom(uint64_t bytes);
  // What frees memory on demand (the registry's copy cache): asked to make
  // `bytes` fit when they do not. Set once, before the budget is shared; it must
  // not reserve from this budget.
  void SetReclaimer(std::function<void(uint64_t bytes)> reclaim) { reclaim_ = std::move(reclaim); }
  bool Fits(uint64_t bytes) const {
    const uint64_t used = used_.load(std::memory_order_relaxed);
    return bytes <= limit_ && used <= limit_ - bytes;
  }
  void Release(uint64_t bytes) { used_.fetch_sub(bytes, std::memory_order_relaxed); }

  uint64_t used() const { return used_.load(std::memory_order_relaxed); }
  uint64_t limit() const { return limit_; }

 private:
  const uint64_t limit_;
  std::atomic<uint64_t> used_{0};
  std::function<void(uint64_t)> reclaim_;
};

class Reservation {
 public:
  Reservation() = default;
  Reservation(MemoryBudget* budget, uint64_t bytes) : budget_(budget), bytes_(bytes) {}
  Reservation(Reservation&& other) noexcept
      : budget_(std::exchange(other.budget_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}
  Reservation& operator=(Reservation&& other) noexcept {
    if (this != &other) {
      Reset();
      budget_ = std::exchange(other.budget_, nullptr);
      bytes_ = std::exchange(other.bytes_, 0);
    }
    return *this;
  }
  Reservation(const Reservation&) = delete;
  Reservation& operator=(const Reservation&) = delete;
  ~Reservation() { Reset(); }

  uint64_t bytes() const { return bytes_; }

 private:
  void Reset() {
    if (budget_ != nullptr) budget_->Release(bytes_);
    budget_ = nullptr;
    bytes_ = 0;
  }
  MemoryBudget* budget_ = nullptr;
  uint64_t bytes_ = 0;
};

// Reserves and returns the reservation in one step.
inline absl::Status ReserveInto(MemoryBudget& budget, uint64_t bytes, absl::string_view what,
                                Reservation& out) {
  if (absl::Status s = budget.Reserve(bytes, what); !s.ok()) return s;
  out = Reservation(&budget, bytes);
  return absl::OkStatus();
}

}  // namespace mxserve
