// The fast GEMM kernels against mx::ReferenceLinear, bit for bit, at every ISA
// level this machine can run.
#include "mx/kernels/linear.h"

#include <gtest/gtest.h>

#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <limits>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "mx/element.h"
#include "mx/packed.h"
#include "mx/reference_gemm.h"
#include "tests/mx/kernels/linear_test_util.h"

namespace mx::kernels {
namespace {

class LinearAtIsa : public ::testing::TestWithParam<Isa> {};

std::string IsaParamName(const ::testing::TestParamInfo<Isa>& info) {
  return std::string(IsaName(info.param));
}

INSTANTIATE_TEST_SUITE_P(Available, LinearAtIsa, ::testing::ValuesIn(AvailableIsas().begin(),
                                                                      AvailableIsas().end()),
                         IsaParamName);

// Every MX pair, awkward shapes (M = 1, N and K not multiples of 16 or 32), bias
// on and off.
TEST_P(LinearAtIsa, EveryMxPairMatchesReference) {
  struct Shape {
    int64_t m, n, k;
  };
  const Shape shapes[] = {{1, 1, 1}, {1, 17, 33}, {3, 16, 32}, {5, 40, 100}, {9, 33, 64}};
  uint32_t seed = 1;
  for (Format fx : kMxFormats) {
    for (Format fw : kMxFormats) {
      for (const Shape& s : shapes) {
        for (bool with_bias : {false, true}) {
          const auto x = Quantize(Gaussian(s.m * s.k, ++seed, 3.0f), s.m, s.k, fx);
          const auto w = Quantize(Gaussian(s.n * s.k, ++seed, 0.05f), s.n, s.k, fw);
          const std::vector<float> bias = with_bias ? Gaussian(s.n, ++seed) : std::vector<float>{};
          ExpectSameAsReference(x, w, bias, GetParam(),
                                absl::StrCat(FormatName(fx), " x ", FormatName(fw), " ", s.m, "x",
                                             s.n, "x", s.k, with_bias ? " +bias" : ""));
        }
      }
    }
  }
}

TEST_P(LinearAtIsa, Int8AndFloatFormatsMatchReference) {
  const Format formats[] = {Format::kInt8, Format::kBf16, Format::kFp16, Format::kFp32,
                            Format::kMxfp4E2m1};
  uint32_t seed = 100;
  for (Format fx : formats) {
    for (Format fw : formats) {
      if (IsMx(fx) && IsMx(fw)) continue;
      for (bool with_bias : {false, true}) {
        const int64_t m = 5, n = 19, k = 70;
        const auto x = Quantize(Gaussian(m * k, ++seed), m, k, fx);
        const auto w = Quantize(Gaussian(n * k, ++seed, 0.1f), n, k, fw);
        const std::vector<float> bias = with_bias ? Gaussian(n, ++seed) : std::vector<float>{};
        ExpectSameAsReference(x, w, bias, GetParam(),
                              absl::StrCat(FormatName(fx), " x ", FormatName(fw)));
      }
    }
  }
}

// The extremes of the integer kinds' byte paths: every element −128 (a client's
// own packing; the quantizers stop at ±127), where w + 128 is 0 and the offset
// correction carries the whole dot. INT8 at the largest K whose dot fits int32
// (128 · 128 · 131071 < 2^31) runs the kernels; one more column could reach
// 2^31 and goes to the reference. MXINT8 × MXINT8 with the largest scales
// whose results stay finite.
TEST_P(LinearAtIsa, Int8AndMxint8MinusOneTwentyEightEverywhere) {
  const auto int8 = AllMinus128Int8;
  const auto mxint8 = AllMinus128Mxint8;
  const int64_t k_max = 131071;
  KernelInfo info;
  ExpectSameAsReference(int8(2, k_max, 0x1p-20f), int8(17, k_max, 0x1p-3f), Gaussian(17, 5),
                        GetParam(), "INT8 -128, K = 131071", nullptr, &info);
  EXPECT_EQ(info.name, KernelNameFor(Format::kInt8, Format::kInt8, GetParam()));
  EXPECT_EQ(ReferenceLinear(int8(1, k_max, 1.0f), int8(1, k_max, 1.0f)).value()[0],
            128.0f * 128.0f * k_max);
  ExpectSameAsReference(int8(1, k_max + 1, 1.0f), int8(3, k_max + 1, 1.0f), {}, GetParam(),
                        "INT8 -128, K = 131072", nullptr, &info);
  EXPECT_EQ(info.name, "reference");

  ExpectSameAsReference(mxint8(9, 100, 170), mxint8(18, 100, 140), Gaussian(18, 6), GetParam(),
                        "MXINT8 -128", nullptr, &info);
  EXPECT_EQ(info.name, KernelNameFor(Format::kMxint8, Format::kMxint8, GetParam()));
}

// BF16/FP16/FP32 are held to an FP64 reference with a tolerance, as the contract
// asks: |y − y64| <= K · 2^-24 · (Σ|x·w| + |bias|).
TEST_P(LinearAtIsa, FloatFormatsWithinToleranceOfFp64) {
  const int64_t m = 4, n = 21, k = 300;
  for (Format f : {Format::kBf16, Format::kFp16, Format::kFp32}) {
    const auto x = Quantize(Gaussian(m * k, 7), m, k, f);
    const auto w = Quantize(Gaussian(n * k, 8), n, k, f);
    const std::vector<float> xv = Dequantize(x), wv = Dequantize(w);
    const std::vector<float> y = Linear(x, w, {}, {.isa = GetParam()}).value();
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double exact = 0, magnitude = 0;
        for (int64_t c = 0; c < k; ++c) {
          exact += double{xv[i * k + c]} * wv[j * k + c];
          magnitude += std::fabs(double{xv[i * k + c]} * wv[j * k + c]);
        }
        EXPECT_NEAR(y[i * n + j], exact, k * std::ldexp(1.0, -24) * magnitude)
            << FormatName(f) << " y[" << i << "][" << j << "]";
      }
    }
  }
}

