#include "server/rpc/telemetry_service.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "mx/checked_math.h"
#include "mx/status_macros.h"
#include "proto/convert/enums.h"
#include "server/base/label.h"
#include "server/compute/compute_work.h"
#include "server/compute/wire.h"
#include "server/rpc/call.h"
#include "server/telemetry/clock.h"
#include "server/telemetry/log.h"

namespace mxserve {
namespace {

// What a power sample and an energy interval are checked against alike: the
// daemon's clock, within the last day and at most a minute ahead.
absl::Status CheckTimestamp(double t, double now, absl::string_view field) {
  if (std::isfinite(t) && t >= now - kMaxPowerSampleAgeSeconds &&
      t <= now + kMaxPowerClockAheadSeconds) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      field, ": expected a Unix time within the last ", kMaxPowerSampleAgeSeconds,
      " s and at most ", kMaxPowerClockAheadSeconds, " s ahead of the daemon's clock (",
      absl::StrFormat("%.3f", now), "), got ", t));
}

// Source, device and run: they become metric labels and ledger keys, so they
// are short and plain; and the run is one `who` may book into.
template <typename Message>
absl::Status CheckLabels(const Core& core, const Message& m, const Principal& who,
                         absl::string_view field) {
  MX_RETURN_IF_ERROR(CheckPlainLabel(m.source(), absl::StrCat(field, ".source")));
  MX_RETURN_IF_ERROR(CheckPlainLabel(m.device(), absl::StrCat(field, ".device")));
  MX_RETURN_IF_ERROR(CheckRunTag(m.run(), absl::StrCat(field, ".run")));
  return core.ledger->CheckRun(m.run(), who, absl::StrCat(field, ".run"));
}

// One client stream of telemetry (ReportPower, ReportEnergy): reads messages
// one at a time and hands each to Derived::Accept; the first that fails ends
// the stream with its status, and what was accepted before it stays accounted.
template <typename Derived, typename Message, typename Response>
class ReportReactor : public grpc::ServerReadReactor<grpc::ByteBuffer> {
 public:
  ReportReactor(const Core& core, TelemetryService& service, Rpc rpc,
                grpc::CallbackServerContext* context, grpc::ByteBuffer* response)
      : core_(core), service_(service), record_(core, rpc, context), raw_response_(response) {}

  void OnReadDone(bool ok) override {
    if (!ok) return Done(absl::OkStatus());
    const std::string field = absl::StrCat(Derived::kField, "[", index_++, "]");
    message_.Clear();
    absl::Status s = ParseMessage(raw_message_, &message_, field);
    raw_message_.Clear();
    if (s.ok()) s = static_cast<Derived*>(this)->Accept(message_, field);
    if (!s.ok()) return Done(s);
    StartRead(&raw_message_);
  }

  void OnCancel() override { record_.MarkCancelled(); }

  void OnDone() override {
    record_.Done();
    delete static_cast<Derived*>(this);
  }

 protected:
  // The constructor's last step (a derived reactor is complete by then).
  void Begin() {
    if (!record_.admission().ok()) return Done(record_.admission());
    StartRead(&raw_message_);
  }

  void Done(absl::Status status) {
    status = record_.Settle(std::move(status), response_, raw_response_);
    // Who reported what: measurements are attributed to the caller's principal.
    if (!status.ok()) {
      Log(LogLevel::kWarning, Derived::kRejectedEvent,
          {{"principal", record_.principal().name}, {"message", CapMessage(status.message())}});
    } else if (static_cast<Derived*>(this)->accepted() > 0) {
      Log(LogLevel::kInfo, Derived::kReportedEvent,
          {{"principal", record_.principal().name},
           {Derived::kField, absl::StrCat(static_cast<Derived*>(this)->accepted())},
           {"joules", absl::StrCat(response_.joules_added())}});
    }
    Finish(ToGrpc(status));
  }

  // The caller: it books into its own runs.
  const Principal& principal() const { return record_.principal(); }

  const Core& core_;
  TelemetryService& service_;
  Response response_;

 private:
  CallRecord record_;
  grpc::ByteBuffer* raw_response_;
  grpc::ByteBuffer raw_message_;
  Message message_;
  uint64_t index_ = 0;
};

