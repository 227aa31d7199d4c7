// `mxctl energy`: the daemon's energy accounting (Telemetry.GetEnergyReport) as a
// table per source and phase, of every run together or of one (--run).
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "clients/cpp/cli_status.h"
#include "clients/cpp/commands.h"
#include "clients/cpp/common_flags.h"
#include "clients/cpp/table.h"
#include "clients/cpp/wire_names.h"
#include "mx/status_macros.h"

namespace mxctl {

namespace v1 = ::mxserve::v1;

absl::Status RunEnergy(const RemoteContext& remote, const Args& args) {
  MX_ASSIGN_OR_RETURN(auto flags, Flags::Parse(args, {"since", "run"}));
  // --since N: the last N seconds; absent: since the daemon started.
  double since = 0;
  if (flags.Has("since")) {
    MX_ASSIGN_OR_RETURN(auto window, flags.DurationOr("since", absl::ZeroDuration()));
    since = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch() - window);
  }
  const auto client = MakeClient(remote);
  absl::StatusOr<v1::EnergyReport> report = client->GetEnergyReport(since, RunFlag(flags));
  if (!report.ok()) return ServerError("Telemetry.GetEnergyReport", report.status());

  const auto time = [](double unix_seconds) {
    return absl::FormatTime("%Y-%m-%d %H:%M:%S", absl::UnixEpoch() + absl::Seconds(unix_seconds),
                            absl::LocalTimeZone());
  };
  // A report since 0 covers everything since the daemon started.
  if (report->since_seconds() > 0) {
    std::printf("energy from %s to %s (%.1f s)\n", time(report->since_seconds()).c_str(),
                time(report->until_seconds()).c_str(),
                report->until_seconds() - report->since_seconds());
  } else {
    std::printf("energy since the daemon started, until %s\n",
                time(report->until_seconds()).c_str());
  }
  if (!report->run().empty()) std::printf("run %s\n", report->run().c_str());
  std::vector<std::vector<std::string>> rows = {
      {"source", "phase", "joules", "busy_s", "requests", "mean_watts"}};
  for (const v1::EnergyEntry& entry : report->entries()) {
    rows.push_back(
        {entry.source(), mxserve::WireName(entry.phase()), absl::StrFormat("%.6g", entry.joules()),
         absl::StrFormat("%.4g", entry.busy_seconds()), absl::StrCat(entry.requests()),
         entry.busy_seconds() > 0 ? absl::StrFormat("%.3g", entry.joules() / entry.busy_seconds())
                                  : "-"});
  }
  std::fputs(FormatTable(rows).c_str(), stdout);
  if (report->entries().empty()) {
    std::printf(report->run().empty() ? "(nothing accounted yet)\n"
                                      : "(nothing accounted under this run)\n");
  }
  return absl::OkStatus();
}

}  // namespace mxctl
