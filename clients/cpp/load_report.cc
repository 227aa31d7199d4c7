#include "clients/cpp/load_report.h"

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace mxclient {

std::string LoadReportJson(const LoadResult& result, const LoadDescription& description) {
  nlohmann::ordered_json json;
  json["requests"] = result.requests;
  json["seconds"] = result.seconds;
  json["requests_per_second"] = result.requests_per_second;
  json["gflops"] = result.gflops;
  json["p50_ms"] = result.p50_ms;
  json["p90_ms"] = result.p90_ms;
  json["p99_ms"] = result.p99_ms;
  json["mean_ms"] = result.mean_ms;
  json["max_ms"] = result.max_ms;
  json["errors"] = result.errors;
  json["concurrency"] = description.concurrency;
  json["m"] = description.m;
  json["n"] = description.n;
  json["k"] = description.k;
  json["format"] = description.format;
  json["phase"] = description.phase;
  json["stream"] = description.stream;
  json["target"] = description.target;
  return json.dump();
}

std::string LoadReportText(const LoadResult& result, const LoadDescription& description) {
  std::string text = absl::StrFormat("%s: m=%d n=%d k=%d", description.target, description.m,
                                     description.n, description.k);
  if (!description.format.empty()) absl::StrAppend(&text, " format=", description.format);
  if (!description.phase.empty()) absl::StrAppend(&text, " phase=", description.phase);
  absl::StrAppendFormat(&text, ", concurrency %d%s, %.2f s\n", description.concurrency,
                        description.stream ? " on one stream" : "", result.seconds);
  absl::StrAppendFormat(&text, "requests    %d ok, %d errors\n", result.requests, result.errors);
  absl::StrAppendFormat(&text, "throughput  %.1f requests/s, %.2f GFLOP/s\n",
                        result.requests_per_second, result.gflops);
  absl::StrAppendFormat(&text,
                        "latency     p50 %.3f ms, p90 %.3f ms, p99 %.3f ms (mean %.3f, max %.3f)\n",
                        result.p50_ms, result.p90_ms, result.p99_ms, result.mean_ms, result.max_ms);
  return text;
}

}  // namespace mxclient