// Integrates one stream's samples: consecutive samples of a (source, device)
// form a trapezoid whose energy goes to the later sample's phase. A sample that
// fails validation ends the stream with INVALID_ARGUMENT (RESOURCE_EXHAUSTED past
// the series cap); what came before it stays accounted.
class PowerReactor final
    : public ReportReactor<PowerReactor, v1::PowerSample, v1::ReportPowerResponse> {
 public:
  static constexpr const char* kField = "samples";
  static constexpr const char* kReportedEvent = "power_reported";
  static constexpr const char* kRejectedEvent = "power_rejected";

  PowerReactor(const Core& core, TelemetryService& service, grpc::CallbackServerContext* context,
               grpc::ByteBuffer* response)
      : ReportReactor(core, service, Rpc::kReportPower, context, response) {
    Begin();
  }

  uint64_t accepted() const { return response_.samples_accepted(); }

  absl::Status Accept(const v1::PowerSample& sample, const std::string& field) {
    MX_RETURN_IF_ERROR(CheckLabels(core_, sample, principal(), field));
    absl::StatusOr<Phase> phase = FromProto(sample.phase(), absl::StrCat(field, ".phase"));
    if (!phase.ok()) return phase.status();
    if (!std::isfinite(sample.watts()) || sample.watts() < 0 ||
        sample.watts() > core_.max_power_watts) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".watts: expected 0 to ", core_.max_power_watts,
                       " (--max-power-watts), got ", sample.watts()));
    }
    const double t = sample.timestamp_seconds();
    MX_RETURN_IF_ERROR(CheckTimestamp(t, UnixSeconds(), absl::StrCat(field, ".timestamp_seconds")));
    MX_RETURN_IF_ERROR(service_.AdmitSeries(sample.source(), sample.device(), field));
    auto key = std::make_tuple(sample.source(), sample.device());
    auto last = last_.find(key);
    if (last == last_.end()) {
      // The first sample of a series adds no energy; its counters start at zero.
      core_.metrics->DeclareEnergySource(sample.source());
    } else {
      const double dt = t - last->second.timestamp_seconds();
      if (dt < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            field, ".timestamp_seconds: ", t, " is earlier than the previous sample of ",
            sample.source(), "/", sample.device(), " (", last->second.timestamp_seconds(),
            "); timestamps must not decrease"));
      }
      // A gap too long to say what the device did in between counts nothing.
      if (dt <= kMaxPowerGapSeconds) {
        const double joules = dt * (sample.watts() + last->second.watts()) / 2;
        core_.ledger->Add(sample.source(), *phase, sample.run(), t,
                          {.joules = joules, .busy_seconds = dt, .requests = 0}, 1, principal());
        core_.metrics->AddEnergy(sample.source(), *phase, joules, dt);
        response_.set_joules_added(response_.joules_added() + joules);
      }
    }
    core_.metrics->SetPower(sample.source(), sample.device(), sample.watts());
    last_[key] = sample;
    response_.set_samples_accepted(response_.samples_accepted() + 1);
    return absl::OkStatus();
  }

 private:
  std::map<std::tuple<std::string, std::string>, v1::PowerSample> last_;
};

