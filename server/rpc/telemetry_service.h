// mxserve.v1.Telemetry: power samples, measured energy intervals and the layer
// calls clients computed themselves (ReportWork) in, energy reports out.
//
// Power samples come from outside the daemon and become metric labels and
// ledger entries, so they are bounded: source and device names are short and
// plain, the daemon's own sources ("fpga", "fpga_model") are reserved, the
// (source, device) pairs are capped (--max-power-series) or listed
// (--power-sources), and a sample must be plausible (watts up to
// --max-power-watts, a timestamp near the daemon's clock). Their run tags, like
// those of compute requests, go to the energy ledger only, which bounds them
// itself (--max-energy-runs).
#pragma once

#include <set>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "mxserve/v1/telemetry.grpc.pb.h"
#include "server/base/mutex.h"
#include "server/rpc/core.h"

namespace mxserve {

// Sources the daemon books itself; clients cannot report as them.
inline constexpr const char* kReservedPowerSources[] = {"fpga", "fpga_model"};
// A sample may be this far ahead of the daemon's clock (clocks drift)...
inline constexpr double kMaxPowerClockAheadSeconds = 60;
// ... and at most this old (the energy ledger's resolution window).
inline constexpr double kMaxPowerSampleAgeSeconds = 24 * 3600;
// Consecutive samples of a device further apart than this are not integrated:
// the later one starts a new integration, as a new stream would.
inline constexpr double kMaxPowerGapSeconds = 60;
// An energy interval (ReportEnergy) spans at most this: longer phases come as
// several intervals, so that no single report books hours at one instant.
inline constexpr double kMaxEnergyIntervalSeconds = 3600;
// An interval may hold up to --max-power-watts × (its length + this): NVML's
// energy counter moves about every 100 ms, so a short interval can see a step
// that belongs partly to the time just before it.
inline constexpr double kEnergyCounterSlackSeconds = 0.25;

// ReportWork's bounds (telemetry.proto): WorkCall entries in one message, the
// count of one, the counts of one message together (the booking loop on gRPC's
// thread stays well under a second), and the rows (m) of one call.
inline constexpr size_t kMaxWorkCalls = size_t{1} << 16;
inline constexpr uint64_t kMaxWorkCallCount = uint64_t{1} << 20;
inline constexpr uint64_t kMaxWorkCallsBooked = uint64_t{1} << 22;
inline constexpr uint64_t kMaxWorkRows = uint64_t{1} << 32;
// A call's multiply-accumulates (m × n × k) at most this: the FPGA model's MAC
// count of it is then an exact double.
inline constexpr uint64_t kMaxWorkCallMacs = uint64_t{1} << 53;

using RawTelemetryService = v1::Telemetry::WithRawCallbackMethod_ReportPower<
    v1::Telemetry::WithRawCallbackMethod_ReportEnergy<
        v1::Telemetry::WithRawCallbackMethod_GetEnergyReport<
            v1::Telemetry::WithRawCallbackMethod_ReportWork<v1::Telemetry::Service>>>>;

class TelemetryService final : public RawTelemetryService {
 public:
  explicit TelemetryService(const Core& core) : core_(core) {}

  grpc::ServerReadReactor<grpc::ByteBuffer>* ReportPower(grpc::CallbackServerContext* context,
                                                         grpc::ByteBuffer* response) override;
  grpc::ServerReadReactor<grpc::ByteBuffer>* ReportEnergy(grpc::CallbackServerContext* context,
                                                          grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* GetEnergyReport(grpc::CallbackServerContext* context,
                                            const grpc::ByteBuffer* request,
                                            grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* ReportWork(grpc::CallbackServerContext* context,
                                       const grpc::ByteBuffer* request,
                                       grpc::ByteBuffer* response) override;

  // OK when samples or intervals of (source, device) may be accounted: the source is not
  // reserved and is allowed, and the pair is known or there is room for it.
  // Errors name `field`.
  absl::Status AdmitSeries(const std::string& source, const std::string& device,
                           absl::string_view field);

 private:
  const Core& core_;
  Mutex mu_;
  // Admitted (source, device) pairs.
  std::set<std::pair<std::string, std::string>> series_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mxserve
