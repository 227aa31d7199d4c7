// Quantizing one MX block: the shared E8M0 scale and the element codes.
#pragma once

#include <cstdint>
#include <span>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "mx/element.h"
#include "mx/format.h"

namespace mx {

// How a block's shared exponent e (scale 2^e) follows from its largest
// magnitude amax. Every rule gives an all-zero block e = -127 and clamps e to
// the E8M0 range [-127, 127]; a block holding NaN or Inf is NaN whatever the
// rule. emax is the format's emax_elem, max_normal its largest element.
enum class ScaleRule : uint8_t {
  // The spec's rule: e = floor(log2(amax)) - emax. Elements in the top binade
  // may saturate to ±max normal.
  kFloor,
  // The floor rule, raised by one where the block maximum would otherwise round
  // past max normal: no element is ever clamped, at the price of one bit of
  // resolution for the block.
  kNoSaturation,
  // e = ceil(log2(amax)) - emax: never saturates, and loses a bit wherever amax
  // is not a power of two (torchao's CEIL, Brevitas' power-of-two scale rounded
  // up).
  kCeil,
  // e = ceil(log2(q)) with q = amax / max_normal rounded to FP32 (nearest even):
  // the smallest power of two that brings amax within max normal, as cuBLAS
  // computes it for UE8M0 scales (torchao's and TransformerEngine's RCEIL). A q
  // that underflows to 0 gives e = -127.
  kRceil,
};
inline constexpr ScaleRule kAllScaleRules[] = {ScaleRule::kFloor, ScaleRule::kNoSaturation,
                                               ScaleRule::kCeil, ScaleRule::kRceil};

// "floor", "no_saturation", "ceil", "rceil".
absl::string_view ScaleRuleName(ScaleRule rule);
// A name above, case-insensitive; INVALID_ARGUMENT listing them otherwise.
absl::StatusOr<ScaleRule> ParseScaleRule(absl::string_view name);

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
