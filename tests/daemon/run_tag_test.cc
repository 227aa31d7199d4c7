// Run tags through the real daemon: compute requests and power samples carry a
// run, and Telemetry.GetEnergyReport with `run` reads that run alone while the
// report without one stays the sum of everything. Each request is booked under
// its own run, also when it shares a fused GEMM with other runs' requests; past
// --max-energy-runs the least recently accounted run folds into the untagged
// energy, and the totals do not move. The metrics never get a run label.
#include <cmath>
#include <map>

#include "tests/daemon/api_util.h"
#include "tests/daemon/daemon_process.h"

namespace mx_test {
namespace {

v1::EnergyReport Report(const DaemonProcess& daemon, const std::string& run, double since = 0) {
  v1::GetEnergyReportRequest request;
  request.set_run(run);
  request.set_since_seconds(since);
  grpc::ClientContext context;
  v1::EnergyReport report;
  const grpc::Status s =
      v1::Telemetry::NewStub(daemon.channel())->GetEnergyReport(&context, request, &report);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return report;
}

// (source, phase) → entry, for comparing reports entry by entry.
std::map<std::pair<std::string, int>, v1::EnergyEntry> Entries(const v1::EnergyReport& report) {
  std::map<std::pair<std::string, int>, v1::EnergyEntry> entries;
  for (const v1::EnergyEntry& e : report.entries()) entries[{e.source(), e.phase()}] = e;
  return entries;
}

// The energy of some requests as their ExecutionInfos give it.
struct Sum {
  double joules = 0;
  double seconds = 0;
  void Add(const v1::ExecutionInfo& info) {
    joules += info.model_joules();
    seconds += info.model_seconds();
  }
};

// A run's report holds exactly one fpga_model entry: `phase`, `requests`, and
// the energy those requests' ExecutionInfos gave.
void ExpectOnlyModelEntry(const v1::EnergyReport& report, v1::Phase phase, uint64_t requests,
                          const Sum& sent) {
  ASSERT_EQ(report.entries_size(), 1) << report.DebugString();
  EXPECT_EQ(report.entries(0).source(), "fpga_model");
  EXPECT_EQ(report.entries(0).phase(), phase);
  EXPECT_EQ(report.entries(0).requests(), requests);
  EXPECT_TRUE(NearlyEqual(report.entries(0).joules(), sent.joules));
  EXPECT_TRUE(NearlyEqual(report.entries(0).busy_seconds(), sent.seconds));
}

class RunTagTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(daemon_.ok());
    ASSERT_TRUE(RegisterAndPublish(daemon_.channel().get(), "m", {layer_}).ok());
  }

  // One LayerForward of `rows` rows under `run` in `phase`; returns its
  // ExecutionInfo.
  v1::ExecutionInfo Forward(const std::string& run, v1::Phase phase, int64_t rows, uint32_t seed) {
    v1::LayerForwardRequest request =
        ForwardRequest("m", layer_, phase, static_cast<int>(mx::Format::kMxfp8E4m3),
                       TestValues(rows * layer_.in, seed), rows);
    request.set_run(run);
    grpc::ClientContext context;
    v1::LayerForwardResponse response;
    const grpc::Status s =
        v1::Compute::NewStub(daemon_.channel())->LayerForward(&context, request, &response);
    EXPECT_TRUE(s.ok()) << s.error_message();
    EXPECT_GT(response.info().model_joules(), 0);
    return response.info();
  }

  const TestLayer layer_ = MakeLayer("model.layers.2.mlp.up_proj", 48, 64, true, 110);
  DaemonProcess daemon_{{"--workers", "2"}};
};