// BF16 × BF16 where the pair instructions could flush what the reference keeps
// (and at the guard's edge): within the float bound at every level this CPU
// runs, bits independent of batch-mates and W's slice; below avx512 the
// exact-order kernel, the reference's own bits.
TEST_P(LinearAtIsa, Bf16GuardAndExactOrderBelowAvx512) {
  for (const Bf16GuardCase& c : Bf16GuardCases()) {
    KernelInfo info;
    ExpectSameAsReference(c.x, c.w, c.bias, GetParam(), c.what, nullptr, &info);
    EXPECT_EQ(info.name, KernelNameFor(Format::kBf16, Format::kBf16, GetParam())) << c.what;
  }
  ExpectBf16BitsIndependentOfBatchAndSlice(
      [](const QuantizedMatrix& x, const QuantizedMatrix& w) {
        return Linear(x, w, {}, {.isa = GetParam()}).value();
      },
      std::string(IsaName(GetParam())));
  // exact_bf16: the float kind's tile at every level, the reference's bits.
  {
    const int64_t m = 11, n = 21, k = 77;
    const QuantizedMatrix x = Quantize(Gaussian(m * k, 643), m, k, Format::kBf16);
    const QuantizedMatrix w = Quantize(Gaussian(n * k, 644), n, k, Format::kBf16);
    const std::vector<float> bias = Gaussian(n, 645);
    const std::vector<float> want = ReferenceLinear(x, w, bias).value();
    std::vector<float> got(m * n);
    const KernelInfo info = Linear(x, PackedWeight::Pack(w).value(), bias, got,
                                   {.isa = GetParam(), .exact_bf16 = true})
                                .value();
    EXPECT_EQ(info.name, KernelNameFor(Format::kFp32, Format::kBf16, GetParam()));
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_TRUE(SameBits(got[i], want[i])) << "exact_bf16: y[" << i << "] = " << got[i]
                                             << ", reference " << want[i];
    }
  }
  if (GetParam() > Isa::kAvx2) return;
  const int64_t m = 5, n = 19, k = 77;
  const QuantizedMatrix x = Quantize(Gaussian(m * k, 640), m, k, Format::kBf16);
  const QuantizedMatrix w = Quantize(Gaussian(n * k, 641), n, k, Format::kBf16);
  const std::vector<float> bias = Gaussian(n, 642);
  const std::vector<float> want = ReferenceLinear(x, w, bias).value();
  const std::vector<float> got = Linear(x, w, bias, {.isa = GetParam()}).value();
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(SameBits(got[i], want[i])) << "y[" << i << "] = " << got[i] << ", reference "
                                           << want[i];
  }
}

// NaN and Inf inputs make NaN blocks; zeros make all-zero blocks (scale byte 0).
TEST_P(LinearAtIsa, NanBlocksAndZeroBlocks) {
  const int64_t m = 6, n = 20, k = 96;
  for (Format f : kMxFormats) {
    std::vector<float> xv = Gaussian(m * k, 11), wv = Gaussian(n * k, 12);
    xv[1 * k + 40] = std::numeric_limits<float>::quiet_NaN();        // row 1, block 1
    xv[3 * k + 5] = std::numeric_limits<float>::infinity();          // row 3, block 0
    wv[7 * k + 70] = -std::numeric_limits<float>::infinity();        // col 7, block 2
    std::fill(xv.begin() + 4 * k, xv.begin() + 5 * k, 0.0f);          // row 4 all zero
    std::fill(wv.begin() + 2 * k + 32, wv.begin() + 2 * k + 64, 0.0f);  // col 2, block 1
    const std::vector<float> bias = Gaussian(n, 13);
    ExpectSameAsReference(Quantize(xv, m, k, f), Quantize(wv, n, k, f), bias, GetParam(),
                          absl::StrCat(FormatName(f), " NaN/zero blocks"));
  }
}

// Scales at both ends of E8M0: products that leave FP32's normal range round
// into subnormals or overflow to Inf, exactly as the reference rounds them.
TEST_P(LinearAtIsa, ExtremeScalesMatchReference) {
  const int64_t m = 3, n = 18, k = 64;
  const float x_scales[] = {0x1p-120f, 0x1p-60f, 0x1p+60f, 0x1p+120f};
  const float w_scales[] = {0x1p-126f, 0x1p-30f, 0x1p+40f, 0x1p+126f};
  for (Format f : kMxFormats) {
    for (float sx : x_scales) {
      for (float sw : w_scales) {
        std::vector<float> xv = Gaussian(m * k, 21, sx), wv = Gaussian(n * k, 22, sw);
        xv[5] = 0x1p-149f * 3;  // FP32 subnormal inputs are kept by the quantizer
        ExpectSameAsReference(Quantize(xv, m, k, f), Quantize(wv, n, k, f), {}, GetParam(),
                              absl::StrCat(FormatName(f), " scales ", sx, " x ", sw));
      }
    }
  }
}

