// The registry: models, their linear layers, weight versions and the quantized
// copies of each weight.
//
// Weights move in two steps. Uploads stage FP32 tensors in a model's staging area;
// Publish turns the staged tensors into weight version N+1 in one swap. Requests
// read a published version through a shared pointer, so an update never changes
// the weights under a running GEMM, and an old version is freed when its last
// reader finishes.
//
// Each (layer, version, format, layout) is quantized once, and prepared once by
// the backend (prepared_weight.h), while its copy is cached: LayerWeights hands
// the copy it made to every later request. All bytes held — FP32 masters,
// staged tensors, prepared copies — count against one MemoryBudget; copies are
// evicted, least recently used first, when something else needs the room
// (copy_cache.h), and made again on their next use.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "mx/format.h"
#include "mx/kernels/thread_pool.h"
#include "mx/packed.h"
#include "server/base/mutex.h"
#include "server/model/copy_cache.h"
#include "server/model/memory_budget.h"
#include "server/model/optimizer.h"
#include "server/model/prepared_weight.h"
#include "server/policy/policy.h"

namespace mxserve {

struct LayerSpec {
  std::string name;
  int64_t out_features = 0;  // N, rows of W
  int64_t in_features = 0;   // K, columns of W
  bool bias = false;
};

// An FP32 tensor and its share of the memory budget.
struct StoredTensor {
  std::vector<float> values;
  Reservation reservation;
};

// How a weight is quantized: blocked along in_features (W as N×K, for the
// forward pass) or along out_features (Wᵀ as K×N rows, for grad_input = dY·W).
enum class WeightLayout { kForward, kTransposed };
// One prepared copy of a layer's weight: its format and layout.
using CopyKey = std::pair<mx::Format, WeightLayout>;
// Who asks for a copy:
// - kRequest: a rollout or reward-phase request; the copy is cached and marked
//   used, so the next version warms it.
// - kUpdate: an update-phase request (mxserved --update-copies slice, the
//   default). A trainer changes its weights after every step, so each update
//   copy of a version is read about once (the forward layout by the forward, the
//   transposed one by grad_input; a few times when the client splits a large
//   call). So nothing is cached for it: Get returns no weight, and WithCopy
//   makes the rows the call needs with Slice, for that call alone. A copy a kRequest
//   use cached (the same format in the rollout) is shared, and not marked used.
// - kWarmUp: the warm-up after a publish; cached, not marked used.
enum class CopyUse { kRequest, kUpdate, kWarmUp };

// One layer at one published version. Values are immutable; the cache grows.
class LayerWeights {
 public:
  // `cache` keeps this version's copies, `prepare` makes them; both outlive it
  // (the registry owns them). `used_before`: the copies the version it replaces
  // held when it was replaced (what requests actually used), to warm.
  // `principal`: the owner of its model (whose upload evicts these copies
  // first, copy_cache.h).
  LayerWeights(LayerSpec spec, uint64_t version, std::shared_ptr<const StoredTensor> weight,
               std::shared_ptr<const StoredTensor> bias, CopyCache& cache,
               const WeightPreparer& prepare, std::vector<CopyKey> used_before = {},
               std::string principal = "")
      : spec_(std::move(spec)),
        version_(version),
        weight_(std::move(weight)),
        bias_(std::move(bias)),
        used_before_(std::move(used_before)),
        principal_(std::move(principal)),
        copies_(cache),
        prepare_(prepare) {}
  ~LayerWeights();
  LayerWeights(const LayerWeights&) = delete;
  LayerWeights& operator=(const LayerWeights&) = delete;

  const LayerSpec& spec() const { return spec_; }
  uint64_t version() const { return version_; }
  const std::vector<float>& weight() const { return weight_->values; }
  // Empty for a layer without bias.
  std::span<const float> bias() const {
    return bias_ ? std::span<const float>(bias_->values) : std::span<const float>();
  }

