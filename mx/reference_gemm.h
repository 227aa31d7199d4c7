// The reference GEMM: the definition of mxserve's numerics contract. Every fast
// kernel and every backend (CPU, HLS kernel, FPGA) is tested against these bits.
//
// Clear scalar code on purpose; speed lives elsewhere.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "mx/format.h"
#include "mx/packed.h"
#include "mx/quantize.h"

namespace mx {

// Which arithmetic a pair of operand formats uses.
enum class GemmPath : uint8_t {
  // Both MX (same or different formats): per 32-block an exact dot product of the
  // elements, scaled by 2^(scale_x + scale_w) and rounded once to FP32; the block
  // results summed in FP32 in ascending block order, from +0.0 or the bias.
  kMxBlocks,
  // Both NVFP4: per 16-block the exact dot times both UE4M3 scales (exact in
  // FP32), summed in FP32 in ascending block order from +0.0; then
  // y = sum · fp32(ts_x · ts_w) and + bias, in that order (FP32 each).
  kNvBlocks,
  // Both INT8: exact integer dot, then y = float(dot) · scale_x · scale_w (in that
  // order, FP32), then + bias.
  kInt8,
  // Anything else (BF16, FP16, FP32, or a mix of kinds): both operands dequantized
  // to FP32, y = fma(x_k, w_k, y) for k ascending, from +0.0 or the bias.
  kFloat,
};
GemmPath GemmPathFor(Format x, Format w);

// Y = X·Wᵀ (+ bias): X is M×K, W is N×K (both blocked along K), bias empty or N
// values; Y is M×N row-major.
absl::StatusOr<std::vector<float>> ReferenceLinear(const QuantizedMatrix& x,
                                                   const QuantizedMatrix& w,
                                                   std::span<const float> bias = {});

// C = A·B from FP32: A is M×K row-major quantized per row to format_a, B is K×N
// row-major quantized per column to format_b; C is M×N row-major. With
// stochastic rounding A and B draw the streams of Gemm's (kGemmA, kGemmB), as
// the daemon's Gemm does; options.stream is not read.
absl::StatusOr<std::vector<float>> ReferenceGemm(std::span<const float> a, Format format_a,
                                                 std::span<const float> b, Format format_b,
                                                 int64_t m, int64_t k, int64_t n,
                                                 const QuantizeOptions& options = {});

// A linear layer's grad_bias: the column sums of dY (rows × cols, row-major),
// in FP32, each column's rows added in ascending order starting from +0. The
// order is part of the contract (FP32 addition does not associate).
std::vector<float> ColumnSums(std::span<const float> dy, int64_t rows, int64_t cols);

// value · 2^exponent rounded once to FP32, to nearest with ties to even, with
// FP32 subnormals and overflow to ±Inf. The one rounding of an exact block dot.
float RoundScaledToFloat(__int128 value, int exponent);

}  // namespace mx
