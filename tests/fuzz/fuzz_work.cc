// Fuzz target: Telemetry.ReportWork of a daemon in this process, checked
// against its own energy report and an independent pricing. fuzz_rpc sends
// every RPC mutated bytes and looks for crashes; this one also checks the
// books: a message is booked whole or not at all, and what it books is the
// FPGA model's estimate of each call, count times.
//
// Input: the bytes of one ReportWorkRequest, sent as they are. The daemon has
// the seed model's layer specs registered and no weights (a client computing
// locally never uploads them).
//
// What counts as a failure:
// - a status other than OK, INVALID_ARGUMENT, NOT_FOUND;
// - a refusal that does not name `calls`, `calls[k]` or `request`, or after
//   which the report's fpga_model requests or joules changed at all;
// - OK for bytes that do not parse, or for a call outside the documented bounds
//   (phase, kind, format unspecified; m, n, count, the flags);
// - OK, but `calls` not the sum of the counts, `model_joules` not exactly the
//   estimates (fpga_model::EstimateGemm, a backward's two GEMMs summed) added
//   one call at a time, or the report's requests, emulated requests and joules
//   not grown by them.
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "fpga/model/energy_model.h"
#include "mxserve/v1/telemetry.pb.h"
#include "proto/convert/formats.h"
#include "server/energy_model_default.h"
#include "tests/daemon/raw_call.h"
#include "tests/fuzz/fuzz_daemon.h"
#include "tests/fuzz/fuzz_seeds.h"

