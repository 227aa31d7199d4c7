// mxctl's local subcommands, run as a user runs them: the real binary, real files.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "mx/format.h"
#include "mx/reference_gemm.h"
#include "mx/stochastic.h"
#include "tests/cli/mxctl_fixture.h"
#include "tests/mx/test_util.h"

namespace {

using mx_test::ReadBytes;
using mx_test::SameValue;

using Result = mx_test::MxctlResult;

class Mxctl : public mx_test::MxctlTest {
 protected:
  Result Run(const std::string& args) const { return RunMxctl(args); }
};

TEST_F(Mxctl, QuantizeReproducesEveryGoldenCase) {
  const std::vector<mx_test::GoldenCase> cases = mx_test::GoldenCases("quantize");
  ASSERT_EQ(cases.size(), 12u) << "golden vectors missing at " << mx_test::kGoldenDir;
  for (const auto& c : cases) {
    SCOPED_TRACE(c["id"].get<std::string>());
    const Result r =
        Run("quantize --format " + c["format"].get<std::string>() + " --rounding even --input " +
            mx_test::CaseFile(c, "input") + " --output " + Path("out.f32") + " --scales " +
            Path("s.u8") + " --codes " + Path("c.u8"));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const std::vector<float> out = ReadFloats("out.f32");
    const std::vector<float> expected = mx_test::ReadFloats(mx_test::CaseFile(c, "output"));
    ASSERT_EQ(out.size(), expected.size());
    for (size_t i = 0; i < out.size(); ++i) ASSERT_TRUE(SameValue(out[i], expected[i])) << i;
    EXPECT_EQ(ReadBytes(Path("s.u8")), ReadBytes(mx_test::CaseFile(c, "scales_e8m0")));
    const std::vector<uint8_t> codes = ReadBytes(Path("c.u8"));
    const std::vector<uint8_t> expected_codes = ReadBytes(mx_test::CaseFile(c, "element_codes"));
    ASSERT_EQ(codes.size(), expected_codes.size());
    for (size_t i = 0; i < codes.size(); ++i) {
      // Codes agree except, for zeros, in the sign bit (golden README item 6).
      if (codes[i] != expected_codes[i]) {
        ASSERT_EQ(out[i], 0.0f) << i;
      }
    }
  }
}

TEST_F(Mxctl, GemmReproducesEveryGoldenCase) {
  const std::vector<mx_test::GoldenCase> cases = mx_test::GoldenCases("matmul");
  ASSERT_EQ(cases.size(), 12u);
  for (const auto& c : cases) {
    SCOPED_TRACE(c["id"].get<std::string>());
    const int64_t m = c["M"], k = c["K"], n = c["N"];
    const std::string format = c["format"];
    const Result r =
        Run("gemm --format " + format + " --a " + mx_test::CaseFile(c, "A") + " --b " +
            mx_test::CaseFile(c, "B") + " --m " + std::to_string(m) + " --k " + std::to_string(k) +
            " --n " + std::to_string(n) + " --output " + Path("c.f32"));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const std::vector<float> out = ReadFloats("c.f32");
    // Bit for bit the library's reference GEMM...
    const mx::Format f = mx::ParseFormat(format).value();
    const std::vector<float> ours =
        mx::ReferenceGemm(mx_test::ReadFloats(mx_test::CaseFile(c, "A")), f,
                          mx_test::ReadFloats(mx_test::CaseFile(c, "B")), f, m, k, n)
            .value();
    ASSERT_EQ(out, ours);
    // ...and within the README's tolerance of the float64 product.
    const std::vector<float> aq = mx_test::ReadFloats(mx_test::CaseFile(c, "A_dequantized"));
    const std::vector<float> bq = mx_test::ReadFloats(mx_test::CaseFile(c, "B_dequantized"));
    const std::vector<float> c64 = mx_test::ReadFloats(mx_test::CaseFile(c, "C_from_float64"));
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        EXPECT_LE(std::fabs(double{out[i * n + j]} - c64[i * n + j]),
                  mx_test::GoldenGemmBound(aq, bq, k, n, i, j));
      }
    }
  }
}