// A client may pack Inf/NaN element codes itself; such calls take the reference.
TEST_P(LinearAtIsa, SpecialElementCodesTakeTheReference) {
  const int64_t m = 2, n = 16, k = 32;
  auto x = Quantize(Gaussian(m * k, 31), m, k, Format::kMxfp8E4m3);
  x.elements[3] = 0x7F;  // E4M3 NaN
  const auto w = Quantize(Gaussian(n * k, 32), n, k, Format::kMxfp8E4m3);
  KernelInfo info;
  ExpectSameAsReference(x, w, {}, GetParam(), "E4M3 NaN code", nullptr, &info);
  EXPECT_EQ(info.name, "reference");
  EXPECT_EQ(info.fallback_reason, "x holds Inf/NaN element codes");
}

// An MXFP8_E5M2 block pair can span more bits than FP64 holds. Here one block's
// products are 2^30, 2^6 and 2^-32: FP64 drops the 2^-32, leaving 2^30 + 2^6, an
// FP32 tie that rounds to even (2^30); the exact sum lies above the tie and
// rounds up to 2^30 + 2^7. The fast kernels find such outputs and redo them.
TEST_P(LinearAtIsa, WideE5m2BlocksAreExact) {
  const int64_t m = 1, n = 1, k = 32;
  std::vector<float> xv(k, 0.0f), wv(k, 0.0f);
  xv[0] = wv[0] = 0x1p15f;
  xv[1] = wv[1] = 0x1p3f;
  xv[2] = wv[2] = 0x1p-16f;
  KernelInfo info;
  const QuantizedMatrix x = Quantize(xv, m, k, Format::kMxfp8E5m2);
  const QuantizedMatrix w = Quantize(wv, n, k, Format::kMxfp8E5m2);
  ExpectSameAsReference(x, w, {}, GetParam(), "wide E5M2", nullptr, &info);
  EXPECT_EQ(info.name,
            KernelNameFor(Format::kMxfp8E5m2, Format::kMxfp8E5m2, GetParam()) + "+exact_wide");
  EXPECT_EQ(info.name.substr(info.name.find('/')), "/mx_f64+exact_wide");
  EXPECT_EQ(ReferenceLinear(x, w).value()[0], 0x1p30f + 0x1p7f);
}

// Wide blocks planted among ordinary ones, in X and in W, on a ragged shape with
// bias and two threads: only some outputs need the exact redo, and every output
// must still equal the reference. E5M2 activations with E4M3 and FP4 weights too.
TEST_P(LinearAtIsa, WideE5m2BlocksAmongOrdinaryOnes) {
  const int64_t m = 37, n = 45, k = 200;
  ThreadPool pool(2);
  for (Format wf : {Format::kMxfp8E5m2, Format::kMxfp8E4m3, Format::kMxfp4E2m1}) {
    std::vector<float> xv = Gaussian(m * k, 41), wv = Gaussian(n * k, 42);
    std::mt19937 rng(43);
    // A value at the bottom of E5M2's range beside the block's largest: a 30-bit span.
    for (int t = 0; t < 12; ++t) {
      const int64_t i = rng() % m, b = rng() % 7;
      xv[i * k + b * 32] = 0x1p15f;
      xv[i * k + b * 32 + 1] = 0x1p-16f;
      const int64_t j = rng() % n, c = rng() % 7;
      wv[j * k + c * 32] = -0x1p15f;
      wv[j * k + c * 32 + 3] = 0x1.8p-16f;
    }
    // And the tie of WideE5m2BlocksAreExact as whole blocks of some (i, j) pairs,
    // where FP64 would round differently.
    for (int t = 0; t < 4; ++t) {
      const int64_t i = rng() % m, j = rng() % n, b = rng() % 6;
      std::fill_n(xv.begin() + i * k + b * 32, 32, 0.0f);
      std::fill_n(wv.begin() + j * k + b * 32, 32, 0.0f);
      for (const auto& [at, v] : {std::pair{0, 0x1p15f}, {1, 0x1p3f}, {2, 0x1p-16f}}) {
        xv[i * k + b * 32 + at] = v;
        wv[j * k + b * 32 + at] = v;
      }
    }
    PlantUnlimbedWAgainstOneElementX(xv, wv, k);
    const std::vector<float> bias = Gaussian(n, 44);
    KernelInfo info;
    ExpectSameAsReference(Quantize(xv, m, k, Format::kMxfp8E5m2), Quantize(wv, n, k, wf), bias,
                          GetParam(), absl::StrCat("wide E5M2 x ", FormatName(wf)), &pool,
                          &info);
    EXPECT_NE(info.name, "reference") << info.fallback_reason;
  }
}

// kMxF64's int16 path at and past its bounds (Int16Bounds), for E4M3 and E5M2 on
// either side, M = 19 (two avx512 tiles of 8 and one of 3) and two threads.
TEST_P(LinearAtIsa, MxFp8Int16PathBoundsMatchReference) {
  ThreadPool pool(2);
  for (Format xf : {Format::kMxfp8E4m3, Format::kMxfp8E5m2}) {
    for (Format wf : {Format::kMxfp8E4m3, Format::kMxfp8E5m2}) {
      const Int16BoundsCase c = Int16Bounds(xf, wf);
      const std::string what = absl::StrCat(FormatName(xf), " x ", FormatName(wf));
      KernelInfo info;
      ExpectSameAsReference(c.x, c.w, c.bias, GetParam(), what, &pool, &info);
      EXPECT_EQ(info.name.substr(0, info.name.find('+')),
                KernelNameFor(xf, wf, GetParam()))
          << what;
    }
  }
}