TEST_F(RunTagTest, EachRunsReportHoldsItsOwnRequestsAndTheTotalIsTheirSum) {
  // Interleaved: a (rollout) ×3, b (update) ×2, one untagged (rollout).
  Sum a_sent, b_sent, untagged_sent;
  a_sent.Add(Forward("a", v1::PHASE_ROLLOUT, 3, 1));
  b_sent.Add(Forward("b", v1::PHASE_UPDATE, 5, 2));
  untagged_sent.Add(Forward("", v1::PHASE_ROLLOUT, 2, 3));
  a_sent.Add(Forward("a", v1::PHASE_ROLLOUT, 1, 4));
  b_sent.Add(Forward("b", v1::PHASE_UPDATE, 4, 5));
  a_sent.Add(Forward("a", v1::PHASE_ROLLOUT, 7, 6));

  const v1::EnergyReport a = Report(daemon_, "a");
  EXPECT_EQ(a.run(), "a");  // the filter, echoed
  ExpectOnlyModelEntry(a, v1::PHASE_ROLLOUT, 3, a_sent);

  const v1::EnergyReport b = Report(daemon_, "b");
  EXPECT_EQ(b.run(), "b");
  ExpectOnlyModelEntry(b, v1::PHASE_UPDATE, 2, b_sent);

  // Every run together: a + b + the untagged forward, per (source, phase).
  const v1::EnergyReport all = Report(daemon_, "");
  EXPECT_EQ(all.run(), "");
  const v1::EnergyEntry* rollout = FindEnergyEntry(all, "fpga_model", v1::PHASE_ROLLOUT);
  const v1::EnergyEntry* update = FindEnergyEntry(all, "fpga_model", v1::PHASE_UPDATE);
  ASSERT_NE(rollout, nullptr);
  ASSERT_NE(update, nullptr);
  EXPECT_EQ(all.entries_size(), 2);
  EXPECT_EQ(rollout->requests(), 4u);
  EXPECT_TRUE(NearlyEqual(rollout->joules(), a_sent.joules + untagged_sent.joules));
  EXPECT_TRUE(NearlyEqual(rollout->busy_seconds(), a_sent.seconds + untagged_sent.seconds));
  EXPECT_EQ(update->requests(), 2u);
  EXPECT_EQ(update->joules(), b.entries(0).joules());
  EXPECT_EQ(update->busy_seconds(), b.entries(0).busy_seconds());

  // A run nobody used: no entries at all, but a valid answer.
  const v1::EnergyReport unknown = Report(daemon_, "never-used");
  EXPECT_EQ(unknown.run(), "never-used");
  EXPECT_EQ(unknown.entries_size(), 0);
  EXPECT_GT(unknown.until_seconds(), 0);

  // `since` applies within a run: after everything, a's entry is there with zeros.
  const v1::EnergyReport later = Report(daemon_, "a", UnixNow() + 3600);
  ASSERT_EQ(later.entries_size(), 1);
  EXPECT_EQ(later.entries(0).joules(), 0);
  EXPECT_EQ(later.entries(0).requests(), 0u);

  // The metrics keep their labels: no run label, no series per tag.
  const std::string m = ScrapeMetrics(daemon_.metrics_address());
  ASSERT_FALSE(m.empty());
  EXPECT_EQ(m.find("run="), std::string::npos);
  EXPECT_TRUE(NearlyEqual(
      MetricValue(m, "mxserve_energy_joules_total{phase=\"rollout\",source=\"fpga_model\"}"),
      a_sent.joules + untagged_sent.joules));
}

TEST_F(RunTagTest, PowerSamplesLandInTheirOwnRun) {
  Forward("a", v1::PHASE_ROLLOUT, 2, 7);  // a has compute energy too
  const double t0 = std::floor(UnixNow()) - 30;
  // gpu0 for run a: 100 W → 300 W over 1 s (rollout) = 200 J; then 300 W flat
  // for 0.5 s under run b (update) = 150 J; then 0.25 s of 300 W → 100 W
  // untagged (reward) = 50 J.
  struct S {
    const char* run;
    v1::Phase phase;
    double t, watts;
  } samples[] = {{"a", v1::PHASE_ROLLOUT, t0, 100},
                 {"a", v1::PHASE_ROLLOUT, t0 + 1, 300},
                 {"b", v1::PHASE_UPDATE, t0 + 1.5, 300},
                 {"", v1::PHASE_REWARD, t0 + 1.75, 100}};
  grpc::ClientContext context;
  v1::ReportPowerResponse response;
  auto writer = v1::Telemetry::NewStub(daemon_.channel())->ReportPower(&context, &response);
  for (const S& s : samples) {
    v1::PowerSample sample;
    sample.set_source("gpu_baseline");
    sample.set_device("cuda:0");
    sample.set_run(s.run);
    sample.set_phase(s.phase);
    sample.set_timestamp_seconds(s.t);
    sample.set_watts(s.watts);
    ASSERT_TRUE(writer->Write(sample));
  }
  writer->WritesDone();
  const grpc::Status finished = writer->Finish();
  ASSERT_TRUE(finished.ok()) << finished.error_message();
  EXPECT_EQ(response.samples_accepted(), 4u);
  EXPECT_DOUBLE_EQ(response.joules_added(), 400);

  const v1::EnergyReport a = Report(daemon_, "a");
  const v1::EnergyEntry* a_gpu = FindEnergyEntry(a, "gpu_baseline", v1::PHASE_ROLLOUT);
  ASSERT_NE(a_gpu, nullptr) << a.DebugString();
  EXPECT_EQ(a_gpu->joules(), 200);
  EXPECT_EQ(a_gpu->busy_seconds(), 1);
  EXPECT_EQ(a.entries_size(), 2);  // and its forward's fpga_model entry
  EXPECT_NE(FindEnergyEntry(a, "fpga_model", v1::PHASE_ROLLOUT), nullptr);

  const v1::EnergyReport b = Report(daemon_, "b");
  ASSERT_EQ(b.entries_size(), 1) << b.DebugString();
  EXPECT_EQ(b.entries(0).source(), "gpu_baseline");
  EXPECT_EQ(b.entries(0).phase(), v1::PHASE_UPDATE);
  EXPECT_EQ(b.entries(0).joules(), 150);

  const v1::EnergyReport all = Report(daemon_, "");
  const v1::EnergyEntry* reward = FindEnergyEntry(all, "gpu_baseline", v1::PHASE_REWARD);
  ASSERT_NE(reward, nullptr);
  EXPECT_EQ(reward->joules(), 50);  // the untagged trapezoid is in the total only
  EXPECT_EQ(FindEnergyEntry(all, "gpu_baseline", v1::PHASE_ROLLOUT)->joules(), 200);
  EXPECT_EQ(FindEnergyEntry(all, "gpu_baseline", v1::PHASE_UPDATE)->joules(), 150);
}

