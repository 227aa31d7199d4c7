// Fast quantization: FP32, BF16 or FP16 values to any format, in the packed layout
// of mx/packed.h, bit for bit what mx::QuantizeRows / mx::QuantizeColumns produce.
//
// The reference encodes one element at a time with exact integer arithmetic on the
// FP32 bits. These kernels reach the same codes with about ten float and integer
// operations per element and no branch, eight at a time at the avx2 level:
//
//   1. Block scale: amax is the largest |v| compared as bits (NaN and Inf compare
//      at or above Inf, so one comparison finds them); floor(log2(amax)) comes from
//      its exponent field, exactly as in the reference.
//   2. s = min(|v| · 2^-e, max normal). The power-of-two multiply is exact, except
//      that a product below 2^-126 may round among the FP32 subnormals: far below
//      half the smallest element of every format (2^-17 for E5M2, the widest), so
//      it encodes as 0 either way. Clamping before rounding gives the reference's
//      saturation: whatever lies past max normal encodes as max normal.
//   3. One FP32 addition rounds s to the element grid and yields the code: the
//      grid step is 2^u with u = max(floor(log2 s), emin_elem) - mantissa_bits, and
//      C = 2^(u + 23) · (1 + base · 2^-23), where base = (exponent field - 1) <<
//      mantissa_bits is the code of 2^max(floor(log2 s), emin_elem) less its
//      significand (0 in the subnormal range). s + C stays in C's binade, whose FP32
//      step is 2^u, so the addition is the one rounding (nearest even: base is
//      even), and the low byte of its bits is base + round(s / 2^u), the element
//      code's magnitude, a carry into the next binade included. This step produces
//      no FP32 subnormal (x86 pays a large penalty for them). Ties away from zero add one
//      where s - (sum - C), exact, is half a step.
//   4. The sign bit is the input's, so a negative value that rounds to zero keeps
//      it, as in the reference.
//   MXINT8 is k = round(|v| · 2^(6-e)) clamped to 127, with the input's sign.
//   INT8 divides by the row scale with the IEEE division the reference performs.
//
// The functions below take the reference's arguments and return its errors word
// for word; `isa` picks the kernel level (cpu_features.h), capped to what this
// machine runs; `pool`, when given, splits the rows (columns) across its threads.
#pragma once

#include <cstdint>
#include <span>

#include "absl/status/statusor.h"
#include "mx/format.h"
#include "mx/kernels/cpu_features.h"
#include "mx/kernels/thread_pool.h"
#include "mx/packed.h"
#include "mx/quantize.h"

namespace mx::kernels {

// Quantizes a row-major rows × cols FP32 matrix along its rows (K = cols):
// mx::QuantizeRows, faster.
absl::StatusOr<QuantizedMatrix> QuantizeRows(std::span<const float> values, int64_t rows,
                                             int64_t cols, Format format,
                                             const QuantizeOptions& options = {},
                                             Isa isa = DefaultIsa(), ThreadPool* pool = nullptr);
// The same for BF16 or FP16 input given as raw 16-bit codes (`source` says which),
// widened in registers: no FP32 copy of the input is made.
absl::StatusOr<QuantizedMatrix> QuantizeRows(std::span<const uint16_t> values, Format source,
                                             int64_t rows, int64_t cols, Format format,
                                             const QuantizeOptions& options = {},
                                             Isa isa = DefaultIsa(), ThreadPool* pool = nullptr);
// Quantizes a row-major K × N FP32 matrix along its columns; the result holds the
// transpose, N rows of K: mx::QuantizeColumns, faster. Columns are transposed in
// panels of kColumnPanel, then quantized as rows.
absl::StatusOr<QuantizedMatrix> QuantizeColumns(std::span<const float> values, int64_t k, int64_t n,
                                                Format format, const QuantizeOptions& options = {},
                                                Isa isa = DefaultIsa(), ThreadPool* pool = nullptr);

// --- Internals shared by quantize_fast.cc and the per-ISA quantize_*.cc. ---
namespace internal {

// Columns of the K × N input transposed per panel by QuantizeColumns.
inline constexpr int kColumnPanel = 16;

// The shape of an MX minifloat element, as compile-time constants for the kernels
// (the same numbers as Traits(); a test checks that they agree).
struct ElementShape {
  int exponent_bits;
  int mantissa_bits;
  int bias;
  int emax;
  float max_normal;
};
inline constexpr ElementShape kE4m3 = {4, 3, 7, 8, 448.0f};
inline constexpr ElementShape kE5m2 = {5, 2, 15, 15, 57344.0f};
inline constexpr ElementShape kE3m2 = {3, 2, 3, 4, 28.0f};
inline constexpr ElementShape kE2m3 = {2, 3, 1, 2, 7.5f};
inline constexpr ElementShape kE2m1 = {2, 1, 1, 2, 6.0f};

// One call's work for a kernel level: `rows` rows of `cols` values of `source`
// (kFp32, kBf16 or kFp16), row-major, into buffers already sized for the result.
struct RowsJob {
  Format source = Format::kFp32;
  const void* values = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  Format format = Format::kFp32;
  QuantizeOptions options;
  uint8_t* elements = nullptr;      // rows × RowBytes(format, cols)
  uint8_t* block_scales = nullptr;  // MX: rows × BlocksPerRow(cols)
  float* row_scales = nullptr;      // INT8: rows
};

// Per-level kernels. QuantizeRowsAvx2 and TransposePanelAvx2 may only run where
// the CPU has AVX2, FMA and F16C. (No inline functions here: one compiled into the
// AVX2 translation unit could be the copy the linker keeps for the scalar one.)
void QuantizeRowsScalar(const RowsJob& job);
void QuantizeRowsAvx2(const RowsJob& job);
// Copies columns [j0, j0 + width) of the row-major k × n matrix `values` into
// `panel` as width rows of k (row stride k).
void TransposePanelScalar(const float* values, int64_t k, int64_t n, int64_t j0, int width,
                          float* panel);
// NVFP4 rows under tensor scale `ts`, nearest even (or away): the reference's
// recipe, into the rows' place in a matrix (elements: rows × RowBytes, scales:
// rows × blocks, row_scales: rows). Scalar and AVX2 levels.
void NvRowsScalar(const float* values, int64_t rows, int64_t cols, float ts, bool away,
                  uint8_t* elements, uint8_t* scales, float* row_scales);
void NvRowsAvx2(const float* values, int64_t rows, int64_t cols, float ts, bool away,
                uint8_t* elements, uint8_t* scales, float* row_scales);
void TransposePanelAvx2(const float* values, int64_t k, int64_t n, int64_t j0, int width,
                        float* panel);

}  // namespace internal
}  // namespace mx::kernels
