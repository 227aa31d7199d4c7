#include "mx/quantize.h"

#include <algorithm>
#include <bit>
#include <cassert>

namespace mx {

int FloorLog2(float v) {
  const uint32_t magnitude = std::bit_cast<uint32_t>(v) & 0x7FFFFFFF;
  const int biased = static_cast<int>(magnitude >> 23);
  if (biased != 0) return biased - 127;
  // Subnormal: value = fraction · 2^-149.
  return (31 - std::countl_zero(magnitude)) - 149;
}

int SharedExponent(Format format, float amax, const QuantizeOptions& options) {
  if (amax == 0.0f) return -kScaleBias;
  const int emax = Traits(format).emax;
  int exponent = std::clamp(FloorLog2(amax) - emax, -kScaleBias, kScaleBias);
  if (options.scale_rule == ScaleRule::kNoSaturation && exponent < kScaleBias &&
      EncodeElementDetailed(format, amax, options.rounding, exponent).overflowed) {
    ++exponent;
  }
  return exponent;
}

uint8_t QuantizeBlock(Format format, std::span<const float> values, std::span<uint8_t> codes,
                      const QuantizeOptions& options) {
  assert(IsMx(format) && values.size() <= kBlockSize && codes.size() == values.size());
  // The largest magnitude, compared as bits: for non-negative floats the integer
  // order is the numeric order, and any NaN or Inf compares at or above Inf.
  uint32_t max_magnitude = 0;
  for (float v : values) {
    max_magnitude = std::max(max_magnitude, std::bit_cast<uint32_t>(v) & 0x7FFFFFFF);
  }
  if (max_magnitude >= 0x7F800000) {
    std::fill(codes.begin(), codes.end(), 0);
    return kScaleNan;
  }
  const int exponent = SharedExponent(format, std::bit_cast<float>(max_magnitude), options);
  for (size_t i = 0; i < values.size(); ++i) {
    codes[i] = static_cast<uint8_t>(EncodeElement(format, values[i], options.rounding, exponent));
  }
  return static_cast<uint8_t>(exponent + kScaleBias);
}

}  // namespace mx
