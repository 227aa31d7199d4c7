// The quantized copies of every layer's weights, in order of last use.
//
// A copy is a cache: the FP32 master can always make it again. So when the
// weight-memory budget cannot fit something new (an upload, the next weight
// version, another copy), the least recently used copies are evicted until it
// fits, rather than the daemon refusing every new version until DeleteModel.
// A copy a running request still holds stays alive, and counted, until that
// request lets go of it; a later request that finds it alive takes it back.
//
// Copies are the daemon's cache, charged to no principal's quota (whoever's
// request made them); each remembers whose model it is a copy of, so that
// making room for that principal's upload can evict her own models' copies
// before other tenants'.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <string>
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
  // version it belongs to (for Forget); `principal` the owner of its model.
  void Touch(const void* owner, std::shared_ptr<const CachedCopy> copy,
             const std::string& principal = "");
  // Drops every copy of `owner`, a layer version that is gone.
  void Forget(const void* owner);
  // Evicts least recently used copies until `fits()` says yes or none is left:
  // first those of `first`'s models (when not ""), then everyone's. Returns how
  // many were evicted. Copies are released outside the lock.
  int EvictUntil(const std::function<bool()>& fits, const std::string& first = "");
  // The bytes evicting every copy would free now: those no running request holds.
  uint64_t ReclaimableBytes();

 private:
  struct Entry {
    const void* owner;
    std::shared_ptr<const CachedCopy> copy;
    std::string principal;  // its model's owner
  };
  // Takes the least recently used copy (of `principal`'s models when not
  // null) out of the cache; null when there is none.
  std::shared_ptr<const CachedCopy> TakeLeastRecent(const std::string* principal);
  Mutex mu_;
  std::list<Entry> entries_ ABSL_GUARDED_BY(mu_);  // least recently used first
  std::unordered_map<const CachedCopy*, std::list<Entry>::iterator> index_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mxserve