  struct Quantized {
    // Null for a CopyUse::kUpdate use of a copy not cached: WithCopy slices it.
    std::shared_ptr<const PreparedWeight> weight;
    bool created = false;  // false: served from the cache
  };
  // The weight in `format` and `layout`, quantized and prepared by the backend
  // on first use or after an eviction (under this layer's lock, so concurrent
  // first users wait for one conversion). The budget is charged for the
  // prepared copy as a whole.
  absl::StatusOr<Quantized> Get(mx::Format format, WeightLayout layout, MemoryBudget& budget,
                                CopyUse use = CopyUse::kRequest) const;
  // Rows [begin, end) of the copy in `format` and `layout` (of W's N rows in the
  // forward layout, of Wᵀ's K rows in the transposed one), quantized and
  // prepared for one call: never cached, charged to the budget while held. Each
  // row is quantized on its own, so they are those rows of the whole copy, bit
  // for bit. The caller checks 0 <= begin < end <= rows.
  absl::StatusOr<std::shared_ptr<const PreparedWeight>> Slice(mx::Format format,
                                                              WeightLayout layout, int64_t begin,
                                                              int64_t end,
                                                              MemoryBudget& budget) const;

  // One part of a copy that WithCopy hands over: rows [begin, end) of the
  // copy's rows (N in the forward layout, K in the transposed one), prepared.
  struct CopyPart {
    int64_t begin = 0;
    int64_t end = 0;
    const PreparedWeight& weight;
  };
  // The copy in `format` and `layout` for one call, part by part, in row order:
  // the cached copy as one part (made first where needed, as Get makes it), or,
  // for a CopyUse::kUpdate use of a copy not cached, slices of whole 64-row
  // panels of at most `slice_elements` elements each (one slice if that is all
  // the rows), made with Slice one at a time and each freed before the next.
  // The first error of `use` ends the walk and is returned. `*created` says
  // whether a copy was quantized for this call (the cached one made, or every
  // slice made and used).
  absl::Status WithCopy(mx::Format format, WeightLayout layout, MemoryBudget& budget, CopyUse use,
                        int64_t slice_elements,
                        absl::FunctionRef<absl::Status(const CopyPart&)> use_part,
                        bool* created) const;

  const std::shared_ptr<const StoredTensor>& weight_tensor() const { return weight_; }
  const std::shared_ptr<const StoredTensor>& bias_tensor() const { return bias_; }

  // Formats held in the forward layout (not evicted).
  std::vector<mx::Format> CachedFormats() const;
  // What the next version of this layer should warm: the copies requests used
  // that are still held, or, if requests used none, what this version was told
  // its predecessor used.
  std::vector<CopyKey> CopiesInUse() const;
  // The predecessor's CopiesInUse() when this version replaced it; empty for a
  // first version.
  const std::vector<CopyKey>& used_before() const { return used_before_; }
  // FP32 masters (counted once even when shared with another version) + copies.
  uint64_t Bytes() const;
  // The FP32 masters alone (weight and bias): what --quota-weight-bytes charges.
  uint64_t MasterBytes() const;

 private:
  const LayerSpec spec_;
  const uint64_t version_;
  const std::shared_ptr<const StoredTensor> weight_;
  const std::shared_ptr<const StoredTensor> bias_;
  const std::vector<CopyKey> used_before_;
  const std::string principal_;
  CopyCache& copies_;
  const WeightPreparer& prepare_;
  // Rows [begin, end) of the copy in `format` and `layout` (all of them for
  // Get), quantized, prepared by the backend and charged to `budget`.
  absl::StatusOr<std::shared_ptr<const CachedCopy>> Make(mx::Format format, WeightLayout layout,
                                                         int64_t begin, int64_t end,
                                                         MemoryBudget& budget) const;
  // NVFP4's tensor scale of the whole weight, worked out on first use and kept:
  // every copy and every slice of one is quantized under it.
  float NvTensorScale() const;

