// The reference GEMM against an independent exact computation: MPFR at 256 bits
// holds every per-block dot product exactly (each product of two dequantized MX
// values has at most 8 significant bits, and one block's products span well under
// 200 binades), and mpfr_get_flt rounds it once to FP32, subnormals included.
#include "mx/reference_gemm.h"

#include <gtest/gtest.h>
#include <mpfr.h>

#include <bit>
#include <cmath>
#include <limits>
#include <random>

#include "mx/element.h"
#include "tests/mx/test_util.h"

namespace {

using mx::Format;

const Format kMxFormats[] = {Format::kMxfp8E4m3, Format::kMxfp8E5m2, Format::kMxfp6E3m2,
                             Format::kMxfp6E2m3, Format::kMxfp4E2m1, Format::kMxint8};

class Mpfr {
 public:
  Mpfr() {
    mpfr_init2(value_, 256);
    mpfr_set_zero(value_, 1);
  }
  ~Mpfr() { mpfr_clear(value_); }
  Mpfr(const Mpfr&) = delete;
  mpfr_ptr get() { return value_; }

 private:
  mpfr_t value_;
};

// The contract, computed from the dequantized operands by other means.
std::vector<float> ExactOracle(const mx::QuantizedMatrix& x, const mx::QuantizedMatrix& w,
                               const std::vector<float>& bias) {
  const std::vector<float> xd = mx::Dequantize(x), wd = mx::Dequantize(w);
  const int64_t k = x.cols;
  std::vector<float> y(x.rows * w.rows);
  Mpfr sum, a, b, product;
  for (int64_t i = 0; i < x.rows; ++i) {
    for (int64_t j = 0; j < w.rows; ++j) {
      float acc = bias.empty() ? 0.0f : bias[j];
      for (int64_t start = 0; start < k; start += 32) {
        mpfr_set_zero(sum.get(), 1);
        bool nan = false;
        for (int64_t c = start; c < std::min(k, start + 32); ++c) {
          const float xv = xd[i * k + c], wv = wd[j * k + c];
          nan |= std::isnan(xv) || std::isnan(wv);
          if (nan) break;
          mpfr_set_flt(a.get(), xv, MPFR_RNDN);
          mpfr_set_flt(b.get(), wv, MPFR_RNDN);
          EXPECT_EQ(mpfr_mul(product.get(), a.get(), b.get(), MPFR_RNDN), 0);      // exact
          EXPECT_EQ(mpfr_add(sum.get(), sum.get(), product.get(), MPFR_RNDN), 0);  // exact
        }
        acc += nan ? std::numeric_limits<float>::quiet_NaN() : mpfr_get_flt(sum.get(), MPFR_RNDN);
      }
      y[i * w.rows + j] = acc;
    }
  }
  return y;
}

// Rows whose magnitudes are drawn from a range: 0 ordinary, 1 near FP32 overflow
// (block results overflow to Inf), 2 tiny and 3 small (their products land in the
// subnormal range, where the single rounding matters most), 4 near one; with
// optional NaNs sprinkled in.
std::vector<float> RandomMatrix(int64_t rows, int64_t cols, int mode, bool with_nan,
                                std::mt19937& rng) {
  std::normal_distribution<float> normal;
  std::uniform_int_distribution<int> ordinary(-40, 40), huge(100, 126), tiny(-120, -100),
      small(-30, -10), unit(-2, 2);
  std::bernoulli_distribution rare(0.01);
  std::vector<float> m(rows * cols);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const int e = mode == 0   ? ordinary(rng)
                    : mode == 1 ? huge(rng)
                    : mode == 2 ? tiny(rng)
                    : mode == 3 ? small(rng)
                                : unit(rng);
      float v = std::ldexp(normal(rng), c % 32 == 0 ? e : e / 2 * 2);
      if (with_nan && rare(rng)) v = std::numeric_limits<float>::quiet_NaN();
      m[r * cols + c] = v;
    }
  }
  return m;
}

