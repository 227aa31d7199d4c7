// mxctl's remote subcommands against a real mxserved (tests/daemon/daemon_process.h
// starts it on 127.0.0.1, port 0, and stops it with SIGTERM): the binaries a user
// runs, real files, exit codes and messages. Numerics: the daemon's forward and
// GEMM must give the local reference GEMM's bits.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>

#include "mx/format.h"
#include "mx/reference_gemm.h"
#include "tests/cli/mxctl_fixture.h"
#include "tests/daemon/daemon_process.h"
#include "tests/float_bound.h"
#include "tests/mx/test_util.h"

namespace {

using Result = mx_test::MxctlResult;

std::vector<float> RandomFloats(size_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> values(count);
  for (float& v : values) v = normal(rng);
  return values;
}

// W (rows × cols) → Wᵀ, so that X·Wᵀ is the local `gemm` of X and B = Wᵀ.
std::vector<float> Transpose(const std::vector<float>& w, int64_t rows, int64_t cols) {
  std::vector<float> t(w.size());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) t[c * rows + r] = w[r * cols + c];
  }
  return t;
}

// Table checks by pattern: column widths are the printer's business.
bool Contains(const std::string& text, const std::string& pattern) {
  return std::regex_search(text, std::regex(pattern));
}

class MxctlRemote : public mx_test::MxctlTest {
 protected:
  static void SetUpTestSuite() {
    daemon_ = new mx_test::DaemonProcess({"--backend", "cpu", "--workers", "2"});
  }
  static void TearDownTestSuite() { mx_test::StopSuiteDaemon(daemon_); }

  void SetUp() override {
    ASSERT_TRUE(daemon_->ok());
    MxctlTest::SetUp();
  }

  // mxctl ARGS --server ADDRESS (unless `with_server` is false).
  Result Run(const std::string& args, bool with_server = true) const {
    return RunMxctl(with_server ? args + " --server " + daemon_->grpc_address() : args);
  }

  // Runs and expects success, returning stdout.
  std::string Ok(const std::string& args) const {
    const Result r = Run(args);
    EXPECT_EQ(r.exit_code, 0) << args << "\n" << r.err;
    return r.out;
  }

  // Registers `model` with one layer `layer` of out×in (no bias), uploads seeded
  // weights (written to W.f32) and publishes them.
  void RegisterWithWeights(const std::string& model, const std::string& layer, int64_t out,
                           int64_t in) {
    Ok("models register --name " + model + " --layer " + layer + ":" + std::to_string(out) + "x" +
       std::to_string(in));
    WriteFloats("W.f32", RandomFloats(static_cast<size_t>(out * in), 11));
    const std::string upload = Ok("models upload --model " + model + " --layer " + layer +
                                  " --weight " + Path("W.f32") + " --publish");
    EXPECT_NE(upload.find("published weight version 1"), std::string::npos) << upload;
  }

  static void ExpectOneErrorLine(const Result& r, int exit_code, const std::string& message) {
    EXPECT_EQ(r.exit_code, exit_code) << r.err;
    EXPECT_EQ(r.err.rfind("mxctl: error: ", 0), 0u) << r.err;
    EXPECT_NE(r.err.find(message), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }

  static mx_test::DaemonProcess* daemon_;
};

mx_test::DaemonProcess* MxctlRemote::daemon_ = nullptr;

TEST_F(MxctlRemote, HealthReportsServing) {
  Result r = Run("health");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "SERVING\n");
  // --server before the subcommand works as well as after it.
  r = Run("--server " + daemon_->grpc_address() + " health --service mxserve.v1.Compute",
          /*with_server=*/false);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "SERVING\n");
  ExpectOneErrorLine(Run("health --service no.such.Service"), 1,
                     "grpc.health.v1.Health.Check: NOT_FOUND");
}

