#include "server/model/memory_budget.h"

#include "absl/strings/str_cat.h"

namespace mxserve {

absl::Status MemoryBudget::Reserve(uint64_t bytes, absl::string_view what,
                                   absl::string_view first) {
  bool reclaimed = false;
  uint64_t used = used_.load(std::memory_order_relaxed);
  while (true) {
    if (bytes > limit_ || used > limit_ - bytes) {
      if (!reclaimed && reclaim_ && bytes <= limit_) {
        reclaim_(bytes, first);
        reclaimed = true;
        used = used_.load(std::memory_order_relaxed);
        continue;
      }
      return absl::ResourceExhaustedError(absl::StrCat(
          what, " needs ", bytes, " bytes, but the weight memory limit is ", limit_, " bytes and ",
          used,
          " are in use (--weight-memory-bytes; copies in use by running requests cannot "
          "be evicted)"));
    }
    if (used_.compare_exchange_weak(used, used + bytes, std::memory_order_relaxed)) {
      return absl::OkStatus();
    }
  }
}

bool MemoryBudget::MakeRoom(uint64_t bytes, absl::string_view first) {
  if (!Fits(bytes) && reclaim_ && bytes <= limit_) reclaim_(bytes, first);
  return Fits(bytes);
}

}  // namespace mxserve
