// Quantizing one MX block: the shared E8M0 scale and the element codes.
#pragma once

#include <cstdint>
#include <span>

#include "mx/element.h"
#include "mx/format.h"

namespace mx {

enum class ScaleRule : uint8_t {
  // The spec's rule: e = floor(log2(amax)) - emax_elem. Elements in the top
  // binade may saturate to ±max normal.
  kFloor,
  // The floor rule, raised by one where the block maximum would otherwise round
  // past max normal: no element is ever clamped, at the price of one bit of
  // resolution for the block.
  kNoSaturation,
};

struct QuantizeOptions {
  Rounding rounding = Rounding::kNearestEven;
  ScaleRule scale_rule = ScaleRule::kFloor;
};

// floor(log2(|v|)) taken exactly from the FP32 bits (a subnormal's from its leading
// one). v must be finite and non-zero.
int FloorLog2(float v);

// The unbiased shared exponent of a block (scale = 2^exponent) for a finite block
// maximum `amax`: the scale rule applied, clamped to the E8M0 range [-127, 127].
// An all-zero block gets -127 (byte 0).
int SharedExponent(Format format, float amax, const QuantizeOptions& options);

// Quantizes up to 32 values (fewer: a short last block, as if padded with zeros)
// to the MX format `format`. Writes one code per value into `codes` (same length
// as `values`, element code in the low bits) and returns the E8M0 scale byte. A
// block holding NaN or ±Inf returns kScaleNan and zero codes.
uint8_t QuantizeBlock(Format format, std::span<const float> values, std::span<uint8_t> codes,
                      const QuantizeOptions& options = {});

}  // namespace mx
