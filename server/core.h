// What every service of the daemon shares: the registry, policies, scheduler,
// backend, metrics and energy accounting, and the limits from the flags. Owned
// by Daemon; services hold a reference.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <condition_variable>
#include <mutex>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "fpga/model/energy_model.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/server_callback.h"
#include "server/backend.h"
#include "server/energy_ledger.h"
#include "server/metrics.h"
#include "server/model_dirs.h"
#include "server/policy_store.h"
#include "server/registry.h"
#include "server/scheduler.h"

namespace mxserve {

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

struct Core {
  CallTracker* calls = nullptr;
  Registry* registry = nullptr;
  PolicyStore* policies = nullptr;
  Scheduler* scheduler = nullptr;
  Backend* backend = nullptr;
  Metrics* metrics = nullptr;
  EnergyLedger* ledger = nullptr;
  fpga_model::EnergyModelParams energy_model;
  const ModelDirs* model_dirs = nullptr;
  std::string default_policy;
  int64_t max_message_bytes = 0;
  // ReportPower's bounds (--max-power-series, --power-sources, --max-power-watts).
  int max_power_series = 64;
  std::vector<std::string> power_sources;  // empty: any name that is not reserved
  double max_power_watts = 10000;

  void UpdateMemoryGauges() const {
    metrics->SetWeightBytes(static_cast<double>(registry->budget().used()));
    metrics->SetModels(static_cast<double>(registry->model_count()));
  }
};

// Unix time now, in seconds.
double UnixSeconds();

// Set by a reactor's OnCancel, the callback API's notice that the client
// cancelled, its deadline passed, or the connection broke.
using CancelFlag = std::shared_ptr<std::atomic<bool>>;

// When a call arrived, when it must be done by, and whether its client gave up.
struct CallInfo {
  Clock::time_point arrival = Clock::now();
  Clock::time_point deadline = Clock::time_point::max();
  CancelFlag cancelled;  // null: never cancelled

  static CallInfo From(const grpc::CallbackServerContext* context, CancelFlag cancelled);
  bool Cancelled() const { return cancelled && cancelled->load(std::memory_order_relaxed); }
};

// Answers a request exactly once: status to the client, and the status counter.
using Done = std::function<void(absl::Status)>;

}  // namespace mxserve
