// Telemetry.ReportEnergy against a real daemon over loopback: measured intervals
// book their joules as they are (no integration) into the ledger and the
// Prometheus energy counters, per source, phase and run; hostile intervals end
// the stream with INVALID_ARGUMENT naming the field and the expected value, the
// series cap and --power-sources hold as for ReportPower, and what came before
// a refused interval stays booked.
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "tests/daemon/api_util.h"
#include "tests/daemon/daemon_process.h"
#include "tests/daemon/raw_call.h"

namespace mx_test {
namespace {

v1::EnergyInterval Interval(const std::string& source, const std::string& device, v1::Phase phase,
                            double start, double end, double joules, const std::string& run = "") {
  v1::EnergyInterval i;
  i.set_source(source);
  i.set_device(device);
  i.set_phase(phase);
  i.set_start_seconds(start);
  i.set_end_seconds(end);
  i.set_joules(joules);
  i.set_run(run);
  return i;
}

grpc::Status ReportEnergy(const std::shared_ptr<grpc::Channel>& channel,
                          const std::vector<v1::EnergyInterval>& intervals,
                          v1::ReportEnergyResponse* response) {
  grpc::ClientContext context;
  auto writer = v1::Telemetry::NewStub(channel)->ReportEnergy(&context, response);
  for (const auto& i : intervals) {
    if (!writer->Write(i)) break;
  }
  writer->WritesDone();
  return writer->Finish();
}

v1::EnergyReport Report(const std::shared_ptr<grpc::Channel>& channel, const std::string& run = "",
                        double since = 0) {
  grpc::ClientContext context;
  v1::GetEnergyReportRequest request;
  request.set_run(run);
  request.set_since_seconds(since);
  v1::EnergyReport report;
  EXPECT_TRUE(v1::Telemetry::NewStub(channel)->GetEnergyReport(&context, request, &report).ok());
  return report;
}

double Joules(const v1::EnergyReport& report, const std::string& source, v1::Phase phase) {
  const v1::EnergyEntry* e = FindEnergyEntry(report, source, phase);
  return e == nullptr ? 0 : e->joules();
}

class ReportEnergyTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(daemon_.ok()); }
  DaemonProcess daemon_{{"--workers", "1", "--max-power-watts", "1000", "--max-power-series", "4"}};
};

