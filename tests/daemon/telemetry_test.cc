// Metrics scraped over HTTP and energy accounting: request counts per phase and
// format equal what was sent; power samples integrate by the trapezoid rule into
// the phase of the later sample; the FPGA model's energy adds up per phase.
#include <cmath>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "fpga/model/energy_model.h"
#include "tests/daemon/api_util.h"
#include "tests/daemon/daemon_process.h"

namespace mx_test {
namespace {

class TelemetryTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(daemon_.ok()); }
  DaemonProcess daemon_{{"--workers", "2"}};
};

TEST_F(TelemetryTest, RequestCountsAndModelEnergyPerPhaseAndFormat) {
  // Before any request the model's energy series are there, at zero, so that
  // Prometheus' increase() over a range counts the first request's joules too.
  const std::string before = ScrapeMetrics(daemon_.metrics_address());
  for (const char* phase : {"rollout", "reward", "update"}) {
    EXPECT_EQ(MetricValue(before, absl::StrCat("mxserve_energy_joules_total{phase=\"", phase,
                                               "\",source=\"fpga_model\"}")),
              0)
        << before;
  }
  // Block 3 of 0..9 is neither first nor last: a tolerant layer for policy D.
  const TestLayer first = MakeLayer("model.layers.0.mlp.gate_proj", 64, 128, false, 80);
  const TestLayer layer = MakeLayer("model.layers.3.mlp.gate_proj", 64, 128, false, 81);
  const TestLayer last = MakeLayer("model.layers.9.mlp.gate_proj", 64, 128, false, 82);
  ASSERT_TRUE(RegisterAndPublish(daemon_.channel().get(), "m", {first, layer, last}).ok());
  auto stub = v1::Compute::NewStub(daemon_.channel());
  const auto x = TestValues(4 * 128, 82);
  struct Sent {
    v1::Phase phase;
    v1::Format format;
    int count;
  } plan[] = {{v1::PHASE_ROLLOUT, v1::FORMAT_MXFP4_E2M1, 5},
              {v1::PHASE_ROLLOUT, v1::FORMAT_UNSPECIFIED, 2},  // D: MXFP4 on this layer
              {v1::PHASE_REWARD, v1::FORMAT_MXFP8_E4M3, 3},
              {v1::PHASE_UPDATE, v1::FORMAT_FP16, 1}};
  double model_joules[4] = {0, 0, 0, 0};
  for (const auto& p : plan) {
    for (int i = 0; i < p.count; ++i) {
      v1::LayerForwardRequest r;
      r.set_model("m");
      r.set_layer(layer.name);
      r.set_phase(p.phase);
      r.set_format(p.format);
      *r.mutable_input()->mutable_tensor() = Matrix(x, 4, 128);
      grpc::ClientContext context;
      v1::LayerForwardResponse response;
      ASSERT_TRUE(stub->LayerForward(&context, r, &response).ok());
      model_joules[p.phase] += response.info().model_joules();
    }
  }
  const std::string m = ScrapeMetrics(daemon_.metrics_address());
  ASSERT_FALSE(m.empty());
  auto requests = [&](const char* format, const char* phase) {
    return MetricValue(m, std::string("mxserve_requests_total{backend=\"cpu\",format=\"") + format +
                              "\",phase=\"" + phase + "\",rpc=\"LayerForward\"}");
  };
  EXPECT_EQ(requests("MXFP4_E2M1", "rollout"), 7) << m;
  EXPECT_EQ(requests("MXFP8_E4M3", "reward"), 3);
  EXPECT_EQ(requests("FP16", "update"), 1);
  EXPECT_EQ(requests("MXFP8_E4M3", "rollout"), -1);  // never sent: no series
  EXPECT_EQ(
      MetricValue(m,
                  "mxserve_request_duration_seconds_count{backend=\"cpu\",format=\"MXFP4_E2M1\","
                  "phase=\"rollout\",rpc=\"LayerForward\"}"),
      7);
  EXPECT_EQ(MetricValue(m, "mxserve_flops_total{format=\"MXFP8_E4M3\",phase=\"reward\"}"),
            3 * 2.0 * 4 * 64 * 128);
  EXPECT_EQ(AwaitMetric(daemon_.metrics_address(),
                        "mxserve_rpc_completed_total{code=\"OK\",rpc=\"LayerForward\"}", 11),
            11);
  EXPECT_EQ(MetricValue(m, "mxserve_models"), 1);
  EXPECT_GT(MetricValue(m, "mxserve_weight_bytes"), 64 * 128 * 4);
  EXPECT_NEAR(
      MetricValue(m, "mxserve_energy_joules_total{phase=\"rollout\",source=\"fpga_model\"}"),
      model_joules[v1::PHASE_ROLLOUT], 1e-12);
  // The same energy by the weight's format: rollout's all went to MXFP4.
  EXPECT_NEAR(MetricValue(m,
                          "mxserve_request_energy_joules_total{format=\"MXFP4_E2M1\","
                          "phase=\"rollout\",source=\"fpga_model\"}"),
              model_joules[v1::PHASE_ROLLOUT], 1e-12);
  EXPECT_NEAR(MetricValue(m,
                          "mxserve_request_energy_joules_total{format=\"FP16\","
                          "phase=\"update\",source=\"fpga_model\"}"),
              model_joules[v1::PHASE_UPDATE], 1e-12);
  EXPECT_NE(m.find("mxserve_build_info{backend=\"cpu\",version=\""), std::string::npos);

  auto telemetry = v1::Telemetry::NewStub(daemon_.channel());
  grpc::ClientContext context;
  v1::EnergyReport report;
  ASSERT_TRUE(telemetry->GetEnergyReport(&context, {}, &report).ok());
  const v1::EnergyEntry* reward = FindEnergyEntry(report, "fpga_model", v1::PHASE_REWARD);
  ASSERT_NE(reward, nullptr);
  EXPECT_EQ(reward->requests(), 3u);
  EXPECT_NEAR(reward->joules(), model_joules[v1::PHASE_REWARD], 1e-12);
  EXPECT_GT(reward->busy_seconds(), 0);
}

