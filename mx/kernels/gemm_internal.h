// Internals shared by the GEMM driver (linear.cc), the weight packer
// (operands.cc) and the per-ISA tile kernels (gemm_scalar.cc, gemm_avx2.cc).
// Not part of the library's interface.
//
// Arithmetic kinds. An MX block dot is exact in each; what differs is the
// smallest integer or float type that holds it:
//
//   kMxI8   both operands in {MXFP4, MXFP6_E2M3, MXINT8}, not both MXINT8.
//           Elements are small integers after a fixed shift (FP4: ±12 in units
//           of 2^-1, E2M3: ±60 in 2^-3, MXINT8: ±127 in 2^-6). W is stored as
//           unsigned bytes w + offset so that u8·s8 multiplies (vpmaddubsw) can
//           take it; the offset's contribution, offset·Σx, is subtracted per
//           block through the X operand's `block_offset`.
//   kMxI16  pairs with MXFP6_E3M2 (±448 in 2^-4), and MXINT8 with itself:
//           16-bit integers, int16 pairs multiplied into int32 (vpmaddwd).
//   kMxF64  pairs with MXFP8 (E4M3: 18-bit integers, E5M2: 32-bit): elements
//           as doubles, products exact, the block sum exact in FP64 as long as
//           it spans at most 53 bits (always for E4M3). E5M2 blocks can span
//           more: the driver finds the outputs with such a pair of blocks after
//           the tiles and computes them again exactly (RedoWideOutputs).
//           Narrow blocks also come as int16 (the avx512 level's fast path):
//           a block whose fixed-point elements span at most 15 bits is stored
//           shifted right by its lowest set bit (exact: every element is a
//           multiple of it), the shift folded into its scale. For a pair of
//           such blocks |Σ x'w'| <= max|x'| · Σ|w'|, and likewise with the
//           roles swapped: where either bound is below 2^31 the dot is exact in
//           int32 (vpdpwssd wraps, but the true sum fits) and takes the fast
//           epilogue (FastScalesOk with 31-bit dots). ShiftedPairFits says it,
//           from the exact magnitudes; the bit widths (span, and l1 for
//           Σ|v'|) bound the shifts of the rows that fail.
//           A W block spanning 16 to 30 bits is split into two int16 limbs,
//           w' = h · 2^s + l with s = span − 15, h = w' >> s and 0 <= l < 2^s:
//           the dot is (Σ x'h) · 2^s + Σ x'l, computed in wrapping int32 —
//           exact wherever the bound above holds for w' itself, since the true
//           sum fits and every step is exact mod 2^32. X blocks of 16 to 30
//           bits are decoded into limbs the same way (SplitLimbs, operands.h);
//           a row failing the bound is shifted right until it fits, its few
//           small residue elements dotted apart (avx512's MxF64ShiftedTile).
//   kInt8   INT8 × INT8 (per-row scales): int32 over the whole K (int16 pairs,
//           or at avx512 vpdpbusd on W's u8 copy).
//   kNvI8   NVFP4 × NVFP4: E2M1 elements as in kMxI8 (±12 in units of 2^-1, W
//           as u8 w + 12), blocks of 16. The block result, float(dot) · S_x/2 ·
//           S_w/2 with UE4M3 scales S, is exact in FP32 (12 + 4 + 4 bits), so
//           the fast epilogue is always exact; after the last block each
//           output is multiplied by fp32(ts_x · ts_w) (the tensor scales) and
//           the bias added.
//   kF32    everything else (FP16, FP32, mixed kinds): both dequantized to
//           FP32, FMA accumulation in any order (tolerance, not bits).
//   kBf16   BF16 × BF16: as kF32 (scalar and avx2 run kF32's tile, the
//           reference's bits), and at avx512 with AVX512_BF16 pairs of k on
//           vdpbf16ps, at amx on TDPBF16PS tiles. Those instructions treat
//           subnormal inputs and results as zero; every other step is an FP32
//           product (exact: 8 × 8 significand bits) and an RNE add, so the
//           result keeps the float paths' bound |y − y64| <= K · 2^-24 ·
//           (Σ|x·w| + |bias|) wherever no flush can matter and no partial sum
//           can overflow. That is decided per output (Bf16PairsExact, from the
//           least and greatest exponents of X's row and W's row).
//           The kernels compute a tile with the pair instructions and
//           then the outputs that fail again in the exact order (the
//           reference's bits): a row's bits depend on its own data and W's,
//           never on its batch-mates or on how W is sliced.
//
// Block result (contract step 1): dot · 2^(ex + ew) rounded once to FP32, with
// ex = scale_x − 127 − F_x (F = the format's fraction bits) and likewise ew.
//   fast  (kMxI8/kMxI16, and kMxF64's int16 path at avx512): t = float(dot) ·
//         2^ex, y = fma(t, 2^ew, y). Exact only while every scale keeps t and
//         t·2^ew normal; the driver checks the exponent ranges of both operands
//         first (FastScalesOk).
//   wide  (scalar, kMxF64): float(double(dot) · 2^ex · 2^ew): the product is
//         exact in FP64 and the conversion is the one rounding, subnormals and
//         overflow included.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "mx/format.h"
#include "mx/kernels/cpu_features.h"