TEST_F(ReportEnergyTest, IntervalsBookTheirJoulesPerSourcePhaseAndRun) {
  const double t0 = std::floor(UnixNow()) - 30;
  v1::ReportEnergyResponse response;
  // A rollout of 0.8 s at 412.5 J, a reward of 0.3 s at 123 J (run A); then an
  // update of 2 s at 1500 J under run B. Intervals may touch (start == the
  // previous end) and may leave gaps.
  ASSERT_TRUE(ReportEnergy(daemon_.channel(),
                           {Interval("gpu_baseline", "cuda:0", v1::PHASE_ROLLOUT, t0, t0 + 0.8,
                                     412.5, "exp/A"),
                            Interval("gpu_baseline", "cuda:0", v1::PHASE_REWARD, t0 + 0.8,
                                     t0 + 1.1, 123, "exp/A"),
                            Interval("gpu_baseline", "cuda:0", v1::PHASE_UPDATE, t0 + 5, t0 + 7,
                                     1500, "exp/B")},
                           &response)
                  .ok());
  EXPECT_EQ(response.intervals_accepted(), 3u);
  EXPECT_DOUBLE_EQ(response.joules_added(), 2035.5);

  const v1::EnergyReport all = Report(daemon_.channel());
  const v1::EnergyEntry* rollout = FindEnergyEntry(all, "gpu_baseline", v1::PHASE_ROLLOUT);
  ASSERT_NE(rollout, nullptr);
  EXPECT_DOUBLE_EQ(rollout->joules(), 412.5);
  EXPECT_NEAR(rollout->busy_seconds(), 0.8, 1e-6);
  EXPECT_EQ(rollout->requests(), 0u);
  EXPECT_DOUBLE_EQ(Joules(all, "gpu_baseline", v1::PHASE_REWARD), 123);
  EXPECT_DOUBLE_EQ(Joules(all, "gpu_baseline", v1::PHASE_UPDATE), 1500);
  // Each run reads its own intervals.
  const v1::EnergyReport a = Report(daemon_.channel(), "exp/A");
  EXPECT_DOUBLE_EQ(Joules(a, "gpu_baseline", v1::PHASE_ROLLOUT), 412.5);
  EXPECT_DOUBLE_EQ(Joules(a, "gpu_baseline", v1::PHASE_UPDATE), 0);
  const v1::EnergyReport b = Report(daemon_.channel(), "exp/B");
  EXPECT_DOUBLE_EQ(Joules(b, "gpu_baseline", v1::PHASE_UPDATE), 1500);
  EXPECT_DOUBLE_EQ(Joules(b, "gpu_baseline", v1::PHASE_ROLLOUT), 0);
  // Booked at the interval's end: a report since t0 + 2 sees the update only.
  const v1::EnergyReport later = Report(daemon_.channel(), "", t0 + 2);
  EXPECT_DOUBLE_EQ(Joules(later, "gpu_baseline", v1::PHASE_ROLLOUT), 0);
  EXPECT_DOUBLE_EQ(Joules(later, "gpu_baseline", v1::PHASE_UPDATE), 1500);

  // The same Prometheus counters as ReportPower's, all three phases present.
  const std::string m = ScrapeMetrics(daemon_.metrics_address());
  EXPECT_DOUBLE_EQ(
      MetricValue(m, "mxserve_energy_joules_total{phase=\"rollout\",source=\"gpu_baseline\"}"),
      412.5)
      << m;
  EXPECT_DOUBLE_EQ(
      MetricValue(m, "mxserve_energy_joules_total{phase=\"update\",source=\"gpu_baseline\"}"), 1500);
  EXPECT_NEAR(
      MetricValue(m, "mxserve_busy_seconds_total{phase=\"reward\",source=\"gpu_baseline\"}"), 0.3,
      1e-6);
  EXPECT_EQ(AwaitMetric(daemon_.metrics_address(),
                        "mxserve_rpc_completed_total{code=\"OK\",rpc=\"ReportEnergy\"}", 1),
            1);

  // The sampled timeline of the same device goes to its own source, and the
  // counter's joules stay what they were.
  grpc::ClientContext context;
  v1::ReportPowerResponse power;
  auto writer = v1::Telemetry::NewStub(daemon_.channel())->ReportPower(&context, &power);
  for (int i = 0; i < 3; ++i) {
    v1::PowerSample s;
    s.set_source("gpu_baseline_sampled");
    s.set_device("cuda:0");
    s.set_phase(v1::PHASE_ROLLOUT);
    s.set_timestamp_seconds(t0 + 0.5 * i);
    s.set_watts(100);
    ASSERT_TRUE(writer->Write(s));
  }
  writer->WritesDone();
  ASSERT_TRUE(writer->Finish().ok());
  const v1::EnergyReport both = Report(daemon_.channel());
  EXPECT_DOUBLE_EQ(Joules(both, "gpu_baseline_sampled", v1::PHASE_ROLLOUT), 100);
  EXPECT_DOUBLE_EQ(Joules(both, "gpu_baseline", v1::PHASE_ROLLOUT), 412.5);
}

