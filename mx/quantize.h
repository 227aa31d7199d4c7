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

inline constexpr Rounding kAllRoundings[] = {Rounding::kNearestEven, Rounding::kNearestAway,
                                             Rounding::kStochastic};
// "nearest_even", "nearest_away", "stochastic" (the wire's ROUNDING_<NAME>).
absl::string_view RoundingName(Rounding rounding);
// A name above or its short form (even, away), case-insensitive; INVALID_ARGUMENT
// listing them otherwise.
absl::StatusOr<Rounding> ParseRounding(absl::string_view name);

struct QuantizeOptions {
  Rounding rounding = Rounding::kNearestEven;
  ScaleRule scale_rule = ScaleRule::kFloor;
  // kStochastic only: the key of the random bits (mx/stochastic.h), and which
  // index each element draws. Element (i, j) of the source matrix — the
  // row-major values QuantizeRows is given, or the K × N matrix QuantizeColumns
  // is given — draws index index_offset + i · index_row_stride + j, the stride
  // being the source's width where it is 0. So an operand's bits do not depend
  // on its orientation's storage, and a slice of a wider tensor (offset, stride)
  // draws what the whole tensor would have drawn there.
  uint64_t seed = 0;
  uint32_t stream = 0;
  int64_t index_offset = 0;
  int64_t index_row_stride = 0;
  // NVFP4: the per-tensor scale to quantize with; 0 (the default), or anything
  // not positive and finite, computes it from the values quantized together
  // (all of QuantizeRows' matrix) as NvTensorScale(FiniteAmax(values)). A tensor
  // quantized in parts (slices of a weight copy) passes the whole tensor's. The
  // scale rule is not read: NVFP4's block scales follow their own recipe
  // (QuantizeNvBlock).
  float tensor_scale = 0.0f;
};

// Whether `options` brings an NVFP4 tensor scale to use (a positive finite one);
// anything else means: compute it from the values.
inline bool BringsTensorScale(const QuantizeOptions& options) {
  return options.tensor_scale > 0.0f && options.tensor_scale <= 3.4028234663852886e38f;
}

// The stochastic-rounding streams of the operands a request brings: the "tensor
// identity" of the key, so that no two quantizations of one request share draws.
// Part of the contract: the trainer-side emulator draws the same.
enum class OperandStream : uint32_t {
  kGemmA = 0,              // Gemm's A, by rows
  kGemmB = 1,              // Gemm's B, by columns
  kForwardInput = 2,       // LayerForward's X, by rows
  kGradOutputRows = 3,     // LayerBackward's dY by rows, for grad_input
  kGradOutputColumns = 4,  // LayerBackward's dY by columns, for grad_weight
  kInputColumns = 5,       // LayerBackward's X by columns, for grad_weight
};
// options with `stream` set to the operand's.
inline QuantizeOptions ForStream(QuantizeOptions options, OperandStream stream) {
  options.stream = static_cast<uint32_t>(stream);
  return options;
}

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
// block holding NaN or ±Inf returns kScaleNan and zero codes. With stochastic
// rounding `random_bits` holds each value's 32 bits (same length as `values`);
// the scale is chosen as with nearest even (the no-saturation rule's test too).
uint8_t QuantizeBlock(Format format, std::span<const float> values, std::span<uint8_t> codes,
                      const QuantizeOptions& options = {},
                      std::span<const uint32_t> random_bits = {});

// --- NVFP4 (NVIDIA's recipe, as torchao's NVFP4Tensor computes it) ---

// The largest |v| among the finite values (0 when there is none).
float FiniteAmax(std::span<const float> values);
// The per-tensor scale of a tensor whose largest finite magnitude is amax:
// fp32(amax / (448 · 6)), or 1 where that is not a normal float (an all-zero
// tensor, or one so small the quotient underflows), so the scale is always a
// positive normal number.
float NvTensorScale(float amax);

// The value of an NVFP4 block's UE4M3 scale byte: E4M3 without its sign; NaN for
// kNvScaleNan, the byte of a block that held NaN or Inf.
float NvScaleValue(uint8_t byte);

// Quantizes up to 16 values (a short last block as if padded with zeros) to
// NVFP4 under tensor scale `tensor_scale`: the element codes into `codes` and
// the UE4M3 scale byte returned. For a block of largest magnitude amax_b:
//   s     = fp32(fp32(amax_b / 6) / tensor_scale), clamped to [2^-6, 448]
//   byte  = s as UE4M3, nearest even       (value S)
//   code  = fp32(v / fp32(tensor_scale · S)) clamped to ±6, as E2M1 with
//           `options.rounding` (stochastic: `random_bits`, one per value)
// each fp32(...) one IEEE operation. A block holding NaN or Inf gets byte 0x7F
// (kNvScaleNan) and zero codes; an all-zero block byte 0x08 (2^-6) and zeros.
uint8_t QuantizeNvBlock(std::span<const float> values, float tensor_scale,
                        std::span<uint8_t> codes, const QuantizeOptions& options = {},
                        std::span<const uint32_t> random_bits = {});

}  // namespace mx
