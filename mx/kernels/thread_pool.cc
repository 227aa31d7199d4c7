#include "mx/kernels/thread_pool.h"

namespace mx::kernels {

ThreadPool::ThreadPool(int threads) {
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::RunTasks() {
  for (int64_t i = next_.fetch_add(1, std::memory_order_relaxed); i < tasks_;
       i = next_.fetch_add(1, std::memory_order_relaxed)) {
    (*fn_)(i);
  }
}

void ThreadPool::WorkerLoop() {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    RunTasks();
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (++finished_ == static_cast<int>(workers_.size())) done_.notify_all();
    }
  }
}

void ThreadPool::ParallelFor(int64_t tasks, absl::FunctionRef<void(int64_t)> fn) {
  std::unique_lock<std::mutex> busy(busy_, std::try_to_lock);
  if (workers_.empty() || tasks <= 1 || !busy.owns_lock()) {
    for (int64_t i = 0; i < tasks; ++i) fn(i);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    fn_ = &fn;
    tasks_ = tasks;
    next_.store(0, std::memory_order_relaxed);
    finished_ = 0;
    ++generation_;
  }
  wake_.notify_all();
  RunTasks();
  // Every worker checks in once per generation, even one that wakes after the
  // tasks ran out, so none is still reading fn_ when the next call replaces it.
  std::unique_lock<std::mutex> lock(mu_);
  done_.wait(lock, [&] { return finished_ == static_cast<int>(workers_.size()); });
  fn_ = nullptr;
}

}  // namespace mx::kernels