TEST_F(MxctlRemote, ModelsRegisterUploadListDescribeDelete) {
  std::string out =
      Ok("models register --name lifecycle --layer q_proj:64x96 "
         "--layer out:32x64:bias --policy C-aggressive");
  EXPECT_NE(out.find("C-aggressive"), std::string::npos) << out;
  EXPECT_NE(out.find("q_proj"), std::string::npos) << out;

  WriteFloats("q.f32", RandomFloats(64 * 96, 1));
  WriteFloats("o.f32", RandomFloats(32 * 64, 2));
  WriteFloats("b.f32", RandomFloats(32, 3));
  out = Ok("models upload --model lifecycle --layer q_proj --weight " + Path("q.f32"));
  EXPECT_NE(out.find("staged 1 tensors"), std::string::npos) << out;
  out = Ok("models upload --model lifecycle --layer out --weight " + Path("o.f32") + " --bias " +
           Path("b.f32"));
  EXPECT_NE(out.find("staged 2 tensors"), std::string::npos) << out;
  out = Ok("models publish --model lifecycle");
  EXPECT_NE(out.find("weight_version  1"), std::string::npos) << out;

  out = Ok("models list");
  EXPECT_NE(out.find("lifecycle"), std::string::npos) << out;
  out = Ok("models describe lifecycle");
  for (const char* expected : {"model           lifecycle", "policy          C-aggressive",
                               "weight_version  1", "q_proj", "out"}) {
    EXPECT_NE(out.find(expected), std::string::npos) << expected << "\n" << out;
  }

  // A weight file of the wrong size is caught before anything is sent.
  ExpectOneErrorLine(
      Run("models upload --model lifecycle --layer out --weight " + Path("q.f32")), 2,
      "--weight: '" + Path("q.f32") + "' holds 6144 floats, layer 'out' needs OUT*IN = 32*64");

  out = Ok("models delete lifecycle");
  EXPECT_NE(out.find("deleted model lifecycle"), std::string::npos) << out;
  EXPECT_EQ(Ok("models list").find("lifecycle"), std::string::npos);
  ExpectOneErrorLine(Run("models describe --model lifecycle"), 1,
                     "Models.DescribeModel: NOT_FOUND");
}

TEST_F(MxctlRemote, ModelsRegisterFromLayersJson) {
  std::ofstream(Path("layers.json"))
      << R"({"layers": [{"name": "a", "out_features": 8, "in_features": 32},
                        {"name": "b", "out_features": 4, "in_features": 8, "bias": true}]})";
  const std::string out =
      Ok("models register --name from-json --layers-json " + Path("layers.json"));
  EXPECT_TRUE(Contains(out, R"(\na +8 +32 +no)")) << out;
  EXPECT_TRUE(Contains(out, R"(\nb +4 +8 +yes)")) << out;
  Ok("models delete from-json");
}