// Books one stream's measured intervals as they are: joules and end - start
// busy seconds to (source, phase, run), at the interval's end. Each interval is
// checked whole before anything of it is booked.
class EnergyReactor final
    : public ReportReactor<EnergyReactor, v1::EnergyInterval, v1::ReportEnergyResponse> {
 public:
  static constexpr const char* kField = "intervals";
  static constexpr const char* kReportedEvent = "energy_reported";
  static constexpr const char* kRejectedEvent = "energy_rejected";

  EnergyReactor(const Core& core, TelemetryService& service, grpc::CallbackServerContext* context,
                grpc::ByteBuffer* response)
      : ReportReactor(core, service, Rpc::kReportEnergy, context, response) {
    Begin();
  }

  uint64_t accepted() const { return response_.intervals_accepted(); }

  absl::Status Accept(const v1::EnergyInterval& interval, const std::string& field) {
    MX_RETURN_IF_ERROR(CheckLabels(core_, interval, principal(), field));
    absl::StatusOr<Phase> phase = FromProto(interval.phase(), absl::StrCat(field, ".phase"));
    if (!phase.ok()) return phase.status();
    const double now = UnixSeconds();
    const double start = interval.start_seconds(), end = interval.end_seconds();
    MX_RETURN_IF_ERROR(CheckTimestamp(start, now, absl::StrCat(field, ".start_seconds")));
    MX_RETURN_IF_ERROR(CheckTimestamp(end, now, absl::StrCat(field, ".end_seconds")));
    // Both ends are finite and within a day of now here, so the difference is too.
    const double seconds = end - start;
    if (seconds < 0 || seconds > kMaxEnergyIntervalSeconds) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".end_seconds: expected start_seconds (", absl::StrFormat("%.3f", start),
          ") to start_seconds + ", kMaxEnergyIntervalSeconds,
          " s (report a longer phase as several intervals), got ", absl::StrFormat("%.3f", end)));
    }
    // No device draws more than --max-power-watts; the slack is for a counter
    // that moved on just before one end was read.
    const double most = core_.max_power_watts * (seconds + kEnergyCounterSlackSeconds);
    const double joules = interval.joules();
    if (!std::isfinite(joules) || joules < 0 || joules > most) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".joules: expected 0 to ", most, " (--max-power-watts ", core_.max_power_watts,
          " W × (", seconds, " s + ", kEnergyCounterSlackSeconds, " s)), got ", joules));
    }
    MX_RETURN_IF_ERROR(service_.AdmitSeries(interval.source(), interval.device(), field));
    auto key = std::make_tuple(interval.source(), interval.device());
    if (auto last_end = last_end_.find(key); last_end != last_end_.end()) {
      if (start < last_end->second) {
        return absl::InvalidArgumentError(absl::StrCat(
            field, ".start_seconds: expected at least ", absl::StrFormat("%.3f", last_end->second),
            " (the end of the previous interval of ", interval.source(), "/", interval.device(),
            "; intervals must not overlap or go back in time), got ",
            absl::StrFormat("%.3f", start)));
      }
    } else {
      // Counters of a new source start at zero, as ReportPower's do.
      core_.metrics->DeclareEnergySource(interval.source());
    }
    core_.ledger->Add(interval.source(), *phase, interval.run(), end,
                      {.joules = joules, .busy_seconds = seconds, .requests = 0}, 1, principal());
    core_.metrics->AddEnergy(interval.source(), *phase, joules, seconds);
    last_end_[key] = end;
    response_.set_joules_added(response_.joules_added() + joules);
    response_.set_intervals_accepted(response_.intervals_accepted() + 1);
    return absl::OkStatus();
  }

 private:
  std::map<std::tuple<std::string, std::string>, double> last_end_;
};

// One WorkCall of a ReportWork message, checked and priced: what booking it needs.
struct PricedWorkCall {
  Rpc rpc;  // kLayerForward or kLayerBackward: the call it stands for
  Phase phase;
  mx::Format format;
  LayerCallCost cost;
  uint64_t count;
};

