// A fixed pool of threads for splitting one GEMM across cores. The caller owns it
// and sizes it (the daemon from --kernel-threads); kernels never start threads.
// After a call its workers spin for up to 50 µs before they sleep, so an idle
// pool costs nothing after that and a busy one (a forward pass's GEMMs back to
// back) no wake-up per call.
#pragma once

#include <atomic>
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
  // a few hundred. generation_ and stop_ change under mu_; finished_ is
  // counted without it, and the last worker takes mu_ before notifying.
  std::mutex mu_;
  std::condition_variable wake_;
  std::condition_variable done_;
  std::atomic<uint64_t> generation_{0};  // bumped per ParallelFor
  std::atomic<int> finished_{0};         // workers done with the current generation
  std::atomic<bool> stop_{false};

  // The current job, published before generation_ changes (release).
  const absl::FunctionRef<void(int64_t)>* fn_ = nullptr;
  int64_t tasks_ = 0;
  std::atomic<int64_t> next_{0};
};

}  // namespace mx::kernels