TEST_F(MxctlRemote, PolicyPutListGetActivateResolveDelete) {
  std::ofstream(Path("policy.json")) << R"({
    "name": "test-policy", "description": "q in FP16, the rest MXFP4",
    "defaults": {"rollout": "MXFP4", "reward": "MXFP6_E2M3", "update": "BF16"},
    "rules": [{"phase": "*", "layers": "*.q_proj", "format": "FP16"}]})";
  std::string out = Ok("policy put --file " + Path("policy.json"));
  EXPECT_NE(out.find("stored policy test-policy"), std::string::npos) << out;
  out = Ok("policy list");
  EXPECT_NE(out.find("test-policy"), std::string::npos) << out;
  EXPECT_TRUE(Contains(out, R"(\nD-phase-adaptive +builtin)")) << out;
  out = Ok("policy get test-policy");
  EXPECT_NE(out.find("\"name\": \"test-policy\""), std::string::npos) << out;

  Ok("models register --name policed --layer layers.0.q_proj:8x32 --layer layers.0.mlp:8x32");
  out = Ok("policy activate --model policed --policy test-policy");
  EXPECT_NE(out.find("model policed: active policy test-policy"), std::string::npos) << out;
  out = Ok("policy resolve --model policed");
  EXPECT_NE(out.find("policy test-policy"), std::string::npos) << out;
  EXPECT_TRUE(Contains(out, R"(\nlayer +rollout +reward +update\n)")) << out;
  EXPECT_TRUE(
      Contains(out, R"(\nlayers\.0\.q_proj +FP16 \(rule 0\) +FP16 \(rule 0\) +FP16 \(rule 0\)\n)"))
      << out;
  EXPECT_TRUE(Contains(out, R"(\nlayers\.0\.mlp +MXFP4_E2M1 +MXFP6_E2M3 +BF16\n)")) << out;
  EXPECT_EQ(out.find("scale rule"), std::string::npos) << "floor and nearest even go unsaid";
  out = Ok("policy resolve --model policed --policy fp16-baseline");
  EXPECT_TRUE(Contains(out, R"(\nlayers\.0\.mlp +FP16 +FP16 +FP16\n)")) << out;
  // A policy's scale rules and roundings, per phase, under the table.
  std::ofstream(Path("numerics.json")) << R"({
    "name": "numerics-policy", "defaults": {"rollout": "MXFP4", "reward": "MXFP4", "update": "MXFP4"},
    "scale_rules": {"update": "rceil"}, "roundings": {"update": "stochastic", "reward": "away"}})";
  Ok("policy put --file " + Path("numerics.json"));
  out = Ok("policy resolve --model policed --policy numerics-policy");
  EXPECT_TRUE(Contains(out, "\nreward: scale rule floor, rounding nearest_away\n"
                            "update: scale rule rceil, rounding stochastic\n$"))
      << out;
  Ok("policy delete numerics-policy");

  // In use: the daemon refuses, and says so.
  ExpectOneErrorLine(Run("policy delete test-policy"), 1,
                     "Policies.DeletePolicy: FAILED_PRECONDITION");
  Ok("models delete policed");
  out = Ok("policy delete test-policy");
  EXPECT_NE(out.find("deleted policy test-policy"), std::string::npos) << out;
  ExpectOneErrorLine(Run("policy get test-policy"), 1, "Policies.GetPolicy: NOT_FOUND");
}

