// Seeded stochastic rounding: the generator's known answers, the rounding rule
// at its edges, unbiasedness measured over many seeds against its sampling
// interval, specials, and the element indices every quantizer draws — the
// reference's and the fast kernels' at every ISA level this CPU has.
#include "mx/stochastic.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "mx/element.h"
#include "mx/kernels/cpu_features.h"
#include "mx/kernels/quantize_fast.h"
#include "mx/kernels/thread_pool.h"
#include "mx/packed.h"
#include "mx/quantize.h"

namespace {

using mx::Format;
using mx::QuantizeOptions;
using mx::Rounding;

// Written by a separate Python implementation of the formula in stochastic.h
// (integers masked to 32 bits), not by this library.
TEST(StochasticBits, KnownAnswers) {
  EXPECT_EQ(mx::Lowbias32(0), 0u);
  EXPECT_EQ(mx::Lowbias32(1), 0x688990C0u);
  EXPECT_EQ(mx::Lowbias32(0xDEADBEEF), 0xE628C683u);
  EXPECT_EQ(mx::StochasticBits(0, 0)(0), 0x0EAA7511u);
  EXPECT_EQ(mx::StochasticBits(1, 0)(0), 0x62181B8Du);
  EXPECT_EQ(mx::StochasticBits(0, 1)(0), 0x7D2B5EA8u);
  EXPECT_EQ(mx::StochasticBits(0, 0)(1), 0xF3AA8044u);
  EXPECT_EQ(mx::StochasticBits(0x123456789ABCDEF0, 3)((uint64_t{1} << 40) + 7), 0x605C3FD3u);
  EXPECT_EQ(mx::StochasticBits(42, 5)(999999), 0x99222857u);
}

TEST(StochasticRounding, RoundsUpIffTheFractionTimes2To32ExceedsTheBits) {
  const Format fp4 = Format::kMxfp4E2m1;  // 2.5 lies halfway between 2 (code 4) and 3 (code 5)
  EXPECT_EQ(mx::EncodeElement(fp4, 2.5f, Rounding::kStochastic, 0, 0x7FFFFFFF), 5u);
  EXPECT_EQ(mx::EncodeElement(fp4, 2.5f, Rounding::kStochastic, 0, 0x80000000), 4u);
  EXPECT_EQ(mx::EncodeElement(fp4, -2.5f, Rounding::kStochastic, 0, 0), 0xDu);  // -3: magnitude up
  // On the grid nothing moves, whatever the bits.
  EXPECT_EQ(mx::EncodeElement(fp4, 2.0f, Rounding::kStochastic, 0, 0), 4u);
  EXPECT_EQ(mx::EncodeElement(fp4, 0.0f, Rounding::kStochastic, 0, 0), 0u);
  // A value far below the smallest step still rounds up when u = 0, never else.
  EXPECT_EQ(mx::EncodeElement(fp4, 1e-30f, Rounding::kStochastic, 0, 0), 1u);
  EXPECT_EQ(mx::EncodeElement(fp4, 1e-30f, Rounding::kStochastic, 0, 1), 0u);
  // Past max normal it saturates, as the deterministic roundings do.
  EXPECT_EQ(mx::EncodeElement(fp4, 6.5f, Rounding::kStochastic, 0, 0), 7u);
  // INT8 and MXINT8 use the same rule: 1.25 rounds to 2 with probability 1/4.
  EXPECT_EQ(mx::EncodeElement(Format::kInt8, 1.25f, Rounding::kStochastic, 0, 0x3FFFFFFF), 2u);
  EXPECT_EQ(mx::EncodeElement(Format::kInt8, 1.25f, Rounding::kStochastic, 0, 0x40000000), 1u);
  EXPECT_EQ(mx::EncodeElement(Format::kMxint8, 1.25f / 64, Rounding::kStochastic, 0, 0), 2u);
}

TEST(StochasticRounding, NamesParseAndPrint) {
  EXPECT_EQ(mx::RoundingName(Rounding::kStochastic), "stochastic");
  EXPECT_EQ(*mx::ParseRounding("STOCHASTIC"), Rounding::kStochastic);
  EXPECT_EQ(*mx::ParseRounding("even"), Rounding::kNearestEven);
  EXPECT_EQ(*mx::ParseRounding("nearest_away"), Rounding::kNearestAway);
  const absl::Status bad = mx::ParseRounding("dither").status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.message(),
            "unknown rounding 'dither'; expected nearest_even (even), nearest_away (away) or "
            "stochastic");
}

