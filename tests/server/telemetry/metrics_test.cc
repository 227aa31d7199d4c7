// The metrics without a daemon: energy series that start at zero (so that
// Prometheus' increase() counts a source's first joules) and the board's energy
// by weight format, read back from the text exposition.
#include "server/telemetry/metrics.h"

#include <gtest/gtest.h>
#include <prometheus/text_serializer.h>

#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"

namespace mxserve {
namespace {

// The value of one exposition line "name{labels} value", or -1 when absent.
double Value(const Metrics& metrics, const std::string& series) {
  std::istringstream lines(prometheus::TextSerializer().Serialize(metrics.registry()->Collect()));
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind(series + " ", 0) == 0) return std::stod(line.substr(series.size() + 1));
  }
  return -1;
}

std::string Energy(const std::string& source, const std::string& phase) {
  return "mxserve_energy_joules_total{phase=\"" + phase + "\",source=\"" + source + "\"}";
}

TEST(Metrics, EnergySeriesStartAtZeroForEveryPhase) {
  Metrics metrics("cpu");
  for (const char* phase : {"rollout", "reward", "update"}) {
    EXPECT_EQ(Value(metrics, Energy("fpga_model", phase)), 0) << phase;
    EXPECT_EQ(Value(metrics, Energy("gpu_baseline", phase)), -1) << phase;
  }
  metrics.DeclareEnergySource("gpu_baseline");
  for (const char* phase : {"rollout", "reward", "update"}) {
    EXPECT_EQ(Value(metrics, Energy("gpu_baseline", phase)), 0) << phase;
  }
  // A first AddEnergy of another source makes its other phases too, at zero.
  metrics.AddEnergy("gpu2", Phase::kUpdate, 2.5, 1);
  EXPECT_EQ(Value(metrics, Energy("gpu2", "update")), 2.5);
  EXPECT_EQ(Value(metrics, Energy("gpu2", "rollout")), 0);
}

TEST(Metrics, BoardEnergyCountsPerSourceAndPerFormat) {
  Metrics metrics("fpga");
  metrics.RecordBoardEnergy(Phase::kReward, mx::Format::kMxfp8E4m3, 1.5, 0.25);
  metrics.RecordBoardEnergy(Phase::kReward, mx::Format::kMxfp4E2m1, 0.5, 0.125);
  metrics.RecordBoardEnergy(Phase::kReward, mx::Format::kMxfp8E4m3, 1.0, 0.25);
  EXPECT_EQ(Value(metrics, Energy("fpga", "reward")), 3.0);
  EXPECT_EQ(Value(metrics, Energy("fpga", "rollout")), 0);
  EXPECT_EQ(Value(metrics, "mxserve_busy_seconds_total{phase=\"reward\",source=\"fpga\"}"), 0.625);
  EXPECT_EQ(Value(metrics,
                  "mxserve_request_energy_joules_total{format=\"MXFP8_E4M3\","
                  "phase=\"reward\",source=\"fpga\"}"),
            2.5);
  EXPECT_EQ(Value(metrics,
                  "mxserve_request_energy_joules_total{format=\"MXFP4_E2M1\","
                  "phase=\"reward\",source=\"fpga\"}"),
            0.5);
}

TEST(Metrics, ModelEnergyHasASeriesPerModelUpToTheLimitThenOther) {
  Metrics metrics("cpu");
  metrics.RecordModelEnergy("before", Phase::kRollout, 1);  // off by default: names no model
  metrics.EnableModelEnergy(true);
  auto series = [](const std::string& model, const std::string& phase) {
    return "mxserve_model_energy_joules_total{model=\"" + model + "\",phase=\"" + phase + "\"}";
  };
  metrics.RecordModelEnergy("policy", Phase::kRollout, 1.5);
  metrics.RecordModelEnergy("policy", Phase::kRollout, 0.25);
  EXPECT_EQ(Value(metrics, series("policy", "rollout")), 1.75);
  EXPECT_EQ(Value(metrics, series("before", "rollout")), -1);
  EXPECT_EQ(Value(metrics, series("policy", "update")), 0);  // every phase, from zero
  for (size_t i = 1; i < Metrics::kMaxModelLabels; ++i) {
    metrics.RecordModelEnergy(absl::StrCat("m", i), Phase::kReward, 1);
  }
  EXPECT_EQ(Value(metrics, series("m31", "reward")), 1);
  EXPECT_EQ(Value(metrics, series("other", "reward")), -1);  // not yet needed
  // The 33rd model and every later one share "other".
  metrics.RecordModelEnergy("late-1", Phase::kUpdate, 2);
  metrics.RecordModelEnergy("late-2", Phase::kUpdate, 0.5);
  EXPECT_EQ(Value(metrics, series("other", "update")), 2.5);
  EXPECT_EQ(Value(metrics, series("late-1", "update")), -1);
  metrics.RecordModelEnergy("policy", Phase::kUpdate, 1);  // labelled models keep theirs
  EXPECT_EQ(Value(metrics, series("policy", "update")), 1);
}

}  // namespace
}  // namespace mxserve