// Checks `call` (the message's `field`, "calls[i]") and prices it as the daemon
// prices the LayerForward or LayerBackward it stands for. The layer must be
// registered; its weights need not be published (a client computing locally
// registers its specs and never uploads weights).
absl::StatusOr<PricedWorkCall> PriceWorkCall(const Core& core, const v1::WorkCall& call,
                                             const Principal& who, const std::string& field) {
  MX_ASSIGN_OR_RETURN(Phase phase, FromProto(call.phase(), absl::StrCat(field, ".phase")));
  MX_RETURN_IF_ERROR(CheckRunTag(call.run(), absl::StrCat(field, ".run")));
  MX_RETURN_IF_ERROR(core.ledger->CheckRun(call.run(), who, absl::StrCat(field, ".run")));
  const bool forward = call.call() == v1::WORK_CALL_KIND_FORWARD;
  if (!forward && call.call() != v1::WORK_CALL_KIND_BACKWARD) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".call: expected ",
        WireNameList(DescriptorOf<v1::WorkCallKind>(), /*full=*/true), ", got ",
        call.call() == v1::WORK_CALL_KIND_UNSPECIFIED ? std::string("unspecified")
                                                      : absl::StrCat(call.call())));
  }
  MX_ASSIGN_OR_RETURN(std::optional<mx::Format> format,
                      FromProto(call.format(), absl::StrCat(field, ".format")));
  if (!format) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".format: required (the format the call ran in; there is no policy to resolve); "
               "expected one of ",
        mx::FormatNameList()));
  }
  // The registry names the field "model" or "layer": prefixed, "calls[i].model".
  absl::StatusOr<LayerSpec> spec = core.registry->FindLayer(call.model(), call.layer(), "layer");
  if (!spec.ok()) {
    return absl::Status(spec.status().code(), absl::StrCat(field, ".", spec.status().message()));
  }
  const auto out_features = static_cast<uint64_t>(spec->out_features);
  const auto in_features = static_cast<uint64_t>(spec->in_features);
  const std::string layer = absl::StrCat(" of layer ", Quote(spec->name));
  if (call.m() < 1 || call.m() > kMaxWorkRows) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".m: expected 1 to ", kMaxWorkRows,
                                                   " (rows of X, or of grad_output), got ",
                                                   call.m()));
  }
  uint64_t n = call.n() == 0 ? out_features : call.n();
  if (forward && n != out_features) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".n: expected 0 or ", out_features,
                                                   " (out_features", layer,
                                                   ") for a forward call, got ", call.n()));
  }
  if (!forward && n > out_features) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".n: expected 0 or 1 to ", out_features, " (out_features", layer,
        ", or the width of a weight_rows slice) for a backward call, got ", call.n()));
  }
  if (!forward && call.grad_input() && n != out_features) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".n: expected 0 or ", out_features, " (out_features", layer,
        ") for a backward call with grad_input (a weight_rows slice computes grad_weight only), "
        "got ",
        call.n()));
  }
  if (forward && (call.grad_input() || call.grad_weight())) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, call.grad_input() ? ".grad_input" : ".grad_weight",
                     ": expected false for a forward call (it runs no gradient)"));
  }
  if (!forward && !call.grad_input() && !call.grad_weight()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field,
                     ".grad_weight: a backward call runs grad_input, grad_weight or both; "
                     "got neither"));
  }
  const std::optional<uint64_t> macs = mx::CheckedProduct({call.m(), n, in_features});
  if (!macs || *macs > kMaxWorkCallMacs) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".m: m × n × in_features = ", call.m(), " × ", n, " × ", in_features, layer,
        " is over ", kMaxWorkCallMacs, " multiply-accumulates; report fewer rows per call"));
  }
  if (call.count() < 1 || call.count() > kMaxWorkCallCount) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".count: expected 1 to ",
                                                   kMaxWorkCallCount, ", got ", call.count()));
  }
  // m, n and in_features are at most 2^53 each here: int64 holds them.
  const auto m = static_cast<int64_t>(call.m()), n64 = static_cast<int64_t>(n);
  const int64_t k = spec->in_features;
  return PricedWorkCall{
      .rpc = forward ? Rpc::kLayerForward : Rpc::kLayerBackward,
      .phase = phase,
      .format = *format,
      .cost = forward ? PriceForward(core, *format, *format, m, n64, k)
                      : PriceBackward(core, *format, m, n64, k, call.grad_input(),
                                      call.grad_weight()),
      .count = call.count()};
}

void FillEnergyEntry(const std::string& source, Phase phase, const EnergyAmount& amount,
                     v1::EnergyEntry* entry) {
  entry->set_source(source);
  entry->set_phase(ToProto(phase));
  entry->set_joules(amount.joules);
  entry->set_busy_seconds(amount.busy_seconds);
  entry->set_requests(amount.requests);
  entry->set_emulated_requests(amount.emulated_requests);
}

// ReportWork: every call checked and priced first (a bad one books nothing),
// then booked in message order, each `count` times, at one instant.
absl::Status BookReportedWork(const Core& core, const v1::ReportWorkRequest& request,
                              const Principal& who, v1::ReportWorkResponse* response) {
  if (request.calls().empty() || static_cast<size_t>(request.calls_size()) > kMaxWorkCalls) {
    return absl::InvalidArgumentError(absl::StrCat("calls: expected 1 to ", kMaxWorkCalls,
                                                   " calls per message, got ",
                                                   request.calls_size(),
                                                   request.calls().empty()
                                                       ? ""
                                                       : "; send them in several messages"));
  }
  std::vector<PricedWorkCall> priced;
  priced.reserve(request.calls().size());
  uint64_t booked = 0;
  for (int i = 0; i < request.calls_size(); ++i) {
    const std::string field = absl::StrCat("calls[", i, "]");
    MX_ASSIGN_OR_RETURN(PricedWorkCall call, PriceWorkCall(core, request.calls(i), who, field));
    const std::optional<uint64_t> total = mx::CheckedAdd(booked, call.count);
    if (!total || *total > kMaxWorkCallsBooked) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".count: the counts of calls[0..", i, "] add up to more than ",
          kMaxWorkCallsBooked, ", the most one message books; send the rest in another message"));
    }
    booked = *total;
    priced.push_back(call);
  }
  const double now = UnixSeconds();
  double joules = 0, seconds = 0;
  for (int i = 0; i < request.calls_size(); ++i) {
    const PricedWorkCall& call = priced[static_cast<size_t>(i)];
    BookEmulatedCalls(core, call.rpc, call.phase, request.calls(i).run(), who, call.format,
                      call.cost, call.count, now, request.calls(i).model());
    for (uint64_t c = 0; c < call.count; ++c) {
      joules += call.cost.model.joules;
      seconds += call.cost.model.seconds;
    }
  }
  response->set_calls(booked);
  response->set_model_joules(joules);
  response->set_model_seconds(seconds);
  return absl::OkStatus();
}

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

