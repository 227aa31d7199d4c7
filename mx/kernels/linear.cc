// The GEMM driver: validation, the choice of kind and kernel, X decoding, and
// the split of M × N into tiles across the caller's threads.
#include "mx/kernels/linear.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "mx/kernels/gemm_internal.h"
#include "mx/kernels/operands.h"
#include "mx/reference_gemm.h"

namespace mx::kernels {
namespace {

using internal::Kind;

// Rows of X per task: 64 tiles of 4. A task walks its rows against one panel of
// W, which stays in L1 meanwhile; X's rows stay in L2 across panels.
constexpr int64_t kRowsPerTask = 256;

// INT8 sums over all of K in int32: 127 · 127 · K must stay below 2^31.
constexpr int64_t kMaxInt8K = int64_t{1} << 17;

absl::Status CheckArguments(const QuantizedMatrix& x, const PackedWeight& w,
                            std::span<const float> bias, size_t y_size) {
  if (absl::Status s = ValidateLayout(x); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("x ", s.message()));
  }
  if (x.cols != w.cols()) {
    return absl::InvalidArgumentError(
        absl::StrCat("w: expected K = ", x.cols, " columns to match x, got ", w.cols()));
  }
  if (!bias.empty() && static_cast<int64_t>(bias.size()) != w.rows()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bias: expected ", w.rows(), " values (one per row of w), got ", bias.size()));
  }
  if (static_cast<int64_t>(y_size) != x.rows * w.rows()) {
    return absl::InvalidArgumentError(absl::StrCat("y: expected ", x.rows, "x", w.rows(), " = ",
                                                   x.rows * w.rows(), " values, got ", y_size));
  }
  return absl::OkStatus();
}

// Why the exact fast kernels cannot take this pair, or "" when they can.
std::string FallbackReason(const internal::DecodedX& x, const internal::WeightPanels& w) {
  if (x.has_special) return "x holds Inf/NaN element codes";
  if (w.has_special) return "w holds Inf/NaN element codes";
  if (x.kind == Kind::kMxF64 && x.max_span_bits + w.max_span_bits + 5 > 53) {
    return absl::StrCat("a block sum may need ", x.max_span_bits + w.max_span_bits + 5,
                        " bits, more than FP64's 53");
  }
  if (x.kind == Kind::kInt8 && w.k > kMaxInt8K) {
    return absl::StrCat("INT8 with K = ", w.k, " > ", kMaxInt8K, " could overflow int32");
  }
  return "";
}

}  // namespace

absl::StatusOr<PackedWeight> PackedWeight::Pack(const QuantizedMatrix& w) {
  if (absl::Status s = ValidateLayout(w); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("w ", s.message()));
  }
  PackedWeight packed;
  packed.panels_ = internal::PackPanels(w, internal::KindFor(w.format, w.format));
  if (packed.panels_->has_special) packed.original_ = std::make_shared<const QuantizedMatrix>(w);
  return packed;
}

Format PackedWeight::format() const { return panels_->format; }
int64_t PackedWeight::rows() const { return panels_->n; }
int64_t PackedWeight::cols() const { return panels_->k; }
size_t PackedWeight::bytes() const {
  size_t bytes = panels_->bytes();
  if (original_) {
    bytes += original_->elements.size() + original_->block_scales.size() +
             4 * original_->row_scales.size();
  }
  return bytes;
}
QuantizedMatrix PackedWeight::Unpacked() const {
  return original_ ? *original_ : internal::UnpackPanels(*panels_);
}

absl::StatusOr<KernelInfo> Linear(const QuantizedMatrix& x, const PackedWeight& w,
                                  std::span<const float> bias, std::span<float> y,
                                  const GemmOptions& options) {
  if (absl::Status s = CheckArguments(x, w, bias, y.size()); !s.ok()) return s;
  const Kind kind = internal::KindFor(x.format, w.format());

  // A pair whose kind differs from the one W was packed for gets a temporary layout.
  std::shared_ptr<const internal::WeightPanels> temporary;
  if (w.panels().kind != kind) temporary = internal::PackPanels(w.Unpacked(), kind);
  const internal::WeightPanels* panels = temporary ? temporary.get() : &w.panels();
  const internal::DecodedX decoded = internal::DecodeActivations(x, kind, w.format());

  KernelInfo info;
  info.fallback_reason = FallbackReason(decoded, *panels);
  if (!info.fallback_reason.empty()) {
    absl::StatusOr<std::vector<float>> out = ReferenceLinear(x, w.Unpacked(), bias);
    if (!out.ok()) return out.status();
    std::copy(out->begin(), out->end(), y.begin());
    info.name = "reference";
    return info;
  }

  internal::Problem problem{&decoded,
                            panels,
                            bias.empty() ? nullptr : bias.data(),
                            y.data(),
                            x.format,
                            w.rows(),
                            internal::FastScalesOk(decoded.range, panels->range)};
  Isa isa = Resolve(options.isa);
  internal::TileFn tile = nullptr;
  if (isa >= Isa::kAvx2) tile = internal::Avx2Tile(kind, problem);
  if (tile == nullptr) {
    isa = Isa::kScalar;
    tile = internal::ScalarTile(kind);
  }
  info.name = absl::StrCat(IsaName(isa), "/", internal::KindName(kind));

  const int64_t row_groups = (x.rows + kRowsPerTask - 1) / kRowsPerTask;
  const int64_t tasks = row_groups * panels->panels;
  const auto run_task = [&](int64_t task) {
    const int64_t panel = task % panels->panels;
    const int64_t first = (task / panels->panels) * kRowsPerTask;
    const int64_t end = std::min(x.rows, first + kRowsPerTask);
    for (int64_t row = first; row < end; row += internal::kMaxTileRows) {
      tile(problem, row, static_cast<int>(std::min<int64_t>(internal::kMaxTileRows, end - row)),
           panel);
    }
  };
  if (options.pool != nullptr) {
    options.pool->ParallelFor(tasks, run_task);
  } else {
    for (int64_t task = 0; task < tasks; ++task) run_task(task);
  }
  return info;
}

absl::StatusOr<std::vector<float>> Linear(const QuantizedMatrix& x, const QuantizedMatrix& w,
                                          std::span<const float> bias,
                                          const GemmOptions& options) {
  absl::StatusOr<PackedWeight> packed = PackedWeight::Pack(w);
  if (!packed.ok()) return packed.status();
  std::vector<float> y(x.rows * w.rows);
  absl::StatusOr<KernelInfo> info = Linear(x, *packed, bias, y, options);
  if (!info.ok()) return info.status();
  return y;
}

}  // namespace mx::kernels
