// Block quantization properties beyond the golden set: idempotence, saturation,
// sign symmetry, the extremes of FP32, NaN/Inf blocks, short blocks, scale rules,
// and BF16/FP16 input.
#include "mx/quantize.h"

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <limits>
#include <random>

#include "mx/element.h"
#include "mx/packed.h"
#include "tests/mx/test_util.h"

namespace {

using mx::Format;

const Format kMxFormats[] = {Format::kMxfp8E4m3, Format::kMxfp8E5m2, Format::kMxfp6E3m2,
                             Format::kMxfp6E2m3, Format::kMxfp4E2m1, Format::kMxint8};

// Blocks of many kinds: Gaussian at a random magnitude, wide dynamic range, tiny
// (FP32 subnormal), huge, and with exact zeros mixed in.
std::vector<float> RandomBlocks(int blocks, std::mt19937& rng) {
  std::normal_distribution<float> normal;
  std::uniform_int_distribution<int> exponent(-140, 120), kind(0, 3), wide(-30, 0);
  std::vector<float> values;
  for (int b = 0; b < blocks; ++b) {
    const int e = exponent(rng), k = kind(rng);
    for (int i = 0; i < mx::kBlockSize; ++i) {
      float v = std::ldexp(normal(rng), e);
      if (k == 1) v = std::ldexp(normal(rng), std::min(e + wide(rng), 126));
      if (k == 2 && i % 3 == 0) v = 0.0f;
      values.push_back(v);
    }
  }
  return values;
}

class EveryMxFormat : public testing::TestWithParam<Format> {};

TEST_P(EveryMxFormat, QuantizeDequantizeQuantizeIsIdentity) {
  const Format format = GetParam();
  std::mt19937 rng(11);
  const std::vector<float> x = RandomBlocks(400, rng);
  const int64_t n = static_cast<int64_t>(x.size());
  for (mx::Rounding rounding : {mx::Rounding::kNearestEven, mx::Rounding::kNearestAway}) {
    const mx::QuantizeOptions options{rounding, mx::ScaleRule::kFloor};
    const mx::QuantizedMatrix q = mx::QuantizeRows(x, 1, n, format, options).value();
    const mx::QuantizedMatrix again =
        mx::QuantizeRows(mx::Dequantize(q), 1, n, format, options).value();
    for (size_t b = 0; b < q.block_scales.size(); ++b) {
      // Only a block whose elements all rounded to zero may change its scale: it
      // requantizes as an all-zero block (byte 0).
      if (again.block_scales[b] != q.block_scales[b]) {
        bool zero = true;
        for (size_t i = b * 32; i < b * 32 + 32; ++i) zero &= mx::ElementValue(q, 0, i) == 0.0f;
        EXPECT_TRUE(zero) << "block " << b;
        EXPECT_EQ(again.block_scales[b], 0) << "block " << b;
      }
    }
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_TRUE(mx_test::SameValue(mx::ElementValue(again, 0, i), mx::ElementValue(q, 0, i)))
          << i;
      if (again.block_scales[i / 32] == q.block_scales[i / 32]) {
        ASSERT_EQ(mx::ElementCode(again, 0, i), mx::ElementCode(q, 0, i)) << i;
      }
    }
  }
}

TEST_P(EveryMxFormat, SignSymmetry) {
  const Format format = GetParam();
  std::mt19937 rng(12);
  const std::vector<float> x = RandomBlocks(200, rng);
  std::vector<float> negated(x.size());
  for (size_t i = 0; i < x.size(); ++i) negated[i] = -x[i];
  const int64_t n = static_cast<int64_t>(x.size());
  const mx::QuantizedMatrix q = mx::QuantizeRows(x, 1, n, format).value();
  const mx::QuantizedMatrix qn = mx::QuantizeRows(negated, 1, n, format).value();
  EXPECT_EQ(q.block_scales, qn.block_scales);
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_TRUE(mx_test::SameValue(mx::ElementValue(qn, 0, i), -mx::ElementValue(q, 0, i))) << i;
    if (mx::ElementValue(q, 0, i) != 0.0f) {
      ASSERT_EQ(std::signbit(mx::ElementValue(qn, 0, i)), !std::signbit(mx::ElementValue(q, 0, i)));
    }
  }
}

