#include "clients/cpp/remote.h"

#include "absl/strings/str_format.h"
#include "clients/cpp/table.h"
#include "clients/cpp/wire_names.h"

namespace mxctl {

std::unique_ptr<mxclient::Client> MakeClient(const RemoteContext& context) {
  // pick_first, not the library's round_robin: a command works on one daemon's
  // models and policies (bench registers, uploads, then calls its model), which
  // round_robin would split across the daemons of a multi-address --server.
  return std::make_unique<mxclient::Client>(mxclient::ClientOptions{
      .address = context.server, .timeout = context.timeout, .load_balancing_policy = ""});
}

std::string FormatExecutionInfo(const mxserve::v1::ExecutionInfo& info) {
  std::string format = mxclient::WireFormatName(info.format());
  if (info.weight_format() != info.format()) {
    absl::StrAppend(&format, " (weights ", mxclient::WireFormatName(info.weight_format()), ")");
  }
  return FormatKeyValues({
      {"format", format},
      {"backend", info.backend()},
      {"weight_version", absl::StrCat(info.weight_version())},
      {"batch_size", absl::StrCat(info.batch_size())},
      {"queue_ms", absl::StrFormat("%.4g", info.queue_seconds() * 1e3)},
      {"compute_ms", absl::StrFormat("%.4g", info.compute_seconds() * 1e3)},
      {"model_ms", absl::StrFormat("%.4g", info.model_seconds() * 1e3)},
      {"model_joules", absl::StrFormat("%.4g", info.model_joules())},
  });
}

std::string FormatBytes(uint64_t bytes) {
  if (bytes < 1024) return absl::StrCat(bytes, " B");
  const char* units[] = {"KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes) / 1024;
  int unit = 0;
  while (value >= 1024 && unit < 3) {
    value /= 1024;
    ++unit;
  }
  return absl::StrFormat("%.1f %s", value, units[unit]);
}

}  // namespace mxctl