QuantizeOptions Stochastic(uint64_t seed, mx::ScaleRule rule = mx::ScaleRule::kFloor) {
  QuantizeOptions options;
  options.rounding = Rounding::kStochastic;
  options.scale_rule = rule;
  options.seed = seed;
  return options;
}

// Values spread over a few binades, most of them off every grid.
std::vector<float> Values(int64_t count, uint32_t salt) {
  std::vector<float> v(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    const uint32_t h = mx::Lowbias32(static_cast<uint32_t>(i) * 2654435761u + salt);
    v[i] = std::ldexp(1.0f + (h & 0xFFFFF) / 1048576.0f, static_cast<int>(h >> 28) - 6) *
           ((h >> 27) & 1 ? -1.0f : 1.0f);
  }
  return v;
}

// The mean over many seeds of each dequantized element is the element itself:
// each draw is the grid point below plus a Bernoulli(f) step, so the mean of n
// draws lies within 5 standard errors, step·sqrt(f(1 - f)/n), of the value (a
// deterministic set of seeds: this either always passes or never). Nearest even
// fails the same test for the off-grid elements, which shows it can fail.
TEST(StochasticRounding, UnbiasedOverSeedsWithinFiveStandardErrors) {
  const int64_t cols = 64;
  const std::vector<float> values = Values(cols, 7);
  for (const Format format : {Format::kMxfp4E2m1, Format::kMxfp6E3m2, Format::kMxfp8E4m3,
                              Format::kMxint8, Format::kInt8}) {
    SCOPED_TRACE(mx::FormatName(format));
    const int seeds = 4000;
    std::vector<double> sum(cols, 0.0);
    for (int s = 0; s < seeds; ++s) {
      const auto q = mx::QuantizeRows(values, 1, cols, format, Stochastic(1000 + s));
      const std::vector<float> back = mx::Dequantize(*q);
      for (int64_t c = 0; c < cols; ++c) sum[c] += back[c];
    }
    const auto nearest = mx::QuantizeRows(values, 1, cols, format);
    const std::vector<float> rounded = mx::Dequantize(*nearest);
    int tested = 0, nearest_outside = 0;
    for (int64_t c = 0; c < cols; ++c) {
      const double mean = sum[c] / seeds;
      // The step at this element: the distance between its two possible results,
      // seen among the first 64 seeds' draws.
      double below = rounded[c], above = rounded[c];
      for (int s = 0; s < 64; ++s) {
        const float v = mx::Dequantize(*mx::QuantizeRows(values, 1, cols, format, Stochastic(s)))[c];
        below = std::min<double>(below, v);
        above = std::max<double>(above, v);
      }
      const double step = above - below;
      if (step == 0) continue;  // on the grid (or saturated): nothing to test
      const double f = (std::fabs(values[c]) - std::fabs(values[c] < 0 ? above : below)) / step;
      const double p = std::clamp(std::fabs(f), 1e-3, 1.0 - 1e-3);
      const double bound = 5 * step * std::sqrt(p * (1 - p) / seeds);
      EXPECT_NEAR(mean, values[c], bound) << "element " << c;
      nearest_outside += std::fabs(rounded[c] - values[c]) > bound;
      ++tested;
    }
    EXPECT_GT(tested, cols / 2);
    EXPECT_GT(nearest_outside, tested / 2);
  }
}