// From the command line alone: a weight-only profile with its CSV, then the
// fraction policies A-D of ORIGIN.md and a budgeted one, each one command.
TEST_F(MxctlRemote, ProfileThenGenerateFractionAndBudgetedPolicies) {
  Ok("models register --name profiled --layer model.layers.0.q_proj:32x64 "
     "--layer model.layers.0.k_proj:32x64 --layer model.layers.0.mlp.up:64x64 "
     "--layer model.layers.1.q_proj:32x64 --layer model.layers.1.mlp.up:64x64");
  uint32_t seed = 20;
  for (const char* layer :
       {"model.layers.0.q_proj", "model.layers.0.k_proj", "model.layers.1.q_proj"}) {
    std::vector<float> w = RandomFloats(32 * 64, seed++);
    if (seed % 2 == 0) {
      for (size_t i = 0; i < w.size(); i += 31) w[i] *= 60;  // outliers: MXFP4 suffers
    }
    WriteFloats("W.f32", w);
    Ok(std::string("models upload --model profiled --layer ") + layer + " --weight " +
       Path("W.f32"));
  }
  WriteFloats("U.f32", RandomFloats(64 * 64, seed++));
  Ok("models upload --model profiled --layer model.layers.0.mlp.up --weight " + Path("U.f32"));
  Ok("models upload --model profiled --layer model.layers.1.mlp.up --weight " + Path("U.f32") +
     " --publish");

  std::string out = Ok("profile --model profiled --formats MXFP4_E2M1,MXFP8_E4M3,FP16 --csv " +
                       Path("profile.csv"));
  EXPECT_TRUE(Contains(out, R"(model profiled version 1: 5 layers x 3 formats)")) << out;
  EXPECT_TRUE(Contains(out, R"(\nlayer +MXFP4_E2M1 +MXFP8_E4M3 +FP16\n)")) << out;
  std::ifstream csv_file(Path("profile.csv"));
  std::vector<std::string> lines;
  for (std::string line; std::getline(csv_file, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), 1u + 5 * 3);
  EXPECT_EQ(lines[0].rfind("layer,format,", 0), 0u) << lines[0];
  EXPECT_NE(lines[0].find(",rel_error,"), std::string::npos);
  EXPECT_EQ(lines[1].rfind("model.layers.0.q_proj,MXFP4_E2M1,", 0), 0u) << lines[1];

  // A, B, C: 20/50/80% low in rollout and reward, update all FP16; D: 80/50/20%.
  const std::pair<const char*, const char*> fractions[] = {
      {"A", "--phase rollout --phase reward --fraction 0.2"},
      {"B", "--phase rollout --phase reward --fraction 0.5"},
      {"C", "--phase rollout --phase reward --fraction 0.8"},
      {"D", "--fraction rollout=0.8,reward=0.5,update=0.2"}};
  const std::map<std::string, std::vector<int>> low = {
      {"A", {1, 1, 0}}, {"B", {3, 3, 0}}, {"C", {4, 4, 0}}, {"D", {4, 3, 1}}};  // round(f·5)
  for (const auto& [name, flags] : fractions) {
    out = Ok(std::string("policy generate --model profiled --name gen-") + name +
             " --kind fraction --low MXFP4_E2M1 --high FP16 " + flags);
    EXPECT_NE(out.find(std::string("put policy gen-") + name + " for model profiled"),
              std::string::npos)
        << out;
    EXPECT_TRUE(Contains(out, R"(\nlayer +rollout +reward +update\n)")) << out;
    EXPECT_TRUE(Contains(out, R"(\nphase +J/token +FP16 J/token +vs FP16)")) << out;
    const char* phases[] = {"rollout", "reward", "update"};
    for (int p = 0; p < 3; ++p) {
      EXPECT_TRUE(Contains(
          out, std::string("\n") + phases[p] + " .* " + std::to_string(low.at(name)[p]) + "/5\n"))
          << name << " " << phases[p] << "\n"
          << out;
    }
    // The daemon has it, and resolves to the printed table.
    EXPECT_NE(Ok(std::string("policy resolve --model profiled --policy gen-") + name)
                  .find("model.layers.1.mlp.up"),
              std::string::npos);
  }
  out =
      Ok("policy generate --model profiled --name gen-half --kind budget "
         "--relative-budget 0.5 --group '*.q_proj|*.k_proj'");
  EXPECT_NE(out.find("put policy gen-half"), std::string::npos) << out;
  // At most half the FP16 energy in every phase ("vs FP16" at or under 50.0%).
  std::smatch m;
  std::string rest = out;
  int phases_seen = 0;
  while (std::regex_search(rest, m, std::regex(R"(\n(rollout|reward|update) .* ([0-9.]+)%)"))) {
    EXPECT_LE(std::stod(m[2]), 50.0) << out;
    ++phases_seen;
    rest = m.suffix();
  }
  EXPECT_EQ(phases_seen, 3) << out;
  // q and k of block 0 share a format in every phase.
  EXPECT_TRUE(Contains(
      out,
      R"(\nmodel\.layers\.0\.q_proj +(\S+) +(\S+) +(\S+)\nmodel\.layers\.0\.k_proj +\1 +\2 +\3\n)"))
      << out;

  // Errors: the daemon's (exit 1, naming the field) and the command line's (exit 2).
  ExpectOneErrorLine(
      Run("policy generate --model profiled --name gen-x --kind budget --budget 1e-15"), 1,
      "below the cheapest feasible budget");
  ExpectOneErrorLine(Run("policy generate --model profiled --name gen-x --kind fraction "
                         "--fraction 0.5 --low MXINT8"),
                     1, "low: MXINT8 is not in the profile");
  ExpectOneErrorLine(
      Run("policy generate --model profiled --name gen-x --kind fraction --low MXFP4"), 2,
      "--fraction");
  ExpectOneErrorLine(
      Run("policy generate --model profiled --name gen-x --kind knapsack --fraction 1"), 2,
      "--kind: expected fraction, budget or tolerance");
  ExpectOneErrorLine(
      Run("policy generate --model profiled --name gen-x --kind rl --fraction 1"), 2,
      "--kind rl: the RL search runs the whole model on calibration batches");
  ExpectOneErrorLine(Run("profile --model profiled --formats MXFP5"), 2,
                     "--formats: unknown format 'MXFP5'");
  ExpectOneErrorLine(Run("profile --model profiled --formats ''"), 2,
                     "--formats: unknown format ''");
  ExpectOneErrorLine(Run("profile --model no-such-model"), 1, "Profiles.ProfileModel: NOT_FOUND");
  for (const char* name : {"A", "B", "C", "D"}) Ok(std::string("policy delete gen-") + name);
  Ok("policy delete gen-half");
  Ok("models delete profiled");
}