  mutable std::once_flag nv_tensor_scale_once_;
  mutable float nv_tensor_scale_ = 0.0f;
  mutable Mutex mu_;
  // Strong references live in copies_ and in the requests using a copy: an
  // evicted copy expires here once they are done.
  mutable std::map<CopyKey, std::weak_ptr<const CachedCopy>> cache_
      ABSL_GUARDED_BY(mu_);
  mutable std::set<CopyKey> used_ ABSL_GUARDED_BY(mu_);  // asked for by requests
};

// A tensor an upload fills; committed to a model's staging area as a whole.
struct StagedTensorKey {
  std::string layer;
  bool is_bias = false;
  auto operator<=>(const StagedTensorKey&) const = default;
};

// What a request reads: the layer's published weights and how to resolve its
// format.
struct LayerView {
  std::string model;  // the model's name
  std::shared_ptr<const LayerWeights> weights;
  LayerTolerance tolerance;  // its place in the model's tolerance ranking
  std::string policy;  // the model's active policy
  // The layer's optimizer state on the daemon (accumulated gradient, AdamW's
  // moments), for LayerBackward with accumulate_grad. Never null.
  std::shared_ptr<LayerOptimizer> optimizer;
};

// Models.StepOptimizer's request: AdamW, with torch's global gradient-norm
// clipping over the daemon's layers and the trainer's own parameters.
struct OptimizerStep {
  AdamWParams adamw;
  double max_grad_norm = 0;       // <= 0: no clipping
  double other_grad_sq_norm = 0;  // Σ‖g‖² of the parameters the trainer steps itself
  // Forget the accumulated gradients instead of stepping (the norms are still
  // reported; nothing is published; `adamw` is not read).
  bool discard = false;
  // --quota-weight-bytes (0: none): the moments a first step adds count.
  uint64_t quota_bytes = 0;
};

struct OptimizerStepResult {
  uint64_t version = 0;  // the version the stepped masters were published as
  // Per layer that had a gradient, in the model's layer order: its name and
  // ‖grad_weight‖² + ‖grad_bias‖² (before clipping), FP64.
  std::vector<std::pair<std::string, double>> grad_sq_norms;
  double total_grad_norm = 0;   // sqrt(other_grad_sq_norm + Σ of the above)
  float clip_coefficient = 1;   // what every gradient was multiplied by
  bool published = false;       // false: nothing stepped (no gradient, or discard)
};

struct ModelSummary {
  std::string name;
  std::string owner;  // the principal that registered it
  std::string policy;
  uint64_t version = 0;
  uint64_t staged_tensors = 0;
  // Everything it holds: staged tensors, FP32 masters, optimizer state, cached copies.
  uint64_t bytes = 0;
  // What --quota-weight-bytes charges its owner for it: staged tensors, FP32
  // masters and optimizer state (gradient accumulators, moments), not the
  // cached copies (the daemon's cache, whoever's requests made them; evicted
  // under --weight-memory-bytes).
  uint64_t quota_bytes = 0;
  double lease_seconds = 0;  // 0: none
  struct Layer {
    LayerSpec spec;
    std::vector<mx::Format> cached_formats;
    LayerTolerance tolerance;
  };
  std::vector<Layer> layers;
};

class Registry {
 public:
  // Installs the copy cache as `budget`'s reclaimer; `prepare` turns quantized
  // weights into the backend's form; `on_evict` (may be empty) is told how
  // many copies each reclaim evicted.
  Registry(MemoryBudget* budget, WeightPreparer prepare,
           std::function<void(int evicted)> on_evict = {});

  MemoryBudget& budget() const { return *budget_; }

