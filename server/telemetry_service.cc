#include "server/telemetry_service.h"

#include <cmath>
#include <map>
#include <tuple>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "server/log.h"
#include "server/wire.h"

namespace mxserve {
namespace {

// Sources and devices become metric labels: keep them short and plain.
bool ValidLabel(absl::string_view value) {
  if (value.empty() || value.size() > 64) return false;
  for (char c : value) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-' && c != '.' &&
        c != ':' && c != '/') {
      return false;
    }
  }
  return true;
}

// Integrates one stream's samples: consecutive samples of a (source, device)
// form a trapezoid whose energy goes to the later sample's phase. A sample that
// fails validation ends the stream with INVALID_ARGUMENT; what came before it
// stays accounted.
class PowerReactor final : public grpc::ServerReadReactor<v1::PowerSample> {
 public:
  PowerReactor(const Core& core, v1::ReportPowerResponse* response)
      : core_(core), response_(response) {
    core_.calls->Begin();
    StartRead(&sample_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) return Done(absl::OkStatus());
    if (absl::Status s = Accept(); !s.ok()) return Done(s);
    StartRead(&sample_);
  }

  void OnDone() override {
    core_.calls->End();
    delete this;
  }

 private:
  absl::Status Accept() {
    const std::string field = absl::StrCat("samples[", index_++, "]");
    if (!ValidLabel(sample_.source())) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".source: expected 1-64 characters of [A-Za-z0-9_.:/-], got '", sample_.source(),
          "'"));
    }
    if (!ValidLabel(sample_.device())) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".device: expected 1-64 characters of [A-Za-z0-9_.:/-], got '", sample_.device(),
          "'"));
    }
    absl::StatusOr<Phase> phase = FromProto(sample_.phase(), absl::StrCat(field, ".phase"));
    if (!phase.ok()) return phase.status();
    if (!std::isfinite(sample_.watts()) || sample_.watts() < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".watts: expected a finite value >= 0, got ", sample_.watts()));
    }
    if (!std::isfinite(sample_.timestamp_seconds()) || sample_.timestamp_seconds() <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".timestamp_seconds: expected a positive Unix time, got ",
          sample_.timestamp_seconds()));
    }
    auto key = std::make_tuple(sample_.source(), sample_.device());
    auto last = last_.find(key);
    if (last != last_.end()) {
      const double dt = sample_.timestamp_seconds() - last->second.timestamp_seconds();
      if (dt < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            field, ".timestamp_seconds: ", sample_.timestamp_seconds(),
            " is earlier than the previous sample of ", sample_.source(), "/", sample_.device(),
            " (", last->second.timestamp_seconds(), "); timestamps must not decrease"));
      }
      const double joules = dt * (sample_.watts() + last->second.watts()) / 2;
      core_.ledger->Add(sample_.source(), *phase, sample_.timestamp_seconds(), {joules, dt, 0});
      core_.metrics->AddEnergy(sample_.source(), *phase, joules, dt);
      response_->set_joules_added(response_->joules_added() + joules);
    }
    core_.metrics->SetPower(sample_.source(), sample_.device(), sample_.watts());
    last_[key] = sample_;
    response_->set_samples_accepted(response_->samples_accepted() + 1);
    return absl::OkStatus();
  }

  void Done(const absl::Status& status) {
    core_.metrics->RecordStatus(Rpc::kReportPower, status.code());
    if (!status.ok()) {
      Log(LogLevel::kWarning, "power_rejected", {{"message", std::string(status.message())}});
    }
    Finish(ToGrpc(status));
  }

  const Core& core_;
  v1::ReportPowerResponse* response_;
  v1::PowerSample sample_;
  uint64_t index_ = 0;
  std::map<std::tuple<std::string, std::string>, v1::PowerSample> last_;
};

}  // namespace

grpc::ServerReadReactor<v1::PowerSample>* TelemetryService::ReportPower(
    grpc::CallbackServerContext*, v1::ReportPowerResponse* response) {
  return new PowerReactor(core_, response);
}

grpc::ServerUnaryReactor* TelemetryService::GetEnergyReport(
    grpc::CallbackServerContext* context, const v1::GetEnergyReportRequest* request,
    v1::EnergyReport* response) {
  auto* reactor = context->DefaultReactor();
  absl::Status status;
  if (!std::isfinite(request->since_seconds()) || request->since_seconds() < 0) {
    status = absl::InvalidArgumentError(absl::StrCat(
        "since_seconds: expected 0 (since start) or a Unix time, got ", request->since_seconds()));
  } else {
    for (const EnergyRow& row : core_.ledger->Report(request->since_seconds())) {
      v1::EnergyEntry* entry = response->add_entries();
      entry->set_source(row.source);
      entry->set_phase(ToProto(row.phase));
      entry->set_joules(row.amount.joules);
      entry->set_busy_seconds(row.amount.busy_seconds);
      entry->set_requests(row.amount.requests);
    }
    response->set_since_seconds(request->since_seconds());
    response->set_until_seconds(UnixSeconds());
  }
  core_.metrics->RecordStatus(Rpc::kGetEnergyReport, status.code());
  reactor->Finish(ToGrpc(status));
  return reactor;
}

}  // namespace mxserve
