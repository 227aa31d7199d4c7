// What every service of the daemon shares: the compute context (registry,
// policies, scheduler, backend, metrics, energy ledger, limits) and what only
// the services use: the open-call count, access control, the loader pool, the --model-dir
// confinement, ReportPower's bounds and the profiler. Owned by Daemon; services
// hold a reference.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mx/kernels/thread_pool.h"
#include "server/compute/context.h"
#include "server/model/model_dirs.h"
#include "server/profile/profile_store.h"
#include "server/rpc/access.h"

namespace mxserve {

// The loader pool: LoadSafetensors reads and the warm-up after a publish.
inline constexpr int kLoaderThreads = 1;
inline constexpr int kLoaderQueue = 64;
// The profiler: one worker computes profile batches and generates policies; the
// streams waiting on it hold one batch each.
inline constexpr int kProfilerQueue = 16;

class CallTracker;  // call.h

struct Core : ComputeContext {
  CallTracker* calls = nullptr;
  // Who may call what (--auth-tokens, ownership, --quota-*); null: everyone is
  // "anonymous" with role admin and there are no quotas.
  const Access* access = nullptr;
  // The per-principal quotas (all unlimited without an Access).
  Quotas quotas() const { return access ? access->quotas() : Quotas{}; }
  // Models' file loads and warm-ups (kLoaderThreads workers, kLoaderQueue deep).
  Scheduler* loader = nullptr;
  const ModelDirs* model_dirs = nullptr;
  // Kept profiles, the profiler's queue, and the kernel threads it splits
  // GEMMs across (--kernel-threads, its own pool: profiling and serving at
  // once share the cores); StepOptimizer spreads its layers over them too.
  ProfileStore* profiles = nullptr;
  Scheduler* profiler = nullptr;
  mx::kernels::ThreadPool* profile_pool = nullptr;
  // ReportPower's and ReportEnergy's bounds (--max-power-series, --power-sources,
  // --max-power-watts).
  int max_power_series = 64;
  std::vector<std::string> power_sources;  // empty: any name that is not reserved
  double max_power_watts = 10000;
};

}  // namespace mxserve