TEST(ReferenceGemm, MatchesExactOracleOnRandomShapesAndFormatPairs) {
  std::mt19937 rng(2024);
  const int64_t ks[] = {1, 5, 31, 32, 33, 64, 100, 160};
  std::uniform_int_distribution<int> dim(1, 6), pick_k(0, 7), pick_format(0, 5), mode(0, 2);
  int compared = 0, nonfinite = 0, subnormal = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const Format fx = kMxFormats[pick_format(rng)], fw = kMxFormats[pick_format(rng)];
    const int64_t m = dim(rng), n = dim(rng), k = ks[pick_k(rng)];
    const int mx_mode = mode(rng);
    const std::vector<float> a = RandomMatrix(m, k, mx_mode, trial % 5 == 0, rng);
    const std::vector<float> wt = RandomMatrix(n, k, mx_mode == 2 ? 3 : mx_mode, false, rng);
    std::vector<float> bias;
    if (trial % 2) bias = RandomMatrix(1, n, 0, false, rng);
    const mx::QuantizedMatrix x = mx::QuantizeRows(a, m, k, fx).value();
    const mx::QuantizedMatrix w = mx::QuantizeRows(wt, n, k, fw).value();
    const std::vector<float> ours = mx::ReferenceLinear(x, w, bias).value();
    const std::vector<float> oracle = ExactOracle(x, w, bias);
    for (size_t i = 0; i < ours.size(); ++i) {
      ASSERT_TRUE(std::isnan(oracle[i])
                      ? std::isnan(ours[i])
                      : std::bit_cast<uint32_t>(ours[i]) == std::bit_cast<uint32_t>(oracle[i]))
          << mx::FormatName(fx) << " x " << mx::FormatName(fw) << " " << m << "x" << n << "x" << k
          << " trial " << trial << " y[" << i << "] = " << ours[i] << ", exact " << oracle[i];
      ++compared;
      nonfinite += !std::isfinite(ours[i]);
      subnormal += std::fpclassify(ours[i]) == FP_SUBNORMAL;
    }
  }
  // The sweep must actually reach the edge cases it is meant to cover.
  EXPECT_GT(compared, 3000);
  EXPECT_GT(nonfinite, 50);
  EXPECT_GT(subnormal, 20);
}

TEST(ReferenceGemm, RoundScaledToFloatIsCorrectlyRounded) {
  std::mt19937_64 rng(5);
  std::uniform_int_distribution<int> bits(1, 100), exponent(-300, 100);
  Mpfr exact;
  for (int trial = 0; trial < 200000; ++trial) {
    const int width = bits(rng);
    unsigned __int128 magnitude = (static_cast<unsigned __int128>(rng()) << 64) | rng();
    magnitude >>= 128 - width;
    // Make exact ties common: clear low bits so the value sits on a midpoint.
    if (trial % 3 == 0 && width > 26) magnitude = (magnitude >> (width - 25)) << (width - 25);
    const __int128 value =
        trial % 2 ? -static_cast<__int128>(magnitude) : static_cast<__int128>(magnitude);
    const int e = exponent(rng);
    mpfr_set_ui_2exp(exact.get(), static_cast<unsigned long>(magnitude >> 64), 64, MPFR_RNDN);
    Mpfr low;
    mpfr_set_ui(low.get(), static_cast<unsigned long>(magnitude), MPFR_RNDN);
    mpfr_add(exact.get(), exact.get(), low.get(), MPFR_RNDN);
    if (value < 0) mpfr_neg(exact.get(), exact.get(), MPFR_RNDN);
    mpfr_mul_2si(exact.get(), exact.get(), e, MPFR_RNDN);
    const float expected = mpfr_get_flt(exact.get(), MPFR_RNDN);
    const float got = mx::RoundScaledToFloat(value, e);
    ASSERT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(expected))
        << "width " << width << " exponent " << e << ": " << got << " vs " << expected;
  }
}

TEST(ReferenceGemm, E5m2TimesE5m2AtFullRangeIsExact) {
  // The widest accumulator case: 32 products of ±57344·2^-16-step elements.
  std::vector<float> a(32), b(32);
  for (int i = 0; i < 32; ++i) {
    a[i] = i % 2 ? 57344.0f : std::ldexp(1.0f, -16);  // max normal and min subnormal
    b[i] = i % 3 ? -57344.0f : 57344.0f;
  }
  const auto x = mx::QuantizeRows(a, 1, 32, Format::kMxfp8E5m2).value();
  const auto w = mx::QuantizeRows(b, 1, 32, Format::kMxfp8E5m2).value();
  EXPECT_EQ(mx::ReferenceLinear(x, w).value()[0], ExactOracle(x, w, {})[0]);
}

TEST(ReferenceGemm, NanScaleBlocksPoisonTheirOutputsOnly) {
  std::vector<float> a(2 * 64, 1.0f);
  a[64 + 40] = std::numeric_limits<float>::quiet_NaN();  // row 1, block 1
  const std::vector<float> w(3 * 64, 0.5f);
  const auto x = mx::QuantizeRows(a, 2, 64, Format::kMxfp4E2m1).value();
  const auto wq = mx::QuantizeRows(w, 3, 64, Format::kMxfp8E4m3).value();
  const std::vector<float> y = mx::ReferenceLinear(x, wq).value();
  for (int j = 0; j < 3; ++j) {
    EXPECT_EQ(y[j], 32.0f);
    EXPECT_TRUE(std::isnan(y[3 + j]));
  }
}