// The weight-update problem: 1 + 2^-10 is 1 to nearest in MXFP8 (step 2^-3
// there), so an update that small never survives; stochastically its mean does.
TEST(StochasticRounding, ASmallUpdateSurvivesInTheMean) {
  const std::vector<float> values(32, 1.0f + 0x1p-10f);
  double sum = 0;
  const int seeds = 20000;
  for (int s = 0; s < seeds; ++s) {
    sum += mx::Dequantize(*mx::QuantizeRows(values, 1, 32, Format::kMxfp8E4m3, Stochastic(s)))[5];
  }
  const double p = 0x1p-7;  // 2^-10 / 2^-3
  EXPECT_NEAR(sum / seeds, 1.0 + 0x1p-10, 5 * 0x1p-3 * std::sqrt(p * (1 - p) / seeds));
  EXPECT_EQ(mx::Dequantize(*mx::QuantizeRows(values, 1, 32, Format::kMxfp8E4m3))[5], 1.0f);
}

TEST(StochasticRounding, TheSameSeedGivesTheSameBitsAndAnotherSeedOthers) {
  const std::vector<float> values = Values(4 * 96, 11);
  for (const Format format : {Format::kMxfp4E2m1, Format::kMxfp8E5m2, Format::kInt8}) {
    SCOPED_TRACE(mx::FormatName(format));
    const auto a = mx::QuantizeRows(values, 4, 96, format, Stochastic(5));
    const auto b = mx::QuantizeRows(values, 4, 96, format, Stochastic(5));
    const auto c = mx::QuantizeRows(values, 4, 96, format, Stochastic(6));
    EXPECT_EQ(a->elements, b->elements);
    EXPECT_NE(a->elements, c->elements);
    EXPECT_EQ(a->block_scales, c->block_scales);  // scales are chosen as with nearest even
    EXPECT_EQ(a->row_scales, c->row_scales);
  }
}

// NaN, Inf and all-zero blocks come out as they do with nearest even: a NaN
// scale (or INT8 row scale) with zero codes, and byte 0 with zero codes.
TEST(StochasticRounding, SpecialAndZeroBlocksAsTheDeterministicModes) {
  std::vector<float> values(4 * 64, 0.0f);
  for (int i = 0; i < 64; ++i) values[64 + i] = 0.3f * (i + 1);
  values[64 + 3] = NAN;                  // row 1, first block: NaN
  values[128 + 40] = INFINITY;           // row 2, second block: Inf
  values[192 + 7] = -0.0f;               // row 3: zeros, one negative
  for (const Format format : {Format::kMxfp4E2m1, Format::kMxfp8E4m3, Format::kMxint8,
                              Format::kInt8}) {
    SCOPED_TRACE(mx::FormatName(format));
    const auto even = mx::QuantizeRows(values, 4, 64, format);
    const auto stochastic = mx::QuantizeRows(values, 4, 64, format, Stochastic(3));
    EXPECT_EQ(even->block_scales, stochastic->block_scales);
    ASSERT_EQ(even->row_scales.size(), stochastic->row_scales.size());
    for (size_t r = 0; r < even->row_scales.size(); ++r) {
      EXPECT_EQ(std::isnan(even->row_scales[r]), std::isnan(stochastic->row_scales[r]));
    }
    // Rows 0 (zeros), 2's Inf block and 3 (zeros): identical codes. Row 1's
    // first block is NaN: zero codes.
    for (int64_t r : {0, 3}) {
      for (int64_t c = 0; c < 64; ++c) {
        EXPECT_EQ(mx::ElementCode(*even, r, c), mx::ElementCode(*stochastic, r, c));
      }
    }
    if (mx::IsMx(format)) {
      EXPECT_EQ(even->block_scales[2], mx::kScaleNan);
      EXPECT_EQ(even->block_scales[5], mx::kScaleNan);
      for (int64_t c = 0; c < 32; ++c) EXPECT_EQ(mx::ElementCode(*stochastic, 1, c), 0u);
      for (int64_t c = 32; c < 64; ++c) EXPECT_EQ(mx::ElementCode(*stochastic, 2, c), 0u);
    }
  }
}