// The same planted pairs a decode step at a time: X's rows eight or fewer per
// call, so the avx512 kernel runs its decode tile (MxF64ShiftedTile's
// streaming variant, which prefetches W's low limbs) on the heavy, split and
// shifted rows as well.
TEST_P(LinearAtIsa, MxFp8Int16PathBoundsInDecodeStepsMatchReference) {
  const Int16BoundsCase c = Int16Bounds(Format::kMxfp8E4m3, Format::kMxfp8E4m3);
  for (int64_t first = 0; first < c.x.rows; first += 8) {
    const int64_t count = std::min<int64_t>(8, c.x.rows - first);
    ExpectSameAsReference(MxRows(c.x, first, count), c.w, c.bias, GetParam(),
                          absl::StrCat("X rows ", first, " to ", first + count - 1));
  }
}

// A shifted row's residue against W's low limbs in two k-pairs
// (ResidueMeetsLowLimbs): the known answer at every level, for all sixteen rows
// at once (the avx512 kernel's tile for many rows) and eight at a time (its
// decode tile), and the reference's bits everywhere else.
TEST_P(LinearAtIsa, MxFp8ResidueMeetsLowLimbsKnownAnswer) {
  const auto [x, w] = ResidueMeetsLowLimbs();
  const std::vector<float> bias(w.rows, 0.0f);
  for (int64_t step : {x.rows, int64_t{8}}) {
    for (int64_t first = 0; first < x.rows; first += step) {
      const std::string what = absl::StrCat("X rows ", first, " to ", first + step - 1);
      std::vector<float> y;
      ASSERT_NO_FATAL_FAILURE(ExpectSameAsReference(MxRows(x, first, step), w, bias, GetParam(),
                                                    what, nullptr, nullptr, nullptr, &y));
      for (int64_t r : kResidueRows) {
        if (r < first || r >= first + step) continue;
        for (int64_t j : kResidueCols) {
          EXPECT_EQ(y[(r - first) * w.rows + j], kResidueMeetsLowLimbsAnswer)
              << what << ": y[" << r << "][" << j << "]";
        }
      }
    }
  }
}

// The planted heavy pair really is past int32: the shifted integers' dot of an
// E4M3 heavy row and heavy column exceeds 2^31, and ShiftedPairFits says no on
// the exact magnitudes (a limit one bit looser, 2^32, would take it and wrap
// int32 here); the Gaussian blocks beside them fit, and the block magnitudes
// are what InspectBlock says.
TEST(Int16PathTest, HeavyPairsWouldWrapAndAreRejected) {
  const Int16BoundsCase c = Int16Bounds(Format::kMxfp8E4m3, Format::kMxfp8E4m3);
  const internal::CodeTable& table = internal::Codes(Format::kMxfp8E4m3);
  struct Block {
    internal::BlockInfo info;
    std::vector<int64_t> shifted;  // the fixed-point values >> low_bit
    double sq;                     // ShiftedSquares
  };
  const auto block = [&](const QuantizedMatrix& m, int64_t row, int64_t b) {
    const uint8_t* codes = m.elements.data() + row * RowBytes(m.format, m.cols) + b * kBlockSize;
    Block out{internal::InspectBlock(table, codes), std::vector<int64_t>(kBlockSize), 0.0};
    for (int i = 0; i < kBlockSize; ++i) out.shifted[i] = table.fixed[codes[i]] >> out.info.low_bit;
    out.sq = internal::ShiftedSquares(table, codes, out.info.low_bit);
    return out;
  };
  const auto fits = [](const Block& x, const Block& w) {
    return internal::ShiftedPairFits(static_cast<double>(x.info.max), static_cast<double>(x.info.l1),
                                     x.sq, static_cast<double>(w.info.max),
                                     static_cast<double>(w.info.l1), w.sq);
  };
  const Block x = block(c.x, c.heavy_rows[0], 1);
  const Block w = block(c.w, c.heavy_cols[0], 1);
  EXPECT_EQ(x.info.span_bits, 15);
  EXPECT_EQ(w.info.span_bits, 15);
  EXPECT_EQ(x.info.max, 28672u);  // 448 / 2^-6 = 7 · 2^12
  EXPECT_EQ(x.info.l1, 4u * 28672 + 1);
  EXPECT_EQ(x.info.l1_bits, 17);
  EXPECT_EQ(w.info.l1, 4u * 28672 + 1);
  EXPECT_EQ(x.sq, 4.0 * 28672 * 28672 + 1);  // Cauchy–Schwarz, too: (Σx'²·Σw'²)^½ > 2^31
  int64_t dot = 0;
  for (int i = 0; i < kBlockSize; ++i) dot += x.shifted[i] * w.shifted[i];
  EXPECT_GT(dot, int64_t{1} << 31);
  EXPECT_FALSE(fits(x, w));
  EXPECT_LT(static_cast<double>(x.info.max) * static_cast<double>(w.info.l1), 0x1p32);
  const Block gx = block(c.x, 1, 0);
  const Block gw = block(c.w, 1, 0);
  EXPECT_TRUE(fits(gx, gw));
  const Block tiny = block(c.x, 0, 3);  // 448 among 2^-6: span 15, L1 28672 + 31
  EXPECT_EQ(tiny.info.span_bits, 15);
  EXPECT_EQ(tiny.info.l1, 28672u + 31);
  EXPECT_TRUE(fits(tiny, gw));
  const Block wide = block(c.w, 9, 2);  // 448 beside 2^-9
  EXPECT_EQ(wide.info.span_bits, 18);
}