namespace mx::kernels::internal {

// Output columns (rows of W) per packed panel.
inline constexpr int kPanel = 16;

enum class Kind : uint8_t { kMxI8, kMxI16, kMxF64, kInt8, kNvI8, kF32, kBf16 };

// kBf16's bound on the products the pair instructions may see (see kBf16).
inline constexpr int kBf16MinProductExp = -96;
// The least and greatest exponents, floor(log2 |v|), of the nonzero values of a
// BF16 row (a subnormal counts as −127, an Inf as 128); a row whose values are
// all zero or NaN has kNoExponent and −kNoExponent: nothing there a flush or an
// overflow could change.
inline constexpr int16_t kNoExponent = 1000;
// kBf16's guard for one output, from those exponents of X's row and W's row and
// K < 2^k_bits: true when the pair instructions compute it within the float
// bound — no flush can matter (every nonzero value normal, every nonzero
// product at least 2^kBf16MinProductExp, so a flushed partial sum, < 2^-126,
// is below 2^-30 of any product) and no partial sum can overflow (each below
// K · 2^(x_max + 1) · 2^(w_max + 1) <= 2^127, where an FMA chain might have
// cancelled an overflowing product). Nondecreasing in the least exponents,
// nonincreasing in the greatest, so a panel's extremes answer for all its lanes
// at once when they pass.
constexpr bool Bf16PairsExact(int x_min, int x_max, int w_min, int w_max, int k_bits) {
  if (x_min == kNoExponent || w_min == kNoExponent) return true;
  return x_min >= -126 && w_min >= -126 && x_min + w_min >= kBf16MinProductExp &&
         x_max + w_max + k_bits + 2 <= 127;
}

// True when W packed for kind `a` serves kind `b` as it is: the same kind, or
// kF32 and kBf16 (one layout for float W, see WeightPanels).
constexpr bool SharesLayout(Kind a, Kind b) {
  const auto is_float = [](Kind k) { return k == Kind::kF32 || k == Kind::kBf16; };
  return a == b || (is_float(a) && is_float(b));
}

const char* KindName(Kind kind);

// The kind a pair of operand formats computes in.
Kind KindFor(Format x, Format w);

// Offset added to each W byte of kind kMxI8: the largest |element| of W's format.
int I8Offset(Format w);

// Exponent range of an operand's effective block scales (2^e applied to the
// integer dot), over blocks that are neither all zero nor NaN; empty when no
// block counts.
struct ScaleRange {
  int min = 1 << 20;
  int max = -(1 << 20);
  void Add(int e) {
    min = e < min ? e : min;
    max = e > max ? e : max;
  }
  bool empty() const { return min > max; }
};

// True when the fast float epilogue, float(dot) · 2^ex · 2^ew with
// 1 <= |dot| < 2^dot_bits, is exact for every pair of blocks.
bool FastScalesOk(const ScaleRange& x, const ScaleRange& w, int dot_bits);
struct DecodedX;
struct WeightPanels;
// The same for a pair of operands, with the bound on |dot| of their kind.
bool FastScalesOk(const DecodedX& x, const WeightPanels& w);

// Integer block dots of kMxF64's int16 path: X's block at most 15 bits wide
// (int16), W's at most 30 (two int16 limbs beyond 15), the dot below 2^31.
inline constexpr int kShiftedI16Bits = 15, kShiftedSplitBits = 30, kShiftedDotBits = 31;
// True when the int16 path computes the dot of an X block and a W block
// exactly (see kMxF64 above): |Σ x'w'| <= Σ|x'w'| < 2^31, so the wrapping int32
// sum is the true one. Three bounds on Σ|x'w'|, any of which will do:
// max|x'|·Σ|w'|, Σ|x'|·max|w'|, and Cauchy–Schwarz, (Σx'²·Σw'²)^½ — the last,
// squared, against 2^62. On Gaussian blocks the third is the tightest (in a
// numpy model of mx_bench's E4M3 layer the rows that fail against a tile's two
// panels go from 7.7 % to 4.5 %), the first two win where one element
// dominates. From each block's largest |v'|, Σ|v'| (InspectBlock) and Σv'²
// (ShiftedSquares) in FP64: the first two exact for these integers, Σv'² rounded up, and a
// product's rounding is monotonic, so a product below a power of two means the
// exact one is. +Inf on a side with no int16 form (an X block wider than
// kShiftedI16Bits, a W block wider than kShiftedSplitBits: Inf times anything
// is Inf or NaN, never below the limit). A panel's block keeps the largest of
// its lanes' (WeightPanels::fit_max, fit_l1, fit_sq): one test for all 16.
constexpr bool ShiftedPairFits(double x_max, double x_l1, double x_sq, double w_max, double w_l1,
                               double w_sq) {
  constexpr double kLimit = 2147483648.0;         // 2^kShiftedDotBits
  constexpr double kSquaredLimit = kLimit * kLimit;  // 2^62
  return x_max * w_l1 < kLimit || x_l1 * w_max < kLimit || x_sq * w_sq < kSquaredLimit;
}

// W converted for one kind: N rows padded to whole panels, K to whole blocks of
// 32, padding zero. Element (n, k) of panel p = n / 16, lane j = n % 16:
//   kMxI8   u8  [p][k/4][16][4]   w + offset; for MXFP4 W (nibbles set) half of
//           that: u8 [p][k/8][2][8][4], the byte of (group pair, half h, lane l,
//           k % 4) holding the 4-bit codes of groups 2q (low nibble) and 2q + 1
//           (high nibble); nibble_lut turns a code into w + offset, so a
//           vpshufb gives the kernel the same bytes as the wide layout
//   kMxI16  i16 [p][k/2][16][2]; MXINT8 W also u8 [p][k/4][16][4] w + 128
//   kInt8   i16 [p][k/2][16][2] and u8 [p][k/4][16][4] w + 128 (kU8Offset,
//           operands.h: for vpdpbusd at avx512)
//   kMxF64  u16 [p][k][16]        FP16 bits of the element's value (exact),
//           and i16 [p][k/2][16][2]: the block's fixed-point elements shifted
//           right by the block's lowest set bit where the block spans at most
//           kShiftedI16Bits, the high limb h where it spans at most
//           kShiftedSplitBits (else 0, never read: the FP64 path takes it); the
//           low limbs l of a panel's block with any split lane in i16_lo,
//           [16][16][2] from split_at[p][block] (−1: none), the lanes' shifts s
//           in split_shift [p][block][16] (0: not split)
//   kNvI8   u8  [p][k/4][16][4]   w + 12, as kMxI8's wide storage (blocks of 16)
//   kF32    in W's own precision (float_store says which): f32 [p][k][16]
//   kBf16   (FP32, and any other format dequantized), u16 FP16 bits [p][k][16],
//           or u16 BF16 bits in pairs of k, [p][k/2][16][2] — the operand
//           layout of vdpbf16ps and of TDPBF16PS's B tile; each 32-bit word is
//           one lane's (k even, k odd), so the exact-order kernels widen the
//           even k by a left shift and the odd one by masking the low half.
// Scales, MX kinds and kNvI8: [p][block][16] (kNvI8: S/2, NaN for a NaN block;
// kMxF64: `scale` is the int16 path's 2^(ew + low_bit), `scale_d` the FP64 path's);
// kInt8: [p][16] (the row scales); kF32: none. kNvI8 also keeps the tensor scale
// of each row of W in tensor_scale.
struct WeightPanels {
  Kind kind = Kind::kF32;
  Format format = Format::kFp32;
  int64_t n = 0, k = 0, k_padded = 0, blocks = 0, panels = 0;
  std::vector<uint8_t> u8;
  std::vector<int16_t> i16;
  std::vector<uint16_t> f16;
  std::vector<float> f32;
  std::vector<float> scale;     // fast epilogue: 2^ew, 0 for an all-zero block, NaN
  std::vector<double> scale_d;  // wide epilogue: 2^ew, NaN
  std::vector<uint8_t> scale_bytes;  // MX: the E8M0 bytes, N × blocks, for unpacking
  Format float_store = Format::kFp32;  // kF32: kFp32, kFp16 or kBf16
  ScaleRange range;  // MX: block scale exponents
  // BF16 store: each lane's least and greatest exponents (panels × 16, see
  // kNoExponent), and each panel's extremes over its lanes.
  std::vector<int16_t> min_exp, max_exp, panel_min_exp, panel_max_exp;
  int i8_offset = 0;
  bool nibbles = false;                 // kMxI8 with MXFP4 W: 4-bit codes, see above
  std::array<uint8_t, 16> nibble_lut{};  // FP4 code -> w + offset
  bool has_special = false;  // an element code is Inf or NaN: the reference path
  int max_span_bits = 0;     // kMxF64: widest block, in bits of its fixed-point values
  std::vector<uint8_t> span_bits;  // kMxF64: every block's span, N × blocks (row-major)
  std::vector<double> fit_max, fit_l1, fit_sq;  // kMxF64: [p][block], see ShiftedPairFits
  std::vector<uint8_t> panel_l1;    // kMxF64: [p][block], the largest l1 bits of its lanes
  std::vector<int16_t> i16_lo;       // kMxF64: the low limbs of split blocks (see above)
  std::vector<int32_t> split_at;     // kMxF64: [p][block], offset into i16_lo or −1
  std::vector<uint16_t> split_pairs;  // kMxF64: [p][block], bit j: some low limb of pair j is not 0
  std::vector<uint8_t> split_shift;  // kMxF64: [p][block][16] limb shift s, 0 unsplit
  std::vector<float> tensor_scale;  // kNvI8: W's row scales, N values

