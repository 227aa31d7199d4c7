// Element codes: converting one value to and from the bits of an element format.
//
// Encoding is exact integer arithmetic on the FP32 bit pattern: no floating-point
// division, so a value scaled by a block's power of two rounds exactly once.
#pragma once

#include <cstddef>
#include <cstdint>

#include "mx/format.h"

namespace mx {

enum class Rounding : uint8_t {
  kNearestEven,  // IEEE roundTiesToEven, the spec's rule and the default
  kNearestAway,  // ties away from zero, for comparison with tools that use it
  // Up with probability equal to the discarded fraction of a step, decided by 32
  // random bits per element (mx/stochastic.h): unbiased in expectation, so that
  // small gradient updates survive requantization. The quantizers apply it to
  // MX, NVFP4 and INT8 operands; BF16/FP16 operands are converted to nearest even
  // whatever the rounding.
  kStochastic,
};

struct EncodeResult {
  uint32_t code;
  // The rounded magnitude exceeded the largest finite element and was clamped to
  // it (MX formats), or overflowed to Inf (FP16/BF16).
  bool overflowed;
};

// Encodes v / 2^scale_exponent as an element of `format` (any format but FP32,
// whose code is the float's own bits). MX elements saturate: a finite value past
// the largest normal is clamped to it, keeping its sign. FP16 and BF16 follow IEEE
// and overflow to Inf. Inf encodes as Inf where the format has one and saturates
// otherwise; NaN encodes as the format's NaN, or as +0 where the format has none
// (an MX block holding NaN records it in its scale instead). MXINT8 clamps to
// ±127; INT8 encodes the value itself, rounded and clamped to ±127.
// `random_bits` is u of kStochastic: the magnitude rounds up iff the fraction of
// a step it lies above the grid point below, times 2^32, exceeds u (ignored by
// the other roundings). A value past max normal still saturates.
EncodeResult EncodeElementDetailed(Format format, float v, Rounding rounding,
                                   int scale_exponent = 0, uint32_t random_bits = 0);

inline uint32_t EncodeElement(Format format, float v, Rounding rounding = Rounding::kNearestEven,
                              int scale_exponent = 0, uint32_t random_bits = 0) {
  return EncodeElementDetailed(format, v, rounding, scale_exponent, random_bits).code;
}

// The value of an element code, without any block scale. Exact for every format.
float DecodeElement(Format format, uint32_t code);

// True where the code is NaN or Inf (only E4M3, E5M2, FP16, BF16, FP32 have such codes).
bool IsSpecialCode(Format format, uint32_t code);

// Number of element codes of a format: 2^element_bits.
uint64_t CodeCount(Format format);

// --- Fixed-point view of MX elements, for the exact block dot product. ---
//
// Every finite MX element is an integer multiple of the format's smallest step
// 2^-F: value = ElementToFixed(code) · 2^-F with F = FixedPointFractionBits().
// F is 9 (E4M3), 16 (E5M2), 4 (E3M2), 3 (E2M3), 1 (E2M1), 6 (MXINT8). The integer
// needs at most 32 bits (E5M2's 57344·2^16 < 2^32) plus sign.
int FixedPointFractionBits(Format format);
int64_t ElementToFixed(Format format, uint32_t code);

// FP16 and BF16 conversions (round to nearest even, IEEE overflow to Inf).
uint16_t FloatToBf16(float v);
float Bf16ToFloat(uint16_t bits);
uint16_t FloatToFp16(float v);
float Fp16ToFloat(uint16_t bits);

// `count` little-endian values of `source` (kFp32, kBf16 or kFp16) read from
// `raw` (no alignment needed), widened exactly to FP32 into `out`. The one
// decoder of dense tensors from the wire, uploads and safetensors files.
void WidenToFloat(Format source, const void* raw, size_t count, float* out);

}  // namespace mx