TEST_F(MxctlRemote, ForwardEqualsLocalGemmOfTheTransposedWeights) {
  constexpr int64_t kM = 5, kK = 96, kN = 40;
  RegisterWithWeights("fwd", "proj", kN, kK);
  WriteFloats("Wt.f32", Transpose(ReadFloats("W.f32"), kN, kK));
  WriteFloats("X.f32", RandomFloats(kM * kK, 5));
  for (const char* format :
       {"MXFP4_E2M1", "MXFP8_E4M3", "MXFP6_E3M2", "MXINT8", "INT8", "BF16", "FP32"}) {
    SCOPED_TRACE(format);
    const std::string out =
        Ok(std::string("forward --model fwd --layer proj --phase rollout --format ") + format +
           " --input " + Path("X.f32") + " --m 5 --output " + Path("Y.f32"));
    EXPECT_NE(out.find(std::string("format          ") + format + "\n"), std::string::npos) << out;
    EXPECT_NE(out.find("backend         cpu"), std::string::npos) << out;
    EXPECT_NE(out.find("weight_version  1"), std::string::npos) << out;
    const Result local =
        Run(std::string("gemm --format ") + format + " --a " + Path("X.f32") + " --b " +
                Path("Wt.f32") + " --m 5 --k 96 --n 40 --output " + Path("C.f32"),
            /*with_server=*/false);
    ASSERT_EQ(local.exit_code, 0) << local.err;
    const std::vector<float> y = ReadFloats("Y.f32"), c = ReadFloats("C.f32");
    ASSERT_EQ(y.size(), static_cast<size_t>(kM * kN));
    if (std::string(format) == "BF16") {  // pair instructions: each within the float bound
      EXPECT_TRUE(mx_test::WithinFloatBound(y, ReadFloats("X.f32"), ReadFloats("W.f32"), {}, kM,
                                            kK, kN, mx::Format::kBf16, &c, 2));
    } else {
      EXPECT_EQ(std::memcmp(y.data(), c.data(), y.size() * 4), 0);
    }
  }
  // No --format: the model's active policy chooses (D-phase-adaptive by default).
  const std::string out = Ok("forward --model fwd --layer proj --phase update --input " +
                             Path("X.f32") + " --m 5 --output " + Path("Y.f32"));
  EXPECT_NE(out.find("output  [5, 40]"), std::string::npos) << out;
  Ok("models delete fwd");
}

