// Builds a sensitivity profile of one model version, one calibration batch at a
// time, so the daemon holds one batch and one layer's quantized weights, never
// the whole calibration set.
//
// For a batch X of layer L (W, bias b) and each candidate format F:
//   Y   = X·Wᵀ + b in the reference precision (FP32 kernels, or FP64)
//   Y_F = the layer as the daemon serves it in F: X and W quantized to F, the
//         mx/ kernels (bit-identical to the FPGA datapath by the numerics contract)
// and it adds Σ (Y_F − Y)², Σ Y² and, given dL/dY, Σ (dL/dY)² (Y_F − Y)² to the
// layer's totals. Without any batch the profile is weight-only: W_F against W.
// The arithmetic runs on the CPU emulation whatever the daemon's backend: the
// numbers are the format's, not the device's, and profiling never waits for or
// occupies the device.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "fpga/model/energy_model.h"
#include "mx/kernels/linear.h"
#include "mx/kernels/thread_pool.h"
#include "server/model/memory_budget.h"
#include "server/model/registry.h"
#include "server/profile/profile.h"

namespace mxserve {

// Largest batch_tokens a profile takes (the cost model's rows per GEMM).
inline constexpr int64_t kMaxProfileBatchTokens = int64_t{1} << 20;

// INVALID_ARGUMENT naming `field` and the first element that is NaN or infinite.
absl::Status CheckFinite(std::span<const float> values, absl::string_view field);

class ProfileBuilder {
 public:
  struct Options {
    std::vector<mx::Format> formats;  // non-empty, no repeats
    Reference reference = Reference::kFp32;
    int64_t batch_tokens = 128;  // 1 .. kMaxProfileBatchTokens
  };

  // `layers`: the published layers to profile, all of one version, in
  // registration order. `pool` splits the GEMMs; `budget` is charged for the
  // working memory (one batch's outputs, one layer's quantized weights).
  ProfileBuilder(std::string model, uint64_t version,
                 std::vector<std::shared_ptr<const LayerWeights>> layers, Options options,
                 const fpga_model::EnergyModelParams& energy, mx::kernels::ThreadPool* pool,
                 MemoryBudget* budget);
  ~ProfileBuilder();
  ProfileBuilder(const ProfileBuilder&) = delete;
  ProfileBuilder& operator=(const ProfileBuilder&) = delete;

  // The index of a profiled layer, or -1.
  int LayerIndex(absl::string_view name) const;
  const LayerSpec& spec(int layer) const;
  size_t layer_count() const;

  // Adds one batch of layer `layer`: `x` is rows × in_features, `dy` empty or
  // rows × out_features, all finite (the caller checks shapes and values).
  // RESOURCE_EXHAUSTED when its working memory does not fit the budget.
  absl::Status AddBatch(int layer, std::span<const float> x, int64_t rows,
                        std::span<const float> dy);

  // The profile. With batches, every profiled layer must have had one
  // (FAILED_PRECONDITION naming those that did not).
  absl::StatusOr<Profile> Finish();

 private:
  struct Totals;
  struct WeightCache;
  absl::Status LoadWeights(int layer);
  void Reference64(int layer, std::span<const float> x, int64_t rows, std::span<double> y) const;
  absl::StatusOr<std::vector<FormatScore>> WeightOnlyScores(int layer);

  const std::string model_;
  const uint64_t version_;
  const std::vector<std::shared_ptr<const LayerWeights>> layers_;
  const Options options_;
  const fpga_model::EnergyModelParams& energy_;
  mx::kernels::ThreadPool* const pool_;
  MemoryBudget* const budget_;
  std::vector<Totals> totals_;            // per layer
  std::unique_ptr<WeightCache> weights_;  // the last batch's layer, quantized
  uint64_t batches_ = 0;
  double compute_seconds_ = 0;
};

}  // namespace mxserve
