// A layer's optimizer state on the daemon, for a trainer whose optimizer runs
// where its GEMMs run (Models.StepOptimizer, issue 37): the weight gradient
// that LayerBackward with accumulate_grad adds up instead of sending it down,
// and AdamW's two moments. The FP32 masters stay the registry's published
// weights; a step reads them and makes the next version's.
//
// Memory, charged to --weight-memory-bytes (and counted in the owner's
// quota_bytes): the gradient accumulator from the first accumulation (4 bytes
// per parameter, plus one byte per row of W), the two moments from the first
// step (8 bytes per parameter); on top of the 4-byte master, 16 bytes per
// parameter in all, held until the model is deleted.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <shared_mutex>
#include <span>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/base/mutex.h"
#include "server/model/adamw.h"
#include "server/model/memory_budget.h"

namespace mxserve {

class LayerOptimizer {
 public:
  // W is `rows` × `cols` (out_features × in_features); `bias`: whether the
  // layer has one. `principal`: whose copies make room first (memory_budget.h).
  // `gate`: the model's writer lock, held shared while a gradient is added
  // (a step holds it exclusively).
  LayerOptimizer(std::string layer, int64_t rows, int64_t cols, bool bias, MemoryBudget& budget,
                 std::string principal, std::shared_ptr<std::shared_mutex> gate)
      : layer_(std::move(layer)),
        rows_(rows),
        cols_(cols),
        bias_(bias),
        budget_(budget),
        principal_(std::move(principal)),
        gate_(std::move(gate)) {}
  LayerOptimizer(const LayerOptimizer&) = delete;
  LayerOptimizer& operator=(const LayerOptimizer&) = delete;

  // Adds rows [first_row, first_row + grad_weight.size() / cols) of the weight
  // gradient (and the same elements of the bias gradient; empty for a layer
  // without bias) to the accumulator. A row's first gradient since the last
  // step is copied, later ones added, as torch fills and adds to `.grad`.
  // Waits while a step of the model runs (the gate). The caller checks the
  // rows are in range and the sizes whole.
  // RESOURCE_EXHAUSTED when the accumulator does not fit the budget.
  absl::Status Accumulate(int64_t first_row, std::span<const float> grad_weight,
                          std::span<const float> grad_bias);

  // Whether a gradient arrived since the last step (else a step skips the
  // layer, as torch skips a parameter whose .grad is None).
  bool HasGradient() const;
  // Forgets the gradient accumulated since the last step (a backward pass that
  // failed midway); the moments stay.
  void DiscardGradient();
  // Whether the accumulator, and the moments, are held; the bytes each takes
  // (what a first accumulation, or a first step, adds).
  bool HasAccumulator() const;
  bool HasMoments() const;
  uint64_t AccumulatorBytes() const {
    return (weight_elements() + bias_elements()) * sizeof(float) + static_cast<uint64_t>(rows_);
  }
  uint64_t MomentBytes() const { return 2 * (weight_elements() + bias_elements()) * sizeof(float); }
  // ‖grad_weight‖² + ‖grad_bias‖² of the accumulated gradient, in FP64 (rows
  // that got none count as zero), summed in an order of its own: to FP64
  // rounding, not bit for bit any other sum.
  double GradSquaredNorm() const;

  struct Stepped {
    std::vector<float> weight;
    std::vector<float> bias;  // empty without bias
  };
  // One AdamW step of the masters `weight` and `bias` with the accumulated
  // gradient times `grad_scale`: the moments advance, the accumulator empties,
  // and the stepped masters come back (new tensors: the published ones are
  // shared with readers). The caller checks HasGradient() and calls
  // ReserveMoments() first; without them it steps nothing and answers
  // FAILED_PRECONDITION.
  absl::StatusOr<Stepped> Step(std::span<const float> weight, std::span<const float> bias,
                               float grad_scale, const AdamWParams& params);

  // Reserves AdamW's moments (zeros) unless held: a step of several layers
  // makes room for all of them before it changes any. RESOURCE_EXHAUSTED when
  // they do not fit the budget.
  absl::Status ReserveMoments();

  // Bytes held: accumulator and moments. Takes no lock (the registry asks
  // under its own).
  uint64_t Bytes() const { return bytes_.load(std::memory_order_relaxed); }
  int64_t steps() const;

 private:
  size_t weight_elements() const { return static_cast<size_t>(rows_ * cols_); }
  // Reserves `bytes` for `what` of this layer into `into`, and counts them in Bytes().
  absl::Status Charge(uint64_t bytes, absl::string_view what, Reservation& into)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  size_t bias_elements() const { return bias_ ? static_cast<size_t>(rows_) : 0; }

  const std::string layer_;
  const int64_t rows_, cols_;
  const bool bias_;
  MemoryBudget& budget_;
  const std::string principal_;
  const std::shared_ptr<std::shared_mutex> gate_;
  mutable Mutex mu_;
  std::vector<float> grad_weight_ ABSL_GUARDED_BY(mu_);
  std::vector<float> grad_bias_ ABSL_GUARDED_BY(mu_);
  // Per row of W: whether it got a gradient since the last step.
  std::vector<uint8_t> has_row_ ABSL_GUARDED_BY(mu_);
  int64_t rows_with_gradient_ ABSL_GUARDED_BY(mu_) = 0;
  Reservation grad_reservation_ ABSL_GUARDED_BY(mu_);
  std::vector<float> exp_avg_weight_ ABSL_GUARDED_BY(mu_), exp_avg_sq_weight_ ABSL_GUARDED_BY(mu_);
  std::vector<float> exp_avg_bias_ ABSL_GUARDED_BY(mu_), exp_avg_sq_bias_ ABSL_GUARDED_BY(mu_);
  Reservation moment_reservation_ ABSL_GUARDED_BY(mu_);
  int64_t step_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<uint64_t> bytes_{0};
};

}  // namespace mxserve
