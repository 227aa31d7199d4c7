// How mxctl tells its two kinds of failure apart: an error of the command line or
// of a local file exits 2; an error the daemon returned (or a failed RPC) exits 1
// and names the RPC and its gRPC code, e.g.
//   mxctl: error: Models.DescribeModel: NOT_FOUND: model 'nope' is not registered
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace mxctl {

inline constexpr int kExitServerError = 1;
inline constexpr int kExitUsageError = 2;

absl::Status UsageError(absl::string_view message);
// Wraps a failed RPC's status: the message gains the RPC and the code's name, and
// a payload marks it as the daemon's error (exit 1). OK stays OK.
absl::Status ServerError(absl::string_view rpc, const absl::Status& status);
bool IsServerError(const absl::Status& status);
// The exit status for `status` (0 when OK).
int ExitCodeFor(const absl::Status& status);

}  // namespace mxctl