grpc::ServerReadReactor<grpc::ByteBuffer>* TelemetryService::ReportEnergy(
    grpc::CallbackServerContext* context, grpc::ByteBuffer* response) {
  return new EnergyReactor(core_, *this, context, response);
}

grpc::ServerUnaryReactor* TelemetryService::GetEnergyReport(grpc::CallbackServerContext* context,
                                                            const grpc::ByteBuffer* request,
                                                            grpc::ByteBuffer* response) {
  return ServeNow<v1::GetEnergyReportRequest, v1::EnergyReport>(
      core_, Rpc::kGetEnergyReport, context, request, response,
      [this](const v1::GetEnergyReportRequest& r, v1::EnergyReport* out,
             const CallRecord& record) -> absl::Status {
        if (!std::isfinite(r.since_seconds()) || r.since_seconds() < 0) {
          return absl::InvalidArgumentError(absl::StrCat(
              "since_seconds: expected 0 (since start) or a Unix time, got ", r.since_seconds()));
        }
        MX_RETURN_IF_ERROR(CheckRunTag(r.run(), "run"));
        if (r.by_model()) {
          // Totals since start, every run together: no time or run filter applies.
          if (r.since_seconds() != 0) {
            return absl::InvalidArgumentError(absl::StrCat(
                "since_seconds: by_model reports totals since the daemon started; expected 0, "
                "got ", r.since_seconds()));
          }
          if (!r.run().empty()) {
            return absl::InvalidArgumentError(
                absl::StrCat("run: by_model reports every run together; expected empty, got ",
                             Quote(r.run())));
          }
          for (const ModelEnergyRow& row : core_.ledger->ModelReport()) {
            v1::EnergyEntry* entry = out->add_entries();
            entry->set_model(row.model);
            FillEnergyEntry(row.source, row.phase, row.amount, entry);
          }
          out->set_until_seconds(UnixSeconds());
          return absl::OkStatus();
        }
        // One run's report is its owner's (and admins'); every run summed is anyone's.
        MX_RETURN_IF_ERROR(core_.ledger->CheckRun(r.run(), record.principal(), "run"));
        for (const EnergyRow& row : core_.ledger->Report(r.since_seconds(), r.run())) {
          FillEnergyEntry(row.source, row.phase, row.amount, out->add_entries());
        }
        out->set_since_seconds(r.since_seconds());
        out->set_run(r.run());
        out->set_until_seconds(UnixSeconds());
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* TelemetryService::ReportWork(grpc::CallbackServerContext* context,
                                                       const grpc::ByteBuffer* request,
                                                       grpc::ByteBuffer* response) {
  return ServeNow<v1::ReportWorkRequest, v1::ReportWorkResponse>(
      core_, Rpc::kReportWork, context, request, response,
      [this](const v1::ReportWorkRequest& r, v1::ReportWorkResponse* out,
             const CallRecord& record) -> absl::Status {
        absl::Status status = BookReportedWork(core_, r, record.principal(), out);
        // Who booked what: reported work is attributed to the caller's principal.
        if (!status.ok()) {
          Log(LogLevel::kWarning, "work_rejected",
              {{"principal", record.principal().name}, {"message", CapMessage(status.message())}});
        } else {
          Log(LogLevel::kInfo, "work_reported",
              {{"principal", record.principal().name},
               {"calls", absl::StrCat(out->calls())},
               {"joules", absl::StrCat(out->model_joules())}});
        }
        return status;
      });
}

}  // namespace mxserve
