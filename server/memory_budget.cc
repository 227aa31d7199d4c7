#include "server/memory_budget.h"

#include "absl/strings/str_cat.h"

namespace mxserve {

absl::Status MemoryBudget::Reserve(uint64_t bytes, absl::string_view what) {
  uint64_t used = used_.load(std::memory_order_relaxed);
  do {
    if (bytes > limit_ || used > limit_ - bytes) {
      return absl::ResourceExhaustedError(
          absl::StrCat(what, " needs ", bytes, " bytes, but the weight memory limit is ", limit_,
                       " bytes and ", used, " are in use (--weight-memory-bytes)"));
    }
  } while (!used_.compare_exchange_weak(used, used + bytes, std::memory_order_relaxed));
  return absl::OkStatus();
}

}  // namespace mxserve