// Element (i, j) of the source draws index offset + i·stride + j, whichever
// way it is quantized: QuantizeColumns' codes are QuantizeRows' of the same
// element drawn at the same index, and a slice told its offset and stride gets
// the whole matrix's codes.
TEST(StochasticRounding, EveryQuantizerDrawsTheSourceIndex) {
  const int64_t k = 70, n = 37;
  const std::vector<float> values = Values(k * n, 13);
  const Format format = Format::kMxfp6E2m3;
  const QuantizeOptions options = Stochastic(77);
  const auto columns = mx::QuantizeColumns(values, k, n, format, options);
  const mx::StochasticBits bits(77, 0);
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t i = 0; i < k; ++i) {
      const int exponent = columns->block_scales[j * mx::BlocksPerRow(k) + i / 32] - 127;
      ASSERT_EQ(mx::ElementCode(*columns, j, i),
                mx::EncodeElement(format, values[i * n + j], Rounding::kStochastic, exponent,
                                  bits(i * n + j)))
          << i << ", " << j;
    }
  }
  // Rows [3, 9) of the whole, quantized alone.
  const auto whole = mx::QuantizeRows(values, k, n, format, options);
  QuantizeOptions slice_options = options;
  slice_options.index_offset = 3 * n;
  slice_options.index_row_stride = n;
  const auto slice = mx::QuantizeRows(std::span(values).subspan(3 * n, 6 * n), 6, n, format,
                                      slice_options);
  for (int64_t r = 0; r < 6; ++r) {
    for (int64_t c = 0; c < n; ++c) {
      EXPECT_EQ(mx::ElementCode(*slice, r, c), mx::ElementCode(*whole, r + 3, c));
    }
  }
  // Columns [5, 20) of the whole, as a K × 15 matrix of their own.
  std::vector<float> part(k * 15);
  for (int64_t i = 0; i < k; ++i) {
    for (int64_t j = 0; j < 15; ++j) part[i * 15 + j] = values[i * n + 5 + j];
  }
  slice_options.index_offset = 5;
  const auto part_columns = mx::QuantizeColumns(part, k, 15, format, slice_options);
  for (int64_t j = 0; j < 15; ++j) {
    for (int64_t i = 0; i < k; ++i) {
      EXPECT_EQ(mx::ElementCode(*part_columns, j, i), mx::ElementCode(*columns, j + 5, i));
    }
  }
}

// The fast quantizers, at every level and split across a pool, give the
// reference's bits: rows, columns (in panels), BF16 input, INT8.
TEST(StochasticRounding, FastQuantizersGiveTheReferenceBits) {
  const int64_t rows = 300, cols = 200;  // more than one task of rows and of panels
  const std::vector<float> values = Values(rows * cols, 17);
  std::vector<uint16_t> bf16(values.size());
  std::vector<float> widened(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    bf16[i] = mx::FloatToBf16(values[i]);
    widened[i] = mx::Bf16ToFloat(bf16[i]);
  }
  mx::kernels::ThreadPool pool(2);
  QuantizeOptions options = Stochastic(99);
  options.index_offset = 12345;
  for (const Format format : {Format::kMxfp4E2m1, Format::kMxfp8E4m3, Format::kInt8}) {
    for (const mx::kernels::Isa isa : mx::kernels::AvailableIsas()) {
      SCOPED_TRACE(absl::StrCat(mx::FormatName(format), " ", mx::kernels::IsaName(isa)));
      const auto rows_ref = mx::QuantizeRows(values, rows, cols, format, options);
      const auto rows_fast =
          mx::kernels::QuantizeRows(values, rows, cols, format, options, isa, &pool);
      EXPECT_EQ(rows_fast->elements, rows_ref->elements);
      EXPECT_EQ(rows_fast->block_scales, rows_ref->block_scales);
      EXPECT_EQ(rows_fast->row_scales, rows_ref->row_scales);
      const auto cols_ref = mx::QuantizeColumns(values, rows, cols, format, options);
      const auto cols_fast =
          mx::kernels::QuantizeColumns(values, rows, cols, format, options, isa, &pool);
      EXPECT_EQ(cols_fast->elements, cols_ref->elements);
      EXPECT_EQ(cols_fast->block_scales, cols_ref->block_scales);
      const auto bf16_ref = mx::QuantizeRows(widened, rows, cols, format, options);
      const auto bf16_fast = mx::kernels::QuantizeRows(bf16, Format::kBf16, rows, cols, format,
                                                       options, isa, &pool);
      EXPECT_EQ(bf16_fast->elements, bf16_ref->elements);
    }
  }
}

}  // namespace