// LayerBackward with its input runs two GEMMs (grad_input and grad_weight); it
// booked 0 J when the two estimates were summed positionally into a struct that
// had gained a field. ExecutionInfo, the ledger and the metric must all equal the
// FPGA model's estimate of both.
TEST_F(TelemetryTest, BackwardWithInputBooksBothGemmsEnergy) {
  const TestLayer layer = MakeLayer("model.layers.3.mlp.down_proj", 48, 96, true, 83);
  ASSERT_TRUE(RegisterAndPublish(daemon_.channel().get(), "bw", {layer}).ok());
  const int64_t m = 5, n = layer.out, k = layer.in;
  v1::LayerBackwardRequest r;
  r.set_model("bw");
  r.set_layer(layer.name);
  r.set_phase(v1::PHASE_UPDATE);
  r.set_format(v1::FORMAT_MXFP8_E4M3);
  *r.mutable_grad_output() = Matrix(TestValues(m * n, 84), m, n);
  *r.mutable_input() = Matrix(TestValues(m * k, 85), m, k);
  grpc::ClientContext context;
  v1::LayerBackwardResponse response;
  ASSERT_TRUE(v1::Compute::NewStub(daemon_.channel())->LayerBackward(&context, r, &response).ok());
  const auto params = fpga_model::LoadEnergyModel(std::string(MXSERVE_SOURCE_DIR) +
                                                  "/fpga/model/energy_model.json");
  ASSERT_TRUE(params.ok()) << params.status();
  const auto f = mx::Format::kMxfp8E4m3;
  const auto grad_input = fpga_model::EstimateGemm(*params, f, f, m, k, n);
  const auto grad_weight = fpga_model::EstimateGemm(*params, f, f, n, k, m);
  const double joules = grad_input.joules + grad_weight.joules;
  const double seconds = grad_input.seconds + grad_weight.seconds;
  ASSERT_GT(joules, 0);
  EXPECT_DOUBLE_EQ(response.info().model_joules(), joules);
  EXPECT_DOUBLE_EQ(response.info().model_seconds(), seconds);
  grpc::ClientContext c2;
  v1::EnergyReport report;
  ASSERT_TRUE(v1::Telemetry::NewStub(daemon_.channel())->GetEnergyReport(&c2, {}, &report).ok());
  const v1::EnergyEntry* update = FindEnergyEntry(report, "fpga_model", v1::PHASE_UPDATE);
  ASSERT_NE(update, nullptr);
  EXPECT_DOUBLE_EQ(update->joules(), joules);
  EXPECT_DOUBLE_EQ(update->busy_seconds(), seconds);
  const std::string metrics = ScrapeMetrics(daemon_.metrics_address());
  EXPECT_DOUBLE_EQ(
      MetricValue(metrics, "mxserve_bytes_moved_total{format=\"MXFP8_E4M3\",phase=\"update\"}"),
      grad_input.bytes + grad_weight.bytes);
}