  // ALREADY_EXISTS, or INVALID_ARGUMENT naming the field (name, layers[i].name,
  // lease_seconds, ...). A model with a lease (lease_seconds > 0) is deleted by
  // DeleteExpired once no call has found it by name for that long.
  // `owner`: the principal that registers it (access.h). With `quota_models` >
  // 0, RESOURCE_EXHAUSTED (--quota-models) when `owner` already has that many.
  absl::Status Register(const std::string& name, std::vector<LayerSpec> layers,
                        const std::string& policy, double lease_seconds = 0,
                        const std::string& owner = "", int64_t quota_models = 0);
  // The principal that registered `model` (NOT_FOUND for no such model).
  absl::StatusOr<std::string> Owner(absl::string_view model) const;
  // Deletes the models whose lease ran out by `now`; their names and the bytes
  // each held.
  std::vector<std::pair<std::string, uint64_t>> DeleteExpired(
      std::chrono::steady_clock::time_point now);
  // NOT_FOUND "model: ..." / "layer: ..."; FAILED_PRECONDITION before the first
  // publish or below min_version.
  absl::StatusOr<LayerView> Lookup(absl::string_view model, absl::string_view layer,
                                   uint64_t min_version) const;
  // RESOURCE_EXHAUSTED naming `field` when `more` bytes would take what the
  // owner of `model` is charged for (ModelSummary::quota_bytes over its models)
  // past `quota_bytes` (0: no quota). NOT_FOUND for no such model.
  absl::Status CheckOwnerQuota(absl::string_view model, uint64_t more, uint64_t quota_bytes,
                               absl::string_view field) const;
  // The spec of a layer, for validating uploads (NOT_FOUND naming `field`).
  absl::StatusOr<LayerSpec> FindLayer(absl::string_view model, absl::string_view layer,
                                      absl::string_view field) const;
  // Replaces staged tensors, all or none. With `publish`, also makes them the
  // next version, and stages nothing unless that publish succeeds; returns the
  // new version (0 without publish). With `quota_bytes` > 0, stages nothing
  // and answers RESOURCE_EXHAUSTED (--quota-weight-bytes) when the bytes the
  // model's owner is charged for (ModelSummary::quota_bytes of each of its
  // models: staged tensors and FP32 masters, never cached copies) would then
  // exceed it.
  absl::StatusOr<uint64_t> Stage(absl::string_view model,
                                 std::vector<std::pair<StagedTensorKey, StoredTensor>> tensors,
                                 bool publish, uint64_t quota_bytes = 0);
  // Makes the staged tensors version N+1; returns the new version.
  absl::StatusOr<uint64_t> Publish(absl::string_view model);
  // One AdamW step (adamw.h) of every layer that accumulated a gradient since
  // its last step, from the published FP32 masters, published as version N+1
  // (staged tensors stay staged; the other layers keep their weights). Holds
  // the model's writer lock throughout, so an upload's publish waits for it, and
  // reserves everything it needs (new masters, moments) before it changes
  // anything: RESOURCE_EXHAUSTED leaves gradients, moments' values and weights
  // as they were (first moments it made for some layers stay, zero, for the
  // next step, and charged). No layer with a gradient: nothing stepped or published (as torch
  // skips parameters without one), the current version and the coefficient of
  // other_grad_sq_norm alone. Gradients that arrive while it runs wait for it
  // (the writer lock) and count for the next step. FAILED_PRECONDITION before
  // the first publish; ABORTED when the model was deleted and registered again
  // meanwhile; INVALID_ARGUMENT naming the field for bad hyperparameters.
  // `pool` (may be null): the threads the layers' norms and steps are spread
  // over, a layer per task.
  absl::StatusOr<OptimizerStepResult> StepOptimizer(absl::string_view model,
                                                    const OptimizerStep& step,
                                                    mx::kernels::ThreadPool* pool = nullptr);
  absl::StatusOr<ModelSummary> Describe(absl::string_view model) const;
  // The models whose names sort after `after` ("": all), in name order, to
  // `take` until it returns false. `take` runs under the registry's lock.
  void List(absl::string_view after,
            const std::function<bool(const ModelSummary&)>& take) const;
  // Returns the bytes the model held.
  absl::StatusOr<uint64_t> Delete(absl::string_view model);
  // Returns the previous policy.
  absl::StatusOr<std::string> SetPolicy(absl::string_view model, const std::string& policy);
  bool PolicyInUse(absl::string_view policy) const;
  // For deleting `policy`, owned by `owner` ("" for none): when a model of
  // `owner` (any model, for "") has it active, changes nothing and returns
  // false; else sets every model that has it active (other principals' models,
  // which activated it) to `fallback`, names them in `reset`, and returns true.
  bool ReleasePolicy(absl::string_view policy, absl::string_view owner,
                     const std::string& fallback, std::vector<std::string>& reset);
  // Re-ranks the model's layers by tolerance: `measured` (layer names, most
  // tolerant first, e.g. from its newest sensitivity profile) over the built-in
  // ranking, as ToleranceRanks does; empty: the built-in ranking alone. NOT_FOUND
  // for no such model.
  absl::Status SetToleranceOrder(absl::string_view model, const std::vector<std::string>& measured);
  // The published layers of a model (empty before the first publish).
  absl::StatusOr<std::vector<LayerView>> PublishedLayers(absl::string_view model) const;
  size_t model_count() const;

