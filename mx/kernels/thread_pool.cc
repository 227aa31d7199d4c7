#include "mx/kernels/thread_pool.h"

#include <chrono>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace mx::kernels {
namespace {

// How long a worker keeps looking for the next call, and the caller for the
// workers' check-in, before sleeping. Waking a sleeping thread took 25–30 µs on
// a 2-core EPYC VM (two wake-ups per call: ParallelFor of two trivial tasks,
// 55 µs), against 0.2–0.6 ms for one decode-step GEMM; 50 µs covers the gap
// between the back-to-back GEMMs of a forward pass and costs an idle pool
// 50 µs of one core per call.
constexpr std::chrono::microseconds kSpin{50};

inline void Pause() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

// True as soon as done() is, false when kSpin passed first.
template <typename Done>
bool SpinUntil(const Done& done) {
  const auto start = std::chrono::steady_clock::now();
  for (int i = 1;; ++i) {
    if (done()) return true;
    Pause();
    if (i % 64 == 0 && std::chrono::steady_clock::now() - start > kSpin) return done();
  }
}

}  // namespace

ThreadPool::ThreadPool(int threads) {
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true, std::memory_order_release);
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

// joined_'s flag: the caller ran out of tasks and counted who joined.
constexpr uint64_t kClosed = uint64_t{1} << 63;

void ThreadPool::WorkerLoop() {
  uint64_t seen = 0;
  const auto called = [&] {
    return stop_.load(std::memory_order_acquire) ||
           generation_.load(std::memory_order_acquire) != seen;
  };
  for (;;) {
    if (!SpinUntil(called)) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        wake_.wait(lock, called);
      }
      if (const int64_t us = wake_delay_us_.load(std::memory_order_relaxed); us > 0) {
        std::this_thread::sleep_for(std::chrono::microseconds(us));
      }
    }
    if (stop_.load(std::memory_order_acquire)) return;
    seen = generation_.load(std::memory_order_acquire);
    // Join the call, or the newer one that reset joined_ since (its fn_ and
    // tasks_ are published before that reset), unless it has closed.
    if (joined_.fetch_add(1, std::memory_order_seq_cst) & kClosed) continue;
    RunTasks();
    const int64_t done = finished_.fetch_add(1, std::memory_order_seq_cst) + 1;
    if (done == awaited_.load(std::memory_order_seq_cst)) {
      // Under mu_ once, so a caller between its check and its sleep hears it.
      { std::lock_guard<std::mutex> lock(mu_); }
      done_.notify_all();
    }
  }
}

// The pool whose ParallelFor this thread is running as its caller, if any: a
// ParallelFor from inside one of that call's tasks must not try_lock busy_
// again (undefined for a mutex the thread holds), so it runs inline.
thread_local const ThreadPool* t_calling = nullptr;

void ThreadPool::ParallelFor(int64_t tasks, absl::FunctionRef<void(int64_t)> fn) {
  std::unique_lock<std::mutex> busy;
  if (t_calling != this) busy = std::unique_lock<std::mutex>(busy_, std::try_to_lock);
  if (workers_.empty() || tasks <= 1 || !busy.owns_lock()) {
    for (int64_t i = 0; i < tasks; ++i) fn(i);
    return;
  }
  struct Calling {
    const ThreadPool* previous = t_calling;
    explicit Calling(const ThreadPool* pool) { t_calling = pool; }
    ~Calling() { t_calling = previous; }
  } calling(this);
  {
    std::lock_guard<std::mutex> lock(mu_);
    fn_ = &fn;
    tasks_ = tasks;
    next_.store(0, std::memory_order_relaxed);
    finished_.store(0, std::memory_order_relaxed);
    awaited_.store(-1, std::memory_order_relaxed);
    joined_.store(0, std::memory_order_release);
    generation_.fetch_add(1, std::memory_order_release);
  }
  wake_.notify_all();
  RunTasks();
  // Every task is claimed. Close the call: the workers that joined before this
  // are the ones that may still run a task or read fn_, and the only ones
  // waited for; a worker still waking up finds the call closed and leaves it.
  const int64_t joined =
      static_cast<int64_t>(joined_.fetch_or(kClosed, std::memory_order_seq_cst) & ~kClosed);
  awaited_.store(joined, std::memory_order_seq_cst);
  const auto all_in = [&] { return finished_.load(std::memory_order_seq_cst) == joined; };
  if (!SpinUntil(all_in)) {
    std::unique_lock<std::mutex> lock(mu_);
    done_.wait(lock, all_in);
  }
  fn_ = nullptr;
}

}  // namespace mx::kernels
