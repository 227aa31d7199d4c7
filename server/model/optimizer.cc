#include "server/model/optimizer.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "server/base/quote.h"
#include "mx/status_macros.h"

namespace mxserve {

absl::Status LayerOptimizer::Charge(uint64_t bytes, absl::string_view what, Reservation& into) {
  MX_RETURN_IF_ERROR(ReserveInto(budget_, bytes, absl::StrCat(what, " of layer ", Quote(layer_)),
                                 into, principal_));
  bytes_ += bytes;
  return absl::OkStatus();
}

absl::Status LayerOptimizer::Accumulate(int64_t first_row, std::span<const float> grad_weight,
                                        std::span<const float> grad_bias) {
  const std::shared_lock gate(*gate_);  // waits for a step of the model to end
  MutexLock lock(&mu_);
  if (grad_weight_.empty()) {
    // rows × cols fit memory already: the layer's master holds as many floats.
    MX_RETURN_IF_ERROR(Charge(AccumulatorBytes(), "the gradient accumulator", grad_reservation_));
    grad_weight_.assign(weight_elements(), 0.0f);
    grad_bias_.assign(bias_elements(), 0.0f);
    has_row_.assign(static_cast<size_t>(rows_), 0);
  }
  const int64_t rows = static_cast<int64_t>(grad_weight.size()) / cols_;
  for (int64_t r = 0; r < rows; ++r) {
    const size_t row = static_cast<size_t>(first_row + r);
    const float* from = grad_weight.data() + static_cast<size_t>(r * cols_);
    float* to = grad_weight_.data() + row * static_cast<size_t>(cols_);
    if (has_row_[row]) {
      for (int64_t c = 0; c < cols_; ++c) to[c] += from[c];
      if (bias_) grad_bias_[row] += grad_bias[static_cast<size_t>(r)];
    } else {
      std::copy(from, from + cols_, to);
      if (bias_) grad_bias_[row] = grad_bias[static_cast<size_t>(r)];
      has_row_[row] = 1;
      ++rows_with_gradient_;
    }
  }
  return absl::OkStatus();
}

bool LayerOptimizer::HasGradient() const {
  MutexLock lock(&mu_);
  return rows_with_gradient_ > 0;
}

void LayerOptimizer::DiscardGradient() {
  MutexLock lock(&mu_);
  std::fill(has_row_.begin(), has_row_.end(), 0);
  rows_with_gradient_ = 0;
}

bool LayerOptimizer::HasAccumulator() const {
  MutexLock lock(&mu_);
  return !grad_weight_.empty();
}

bool LayerOptimizer::HasMoments() const {
  MutexLock lock(&mu_);
  return !exp_avg_weight_.empty();
}

double LayerOptimizer::GradSquaredNorm() const {
  MutexLock lock(&mu_);
  if (rows_with_gradient_ == 0) return 0.0;
  // Four running sums (column mod 4), so the additions overlap instead of
  // waiting on each other; rows without a gradient add nothing; the bias last.
  double sums[4] = {0, 0, 0, 0};
  for (int64_t r = 0; r < rows_; ++r) {
    if (!has_row_[static_cast<size_t>(r)]) continue;
    const float* row = grad_weight_.data() + static_cast<size_t>(r * cols_);
    for (int64_t c = 0; c < cols_; ++c) sums[c & 3] += static_cast<double>(row[c]) * row[c];
  }
  for (int64_t r = 0; r < static_cast<int64_t>(grad_bias_.size()); ++r) {
    if (has_row_[static_cast<size_t>(r)]) {
      sums[0] += static_cast<double>(grad_bias_[static_cast<size_t>(r)]) *
                 grad_bias_[static_cast<size_t>(r)];
    }
  }
  return (sums[0] + sums[1]) + (sums[2] + sums[3]);
}

absl::StatusOr<LayerOptimizer::Stepped> LayerOptimizer::Step(std::span<const float> weight,
                                                             std::span<const float> bias,
                                                             float grad_scale,
                                                             const AdamWParams& params) {
  MutexLock lock(&mu_);
  if (exp_avg_weight_.empty() || rows_with_gradient_ == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "layer ", Quote(layer_), ": a step needs its gradient and its moments reserved first"));
  }
  // Rows without a gradient step with zero, as torch's dense .grad holds them.
  for (int64_t r = 0; r < rows_; ++r) {
    if (has_row_[static_cast<size_t>(r)]) continue;
    std::fill_n(grad_weight_.begin() + r * cols_, cols_, 0.0f);
    if (bias_) grad_bias_[static_cast<size_t>(r)] = 0.0f;
  }
  Stepped out;
  out.weight.assign(weight.begin(), weight.end());
  out.bias.assign(bias.begin(), bias.end());
  ++step_;
  AdamWStep(out.weight, grad_weight_, grad_scale, exp_avg_weight_, exp_avg_sq_weight_, step_,
            params);
  if (bias_) {
    AdamWStep(out.bias, grad_bias_, grad_scale, exp_avg_bias_, exp_avg_sq_bias_, step_, params);
  }
  std::fill(has_row_.begin(), has_row_.end(), 0);
  rows_with_gradient_ = 0;
  return out;
}

absl::Status LayerOptimizer::ReserveMoments() {
  MutexLock lock(&mu_);
  if (!exp_avg_weight_.empty()) return absl::OkStatus();
  MX_RETURN_IF_ERROR(Charge(MomentBytes(), "AdamW's moments", moment_reservation_));
  exp_avg_weight_.assign(weight_elements(), 0.0f);
  exp_avg_sq_weight_.assign(weight_elements(), 0.0f);
  exp_avg_bias_.assign(bias_elements(), 0.0f);
  exp_avg_sq_bias_.assign(bias_elements(), 0.0f);
  return absl::OkStatus();
}

int64_t LayerOptimizer::steps() const {
  MutexLock lock(&mu_);
  return step_;
}

}  // namespace mxserve
