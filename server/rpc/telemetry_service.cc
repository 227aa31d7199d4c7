#include "server/rpc/telemetry_service.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "mx/status_macros.h"
#include "server/base/label.h"
#include "server/compute/wire.h"
#include "server/rpc/call.h"
#include "server/telemetry/clock.h"
#include "server/telemetry/log.h"

namespace mxserve {
namespace {

// Integrates one stream's samples: consecutive samples of a (source, device)
// form a trapezoid whose energy goes to the later sample's phase. A sample that
// fails validation ends the stream with INVALID_ARGUMENT (RESOURCE_EXHAUSTED past
// the series cap); what came before it stays accounted.
class PowerReactor final : public grpc::ServerReadReactor<grpc::ByteBuffer> {
 public:
  PowerReactor(const Core& core, TelemetryService& service, grpc::CallbackServerContext* context,
               grpc::ByteBuffer* response)
      : core_(core),
        service_(service),
        record_(core, Rpc::kReportPower, context),
        raw_response_(response) {
    if (!record_.admission().ok()) {
      Done(record_.admission());
      return;
    }
    StartRead(&raw_sample_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) return Done(absl::OkStatus());
    if (absl::Status s = Accept(); !s.ok()) return Done(s);
    StartRead(&raw_sample_);
  }

  void OnCancel() override { record_.MarkCancelled(); }

  void OnDone() override {
    record_.Done();
    delete this;
  }

 private:
  absl::Status Accept() {
    const std::string field = absl::StrCat("samples[", index_++, "]");
    sample_.Clear();
    MX_RETURN_IF_ERROR(ParseMessage(raw_sample_, &sample_, field));
    raw_sample_.Clear();
    // Sources and devices become metric labels, runs ledger keys: short and plain.
    MX_RETURN_IF_ERROR(CheckPlainLabel(sample_.source(), absl::StrCat(field, ".source")));
    MX_RETURN_IF_ERROR(CheckPlainLabel(sample_.device(), absl::StrCat(field, ".device")));
    MX_RETURN_IF_ERROR(CheckRunTag(sample_.run(), absl::StrCat(field, ".run")));
    absl::StatusOr<Phase> phase = FromProto(sample_.phase(), absl::StrCat(field, ".phase"));
    if (!phase.ok()) return phase.status();
    if (!std::isfinite(sample_.watts()) || sample_.watts() < 0 ||
        sample_.watts() > core_.max_power_watts) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".watts: expected 0 to ", core_.max_power_watts,
                       " (--max-power-watts), got ", sample_.watts()));
    }
    const double now = UnixSeconds();
    const double t = sample_.timestamp_seconds();
    if (!std::isfinite(t) || t < now - kMaxPowerSampleAgeSeconds ||
        t > now + kMaxPowerClockAheadSeconds) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".timestamp_seconds: expected a Unix time within the last ",
          kMaxPowerSampleAgeSeconds, " s and at most ", kMaxPowerClockAheadSeconds,
          " s ahead of the daemon's clock (", absl::StrFormat("%.3f", now), "), got ", t));
    }
    MX_RETURN_IF_ERROR(service_.AdmitSeries(sample_.source(), sample_.device(), field));
    auto key = std::make_tuple(sample_.source(), sample_.device());
    auto last = last_.find(key);
    if (last == last_.end()) {
      // The first sample of a series adds no energy; its counters start at zero.
      core_.metrics->DeclareEnergySource(sample_.source());
    } else {
      const double dt = t - last->second.timestamp_seconds();
      if (dt < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            field, ".timestamp_seconds: ", t, " is earlier than the previous sample of ",
            sample_.source(), "/", sample_.device(), " (", last->second.timestamp_seconds(),
            "); timestamps must not decrease"));
      }
      // A gap too long to say what the device did in between counts nothing.
      if (dt <= kMaxPowerGapSeconds) {
        const double joules = dt * (sample_.watts() + last->second.watts()) / 2;
        core_.ledger->Add(sample_.source(), *phase, sample_.run(), t,
                          {.joules = joules, .busy_seconds = dt, .requests = 0});
        core_.metrics->AddEnergy(sample_.source(), *phase, joules, dt);
        response_.set_joules_added(response_.joules_added() + joules);
      }
    }
    core_.metrics->SetPower(sample_.source(), sample_.device(), sample_.watts());
    last_[key] = sample_;
    response_.set_samples_accepted(response_.samples_accepted() + 1);
    return absl::OkStatus();
  }

  void Done(absl::Status status) {
    status = record_.Settle(std::move(status), response_, raw_response_);
    // Who reported what: samples are attributed to the caller's principal.
    if (!status.ok()) {
      Log(LogLevel::kWarning, "power_rejected",
          {{"principal", record_.principal().name}, {"message", CapMessage(status.message())}});
    } else if (response_.samples_accepted() > 0) {
      Log(LogLevel::kInfo, "power_reported",
          {{"principal", record_.principal().name},
           {"samples", absl::StrCat(response_.samples_accepted())},
           {"joules", absl::StrCat(response_.joules_added())}});
    }
    Finish(ToGrpc(status));
  }

  const Core& core_;
  TelemetryService& service_;
  CallRecord record_;
  grpc::ByteBuffer* raw_response_;
  v1::ReportPowerResponse response_;
  grpc::ByteBuffer raw_sample_;
  v1::PowerSample sample_;
  uint64_t index_ = 0;
  std::map<std::tuple<std::string, std::string>, v1::PowerSample> last_;
};

}  // namespace

