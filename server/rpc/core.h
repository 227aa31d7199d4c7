// What every service of the daemon shares: the compute context (registry,
// policies, scheduler, backend, metrics, energy ledger, limits) and what only
// the services use: the open-call count, the --model-dir confinement and
// ReportPower's bounds. Owned by Daemon; services hold a reference.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "server/compute/context.h"
#include "server/model/model_dirs.h"

namespace mxserve {

// The loader pool: LoadSafetensors reads and the warm-up after a publish.
inline constexpr int kLoaderThreads = 1;
inline constexpr int kLoaderQueue = 64;

// Counts the calls that have work outstanding, so shutdown can wait for them
// and then close every connection at once instead of waiting out the grace
// period for clients that keep their channel open.
class CallTracker {
 public:
  void Begin() {
    std::lock_guard lock(mu_);
    ++active_;
  }
  void End() {
    std::lock_guard lock(mu_);
    if (--active_ == 0) idle_.notify_all();
  }
  // True when every call ended before `deadline`.
  bool WaitIdle(std::chrono::steady_clock::time_point deadline) {
    std::unique_lock lock(mu_);
    return idle_.wait_until(lock, deadline, [this] { return active_ == 0; });
  }

 private:
  std::mutex mu_;
  std::condition_variable idle_;
  int64_t active_ = 0;
};

struct Core : ComputeContext {
  CallTracker* calls = nullptr;
  // Models' file loads and warm-ups (kLoaderThreads workers, kLoaderQueue deep).
  Scheduler* loader = nullptr;
  const ModelDirs* model_dirs = nullptr;
  // ReportPower's bounds (--max-power-series, --power-sources, --max-power-watts).
  int max_power_series = 64;
  std::vector<std::string> power_sources;  // empty: any name that is not reserved
  double max_power_watts = 10000;
};

}  // namespace mxserve
