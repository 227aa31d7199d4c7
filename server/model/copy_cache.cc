#include "server/model/copy_cache.h"

#include <vector>

namespace mxserve {

void CopyCache::Touch(const void* owner, std::shared_ptr<const CachedCopy> copy,
                      const std::string& principal) {
  MutexLock lock(&mu_);
  if (auto it = index_.find(copy.get()); it != index_.end()) {
    entries_.splice(entries_.end(), entries_, it->second);
    return;
  }
  const CachedCopy* key = copy.get();
  entries_.push_back({owner, std::move(copy), principal});
  index_[key] = std::prev(entries_.end());
}

void CopyCache::Forget(const void* owner) {
  std::vector<std::shared_ptr<const CachedCopy>> released;  // freed after the lock
  MutexLock lock(&mu_);
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (it->owner == owner) {
      index_.erase(it->copy.get());
      released.push_back(std::move(it->copy));
      it = entries_.erase(it);
    } else {
      ++it;
    }
  }
}

std::shared_ptr<const CachedCopy> CopyCache::TakeLeastRecent(const std::string* principal) {
  MutexLock lock(&mu_);
  auto it = entries_.begin();
  while (it != entries_.end() && principal != nullptr && it->principal != *principal) ++it;
  if (it == entries_.end()) return nullptr;
  std::shared_ptr<const CachedCopy> victim = std::move(it->copy);
  index_.erase(victim.get());
  entries_.erase(it);
  return victim;
}

int CopyCache::EvictUntil(const std::function<bool()>& fits, const std::string& first) {
  int evicted = 0;
  // Pass 0: `first`'s models' copies; pass 1: everyone's.
  for (int pass = first.empty() ? 1 : 0; pass < 2; ++pass) {
    while (!fits()) {
      std::shared_ptr<const CachedCopy> victim = TakeLeastRecent(pass == 0 ? &first : nullptr);
      if (!victim) break;
      ++evicted;
      victim.reset();  // frees its bytes unless a running request still holds it
    }
  }
  return evicted;
}

uint64_t CopyCache::ReclaimableBytes() {
  MutexLock lock(&mu_);
  uint64_t bytes = 0;
  for (const Entry& entry : entries_) {
    if (entry.copy.use_count() == 1) bytes += entry.copy->reservation.bytes();
  }
  return bytes;
}

}  // namespace mxserve