TEST(ReferenceGemm, SpecialElementCodesSentPackedFollowIeee) {
  // A client may send packed operands; E5M2 can hold Inf and NaN codes.
  mx::QuantizedMatrix x =
      mx::QuantizeRows(std::vector<float>(32, 1.0f), 1, 32, Format::kMxfp8E5m2).value();
  const mx::QuantizedMatrix w =
      mx::QuantizeRows(std::vector<float>(32, 1.0f), 1, 32, Format::kMxfp8E5m2).value();
  x.elements[3] = 0x7C;  // +Inf
  EXPECT_EQ(mx::ReferenceLinear(x, w).value()[0], std::numeric_limits<float>::infinity());
  x.elements[4] = 0xFC;  // -Inf: Inf - Inf
  EXPECT_TRUE(std::isnan(mx::ReferenceLinear(x, w).value()[0]));
  mx::QuantizedMatrix e4 =
      mx::QuantizeRows(std::vector<float>(32, 1.0f), 1, 32, Format::kMxfp8E4m3).value();
  e4.elements[0] = 0x7F;  // E4M3 NaN
  EXPECT_TRUE(std::isnan(mx::ReferenceLinear(e4, w).value()[0]));
}

// Padding codes are elements: an Inf or NaN a client packs into a short last
// block's padding counts as one in the real columns would. Once it gave the
// finite dot of the real columns, summed in double and rounded twice.
TEST(ReferenceGemm, SpecialCodesInThePaddingCount) {
  const auto e5m2 = [](int64_t cols, float value) {
    return mx::QuantizeRows(std::vector<float>(cols, value), 1, cols, Format::kMxfp8E5m2).value();
  };
  // K = 3, scale 2^0: the real dot is 3 · 1.5 · 1.25 = 5.625.
  mx::QuantizedMatrix x = e5m2(3, 1.5f), w = e5m2(3, 1.25f);
  ASSERT_EQ(mx::ReferenceLinear(x, w).value()[0], 5.625f);
  x.elements[20] = 0x7C;  // +Inf at padding column 20, whose W code is 0: Inf · 0
  EXPECT_TRUE(std::isnan(mx::ReferenceLinear(x, w).value()[0]));
  w.elements[20] = 0x3C;  // W's padding now 1.0 there: +Inf · 1
  EXPECT_EQ(mx::ReferenceLinear(x, w).value()[0], std::numeric_limits<float>::infinity());
  w.elements[20] = 0xBC;  // -1.0: -Inf
  EXPECT_EQ(mx::ReferenceLinear(x, w).value()[0], -std::numeric_limits<float>::infinity());
  x.elements[20] = 0x7E;  // NaN
  EXPECT_TRUE(std::isnan(mx::ReferenceLinear(x, w).value()[0]));
}

TEST(ReferenceGemm, BlockSumStartsFromBiasInAscendingOrder) {
  // Three blocks whose results are 2^24, 1, 1: summed in order from bias -2^24
  // the result is exact 2; a different order or a bias added last would differ.
  std::vector<float> a(96, 0.0f), w(96, 0.0f);
  a[0] = std::ldexp(1.0f, 24);
  a[32] = 1.0f;
  a[64] = 1.0f;
  w[0] = 1.0f;
  w[32] = 1.0f;
  w[64] = 1.0f;
  const auto x = mx::QuantizeRows(a, 1, 96, Format::kMxfp8E4m3).value();
  const auto wq = mx::QuantizeRows(w, 1, 96, Format::kMxfp8E4m3).value();
  const std::vector<float> bias = {-std::ldexp(1.0f, 24)};
  EXPECT_EQ(mx::ReferenceLinear(x, wq, bias).value()[0], 2.0f);
  // Without bias: 2^24 + 1 rounds to 2^24 (tie to even), twice.
  EXPECT_EQ(mx::ReferenceLinear(x, wq).value()[0], std::ldexp(1.0f, 24));
}