TEST_F(MxctlRemote, RemoteGemmEqualsLocalGemm) {
  WriteFloats("A.f32", RandomFloats(3 * 70, 21));
  WriteFloats("B.f32", RandomFloats(70 * 9, 22));
  const std::string io = " --a " + Path("A.f32") + " --b " + Path("B.f32") + " --m 3 --k 70 --n 9";
  for (const char* formats :
       {"--format mxfp4", "--format MXFP8_E5M2 --format-b mxfp6", "--format mxint8 --rounding away",
        "--format fp16 --phase reward", "--format int8", "--format mxfp4 --scale-rule nosat",
        "--format mxfp8 --scale-rule ceil", "--format mxfp6 --scale-rule rceil --rounding away"}) {
    SCOPED_TRACE(formats);
    const Result local =
        Run(std::string("gemm ") + formats + io + " --output " + Path("local.f32"), false);
    ASSERT_EQ(local.exit_code, 0) << local.err;
    Ok(std::string("gemm ") + formats + io + " --output " + Path("remote.f32"));
    const std::vector<float> expected = ReadFloats("local.f32");
    const std::vector<float> got = ReadFloats("remote.f32");
    ASSERT_EQ(got.size(), 27u);
    EXPECT_EQ(std::memcmp(got.data(), expected.data(), got.size() * 4), 0);
  }
  // An unknown rule is refused before anything is sent.
  ExpectOneErrorLine(
      Run("gemm --format mxfp4 --scale-rule round" + io + " --output " + Path("c.f32")), 2,
      "--scale-rule");
}

TEST_F(MxctlRemote, EnergyPrintsATablePerSourceAndPhase) {
  RegisterWithWeights("watts", "proj", 16, 64);
  WriteFloats("X.f32", RandomFloats(2 * 64, 9));
  Ok("forward --model watts --layer proj --phase reward --format mxfp8 --input " + Path("X.f32") +
     " --m 2 --output " + Path("Y.f32"));
  std::string out = Ok("energy");
  EXPECT_NE(out.find("energy since the daemon started"), std::string::npos) << out;
  EXPECT_TRUE(Contains(out, R"(\nsource +phase +joules +busy_s +requests)")) << out;
  EXPECT_TRUE(Contains(out, R"(\nfpga_model +reward +[0-9.e+-]+ +[0-9.e+-]+ +[1-9])")) << out;
  out = Ok("energy --since 3600");
  EXPECT_NE(out.find("energy from "), std::string::npos) << out;
  // The window runs to the daemon's clock when it answered: the call's own time
  // on top (3600.1 s under ASan on a busy machine).
  EXPECT_TRUE(Contains(out, R"(\(3600\.[0-9] s\))")) << out;
  Ok("models delete watts");
}

TEST_F(MxctlRemote, RunTagsOnForwardAndGemmAndEnergyByRun) {
  RegisterWithWeights("tagged", "proj", 16, 64);
  WriteFloats("X.f32", RandomFloats(2 * 64, 9));
  const std::string forward = "forward --model tagged --layer proj --format mxfp8 --input " +
                              Path("X.f32") + " --m 2 --output " + Path("Y.f32");
  Ok(forward + " --phase update --run mxctl-test/run-1");
  Ok(forward + " --phase update --run mxctl-test/run-1");
  WriteFloats("A.f32", RandomFloats(2 * 32, 1));
  WriteFloats("B.f32", RandomFloats(32 * 4, 2));
  Ok("gemm --format fp16 --phase reward --run mxctl-test/run-1 --a " + Path("A.f32") + " --b " +
     Path("B.f32") + " --m 2 --k 32 --n 4 --output " + Path("C.f32"));

  std::string out = Ok("energy --run mxctl-test/run-1");
  EXPECT_NE(out.find("\nrun mxctl-test/run-1\n"), std::string::npos) << out;
  EXPECT_TRUE(Contains(out, R"(\nfpga_model +reward +[0-9.e+-]+ +[0-9.e+-]+ +1 )")) << out;
  EXPECT_TRUE(Contains(out, R"(\nfpga_model +update +[0-9.e+-]+ +[0-9.e+-]+ +2 )")) << out;
  EXPECT_FALSE(Contains(out, R"(\nfpga_model +rollout)")) << out;
  out = Ok("energy --run mxctl-test/nothing --since 60");
  EXPECT_NE(out.find("(nothing accounted under this run)"), std::string::npos) << out;
  // A local gemm takes --run too (and ignores it), as it does --phase.
  EXPECT_EQ(Run("gemm --format fp16 --run x --a " + Path("A.f32") + " --b " + Path("B.f32") +
                    " --m 2 --k 32 --n 4 --output " + Path("C.f32"),
                /*with_server=*/false)
                .exit_code,
            0);
  // The daemon checks the tag and names it: exit 1, nothing booked.
  ExpectOneErrorLine(Run(forward + " --phase update --run 'a b'"), 1,
                     "Compute.LayerForward: INVALID_ARGUMENT: run: expected 1-64 characters");
  ExpectOneErrorLine(Run("energy --run 'a b'"), 1,
                     "Telemetry.GetEnergyReport: INVALID_ARGUMENT: run: expected 1-64");
  Ok("models delete tagged");
}

