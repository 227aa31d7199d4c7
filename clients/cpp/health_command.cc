// `mxctl health`: grpc.health.v1 Check against the daemon; prints the serving
// status and succeeds only when it is SERVING.
#include <cstdio>

#include "clients/cpp/cli_status.h"
#include "clients/cpp/commands.h"
#include "mx/status_macros.h"

namespace mxctl {

absl::StatusOr<int> RunHealth(const RemoteContext& remote, const Args& args) {
  MX_ASSIGN_OR_RETURN(auto flags, Flags::Parse(args, {"service"}));
  const auto client = MakeClient(remote);
  absl::StatusOr<grpc::health::v1::HealthCheckResponse::ServingStatus> status =
      client->CheckHealth(flags.Get("service").value_or(""));
  if (!status.ok()) return ServerError("grpc.health.v1.Health.Check", status.status());
  std::printf("%s\n", grpc::health::v1::HealthCheckResponse::ServingStatus_Name(*status).c_str());
  return *status == grpc::health::v1::HealthCheckResponse::SERVING ? 0 : kExitServerError;
}

}  // namespace mxctl