TEST(ReferenceGemm, Int8IsExactDotThenOneScaleStep) {
  std::mt19937 rng(9);
  const int64_t m = 3, k = 77, n = 4;
  const std::vector<float> a = RandomMatrix(m, k, 0, false, rng);
  const std::vector<float> b = RandomMatrix(k, n, 0, false, rng);
  const auto qa = mx::QuantizeRows(a, m, k, Format::kInt8).value();
  const auto qb = mx::QuantizeColumns(b, k, n, Format::kInt8).value();
  const std::vector<float> bias = {1.0f, -2.0f, 0.5f, 0.0f};
  const std::vector<float> y = mx::ReferenceLinear(qa, qb, bias).value();
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      int32_t dot = 0;
      for (int64_t c = 0; c < k; ++c) {
        dot += static_cast<int8_t>(qa.elements[i * k + c]) *
               static_cast<int8_t>(qb.elements[j * k + c]);
      }
      const float expected =
          static_cast<float>(dot) * qa.row_scales[i] * qb.row_scales[j] + bias[j];
      EXPECT_EQ(y[i * n + j], expected);
    }
  }
  EXPECT_EQ(mx::GemmPathFor(Format::kInt8, Format::kInt8), mx::GemmPath::kInt8);
}

TEST(ReferenceGemm, FloatFormatsAgreeWithFp64WithinTolerance) {
  std::mt19937 rng(10);
  const int64_t m = 5, k = 300, n = 6;
  const std::vector<float> a = RandomMatrix(m, k, 4, false, rng);  // in FP16's range
  const std::vector<float> b = RandomMatrix(k, n, 4, false, rng);
  const std::pair<Format, Format> pairs[] = {{Format::kFp32, Format::kFp32},
                                             {Format::kBf16, Format::kBf16},
                                             {Format::kFp16, Format::kFp16},
                                             {Format::kMxfp8E4m3, Format::kBf16},
                                             {Format::kInt8, Format::kMxfp4E2m1}};
  for (const auto& [fa, fb] : pairs) {
    ASSERT_EQ(mx::GemmPathFor(fa, fb), mx::GemmPath::kFloat);
    const auto qa = mx::QuantizeRows(a, m, k, fa).value();
    const auto qb = mx::QuantizeColumns(b, k, n, fb).value();
    const std::vector<float> ad = mx::Dequantize(qa), bd = mx::Dequantize(qb);
    const std::vector<float> y = mx::ReferenceGemm(a, fa, b, fb, m, k, n).value();
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double exact = 0.0, magnitude = 0.0;
        for (int64_t c = 0; c < k; ++c) {
          exact += double{ad[i * k + c]} * bd[j * k + c];
          magnitude += std::fabs(double{ad[i * k + c]} * bd[j * k + c]);
        }
        EXPECT_LE(std::fabs(y[i * n + j] - exact), k * std::ldexp(1.0, -24) * magnitude)
            << mx::FormatName(fa) << " x " << mx::FormatName(fb);
      }
    }
  }
}

TEST(ReferenceGemm, ShapeErrorsNameTheField) {
  const auto x = mx::QuantizeRows(std::vector<float>(64), 2, 32, Format::kMxfp8E4m3).value();
  const auto w = mx::QuantizeRows(std::vector<float>(64), 1, 64, Format::kMxfp8E4m3).value();
  const auto mismatch = mx::ReferenceLinear(x, w);
  EXPECT_EQ(mismatch.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(mismatch.status().message(), "w: expected K = 32 columns to match x, got 64");
  const std::vector<float> bias(5);
  EXPECT_EQ(mx::ReferenceLinear(x, x, bias).status().message(),
            "bias: expected 2 values (one per row of w), got 5");
  EXPECT_EQ(mx::ReferenceGemm(std::vector<float>(3), Format::kFp32, std::vector<float>(4),
                              Format::kFp32, 2, 2, 2)
                .status()
                .message(),
            "a values: expected 2x2 = 4 values, got 3");
}

TEST(ColumnSums, AddsRowsInAscendingOrderFromPositiveZero) {
  // FP32 addition does not associate: 1e8 + 1 rounds back to 1e8, so the
  // ascending order gives 0 for column 0, where adding the last two rows first
  // would give 1. Column 1 shows the +0 start: -0 + -0 is -0, but +0 + -0 is +0.
  const std::vector<float> dy = {1e8f,  -0.0f,  //
                                 1.0f,  -0.0f,  //
                                 -1e8f, -0.0f};
  const std::vector<float> sums = mx::ColumnSums(dy, 3, 2);
  ASSERT_EQ(sums.size(), 2u);
  EXPECT_EQ(std::bit_cast<uint32_t>(sums[0]), std::bit_cast<uint32_t>(0.0f));
  EXPECT_EQ(std::bit_cast<uint32_t>(sums[1]), 0u);  // +0, not -0
  EXPECT_EQ(mx::ColumnSums(dy, 0, 2), (std::vector<float>{0.0f, 0.0f}));
}

}  // namespace
