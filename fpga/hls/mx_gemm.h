// The FPGA GEMM engine's interface: Y (M×N, FP32) = X (M×K) · Wᵀ (N×K) (+ bias),
// both operands in the mx/ packed layout, under the numerics contract of
// DESIGN.md. Everything the host must agree on lives here: the port layout, the
// control register, the size limits. No vendor or project headers beyond the
// HLS shim, so Vitis synthesizes it as is.
//
// Memory layout (every port an array of 64-bit little-endian words):
//   x, w        rows of ceil(K/32) blocks; a block is the 32 element codes as one
//               little-endian bit string of 32·bits, i.e. bits/2 words (FP4 2,
//               FP6 3, FP8/INT8 4, BF16/FP16 8, FP32 16). For the MX formats this
//               is byte for byte the mx/ packed layout; the others are padded
//               with zero codes to whole blocks. NVFP4: a block is two of its
//               16-element blocks (2k, 2k + 1), one word each, as mx/ packs
//               them; a row with an odd count ends in a zero word.
//   x_scales,   MX: the E8M0 scale bytes, rows × blocks, row-major.
//   w_scales    INT8: one FP32 scale per row, 4 bytes each.
//               NVFP4: the UE4M3 bytes of both halves, rows × blocks × 2,
//               row-major (a missing second half's byte is 0), then from the
//               next whole word (NvRowScaleWord) the rows' FP32 tensor scales.
//               NF4, BNB_FP4: one FP32 absmax per block, rows × blocks (the
//               64-element block's, so each appears twice). Others: unused.
//   bias        N FP32 values (read only when the control register says so).
//   y           M×N FP32, row-major.
#pragma once

#include <cstdint>

