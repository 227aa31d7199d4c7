// Helpers shared by the GEMM kernel tests (linear_test, emulated_levels_test):
// inputs, the bit-for-bit comparison of a kernel run with the reference, and the
// check of the kernel table against a level's tile function.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "mx/kernels/gemm_internal.h"
#include "mx/kernels/linear.h"
#include "mx/kernels/operands.h"
#include "mx/packed.h"
#include "mx/reference_gemm.h"
#include "tests/float_bound.h"
#include "tests/same_bits.h"

namespace mx::kernels {

inline constexpr Format kMxFormats[] = {Format::kMxfp8E4m3, Format::kMxfp8E5m2,
                                        Format::kMxfp6E3m2, Format::kMxfp6E2m3,
                                        Format::kMxfp4E2m1, Format::kMxint8};

inline std::vector<float> Gaussian(size_t count, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(count);
  for (float& x : v) x = normal(rng);
  return v;
}

using mx_test::SameBits;  // the contract's rule: any two NaNs are equal

// The float paths' bound (DESIGN.md: FP32 accumulation in any order, held to
// FP64): |y − y64| <= K · 2^-24 · (Σ|x·w| + |bias|) — K roundings of partial
// sums that hold the bias where it comes first, as in the reference — with y64
// the sum in FP64 of the dequantized operands and the bias; a non-finite
// reference output must be matched by the same value (any NaN for a NaN).
inline void ExpectWithinFloatBound(const QuantizedMatrix& x, const QuantizedMatrix& w,
                                   std::span<const float> bias, std::span<const float> y,
                                   std::span<const float> reference, const std::string& what) {
  const std::vector<float> xv = Dequantize(x), wv = Dequantize(w);
  const int64_t k = x.cols;
  int failures = 0;
  for (int64_t i = 0; i < x.rows && failures < 5; ++i) {
    for (int64_t j = 0; j < w.rows && failures < 5; ++j) {
      const float got = y[i * w.rows + j], want = reference[i * w.rows + j];
      const mx_test::FloatBound at = mx_test::FloatBoundAt(xv, wv, bias, k, i, j);
      const bool ok =
          std::isfinite(want) ? std::fabs(got - at.exact) <= at.bound : SameBits(got, want);
      if (!ok) {
        ++failures;
        ADD_FAILURE() << what << ": y[" << i << "][" << j << "] = " << got << ", FP64 "
                      << at.exact << " ± " << at.bound << " (reference " << want << ")";
      }
    }
  }
}

// kBf16's guard, stated here on its own rather than through
// internal::Bf16PairsExact, so that a guard that moved fails the tests: the pair
// instructions may compute an output when every nonzero value of its X row and
// W row is normal (a subnormal counts as −127, Inf as 128), every nonzero
// product is at least 2^-96, and K · 2^(x_max+1) · 2^(w_max+1) <= 2^127; a row
// of zeros and NaNs has nothing to guard.
inline std::optional<std::pair<int, int>> Bf16RowExponents(std::span<const float> row) {
  std::optional<std::pair<int, int>> range;
  for (float v : row) {
    if (v == 0.0f || std::isnan(v)) continue;
    const int e = std::isinf(v) ? 128 : std::fabs(v) < 0x1p-126f ? -127 : std::ilogb(v);
    range = range ? std::pair{std::min(range->first, e), std::max(range->second, e)}
                  : std::pair{e, e};
  }
  return range;
}
inline bool Bf16PairsAllowed(const std::optional<std::pair<int, int>>& x,
                             const std::optional<std::pair<int, int>>& w, int64_t k) {
  if (!x || !w) return true;
  return x->first >= -126 && w->first >= -126 && x->first + w->first >= -96 &&
         x->second + w->second + static_cast<int>(std::bit_width(static_cast<uint64_t>(k))) + 2 <=
             127;
}

// BF16 × BF16: the outputs the guard refuses are computed in the exact order at
// every level, so they must be the reference's bits; the others only keep the
// float bound.
inline void ExpectRefusedOutputsHaveReferenceBits(const QuantizedMatrix& x,
                                                  const QuantizedMatrix& w,
                                                  std::span<const float> y,
                                                  std::span<const float> reference,
                                                  const std::string& what) {
  const std::vector<float> xv = Dequantize(x), wv = Dequantize(w);
  const int64_t k = x.cols;
  int failures = 0;
  for (int64_t i = 0; i < x.rows && failures < 5; ++i) {
    const auto x_range = Bf16RowExponents({xv.data() + i * k, static_cast<size_t>(k)});
    for (int64_t j = 0; j < w.rows && failures < 5; ++j) {
      const auto w_range = Bf16RowExponents({wv.data() + j * k, static_cast<size_t>(k)});
      if (Bf16PairsAllowed(x_range, w_range, k)) continue;
      const float got = y[i * w.rows + j], want = reference[i * w.rows + j];
      if (!SameBits(got, want)) {
        ++failures;
        ADD_FAILURE() << what << ": y[" << i << "][" << j << "] = " << got
                      << ", refused by the guard, differs from the reference's " << want;
      }
    }
  }
}

// Runs Linear (or, with `tiles`, the driver with those tried first) and compares
// every output with the reference, bit for bit — or, for BF16 × BF16 (kBf16,
// whose pair instructions sum in their own order), within the float paths'
// bound; on a mismatch, says where.
inline void ExpectSameAsReference(const QuantizedMatrix& x, const QuantizedMatrix& w,
                                  std::span<const float> bias, Isa isa, const std::string& what,
                                  ThreadPool* pool = nullptr, KernelInfo* info_out = nullptr,
                                  const internal::TileOverride* tiles = nullptr,
                                  std::vector<float>* y_out = nullptr) {
  const std::vector<float> expected = ReferenceLinear(x, w, bias).value();
  absl::StatusOr<PackedWeight> packed = PackedWeight::Pack(w);
  ASSERT_TRUE(packed.ok()) << packed.status();
  std::vector<float> y(x.rows * w.rows, -1.0f);
  const GemmOptions options{.isa = isa, .pool = pool};
  absl::StatusOr<KernelInfo> info = tiles ? internal::LinearWith(x, *packed, bias, y, options, tiles)
                                          : Linear(x, *packed, bias, y, options);
  ASSERT_TRUE(info.ok()) << info.status();
  if (info_out) *info_out = *info;
  if (y_out) *y_out = y;
  if (internal::KindFor(x.format, w.format) == internal::Kind::kBf16) {
    ExpectWithinFloatBound(x, w, bias, y, expected, what + " kernel " + info->name);
    ExpectRefusedOutputsHaveReferenceBits(x, w, y, expected, what + " kernel " + info->name);
    return;
  }
  int mismatches = 0;
  for (int64_t i = 0; i < x.rows && mismatches < 5; ++i) {
    for (int64_t j = 0; j < w.rows && mismatches < 5; ++j) {
      const float got = y[i * w.rows + j], want = expected[i * w.rows + j];
      if (!SameBits(got, want)) {
        ++mismatches;
        ADD_FAILURE() << what << " kernel " << info->name << ": y[" << i << "][" << j
                      << "] = " << got << " (0x" << std::hex << std::bit_cast<uint32_t>(got)
                      << "), reference " << want << " (0x" << std::bit_cast<uint32_t>(want)
                      << std::dec << ")";
      }
    }
  }
}

inline QuantizedMatrix Quantize(const std::vector<float>& v, int64_t rows, int64_t cols,
                                Format f) {
  return QuantizeRows(v, rows, cols, f).value();
}

// INT8 / MXINT8 operands whose every element is −128 (code 0x80): the byte
// paths' extreme, where W's u8 copy (w + 128) is 0 and the offset correction
// carries the whole dot.
inline QuantizedMatrix AllMinus128Int8(int64_t rows, int64_t cols, float scale) {
  QuantizedMatrix m;
  m.format = Format::kInt8;
  m.rows = rows;
  m.cols = cols;
  m.elements.assign(rows * cols, 0x80);
  m.row_scales.assign(rows, scale);
  return m;
}
inline QuantizedMatrix AllMinus128Mxint8(int64_t rows, int64_t cols, uint8_t scale) {
  QuantizedMatrix m;
  m.format = Format::kMxint8;
  m.rows = rows;
  m.cols = cols;
  m.elements.assign(rows * RowBytes(Format::kMxint8, cols), 0x80);
  m.block_scales.assign(rows * BlocksPerRow(cols), scale);
  return m;
}

// Operands for kMxF64's int16 path (gemm_internal.h) at and past its bounds, on a
// ragged shape with bias: Gaussian blocks (the int16 path) among planted ones —
// rows of X whose block holds four 448s and one 2^-6 (span 15, L1 17 bits: the
// bound is 2^32, one bit past int32, and the pair with a like block of W really
// has Σ x'w' > 2^31, so the int16 path must not take it), W rows with a
// subnormal beside 448 (span 18: two limbs), X rows likewise (two limbs, one
// against split W), blocks holding one large element and tiny ones (span 15,
// L1 15 bits: still int16), a NaN block and an all-zero block. `heavy_rows` /
// `heavy_cols` say where the 448 blocks are (block 1; also X row 4 and W row
// 24's block 0).
// In row-major values of K columns: W row 7's block 2 of span 31 (2^13 beside
// 2^-17 in E5M2: no int16 limbs) and X row 5's block 2 of one element (largest
// and L1 both 1). Their magnitudes alone would pass the int16 path's bound;
// only W's Inf (ShiftedPairFits) keeps the pair off it.
inline void PlantUnlimbedWAgainstOneElementX(std::vector<float>& xv, std::vector<float>& wv,
                                             int64_t k) {
  std::fill_n(wv.begin() + 7 * k + 64, 32, 0.0f);
  wv[7 * k + 64] = 0x1p13f;
  wv[7 * k + 65] = 0x1p-17f;
  std::fill_n(xv.begin() + 5 * k + 64, 32, 0.0f);
  xv[5 * k + 64] = 1.0f;
}

struct Int16BoundsCase {
  QuantizedMatrix x, w;
  std::vector<float> bias;
  std::vector<int64_t> heavy_rows = {3, 12, 13}, heavy_cols = {5, 20};
};
inline Int16BoundsCase Int16Bounds(Format x_format, Format w_format) {
  const int64_t m = 19, n = 37, k = 150;
  std::vector<float> xv = Gaussian(m * k, 61), wv = Gaussian(n * k, 62);
  Int16BoundsCase c;
  const auto heavy = [&](std::vector<float>& v, int64_t row, int64_t block = 1) {
    std::fill_n(v.begin() + row * k + 32 * block, 32, 0.0f);
    std::fill_n(v.begin() + row * k + 32 * block, 4, 448.0f);
    v[row * k + 32 * block + 7] = 0x1p-6f;
  };
  for (int64_t i : c.heavy_rows) heavy(xv, i);
  // X row 4 and W row 24 (panel 1) heavy in block 0 alone: a pair past int32
  // that, of a tile of two panels (0 and 1), only the second one has.
  heavy(xv, 4, 0);
  heavy(wv, 24, 0);
  // X row 12's block 2 too: it fails the bound against W rows 9 and 31 (below),
  // whose blocks are split into two limbs, so that row runs shifted, with its
  // residue, against split W.
  // X row 15's block 3 spans 18 bits (448 beside 2^-9): two limbs, and against
  // W's one-large-element blocks (rows 2 and 9, below) past the int32 bound, so
  // it runs its high limb shifted, plus both residues.
  xv[15 * k + 96] = 448.0f;
  xv[15 * k + 97] = 0x1p-9f;
  // X row 16's block 2 likewise, against W rows 9 and 31's split block 2: both
  // in two limbs.
  xv[16 * k + 64] = -448.0f;
  xv[16 * k + 66] = 0x1p-9f;
  std::fill_n(xv.begin() + 12 * k + 64, 32, 0.0f);
  std::fill_n(xv.begin() + 12 * k + 64, 4, -448.0f);
  xv[12 * k + 64 + 9] = 0x1p-6f;
  for (int64_t j : c.heavy_cols) heavy(wv, j);
  for (int64_t j : {9, 31}) {  // block 2: span 18
    wv[j * k + 64] = 448.0f;
    wv[j * k + 65] = 0x1p-9f;
  }
  for (int64_t r : {0, 7, 18}) {  // block 3: one large element, the rest tiny
    std::fill_n(xv.begin() + r * k + 96, 32, 0x1p-6f);
    xv[r * k + 100] = -448.0f;
    std::fill_n(wv.begin() + (r + 2) * k + 96, 32, -0x1p-6f);
    wv[(r + 2) * k + 101] = 448.0f;
  }
  xv[6 * k + 70] = std::nanf("");                     // X row 6, block 2: NaN scale
  std::fill_n(wv.begin() + 11 * k + 32, 32, 0.0f);    // W row 11, block 1: all zero
  c.x = Quantize(xv, m, k, x_format);
  c.w = Quantize(wv, n, k, w_format);
  c.bias = Gaussian(n, 63);
  return c;
}

// Rows [first, first + count) of an MX operand.
inline QuantizedMatrix MxRows(const QuantizedMatrix& m, int64_t first, int64_t count) {
  QuantizedMatrix out = m;
  const int64_t bytes = RowBytes(m.format, m.cols), blocks = BlocksPerRow(m.cols);
  out.rows = count;
  out.elements.assign(m.elements.begin() + first * bytes,
                      m.elements.begin() + (first + count) * bytes);
  out.block_scales.assign(m.block_scales.begin() + first * blocks,
                          m.block_scales.begin() + (first + count) * blocks);
  return out;
}

// A shifted row whose residue meets W's low limbs in two k-pairs, with a known
// answer: X rows 2 and 11 (E4M3) hold −448 four times and ±2^-6 at elements 9
// and 20 (k-pairs 4 and 10), span 15; W rows 3 and 17 (one in each panel of a
// tile call) hold 448, 2^-9, −448, 0 and ±2^-9 at elements 9 and 20, span 18:
// two limbs, low limbs in pairs 0, 4 and 10. The pair fails the int16 bound,
// so the row runs shifted (t = 3) and its residue is the two ±2^-6; the large
// products cancel and the block sum is −0.875 + 2^-15 + 2^-15, exactly
// kResidueMeetsLowLimbsAnswer. The rest is Gaussian; M = 16, N = 32, K = 32.
inline constexpr float kResidueMeetsLowLimbsAnswer = -0.875f + 0x1p-14f;
inline constexpr int64_t kResidueRows[] = {2, 11}, kResidueCols[] = {3, 17};
inline std::pair<QuantizedMatrix, QuantizedMatrix> ResidueMeetsLowLimbs() {
  const int64_t m = 16, n = 32, k = 32;
  std::vector<float> xv = Gaussian(m * k, 71), wv = Gaussian(n * k, 72);
  for (int64_t r : kResidueRows) {
    std::fill_n(xv.begin() + r * k, k, 0.0f);
    std::fill_n(xv.begin() + r * k, 4, -448.0f);
    xv[r * k + 9] = 0x1p-6f;
    xv[r * k + 20] = -0x1p-6f;
  }
  for (int64_t j : kResidueCols) {
    std::fill_n(wv.begin() + j * k, k, 0.0f);
    wv[j * k + 0] = 448.0f;
    wv[j * k + 1] = 0x1p-9f;
    wv[j * k + 2] = -448.0f;
    wv[j * k + 9] = 0x1p-9f;
    wv[j * k + 20] = -0x1p-9f;
  }
  return {Quantize(xv, m, k, Format::kMxfp8E4m3), Quantize(wv, n, k, Format::kMxfp8E4m3)};
}

// Operands at the edge of the int16 path's fast epilogue: X's blocks near 2^114
// (shifted exponent 100: within the 23-bit-dot kinds' limit of 104, past the
// 31-bit dots' 96), W's near 2^-102, so the results are ordinary floats but
// float(dot) · 2^100 would overflow. FastScalesOk must send the call to the FP64
// tiles.
inline std::pair<QuantizedMatrix, QuantizedMatrix> HugeShiftedScales(Format x_format,
                                                                     Format w_format) {
  const int64_t m = 9, n = 17, k = 64;
  std::vector<float> xv(m * k, 0.0f), wv(n * k, 0.0f);
  for (int64_t i = 0; i < m; ++i) {
    xv[i * k + 32] = 448.0f * 0x1p106f;
    xv[i * k + 33 + i % 5] = 0x1p100f;
  }
  for (int64_t j = 0; j < n; ++j) {
    wv[j * k + 32] = 448.0f * 0x1p-110f;
    wv[j * k + 34 + j % 7] = -0x1p-116f;
  }
  return {Quantize(xv, m, k, x_format), Quantize(wv, n, k, w_format)};
}

// An X block of two limbs (448 beside 2^-9, 18 bits) whose shifted scale,
// 2^(−120 − 9), is below FP32's normals: its FastScalesOk range must count it
// (else the split path would scale by a flushed 0), sending the call to the FP64
// tiles; the results are ordinary floats.
inline std::pair<QuantizedMatrix, QuantizedMatrix> TinyScaleWideX(Format w_format) {
  const int64_t m = 3, n = 17, k = 32;
  std::vector<float> xv(m * k, 0.0f), wv(n * k, 0.0f);
  for (int64_t i = 0; i < m; ++i) {
    xv[i * k + 0] = 448.0f * 0x1p-120f;
    xv[i * k + 1 + i] = 0x1p-129f;
  }
  for (int64_t j = 0; j < n; ++j) {
    wv[j * k + 0] = 448.0f * 0x1p100f;
    wv[j * k + 1 + j % 3] = 0x1p100f;
  }
  return {Quantize(xv, m, k, Format::kMxfp8E4m3), Quantize(wv, n, k, w_format)};
}

// The kernel table (internal::kHasKernel) against a level's tile function: for
// ordinary operands (Gaussian values, scales the fast epilogue takes) of every
// pair of formats, hence every kind and every layout of it (MXFP4 nibbles, FP16
// and BF16 weights), `select` returns a kernel exactly where the table says the
// level has the kind.
inline void ExpectTileFunctionMatchesTheTable(
    Isa level,
    const std::function<internal::TileKernel(internal::Kind, const internal::Problem&)>& select,
    const std::string& what) {
  const int64_t m = 5, n = 19, k = 70;
  bool seen[internal::kKinds] = {};
  uint32_t seed = 500;
  for (const FormatTraits& tx : AllFormats()) {
    for (const FormatTraits& tw : AllFormats()) {
      const internal::Kind kind = internal::KindFor(tx.format, tw.format);
      const QuantizedMatrix x = Quantize(Gaussian(m * k, ++seed), m, k, tx.format);
      const QuantizedMatrix w = Quantize(Gaussian(n * k, ++seed, 0.1f), n, k, tw.format);
      const auto panels = internal::PackPanels(w, kind);
      const internal::DecodedX decoded = internal::DecodeActivations(x, kind, tw.format);
      const internal::Problem problem{
          .x = &decoded,
          .w = panels.get(),
          .bias = nullptr,
          .y = nullptr,
          .x_format = tx.format,
          .n = n,
          .fast_scales = internal::FastScalesOk(decoded, *panels)};
      const std::string pair =
          absl::StrCat(what, ": ", tx.name, " x ", tw.name, " (", internal::KindName(kind), ")");
      ASSERT_TRUE(problem.fast_scales) << pair << ": not ordinary operands";
      const bool has_kernel = static_cast<bool>(select(kind, problem));
      EXPECT_EQ(has_kernel, internal::HasKernel(level, kind))
          << pair << ": the tile function returns " << (has_kernel ? "a kernel" : "none")
          << ", the table (kHasKernel) says " << IsaName(level)
          << (internal::HasKernel(level, kind) ? " has one" : " has none");
      seen[static_cast<int>(kind)] = true;
    }
  }
  for (int kind = 0; kind < internal::kKinds; ++kind) {
    EXPECT_TRUE(seen[kind]) << internal::KindName(static_cast<internal::Kind>(kind));
  }
}

// BF16 × BF16 operands on both sides of the pair instructions' guard (kBf16 in
// gemm_internal.h: per output, every nonzero value of X's row and W's row
// normal, every product at least 2^kBf16MinProductExp). Where it fails, a pair
// kernel that did not redo the output would flush what the reference keeps, and
// the float bound (or, for non-finite outputs, the reference's value) fails.
struct Bf16GuardCase {
  const char* what;
  QuantizedMatrix x, w;
  std::vector<float> bias = {};
};
inline std::vector<Bf16GuardCase> Bf16GuardCases() {
  const int64_t m = 9, n = 20, k = 70;  // two avx512 tiles of rows, a short panel
  const auto gaussian = [](int64_t rows, int64_t cols, uint32_t seed, float scale) {
    return Quantize(Gaussian(rows * cols, seed, scale), rows, cols, Format::kBf16);
  };
  std::vector<Bf16GuardCase> cases;
  // Gaussian rows whose first value sets the least exponent: −48 and −48 make
  // products of 2^-96 at the least, the bound (pairs); −49 and −48 fall below it
  // (the exact order, the reference's bits, which the pairs' order would miss).
  const auto least_at = [](int64_t rows, int64_t cols, uint32_t seed, int exponent) {
    std::vector<float> v = Gaussian(rows * cols, seed, 0x1p-20f);
    for (int64_t r = 0; r < rows; ++r) v[r * cols] = std::ldexp(1.0f, exponent);
    return Quantize(v, rows, cols, Format::kBf16);
  };
  cases.push_back({"least products 2^-96, at the bound", least_at(m, k, 600, -48),
                   least_at(n, k, 601, -48)});
  cases.push_back({"least products 2^-97, below it", least_at(m, k, 602, -49),
                   least_at(n, k, 603, -48)});
  // A product past FP32's range that the reference's FMA chain cancels:
  // x = (−1.5, 1.5, ...) · 2^127 against w = (1, 1.5, ...) — a pair
  // instruction would overflow on 1.5 · 2^127 · 1.5.
  std::vector<float> huge = Gaussian(m * k, 613), ones = Gaussian(n * k, 614);
  for (int64_t i = 0; i < m; ++i) {
    huge[i * k] = -0x1.8p127f;
    huge[i * k + 1] = 0x1.8p127f;
  }
  for (int64_t j = 0; j < n; ++j) {
    ones[j * k] = 1.0f;
    ones[j * k + 1] = 1.5f;
  }
  cases.push_back({"an overflowing product the exact order cancels",
                   Quantize(huge, m, k, Format::kBf16), Quantize(ones, n, k, Format::kBf16)});
  cases.push_back({"subnormal products", gaussian(m, k, 604, 0x1p-65f),
                   gaussian(n, k, 605, 0x1p-65f)});
  cases.push_back({"subnormal x", gaussian(m, k, 606, 0x1p-130f), gaussian(n, k, 607, 0x1p40f)});
  cases.push_back({"x all zero, a subnormal bias",
                   Quantize(std::vector<float>(m * k, 0.0f), m, k, Format::kBf16),
                   gaussian(n, k, 608, 1e-30f), std::vector<float>(n, 0x1p-140f)});
  // Infs and zeros in X, a subnormal in W: DAZ would make Inf · w NaN.
  std::vector<float> infs(m * k, 0.0f), tiny = Gaussian(n * k, 609);
  for (int64_t i = 0; i < m; ++i) infs[i * k + 3] = std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < n; ++j) tiny[j * k + 3] = 0x1p-130f;
  cases.push_back({"Inf x against a subnormal w", Quantize(infs, m, k, Format::kBf16),
                   Quantize(tiny, n, k, Format::kBf16)});
  // Per output: rows 2 and 7 of X tiny (2^-80), columns 5 and 17 of W holding a
  // subnormal; every other output runs the pair instructions.
  std::vector<float> xv = Gaussian(m * k, 610), wv = Gaussian(n * k, 611);
  for (int64_t i : {2, 7}) {
    for (int64_t c = 0; c < k; ++c) xv[i * k + c] *= 0x1p-80f;
  }
  for (int64_t j : {5, 17}) wv[j * k + 11] = 0x1p-128f;
  cases.push_back({"tiny rows and subnormal columns among ordinary ones",
                   Quantize(xv, m, k, Format::kBf16), Quantize(wv, n, k, Format::kBf16),
                   Gaussian(n, 612)});
  return cases;
}