TEST_P(EveryMxFormat, TopBinadeSaturatesUnderFloorRuleOnly) {
  const Format format = GetParam();
  const mx::FormatTraits& t = mx::Traits(format);
  // A block maximum just below 2^(emax+1): under the floor rule the scale is 1 and
  // the maximum clamps to max normal; the no-saturation rule doubles the scale.
  std::array<float, 32> block{};
  block[0] = std::nextafter(std::ldexp(1.0f, t.emax + 1), 0.0f);
  block[1] = -block[0];
  block[2] = 1.0f;
  std::array<uint8_t, 32> codes;
  EXPECT_EQ(mx::QuantizeBlock(format, block, codes), 127);
  EXPECT_EQ(mx::DecodeElement(format, codes[0]), static_cast<float>(t.max_normal));
  EXPECT_EQ(mx::DecodeElement(format, codes[1]), -static_cast<float>(t.max_normal));
  EXPECT_EQ(mx::SharedExponent(format, block[0], {}), 0);

  const mx::QuantizeOptions no_saturation{mx::Rounding::kNearestEven, mx::ScaleRule::kNoSaturation};
  EXPECT_EQ(mx::QuantizeBlock(format, block, codes, no_saturation), 128);
  for (int i = 0; i < 3; ++i) {
    EXPECT_FALSE(mx::EncodeElementDetailed(format, block[i], no_saturation.rounding, 1).overflowed);
  }
  EXPECT_EQ(std::ldexp(mx::DecodeElement(format, codes[0]), 1), std::ldexp(1.0f, t.emax + 1));

  // A maximum that rounds to max normal without clamping keeps the floor scale.
  block[0] = static_cast<float>(t.max_normal);
  block[1] = 0.0f;
  EXPECT_EQ(mx::QuantizeBlock(format, block, codes, no_saturation), 127);
}

// The rules other libraries use, by known answers: amax = 1.5 and amax = 1 (a
// power of two, where CEIL and FLOOR agree) in MXFP8_E4M3 (emax 8, max normal
// 448), and the rules' edges in every MX format.
TEST(ScaleRules, KnownAnswersInMxfp8E4m3) {
  const auto e = [](float amax, mx::ScaleRule rule) {
    return mx::SharedExponent(Format::kMxfp8E4m3, amax, {mx::Rounding::kNearestEven, rule});
  };
  EXPECT_EQ(e(1.5f, mx::ScaleRule::kFloor), -8);  // floor(0.58) - 8
  EXPECT_EQ(e(1.5f, mx::ScaleRule::kCeil), -7);   // ceil(0.58) - 8
  EXPECT_EQ(e(1.5f, mx::ScaleRule::kRceil), -8);  // ceil(log2(1.5 / 448)) = ceil(-8.22)
  EXPECT_EQ(e(1.0f, mx::ScaleRule::kFloor), -8);
  EXPECT_EQ(e(1.0f, mx::ScaleRule::kCeil), -8);
  EXPECT_EQ(e(1.0f, mx::ScaleRule::kRceil), -8);  // ceil(log2(1 / 448)) = ceil(-8.81)
  // 449 · 2^k: FLOOR saturates it to 448 · 2^k, RCEIL takes the next scale.
  EXPECT_EQ(e(449.0f, mx::ScaleRule::kFloor), 0);
  EXPECT_EQ(e(449.0f, mx::ScaleRule::kRceil), 1);  // 449/448 > 1
  EXPECT_EQ(e(448.0f, mx::ScaleRule::kRceil), 0);  // exactly 1
  EXPECT_EQ(e(448.0f, mx::ScaleRule::kCeil), 1);   // ceil(8.81) - 8
  // The smallest subnormal: 2^-149 / 448 underflows to 0 in FP32.
  EXPECT_EQ(e(std::numeric_limits<float>::denorm_min(), mx::ScaleRule::kRceil), -127);
  EXPECT_EQ(e(std::numeric_limits<float>::denorm_min(), mx::ScaleRule::kCeil), -127);
  EXPECT_EQ(e(3 * std::numeric_limits<float>::denorm_min(), mx::ScaleRule::kFloor), -127);
}