absl::Status TelemetryService::AdmitSeries(const std::string& source, const std::string& device,
                                           absl::string_view field) {
  for (const char* reserved : kReservedPowerSources) {
    if (source == reserved) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".source: ", Quote(source),
          " is reserved for the daemon's own accounting (fpga, fpga_model); report as another "
          "source, e.g. gpu_baseline"));
    }
  }
  const std::vector<std::string>& allowed = core_.power_sources;
  if (!allowed.empty() && std::find(allowed.begin(), allowed.end(), source) == allowed.end()) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".source: ", Quote(source),
                                                   " is not one of the sources this daemon "
                                                   "accepts (--power-sources: ",
                                                   absl::StrJoin(allowed, ", "), ")"));
  }
  MutexLock lock(&mu_);
  if (series_.contains({source, device})) return absl::OkStatus();
  if (series_.size() >= static_cast<size_t>(core_.max_power_series)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        field, ": (source, device) = (", Quote(source), ", ", Quote(device),
        ") would be a new power series, and the daemon already tracks ", series_.size(),
        ", its limit (--max-power-series); reuse a source and device name"));
  }
  series_.emplace(source, device);
  return absl::OkStatus();
}

grpc::ServerReadReactor<grpc::ByteBuffer>* TelemetryService::ReportPower(
    grpc::CallbackServerContext* context, grpc::ByteBuffer* response) {
  return new PowerReactor(core_, *this, context, response);
}

grpc::ServerUnaryReactor* TelemetryService::GetEnergyReport(grpc::CallbackServerContext* context,
                                                            const grpc::ByteBuffer* request,
                                                            grpc::ByteBuffer* response) {
  return ServeNow<v1::GetEnergyReportRequest, v1::EnergyReport>(
      core_, Rpc::kGetEnergyReport, context, request, response,
      [this](const v1::GetEnergyReportRequest& r, v1::EnergyReport* out) -> absl::Status {
        if (!std::isfinite(r.since_seconds()) || r.since_seconds() < 0) {
          return absl::InvalidArgumentError(absl::StrCat(
              "since_seconds: expected 0 (since start) or a Unix time, got ", r.since_seconds()));
        }
        MX_RETURN_IF_ERROR(CheckRunTag(r.run(), "run"));
        for (const EnergyRow& row : core_.ledger->Report(r.since_seconds(), r.run())) {
          v1::EnergyEntry* entry = out->add_entries();
          entry->set_source(row.source);
          entry->set_phase(ToProto(row.phase));
          entry->set_joules(row.amount.joules);
          entry->set_busy_seconds(row.amount.busy_seconds);
          entry->set_requests(row.amount.requests);
        }
        out->set_since_seconds(r.since_seconds());
        out->set_run(r.run());
        out->set_until_seconds(UnixSeconds());
        return absl::OkStatus();
      });
}

}  // namespace mxserve