  size_t bytes() const {
    return u8.size() + scale_bytes.size() + span_bits.size() +
           panel_l1.size() + split_shift.size() +
           2 * (i16.size() + i16_lo.size() + f16.size() + min_exp.size() + max_exp.size() +
                panel_min_exp.size() + panel_max_exp.size()) +
           2 * split_pairs.size() +
           4 * (f32.size() + scale.size() + tensor_scale.size() + split_at.size()) +
           8 * (scale_d.size() + fit_max.size() + fit_l1.size() + fit_sq.size());
  }
};

// Where panel `panel`'s u8 bytes start (the layouts above): k_padded × 16 bytes
// a panel, half that for MXFP4's 4-bit codes (`nibbles`, as w.nibbles says).
inline const uint8_t* U8Panel(const WeightPanels& w, int64_t panel, bool nibbles) {
  return w.u8.data() + panel * w.k_padded * kPanel / (nibbles ? 2 : 1);
}

// A vector whose resize() leaves trivial elements uninitialized (value-less
// construct() default-initializes): for DecodedX's per-element arrays, which
// the row tasks of DecodeActivations write in full, padding included, across
// the caller's pool. Zero-filling them first was a serial pass over up to
// 5.5 MB: MXFP8 at M = 512 on the Zen 5, 0.58–0.67 ms (one thread) in the
// caller before any task ran, about 1.5 % of a one-thread GEMM but, by Amdahl,
// an estimated sixth of a sixteen-thread one.
template <typename T>
struct DefaultInitAllocator : std::allocator<T> {
  template <typename U>
  struct rebind {
    using other = DefaultInitAllocator<U>;
  };
  DefaultInitAllocator() = default;
  template <typename U>
  DefaultInitAllocator(const DefaultInitAllocator<U>&) noexcept {}
  template <typename U, typename... Args>
  void construct(U* at, Args&&... args) {
    if constexpr (sizeof...(Args) == 0) {
      ::new (static_cast<void*>(at)) U;
    } else {
      ::new (static_cast<void*>(at)) U(std::forward<Args>(args)...);
    }
  }
};
template <typename T>
using RowArray = std::vector<T, DefaultInitAllocator<T>>;

// X decoded for one kind: row-major rows × k_padded, padding zero.
//   kMxI8/kNvI8 i8, kMxI16/kInt8 i16 (and i8 with block_offset where W has
//   the u8 copy: kInt8, MXINT8 × MXINT8), kMxF64 f64 (element values) and i16 (the
//   shifted integers of blocks spanning at most kShiftedI16Bits, as W's; the high
//   limb up to kShiftedSplitBits, see i16_lo), kF32 f32, kBf16 f32 and bf16.
// Scales [row][block] for MX kinds (as in WeightPanels), [row] for kInt8.
struct DecodedX {
  Kind kind = Kind::kF32;
  int64_t rows = 0, k_padded = 0, blocks = 0;
  RowArray<int8_t> i8;
  RowArray<int16_t> i16;
  RowArray<double> f64;
  RowArray<float> f32;
  RowArray<uint16_t> bf16;  // kBf16: X's BF16 bits, rows × k_padded (pairs of k)
  std::vector<float> scale;
  std::vector<double> scale_d;
  std::vector<int32_t> block_offset;  // kMxI8, kNvI8 (and i8 copies): −offset_w · Σ x over the block (kInt8: the row)
  std::vector<float> tensor_scale;    // kNvI8: X's row scales
  ScaleRange range;              // MX: block scale exponents
  std::vector<int16_t> min_exp, max_exp;  // kBf16: per row, see kNoExponent
  bool has_special = false;
  int max_span_bits = 0;
  std::vector<uint8_t> span_bits;  // kMxF64: every block's span, rows × blocks
  // kMxF64: a block spanning 16 to 30 bits as two limbs, x' = h · 2^t + l: h in
  // i16, l here (rows × k_padded, 0 elsewhere), t in split_shift (rows × blocks).
  RowArray<int16_t> i16_lo;
  std::vector<uint8_t> split_shift;
  // kMxF64: each block's largest |x'|, Σ|x'| and Σx'² (ShiftedPairFits), eight
  // rows of a block together, [rows / 8][block][8] (FitAt): one vector each.
  std::vector<double> fit_max, fit_l1, fit_sq;
};

inline constexpr int kFitRows = 8;
inline int64_t FitAt(int64_t row, int64_t block, int64_t blocks) {
  return ((row / kFitRows) * blocks + block) * kFitRows + row % kFitRows;
}

// One GEMM as the tile kernels see it.
struct Problem {
  const DecodedX* x;
  const WeightPanels* w;
  const float* bias;  // nullptr or N values
  float* y;           // M × N row-major
  Format x_format;
  int64_t n;
  bool fast_scales;   // the fast epilogue is exact for this pair (kMxI8/kMxI16, kMxF64's int16)
};

inline constexpr int kMaxTileRows = 4;
// Rows per call of the avx512 level's kernels: eight rows of accumulators keep
// both vector pipes busy through the FMA/VNNI latency (four left them half idle).
inline constexpr int kAvx512TileRows = 8;
// MxF64ShiftedTile reads X's fit_max, fit_l1 and fit_sq a tile at a time.
static_assert(kFitRows == kAvx512TileRows);
// Rows per call of the amx level's kernels: two AMX tiles of X (16 rows each),
// against two panels of W, in all eight tile registers (gemm_amx.cc).
inline constexpr int kAmxTileRows = 32;

// Up to 4 × 16 outputs of one tile in FP32, started from the bias (or +0.0) when
// asked; a tile kernel accumulates here and Store() writes the valid columns to
// y. In an unnamed namespace on purpose: each ISA file gets its own inlined copy
// (with internal linkage), so the linker can never hand the scalar level a copy
// compiled for AVX2, and the buffer never escapes the kernel, which keeps GCC
// from reloading operands after every store to it (out-of-line members cost
// MXFP4 at M = 8 a quarter of its speed).
namespace {
struct alignas(32) Tile {
  float y[kMaxTileRows][kPanel];
  int64_t n0;
  int cols;  // valid columns of this panel: min(16, N − n0)