// Shifted scales past the int16 path's fast-epilogue limit (HugeShiftedScales):
// the call runs the FP64 tiles and keeps the reference's finite results.
TEST_P(LinearAtIsa, MxFp8HugeShiftedScalesMatchReference) {
  for (Format xf : {Format::kMxfp8E4m3, Format::kMxfp8E5m2}) {
    const auto [x, w] = HugeShiftedScales(xf, Format::kMxfp8E4m3);
    ExpectSameAsReference(x, w, {}, GetParam(), absl::StrCat(FormatName(xf), " huge scales"));
    const std::vector<float> y = ReferenceLinear(x, w).value();
    EXPECT_TRUE(std::all_of(y.begin(), y.end(), [](float v) { return std::isfinite(v); }));
    EXPECT_EQ(y[0], 12544.0f);  // 448 · 2^106 · 448 · 2^-110, where float(dot) · 2^100 is Inf
  }
}

// Two-limb X blocks count in the fast-epilogue range (TinyScaleWideX).
TEST_P(LinearAtIsa, MxFp8TwoLimbXWithTinyScaleMatchesReference) {
  for (Format wf : {Format::kMxfp8E4m3, Format::kMxfp8E5m2}) {
    const auto [x, w] = TinyScaleWideX(wf);
    ExpectSameAsReference(x, w, {}, GetParam(), absl::StrCat("tiny-scale X x ", FormatName(wf)));
    const std::vector<float> y = ReferenceLinear(x, w).value();
    EXPECT_GT(std::fabs(y[0]), 0.1f);
  }
}

// The test itself: either max-times-L1 product below 2^31; Inf (no int16
// form on that side) never fits, even against an all-zero block.
TEST(Int16PathTest, ShiftedPairFitsKnownAnswers) {
  const double inf = std::numeric_limits<double>::infinity();
  const auto fits = internal::ShiftedPairFits;  // (x max, L1, Σx'², w max, L1, Σw'²)
  EXPECT_TRUE(fits(0, 0, 0, 0, 0, 0));                                   // zero blocks
  EXPECT_TRUE(fits(32767, 0x1p20, inf, 0x1p20, 65537, inf));   // 2^31 − 32769, 2^40
  EXPECT_FALSE(fits(32768, 0x1p20, inf, 0x1p20, 65536, inf));  // 2^31, 2^40
  EXPECT_TRUE(fits(0x1p20, 65537, inf, 32767, 0x1p20, inf));   // the swapped one
  EXPECT_FALSE(fits(0x1p20, 65536, inf, 32768, 0x1p20, inf));
  // Cauchy–Schwarz alone: both max-times-L1 products are 2^33, the squares'
  // product 2^62 − 2^33 fits, 2^62 does not, one ulp below 2^29 does.
  EXPECT_TRUE(fits(0x1p14, 0x1p19, 0x1p33, 0x1p14, 0x1p19, 0x1p29 - 1));
  EXPECT_FALSE(fits(0x1p14, 0x1p19, 0x1p33, 0x1p14, 0x1p19, 0x1p29));
  EXPECT_TRUE(fits(0x1p14, 0x1p19, 0x1p33, 0x1p14, 0x1p19, std::nextafter(0x1p29, 0.0)));
  EXPECT_TRUE(fits(1, 1, 1, 0x1p30, 0x1p30, 0x1p60));               // W in two limbs
  EXPECT_FALSE(fits(inf, inf, inf, 1, 1, 1));                       // X not int16
  EXPECT_FALSE(fits(inf, inf, inf, 0, 0, 0));
  EXPECT_FALSE(fits(0, 0, 0, inf, inf, inf));                       // W past two limbs
}

// ShiftedSquares, the shifted integers' Σv'², is exact where a double holds it
// and rounded up where it does not (so the Cauchy–Schwarz test stays a bound):
// E5M2's largest element beside its least, 7 · 2^29 and 1, squares to
// 49 · 2^58 + 1, one past a double's reach there.
TEST(Int16PathTest, BlockSquaresAreExactOrRoundedUp) {
  const internal::CodeTable& table = internal::Codes(Format::kMxfp8E5m2);
  int largest = 0, least = 0;
  for (int code = 0; code < 128; ++code) {  // positive codes
    if (table.special[code]) continue;
    if (table.fixed[code] > table.fixed[largest]) largest = code;
    if (table.fixed[code] == 1) least = code;
  }
  ASSERT_EQ(table.fixed[largest], int64_t{7} << 29);
  ASSERT_NE(least, 0);
  std::vector<uint8_t> codes(kBlockSize, 0);
  codes[0] = static_cast<uint8_t>(largest);
  codes[7] = static_cast<uint8_t>(least);
  const internal::BlockInfo wide = internal::InspectBlock(table, codes.data());
  EXPECT_EQ(wide.low_bit, 0);
  EXPECT_EQ(internal::ShiftedSquares(table, codes.data(), wide.low_bit),
            std::nextafter(0x1.88p63, std::numeric_limits<double>::infinity()));
  codes[7] = codes[0];  // 2 · 49 · 2^58, exact; shifted by the low bit, 29: 98
  const internal::BlockInfo exact = internal::InspectBlock(table, codes.data());
  EXPECT_EQ(exact.low_bit, 29);
  EXPECT_EQ(internal::ShiftedSquares(table, codes.data(), exact.low_bit), 98.0);
}

