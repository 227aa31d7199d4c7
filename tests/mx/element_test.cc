// Element codes: exhaustive round trips, ties, saturation and specials.
#include "mx/element.h"

#include <gtest/gtest.h>

#include <immintrin.h>

#include <bit>
#include <cmath>
#include <limits>
#include <random>

#include "mx/kernels/cpu_features.h"

namespace {

using mx::Format;
using mx::Rounding;

const Format kCodedFormats[] = {Format::kMxfp8E4m3, Format::kMxfp8E5m2, Format::kMxfp6E3m2,
                                Format::kMxfp6E2m3, Format::kMxfp4E2m1, Format::kMxint8,
                                Format::kInt8,      Format::kBf16,      Format::kFp16};

class EveryCode : public testing::TestWithParam<Format> {};

// Every code decodes to a value that encodes back to the same code: NaN codes to
// NaN, the two zeros to themselves. The integer formats' 0x80 (MXINT8 -2.0, INT8
// -128) is the one code the encoder never produces: it clamps back to -127 (0x81).
TEST_P(EveryCode, DecodesAndEncodesBack) {
  const Format format = GetParam();
  for (uint32_t code = 0; code < mx::CodeCount(format); ++code) {
    const float v = mx::DecodeElement(format, code);
    const mx::EncodeResult back = mx::EncodeElementDetailed(format, v, Rounding::kNearestEven);
    if (std::isnan(v)) {
      EXPECT_TRUE(mx::IsSpecialCode(format, code)) << code;
      EXPECT_TRUE(std::isnan(mx::DecodeElement(format, back.code))) << code;
      continue;
    }
    if ((format == Format::kMxint8 || format == Format::kInt8) && code == 0x80) {
      EXPECT_EQ(v, format == Format::kMxint8 ? -2.0f : -128.0f);
      EXPECT_EQ(back.code, 0x81u);
      continue;
    }
    EXPECT_EQ(back.code, code) << "code " << code << " value " << v;
    EXPECT_EQ(std::signbit(v), std::signbit(mx::DecodeElement(format, back.code)));
    EXPECT_EQ(mx::IsSpecialCode(format, code), std::isinf(v)) << code;
  }
}

// Between two adjacent non-negative values, the midpoint goes to the one with the
// even code under ties-to-even and to the larger under ties-away; one FP32 ulp off
// the midpoint goes to the nearer value in both modes. Checked for every pair.
TEST_P(EveryCode, MidpointsRoundPerMode) {
  const Format format = GetParam();
  if (format == Format::kBf16 || format == Format::kFp16) return;  // covered by the FP16/BF16 tests
  std::vector<std::pair<float, uint32_t>> values;  // non-negative finite values with their codes
  for (uint32_t code = 0; code < mx::CodeCount(format); ++code) {
    const float v = mx::DecodeElement(format, code);
    if (std::isfinite(v) && !std::signbit(v)) values.emplace_back(v, code);
  }
  std::sort(values.begin(), values.end());
  for (size_t i = 0; i + 1 < values.size(); ++i) {
    const auto [low, low_code] = values[i];
    const auto [high, high_code] = values[i + 1];
    const float mid = (low + high) / 2;  // exact: a few significant bits
    ASSERT_EQ(double{mid}, (double{low} + double{high}) / 2);
    const uint32_t even_code = (low_code & 1) == 0 ? low_code : high_code;
    EXPECT_EQ(mx::EncodeElement(format, mid, Rounding::kNearestEven), even_code) << mid;
    EXPECT_EQ(mx::EncodeElement(format, mid, Rounding::kNearestAway), high_code) << mid;
    for (Rounding r : {Rounding::kNearestEven, Rounding::kNearestAway}) {
      EXPECT_EQ(mx::EncodeElement(format, std::nextafter(mid, 0.0f), r), low_code) << mid;
      EXPECT_EQ(mx::EncodeElement(format, std::nextafter(mid, INFINITY), r), high_code) << mid;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, EveryCode, testing::ValuesIn(kCodedFormats),
                         [](const auto& info) { return std::string(mx::FormatName(info.param)); });

TEST(Element, MxElementsSaturateKeepingSign) {
  for (Format format : {Format::kMxfp8E4m3, Format::kMxfp8E5m2, Format::kMxfp6E3m2,
                        Format::kMxfp6E2m3, Format::kMxfp4E2m1, Format::kMxint8}) {
    const double max_normal = mx::Traits(format).max_normal;
    // Within half a step above max normal the value rounds to it: no clamping.
    const float just_above = static_cast<float>(max_normal + mx::Traits(format).min_subnormal / 4);
    EXPECT_FALSE(mx::EncodeElementDetailed(format, just_above, Rounding::kNearestEven).overflowed);
    EXPECT_EQ(mx::DecodeElement(format, mx::EncodeElement(format, just_above)),
              static_cast<float>(max_normal));
    for (float v : {static_cast<float>(max_normal * 1.2), static_cast<float>(max_normal * 1e6),
                    std::numeric_limits<float>::max()}) {
      const mx::EncodeResult pos = mx::EncodeElementDetailed(format, v, Rounding::kNearestEven);
      const mx::EncodeResult neg = mx::EncodeElementDetailed(format, -v, Rounding::kNearestEven);
      EXPECT_TRUE(pos.overflowed);
      EXPECT_EQ(mx::DecodeElement(format, pos.code), static_cast<float>(max_normal));
      EXPECT_EQ(mx::DecodeElement(format, neg.code), -static_cast<float>(max_normal));
    }
    // Exactly max normal is not an overflow.
    EXPECT_FALSE(
        mx::EncodeElementDetailed(format, static_cast<float>(max_normal), Rounding::kNearestEven)
            .overflowed);
  }
  // E4M3: 464 is the midpoint of 448 and the (NaN) next code; it rounds to 448.
  EXPECT_EQ(mx::EncodeElement(Format::kMxfp8E4m3, 464.0f), 0x7Eu);
}

TEST(Element, SpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(mx::EncodeElement(Format::kMxfp8E5m2, inf), 0x7Cu);
  EXPECT_EQ(mx::EncodeElement(Format::kMxfp8E5m2, -inf), 0xFCu);
  EXPECT_TRUE(std::isnan(
      mx::DecodeElement(Format::kMxfp8E5m2, mx::EncodeElement(Format::kMxfp8E5m2, nan))));
  EXPECT_EQ(mx::EncodeElement(Format::kMxfp8E4m3, nan), 0x7Fu);
  EXPECT_EQ(mx::EncodeElement(Format::kMxfp8E4m3, -nan), 0xFFu);
  EXPECT_EQ(mx::EncodeElement(Format::kMxfp8E4m3, inf), 0x7Eu);    // no Inf: saturates
  EXPECT_EQ(mx::EncodeElement(Format::kMxfp4E2m1, nan), 0u);       // no NaN: the scale carries it
  EXPECT_EQ(mx::EncodeElement(Format::kFp16, 1e6f), 0x7C00u);      // IEEE overflow
  EXPECT_EQ(mx::EncodeElement(Format::kFp16, 65519.0f), 0x7BFFu);  // just below the rounding edge
  EXPECT_EQ(mx::EncodeElement(Format::kFp16, 65520.0f), 0x7C00u);  // the tie rounds to Inf
  EXPECT_EQ(mx::EncodeElement(Format::kMxfp4E2m1, -0.0f), 0x8u);   // -0 keeps its sign
  EXPECT_EQ(mx::EncodeElement(Format::kMxfp4E2m1, -0.2f), 0x8u);   // rounds to -0
}

TEST(Element, ScaleExponentDividesExactly) {
  // 3 · 2^100 scaled by 2^99 is 6 = E2M1 max normal; by 2^100 it is 3.
  const float v = std::ldexp(3.0f, 100);
  EXPECT_EQ(mx::DecodeElement(Format::kMxfp4E2m1,
                              mx::EncodeElement(Format::kMxfp4E2m1, v, Rounding::kNearestEven, 99)),
            6.0f);
  EXPECT_EQ(mx::DecodeElement(Format::kMxfp4E2m1, mx::EncodeElement(Format::kMxfp4E2m1, v,
                                                                    Rounding::kNearestEven, 100)),
            3.0f);
  // An FP32 subnormal scaled up: 2^-149 / 2^-152 = 8.
  EXPECT_EQ(mx::DecodeElement(
                Format::kMxfp8E4m3,
                mx::EncodeElement(Format::kMxfp8E4m3, std::numeric_limits<float>::denorm_min(),
                                  Rounding::kNearestEven, -152)),
            8.0f);
}

// An FP16 conversion that is not ours: the compiler's _Float16 where it has
// one (GCC), the CPU's F16C instructions where it does not (clang 14 on x86).
#if defined(__FLT16_MAX__)
uint16_t OtherFloatToFp16(float v) { return std::bit_cast<uint16_t>(static_cast<_Float16>(v)); }
float OtherFp16ToFloat(uint16_t h) { return static_cast<float>(std::bit_cast<_Float16>(h)); }
bool HaveOtherFp16() { return true; }
#else
__attribute__((target("f16c"))) uint16_t OtherFloatToFp16(float v) {
  return _cvtss_sh(v, _MM_FROUND_TO_NEAREST_INT);
}
__attribute__((target("f16c"))) float OtherFp16ToFloat(uint16_t h) { return _cvtsh_ss(h); }
// The avx2 level includes F16C (mx/kernels/cpu_features.h).
bool HaveOtherFp16() { return mx::kernels::CpuSupports() >= mx::kernels::Isa::kAvx2; }
#endif

// FP16 against an independent conversion, BF16 against the textbook bit
// trick, on every FP32 pattern of a strided sweep plus random ones.
TEST(Element, Fp16AndBf16MatchIndependentConversions) {
  if (!HaveOtherFp16()) GTEST_SKIP() << "no _Float16 in this compiler and no F16C in this CPU";
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> any_bits;
  for (int i = 0; i < 2'000'000; ++i) {
    const uint32_t bits = i < 1'000'000 ? static_cast<uint32_t>(i) * 4295u : any_bits(rng);
    const float v = std::bit_cast<float>(bits);
    const uint16_t h = OtherFloatToFp16(v);
    const uint16_t fp16 = mx::FloatToFp16(v);
    if (std::isnan(v)) {
      EXPECT_TRUE(std::isnan(mx::Fp16ToFloat(fp16)));
      EXPECT_TRUE(std::isnan(mx::Bf16ToFloat(mx::FloatToBf16(v))));
      continue;
    }
    ASSERT_EQ(fp16, h) << "v = " << v << " bits " << bits;
    ASSERT_EQ(mx::Fp16ToFloat(fp16), OtherFp16ToFloat(h));
    const uint32_t rounded = bits + 0x7FFF + ((bits >> 16) & 1);  // RNE on the top half
    ASSERT_EQ(mx::FloatToBf16(v), static_cast<uint16_t>(rounded >> 16)) << "bits " << bits;
  }
}

TEST(Element, FixedPointViewMatchesValues) {
  for (Format format : {Format::kMxfp8E4m3, Format::kMxfp8E5m2, Format::kMxfp6E3m2,
                        Format::kMxfp6E2m3, Format::kMxfp4E2m1, Format::kMxint8}) {
    const int fraction_bits = mx::FixedPointFractionBits(format);
    for (uint32_t code = 0; code < mx::CodeCount(format); ++code) {
      if (mx::IsSpecialCode(format, code)) continue;
      const double value = mx::DecodeElement(format, code);
      EXPECT_EQ(std::ldexp(static_cast<double>(mx::ElementToFixed(format, code)), -fraction_bits),
                value)
          << mx::FormatName(format) << " code " << code;
    }
  }
}

}  // namespace
