// mxclient::RunLoad: a closed-loop load generator. It keeps a fixed number of
// requests in flight for a while and measures what comes back: completions per
// second and latency percentiles. It knows nothing of the request itself — the
// caller's `issue` starts one and calls `done(ok)` when it finishes — so mxctl
// bench (mxserved) and bench/bare_client (a bare gRPC server) share this
// measuring code and their figures compare like for like.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace mxclient {

struct LoadOptions {
  int concurrency = 1;                          // requests kept in flight
  absl::Duration duration = absl::Seconds(10);  // measured time
  // Time run before the measurement starts (connections warm, caches filled);
  // nothing finishing in it is counted.
  absl::Duration warmup = absl::ZeroDuration();
  // Work of one request, for the GFLOP/s figure (0: not reported).
  double flops_per_request = 0;
  // A live line on stderr once a second (`\r`-refreshed) — only when stderr is a
  // terminal, so logs and pipes stay clean.
  bool progress = true;
  // Set to true (e.g. from a SIGINT handler) to end the measurement early.
  const std::atomic<bool>* interrupt = nullptr;
};

struct LoadResult {
  uint64_t requests = 0;  // successful completions within the measured time
  uint64_t errors = 0;    // failed completions within the measured time
  double seconds = 0;     // measured time actually elapsed
  double requests_per_second = 0;
  double gflops = 0;
  double p50_ms = 0, p90_ms = 0, p99_ms = 0, max_ms = 0, mean_ms = 0;  // successful requests
};

// `issue(done)` starts one request and arranges for `done(ok)` to be called
// exactly once when it finishes, from any thread (even before issue returns).
using IssueFn = std::function<void(std::function<void(bool ok)> done)>;

// Runs the load and returns once every request it started has finished.
LoadResult RunLoad(const LoadOptions& options, const IssueFn& issue);

// The nearest-rank percentile (q in [0, 1]) of `sorted` (ascending); 0 when empty.
double Percentile(const std::vector<double>& sorted, double q);

}  // namespace mxclient
