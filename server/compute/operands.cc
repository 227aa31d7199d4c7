#include "server/compute/operands.h"

#include <algorithm>

#include "mx/kernels/quantize_fast.h"
#include "mx/reference_gemm.h"
#include "mx/status_macros.h"
#include "server/telemetry/clock.h"

namespace mxserve {
namespace {

mx::QuantizedMatrix ShapeOnly(mx::Format format, int64_t rows, int64_t cols) {
  mx::QuantizedMatrix shape;
  shape.format = format;
  shape.rows = rows;
  shape.cols = cols;
  return shape;
}

}  // namespace

Operands::Operands(const ComputeContext& core)
    : core_(core), shape_only_(!core.backend->computes()) {}

absl::StatusOr<mx::QuantizedMatrix> Operands::Rows(Activation& a,
                                                   const mx::QuantizeOptions& options) const {
  if (a.packed) return *std::move(a.packed);
  return Rows(*a.dense, a.format, options);
}

absl::StatusOr<mx::QuantizedMatrix> Operands::Rows(const DenseMatrix& m, mx::Format format,
                                                   const mx::QuantizeOptions& options) const {
  if (shape_only_) return ShapeOnly(format, m.rows, m.cols);
  return QuantizeDense(m, format, options);
}

std::vector<float> Operands::Floats(const DenseMatrix& m) const {
  return shape_only_ ? std::vector<float>() : ToFloat(m);
}

absl::StatusOr<mx::QuantizedMatrix> Operands::Columns(std::span<const float> values, int64_t rows,
                                                      int64_t cols, mx::Format format,
                                                      const mx::QuantizeOptions& options) const {
  if (shape_only_) return ShapeOnly(format, cols, rows);
  return mx::kernels::QuantizeColumns(values, rows, cols, format, options);
}

std::vector<float> Operands::ColumnSums(std::span<const float> values, int64_t rows,
                                        int64_t cols) const {
  if (shape_only_) return std::vector<float>(static_cast<size_t>(cols), 0.0f);
  return mx::ColumnSums(values, rows, cols);
}

absl::StatusOr<std::string> Operands::Linear(const mx::QuantizedMatrix& x,
                                             const mx::QuantizedMatrix& w,
                                             std::span<const float> bias, std::span<float> y,
                                             double& compute_seconds) const {
  const auto start = Clock::now();
  absl::StatusOr<std::string> kernel = core_.backend->Linear(x, w, bias, y);
  if (!shape_only_) compute_seconds += Seconds(Clock::now() - start);
  return kernel;
}

absl::StatusOr<std::string> Operands::LinearOnCopy(const LayerWeights& weights, mx::Format format,
                                                   WeightLayout layout, CopyUse use,
                                                   const mx::QuantizedMatrix& x,
                                                   std::span<const float> bias, std::span<float> y,
                                                   double& compute_seconds) const {
  const bool forward = layout == WeightLayout::kForward;
  const int64_t rows = forward ? weights.spec().out_features : weights.spec().in_features;
  const int64_t cols = forward ? weights.spec().in_features : weights.spec().out_features;
  if (shape_only_) {
    MX_ASSIGN_OR_RETURN(std::shared_ptr<const PreparedWeight> w,
                        core_.backend->PrepareWeight(ShapeOnly(format, rows, cols)));
    return core_.backend->Linear(x, *w, bias, y);
  }
  const int64_t m = x.rows;
  std::string kernel;
  std::vector<float> part;  // a slice's columns of y, before they are scattered
  bool created = false;
  const absl::Status status = weights.WithCopy(
      format, layout, core_.registry->budget(), use, core_.update_slice_elements,
      [&](const LayerWeights::CopyPart& p) -> absl::Status {
        const int64_t width = p.end - p.begin;
        const bool whole = width == rows;
        if (!whole) part.resize(static_cast<size_t>(m * width));
        const auto start = Clock::now();
        MX_ASSIGN_OR_RETURN(
            kernel, core_.backend->Linear(x, p.weight,
                                          bias.empty() ? bias : bias.subspan(p.begin, width),
                                          whole ? y : std::span<float>(part)));
        compute_seconds += Seconds(Clock::now() - start);
        for (int64_t row = 0; !whole && row < m; ++row) {
          std::copy_n(part.data() + row * width, width, y.data() + row * rows + p.begin);
        }
        return absl::OkStatus();
      },
      &created);
  if (created) {
    core_.metrics->RecordQuantization(format);
    core_.UpdateMemoryGauges();
  }
  MX_RETURN_IF_ERROR(status);
  return kernel;
}

}  // namespace mxserve
