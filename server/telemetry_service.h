// mxserve.v1.Telemetry: power samples in, energy reports out.
#pragma once

#include "mxserve/v1/telemetry.grpc.pb.h"
#include "server/core.h"

namespace mxserve {

class TelemetryService final : public v1::Telemetry::CallbackService {
 public:
  explicit TelemetryService(const Core& core) : core_(core) {}

  grpc::ServerReadReactor<v1::PowerSample>* ReportPower(
      grpc::CallbackServerContext* context, v1::ReportPowerResponse* response) override;
  grpc::ServerUnaryReactor* GetEnergyReport(grpc::CallbackServerContext* context,
                                            const v1::GetEnergyReportRequest* request,
                                            v1::EnergyReport* response) override;

 private:
  const Core& core_;
};

}  // namespace mxserve