TEST_P(EveryMxFormat, CeilAndRceilNeverSaturate) {
  const Format format = GetParam();
  const mx::FormatTraits& t = mx::Traits(format);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
  for (int i = 0; i < 2000; ++i) {
    const float amax = std::ldexp(mantissa(rng), static_cast<int>(rng() % 60) - 30);
    for (const mx::ScaleRule rule : {mx::ScaleRule::kCeil, mx::ScaleRule::kRceil}) {
      const mx::QuantizeOptions options{mx::Rounding::kNearestEven, rule};
      const int e = mx::SharedExponent(format, amax, options);
      // amax / 2^e <= max normal, and one scale less would not be (the smallest
      // such scale for RCEIL; CEIL may be one more).
      // (RCEIL's FP32 quotient may round down onto a power of two: a hair over.)
      EXPECT_LE(std::ldexp(static_cast<double>(amax), -e), t.max_normal * (1 + 1e-6)) << amax;
      if (rule == mx::ScaleRule::kRceil) {
        EXPECT_GT(std::ldexp(static_cast<double>(amax), 1 - e), t.max_normal * (1 - 1e-6)) << amax;
      }
      EXPECT_GE(e, mx::SharedExponent(format, amax, {}));  // never below FLOOR
      EXPECT_LE(e, mx::SharedExponent(format, amax, {}) + 1);
    }
  }
}

TEST(ScaleRules, NamesParseBackAndUnknownOnesAreRefused) {
  for (const mx::ScaleRule rule : mx::kAllScaleRules) {
    EXPECT_EQ(mx::ParseScaleRule(mx::ScaleRuleName(rule)).value(), rule);
  }
  EXPECT_EQ(mx::ParseScaleRule("RCEIL").value(), mx::ScaleRule::kRceil);
  EXPECT_EQ(mx::ParseScaleRule("nosat").status().message(),
            "unknown scale rule 'nosat'; expected floor, no_saturation, ceil or rceil");
}

TEST_P(EveryMxFormat, ScaleClampsAtTheExtremesOfFp32) {
  const Format format = GetParam();
  const int emax = mx::Traits(format).emax;
  std::array<float, 32> block{};
  std::array<uint8_t, 32> codes;
  block[5] = std::numeric_limits<float>::max();
  EXPECT_EQ(mx::QuantizeBlock(format, block, codes), 127 + 127 - emax);
  // Smallest subnormal: floor(log2) - emax = -149 - emax, clamped to -127 (byte 0);
  // at scale 2^-127 the value 2^-149 rounds to zero.
  block[5] = std::numeric_limits<float>::denorm_min();
  EXPECT_EQ(mx::QuantizeBlock(format, block, codes), 0);
  EXPECT_EQ(mx::DecodeElement(format, codes[5]), 0.0f);
  // 2^-127·min_subnormal_elem survives at the clamped scale exactly.
  const float smallest = std::ldexp(1.0f, -127 - mx::FixedPointFractionBits(format));
  block[5] = smallest;
  EXPECT_EQ(mx::QuantizeBlock(format, block, codes), 0);
  EXPECT_EQ(std::ldexp(mx::DecodeElement(format, codes[5]), -127), smallest);
}

TEST_P(EveryMxFormat, NanOrInfAnywhereMakesTheBlockNan) {
  const Format format = GetParam();
  for (float special :
       {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
        -std::numeric_limits<float>::infinity()}) {
    std::vector<float> x(70, 1.5f);
    x[40] = special;  // block 1 of 3
    const mx::QuantizedMatrix q = mx::QuantizeRows(x, 1, 70, format).value();
    const int finite_scale = 127 - mx::Traits(format).emax;  // amax 1.5
    EXPECT_EQ(q.block_scales[0], finite_scale);
    EXPECT_EQ(q.block_scales[1], mx::kScaleNan);
    EXPECT_EQ(q.block_scales[2], finite_scale);
    const std::vector<float> back = mx::Dequantize(q);
    for (int i = 0; i < 70; ++i) EXPECT_EQ(std::isnan(back[i]), i >= 32 && i < 64) << i;
  }
}

TEST_P(EveryMxFormat, ShortLastBlockIsPaddedWithZeros) {
  const Format format = GetParam();
  std::mt19937 rng(13);
  std::vector<float> x = RandomBlocks(4, rng);
  x.resize(100);
  std::vector<float> padded = x;
  padded.resize(128, 0.0f);
  const mx::QuantizedMatrix q = mx::QuantizeRows(x, 1, 100, format).value();
  const mx::QuantizedMatrix qp = mx::QuantizeRows(padded, 1, 128, format).value();
  EXPECT_EQ(q.block_scales, qp.block_scales);
  EXPECT_EQ(q.elements, qp.elements);  // the padding is stored as code 0 in both
}