TEST_F(ReportEnergyTest, HostileIntervalsAreRefusedAndWhatCameBeforeStays) {
  const double now = UnixNow();
  const double t = std::floor(now) - 100;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  v1::ReportEnergyResponse response;
  auto one = [&](const v1::EnergyInterval& bad) {
    // A good interval first: it stays booked whatever follows.
    return ReportEnergy(daemon_.channel(),
                        {Interval("hostile", "d", v1::PHASE_REWARD, t, t + 1, 10), bad}, &response);
  };
  struct Case {
    v1::EnergyInterval interval;
    grpc::StatusCode code;
    std::string text;
  } cases[] = {
      {Interval("", "d", v1::PHASE_ROLLOUT, t, t + 1, 1), grpc::StatusCode::INVALID_ARGUMENT,
       "intervals[1].source: expected 1-64 characters"},
      {Interval("a b", "d", v1::PHASE_ROLLOUT, t, t + 1, 1), grpc::StatusCode::INVALID_ARGUMENT,
       "intervals[1].source"},
      {Interval("s", std::string(65, 'd'), v1::PHASE_ROLLOUT, t, t + 1, 1),
       grpc::StatusCode::INVALID_ARGUMENT, "intervals[1].device"},
      {Interval("s", "d", v1::PHASE_ROLLOUT, t, t + 1, 1, "a b"),
       grpc::StatusCode::INVALID_ARGUMENT, "intervals[1].run: expected 1-64 characters"},
      {Interval("s", "d", v1::PHASE_UNSPECIFIED, t, t + 1, 1), grpc::StatusCode::INVALID_ARGUMENT,
       "intervals[1].phase"},
      {Interval("s", "d", static_cast<v1::Phase>(77), t, t + 1, 1),
       grpc::StatusCode::INVALID_ARGUMENT, "intervals[1].phase"},
      {Interval("fpga", "d", v1::PHASE_ROLLOUT, t, t + 1, 1), grpc::StatusCode::INVALID_ARGUMENT,
       "intervals[1].source: 'fpga' is reserved for the daemon's own accounting"},
      {Interval("fpga_model", "d", v1::PHASE_ROLLOUT, t, t + 1, 1),
       grpc::StatusCode::INVALID_ARGUMENT, "intervals[1].source: 'fpga_model' is reserved"},
      {Interval("s", "d", v1::PHASE_ROLLOUT, nan, t + 1, 1), grpc::StatusCode::INVALID_ARGUMENT,
       "intervals[1].start_seconds: expected a Unix time within the last 86400 s and at most 60 s "
       "ahead"},
      {Interval("s", "d", v1::PHASE_ROLLOUT, 1000, 1001, 1), grpc::StatusCode::INVALID_ARGUMENT,
       "intervals[1].start_seconds: expected a Unix time within the last 86400 s"},
      {Interval("s", "d", v1::PHASE_ROLLOUT, t, inf, 1), grpc::StatusCode::INVALID_ARGUMENT,
       "intervals[1].end_seconds: expected a Unix time"},
      {Interval("s", "d", v1::PHASE_ROLLOUT, now + 30, now + 120, 1),
       grpc::StatusCode::INVALID_ARGUMENT, "intervals[1].end_seconds: expected a Unix time"},
      {Interval("s", "d", v1::PHASE_ROLLOUT, t, t - 0.5, 1), grpc::StatusCode::INVALID_ARGUMENT,
       absl::StrFormat("intervals[1].end_seconds: expected start_seconds (%.3f) to "
                       "start_seconds + 3600 s (report a longer phase as several intervals), got "
                       "%.3f",
                       t, t - 0.5)},
      {Interval("s", "d", v1::PHASE_ROLLOUT, now - 5000, now - 5000 + 3601, 1),
       grpc::StatusCode::INVALID_ARGUMENT, "to start_seconds + 3600 s (report a longer phase"},
      {Interval("s", "d", v1::PHASE_ROLLOUT, t, t + 1, nan), grpc::StatusCode::INVALID_ARGUMENT,
       "intervals[1].joules: expected 0 to 1250 (--max-power-watts 1000 W × (1 s + 0.25 s)), "
       "got nan"},
      {Interval("s", "d", v1::PHASE_ROLLOUT, t, t + 1, -1), grpc::StatusCode::INVALID_ARGUMENT,
       "intervals[1].joules: expected 0 to 1250"},
      {Interval("s", "d", v1::PHASE_ROLLOUT, t, t + 1, 1250.5), grpc::StatusCode::INVALID_ARGUMENT,
       "got 1250.5"},
      {Interval("s", "d", v1::PHASE_ROLLOUT, t, t, 251), grpc::StatusCode::INVALID_ARGUMENT,
       "intervals[1].joules: expected 0 to 250 (--max-power-watts 1000 W × (0 s + 0.25 s))"},
      {Interval("s", "d", v1::PHASE_ROLLOUT, t, t + 1, inf), grpc::StatusCode::INVALID_ARGUMENT,
       "intervals[1].joules"},
      // Overlapping the good interval of the same (source, device) in this stream.
      {Interval("hostile", "d", v1::PHASE_REWARD, t + 0.5, t + 2, 1),
       grpc::StatusCode::INVALID_ARGUMENT,
       absl::StrFormat("intervals[1].start_seconds: expected at least %.3f (the end of the "
                       "previous interval of hostile/d; intervals must not overlap or go back in "
                       "time), got %.3f",
                       t + 1, t + 0.5)},
  };
  int refused = 0;
  for (const Case& c : cases) {
    const grpc::Status s = one(c.interval);
    EXPECT_EQ(s.error_code(), c.code) << c.text << ": " << s.error_message();
    EXPECT_NE(s.error_message().find(c.text), std::string::npos)
        << "want: " << c.text << "\ngot:  " << s.error_message();
    EXPECT_EQ(response.intervals_accepted(), 0u);  // an error carries no response
    ++refused;
  }
  // Each stream's first interval was booked before its second was refused.
  const v1::EnergyReport report = Report(daemon_.channel());
  EXPECT_DOUBLE_EQ(Joules(report, "hostile", v1::PHASE_REWARD), 10.0 * refused);
  EXPECT_NEAR(FindEnergyEntry(report, "hostile", v1::PHASE_REWARD)->busy_seconds(), refused, 1e-6);
  // Nothing of a refused interval reached the ledger or the metrics.
  for (const auto& e : report.entries()) {
    EXPECT_TRUE(e.source() == "hostile" || e.source() == "fpga_model") << e.source();
  }
  const std::string m = ScrapeMetrics(daemon_.metrics_address());
  EXPECT_EQ(m.find("source=\"s\""), std::string::npos);

  // Exactly --max-power-watts × (duration + slack) is allowed; intervals that
  // touch are fine.
  ASSERT_TRUE(ReportEnergy(daemon_.channel(),
                           {Interval("edge", "d", v1::PHASE_UPDATE, t, t + 2, 2250),
                            Interval("edge", "d", v1::PHASE_UPDATE, t + 2, t + 2, 0)},
                           &response)
                  .ok());
  EXPECT_EQ(response.intervals_accepted(), 2u);

  // --max-power-series 4, shared with ReportPower: "hostile/d" and "edge/d"
  // exist, two more fit, a fifth is RESOURCE_EXHAUSTED; known series go on.
  ASSERT_TRUE(ReportEnergy(daemon_.channel(),
                           {Interval("s3", "d", v1::PHASE_ROLLOUT, t, t + 1, 1),
                            Interval("s4", "d", v1::PHASE_ROLLOUT, t, t + 1, 1)},
                           &response)
                  .ok());
  EXPECT_STATUS(ReportEnergy(daemon_.channel(),
                             {Interval("s3", "d", v1::PHASE_ROLLOUT, t + 1, t + 2, 1),
                              Interval("s5", "d", v1::PHASE_ROLLOUT, t, t + 1, 1)},
                             &response),
                RESOURCE_EXHAUSTED, "intervals[1]: (source, device) = ('s5', 'd') would be a new "
                                    "power series");
  EXPECT_DOUBLE_EQ(Joules(Report(daemon_.channel()), "s3", v1::PHASE_ROLLOUT), 2);

  // A stream of garbage bytes is refused as such, and the daemon keeps serving.
  const RawResult raw =
      RawCall(daemon_.channel(), "/mxserve.v1.Telemetry/ReportEnergy", {std::string("\xff\xff", 2)});
  EXPECT_EQ(raw.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
      << raw.status.error_message();
  EXPECT_NE(raw.status.error_message().find("intervals[0]"), std::string::npos)
      << raw.status.error_message();
  EXPECT_TRUE(ReportEnergy(daemon_.channel(),
                           {Interval("s4", "d", v1::PHASE_ROLLOUT, t + 1, t + 2, 1)}, &response)
                  .ok());
}

TEST(ReportEnergySourcesTest, ListedSourcesOnly) {
  DaemonProcess daemon(
      {"--workers", "1", "--power-sources", "gpu_baseline,gpu_baseline_sampled"});
  ASSERT_TRUE(daemon.ok());
  const double t = UnixNow() - 10;
  v1::ReportEnergyResponse response;
  EXPECT_TRUE(ReportEnergy(daemon.channel(),
                           {Interval("gpu_baseline", "cuda:0", v1::PHASE_ROLLOUT, t, t + 1, 300)},
                           &response)
                  .ok());
  EXPECT_STATUS(ReportEnergy(daemon.channel(),
                             {Interval("gpu_other", "cuda:0", v1::PHASE_ROLLOUT, t, t + 1, 300)},
                             &response),
                INVALID_ARGUMENT,
                "intervals[0].source: 'gpu_other' is not one of the sources this daemon accepts "
                "(--power-sources: gpu_baseline, gpu_baseline_sampled)");
}

}  // namespace
}  // namespace mx_test
