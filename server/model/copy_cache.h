// The quantized copies of every layer's weights, in order of last use.
//
// A copy is a cache: the FP32 master can always make it again. So when the
// weight-memory budget cannot fit something new (an upload, the next weight
// version, another copy), the least recently used copies are evicted until it
// fits, rather than the daemon refusing every new version until DeleteModel.
// A copy a running request still holds stays alive, and counted, until that
// request lets go of it; a later request that finds it alive takes it back.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <unordered_map>

#include "absl/base/thread_annotations.h"
#include "server/base/mutex.h"
#include "server/model/memory_budget.h"
#include "server/model/prepared_weight.h"

namespace mxserve {

// A prepared copy and its share of the budget (released when the last holder
// of the copy is gone).
struct CachedCopy {
  std::shared_ptr<const PreparedWeight> weight;
  Reservation reservation;
};

class CopyCache {
 public:
  // Makes `copy` the most recently used, adding it if new. `owner` is the layer
  // version it belongs to (for Forget).
  void Touch(const void* owner, std::shared_ptr<const CachedCopy> copy);
  // Drops every copy of `owner`, a layer version that is gone.
  void Forget(const void* owner);
  // Evicts least recently used copies until `fits()` says yes or none is left;
  // returns how many were evicted. Copies are released outside the lock.
  int EvictUntil(const std::function<bool()>& fits);
  // The bytes evicting every copy would free now: those no running request holds.
  uint64_t ReclaimableBytes();

 private:
  struct Entry {
    const void* owner;
    std::shared_ptr<const CachedCopy> copy;
  };
  Mutex mu_;
  std::list<Entry> entries_ ABSL_GUARDED_BY(mu_);  // least recently used first
  std::unordered_map<const CachedCopy*, std::list<Entry>::iterator> index_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mxserve