// Y of `x` and `w` as `run` computes it; BF16 × BF16 rows and columns must not
// change bits with their batch-mates or with the slice of W they meet (the
// guard decides per output): rows [0, 9) alone and with tiny rows after them,
// W's rows [0, 20) alone and with rows holding a subnormal after them.
inline void ExpectBf16BitsIndependentOfBatchAndSlice(
    const std::function<std::vector<float>(const QuantizedMatrix&, const QuantizedMatrix&)>& run,
    const std::string& what) {
  const int64_t m = 9, extra = 8, n = 20, k = 100;
  std::vector<float> xv = Gaussian((m + extra) * k, 620), wv = Gaussian(2 * n * k, 621);
  for (int64_t i = m * k; i < (m + extra) * k; ++i) xv[i] *= 0x1p-90f;
  for (int64_t j = n; j < 2 * n; ++j) wv[j * k + 7] = 0x1p-129f;
  const QuantizedMatrix x_alone = Quantize({xv.begin(), xv.begin() + m * k}, m, k, Format::kBf16);
  const QuantizedMatrix x_batch = Quantize(xv, m + extra, k, Format::kBf16);
  const QuantizedMatrix w_slice = Quantize({wv.begin(), wv.begin() + n * k}, n, k, Format::kBf16);
  const QuantizedMatrix w_whole = Quantize(wv, 2 * n, k, Format::kBf16);
  const std::vector<float> alone = run(x_alone, w_slice);
  const std::vector<float> batched = run(x_batch, w_slice);
  const std::vector<float> whole = run(x_alone, w_whole);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      ASSERT_TRUE(SameBits(batched[i * n + j], alone[i * n + j]))
          << what << ": y[" << i << "][" << j << "] in a batch with tiny rows";
      ASSERT_TRUE(SameBits(whole[i * 2 * n + j], alone[i * n + j]))
          << what << ": y[" << i << "][" << j << "] against W with subnormal rows";
    }
  }
}

}  // namespace mx::kernels
