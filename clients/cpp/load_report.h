// How a load run is reported: the text summary and the one-line JSON object that
// `mxctl bench` and `bench/bare_client` both print, so scripts read them alike.
#pragma once

#include <cstdint>
#include <string>

#include "clients/cpp/load_generator.h"

namespace mxclient {

// What was measured, beside the figures.
struct LoadDescription {
  std::string target = {};  // e.g. "mxserved Compute.LayerForward", "bare Forward"
  int64_t m = 0, n = 0, k = 0;
  int concurrency = 0;
  std::string format = {};  // e.g. "MXFP4_E2M1"; empty when not applicable
  std::string phase = {};   // e.g. "rollout"; empty when not applicable
  bool stream = false;
};

// Keys: requests, seconds, requests_per_second, gflops, p50_ms, p90_ms, p99_ms,
// errors, concurrency, m, n, k, format, phase, stream (plus mean_ms, max_ms,
// target). One line, no trailing newline.
std::string LoadReportJson(const LoadResult& result, const LoadDescription& description);
// A few aligned lines, ending in a newline.
std::string LoadReportText(const LoadResult& result, const LoadDescription& description);

}  // namespace mxclient