  Tile(const Problem& p, int64_t panel, bool with_bias)
      : n0(panel * kPanel), cols(static_cast<int>(std::min<int64_t>(kPanel, p.n - n0))) {
    for (auto& row : y) {
      for (int j = 0; j < kPanel; ++j) {
        row[j] = (with_bias && p.bias && j < cols) ? p.bias[n0 + j] : 0.0f;
      }
    }
  }
  void Store(const Problem& p, int64_t row0, int rows) const {
    for (int r = 0; r < rows; ++r) {
      std::memcpy(p.y + (row0 + r) * p.n + n0, y[r], cols * sizeof(float));
    }
  }
};
}  // namespace

// The TileFn that runs the tile function template `tile<MR, args...>` with MR
// the row count (1..4): how each ISA file names its kernels, one expression per
// kernel, instantiated with that file's instructions (a captureless lambda
// converts to a TileFn, declared below).
#define MX_BY_ROWS(tile, ...)                                                        \
  (+[](const Problem& p_, int64_t row0_, int rows_, int64_t panel_) {                 \
    switch (rows_) {                                                                  \
      case 1: return tile<1 __VA_OPT__(, ) __VA_ARGS__>(p_, row0_, rows_, panel_);    \
      case 2: return tile<2 __VA_OPT__(, ) __VA_ARGS__>(p_, row0_, rows_, panel_);    \
      case 3: return tile<3 __VA_OPT__(, ) __VA_ARGS__>(p_, row0_, rows_, panel_);    \
      default: return tile<4 __VA_OPT__(, ) __VA_ARGS__>(p_, row0_, rows_, panel_);   \
    }                                                                                 \
  })

// The same for the avx512 level's kAvx512TileRows (1..8).
#define MX_BY_ROWS_8(tile, ...)                                                      \
  (+[](const Problem& p_, int64_t row0_, int rows_, int64_t panel_) {                 \
    switch (rows_) {                                                                  \
      case 1: return tile<1 __VA_OPT__(, ) __VA_ARGS__>(p_, row0_, rows_, panel_);    \
      case 2: return tile<2 __VA_OPT__(, ) __VA_ARGS__>(p_, row0_, rows_, panel_);    \
      case 3: return tile<3 __VA_OPT__(, ) __VA_ARGS__>(p_, row0_, rows_, panel_);    \
      case 4: return tile<4 __VA_OPT__(, ) __VA_ARGS__>(p_, row0_, rows_, panel_);    \
      case 5: return tile<5 __VA_OPT__(, ) __VA_ARGS__>(p_, row0_, rows_, panel_);    \
      case 6: return tile<6 __VA_OPT__(, ) __VA_ARGS__>(p_, row0_, rows_, panel_);    \
      case 7: return tile<7 __VA_OPT__(, ) __VA_ARGS__>(p_, row0_, rows_, panel_);    \
      default: return tile<8 __VA_OPT__(, ) __VA_ARGS__>(p_, row0_, rows_, panel_);   \
    }                                                                                 \
  })

// The kMxI8 bytes (w + offset) of one block of a panel, [k in block][lane], from
// either storage: for the scalar kernel; the SIMD kernels read whole vectors.
void I8WeightBlock(const WeightPanels& w, int64_t panel, int64_t block,
                   uint8_t (&out)[kBlockSize][kPanel]);

// Computes y[row0, row0 + rows) × [16·panel, 16·(panel + panels)) ∩ N, all of
// K, from the bias (or +0.0), `panels` being its TileKernel's. rows <=
// TileRows(level) of the level it belongs to.
using TileFn = void (*)(const Problem& p, int64_t row0, int rows, int64_t panel);
// A level's kernel for a kind: its function and how many consecutive panels of
// W one call takes (the driver gives each call a first panel that is a
// multiple of it; the last call of N may have fewer).
struct TileKernel {
  TileFn fn = nullptr;
  int panels = 1;
  TileKernel(TileFn f = nullptr, int n = 1) : fn(f), panels(n) {}  // NOLINT: from a TileFn
  explicit operator bool() const { return fn != nullptr; }
};

// Which ISA levels have a tile kernel of their own for each kind: the one table
// of it. The driver runs a kind at LevelFor(kind, requested), and where that
// level's tile function declines the operands (kMxI8/kMxI16 whose scales the
// fast epilogue cannot take exactly) at the next level down that has the kind,
// scalar in the end. The kernel names that Linear reports, KernelNameFor
// (linear.h), and the tests' expectations all follow from it. A level marked
// here returns a kernel for ordinary operands of the kind, and one not marked
// returns nullptr for every operand: linear_test (real levels) and
// emulated_levels_test (avx512 and amx, on any AVX2 machine) check both ways.
inline constexpr int kKinds = 7;
inline constexpr int kIsaLevels = 4;
// kHasKernel[kind][level]. Not inline: each file that reads it gets its own
// copy, never a weak symbol that an AVX2 object could share (see Tile below).
constexpr bool kHasKernel[kKinds][kIsaLevels] = {
    //            scalar avx2  avx512 amx
    /* kMxI8  */ {true, true, true, false},
    /* kMxI16 */ {true, true, true, false},
    /* kMxF64 */ {true, true, true, false},
    /* kInt8  */ {true, true, true, false},
    /* kNvI8  */ {true, true, true, false},
    /* kF32   */ {true, true, true, false},
    /* kBf16  */ {true, true, true, true},
};
static_assert(static_cast<int>(Kind::kBf16) + 1 == kKinds &&
              static_cast<int>(Isa::kAmx) + 1 == kIsaLevels);
static_assert(
    [] {
      for (const auto& levels : kHasKernel) {
        if (!levels[static_cast<int>(Isa::kScalar)]) return false;
      }
      return true;
    }(),
    "the scalar level has every kind: the last resort of the driver");


// Rows a tile function of `level` takes per call.
constexpr int TileRows(Isa level) {
  return level == Isa::kAmx ? kAmxTileRows : level == Isa::kAvx512 ? kAvx512TileRows : kMaxTileRows;
}

bool HasKernel(Isa level, Kind kind);
// The best level at or below `requested` that has a kernel for `kind`.
Isa LevelFor(Kind kind, Isa requested);
// "<level>/<kind>", the form of KernelInfo::name.
std::string KernelName(Isa level, Kind kind);

// The tile kernel of a kind at an ISA level, nullptr where the level has none
// for that kind or declines these operands (the driver then takes the next
// level down that has the kind).
TileKernel ScalarTile(Kind kind);
TileKernel Avx2Tile(Kind kind, const Problem& p);
TileKernel Avx512Tile(Kind kind, const Problem& p);
// Takes up to kAmxTileRows rows per call and writes y itself (no Tile).
TileKernel AmxTile(Kind kind, const Problem& p);
// The one of the four above for `level`. Only for levels this CPU runs: the
// avx512 and amx files are compiled with those instructions.
TileKernel TileAt(Isa level, Kind kind, const Problem& p);

// Tile kernels a test supplies in place of a level's own (the avx512 kernels
// compiled against SIMDe run this way on CPUs without AVX-512): tried first;
// where `select` returns nullptr the driver takes its usual levels.
struct TileOverride {
  TileKernel (*select)(Kind kind, const Problem& p);
  const char* name;  // the level name KernelInfo reports for them
  int rows = kMaxTileRows;  // rows per call they take
};

}  // namespace mx::kernels::internal