 private:
  struct Model {
    std::string name;
    std::string owner;
    std::vector<LayerSpec> layers;
    // Per layer, its tolerance rank (server/policy/layer_sensitivity.h): the
    // built-in ranking until SetToleranceOrder gives a measured one.
    std::vector<uint32_t> tolerance_rank;
    std::map<std::string, int, std::less<>> index;
    std::string policy;
    uint64_t version = 0;
    double lease_seconds = 0;
    // The last time a call found the model by name (FindModel): its lease's start.
    mutable std::chrono::steady_clock::time_point last_used;
    std::vector<std::shared_ptr<const LayerWeights>> published;  // per layer
    std::map<StagedTensorKey, std::shared_ptr<const StoredTensor>> staged;
    // Held exclusively by whatever publishes (Stage, Publish, StepOptimizer)
    // from before it reads the published weights until it has replaced them,
    // and shared by gradient accumulations (LayerOptimizer::Accumulate), so a
    // step sees no gradient arrive between its norms and its update. Taken
    // before mu_ and before a layer's optimizer lock, never under either.
    std::shared_ptr<std::shared_mutex> writer = std::make_shared<std::shared_mutex>();
    std::vector<std::shared_ptr<LayerOptimizer>> optimizers;  // per layer
  };
  using StagedMap = std::map<StagedTensorKey, std::shared_ptr<const StoredTensor>>;
  absl::StatusOr<const Model*> FindModel(absl::string_view name) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The writer lock of a model (Model::writer); NOT_FOUND for no such model.
  absl::StatusOr<std::shared_ptr<std::shared_mutex>> Writer(absl::string_view model) const;
  // The model and the index of its layer; NOT_FOUND naming `field` for a layer
  // it does not have.
  struct FoundLayer {
    const Model* model;
    int index;
  };
  absl::StatusOr<FoundLayer> FindLayerLocked(absl::string_view model, absl::string_view layer,
                                             absl::string_view field) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // FAILED_PRECONDITION unless every layer would have its weight (and bias).
  absl::Status CheckPublishable(const Model& model, const StagedMap& staged) const;
  uint64_t PublishLocked(Model& model);
  ModelSummary Summarize(const Model& model) const;
  // What `model` holds: staged tensors, then each published layer's masters and
  // copies, and its optimizer state (ModelSummary::bytes).
  uint64_t HeldBytes(const Model& model) const;
  // What its owner is charged for: the same without the copies
  // (ModelSummary::quota_bytes).
  uint64_t ChargedBytes(const Model& model) const;
  // ChargedBytes summed over every model `owner` registered.
  uint64_t OwnerChargedBytes(absl::string_view owner) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Staged tensors, published weights and optimizer state: with the weights'
  // copies or their masters alone.
  uint64_t StoredBytes(const Model& model, bool with_copies) const;

  MemoryBudget* budget_;
  const WeightPreparer prepare_;
  CopyCache copies_;
  mutable Mutex mu_;
  std::map<std::string, std::unique_ptr<Model>, std::less<>> models_ ABSL_GUARDED_BY(mu_);
};

// Name limits (server/README.md documents them).
inline constexpr size_t kMaxModelNameChars = 128;  // [A-Za-z0-9._-]+
inline constexpr size_t kMaxLayerNameChars = 256;  // any bytes
// Layers a model may declare: a mixture-of-experts model with a linear layer per
// expert has tens of thousands. The bound keeps one registration's memory (about
// 2.5 KB a layer) and one model's description in an answer within reason.
inline constexpr size_t kMaxLayersPerModel = 65536;
// The longest model lease (RegisterModelRequest.lease_seconds): 30 days.
inline constexpr int64_t kMaxLeaseSeconds = 30 * 24 * 3600;

// The model-name rule of RegisterModel: [A-Za-z0-9._-]+, at most 128 characters.
bool ValidModelName(absl::string_view name);

}  // namespace mxserve
