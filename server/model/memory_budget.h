// Accounting of the memory held for weights against --weight-memory-bytes.
// A Reservation is the RAII share of the budget one stored tensor holds: it is
// released when the tensor is freed, so an old weight version still read by an
// in-flight request stays counted until that request lets go of it.
//
// A reservation may name the principal it is made for (`first`: the owner of
// the model an upload or a new model's masters belong to): when it does not fit,
// the reclaimer evicts that principal's models' cached copies before anyone
// else's (server/README.md, "Quotas"), so one tenant's uploads make room in her
// own cache first.
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
  // after the reclaimer freed what it could. `first`: whose copies the
  // reclaimer evicts before others' ("": no one's).
  absl::Status Reserve(uint64_t bytes, absl::string_view what, absl::string_view first = "");
  // True when `bytes` more fit now, after asking the reclaimer if they did not.
  bool MakeRoom(uint64_t bytes, absl::string_view first = "");
  // What frees memory on demand (the registry's copy cache): asked to make
  // `bytes` fit when they do not, evicting `first`'s copies before others'. Set
  // once, before the budget is shared; it must not reserve from this budget.
  using Reclaimer = std::function<void(uint64_t bytes, absl::string_view first)>;
  void SetReclaimer(Reclaimer reclaim) { reclaim_ = std::move(reclaim); }
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
  Reclaimer reclaim_;
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
                                Reservation& out, absl::string_view first = "") {
  if (absl::Status s = budget.Reserve(bytes, what, first); !s.ok()) return s;
  out = Reservation(&budget, bytes);
  return absl::OkStatus();
}

}  // namespace mxserve
