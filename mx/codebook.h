// The codebook formats: bitsandbytes' NF4 (QLoRA's NormalFloat) and FP4, as its
// blockwise 4-bit quantization defines them. A block of 64 values along K keeps
// its largest magnitude (absmax, FP32); each value is stored as the 4-bit code
// of the table entry its normalized value n = x · fp32(1 / absmax) falls to.
//
// The contract (mx/README.md, "Codebook formats"):
//  - tables: NF4's 16 values as bitsandbytes publishes them (FP32 constants,
//    sorted, code = index; code 7 is 0); FP4's eight magnitudes {0, 1/192, 1/6,
//    1/4, 1/3, 1/2, 2/3, 1} (each fp32 of the rational) under bitsandbytes' codes
//    (bit 3 the sign; 0b0011 is 1, 0b0001 is 1/192), negatives mirrored;
//  - thresholds: the FP32 value nearest (ties to even) the exact midpoint of two
//    neighbouring table values; a value above a threshold goes up, one on it
//    stays down (bitsandbytes' `x > threshold` tree). FP4 thresholds its
//    magnitude and takes the sign of n < 0 (a -0 or a value rounding to 0 keeps
//    the sign bit as bitsandbytes' does: code 8 for small negatives);
//  - normalization: n = fp32(x · fp32(1 / absmax)), bitsandbytes' reciprocal
//    multiply; where 1 / absmax overflows FP32 (absmax below 2^-128) n is the
//    one division fp32(x / absmax) instead (bitsandbytes gives Inf and NaN there);
//  - special blocks: a block holding NaN or Inf stores absmax NaN and the codes
//    of 0; an all-zero block absmax 0 and the codes of 0;
//  - value: fp32(table[code] · absmax), one FP32 multiply. GEMMs take the float
//    path (reference_gemm.h): both operands dequantized so, an fma chain over K.
//
// The rounding modes do not apply: a codebook quantizes by its thresholds.
#pragma once

#include <array>
#include <cstdint>
#include <span>

#include "mx/format.h"

namespace mx {

// The 16 table values of a codebook format, by code.
const std::array<float, 16>& CodebookTable(Format format);

// The code of a normalized value n (finite).
uint8_t CodebookCode(Format format, float n);

// The code of 0 (NF4: 7, BNB_FP4: 0).
uint8_t CodebookZeroCode(Format format);

// One block of a codebook format (at most kCodebookBlockSize values): writes one
// code per value and returns the block's absmax (NaN for a block with NaN/Inf).
float QuantizeCodebookBlock(Format format, std::span<const float> values,
                            std::span<uint8_t> codes);

// An element's value: fp32(table[code] · absmax).
inline float CodebookValue(Format format, uint32_t code, float absmax) {
  return CodebookTable(format)[code & 15] * absmax;
}

}  // namespace mx