TEST_F(MxctlRemote, BenchJsonCountsRequestsAndCleansUp) {
  for (const char* mode : {"", " --stream"}) {
    SCOPED_TRACE(mode);
    const std::string out =
        Ok(std::string("bench --phase rollout --format mxfp4 --m 4 --k 64 --n 32 --concurrency 3 "
                       "--duration 1s --warmup 0s --json") +
           mode);
    const nlohmann::json json = nlohmann::json::parse(out, nullptr, false);
    ASSERT_TRUE(json.is_object()) << out;
    for (const char* key :
         {"requests", "seconds", "requests_per_second", "gflops", "p50_ms", "p90_ms", "p99_ms",
          "errors", "concurrency", "m", "n", "k", "format", "phase", "stream"}) {
      EXPECT_TRUE(json.contains(key)) << key;
    }
    EXPECT_GT(json["requests"].get<int64_t>(), 0);
    EXPECT_EQ(json["errors"].get<int64_t>(), 0);
    EXPECT_NEAR(json["seconds"].get<double>(), 1.0, 0.5);
    EXPECT_LE(json["p50_ms"].get<double>(), json["p99_ms"].get<double>());
    EXPECT_EQ(json["concurrency"], 3);
    EXPECT_EQ(json["format"], "MXFP4_E2M1");
    EXPECT_EQ(json["phase"], "rollout");
    EXPECT_EQ(json["stream"], *mode != '\0');
  }
  // The throwaway models are gone.
  EXPECT_EQ(Ok("models list").find("mxctl-bench-"), std::string::npos);
}

TEST_F(MxctlRemote, ErrorsNameTheProblemAndExitOneOrTwo) {
  WriteFloats("X.f32", RandomFloats(2 * 8, 1));
  // The daemon's errors: exit 1, the RPC, the code and the daemon's message.
  ExpectOneErrorLine(Run("forward --model no-such-model --layer l --phase rollout --input " +
                         Path("X.f32") + " --m 2 --output " + Path("Y.f32")),
                     1, "Compute.LayerForward: NOT_FOUND");
  EXPECT_NE(Run("forward --model no-such-model --layer l --phase rollout --input " + Path("X.f32") +
                " --m 2 --output " + Path("Y.f32"))
                .err.find("no-such-model"),
            std::string::npos);
  ExpectOneErrorLine(Run("models delete no-such-model"), 1, "no-such-model");
  Ok("models register --name dup --layer a:4x4");
  ExpectOneErrorLine(Run("models register --name dup --layer a:4x4"), 1,
                     "Models.RegisterModel: ALREADY_EXISTS");
  Ok("models delete dup");
  // Nothing listens on port 1: the RPC fails, and that is exit 1 too.
  ExpectOneErrorLine(Run("--server 127.0.0.1:1 health", /*with_server=*/false), 1,
                     "grpc.health.v1.Health.Check: UNAVAILABLE");

  // The command line's errors: exit 2, before any RPC.
  const std::pair<std::string, std::string> usage_errors[] = {
      {"models register --name x", "give the layers with --layer"},
      {"models register --name x --layer a:4by4", "--layer: expected name:OUTxIN"},
      {"models frobnicate", "models: unknown subcommand 'frobnicate'"},
      {"models describe", "missing the model"},
      {"policy", "policy: expected put, get"},
      {"policy put", "missing required flag --file"},
      {"forward --model m --layer l --input x --m 1 --output y", "missing required flag --phase"},
      {"forward --model m --layer l --phase sideways --input x --m 1 --output y",
       "--phase: unknown phase 'sideways'"},
      {"forward --model m --layer l --phase rollout --format mxfp5 --input x --m 1 --output y",
       "--format: unknown format 'mxfp5'"},
      {"bench --m 0 --k 4 --n 4", "--m: expected an integer in [1, 65536], got '0'"},
      {"bench --m 1 --k 4 --n 4 --duration forever", "--duration: expected a duration"},
      {"bench --m 1 --k 4 --n 4 --json=maybe", "--json: a switch takes no value"},
      {"energy --since yesterday", "--since: expected a duration"},
      {"health --timeout 0s", "--timeout: must be positive"},
  };
  for (const auto& [args, message] : usage_errors) {
    SCOPED_TRACE(args);
    ExpectOneErrorLine(Run(args), 2, message);
  }
  ExpectOneErrorLine(Run("health --server", false), 2, "flag --server needs a value");
}

