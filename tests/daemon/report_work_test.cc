// Telemetry.ReportWork against real daemons over loopback: layer calls a client
// computed itself book exactly what the daemon books for running them (the
// ledger's fpga_model joules, busy seconds and requests bit for bit, and the
// same Prometheus FLOPs, bytes and energy counters), marked as emulated; every
// field of a bad message is refused naming calls[i].<field>, with nothing of
// the message booked; the role is LayerForward's; the daemon keeps serving.
#include <bit>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "tests/daemon/api_util.h"
#include "tests/daemon/daemon_process.h"
#include "server/rpc/access.h"
#include "tests/daemon/raw_call.h"

namespace mx_test {
namespace {

constexpr mx::Format kMxfp4 = mx::Format::kMxfp4E2m1;
constexpr mx::Format kMxfp8 = mx::Format::kMxfp8E4m3;
constexpr mx::Format kBf16 = mx::Format::kBf16;

v1::WorkCall Forward(v1::Phase phase, const std::string& run, const std::string& model,
                     const TestLayer& layer, mx::Format format, uint64_t m, uint64_t count = 1) {
  v1::WorkCall c;
  c.set_phase(phase);
  c.set_run(run);
  c.set_model(model);
  c.set_layer(layer.name);
  c.set_call(v1::WORK_CALL_KIND_FORWARD);
  c.set_format(mxserve::ToProto(format));
  c.set_m(m);
  c.set_count(count);
  return c;
}

v1::WorkCall Backward(v1::Phase phase, const std::string& run, const std::string& model,
                      const TestLayer& layer, mx::Format format, uint64_t m, uint64_t n,
                      bool grad_input, bool grad_weight) {
  v1::WorkCall c = Forward(phase, run, model, layer, format, m);
  c.set_call(v1::WORK_CALL_KIND_BACKWARD);
  c.set_n(n);
  c.set_grad_input(grad_input);
  c.set_grad_weight(grad_weight);
  return c;
}

grpc::Status ReportWork(const std::shared_ptr<grpc::Channel>& channel,
                        const std::vector<v1::WorkCall>& calls, v1::ReportWorkResponse* response,
                        const std::string& token = "") {
  v1::ReportWorkRequest request;
  for (const auto& c : calls) *request.add_calls() = c;
  grpc::ClientContext context;
  Authorize(context, token);
  return v1::Telemetry::NewStub(channel)->ReportWork(&context, request, response);
}

v1::EnergyReport Report(const std::shared_ptr<grpc::Channel>& channel, const std::string& run) {
  grpc::ClientContext context;
  v1::GetEnergyReportRequest request;
  request.set_run(run);
  v1::EnergyReport report;
  EXPECT_TRUE(v1::Telemetry::NewStub(channel)->GetEnergyReport(&context, request, &report).ok());
  return report;
}

uint64_t Bits(double d) { return std::bit_cast<uint64_t>(d); }

// The fpga_model entries of `served` (a daemon that ran the calls) and
// `reported` (one that was told of them) agree bit for bit; the reported ones
// are all marked emulated, the served ones not.
void ExpectSameBooks(const v1::EnergyReport& served, const v1::EnergyReport& reported,
                     const std::string& what) {
  SCOPED_TRACE(what);
  int entries = 0;
  for (v1::Phase phase : {v1::PHASE_ROLLOUT, v1::PHASE_REWARD, v1::PHASE_UPDATE}) {
    const v1::EnergyEntry* s = FindEnergyEntry(served, "fpga_model", phase);
    const v1::EnergyEntry* r = FindEnergyEntry(reported, "fpga_model", phase);
    ASSERT_EQ(s == nullptr, r == nullptr) << "phase " << phase;
    if (s == nullptr) continue;
    ++entries;
    EXPECT_EQ(Bits(r->joules()), Bits(s->joules())) << r->joules() << " vs " << s->joules();
    EXPECT_EQ(Bits(r->busy_seconds()), Bits(s->busy_seconds()))
        << r->busy_seconds() << " vs " << s->busy_seconds();
    EXPECT_EQ(r->requests(), s->requests());
    EXPECT_EQ(r->emulated_requests(), r->requests());
    EXPECT_EQ(s->emulated_requests(), 0u);
  }
  EXPECT_GT(entries, 0);
}

// The sample lines of `exposition` whose name is one of `names` (and, for the
// per-source families, of source fpga_model), sorted as exposed.
std::vector<std::string> Lines(const std::string& exposition, const std::vector<std::string>& names) {
  std::vector<std::string> lines;
  std::istringstream in(exposition);
  for (std::string line; std::getline(in, line);) {
    for (const std::string& name : names) {
      if (absl::StartsWith(line, name + "{") &&
          (!absl::StrContains(line, "source=") || absl::StrContains(line, "fpga_model"))) {
        lines.push_back(line);
      }
    }
  }
  return lines;
}

class ReportWorkTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(daemon_.ok()); }
  DaemonProcess daemon_{{"--workers", "1"}};
};

