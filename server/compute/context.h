// What the compute work items read: the daemon's parts they use and the limits
// that bound a request, and the call a work item answers. Filled once by Daemon
// (the rpc room's Core extends it with what only the services need).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "fpga/model/energy_model.h"
#include "server/base/auth_tokens.h"
#include "server/compute/backends/backend.h"
#include "server/compute/scheduler.h"
#include "server/model/registry.h"
#include "server/policy/policy_store.h"
#include "server/telemetry/energy_ledger.h"
#include "server/telemetry/metrics.h"

namespace mxserve {

struct ComputeContext {
  Registry* registry = nullptr;
  PolicyStore* policies = nullptr;
  Scheduler* scheduler = nullptr;
  Backend* backend = nullptr;
  Metrics* metrics = nullptr;
  EnergyLedger* ledger = nullptr;
  fpga_model::EnergyModelParams energy_model;
  std::string default_policy;
  int64_t max_message_bytes = 0;
  // mxserved --quota-weight-bytes (0: none), for what a compute call makes its
  // model's owner hold: the gradient accumulator of LayerBackward's accumulate_grad.
  uint64_t quota_weight_bytes = 0;
  // mxserved --update-copies cache: update-phase copies are cached, not sliced.
  bool cache_update_copies = false;
  // The most weight elements one slice of an update call's copy holds
  // (LayerWeights::WithCopy): 32 MiB of FP32 source, 64 MiB of copy at most.
  int64_t update_slice_elements = int64_t{8} << 20;

  void UpdateMemoryGauges() const {
    metrics->SetWeightBytes(static_cast<double>(registry->budget().used()));
    metrics->SetModels(static_cast<double>(registry->model_count()));
  }
};

// Set by a reactor's OnCancel, the callback API's notice that the client
// cancelled, its deadline passed, or the connection broke.
using CancelFlag = std::shared_ptr<std::atomic<bool>>;

// When a call arrived, when it must be done by, whether its client gave up, and
// who made it.
struct CallInfo {
  Clock::time_point arrival = Clock::now();
  Clock::time_point deadline = Clock::time_point::max();
  CancelFlag cancelled;  // null: never cancelled
  // The caller: its run tags are its own (EnergyLedger::CheckRun).
  Principal principal = AnonymousPrincipal();

  bool Cancelled() const { return cancelled && cancelled->load(std::memory_order_relaxed); }
};

// Answers a request exactly once: status to the client, and the status counter.
using Done = std::function<void(absl::Status)>;

}  // namespace mxserve