TEST_P(EveryMxFormat, Bf16AndFp16InputQuantizeLikeTheirFp32Values) {
  const Format format = GetParam();
  std::mt19937 rng(14);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<uint16_t> bf16(96), fp16(96);
  std::vector<float> bf16_values(96), fp16_values(96);
  for (int i = 0; i < 96; ++i) {
    bf16[i] = mx::FloatToBf16(normal(rng));
    fp16[i] = mx::FloatToFp16(normal(rng));
    bf16_values[i] = mx::Bf16ToFloat(bf16[i]);
    fp16_values[i] = mx::Fp16ToFloat(fp16[i]);
  }
  const auto from_bf16 =
      mx::QuantizeRows(std::span<const uint16_t>(bf16), Format::kBf16, 3, 32, format).value();
  const auto from_fp16 =
      mx::QuantizeRows(std::span<const uint16_t>(fp16), Format::kFp16, 3, 32, format).value();
  EXPECT_EQ(from_bf16.elements, mx::QuantizeRows(bf16_values, 3, 32, format).value().elements);
  EXPECT_EQ(from_fp16.elements, mx::QuantizeRows(fp16_values, 3, 32, format).value().elements);
  EXPECT_EQ(from_fp16.block_scales,
            mx::QuantizeRows(fp16_values, 3, 32, format).value().block_scales);
  EXPECT_FALSE(
      mx::QuantizeRows(std::span<const uint16_t>(fp16), Format::kFp32, 3, 32, format).ok());
}

INSTANTIATE_TEST_SUITE_P(Formats, EveryMxFormat, testing::ValuesIn(kMxFormats),
                         [](const auto& info) { return std::string(mx::FormatName(info.param)); });

TEST(Quantize, RoundingModesDifferOnlyOnTies) {
  // Scale 1 (max 4 = 2^emax); 0.25 lies midway between the E2M1 codes 0 and 0.5,
  // 2.5 between 2 and 3, 0.3 is no tie.
  std::array<float, 4> block = {4.0f, 0.25f, 2.5f, 0.3f};
  std::array<uint8_t, 4> even, away;
  ASSERT_EQ(mx::QuantizeBlock(Format::kMxfp4E2m1, block, even), 127);
  mx::QuantizeBlock(Format::kMxfp4E2m1, block, away,
                    {mx::Rounding::kNearestAway, mx::ScaleRule::kFloor});
  EXPECT_EQ(mx::DecodeElement(Format::kMxfp4E2m1, even[1]), 0.0f);
  EXPECT_EQ(mx::DecodeElement(Format::kMxfp4E2m1, away[1]), 0.5f);
  EXPECT_EQ(mx::DecodeElement(Format::kMxfp4E2m1, even[2]), 2.0f);
  EXPECT_EQ(mx::DecodeElement(Format::kMxfp4E2m1, away[2]), 3.0f);
  EXPECT_EQ(even[3], away[3]);
}

TEST(Quantize, FloorLog2IsExactBelowPowersOfTwo) {
  // log2 in floating point rounds these up to the next integer; the bits do not.
  EXPECT_EQ(mx::FloorLog2(std::nextafter(2.0f, 0.0f)), 0);
  EXPECT_EQ(mx::FloorLog2(std::nextafter(std::ldexp(1.0f, 100), 0.0f)), 99);
  EXPECT_EQ(mx::FloorLog2(std::numeric_limits<float>::denorm_min()), -149);
  EXPECT_EQ(mx::FloorLog2(std::ldexp(1.5f, -140)), -140);
  EXPECT_EQ(mx::FloorLog2(-std::ldexp(1.0f, -126)), -126);
}

TEST(Quantize, Int8RowsUseOneSymmetricScale) {
  const std::vector<float> x = {1.0f, -2.0f, 0.5f, 0.0f, 254.0f, -127.0f, 0.0f, 0.0f};
  const mx::QuantizedMatrix q = mx::QuantizeRows(x, 2, 4, Format::kInt8).value();
  EXPECT_EQ(q.row_scales[0], 2.0f / 127.0f);
  EXPECT_EQ(q.row_scales[1], 2.0f);
  EXPECT_EQ(static_cast<int8_t>(mx::ElementCode(q, 0, 1)), -127);
  EXPECT_EQ(static_cast<int8_t>(mx::ElementCode(q, 1, 0)), 127);
  EXPECT_EQ(mx::ElementValue(q, 1, 1), -128.0f);  // -63.5 rounds to even: -64
  const std::vector<float> bad = {1.0f, std::numeric_limits<float>::quiet_NaN()};
  EXPECT_TRUE(std::isnan(mx::QuantizeRows(bad, 1, 2, Format::kInt8).value().row_scales[0]));
}

}  // namespace