// The same layer calls run by one daemon (cpu backend) and reported to another
// that has the model's layer specs only (no weights): the same books.
TEST_F(ReportWorkTest, ReportedCallsBookWhatRunningThemBooks) {
  DaemonProcess reporter({"--workers", "1"});
  ASSERT_TRUE(reporter.ok());
  const TestLayer q = MakeLayer("blocks.0.q_proj", 48, 64, true, 3);
  const TestLayer up = MakeLayer("blocks.0.up_proj", 80, 48, false, 5);
  ASSERT_TRUE(RegisterAndPublish(daemon_.channel().get(), "m", {q, up}).ok());
  ASSERT_TRUE(Register(reporter.channel().get(), "m", {q, up}).ok());  // no weights

  auto compute = v1::Compute::NewStub(daemon_.channel());
  std::vector<v1::WorkCall> calls;  // what the reporting client sends, in order
  double served_joules = 0;          // ExecutionInfo.model_joules summed in order
  uint64_t served = 0;
  auto forward = [&](v1::Phase phase, const std::string& run, const TestLayer& layer,
                     mx::Format format, int64_t m) {
    v1::LayerForwardRequest request =
        ForwardRequest("m", layer, phase, static_cast<int>(format),
                       TestValues(static_cast<size_t>(m * layer.in), 7 + served), m);
    request.set_run(run);
    grpc::ClientContext context;
    v1::LayerForwardResponse response;
    ASSERT_TRUE(compute->LayerForward(&context, request, &response).ok());
    served_joules += response.info().model_joules();
    ++served;
  };
  // `rows`: a weight_rows slice [begin, end) (grad_weight only), or the whole layer.
  auto backward = [&](v1::Phase phase, const std::string& run, const TestLayer& layer,
                      mx::Format format, int64_t m, bool with_input,
                      std::optional<std::pair<int64_t, int64_t>> rows = std::nullopt) {
    const int64_t n = rows ? rows->second - rows->first : layer.out;
    v1::LayerBackwardRequest request = BackwardRequest(
        "m", layer, phase, static_cast<int>(format),
        TestValues(static_cast<size_t>(m * layer.out), 11 + served), std::nullopt, m);
    *request.mutable_grad_output() =
        Matrix(TestValues(static_cast<size_t>(m * n), 11 + served), m, n);
    if (with_input) {
      *request.mutable_input() =
          Matrix(TestValues(static_cast<size_t>(m * layer.in), 13 + served), m, layer.in);
    }
    if (rows) {
      request.mutable_weight_rows()->set_begin(rows->first);
      request.mutable_weight_rows()->set_end(rows->second);
    }
    request.set_run(run);
    grpc::ClientContext context;
    v1::LayerBackwardResponse response;
    const grpc::Status status = compute->LayerBackward(&context, request, &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
    served_joules += response.info().model_joules();
    ++served;
  };

  // At most two calls per (run, phase): whether the daemon ran them within one
  // second of the ledger or not, the sums are the same doubles (0 + a + b).
  forward(v1::PHASE_ROLLOUT, "exp/a", q, kMxfp4, 3);
  forward(v1::PHASE_ROLLOUT, "exp/a", q, kMxfp4, 3);
  calls.push_back(Forward(v1::PHASE_ROLLOUT, "exp/a", "m", q, kMxfp4, 3, /*count=*/2));
  forward(v1::PHASE_REWARD, "exp/a", up, kMxfp8, 5);
  calls.push_back(Forward(v1::PHASE_REWARD, "exp/a", "m", up, kMxfp8, 5));
  calls.back().set_n(static_cast<uint64_t>(up.out));  // n = out_features, as 0
  forward(v1::PHASE_REWARD, "exp/a", q, kBf16, 2);
  calls.push_back(Forward(v1::PHASE_REWARD, "exp/a", "m", q, kBf16, 2));
  // Update: grad_input and grad_weight, grad_input alone, a weight_rows slice.
  backward(v1::PHASE_UPDATE, "exp/b", q, kMxfp8, 4, /*with_input=*/true);
  calls.push_back(Backward(v1::PHASE_UPDATE, "exp/b", "m", q, kMxfp8, 4, 0, true, true));
  backward(v1::PHASE_UPDATE, "exp/b", up, kMxfp8, 6, /*with_input=*/false);
  calls.push_back(
      Backward(v1::PHASE_UPDATE, "exp/b", "m", up, kMxfp8, 6, static_cast<uint64_t>(up.out), true,
               false));
  backward(v1::PHASE_UPDATE, "", q, kBf16, 4, /*with_input=*/true, std::pair<int64_t, int64_t>{8, 24});
  calls.push_back(Backward(v1::PHASE_UPDATE, "", "m", q, kBf16, 4, 16, false, true));
  forward(v1::PHASE_UPDATE, "", up, kMxfp4, 7);
  calls.push_back(Forward(v1::PHASE_UPDATE, "", "m", up, kMxfp4, 7));

  v1::ReportWorkResponse response;
  const grpc::Status status = ReportWork(reporter.channel(), calls, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response.calls(), served);
  EXPECT_EQ(Bits(response.model_joules()), Bits(served_joules))
      << response.model_joules() << " vs " << served_joules;

  // The ledger, every run together and each run alone.
  for (const std::string run : {"", "exp/a", "exp/b"}) {
    ExpectSameBooks(Report(daemon_.channel(), run), Report(reporter.channel(), run),
                    "run '" + run + "'");
  }
  // The counters the served calls moved, the same values to the last digit.
  const std::vector<std::string> families = {
      "mxserve_flops_total", "mxserve_bytes_moved_total", "mxserve_request_energy_joules_total",
      "mxserve_energy_joules_total", "mxserve_busy_seconds_total"};
  const std::string served_metrics = ScrapeMetrics(daemon_.metrics_address());
  const std::string reported_metrics = ScrapeMetrics(reporter.metrics_address());
  const std::vector<std::string> served_lines = Lines(served_metrics, families);
  EXPECT_GE(served_lines.size(), 10u);
  EXPECT_EQ(Lines(reported_metrics, families), served_lines) << reported_metrics;
  // Marked: counted as emulated calls, not as served requests, and never timed.
  EXPECT_DOUBLE_EQ(
      MetricValue(reported_metrics,
                  "mxserve_emulated_calls_total{call=\"forward\",format=\"MXFP4_E2M1\",phase="
                  "\"rollout\"}"),
      2)
      << reported_metrics;
  EXPECT_DOUBLE_EQ(
      MetricValue(reported_metrics,
                  "mxserve_emulated_calls_total{call=\"backward\",format=\"MXFP8_E4M3\",phase="
                  "\"update\"}"),
      2);
  EXPECT_EQ(MetricValue(served_metrics,
                        "mxserve_emulated_calls_total{call=\"forward\",format=\"MXFP4_E2M1\","
                        "phase=\"rollout\"}"),
            -1);
  for (const std::string& line : Lines(reported_metrics, {"mxserve_requests_total",
                                                           "mxserve_request_duration_seconds_count",
                                                           "mxserve_queue_duration_seconds_count"})) {
    EXPECT_TRUE(absl::EndsWith(line, " 0")) << line;
  }
}

// A longer sequence in one (run, phase): the order of the additions matters,
// and reported one call at a time in message order it is the daemon's own.
// Checked when the served calls fell within one second of the ledger (a sum
// split over two seconds adds in another order, in both daemons alike).
TEST_F(ReportWorkTest, ManyCallsOfOneSeriesSumInTheSameOrder) {
  DaemonProcess reporter({"--workers", "1"});
  ASSERT_TRUE(reporter.ok());
  const TestLayer layer = MakeLayer("fc", 40, 96, false, 9);
  ASSERT_TRUE(RegisterAndPublish(daemon_.channel().get(), "m", {layer}).ok());
  ASSERT_TRUE(Register(reporter.channel().get(), "m", {layer}).ok());
  auto compute = v1::Compute::NewStub(daemon_.channel());
  for (int attempt = 0; attempt < 5; ++attempt) {
    const std::string run = absl::StrCat("long/", attempt);
    std::vector<v1::WorkCall> calls;
    const double start = std::floor(UnixNow());
    // Nine calls of assorted sizes and formats, then four identical ones (reported as
    // one WorkCall with count 4: added one at a time onto what came before, which
    // is not the sum plus 4 × their joules), then another.
    for (int i = 0; i < 14; ++i) {
      const bool repeated = i >= 9 && i < 13;
      const int64_t m = repeated ? 5 : 1 + (i * 7) % 13;
      const mx::Format format =
          repeated ? kMxfp8 : (i % 3 == 0 ? kMxfp4 : (i % 3 == 1 ? kMxfp8 : kBf16));
      v1::LayerForwardRequest request =
          ForwardRequest("m", layer, v1::PHASE_ROLLOUT, static_cast<int>(format),
                         TestValues(static_cast<size_t>(m * layer.in), 3 + i), m);
      request.set_run(run);
      grpc::ClientContext context;
      v1::LayerForwardResponse response;
      ASSERT_TRUE(compute->LayerForward(&context, request, &response).ok());
      if (repeated && i > 9) {
        calls.back().set_count(calls.back().count() + 1);
      } else {
        calls.push_back(Forward(v1::PHASE_ROLLOUT, run, "m", layer, format, m));
      }
    }
    ASSERT_EQ(calls.size(), 11u);
    const bool one_second = std::floor(UnixNow()) == start;
    v1::ReportWorkResponse response;
    ASSERT_TRUE(ReportWork(reporter.channel(), calls, &response).ok());
    if (!one_second) continue;
    ExpectSameBooks(Report(daemon_.channel(), run), Report(reporter.channel(), run), run);
    return;
  }
  ADD_FAILURE() << "the served calls crossed a second in every attempt";
}

class ReportWorkRefusals : public ReportWorkTest {
 protected:
  void SetUp() override {
    ReportWorkTest::SetUp();
    // Specs only: reported work needs no published weights.
    ASSERT_TRUE(Register(daemon_.channel().get(), "m",
                         {MakeLayer("lm.q_proj", 96, 64, false, 1),
                          TestLayer{"big", 4096, 4096, false, {}, {}}})
                    .ok());
  }
  // A good call first: nothing of it may be booked when the second is refused.
  grpc::Status Refused(const v1::WorkCall& bad, v1::ReportWorkResponse* response) {
    return ReportWork(daemon_.channel(), {good_, bad}, response);
  }
  uint64_t BookedRequests() {
    const v1::EnergyReport report = Report(daemon_.channel(), "");
    uint64_t requests = 0;
    for (const auto& e : report.entries()) requests += e.requests();
    return requests;
  }
  const TestLayer q_{"lm.q_proj", 96, 64, false, {}, {}};
  const v1::WorkCall good_ = Forward(v1::PHASE_ROLLOUT, "exp/ok", "m", q_, kMxfp4, 8);
};

TEST_F(ReportWorkRefusals, EveryFieldIsCheckedAndNothingIsBooked) {
  struct Case {
    std::string label;
    std::function<void(v1::WorkCall&)> mutate;
    grpc::StatusCode code;
    std::string message;
  };
  using grpc::StatusCode;
  const auto bwd = [](v1::WorkCall& c) { c.set_call(v1::WORK_CALL_KIND_BACKWARD); };
  const std::vector<Case> cases = {
      {"phase unspecified", [](auto& c) { c.set_phase(v1::PHASE_UNSPECIFIED); },
       StatusCode::INVALID_ARGUMENT, "calls[1].phase: required"},
      {"phase unknown", [](auto& c) { c.set_phase(static_cast<v1::Phase>(7)); },
       StatusCode::INVALID_ARGUMENT, "calls[1].phase: unknown phase value 7"},
      {"run", [](auto& c) { c.set_run("a b"); }, StatusCode::INVALID_ARGUMENT, "calls[1].run: "},
      {"call unspecified", [](auto& c) { c.set_call(v1::WORK_CALL_KIND_UNSPECIFIED); },
       StatusCode::INVALID_ARGUMENT,
       "calls[1].call: expected WORK_CALL_KIND_FORWARD or WORK_CALL_KIND_BACKWARD, got "
       "unspecified"},
      {"call unknown", [](auto& c) { c.set_call(static_cast<v1::WorkCallKind>(9)); },
       StatusCode::INVALID_ARGUMENT, "calls[1].call: expected WORK_CALL_KIND_FORWARD or "
                                     "WORK_CALL_KIND_BACKWARD, got 9"},
      {"format unspecified", [](auto& c) { c.set_format(v1::FORMAT_UNSPECIFIED); },
       StatusCode::INVALID_ARGUMENT, "calls[1].format: required"},
      {"format unknown", [](auto& c) { c.set_format(static_cast<v1::Format>(42)); },
       StatusCode::INVALID_ARGUMENT, "calls[1].format: unknown format value 42"},
      {"model", [](auto& c) { c.set_model("nope"); }, StatusCode::NOT_FOUND,
       "calls[1].model: no model named 'nope'"},
      {"layer", [](auto& c) { c.set_layer("nope"); }, StatusCode::NOT_FOUND,
       "calls[1].layer: model 'm' has no layer 'nope'"},
      {"m zero", [](auto& c) { c.set_m(0); }, StatusCode::INVALID_ARGUMENT,
       "calls[1].m: expected 1 to 4294967296 (rows of X, or of grad_output), got 0"},
      {"m too many", [](auto& c) { c.set_m((uint64_t{1} << 32) + 1); },
       StatusCode::INVALID_ARGUMENT, "calls[1].m: expected 1 to 4294967296"},
      {"macs", [](auto& c) {
         c.set_layer("big");
         c.set_m(uint64_t{1} << 32);
       },
       StatusCode::INVALID_ARGUMENT,
       "calls[1].m: m × n × in_features = 4294967296 × 4096 × 4096 of layer 'big' is over "
       "9007199254740992 multiply-accumulates"},
      {"forward n", [](auto& c) { c.set_n(5); }, StatusCode::INVALID_ARGUMENT,
       "calls[1].n: expected 0 or 96 (out_features of layer 'lm.q_proj') for a forward call, "
       "got 5"},
      {"backward n", [&](auto& c) {
         bwd(c);
         c.set_grad_weight(true);
         c.set_n(97);
       },
       StatusCode::INVALID_ARGUMENT,
       "calls[1].n: expected 0 or 1 to 96 (out_features of layer 'lm.q_proj', or the width of a "
       "weight_rows slice) for a backward call, got 97"},
      {"backward slice with grad_input", [&](auto& c) {
         bwd(c);
         c.set_grad_input(true);
         c.set_grad_weight(true);
         c.set_n(16);
       },
       StatusCode::INVALID_ARGUMENT,
       "calls[1].n: expected 0 or 96 (out_features of layer 'lm.q_proj') for a backward call "
       "with grad_input"},
      {"forward grad_input", [](auto& c) { c.set_grad_input(true); },
       StatusCode::INVALID_ARGUMENT, "calls[1].grad_input: expected false for a forward call"},
      {"forward grad_weight", [](auto& c) { c.set_grad_weight(true); },
       StatusCode::INVALID_ARGUMENT, "calls[1].grad_weight: expected false for a forward call"},
      {"backward no gradient", bwd, StatusCode::INVALID_ARGUMENT,
       "calls[1].grad_weight: a backward call runs grad_input, grad_weight or both; got neither"},
      {"count zero", [](auto& c) { c.set_count(0); }, StatusCode::INVALID_ARGUMENT,
       "calls[1].count: expected 1 to 1048576, got 0"},
      {"count too many", [](auto& c) { c.set_count((1 << 20) + 1); },
       StatusCode::INVALID_ARGUMENT, "calls[1].count: expected 1 to 1048576, got 1048577"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.label);
    v1::WorkCall bad = good_;
    c.mutate(bad);
    v1::ReportWorkResponse response;
    const grpc::Status status = Refused(bad, &response);
    EXPECT_EQ(status.error_code(), c.code) << status.error_message();
    EXPECT_TRUE(absl::StartsWith(status.error_message(), c.message)) << status.error_message();
  }
  EXPECT_EQ(BookedRequests(), 0u);
  // The message as a whole: no calls, too many, counts over the bound, not a message.
  v1::ReportWorkResponse response;
  EXPECT_STATUS(ReportWork(daemon_.channel(), {}, &response), INVALID_ARGUMENT,
                "calls: expected 1 to 65536 calls per message, got 0");
  EXPECT_STATUS(ReportWork(daemon_.channel(), std::vector<v1::WorkCall>(65537, good_), &response),
                INVALID_ARGUMENT, "calls: expected 1 to 65536 calls per message, got 65537");
  v1::WorkCall full = good_;
  full.set_count(1 << 20);
  EXPECT_STATUS(ReportWork(daemon_.channel(), std::vector<v1::WorkCall>(5, full), &response),
                INVALID_ARGUMENT,
                "calls[4].count: the counts of calls[0..4] add up to more than 4194304");
  const RawResult garbage = RawCall(daemon_.channel(), "/mxserve.v1.Telemetry/ReportWork",
                                    {std::string("\xff\xff", 2)});
  EXPECT_STATUS(garbage.status, INVALID_ARGUMENT,
                "request: not a valid mxserve.v1.ReportWorkRequest message");
  EXPECT_EQ(BookedRequests(), 0u);

  // The daemon keeps serving: the most one message books, then the good call.
  ASSERT_TRUE(ReportWork(daemon_.channel(), std::vector<v1::WorkCall>(4, full), &response).ok());
  EXPECT_EQ(response.calls(), uint64_t{1} << 22);
  ASSERT_TRUE(ReportWork(daemon_.channel(), {good_}, &response).ok());
  EXPECT_EQ(response.calls(), 1u);
  EXPECT_EQ(BookedRequests(), (uint64_t{1} << 22) + 1);
  const v1::EnergyReport ok = Report(daemon_.channel(), "exp/ok");
  const v1::EnergyEntry* e = FindEnergyEntry(ok, "fpga_model", v1::PHASE_ROLLOUT);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->emulated_requests(), (uint64_t{1} << 22) + 1);
  EXPECT_EQ(AwaitMetric(daemon_.metrics_address(),
                        "mxserve_rpc_completed_total{code=\"INVALID_ARGUMENT\",rpc=\"ReportWork\"}",
                        static_cast<double>(cases.size()) - 2 + 4),
            static_cast<double>(cases.size()) - 2 + 4);
}

