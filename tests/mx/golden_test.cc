// Every case of ../shared/golden/mx reproduced bit for bit by the library:
// quantize outputs, E8M0 scales and element codes, and the matmul's quantized
// operands; C against the float64 product within the README's tolerance.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "mx/element.h"
#include "mx/packed.h"
#include "mx/reference_gemm.h"
#include "tests/mx/test_util.h"

namespace {

using mx_test::CaseFile;
using mx_test::ReadBytes;
using mx_test::ReadFloats;
using mx_test::SameValue;

mx::Format CaseFormat(const mx_test::GoldenCase& c) {
  return mx::ParseFormat(c["format"].get<std::string>()).value();
}

// Zero codes may differ in their sign bit (golden README, item 6).
bool SameCode(mx::Format format, uint8_t a, uint8_t b) {
  const mx::FormatTraits& t = mx::Traits(format);
  const uint8_t sign = t.kind == mx::FormatKind::kMxInt
                           ? 0
                           : static_cast<uint8_t>(1u << (t.exponent_bits + t.mantissa_bits));
  const bool a_zero = (a & ~sign) == 0, b_zero = (b & ~sign) == 0;
  return a == b || (a_zero && b_zero);
}

TEST(Golden, ManifestIsPresent) {
  std::ifstream in(mx_test::kGoldenDir + "/manifest.json");
  ASSERT_TRUE(in) << "golden vectors not found at " << mx_test::kGoldenDir
                  << " (configure with -DMXSERVE_GOLDEN_DIR=...)";
  EXPECT_EQ(mx_test::GoldenCases("quantize").size(), 12u);
  EXPECT_EQ(mx_test::GoldenCases("matmul").size(), 12u);
}

class GoldenQuantize : public testing::TestWithParam<mx_test::GoldenCase> {};

TEST_P(GoldenQuantize, OutputsScalesAndCodesMatchBitForBit) {
  const mx_test::GoldenCase& c = GetParam();
  ASSERT_EQ(c["rounding"], "even");
  const mx::Format format = CaseFormat(c);
  const std::vector<float> input = ReadFloats(CaseFile(c, "input"));
  const std::vector<float> expected = ReadFloats(CaseFile(c, "output"));
  const std::vector<uint8_t> scales = ReadBytes(CaseFile(c, "scales_e8m0"));
  const std::vector<uint8_t> codes = ReadBytes(CaseFile(c, "element_codes"));
  const int64_t n = c["length"].get<int64_t>();
  ASSERT_EQ(input.size(), static_cast<size_t>(n));
  ASSERT_EQ(expected.size(), input.size());

  const mx::QuantizedMatrix q = mx::QuantizeRows(input, 1, n, format).value();
  ASSERT_EQ(q.block_scales.size(), scales.size());
  for (size_t b = 0; b < scales.size(); ++b) {
    EXPECT_EQ(q.block_scales[b], scales[b]) << "block " << b;
  }
  const std::vector<float> output = mx::Dequantize(q);
  int mismatches = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t code = static_cast<uint8_t>(mx::ElementCode(q, 0, i));
    if (!SameValue(output[i], expected[i]) || !SameCode(format, code, codes[i])) {
      if (++mismatches <= 10) {
        ADD_FAILURE() << "element " << i << " (block " << i / 32 << ") input " << input[i]
                      << ": got " << output[i] << " code 0x" << std::hex << int{code}
                      << ", expected " << expected[i] << " code 0x" << int{codes[i]};
      }
    }
  }
  EXPECT_EQ(mismatches, 0);
}

INSTANTIATE_TEST_SUITE_P(AllCases, GoldenQuantize,
                         testing::ValuesIn(mx_test::GoldenCases("quantize")),
                         [](const auto& info) { return mx_test::TestName(info.param["id"]); });

class GoldenMatmul : public testing::TestWithParam<mx_test::GoldenCase> {};

TEST_P(GoldenMatmul, OperandsBitExactAndProductWithinTolerance) {
  const mx_test::GoldenCase& c = GetParam();
  const mx::Format format = CaseFormat(c);
  const int64_t m = c["M"], k = c["K"], n = c["N"];
  const std::vector<float> a = ReadFloats(CaseFile(c, "A"));
  const std::vector<float> b = ReadFloats(CaseFile(c, "B"));
  const std::vector<float> aq = ReadFloats(CaseFile(c, "A_dequantized"));
  const std::vector<float> bq = ReadFloats(CaseFile(c, "B_dequantized"));
  const std::vector<float> c64 = ReadFloats(CaseFile(c, "C_from_float64"));
  const std::vector<float> c32 = ReadFloats(CaseFile(c, "C"));

  // A per row, B per column (held as N rows of K).
  const std::vector<float> our_aq = mx::Dequantize(mx::QuantizeRows(a, m, k, format).value());
  const std::vector<float> our_bq_t = mx::Dequantize(mx::QuantizeColumns(b, k, n, format).value());
  for (int64_t i = 0; i < m * k; ++i) {
    ASSERT_TRUE(SameValue(our_aq[i], aq[i])) << "Aq[" << i << "] " << our_aq[i] << " vs " << aq[i];
  }
  for (int64_t r = 0; r < k; ++r) {
    for (int64_t j = 0; j < n; ++j) {
      ASSERT_TRUE(SameValue(our_bq_t[j * k + r], bq[r * n + j]))
          << "Bq[" << r << "," << j << "] " << our_bq_t[j * k + r] << " vs " << bq[r * n + j];
    }
  }

  // C: |C - C64| <= K·2^-23·(|Aq| @ |Bq|), element-wise (README item 7).
  const std::vector<float> ours = mx::ReferenceGemm(a, format, b, format, m, k, n).value();
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      const double bound = mx_test::GoldenGemmBound(aq, bq, k, n, i, j);
      EXPECT_LE(std::fabs(double{ours[i * n + j]} - c64[i * n + j]), bound)
          << "C[" << i << "," << j << "]";
      // The reference implementation's own float32 C meets the same bound: this
      // checks that the bound as computed here is the README's, not a looser one.
      EXPECT_LE(std::fabs(double{c32[i * n + j]} - c64[i * n + j]), bound);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllCases, GoldenMatmul, testing::ValuesIn(mx_test::GoldenCases("matmul")),
                         [](const auto& info) { return mx_test::TestName(info.param["id"]); });

}  // namespace
