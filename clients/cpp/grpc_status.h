// gRPC status ↔ absl::Status. The two code enums share their numbering (both
// follow google.rpc.Code), so a daemon's NOT_FOUND stays NOT_FOUND for the caller.
#pragma once

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace mxclient {

inline absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

}  // namespace mxclient
