#include "mx/quantize.h"

#include <algorithm>
#include <bit>
#include <cassert>
#include <cmath>
#include <limits>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace mx {

int FloorLog2(float v) {
  const uint32_t magnitude = std::bit_cast<uint32_t>(v) & 0x7FFFFFFF;
  const int biased = static_cast<int>(magnitude >> 23);
  if (biased != 0) return biased - 127;
  // Subnormal: value = fraction · 2^-149.
  return (31 - std::countl_zero(magnitude)) - 149;
}

namespace {

// ceil(log2(|v|)) for a finite non-zero v, exactly: floor, plus one unless v is a
// power of two (one significant bit).
int CeilLog2(float v) {
  const uint32_t magnitude = std::bit_cast<uint32_t>(v) & 0x7FFFFFFF;
  const bool normal = (magnitude >> 23) != 0;
  const uint32_t significand = normal ? (magnitude & 0x7FFFFF) : magnitude;
  const bool power_of_two = normal ? significand == 0 : std::has_single_bit(significand);
  return FloorLog2(v) + (power_of_two ? 0 : 1);
}

// The largest magnitude of a block as FP32 bits: for non-negative floats the
// integer order is the numeric order, and any NaN or Inf compares at or above Inf
// (0x7F800000), so one comparison finds them.
uint32_t MaxMagnitudeBits(std::span<const float> values) {
  uint32_t largest = 0;
  for (float v : values) largest = std::max(largest, std::bit_cast<uint32_t>(v) & 0x7FFFFFFFu);
  return largest;
}

}  // namespace

absl::string_view ScaleRuleName(ScaleRule rule) {
  switch (rule) {
    case ScaleRule::kFloor:
      return "floor";
    case ScaleRule::kNoSaturation:
      return "no_saturation";
    case ScaleRule::kCeil:
      return "ceil";
    case ScaleRule::kRceil:
      return "rceil";
  }
  return "?";
}

absl::StatusOr<ScaleRule> ParseScaleRule(absl::string_view name) {
  for (const ScaleRule rule : kAllScaleRules) {
    if (absl::EqualsIgnoreCase(name, ScaleRuleName(rule))) return rule;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown scale rule '", name, "'; expected floor, no_saturation, ceil or rceil"));
}

absl::string_view RoundingName(Rounding rounding) {
  switch (rounding) {
    case Rounding::kNearestEven:
      return "nearest_even";
    case Rounding::kNearestAway:
      return "nearest_away";
    case Rounding::kStochastic:
      return "stochastic";
  }
  return "?";
}

absl::StatusOr<Rounding> ParseRounding(absl::string_view name) {
  for (const Rounding rounding : kAllRoundings) {
    if (absl::EqualsIgnoreCase(name, RoundingName(rounding))) return rounding;
  }
  if (absl::EqualsIgnoreCase(name, "even")) return Rounding::kNearestEven;
  if (absl::EqualsIgnoreCase(name, "away")) return Rounding::kNearestAway;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown rounding '", name,
                   "'; expected nearest_even (even), nearest_away (away) or stochastic"));
}

int SharedExponent(Format format, float amax, const QuantizeOptions& options) {
  if (amax == 0.0f) return -kScaleBias;
  const FormatTraits& traits = Traits(format);
  int unclamped = 0;
  switch (options.scale_rule) {
    case ScaleRule::kFloor:
    case ScaleRule::kNoSaturation:
      unclamped = FloorLog2(amax) - traits.emax;
      break;
    case ScaleRule::kCeil:
      unclamped = CeilLog2(amax) - traits.emax;
      break;
    case ScaleRule::kRceil: {
      // One IEEE FP32 division, as the rule is defined (the quotient's rounding
      // decides the edge cases, exactly as in cuBLAS and torchao).
      const float q = std::fabs(amax) / static_cast<float>(traits.max_normal);
      unclamped = q == 0.0f ? -kScaleBias : CeilLog2(q);
      break;
    }
  }
  int exponent = std::clamp(unclamped, -kScaleBias, kScaleBias);
  // Stochastic rounding decides the scale as nearest even does: the scale is the
  // block's, not any one element's draw.
  const Rounding decide =
      options.rounding == Rounding::kStochastic ? Rounding::kNearestEven : options.rounding;
  if (options.scale_rule == ScaleRule::kNoSaturation && exponent < kScaleBias &&
      EncodeElementDetailed(format, amax, decide, exponent).overflowed) {
    ++exponent;
  }
  return exponent;
}

uint8_t QuantizeBlock(Format format, std::span<const float> values, std::span<uint8_t> codes,
                      const QuantizeOptions& options, std::span<const uint32_t> random_bits) {
  assert(IsMx(format) && values.size() <= kBlockSize && codes.size() == values.size());
  const bool stochastic = options.rounding == Rounding::kStochastic;
  assert(!stochastic || random_bits.size() == values.size());
  const uint32_t max_magnitude = MaxMagnitudeBits(values);
  if (max_magnitude >= 0x7F800000) {
    std::fill(codes.begin(), codes.end(), 0);
    return kScaleNan;
  }
  const int exponent = SharedExponent(format, std::bit_cast<float>(max_magnitude), options);
  for (size_t i = 0; i < values.size(); ++i) {
    codes[i] = static_cast<uint8_t>(EncodeElement(format, values[i], options.rounding, exponent,
                                                  stochastic ? random_bits[i] : 0));
  }
  return static_cast<uint8_t>(exponent + kScaleBias);
}

float FiniteAmax(std::span<const float> values) {
  uint32_t largest = 0;
  for (float v : values) {  // branch-free, so that the compiler vectorizes it
    const uint32_t magnitude = std::bit_cast<uint32_t>(v) & 0x7FFFFFFFu;
    largest = std::max(largest, magnitude < 0x7F800000u ? magnitude : 0u);
  }
  return std::bit_cast<float>(largest);
}

float NvTensorScale(float amax) {
  const float scale = amax / (kNvScaleMax * kNvElementMax);
  return std::isnormal(scale) ? scale : 1.0f;
}

float NvScaleValue(uint8_t byte) {
  return byte == kNvScaleNan ? std::numeric_limits<float>::quiet_NaN()
                             : DecodeElement(Format::kMxfp8E4m3, byte);
}

uint8_t QuantizeNvBlock(std::span<const float> values, float tensor_scale,
                        std::span<uint8_t> codes, const QuantizeOptions& options,
                        std::span<const uint32_t> random_bits) {
  assert(values.size() <= kNvBlockSize && codes.size() == values.size());
  const bool stochastic = options.rounding == Rounding::kStochastic;
  assert(!stochastic || random_bits.size() == values.size());
  const uint32_t max_magnitude = MaxMagnitudeBits(values);
  if (max_magnitude >= 0x7F800000) {
    std::fill(codes.begin(), codes.end(), 0);
    return kNvScaleNan;
  }
  const float block_scale = std::bit_cast<float>(max_magnitude) / kNvElementMax / tensor_scale;
  const uint8_t byte = static_cast<uint8_t>(EncodeElement(
      Format::kMxfp8E4m3, std::clamp(block_scale, kNvScaleMin, kNvScaleMax)));
  const float total = tensor_scale * NvScaleValue(byte);
  for (size_t i = 0; i < values.size(); ++i) {
    const float q = std::clamp(values[i] / total, -kNvElementMax, kNvElementMax);
    codes[i] = static_cast<uint8_t>(
        EncodeElement(Format::kNvfp4, q, options.rounding, 0, stochastic ? random_bits[i] : 0));
  }
  return byte;
}

}  // namespace mx
