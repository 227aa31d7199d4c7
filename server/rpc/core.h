// What every service of the daemon shares: the compute context (registry,
// policies, scheduler, backend, metrics, energy ledger, limits) and what only
// the services use: the open-call count, the loader pool, the --model-dir
// confinement and ReportPower's bounds. Owned by Daemon; services hold a
// reference.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "server/compute/context.h"
#include "server/model/model_dirs.h"

namespace mxserve {

// The loader pool: LoadSafetensors reads and the warm-up after a publish.
inline constexpr int kLoaderThreads = 1;
inline constexpr int kLoaderQueue = 64;

class CallTracker;  // call.h

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