TEST_F(TelemetryTest, PowerSamplesIntegrateIntoEnergyPerSourceAndPhase) {
  auto telemetry = v1::Telemetry::NewStub(daemon_.channel());
  grpc::ClientContext context;
  v1::ReportPowerResponse response;
  auto writer = telemetry->ReportPower(&context, &response);
  // Recent (samples must be near the daemon's clock), and the report below
  // starts just before it.
  const double t0 = std::floor(UnixNow()) - 30;
  // cuda:0: 100 W → 200 W over 1 s (rollout) = 150 J, then 200 W → 200 W over 0.5 s
  // (update) = 100 J. cuda:1 independently: 50 W flat for 2 s (rollout) = 100 J.
  struct S {
    const char* device;
    v1::Phase phase;
    double t, w;
  } samples[] = {{"cuda:0", v1::PHASE_ROLLOUT, t0, 100},
                 {"cuda:1", v1::PHASE_ROLLOUT, t0, 50},
                 {"cuda:0", v1::PHASE_ROLLOUT, t0 + 1, 200},
                 {"cuda:0", v1::PHASE_UPDATE, t0 + 1.5, 200},
                 {"cuda:1", v1::PHASE_ROLLOUT, t0 + 2, 50}};
  for (const auto& s : samples) {
    v1::PowerSample sample;
    sample.set_source("gpu_baseline");
    sample.set_device(s.device);
    sample.set_phase(s.phase);
    sample.set_timestamp_seconds(s.t);
    sample.set_watts(s.w);
    ASSERT_TRUE(writer->Write(sample));
  }
  writer->WritesDone();
  ASSERT_TRUE(writer->Finish().ok());
  EXPECT_EQ(response.samples_accepted(), 5u);
  EXPECT_DOUBLE_EQ(response.joules_added(), 350);

  grpc::ClientContext c2;
  v1::GetEnergyReportRequest since;
  since.set_since_seconds(t0 - 10);
  v1::EnergyReport report;
  ASSERT_TRUE(telemetry->GetEnergyReport(&c2, since, &report).ok());
  const v1::EnergyEntry* rollout = FindEnergyEntry(report, "gpu_baseline", v1::PHASE_ROLLOUT);
  const v1::EnergyEntry* update = FindEnergyEntry(report, "gpu_baseline", v1::PHASE_UPDATE);
  ASSERT_NE(rollout, nullptr);
  ASSERT_NE(update, nullptr);
  EXPECT_DOUBLE_EQ(rollout->joules(), 250);
  EXPECT_DOUBLE_EQ(rollout->busy_seconds(), 3);
  EXPECT_DOUBLE_EQ(update->joules(), 100);
  EXPECT_DOUBLE_EQ(update->busy_seconds(), 0.5);
  // A start after the samples sees none of them.
  grpc::ClientContext c3;
  since.set_since_seconds(t0 + 100);
  ASSERT_TRUE(telemetry->GetEnergyReport(&c3, since, &report).ok());
  for (const auto& e : report.entries()) EXPECT_EQ(e.joules(), 0) << e.source();

  const std::string m = ScrapeMetrics(daemon_.metrics_address());
  EXPECT_EQ(
      MetricValue(m, "mxserve_energy_joules_total{phase=\"rollout\",source=\"gpu_baseline\"}"),
      250);
  EXPECT_EQ(MetricValue(m, "mxserve_power_watts{device=\"cuda:1\",source=\"gpu_baseline\"}"), 50);
  // A phase the source never reported is there too, at zero.
  EXPECT_EQ(MetricValue(m, "mxserve_energy_joules_total{phase=\"reward\",source=\"gpu_baseline\"}"),
            0);
}

// The unauthenticated /metrics listener names no model, layer or run tag
// (server/README, TLS): its labels are only these keys, whatever was served.
TEST_F(TelemetryTest, MetricsNameNoModelLayerOrRunTag) {
  const TestLayer layer = MakeLayer("tenant_secret_layer", 32, 64, false, 90);
  ASSERT_TRUE(RegisterAndPublish(daemon_.channel().get(), "tenant-secret-model", {layer}).ok());
  v1::LayerForwardRequest request =
      ForwardRequest("tenant-secret-model", layer, v1::PHASE_ROLLOUT,
                     static_cast<int>(mx::Format::kMxfp8E4m3), TestValues(2 * 64, 91), 2);
  request.set_run("tenant-secret-run");
  grpc::ClientContext context;
  v1::LayerForwardResponse response;
  ASSERT_TRUE(
      v1::Compute::NewStub(daemon_.channel())->LayerForward(&context, request, &response).ok());
  ASSERT_EQ(AwaitMetric(daemon_.metrics_address(),
                        "mxserve_rpc_completed_total{code=\"OK\",rpc=\"LayerForward\"}", 1),
            1);

  const std::string metrics = ScrapeMetrics(daemon_.metrics_address());
  for (const char* name : {"tenant-secret-model", "tenant_secret_layer", "tenant-secret-run"}) {
    EXPECT_EQ(metrics.find(name), std::string::npos) << name << " in:\n" << metrics;
  }
  const std::set<std::string> allowed = {"rpc",     "phase",  "format",   "backend",
                                         "code",    "source", "device",   "call",
                                         "version", "le",     "quantile", "reason"};
  std::set<std::string> keys;
  for (absl::string_view line : absl::StrSplit(metrics, '\n')) {
    if (line.empty() || line[0] == '#') continue;
    const size_t open = line.find('{'), close = line.find('}');
    if (open == absl::string_view::npos || close == absl::string_view::npos) continue;
    for (absl::string_view label :
         absl::StrSplit(line.substr(open + 1, close - open - 1), ',', absl::SkipEmpty())) {
      keys.insert(std::string(label.substr(0, label.find('='))));
    }
  }
  EXPECT_TRUE(keys.count("rpc") && keys.count("format")) << metrics;  // the parse found labels
  for (const std::string& key : keys) EXPECT_TRUE(allowed.count(key)) << "label " << key;
}

}  // namespace
}  // namespace mx_test
