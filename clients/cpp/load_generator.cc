#include "clients/cpp/load_generator.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <numeric>

namespace mxclient {
namespace {

using Clock = std::chrono::steady_clock;

double Milliseconds(Clock::duration d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

// A request that finishes inside `issue` re-issues from inside its own `done`;
// past this depth the main thread issues instead, so the stack stays bounded.
constexpr int kMaxInlineDepth = 8;
thread_local int inline_depth = 0;

// One run's shared state: the main thread paces it, completions arrive on the
// caller's threads.
class LoadRun {
 public:
  LoadRun(const LoadOptions& options, const IssueFn& issue) : options_(options), issue_(issue) {}

  LoadResult Run() {
    const bool progress = options_.progress && isatty(STDERR_FILENO);
    const Clock::time_point begin = Clock::now();
    {
      std::lock_guard lock(mu_);
      slots_ = std::max(1, options_.concurrency);
      progress_ = progress;
    }
    for (int i = 0; i < std::max(1, options_.concurrency); ++i) Issue();

    const Clock::time_point measure_begin = begin + absl::ToChronoNanoseconds(options_.warmup);
    const Clock::time_point measure_end =
        measure_begin + absl::ToChronoNanoseconds(options_.duration);
    Clock::time_point next_tick = begin + std::chrono::seconds(1);
    Clock::time_point measured_from = measure_begin;
    bool measuring = false;
    std::unique_lock lock(mu_);
    while (true) {
      const Clock::time_point now = Clock::now();
      if (!measuring && now >= measure_begin) {
        measuring = measuring_ = true;
        measured_from = now;
      }
      if ((measuring && now >= measure_end) || Interrupted()) break;
      if (progress && now >= next_tick) {
        std::vector<double> second;
        second.swap(tick_latencies_ms_);
        const uint64_t errors = errors_;
        const double elapsed = std::chrono::duration<double>(now - begin).count();
        lock.unlock();
        std::sort(second.begin(), second.end());
        std::fprintf(stderr,
                     "\r\x1b[K%s %5.1fs  %8.1f req/s  p50 %8.3f ms  p99 %8.3f ms  errors %llu",
                     measuring ? "bench " : "warmup", elapsed, static_cast<double>(second.size()),
                     Percentile(second, 0.50), Percentile(second, 0.99),
                     static_cast<unsigned long long>(errors));
        std::fflush(stderr);
        lock.lock();
        next_tick += std::chrono::seconds(1);
        continue;
      }
      if (deferred_ > 0) {
        const int count = deferred_;
        deferred_ = 0;
        lock.unlock();
        for (int i = 0; i < count; ++i) Issue();
        lock.lock();
        continue;
      }
      Clock::time_point wake =
          std::min(now + std::chrono::milliseconds(100), measuring ? measure_end : measure_begin);
      if (progress) wake = std::min(wake, next_tick);
      cv_.wait_until(lock, wake, [this] { return deferred_ > 0; });
    }

    // Stop: nothing finishing from now on counts, and nothing new starts.
    const Clock::time_point stopped = Clock::now();
    measuring_ = false;
    stopping_ = true;
    slots_ -= deferred_;
    deferred_ = 0;
    cv_.wait(lock, [this] { return slots_ == 0; });
    lock.unlock();
    if (progress) {
      std::fputs("\r\x1b[K", stderr);
      std::fflush(stderr);
    }

    LoadResult result;
    std::sort(latencies_ms_.begin(), latencies_ms_.end());
    result.requests = latencies_ms_.size();
    result.errors = measured_errors_;
    result.seconds = measuring ? std::chrono::duration<double>(stopped - measured_from).count() : 0;
    if (result.seconds > 0) {
      result.requests_per_second = static_cast<double>(result.requests) / result.seconds;
      result.gflops = result.requests_per_second * options_.flops_per_request * 1e-9;
    }
    result.p50_ms = Percentile(latencies_ms_, 0.50);
    result.p90_ms = Percentile(latencies_ms_, 0.90);
    result.p99_ms = Percentile(latencies_ms_, 0.99);
    result.max_ms = latencies_ms_.empty() ? 0 : latencies_ms_.back();
    result.mean_ms = latencies_ms_.empty()
                         ? 0
                         : std::accumulate(latencies_ms_.begin(), latencies_ms_.end(), 0.0) /
                               static_cast<double>(latencies_ms_.size());
    return result;
  }

 private:
  bool Interrupted() const {
    return options_.interrupt != nullptr && options_.interrupt->load(std::memory_order_relaxed);
  }

  // Starts one request in a slot already counted in slots_.
  void Issue() {
    const Clock::time_point start = Clock::now();
    issue_([this, start](bool ok) { Finished(start, ok); });
  }

  void Finished(Clock::time_point start, bool ok) {
    const double latency_ms = Milliseconds(Clock::now() - start);
    bool reissue = false;
    {
      std::lock_guard lock(mu_);
      if (measuring_) {
        if (ok) {
          latencies_ms_.push_back(latency_ms);
        } else {
          ++measured_errors_;
        }
      }
      if (!ok) ++errors_;
      if (ok && progress_) tick_latencies_ms_.push_back(latency_ms);
      if (stopping_) {
        if (--slots_ == 0) cv_.notify_all();
        return;
      }
      // The slot stays taken: this request's successor fills it.
      if (inline_depth >= kMaxInlineDepth) {
        ++deferred_;
        cv_.notify_all();
        return;
      }
      reissue = true;
    }
    if (reissue) {
      ++inline_depth;
      Issue();
      --inline_depth;
    }
  }

  const LoadOptions& options_;
  const IssueFn& issue_;

  std::mutex mu_;
  std::condition_variable cv_;
  int slots_ = 0;                     // requests in flight or waiting in deferred_
  int deferred_ = 0;                  // slots whose next request the main thread issues
  bool measuring_ = false;            // completions now count
  bool stopping_ = false;             // completions now free their slot
  std::vector<double> latencies_ms_;  // successes while measuring, in completion order
  uint64_t measured_errors_ = 0;
  // For the progress line: successes since the last tick, failures since the start.
  bool progress_ = false;
  std::vector<double> tick_latencies_ms_;
  uint64_t errors_ = 0;
};

}  // namespace

double Percentile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  const double rank = std::ceil(q * static_cast<double>(sorted.size()));
  const size_t index = rank < 1 ? 0 : static_cast<size_t>(rank) - 1;
  return sorted[std::min(index, sorted.size() - 1)];
}

LoadResult RunLoad(const LoadOptions& options, const IssueFn& issue) {
  LoadRun run(options, issue);
  return run.Run();
}

}  // namespace mxclient