namespace mxhls {

using Word = uint64_t;

// The processing-element array: PE (r, c) accumulates Y[m0 + r][n0 + c]. Compile
// time parameters (-DMXHLS_PE_ROWS=...); the defaults are the array the model
// and fpga/README.md describe: 8 rows, so a rollout decode step of 8 sequences
// fills every row, and 128 columns of W held on chip.
#ifndef MXHLS_PE_ROWS
#define MXHLS_PE_ROWS 8
#endif
#ifndef MXHLS_PE_COLS
#define MXHLS_PE_COLS 128
#endif
inline constexpr int kPeRows = MXHLS_PE_ROWS;
inline constexpr int kPeCols = MXHLS_PE_COLS;

inline constexpr int kBlock = 32;
// The longest K: the on-chip W tile holds kPeCols rows of kMaxK elements of the
// widest format (FP32: 128 rows · 16384 · 4 bytes = 8 MiB of URAM; MXFP4 uses
// an eighth of it). Every linear layer of Qwen2.5 up to 3B fits.
inline constexpr int kMaxK = 16384;
inline constexpr int kMaxBlocks = kMaxK / kBlock;
inline constexpr int kMaxWordsPerBlock = 16;  // FP32
// The INT8 path's int32 dot holds K ≤ 2^17 products of ±127 exactly; kMaxK is below.
static_assert(kMaxK <= (1 << 17));

// Element formats as the hardware numbers them (the control register's fields).
enum HwFormat : uint32_t {
  kHwE4m3 = 0,    // MXFP8_E4M3
  kHwE5m2 = 1,    // MXFP8_E5M2
  kHwE3m2 = 2,    // MXFP6_E3M2
  kHwE2m3 = 3,    // MXFP6_E2M3
  kHwE2m1 = 4,    // MXFP4_E2M1
  kHwMxInt8 = 5,  // MXINT8
  kHwInt8 = 6,    // INT8, FP32 scale per row
  kHwBf16 = 7,
  kHwFp16 = 8,
  kHwFp32 = 9,
  kHwNvfp4 = 10,  // E2M1 in 16-element blocks, UE4M3 block and FP32 tensor scales
  kHwNf4 = 11,     // codebooks: a 16-entry table (ROM) and an FP32 absmax per
  kHwBnbFp4 = 12,  // 64-element block, on the float path
  kHwFormatCount = 13,
};

// The datapath a call runs on.
enum Datapath : uint32_t {
  // MX × MX with both element sets small integers after a fixed shift (FP4,
  // FP6, MXINT8): narrow integer MACs, a 24-bit block accumulator.
  kPathMxInteger = 0,
  // MX × MX with an FP8 operand: sign·significand products (at most 8×8 bits)
  // shifted by the exponent sum into a 72-bit block accumulator.
  kPathMxWide = 1,
  // INT8 × INT8: one int32 dot over all of K, then the two row scales.
  kPathInt8 = 2,
  // Anything else (BF16/FP16/FP32, or kinds mixed): operands widened to FP32,
  // one fused multiply-add per element, k ascending.
  kPathFloat = 3,
  // NVFP4 × NVFP4: MX integer's E2M1 products, a 13-bit dot per 16-element
  // half block times the two UE4M3 significands (exact), halves added in
  // order; the two tensor scales multiply the sum once at the end.
  kPathNv = 4,
};

// Control register (AXI-lite): bits 3:0 X format, 7:4 W format, 8 bias, 11:9
// datapath. The host derives the datapath from the formats (ControlWord); the
// kernel trusts it, as hardware trusts its driver.
inline constexpr uint32_t kControlBias = 1u << 8;
inline constexpr uint32_t Control(HwFormat x, HwFormat w, Datapath path, bool bias) {
  return (x & 0xFu) | ((w & 0xFu) << 4) | (bias ? kControlBias : 0u) | ((path & 7u) << 9);
}
inline constexpr HwFormat ControlX(uint32_t c) { return static_cast<HwFormat>(c & 0xFu); }
inline constexpr HwFormat ControlW(uint32_t c) { return static_cast<HwFormat>((c >> 4) & 0xFu); }
inline constexpr bool ControlHasBias(uint32_t c) { return (c & kControlBias) != 0; }
inline constexpr Datapath ControlPath(uint32_t c) { return static_cast<Datapath>((c >> 9) & 7u); }

inline constexpr bool IsMxFormat(HwFormat f) { return f <= kHwMxInt8; }
inline constexpr bool IsFp8(HwFormat f) { return f == kHwE4m3 || f == kHwE5m2; }
// The datapath the contract prescribes for a pair (mx::GemmPathFor, split by width).
inline constexpr Datapath DatapathFor(HwFormat x, HwFormat w) {
  if (IsMxFormat(x) && IsMxFormat(w)) return IsFp8(x) || IsFp8(w) ? kPathMxWide : kPathMxInteger;
  if (x == kHwInt8 && w == kHwInt8) return kPathInt8;
  if (x == kHwNvfp4 && w == kHwNvfp4) return kPathNv;
  return kPathFloat;
}
// Formats whose rows carry an FP32 scale of their own.
inline constexpr bool HasRowScale(HwFormat f) { return f == kHwInt8 || f == kHwNvfp4; }
inline constexpr bool IsCodebook(HwFormat f) { return f == kHwNf4 || f == kHwBnbFp4; }

// NVFP4's half block, its NaN scale byte, and where its tensor scales start in
// a scale buffer of `rows` rows of `blocks` blocks (past the 2-byte pairs).
inline constexpr int kNvHalf = 16;
inline constexpr uint32_t kNvScaleNanByte = 0x7F;
inline constexpr int64_t NvRowScaleWord(int64_t rows, int64_t blocks) {
  return (rows * blocks * 2 + 7) / 8;
}

inline constexpr int ElementBits(HwFormat f) {
  switch (f) {
    case kHwE3m2:
    case kHwE2m3:
      return 6;
    case kHwE2m1:
    case kHwNvfp4:
    case kHwNf4:
    case kHwBnbFp4:
      return 4;
    case kHwBf16:
    case kHwFp16:
      return 16;
    case kHwFp32:
      return 32;
    default:
      return 8;
  }
}
inline constexpr int WordsPerBlock(HwFormat f) { return ElementBits(f) / 2; }

}  // namespace mxhls

extern "C" {
// The kernel's top function. m, n, k ≥ 1 and k ≤ kMaxK (the host checks).
void mx_gemm(const mxhls::Word* x, const mxhls::Word* x_scales, const mxhls::Word* w,
             const mxhls::Word* w_scales, const float* bias, float* y, int m, int n, int k,
             uint32_t control);
}
