// The daemon the RPC fuzz targets (fuzz_rpc, fuzz_energy, fuzz_work) talk to: in
// their own process, on a free loopback port, quiet, one worker, no metrics, no
// grace, and few run tags (mutated tags then fold runs into the untagged energy
// often); it lives as long as the process.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>

#include "grpcpp/grpcpp.h"
#include "mxserve/v1/telemetry.pb.h"
#include "server/daemon.h"
#include "server/telemetry/log.h"
#include "tests/daemon/raw_call.h"

namespace mx_fuzz {

// Starts it with `adjust` applied to the options, and returns a channel to it;
// aborts, naming `target`, when it does not start.
inline std::shared_ptr<grpc::Channel> StartFuzzDaemon(
    const char* target, const std::function<void(mxserve::DaemonOptions&)>& adjust = {}) {
  mxserve::SetLogging(false);
  mxserve::DaemonOptions options;
  options.listen = "127.0.0.1:0";
  options.metrics_listen = "off";
  options.workers = 1;
  options.kernel_threads = 1;
  options.grace_seconds = 0;
  options.max_energy_runs = 4;
  if (adjust) adjust(options);
  absl::StatusOr<std::unique_ptr<mxserve::Daemon>> started = mxserve::Daemon::Start(options);
  if (!started.ok()) {
    std::fprintf(stderr, "%s: %s\n", target, std::string(started.status().message()).c_str());
    std::abort();
  }
  // It lives as long as the process, held by a static so that LeakSanitizer finds
  // it reachable (a local pointer dropped here is reported as a leak).
  static mxserve::Daemon* daemon = nullptr;
  daemon = started->release();
  return grpc::CreateChannel(daemon->grpc_address(), grpc::InsecureChannelCredentials());
}

// The daemon's energy report, every run together; aborts, naming `target`, when
// it cannot be read.
inline mxserve::v1::EnergyReport EnergyReport(const std::shared_ptr<grpc::Channel>& channel,
                                              const char* target) {
  const mx_test::RawResult result =
      mx_test::RawCall(channel, "/mxserve.v1.Telemetry/GetEnergyReport", {""});
  mxserve::v1::EnergyReport report;
  if (!result.status.ok() || result.responses.empty() ||
      !report.ParseFromString(result.responses[0])) {
    std::fprintf(stderr, "%s: GetEnergyReport failed: %s\n", target,
                 result.status.error_message().c_str());
    std::abort();
  }
  return report;
}

}  // namespace mx_fuzz