// `mxctl gemm --server` against `mxserved --backend hls-sim`: the FPGA kernel's
// C++ gives the reference's C for every golden matmul case, and for a mixed pair.
class MxctlHlsSim : public mx_test::MxctlTest {
 protected:
  static void SetUpTestSuite() {
    daemon_ = new mx_test::DaemonProcess({"--backend", "hls-sim", "--workers", "2"});
  }
  static void TearDownTestSuite() { mx_test::StopSuiteDaemon(daemon_); }

  void SetUp() override {
    ASSERT_TRUE(daemon_->ok());
    MxctlTest::SetUp();
  }

  static mx_test::DaemonProcess* daemon_;
};

mx_test::DaemonProcess* MxctlHlsSim::daemon_ = nullptr;

TEST_F(MxctlHlsSim, GemmEqualsReferenceOnEveryGoldenCase) {
  const std::vector<mx_test::GoldenCase> cases = mx_test::GoldenCases("matmul");
  ASSERT_EQ(cases.size(), 12u) << "golden vectors missing at " << mx_test::kGoldenDir;
  for (const auto& c : cases) {
    SCOPED_TRACE(c["id"].get<std::string>());
    const int64_t m = c["M"], k = c["K"], n = c["N"];
    const std::string format = c["format"];
    for (const std::string& format_b : {format, std::string("MXFP6_E3M2")}) {
      const Result r =
          RunMxctl("gemm --format " + format + " --format-b " + format_b + " --a " +
                   mx_test::CaseFile(c, "A") + " --b " + mx_test::CaseFile(c, "B") + " --m " +
                   std::to_string(m) + " --k " + std::to_string(k) + " --n " + std::to_string(n) +
                   " --output " + Path("c.f32") + " --server " + daemon_->grpc_address());
      ASSERT_EQ(r.exit_code, 0) << r.err;
      EXPECT_TRUE(Contains(r.out, "(^|\\n)backend +hls-sim\\n")) << r.out;
      const std::vector<float> reference =
          mx::ReferenceGemm(mx_test::ReadFloats(mx_test::CaseFile(c, "A")),
                            mx::ParseFormat(format).value(),
                            mx_test::ReadFloats(mx_test::CaseFile(c, "B")),
                            mx::ParseFormat(format_b).value(), m, k, n)
              .value();
      const std::vector<float> out = ReadFloats("c.f32");
      ASSERT_EQ(out.size(), reference.size());
      for (size_t i = 0; i < out.size(); ++i) {
        ASSERT_TRUE(std::isnan(out[i])
                        ? std::isnan(reference[i])
                        : std::bit_cast<uint32_t>(out[i]) == std::bit_cast<uint32_t>(reference[i]))
            << format_b << " c[" << i << "] = " << out[i] << ", reference " << reference[i];
      }
    }
  }
}

}  // namespace