// The FPGA kernel's C++ runs behind the daemon (`mxserved --backend hls-sim`,
// tests/cli/mxctl_remote_test.cc), not in mxctl: a local --backend is refused
// rather than ignored, so an old command line does not pass reference bits off
// as the kernel's.
TEST_F(Mxctl, GemmHasNoLocalBackend) {
  WriteFloats("a.f32", std::vector<float>(4, 1.0f));
  const Result r = Run("gemm --backend hls-sim --format fp32 --a " + Path("a.f32") + " --b " +
                       Path("a.f32") + " --m 2 --k 2 --n 2 --output " + Path("c.f32"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("unknown flag --backend"), std::string::npos) << r.err;
  EXPECT_FALSE(std::ifstream(Path("c.f32")).good());
}

TEST_F(Mxctl, MixedFormatsAndRoundingFlags) {
  WriteFloats("a.f32", {1.0f, 0.25f, 2.5f, -3.0f});
  // E2M1, amax 3: scale 2^(1 - 2) = 1/2. 2.5 scales to 5, the tie between the
  // elements 4 (even code) and 6: 2.0 under ties-to-even, 3.0 under ties-away.
  ASSERT_EQ(
      Run("quantize --format mxfp4 --input " + Path("a.f32") + " --output " + Path("even.f32"))
          .exit_code,
      0);
  ASSERT_EQ(Run("quantize --format MXFP4 --rounding away --input " + Path("a.f32") + " --output " +
                Path("away.f32"))
                .exit_code,
            0);
  EXPECT_EQ(ReadFloats("even.f32"), (std::vector<float>{1.0f, 0.25f, 2.0f, -3.0f}));
  EXPECT_EQ(ReadFloats("away.f32"), (std::vector<float>{1.0f, 0.25f, 3.0f, -3.0f}));
  // Stochastically 2.5 is 2 or 3, decided by the key (seed, stream 0, index 2)
  // as mx::StochasticBits draws it; the values on the grid stay.
  for (const uint64_t seed : {uint64_t{1}, uint64_t{2}, uint64_t{3}, ~uint64_t{0}}) {
    const std::string out = Path("sr" + std::to_string(seed) + ".f32");
    ASSERT_EQ(Run("quantize --format MXFP4 --rounding stochastic --seed " + std::to_string(seed) +
                  " --input " + Path("a.f32") + " --output " + out)
                  .exit_code,
              0);
    // 2.5 / 2^-1 = 5 lies halfway between the codes of 4 and 6: up iff u < 2^31.
    const float up = mx::StochasticBits(seed, 0)(2) < 0x80000000u ? 3.0f : 2.0f;
    EXPECT_EQ(ReadFloats(out), (std::vector<float>{1.0f, 0.25f, up, -3.0f})) << seed;
  }

  // E4M3 holds A exactly and E2M3 holds B exactly, so C is the exact product.
  WriteFloats("b.f32", {1.0f, 2.0f, 3.0f, 4.0f});
  const Result r = Run("gemm --format mxfp8 --format-b mxfp6 --a " + Path("a.f32") + " --b " +
                       Path("b.f32") + " --m 1 --k 4 --n 1 --output " + Path("c.f32"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(ReadFloats("c.f32"), (std::vector<float>{1.0f + 0.5f + 7.5f - 12.0f}));
}

TEST_F(Mxctl, ErrorsAreOneLineAndExitTwo) {
  WriteFloats("a.f32", std::vector<float>(12, 1.0f));
  WriteFloats("b.f32", std::vector<float>(8, 1.0f));
  std::ofstream(Path("odd.f32")) << "abcde";
  const std::string io =
      " --a " + Path("a.f32") + " --b " + Path("b.f32") + " --output " + Path("c.f32");
  const std::pair<std::string, std::string> cases[] = {
      {"gemm --format MXFP5 --m 3 --k 4 --n 2" + io,
       "--format: unknown format 'MXFP5'; expected one of MXFP8_E4M3"},
      {"gemm --format fp32 --m 4 --k 4 --n 2" + io,
       "--a: '" + Path("a.f32") + "' holds 12 floats, expected M*K = 4*4 = 16"},
      {"gemm --format fp32 --m 3 --k 4 --n 3" + io,
       "--b: '" + Path("b.f32") + "' holds 8 floats, expected K*N = 4*3 = 12"},
      {"gemm --format fp32 --m 3 --k 4" + io, "missing required flag --n"},
      {"gemm --format fp32 --m 3 --k four --n 2" + io,
       "--k: expected an integer in [1, 1048576], got 'four'"},
      {"gemm --format fp32 --m 3 --k 4 --n 2 --rounding up" + io,
       "--rounding: unknown rounding 'up'; expected nearest_even (even), nearest_away (away) or "
       "stochastic"},
      {"gemm --format fp32 --m 3 --k 4 --n 2 --rounding stochastic" + io,
       "--seed: required with --rounding stochastic (the random bits' key)"},
      {"gemm --format fp32 --m 3 --k 4 --n 2 --seed 4" + io,
       "--seed: only read with --rounding stochastic"},
      {"gemm --format fp32 --m 3 --k 4 --n 2 --rounding stochastic --seed -1" + io,
       "--seed: expected an integer from 0 to 2^64 - 1, got '-1'"},
      {"quantize --format mxfp4 --input " + Path("none.f32") + " --output " + Path("o.f32"),
       "--input: cannot read '" + Path("none.f32") + "'"},
      // A directory aborted mxctl at the first read (libstdc++ throws on EISDIR).
      {"quantize --format mxfp4 --input " + Path("") + " --output " + Path("o.f32"),
       "--input: '" + Path("") + "' is a directory, not a file"},
      {"models register --name x --layers-json " + Path(""),
       "--layers-json: '" + Path("") + "' is a directory, not a file"},
      {"quantize --format mxfp4 --input " + Path("odd.f32") + " --output " + Path("o.f32"),
       "is 5 bytes, not a whole number of float32"},
      {"quantize --format fp16 --input " + Path("a.f32") + " --output " + Path("o.f32") +
           " --scales " + Path("s.u8"),
       "--scales: FP16 has no block scales"},
      {"quantize --format mxfp4 --inptu x --output y", "unknown flag --inptu"},
      {"quantize --format mxfp4 --input", "flag --input needs a value"},
      {"frobnicate", "unknown command 'frobnicate'"},
      // A file that is no PEM reached gRPC, which logged three lines and failed the
      // call with "UNAVAILABLE: empty address list" (exit 1).
      {"health --server 127.0.0.1:1 --tls-ca " + Path("a.f32"),
       "--tls-ca: '" + Path("a.f32") + "' holds no PEM certificate (a -----BEGIN CERTIFICATE----- "
       "block)"},
      {"health --server 127.0.0.1:1 --tls-ca " + Path(""),
       "--tls-ca: cannot read '" + Path("") + "' (missing, unreadable, empty or a directory)"},
  };
  for (const auto& [args, message] : cases) {
    SCOPED_TRACE(args);
    const Result r = Run(args);
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_EQ(r.err.rfind("mxctl: error: ", 0), 0u) << r.err;
    EXPECT_NE(r.err.find(message), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
  // Neither way of giving the layers said "..., not both" (a black-box test).
  const std::string layers =
      "mxctl: error: give the layers with --layer name:OUTxIN[:bias] (repeatable) or "
      "--layers-json FILE";
  const Result neither = Run("models register --name x");
  EXPECT_EQ(neither.exit_code, 2);
  EXPECT_EQ(neither.err, layers + "\n");
  const Result both = Run("models register --name x --layer a:2x2 --layers-json " + Path("l.json"));
  EXPECT_EQ(both.exit_code, 2);
  EXPECT_EQ(both.err, layers + ", not both\n");
}

TEST_F(Mxctl, HelpFormatsAndDemo) {
  const Result help = Run("--help");
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.out.find("usage: mxctl <command>"), std::string::npos);
  EXPECT_NE(help.out.find("--format-b F2"), std::string::npos);
  // After a command as well, instead of "unknown flag --help".
  for (const char* command : {"bench --help", "quantize -h", "models register --help"}) {
    const Result sub = Run(command);
    EXPECT_EQ(sub.exit_code, 0) << command << ": " << sub.err;
    EXPECT_NE(sub.out.find("usage: mxctl <command>"), std::string::npos) << command;
  }
  // A typo with --help, and no command at all, are usage errors: they exited 0
  // (a black-box test), which a script reads as success.
  const Result typo = Run("nosuch --help");
  EXPECT_EQ(typo.exit_code, 2);
  EXPECT_EQ(typo.err, "mxctl: error: unknown command 'nosuch' (try 'mxctl help')\n");
  // So is a subcommand typo with --help (it printed the usage and exited 0).
  const Result models_typo = Run("models bogus --help");
  EXPECT_EQ(models_typo.exit_code, 2);
  EXPECT_EQ(models_typo.err,
            "mxctl: error: models: unknown subcommand 'bogus'; expected list, register, upload, "
            "load, publish, describe or delete\n");
  const Result policy_typo = Run("policy lsit -h");
  EXPECT_EQ(policy_typo.exit_code, 2);
  EXPECT_EQ(policy_typo.err,
            "mxctl: error: policy: unknown subcommand 'lsit'; expected put, get, list, delete, "
            "activate, resolve or generate\n");
  EXPECT_EQ(Run("policy generate --help").exit_code, 0);
  EXPECT_EQ(Run("models --help").exit_code, 0);
  const Result nothing = Run("");
  EXPECT_EQ(nothing.exit_code, 2);
  EXPECT_EQ(nothing.out, "");
  EXPECT_NE(nothing.err.find("usage: mxctl <command>"), std::string::npos) << nothing.err;
  const Result formats = Run("formats");
  EXPECT_EQ(formats.exit_code, 0);
  EXPECT_NE(formats.out.find("MXFP6_E3M2     6    6.25    3/2       4            28"),
            std::string::npos)
      << formats.out;
  // Stored bits per element, scales included: 4.25 for MXFP4 (the figure NVFP4's
  // 4.5 is read against), a per-row scale for INT8, none for the floats.
  EXPECT_NE(formats.out.find("MXFP4_E2M1     4    4.25"), std::string::npos) << formats.out;
  EXPECT_NE(formats.out.find("NF4            4    4.50"), std::string::npos) << formats.out;
  EXPECT_NE(formats.out.find("BNB_FP4        4    4.50"), std::string::npos) << formats.out;
  EXPECT_NE(formats.out.find("MXINT8         8    8.25"), std::string::npos) << formats.out;
  EXPECT_NE(formats.out.find("INT8           8  8+32/K"), std::string::npos) << formats.out;
  EXPECT_NE(formats.out.find("BF16          16      16"), std::string::npos) << formats.out;
  const Result demo = Run("demo");
  EXPECT_EQ(demo.exit_code, 0);
  for (const mx::FormatTraits& t : mx::AllFormats()) {
    // Built by appends: GCC 12 warns falsely (-Wrestrict) on "\n" + std::string.
    std::string row(1, '\n');
    row.append(t.name.data(), t.name.size()).push_back(' ');
    EXPECT_NE(demo.out.find(row), std::string::npos) << t.name;
  }
}

}  // namespace
