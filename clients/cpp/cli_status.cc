#include "clients/cpp/cli_status.h"

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"

namespace mxctl {
namespace {

constexpr char kServerErrorPayload[] = "type.mxserve.dev/mxctl.ServerError";

}  // namespace

absl::Status UsageError(absl::string_view message) { return absl::InvalidArgumentError(message); }

absl::Status ServerError(absl::string_view rpc, const absl::Status& status) {
  if (status.ok()) return status;
  absl::Status wrapped(
      status.code(),
      absl::StrCat(rpc, ": ", absl::StatusCodeToString(status.code()), ": ", status.message()));
  wrapped.SetPayload(kServerErrorPayload, absl::Cord("1"));
  return wrapped;
}

bool IsServerError(const absl::Status& status) {
  return status.GetPayload(kServerErrorPayload).has_value();
}

int ExitCodeFor(const absl::Status& status) {
  if (status.ok()) return 0;
  return IsServerError(status) ? kExitServerError : kExitUsageError;
}

}  // namespace mxctl