namespace {

namespace v1 = mxserve::v1;

constexpr const char* kMethod = "/mxserve.v1.Telemetry/ReportWork";

std::shared_ptr<grpc::Channel> channel;
fpga_model::EnergyModelParams params;

void Fail(const std::string& what) {
  std::fprintf(stderr, "fuzz_work: %s\n", what.c_str());
  std::abort();
}

struct Books {
  uint64_t requests = 0, emulated = 0;
  double joules = 0;
};

// fpga_model's entries, every run together.
Books ModelBooks() {
  const v1::EnergyReport report = mx_fuzz::EnergyReport(channel, "fuzz_work");
  Books books;
  for (const auto& e : report.entries()) {
    if (e.source() != "fpga_model") continue;
    books.requests += e.requests();
    books.emulated += e.emulated_requests();
    books.joules += e.joules();
  }
  return books;
}

void Setup() {
  channel = mx_fuzz::StartFuzzDaemon("fuzz_work");
  const mx_test::RawResult registered = mx_test::RawCall(
      channel, "/mxserve.v1.Models/RegisterModel", {mx_fuzz::SeedModel().SerializeAsString()});
  if (!registered.status.ok()) Fail("RegisterModel: " + registered.status.error_message());
  absl::StatusOr<fpga_model::EnergyModelParams> parsed =
      fpga_model::ParseEnergyModel(mxserve::kDefaultEnergyModelJson);
  if (!parsed.ok()) Fail(std::string(parsed.status().message()));
  params = *parsed;
}

// The seed layer named `name`, or null.
const mx_fuzz::SeedLayer* FindLayer(const std::string& name) {
  for (const auto& l : mx_fuzz::kSeedLayers) {
    if (name == l.name) return &l;
  }
  return nullptr;
}

// Empty, or 1-64 of [A-Za-z0-9_.:/-] (server/base/label.h).
bool PlainRun(const std::string& run) {
  if (run.size() > 64) return false;
  for (char ch : run) {
    if (!std::isalnum(static_cast<unsigned char>(ch)) && std::string("_.:/-").find(ch) == std::string::npos) {
      return false;
    }
  }
  return true;
}

// The joules one call books, priced independently of the daemon's code; NAN
// when the daemon must refuse it.
double CallJoules(const v1::WorkCall& c) {
  const mx_fuzz::SeedLayer* layer = FindLayer(c.layer());
  const std::optional<mx::Format> format = mxserve::ToMx(c.format());
  const bool forward = c.call() == v1::WORK_CALL_KIND_FORWARD;
  const bool backward = c.call() == v1::WORK_CALL_KIND_BACKWARD;
  const uint64_t n = c.n() == 0 && layer ? static_cast<uint64_t>(layer->out) : c.n();
  if (c.model() != mx_fuzz::kSeedModel || !PlainRun(c.run()) || layer == nullptr || !format || (!forward && !backward) ||
      c.phase() < 1 || c.phase() > 3 || c.m() < 1 || c.m() > (uint64_t{1} << 32) ||
      c.count() < 1 || c.count() > (uint64_t{1} << 20) || n < 1 ||
      n > static_cast<uint64_t>(layer->out) || (forward && n != static_cast<uint64_t>(layer->out)) ||
      (forward && (c.grad_input() || c.grad_weight())) ||
      (backward && !c.grad_input() && !c.grad_weight()) ||
      (c.grad_input() && n != static_cast<uint64_t>(layer->out))) {
    return NAN;
  }
  const auto m = static_cast<int64_t>(c.m()), nn = static_cast<int64_t>(n);
  if (forward) return fpga_model::EstimateGemm(params, *format, *format, m, nn, layer->in).joules;
  double joules = 0;
  if (c.grad_input()) joules = fpga_model::EstimateGemm(params, *format, *format, m, layer->in, nn).joules;
  if (c.grad_weight()) {
    joules = joules + fpga_model::EstimateGemm(params, *format, *format, nn, layer->in, m).joules;
  }
  return joules;
}

bool NamesCalls(const std::string& message) {
  return message.rfind("calls", 0) == 0 || message.rfind("request:", 0) == 0;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  Setup();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  v1::ReportWorkRequest request;
  const bool parsed = request.ParseFromString(bytes);
  const Books before = ModelBooks();
  const mx_test::RawResult result = mx_test::RawCall(channel, kMethod, {bytes}, 30.0);
  const Books after = ModelBooks();
  switch (result.status.error_code()) {
    case grpc::StatusCode::OK: {
      if (!parsed) Fail("OK for bytes that are not a ReportWorkRequest");
      v1::ReportWorkResponse response;
      if (result.responses.size() != 1 || !response.ParseFromString(result.responses[0])) {
        Fail("OK without a ReportWorkResponse");
      }
      uint64_t calls = 0;
      double joules = 0;
      for (int i = 0; i < request.calls_size(); ++i) {
        const double j = CallJoules(request.calls(i));
        if (std::isnan(j)) Fail("calls[" + std::to_string(i) + "] was booked, though out of bounds");
        calls += request.calls(i).count();
        for (uint64_t c = 0; c < request.calls(i).count(); ++c) joules += j;
      }
      if (request.calls_size() == 0 || request.calls_size() > (1 << 16)) {
        Fail("OK for a message of " + std::to_string(request.calls_size()) + " calls");
      }
      if (calls > (uint64_t{1} << 22)) Fail("OK for a message booking over 2^22 calls");
      if (response.calls() != calls) Fail("response.calls is not the sum of the counts");
      if (response.model_joules() != joules) {
        Fail("model_joules " + std::to_string(response.model_joules()) + ", priced " +
             std::to_string(joules));
      }
      if (after.requests - before.requests != calls || after.emulated - before.emulated != calls) {
        Fail("the report's requests did not grow by the calls booked");
      }
      const double tolerance = 1e-12 * std::fabs(before.joules) + 1e-9 * joules + 1e-12;
      if (!(std::fabs((after.joules - before.joules) - joules) <= tolerance)) {
        Fail("the report gained " + std::to_string(after.joules - before.joules) +
             " J for a message of " + std::to_string(joules) + " J");
      }
      break;
    }
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::NOT_FOUND:
      if (!NamesCalls(result.status.error_message())) {
        Fail("a refusal that names no field: " + result.status.error_message());
      }
      if (after.requests != before.requests || after.joules != before.joules) {
        Fail("a refused message booked something: " + result.status.error_message());
      }
      break;
    default:
      Fail("ReportWork answered " + std::to_string(result.status.error_code()) + ": " +
           result.status.error_message());
  }
  return 0;
}
