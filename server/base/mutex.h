// A std::mutex that clang's thread-safety analysis understands, so members can
// say ABSL_GUARDED_BY(mu_) and the clang builds check it (-Wthread-safety).
//
// Not absl::Mutex: Debian's Abseil is not built with ThreadSanitizer, so under
// make test-tsan its locking is invisible and every guarded access reads as a
// race. std::mutex is pthreads underneath, which TSan intercepts.
#pragma once

#include <mutex>

#include "absl/base/thread_annotations.h"

namespace mxserve {

class ABSL_LOCKABLE Mutex {
 public:
  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }
  // BasicLockable, for std::condition_variable_any.
  void lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }

 private:
  std::mutex mu_;
};

// Holds `mu` for its scope.
class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

}  // namespace mxserve