// Which kernel runs: the best level at or below the one asked for that has the
// kind (kHasKernel: scalar and avx2 have every kind, avx512 and amx some),
// unless the fast epilogue would round differently (extreme scales), then the
// exact scalar one.
TEST_P(LinearAtIsa, ReportsTheKernelThatRan) {
  const Isa isa = GetParam();
  const int64_t m = 2, n = 16, k = 64;
  const struct {
    Format format;
    const char* kind;
  } cases[] = {{Format::kMxfp4E2m1, "mx_i8"},  {Format::kMxfp6E2m3, "mx_i8"},
               {Format::kMxint8, "mx_i16"},    {Format::kMxfp6E3m2, "mx_i16"},
               {Format::kMxfp8E4m3, "mx_f64"}, {Format::kMxfp8E5m2, "mx_f64"},
               {Format::kInt8, "int8"},        {Format::kBf16, "bf16"}};
  for (const auto& c : cases) {
    KernelInfo info;
    ExpectSameAsReference(Quantize(Gaussian(m * k, 41), m, k, c.format),
                          Quantize(Gaussian(n * k, 42), n, k, c.format), {}, isa,
                          std::string(FormatName(c.format)), nullptr, &info);
    EXPECT_EQ(info.name, KernelNameFor(c.format, c.format, isa)) << FormatName(c.format);
    EXPECT_EQ(info.name.substr(info.name.find('/') + 1), c.kind) << FormatName(c.format);
    // Levels up to avx2 have every kind: the level asked for runs.
    if (isa <= Isa::kAvx2) {
      EXPECT_EQ(info.name, absl::StrCat(IsaName(isa), "/", c.kind)) << FormatName(c.format);
    }
  }
  KernelInfo info;
  ExpectSameAsReference(Quantize(Gaussian(m * k, 43, 0x1p-125f), m, k, Format::kMxfp4E2m1),
                        Quantize(Gaussian(n * k, 44, 0x1p-20f), n, k, Format::kMxfp4E2m1), {},
                        isa, "tiny scales", nullptr, &info);
  EXPECT_EQ(info.name, "scalar/mx_i8");
}

// The table of which kinds each level has against the level's own tile
// function, on this CPU (the avx512 and amx ones again, emulated, on any AVX2
// machine: emulated_levels_test).
TEST_P(LinearAtIsa, KernelTableMatchesTheTileFunction) {
  const Isa isa = GetParam();
  ExpectTileFunctionMatchesTheTable(
      isa,
      [isa](internal::Kind kind, const internal::Problem& p) {
        return internal::TileAt(isa, kind, p);
      },
      std::string(IsaName(isa)));
}

TEST_P(LinearAtIsa, ThreadPoolGivesTheSameBits) {
  ThreadPool pool(2);
  const int64_t m = 37, n = 70, k = 96;
  for (Format f : {Format::kMxfp4E2m1, Format::kMxfp8E4m3, Format::kMxint8}) {
    ExpectSameAsReference(Quantize(Gaussian(m * k, 51), m, k, f),
                          Quantize(Gaussian(n * k, 52), n, k, f), Gaussian(n, 53), GetParam(),
                          absl::StrCat(FormatName(f), " two threads"), &pool);
  }
}

// X is decoded in row tasks across the pool too (16K elements each: 170 rows of
// K = 96). Only the last task's rows hold tiny values, whose block scales with
// W's rule out the fast epilogue (2^-103 · 2^-33 < 2^-126): the operand-wide
// scale range must include every task's, so the exact scalar kernel runs.
TEST_P(LinearAtIsa, ThreadedDecodeKeepsEveryTasksScales) {
  ThreadPool pool(2);
  const int64_t m = 300, n = 20, k = 96;
  for (Format f : {Format::kMxfp4E2m1, Format::kMxint8}) {
    std::vector<float> xv = Gaussian(m * k, 54);
    for (int64_t i = 250 * k; i < m * k; ++i) xv[i] *= 0x1p-100f;
    KernelInfo info;
    ExpectSameAsReference(Quantize(xv, m, k, f), Quantize(Gaussian(n * k, 55, 0x1p-30f), n, k, f),
                          {}, GetParam(), absl::StrCat(FormatName(f), " tiny rows, two threads"),
                          &pool, &info);
    EXPECT_EQ(info.name.substr(0, 7), "scalar/") << FormatName(f);
  }
}

// INT8, BF16, FP16 and FP32 X past one decoding task's rows (170 at K = 90, 96
// padded), with a pool: every row decoded into its padded place, INT8's
// −128 · Σx per row and BF16's per-row exponents (the pair instructions'
// guard) included. The last 50 BF16 rows are tiny (2^-120 · g, some subnormal,
// every product far below the guard's least), so only a guard that saw those
// rows' exponents sends them down the exact order and matches the reference.
TEST_P(LinearAtIsa, ManyRowsOfEveryNonMxKindWithAPool) {
  ThreadPool pool(2);
  const int64_t m = 300, n = 20, k = 90;
  for (Format f : {Format::kInt8, Format::kBf16, Format::kFp16, Format::kFp32}) {
    std::vector<float> xv = Gaussian(m * k, 56);
    if (f == Format::kBf16) {
      for (int64_t i = 250 * k; i < m * k; ++i) xv[i] *= 0x1p-120f;
    }
    ExpectSameAsReference(Quantize(xv, m, k, f), Quantize(Gaussian(n * k, 57), n, k, f), {},
                          GetParam(), absl::StrCat(FormatName(f), " 300 rows, two threads"), &pool);
  }
}