// The role of LayerForward (compute); without credentials nothing is booked.
TEST(ReportWorkAuth, NeedsTheComputeRole) {
  const std::string path = absl::StrCat(::testing::TempDir(), "report_work_tokens_", getpid());
  std::ofstream(path) << "tok-train train-user train\ntok-compute compute-user compute\n";
  DaemonProcess daemon({"--auth-tokens", path, "--workers", "1"});
  ASSERT_TRUE(daemon.ok());
  const TestLayer layer{"fc", 16, 32, false, {}, {}};
  ASSERT_TRUE(Register(daemon.channel().get(), "m", {layer}, "", "tok-train").ok());
  const std::vector<v1::WorkCall> calls = {
      Forward(v1::PHASE_ROLLOUT, "", "m", layer, kMxfp8, 4, 3)};
  v1::ReportWorkResponse response;
  EXPECT_STATUS(ReportWork(daemon.channel(), calls, &response), UNAUTHENTICATED, "no credentials");
  EXPECT_STATUS(ReportWork(daemon.channel(), calls, &response, "tok-wrong"), UNAUTHENTICATED,
                "not one of --auth-tokens");
  grpc::ClientContext context;
  Authorize(context, "tok-compute");
  v1::EnergyReport report;
  ASSERT_TRUE(v1::Telemetry::NewStub(daemon.channel())
                  ->GetEnergyReport(&context, v1::GetEnergyReportRequest(), &report)
                  .ok());
  EXPECT_EQ(FindEnergyEntry(report, "fpga_model", v1::PHASE_ROLLOUT), nullptr);
  // compute (LayerForward's role) and above may.
  for (const char* token : {"tok-compute", "tok-train"}) {
    const grpc::Status status = ReportWork(daemon.channel(), calls, &response, token);
    EXPECT_TRUE(status.ok()) << token << ": " << status.error_message();
    EXPECT_EQ(response.calls(), 3u);
  }
  EXPECT_EQ(mxserve::RuleOf(mxserve::Rpc::kReportWork).role,
            mxserve::RuleOf(mxserve::Rpc::kLayerForward).role);
  std::remove(path.c_str());
}

}  // namespace
}  // namespace mx_test
