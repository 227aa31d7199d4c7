// A fixed pool of threads for splitting one GEMM across cores. The caller owns it
// and sizes it (the daemon from --kernel-threads); kernels never start threads.
// After a call its workers spin for up to 50 µs before they sleep, so an idle
// pool costs nothing after that and a busy one (a forward pass's GEMMs back to
// back) no wake-up per call. A call waits only for the workers that joined it
// before its tasks ran out, never for one still waking up.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/functional/function_ref.h"

namespace mx::kernels {

class ThreadPool {
 public:
  // `threads` counts the calling thread: ThreadPool(2) starts one worker, and a
  // ParallelFor runs on it and on the caller. threads < 1 is taken as 1.
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Tests: a worker woken from its sleep waits this long before it looks at the
  // call, as a slow wake-up would (tens to hundreds of µs under gVisor).
  void SetWakeDelayForTesting(std::chrono::microseconds delay) {
    wake_delay_us_.store(delay.count(), std::memory_order_relaxed);
  }

  // Runs fn(i) for every i in [0, tasks) and returns when all have finished.
  // Tasks are claimed one at a time, so uneven tasks balance. If another caller
  // is using the pool at that moment, this call runs all its tasks on its own
  // thread instead of waiting: concurrent GEMMs (several daemon workers) never
  // queue behind each other and never oversubscribe the cores.
  void ParallelFor(int64_t tasks, absl::FunctionRef<void(int64_t)> fn);

 private:
  void WorkerLoop();
  void RunTasks();

  std::vector<std::thread> workers_;
  std::mutex busy_;  // held by the caller that owns the current ParallelFor

  // Both sides spin for a while (kSpin, thread_pool.cc) before they sleep on
  // these: a sleeping thread's wake-up costs tens of µs, a decode step's GEMM
  // a few hundred. generation_ and stop_ change under mu_; joined_ and
  // finished_ are counted without it, and the worker that finishes the caller's
  // count takes mu_ before notifying.
  std::mutex mu_;
  std::condition_variable wake_;
  std::condition_variable done_;
  std::atomic<uint64_t> generation_{0};  // bumped per ParallelFor
  // The workers that joined the current call (low bits) and kClosed once the
  // caller ran out of tasks: a worker that joins after that leaves at once.
  std::atomic<uint64_t> joined_{0};
  std::atomic<int64_t> finished_{0};  // joined workers done with the current call
  std::atomic<int64_t> awaited_{-1};  // joined_ at closing; -1 before the caller closes
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> wake_delay_us_{0};

  // The current job, published before generation_ changes (release).
  const absl::FunctionRef<void(int64_t)>* fn_ = nullptr;
  int64_t tasks_ = 0;
  std::atomic<int64_t> next_{0};
};

}  // namespace mx::kernels