// DecodeActivations leaves its per-element arrays uninitialized (RowArray) and
// its row tasks write them in full: the padding past K must come out zero over
// dirty memory, or the u8 kernels would add (w_pad + 128) · garbage. The heap
// is dirtied first with freed buffers of the arrays' sizes (glibc hands the
// chunks back; a first round raises its mmap threshold past the largest), for
// every pair of formats, on a pool: 40 rows are one row task, 200 rows two
// (RowTasks' 16K elements), whose arrays glibc dirties less reliably.
TEST(DecodeActivationsTest, PaddingIsZeroOverDirtyMemory) {
  ThreadPool pool(2);
  const int64_t k = 70;
  uint32_t seed = 900;
  int pairs = 0;
  for (const int64_t m : {40, 200}) {
    for (const FormatTraits& tx : AllFormats()) {
      for (const FormatTraits& tw : AllFormats()) {
        const internal::Kind kind = internal::KindFor(tx.format, tw.format);
        std::vector<float> values = Gaussian(m * k, ++seed);
        // Row 0's first block spans 31 bits in E5M2 (2^15 and 2^-15 in its
        // elements): more than two int16 limbs, no int16 form.
        std::fill_n(values.begin(), kBlockSize, 0.0f);
        values[0] = 1.0f;
        values[1] = 0x1p-30f;
        const QuantizedMatrix x = Quantize(values, m, k, tx.format);
        for (int round = 0; round < 2; ++round) {
          std::vector<std::vector<uint8_t>> dirt;
          for (int64_t element_bytes : {1, 2, 4, 8}) {
            for (int copy = 0; copy < 3; ++copy) dirt.emplace_back(m * 96 * element_bytes, 0xA5);
          }
        }
        const internal::DecodedX d = internal::DecodeActivations(x, kind, tw.format, &pool);
        const std::string pair = absl::StrCat(m, " rows, ", tx.name, " x ", tw.name, " (",
                                              internal::KindName(kind), ")");
        const auto expect_zero_padding = [&](const auto& array, const char* name) {
          if (array.empty()) return;
          ASSERT_EQ(static_cast<int64_t>(array.size()), m * d.k_padded) << pair << " " << name;
          int64_t nonzero = 0;
          for (int64_t r = 0; r < m; ++r) {
            for (int64_t c = k; c < d.k_padded; ++c) nonzero += array[r * d.k_padded + c] != 0;
          }
          EXPECT_EQ(nonzero, 0) << pair << ": " << name << " has " << nonzero
                                << " non-zero padding elements";
        };
        expect_zero_padding(d.i8, "i8");
        expect_zero_padding(d.i16, "i16");
        expect_zero_padding(d.f64, "f64");
        expect_zero_padding(d.f32, "f32");
        expect_zero_padding(d.bf16, "bf16");
        expect_zero_padding(d.i16_lo, "i16_lo");
        if (tx.format == Format::kMxfp8E5m2 && kind == internal::Kind::kMxF64) {
          ASSERT_GT(d.span_bits[0], internal::kShiftedSplitBits) << pair << ": row 0's first block";
          for (int i = 0; i < kBlockSize; ++i) {
            EXPECT_EQ(d.i16[i], 0) << pair << ": a block with no int16 form, element " << i;
            EXPECT_EQ(d.i16_lo[i], 0) << pair << ": a block with no int16 form, element " << i;
          }
        }
        ++pairs;
      }
    }
  }
  EXPECT_GT(pairs, 200);
}

// LevelFor walks the table down from the level asked for: the best level at or
// below it that has the kind, whatever the table holds.
TEST(KernelTableTest, LevelForIsTheBestLevelAtOrBelowThatHasTheKind) {
  for (int k = 0; k < internal::kKinds; ++k) {
    const auto kind = static_cast<internal::Kind>(k);
    EXPECT_TRUE(internal::HasKernel(Isa::kScalar, kind)) << internal::KindName(kind);
    for (Isa requested : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512, Isa::kAmx}) {
      const Isa level = internal::LevelFor(kind, requested);
      const std::string what = absl::StrCat(internal::KindName(kind), " at ", IsaName(requested));
      EXPECT_LE(level, requested) << what;
      EXPECT_TRUE(internal::HasKernel(level, kind)) << what;
      for (int above = static_cast<int>(level) + 1; above <= static_cast<int>(requested); ++above) {
        EXPECT_FALSE(internal::HasKernel(static_cast<Isa>(above), kind)) << what;
      }
    }
  }
  // The public name resolves the level as Linear does.
  const Isa best = AvailableIsas().back();
  EXPECT_EQ(
      KernelNameFor(Format::kMxfp4E2m1, Format::kMxint8, Isa::kAmx),
      internal::KernelName(internal::LevelFor(internal::Kind::kMxI8, best), internal::Kind::kMxI8));
  EXPECT_EQ(KernelNameFor(Format::kBf16, Format::kMxfp4E2m1, Isa::kScalar), "scalar/f32");
}

// Packing keeps no copy of W: the exchange layout is rebuilt from the panels
// when needed, with the same values and scales for every format.
TEST(PackedWeightTest, UnpackedGivesBackTheSameValues) {
  const int64_t n = 19, k = 45;
  for (const FormatTraits& t : AllFormats()) {
    std::vector<float> v = Gaussian(n * k, 61, 2.0f);
    v[3] = 0.0f;
    v[4] = -0.0f;
    const QuantizedMatrix w = Quantize(v, n, k, t.format);
    const QuantizedMatrix back = PackedWeight::Pack(w).value().Unpacked();
    EXPECT_EQ(back.block_scales, w.block_scales) << t.name;
    EXPECT_EQ(back.row_scales, w.row_scales) << t.name;
    const std::vector<float> a = Dequantize(w), b = Dequantize(back);
    for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], b[i]) << t.name << " element " << i;
  }
}

