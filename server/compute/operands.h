// What a work item hands its backend, made in one place: activations and
// gradients quantized, the layer's weight copy fetched (or sliced), the GEMM
// run and timed. It is the one place that knows a backend can compute nothing
// (null): such a backend is given shape-only operands — rows, columns and
// format, no data — and a shape-only weight instead of a copy, nothing is
// quantized, cached or timed, and grad_bias is zeros. So Gemm, LayerForward and
// LayerBackward each have one path, whatever the backend.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "mx/packed.h"
#include "mx/quantize.h"
#include "server/compute/context.h"
#include "server/compute/wire.h"

namespace mxserve {

// An activation as it arrived: dense (quantized on the worker) or packed.
struct Activation {
  std::optional<DenseMatrix> dense;
  std::optional<mx::QuantizedMatrix> packed;
  int64_t rows = 0;
  int64_t cols = 0;
  mx::Format format = mx::Format::kFp32;  // its compute format
};

class Operands {
 public:
  explicit Operands(const ComputeContext& core);

  // `a` by rows, in its format (as it arrived, if packed: it is moved out).
  absl::StatusOr<mx::QuantizedMatrix> Rows(Activation& a, const mx::QuantizeOptions& options) const;
  // `m` by rows in `format`.
  absl::StatusOr<mx::QuantizedMatrix> Rows(const DenseMatrix& m, mx::Format format,
                                           const mx::QuantizeOptions& options = {}) const;
  // `m` as FP32 values, for Columns and ColumnSums; empty for shape-only.
  std::vector<float> Floats(const DenseMatrix& m) const;
  // A rows × cols matrix quantized along its columns, held as cols rows of
  // `rows` (mx::kernels::QuantizeColumns).
  absl::StatusOr<mx::QuantizedMatrix> Columns(std::span<const float> values, int64_t rows,
                                              int64_t cols, mx::Format format,
                                              const mx::QuantizeOptions& options = {}) const;
  // Σ over rows of a rows × cols matrix (mx::ColumnSums: grad_bias).
  std::vector<float> ColumnSums(std::span<const float> values, int64_t rows, int64_t cols) const;

  // y = x · wᵀ + bias with w for this call only. `compute_seconds` gets the
  // kernel's time. Returns the kernel that ran ("" where none did).
  absl::StatusOr<std::string> Linear(const mx::QuantizedMatrix& x, const mx::QuantizedMatrix& w,
                                     std::span<const float> bias, std::span<float> y,
                                     double& compute_seconds) const;
  // y (M × R) = x · Cᵀ + bias, C the layer's weight in `format` and `layout` (R
  // rows: N forward, K transposed), from the cache or, for an update-phase use
  // of a copy not cached, made for this call in slices of at most
  // ComputeContext::update_slice_elements (LayerWeights::WithCopy), each slice's
  // columns of y written before the next is made: a column of y reads its own
  // row of C only, so the bits are the same.
  absl::StatusOr<std::string> LinearOnCopy(const LayerWeights& weights, mx::Format format,
                                           WeightLayout layout, CopyUse use,
                                           const mx::QuantizedMatrix& x,
                                           std::span<const float> bias, std::span<float> y,
                                           double& compute_seconds) const;

 private:
  const ComputeContext& core_;
  const bool shape_only_;  // the backend computes nothing (null)
};

}  // namespace mxserve
