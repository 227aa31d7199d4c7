// The codebook formats: bitsandbytes' NF4 (QLoRA's NormalFloat) and FP4, as its
// blockwise 4-bit quantization defines them. A block of 64 values along K keeps
// its largest magnitude (absmax, FP32); each value is stored as the 4-bit code
// of the table entry its normalized value n = x · fp32(1 / absmax) falls to.
//
// The contract (mx/README.md, "Codebook formats"):
//  - tables: NF4's 16 values as bitsandbytes publishes them (FP32 constants,
//    sorted, code = index; code 7 is 0); FP4's eight magnitudes, bitsandbytes'
//    dequantization constants for {0, 1/192, 2/3, 1, 1/3, 1/2, 1/6, 1/4} under
//    its codes 0..7 (0b0011 is 1, 0b0001 is 1/192), code 8 | c the negative
//    (code 8 is -0);
//  - thresholds: NF4's are the FP32 nearest the exact midpoint of two
//    neighbouring values; FP4's are bitsandbytes' decimal literals (0.00260417,
//    0.0859375, 0.20833333, 0.29166667, 0.4166667, 0.583333, 0.8333333), which
//    are not all FP32 midpoints. A value above a threshold goes up, one on it
//    stays down (bitsandbytes' `x > threshold` trees). FP4 thresholds |n| and
//    takes the sign bit from n < 0: a small negative value is code 8, a -0 (not
//    below 0) code 0, as in bitsandbytes;
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