TEST(LinearTest, ArgumentErrorsNameTheArgument) {
  const auto x = Quantize(Gaussian(2 * 32, 1), 2, 32, Format::kMxfp4E2m1);
  const auto w = PackedWeight::Pack(Quantize(Gaussian(3 * 64, 2), 3, 64, Format::kMxfp4E2m1));
  ASSERT_TRUE(w.ok());
  std::vector<float> y(6);
  absl::StatusOr<KernelInfo> r = Linear(x, *w, {}, y);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(), "w: expected K = 32 columns to match x, got 64");

  const auto w32 = PackedWeight::Pack(Quantize(Gaussian(3 * 32, 2), 3, 32, Format::kMxfp4E2m1));
  const std::vector<float> bias(2);
  r = Linear(x, *w32, bias, y);
  EXPECT_EQ(r.status().message(), "bias: expected 3 values (one per row of w), got 2");
  std::vector<float> small(5);
  r = Linear(x, *w32, {}, small);
  EXPECT_EQ(r.status().message(), "y: expected 2x3 = 6 values, got 5");

  QuantizedMatrix broken = Quantize(Gaussian(3 * 32, 2), 3, 32, Format::kMxfp4E2m1);
  broken.block_scales.pop_back();
  EXPECT_EQ(PackedWeight::Pack(broken).status().message(),
            "w block_scales (bytes): expected 3 for a 3x32 MXFP4_E2M1 matrix, got 2");
}

TEST(ThreadPoolTest, RunsEveryTaskOnceAndServesConcurrentCallers) {
  ThreadPool pool(2);
  EXPECT_EQ(pool.size(), 2);
  std::vector<std::atomic<int>> hits(1000);
  for (int round = 0; round < 50; ++round) {
    pool.ParallelFor(1000, [&](int64_t i) { hits[i].fetch_add(1); });
  }
  for (const auto& h : hits) ASSERT_EQ(h.load(), 50);

  // Two callers at once: each call still runs all of its tasks.
  std::atomic<int64_t> sum_a{0}, sum_b{0};
  std::thread other([&] {
    for (int round = 0; round < 200; ++round) pool.ParallelFor(100, [&](int64_t i) { sum_a += i; });
  });
  for (int round = 0; round < 200; ++round) pool.ParallelFor(100, [&](int64_t i) { sum_b += i; });
  other.join();
  EXPECT_EQ(sum_a.load(), 200 * 4950);
  EXPECT_EQ(sum_b.load(), 200 * 4950);
}

// A ParallelFor from inside a task (the caller's or a worker's) runs its tasks
// inline: the caller's thread holds the pool, and locking it again was undefined.
TEST(ThreadPoolTest, ACallFromInsideATaskRunsInline) {
  ThreadPool pool(3);
  std::vector<std::atomic<int>> hits(8 * 5);
  for (int round = 0; round < 20; ++round) {
    pool.ParallelFor(8, [&](int64_t i) {
      pool.ParallelFor(5, [&](int64_t j) { hits[i * 5 + j].fetch_add(1); });
    });
  }
  for (const auto& h : hits) ASSERT_EQ(h.load(), 20);
  // The pool works as before once the nested calls are over.
  std::atomic<int> after{0};
  pool.ParallelFor(64, [&](int64_t) { after.fetch_add(1); });
  EXPECT_EQ(after.load(), 64);
}

// Workers spin a while after a call, then sleep (thread_pool.cc): a call after
// a pause past the spin must wake them, they must take part (tasks that block
// briefly land on more than one thread), and a pool destroyed right after a
// call, its workers still spinning, must join them.
TEST(ThreadPoolTest, WorkersWakeAfterSleepingTakePartAndStopWhileSpinning) {
  for (int round = 0; round < 3; ++round) {
    ThreadPool pool(3);
    std::atomic<int> runs{0};
    pool.ParallelFor(64, [&](int64_t) { runs.fetch_add(1); });
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // past the spin: asleep
    std::mutex mu;
    std::set<std::thread::id> threads;
    pool.ParallelFor(30, [&](int64_t) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      runs.fetch_add(1);
      std::lock_guard<std::mutex> lock(mu);
      threads.insert(std::this_thread::get_id());
    });
    EXPECT_EQ(runs.load(), 94);
    EXPECT_GE(threads.size(), 2u) << "only the caller ran the tasks";
  }
}

// A call waits for the workers that joined it, never for one still waking up:
// with every worker's wake-up held for 1 s (SetWakeDelayForTesting), a call on
// a sleeping pool runs its tasks on the caller and returns long before that.
// The late workers then join later calls; every call still runs each of its
// tasks exactly once, which is what a worker that joined the wrong call, or
// read a finished call's tasks, would break.
TEST(ThreadPoolTest, ACallDoesNotWaitForWorkersStillWakingUp) {
  ThreadPool pool(4);
  pool.SetWakeDelayForTesting(std::chrono::seconds(1));
  pool.ParallelFor(8, [](int64_t) {});
  // Past the spin: asleep, or (woken by that call) in their 1 s delay.
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const auto start = std::chrono::steady_clock::now();
  std::atomic<int> runs{0};
  pool.ParallelFor(8, [&](int64_t) { runs.fetch_add(1); });
  const auto waited = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(runs.load(), 8);
  EXPECT_LT(waited, std::chrono::milliseconds(500)) << "the call waited for a sleeping worker";

  // Calls back to back while the late workers wake (after about 1 s) and join:
  // tasks of 100 µs, so that a worker spinning between calls finds some left.
  std::mutex mu;
  std::set<std::thread::id> threads;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (int call = 0; threads.size() < 2 && std::chrono::steady_clock::now() < until; ++call) {
    std::vector<std::atomic<int>> hits(64);
    pool.ParallelFor(64, [&](int64_t i) {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
      hits[i].fetch_add(1);
      std::lock_guard<std::mutex> lock(mu);
      threads.insert(std::this_thread::get_id());
    });
    for (const auto& h : hits) ASSERT_EQ(h.load(), 1) << "call " << call;
  }
  EXPECT_GE(threads.size(), 2u) << "the workers never joined once awake";
}

}  // namespace
}  // namespace mx::kernels