// Three forwards of three runs (one untagged) fused into one GEMM: each is booked
// under its own run with its own estimate, as the unbatched ones are.
TEST(RunTagBatchTest, AFusedBatchBooksEachRequestUnderItsOwnRun) {
  constexpr int kRequests = 3;
  DaemonProcess daemon({"--workers", "1", "--batch-window-us", "10000000", "--max-batch",
                        std::to_string(kRequests)});
  ASSERT_TRUE(daemon.ok());
  const TestLayer layer = MakeLayer("model.layers.4.self_attn.o_proj", 40, 64, false, 111);
  ASSERT_TRUE(RegisterAndPublish(daemon.channel().get(), "m", {layer}).ok());
  const char* runs[kRequests] = {"a", "b", ""};
  const int64_t rows[kRequests] = {1, 3, 2};
  std::vector<v1::LayerForwardRequest> requests;
  for (int i = 0; i < kRequests; ++i) {
    requests.push_back(ForwardRequest("m", layer, v1::PHASE_REWARD,
                                      static_cast<int>(mx::Format::kMxfp4E2m1),
                                      TestValues(rows[i] * layer.in, 112 + i), rows[i]));
    requests.back().set_run(runs[i]);
  }
  const std::vector<ForwardResult> results = ForwardAllAtOnce(daemon.channel(), requests);
  double total = 0;
  for (int i = 0; i < kRequests; ++i) {
    ASSERT_TRUE(results[i].status.ok()) << results[i].status.error_message();
    EXPECT_EQ(results[i].response.info().batch_size(), static_cast<uint32_t>(kRequests));
    total += results[i].response.info().model_joules();
  }
  for (int i = 0; i < 2; ++i) {
    SCOPED_TRACE(runs[i]);
    const v1::EnergyReport report = Report(daemon, runs[i]);
    ASSERT_EQ(report.entries_size(), 1) << report.DebugString();
    EXPECT_EQ(report.entries(0).requests(), 1u);
    EXPECT_EQ(report.entries(0).joules(), results[i].response.info().model_joules());
    EXPECT_EQ(report.entries(0).busy_seconds(), results[i].response.info().model_seconds());
  }
  // The report must outlive the entry pointer FindEnergyEntry returns into it.
  const v1::EnergyReport all = Report(daemon, "");
  const v1::EnergyEntry* reward = FindEnergyEntry(all, "fpga_model", v1::PHASE_REWARD);
  ASSERT_NE(reward, nullptr);
  EXPECT_EQ(reward->requests(), 3u);
  EXPECT_TRUE(NearlyEqual(reward->joules(), total));
}

// --max-energy-runs 2: a third run folds the least recently accounted one into
// the untagged energy. Its own report empties; the all-runs report does not move.
TEST(RunTagLimitTest, PastMaxEnergyRunsTheLeastRecentRunFoldsAndTotalsStay) {
  DaemonProcess daemon({"--workers", "1", "--max-energy-runs", "2"});
  ASSERT_TRUE(daemon.ok());
  auto gemm = [&](const std::string& run) {
    v1::GemmRequest request =
        GemmRequest(v1::PHASE_ROLLOUT, v1::FORMAT_MXFP8_E4M3, TestValues(4 * 64, 120),
                    TestValues(64 * 8, 121), 4, 64, 8);
    request.set_run(run);
    grpc::ClientContext context;
    v1::GemmResponse response;
    const grpc::Status s =
        v1::Compute::NewStub(daemon.channel())->Gemm(&context, request, &response);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return response.info().model_joules();
  };
  const double one = gemm("first");  // every call below is the same GEMM: the same joules
  gemm("second");
  gemm("first");  // first is now the most recent; second the least
  const v1::EnergyReport before = Report(daemon, "");
  ASSERT_EQ(Report(daemon, "second").entries_size(), 1);

  gemm("third");  // past 2 runs: "second" folds into the untagged energy
  EXPECT_EQ(Report(daemon, "second").entries_size(), 0);
  const v1::EnergyReport first = Report(daemon, "first");
  ASSERT_EQ(first.entries_size(), 1);
  EXPECT_EQ(first.entries(0).requests(), 2u);
  EXPECT_TRUE(NearlyEqual(first.entries(0).joules(), 2 * one));
  const v1::EnergyReport third = Report(daemon, "third");
  ASSERT_EQ(third.entries_size(), 1);
  EXPECT_EQ(third.entries(0).requests(), 1u);

  const auto all = Entries(Report(daemon, ""));
  const auto was = Entries(before);
  ASSERT_EQ(all.size(), 1u);
  ASSERT_EQ(was.size(), 1u);
  const v1::EnergyEntry& now = all.begin()->second;
  EXPECT_EQ(now.requests(), 4u);
  EXPECT_TRUE(NearlyEqual(now.joules(), was.begin()->second.joules() + one));
}

}  // namespace
}  // namespace mx_test
