#include "clients/cpp/load_flags.h"

#include "mx/status_macros.h"

namespace mxctl {

absl::StatusOr<LoadRun> ParseLoadFlags(const Flags& flags) {
  constexpr int64_t kMaxDim = int64_t{1} << 16;
  LoadRun run;
  MX_ASSIGN_OR_RETURN(run.m, flags.RequireInt("m", 1, kMaxDim));
  MX_ASSIGN_OR_RETURN(run.k, flags.RequireInt("k", 1, kMaxDim));
  MX_ASSIGN_OR_RETURN(run.n, flags.RequireInt("n", 1, kMaxDim));
  MX_ASSIGN_OR_RETURN(const int64_t concurrency, flags.IntOr("concurrency", 1, 1, 4096));
  run.load.concurrency = static_cast<int>(concurrency);
  MX_ASSIGN_OR_RETURN(run.load.duration, flags.DurationOr("duration", absl::Seconds(10)));
  MX_ASSIGN_OR_RETURN(run.load.warmup, flags.DurationOr("warmup", absl::Seconds(1)));
  run.load.flops_per_request =
      2.0 * static_cast<double>(run.m) * static_cast<double>(run.n) * static_cast<double>(run.k);
  return run;
}

}  // namespace mxctl
