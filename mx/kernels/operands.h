// Operand conversion for the kernels (internal): element code tables, unpacking
// of the exchange layout, W into panels, X into its decoded rows.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "mx/kernels/gemm_internal.h"
#include "mx/kernels/thread_pool.h"
#include "mx/packed.h"

namespace mx::kernels::internal {

// Every code of an MX element format (up to 256): its fixed-point integer
// (value · 2^F), its value, and whether it is Inf/NaN.
struct CodeTable {
  int fraction_bits = 0;
  std::array<int64_t, 256> fixed{};  // E5M2 needs 33 bits
  std::array<float, 256> value{};
  std::array<bool, 256> special{};
};
const CodeTable& Codes(Format format);

// The codes of `blocks` packed blocks (one byte per code, padding included).
void UnpackCodes(Format format, const uint8_t* row, int64_t blocks, uint8_t* codes);

struct BlockInfo {
  bool special = false;   // an Inf/NaN element code
  bool all_zero = false;  // every element is ±0
  int span_bits = 0;      // bits from the lowest set bit of any |fixed| to the top of the largest
  int low_bit = 0;        // that lowest set bit: every element is a multiple of 2^low_bit
  int l1_bits = 0;        // bit width of Σ |fixed| >> low_bit (the shifted integers' L1 norm)
  uint64_t max = 0, l1 = 0;  // the shifted integers' largest magnitude and L1 norm
};
BlockInfo InspectBlock(const CodeTable& table, const uint8_t* codes);
// kMxF64's Cauchy–Schwarz bound (ShiftedPairFits): Σ (|fixed| >> low_bit)² of a
// block whose elements are multiples of 2^low_bit (InspectBlock's), exact where
// a double holds it and rounded up where it does not — a bound, never below.
// Apart from InspectBlock: only kMxF64 reads it, and only for int16 blocks.
double ShiftedSquares(const CodeTable& table, const uint8_t* codes, int low_bit);

// A block's scale as the epilogues use it (see gemm_internal.h).
struct BlockScales {
  int exponent = 0;     // scale − 127 − F
  double fast = 0.0;    // 2^exponent, 0 for an all-zero block, NaN
  double wide = 0.0;    // 2^exponent, NaN
  bool counts = false;  // neither all zero nor NaN: part of the operand's ScaleRange
};
BlockScales ScalesOf(uint8_t scale_byte, int fraction_bits, bool all_zero);

// kMxF64's int16 path (gemm_internal.h), one block of an operand:
// - the scale of its shifted integers, 2^(S − 127 − F + low_bit), counting in
//   the FastScalesOk range only where the block has int16 limbs at all;
// - the limb shift t: 0 for one limb, span − 15 for two, −1 past kShiftedSplitBits;
// - a fixed-point element as its limbs: v = fixed >> low_bit = high · 2^t + low,
//   0 <= low < 2^t.
BlockScales ShiftedScalesOf(uint8_t scale_byte, const CodeTable& table, const BlockInfo& info);
int LimbShift(const BlockInfo& info);
struct Limbs {
  int16_t high, low;
};
Limbs SplitLimbs(int64_t fixed, int low_bit, int shift);

// INT8 and MXINT8 operands of kInt8 / kMxI16 get a second copy for vpdpbusd: W
// as u8 w + kU8Offset (kMxI8's layout), X as i8 with the offset's share,
// −kU8Offset · Σ x, per block (kMxI16: both operands MXINT8) or per row (kInt8).
inline constexpr int kU8Offset = 128;
inline bool HasU8Copy(Kind kind, Format format) {
  return kind == Kind::kInt8 || (kind == Kind::kMxI16 && format == Format::kMxint8);
}

std::shared_ptr<WeightPanels> PackPanels(const QuantizedMatrix& w, Kind kind);
// The exchange layout back from panels: the same values and scales, so the
// reference computes the same bits from it (a −0 element may come back as +0).
// Not for panels of W with Inf/NaN codes, which PackedWeight keeps as they came.
QuantizedMatrix UnpackPanels(const WeightPanels& p);
// MX rows are decoded in tasks across `pool` when given and there is enough work.
DecodedX DecodeActivations(const QuantizedMatrix& x, Kind kind, Format w_format,
                           ThreadPool* pool = nullptr);

// All values in FP32: mx::Dequantize, with BF16/FP16/FP32 widened in one pass.
std::vector<float> DequantizeFast(const QuantizedMatrix& m);

}  // namespace mx::kernels::internal
