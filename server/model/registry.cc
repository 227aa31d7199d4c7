#include "server/model/registry.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "mx/checked_math.h"
#include "mx/kernels/quantize_fast.h"
#include "mx/status_macros.h"
#include "server/base/quote.h"
#include "server/policy/layer_sensitivity.h"

namespace mxserve {
namespace {

constexpr int64_t kMaxDimension = int64_t{1} << 20;

// A writer waited for a model's lock while the model was deleted and another
// registered under its name: what it was about to write belongs to neither.
absl::Status ModelReplaced(absl::string_view name) {
  return absl::AbortedError(absl::StrCat("model: ", Quote(name),
                                         " was deleted and registered again meanwhile; nothing "
                                         "was written (retry against the new model)"));
}

absl::Status ModelNotFound(absl::string_view name) {
  return absl::NotFoundError(absl::StrCat("model: no model named ", Quote(name)));
}

// A layer's place in its model's ranking (M: Registry::Model, private).
template <typename M>
LayerTolerance ToleranceOf(const M& model, size_t layer) {
  return {model.tolerance_rank[layer], static_cast<uint32_t>(model.tolerance_rank.size())};
}

}  // namespace

Registry::Registry(MemoryBudget* budget, WeightPreparer prepare, std::function<void(int)> on_evict)
    : budget_(budget), prepare_(std::move(prepare)) {
  budget_->SetReclaimer([this, on_evict = std::move(on_evict)](uint64_t bytes,
                                                               absl::string_view first) {
    // Evict only when that makes room: a reservation that cannot fit even with
    // every unheld copy gone must not flush other models' copies first (issue 32,
    // item 7: any uploader could empty every tenant's cache that way).
    const uint64_t used = budget_->used();
    const uint64_t kept = used - std::min(used, copies_.ReclaimableBytes());
    if (bytes > budget_->limit() || kept > budget_->limit() - bytes) return;
    // The copies of `first`'s models go first: an owner's upload makes room in
    // her own cache before it touches other tenants' (issue 32, item 3).
    const int evicted =
        copies_.EvictUntil([this, bytes] { return budget_->Fits(bytes); }, std::string(first));
    if (evicted > 0 && on_evict) on_evict(evicted);
  });
}

bool ValidModelName(absl::string_view name) {
  if (name.empty() || name.size() > kMaxModelNameChars) return false;
  for (char c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-') {
      return false;
    }
  }
  return true;
}

LayerWeights::~LayerWeights() { copies_.Forget(this); }

absl::StatusOr<LayerWeights::Quantized> LayerWeights::Get(mx::Format format, WeightLayout layout,
                                                          MemoryBudget& budget, CopyUse use) const {
  MutexLock lock(&mu_);
  auto key = std::make_pair(format, layout);
  if (auto it = cache_.find(key); it != cache_.end()) {
    if (std::shared_ptr<const CachedCopy> copy = it->second.lock()) {
      if (use == CopyUse::kRequest) used_.insert(key);
      copies_.Touch(this, copy, principal_);  // back in the cache if it was evicted
      return Quantized{std::shared_ptr<const PreparedWeight>(copy, copy->weight.get()), false};
    }
    cache_.erase(it);  // evicted and released: make it again
  }
  if (use == CopyUse::kUpdate) return Quantized{};  // the caller slices
  if (use == CopyUse::kRequest) used_.insert(key);
  const int64_t rows = layout == WeightLayout::kForward ? spec_.out_features : spec_.in_features;
  MX_ASSIGN_OR_RETURN(std::shared_ptr<const CachedCopy> held,
                      Make(format, layout, 0, rows, budget));
  cache_[key] = held;
  copies_.Touch(this, held, principal_);
  return Quantized{std::shared_ptr<const PreparedWeight>(held, held->weight.get()), true};
}

absl::StatusOr<std::shared_ptr<const PreparedWeight>> LayerWeights::Slice(
    mx::Format format, WeightLayout layout, int64_t begin, int64_t end,
    MemoryBudget& budget) const {
  MX_ASSIGN_OR_RETURN(std::shared_ptr<const CachedCopy> held,
                      Make(format, layout, begin, end, budget));
  return std::shared_ptr<const PreparedWeight>(held, held->weight.get());
}

absl::Status LayerWeights::WithCopy(mx::Format format, WeightLayout layout, MemoryBudget& budget,
                                    CopyUse use, int64_t slice_elements,
                                    absl::FunctionRef<absl::Status(const CopyPart&)> use_part,
                                    bool* created) const {
  const bool forward = layout == WeightLayout::kForward;
  const int64_t rows = forward ? spec_.out_features : spec_.in_features;
  const int64_t cols = forward ? spec_.in_features : spec_.out_features;
  MX_ASSIGN_OR_RETURN(Quantized copy, Get(format, layout, budget, use));
  *created = copy.created;
  if (copy.weight) return use_part({.begin = 0, .end = rows, .weight = *copy.weight});
  // Whole panels of 64 rows per slice, unless one slice holds them all.
  const int64_t step = std::max<int64_t>(64, slice_elements / cols / 64 * 64);
  for (int64_t begin = 0; begin < rows; begin += step) {
    const int64_t end = std::min(rows, begin + step);
    MX_ASSIGN_OR_RETURN(std::shared_ptr<const PreparedWeight> slice,
                        Slice(format, layout, begin, end, budget));
    MX_RETURN_IF_ERROR(use_part({.begin = begin, .end = end, .weight = *slice}));
  }
  *created = true;
  return absl::OkStatus();
}

float LayerWeights::NvTensorScale() const {
  std::call_once(nv_tensor_scale_once_,
                 [&] { nv_tensor_scale_ = mx::NvTensorScale(mx::FiniteAmax(weight())); });
  return nv_tensor_scale_;
}

absl::StatusOr<std::shared_ptr<const CachedCopy>> LayerWeights::Make(mx::Format format,
                                                                     WeightLayout layout,
                                                                     int64_t begin, int64_t end,
                                                                     MemoryBudget& budget) const {
  const int64_t n = spec_.out_features, k = spec_.in_features;
  const std::vector<float>& w = weight_->values;
  const bool whole = begin == 0 && end == (layout == WeightLayout::kForward ? n : k);
  // NVFP4's tensor scale is the whole weight's, in whichever slices a copy is made.
  mx::QuantizeOptions options;
  if (format == mx::Format::kNvfp4) options.tensor_scale = NvTensorScale();
  absl::StatusOr<mx::QuantizedMatrix> q;
  if (layout == WeightLayout::kForward) {
    q = mx::kernels::QuantizeRows(std::span<const float>(w).subspan(begin * k, (end - begin) * k),
                                  end - begin, k, format, options);
  } else if (whole) {
    q = mx::kernels::QuantizeColumns(w, n, k, format, options);
  } else {
    // Columns [begin, end) of W, gathered, then quantized along out_features.
    const int64_t width = end - begin;
    std::vector<float> columns(static_cast<size_t>(n * width));
    for (int64_t row = 0; row < n; ++row) {
      std::copy_n(w.data() + row * k + begin, width, columns.data() + row * width);
    }
    q = mx::kernels::QuantizeColumns(columns, n, width, format, options);
  }
  if (!q.ok()) return q.status();
  MX_ASSIGN_OR_RETURN(std::shared_ptr<const PreparedWeight> prepared, prepare_(*std::move(q)));
  auto copy = std::make_shared<CachedCopy>();
  const std::string what =
      absl::StrCat(whole ? "" : absl::StrCat("rows ", begin, "-", end, " of "), "the ",
                   mx::FormatName(format), layout == WeightLayout::kTransposed ? " transposed" : "",
                   " copy of layer ", Quote(spec_.name));
  MX_RETURN_IF_ERROR(ReserveInto(budget, prepared->bytes(), what, copy->reservation));
  copy->weight = std::move(prepared);
  return copy;
}

std::vector<mx::Format> LayerWeights::CachedFormats() const {
  MutexLock lock(&mu_);
  std::vector<mx::Format> formats;
  for (const auto& [key, copy] : cache_) {
    if (key.second == WeightLayout::kForward && !copy.expired()) formats.push_back(key.first);
  }
  return formats;
}

std::vector<CopyKey> LayerWeights::CopiesInUse() const {
  MutexLock lock(&mu_);
  std::vector<CopyKey> copies;
  for (const CopyKey& key : used_) {
    auto it = cache_.find(key);
    if (it != cache_.end() && !it->second.expired()) copies.push_back(key);
  }
  return copies.empty() ? used_before_ : copies;
}

uint64_t LayerWeights::Bytes() const {
  MutexLock lock(&mu_);
  uint64_t bytes = MasterBytes();
  for (const auto& [key, weak] : cache_) {
    if (std::shared_ptr<const CachedCopy> copy = weak.lock()) bytes += copy->reservation.bytes();
  }
  return bytes;
}

uint64_t LayerWeights::MasterBytes() const {
  return weight_->reservation.bytes() + (bias_ ? bias_->reservation.bytes() : 0);
}

absl::Status Registry::Register(const std::string& name, std::vector<LayerSpec> layers,
                                const std::string& policy, double lease_seconds,
                                const std::string& owner, int64_t quota_models) {
  if (!ValidModelName(name)) {
    return absl::InvalidArgumentError(absl::StrCat("name: ", Quote(name),
                                                   " is not a model name; expected 1-",
                                                   kMaxModelNameChars, " of [A-Za-z0-9._-]"));
  }
  if (layers.empty()) {
    return absl::InvalidArgumentError("layers: a model needs at least one layer");
  }
  if (layers.size() > kMaxLayersPerModel) {
    return absl::InvalidArgumentError(absl::StrCat("layers: at most ", kMaxLayersPerModel,
                                                   " a model, got ", layers.size()));
  }
  if (!(lease_seconds == 0 || (lease_seconds >= 1 && lease_seconds <= kMaxLeaseSeconds))) {
    return absl::InvalidArgumentError(absl::StrCat("lease_seconds: expected 0 (no lease) or 1 to ",
                                                   kMaxLeaseSeconds, ", got ", lease_seconds));
  }
  auto model = std::make_unique<Model>();
  model->name = name;
  model->owner = owner;
  model->policy = policy;
  model->lease_seconds = lease_seconds;
  model->last_used = std::chrono::steady_clock::now();
  uint64_t fp32_bytes = 0;
  std::vector<std::string> names;
  for (size_t i = 0; i < layers.size(); ++i) {
    const LayerSpec& spec = layers[i];
    const std::string field = absl::StrCat("layers[", i, "]");
    if (spec.name.empty() || spec.name.size() > kMaxLayerNameChars) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".name: expected a non-empty name of at most ", kMaxLayerNameChars,
                       " characters, got ", Quote(spec.name)));
    }
    if (spec.out_features <= 0 || spec.out_features > kMaxDimension) {
      return absl::InvalidArgumentError(absl::StrCat(field, ".out_features: expected 1 to ",
                                                     kMaxDimension, ", got ", spec.out_features));
    }
    if (spec.in_features <= 0 || spec.in_features > kMaxDimension) {
      return absl::InvalidArgumentError(absl::StrCat(field, ".in_features: expected 1 to ",
                                                     kMaxDimension, ", got ", spec.in_features));
    }
    if (!model->index.emplace(spec.name, static_cast<int>(i)).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".name: layer ", Quote(spec.name), " is declared twice"));
    }
    // At most 2^42 bytes a layer; the sum over many layers could still wrap.
    const uint64_t layer_bytes =
        static_cast<uint64_t>(spec.out_features) * spec.in_features * sizeof(float);
    fp32_bytes = mx::CheckedAdd(fp32_bytes, layer_bytes).value_or(UINT64_MAX);
    names.push_back(spec.name);
  }
  // Cached copies give way to a new model's masters (its owner's own first).
  if (!budget_->MakeRoom(fp32_bytes, owner)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("layers: the model's FP32 weights need ", fp32_bytes, " bytes, but only ",
                     budget_->limit() - std::min(budget_->limit(), budget_->used()),
                     " of the weight memory limit (--weight-memory-bytes) are free"));
  }
  model->tolerance_rank = ToleranceRanks(names);
  model->layers = std::move(layers);
  model->published.resize(model->layers.size());
  for (const LayerSpec& spec : model->layers) {
    model->optimizers.push_back(std::make_shared<LayerOptimizer>(
        spec.name, spec.out_features, spec.in_features, spec.bias, *budget_, owner,
        model->writer));
  }
  MutexLock lock(&mu_);
  if (models_.contains(name)) {
    return absl::AlreadyExistsError(absl::StrCat("name: a model named ", Quote(name), " exists"));
  }
  if (quota_models > 0) {
    int64_t owned = 0;
    for (const auto& [other, m] : models_) owned += m->owner == owner ? 1 : 0;
    if (owned >= quota_models) {
      return absl::ResourceExhaustedError(absl::StrCat("--quota-models: principal ", Quote(owner),
                                                       " has ", owned, " models, the limit is ",
                                                       quota_models));
    }
  }
  models_.emplace(name, std::move(model));
  return absl::OkStatus();
}

absl::StatusOr<std::string> Registry::Owner(absl::string_view model) const {
  MutexLock lock(&mu_);
  auto it = models_.find(model);
  if (it == models_.end()) return ModelNotFound(model);
  return it->second->owner;
}

absl::StatusOr<const Registry::Model*> Registry::FindModel(absl::string_view name) const {
  auto it = models_.find(name);
  if (it == models_.end()) return ModelNotFound(name);
  it->second->last_used = std::chrono::steady_clock::now();  // renews a lease
  return it->second.get();
}

absl::StatusOr<Registry::FoundLayer> Registry::FindLayerLocked(absl::string_view model_name,
                                                               absl::string_view layer,
                                                               absl::string_view field) const {
  absl::StatusOr<const Model*> model = FindModel(model_name);
  if (!model.ok()) return model.status();
  auto it = (*model)->index.find(layer);
  if (it == (*model)->index.end()) {
    return absl::NotFoundError(
        absl::StrCat(field, ": model ", Quote(model_name), " has no layer ", Quote(layer)));
  }
  return FoundLayer{*model, it->second};
}

absl::StatusOr<LayerView> Registry::Lookup(absl::string_view model_name, absl::string_view layer,
                                           uint64_t min_version) const {
  MutexLock lock(&mu_);
  absl::StatusOr<FoundLayer> found = FindLayerLocked(model_name, layer, "layer");
  if (!found.ok()) return found.status();
  const Model& m = *found->model;
  if (m.version == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("model: ", Quote(model_name),
                     " has no published weights yet (upload, then PublishVersion)"));
  }
  if (m.version < min_version) {
    return absl::FailedPreconditionError(
        absl::StrCat("min_weight_version: model ", Quote(model_name), " is at weight version ",
                     m.version, ", the request requires at least ", min_version));
  }
  return LayerView{m.name, m.published[found->index], ToleranceOf(m, found->index), m.policy,
                   m.optimizers[found->index]};
}

absl::StatusOr<LayerSpec> Registry::FindLayer(absl::string_view model_name, absl::string_view layer,
                                              absl::string_view field) const {
  MutexLock lock(&mu_);
  absl::StatusOr<FoundLayer> found = FindLayerLocked(model_name, layer, field);
  if (!found.ok()) return found.status();
  return found->model->layers[found->index];
}

absl::Status Registry::CheckPublishable(const Model& model, const StagedMap& staged) const {
  if (staged.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("model: ", Quote(model.name), " has nothing staged to publish"));
  }
  for (size_t i = 0; i < model.layers.size(); ++i) {
    const LayerSpec& spec = model.layers[i];
    const bool has_weight = model.published[i] || staged.contains({spec.name, false});
    const bool has_bias = staged.contains({spec.name, true}) ||
                          (model.published[i] && !model.published[i]->bias().empty());
    if (!has_weight) {
      return absl::FailedPreconditionError(
          absl::StrCat("layer: ", Quote(spec.name), " has no weight staged or published"));
    }
    if (spec.bias && !has_bias) {
      return absl::FailedPreconditionError(absl::StrCat(
          "layer: ", Quote(spec.name), " is declared with a bias, but none is staged"));
    }
  }
  return absl::OkStatus();
}

uint64_t Registry::PublishLocked(Model& model) {
  const uint64_t version = model.version + 1;
  for (size_t i = 0; i < model.layers.size(); ++i) {
    const LayerSpec& spec = model.layers[i];
    auto w = model.staged.find({spec.name, false});
    auto b = model.staged.find({spec.name, true});
    if (w == model.staged.end() && b == model.staged.end()) continue;  // unchanged: keep copies
    std::shared_ptr<const LayerWeights> previous = model.published[i];
    auto weight = w != model.staged.end() ? w->second : nullptr;
    auto bias = b != model.staged.end() ? b->second : nullptr;
    if (!weight) weight = previous->weight_tensor();
    if (!bias && spec.bias) bias = previous->bias_tensor();
    model.published[i] = std::make_shared<const LayerWeights>(
        spec, version, weight, bias, copies_, prepare_,
        previous ? previous->CopiesInUse() : std::vector<CopyKey>{}, model.owner);
  }
  model.staged.clear();
  model.version = version;
  return version;
}

absl::StatusOr<uint64_t> Registry::Stage(
    absl::string_view model_name, std::vector<std::pair<StagedTensorKey, StoredTensor>> tensors,
    bool publish, uint64_t quota_bytes) {
  absl::StatusOr<std::shared_ptr<std::shared_mutex>> writer = Writer(model_name);
  if (!writer.ok()) return writer.status();
  std::unique_lock write(**writer);
  MutexLock lock(&mu_);
  auto it = models_.find(model_name);
  if (it == models_.end()) return ModelNotFound(model_name);
  if (it->second->writer != *writer) return ModelReplaced(model_name);
  Model& model = *it->second;
  StagedMap staged = model.staged;
  uint64_t added = 0, replaced = 0;
  for (auto& [key, tensor] : tensors) {
    if (!model.index.contains(key.layer)) {
      return absl::NotFoundError(
          absl::StrCat("layer: model ", Quote(model_name), " has no layer ", Quote(key.layer)));
    }
    if (auto old = staged.find(key); old != staged.end()) {
      replaced += old->second->reservation.bytes();
    }
    added += tensor.reservation.bytes();
    staged[key] = std::make_shared<const StoredTensor>(std::move(tensor));
  }
  if (quota_bytes > 0) {
    // Cached copies are not charged: a reader's forwards in many formats must
    // never lock the owner out of her own model (issue 32, item 3).
    const uint64_t held = OwnerChargedBytes(model.owner);
    const uint64_t after = held - std::min(held, replaced) + added;
    if (after > quota_bytes) {
      return absl::ResourceExhaustedError(
          absl::StrCat("--quota-weight-bytes: principal ", Quote(model.owner), " holds ", held,
                       " bytes of weights (FP32, staged and published; cached copies are not "
                       "charged); staging ",
                       added, " more would make ", after,
                       ", the limit is ", quota_bytes, "; nothing was staged"));
    }
  }
  // With publish, the tensors are staged only if the publish can happen too.
  if (publish) {
    if (absl::Status s = CheckPublishable(model, staged); !s.ok()) return s;
  }
  model.staged = std::move(staged);
  return publish ? PublishLocked(model) : 0;
}

absl::StatusOr<uint64_t> Registry::Publish(absl::string_view model_name) {
  absl::StatusOr<std::shared_ptr<std::shared_mutex>> writer = Writer(model_name);
  if (!writer.ok()) return writer.status();
  std::unique_lock write(**writer);
  MutexLock lock(&mu_);
  auto it = models_.find(model_name);
  if (it == models_.end()) return ModelNotFound(model_name);
  if (it->second->writer != *writer) return ModelReplaced(model_name);
  Model& model = *it->second;
  if (absl::Status s = CheckPublishable(model, model.staged); !s.ok()) return s;
  return PublishLocked(model);
}

ModelSummary Registry::Summarize(const Model& model) const {
  ModelSummary s;
  s.name = model.name;
  s.owner = model.owner;
  s.policy = model.policy;
  s.version = model.version;
  s.lease_seconds = model.lease_seconds;
  s.staged_tensors = model.staged.size();
  s.bytes = HeldBytes(model);
  s.quota_bytes = ChargedBytes(model);
  for (size_t i = 0; i < model.layers.size(); ++i) {
    ModelSummary::Layer layer{model.layers[i], {}, ToleranceOf(model, i)};
    if (const auto& weights = model.published[i]) layer.cached_formats = weights->CachedFormats();
    s.layers.push_back(std::move(layer));
  }
  return s;
}

uint64_t Registry::HeldBytes(const Model& model) const { return StoredBytes(model, true); }

uint64_t Registry::ChargedBytes(const Model& model) const { return StoredBytes(model, false); }

uint64_t Registry::OwnerChargedBytes(absl::string_view owner) const {
  uint64_t held = 0;
  for (const auto& [name, m] : models_) {
    if (m->owner == owner) held += ChargedBytes(*m);
  }
  return held;
}

uint64_t Registry::StoredBytes(const Model& model, bool with_copies) const {
  uint64_t bytes = 0;
  for (const auto& [key, tensor] : model.staged) bytes += tensor->reservation.bytes();
  for (const auto& weights : model.published) {
    if (weights) bytes += with_copies ? weights->Bytes() : weights->MasterBytes();
  }
  for (const auto& optimizer : model.optimizers) bytes += optimizer->Bytes();
  return bytes;
}

absl::Status Registry::CheckOwnerQuota(absl::string_view model_name, uint64_t more,
                                       uint64_t quota_bytes, absl::string_view field) const {
  if (quota_bytes == 0) return absl::OkStatus();
  MutexLock lock(&mu_);
  MX_ASSIGN_OR_RETURN(const Model* model, FindModel(model_name));
  const uint64_t held = OwnerChargedBytes(model->owner);
  if (held > quota_bytes || more > quota_bytes - held) {
    return absl::ResourceExhaustedError(absl::StrCat(
        field, ": --quota-weight-bytes: principal ", Quote(model->owner), " holds ", held,
        " bytes (FP32 masters, staged tensors and optimizer state); ", more,
        " more for the optimizer state of model ", Quote(model_name), " would pass the limit of ",
        quota_bytes));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<std::shared_mutex>> Registry::Writer(
    absl::string_view model_name) const {
  MutexLock lock(&mu_);
  absl::StatusOr<const Model*> model = FindModel(model_name);
  if (!model.ok()) return model.status();
  return (*model)->writer;
}

absl::StatusOr<OptimizerStepResult> Registry::StepOptimizer(absl::string_view model_name,
                                                            const OptimizerStep& request,
                                                            mx::kernels::ThreadPool* pool) {
  if (!request.discard) MX_RETURN_IF_ERROR(CheckAdamW(request.adamw, "adamw."));
  if (!std::isfinite(request.max_grad_norm)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_grad_norm: expected a finite number (<= 0: no clipping), got ", request.max_grad_norm));
  }
  if (!(request.other_grad_sq_norm >= 0) || std::isinf(request.other_grad_sq_norm)) {
    return absl::InvalidArgumentError(
        absl::StrCat("other_grad_sq_norm: expected a finite number >= 0, got ",
                     request.other_grad_sq_norm));
  }
  MX_ASSIGN_OR_RETURN(std::shared_ptr<std::shared_mutex> writer, Writer(model_name));
  std::unique_lock write(*writer);  // no upload publishes, no gradient arrives, until it is done
  // What to step: the published weights and optimizer of each layer with a
  // gradient. The writer lock keeps the published weights as they are now.
  struct Stepping {
    size_t index;
    std::shared_ptr<const LayerWeights> weights;
    std::shared_ptr<LayerOptimizer> optimizer;
  };
  std::vector<Stepping> layers;
  std::string owner;
  OptimizerStepResult result;
  {
    MutexLock lock(&mu_);
    MX_ASSIGN_OR_RETURN(const Model* model, FindModel(model_name));
    if (model->writer != writer) return ModelReplaced(model_name);
    if (model->version == 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "model: ", Quote(model_name), " has no published weights yet (upload, then publish)"));
    }
    owner = model->owner;
    result.version = model->version;  // unless a step publishes the next
    for (size_t i = 0; i < model->layers.size(); ++i) {
      layers.push_back({i, model->published[i], model->optimizers[i]});
    }
  }
  // Outside mu_: with the writer lock held no accumulation is in flight, so
  // these never wait, but they take each layer's own lock.
  std::erase_if(layers, [](const Stepping& layer) { return !layer.optimizer->HasGradient(); });
  // A layer per task: the norms, then (with the coefficient they give) the steps.
  auto each_layer = [&](absl::FunctionRef<void(int64_t)> fn) {
    if (pool != nullptr) return pool->ParallelFor(static_cast<int64_t>(layers.size()), fn);
    for (size_t i = 0; i < layers.size(); ++i) fn(static_cast<int64_t>(i));
  };
  std::vector<double> norms(layers.size());
  each_layer([&](int64_t task) {
    const size_t i = static_cast<size_t>(task);
    norms[i] = layers[i].optimizer->GradSquaredNorm();
  });
  double squared = request.other_grad_sq_norm;
  for (size_t i = 0; i < layers.size(); ++i) {
    result.grad_sq_norms.emplace_back(layers[i].weights->spec().name, norms[i]);
    squared += norms[i];
  }
  result.total_grad_norm = std::sqrt(squared);
  result.clip_coefficient = ClipCoefficient(squared, request.max_grad_norm);
  if (request.discard) {
    for (const Stepping& layer : layers) layer.optimizer->DiscardGradient();
    return result;  // nothing stepped or published
  }
  // No gradient: as torch steps no parameter without one, no new version.
  if (layers.empty()) return result;
  if (request.quota_bytes > 0) {
    uint64_t more = 0;
    for (const Stepping& layer : layers) {
      if (!layer.optimizer->HasMoments()) more += layer.optimizer->MomentBytes();
    }
    if (more > 0) {
      MX_RETURN_IF_ERROR(CheckOwnerQuota(model_name, more, request.quota_bytes, "adamw"));
    }
  }
  // Everything the step needs, reserved before anything changes.
  std::vector<StoredTensor> weights(layers.size()), biases(layers.size());
  for (size_t i = 0; i < layers.size(); ++i) {
    const LayerWeights& w = *layers[i].weights;
    MX_RETURN_IF_ERROR(layers[i].optimizer->ReserveMoments());
    MX_RETURN_IF_ERROR(ReserveInto(*budget_, w.weight().size() * sizeof(float),
                                   absl::StrCat("the stepped weight of layer ", Quote(w.spec().name)),
                                   weights[i].reservation, owner));
    if (w.spec().bias) {
      MX_RETURN_IF_ERROR(ReserveInto(*budget_, w.bias().size() * sizeof(float),
                                     absl::StrCat("the stepped bias of layer ", Quote(w.spec().name)),
                                     biases[i].reservation, owner));
    }
  }
  std::vector<absl::Status> failed(layers.size());
  each_layer([&](int64_t task) {
    const size_t i = static_cast<size_t>(task);
    const LayerWeights& w = *layers[i].weights;
    absl::StatusOr<LayerOptimizer::Stepped> stepped =
        layers[i].optimizer->Step(w.weight(), w.bias(), result.clip_coefficient, request.adamw);
    if (!stepped.ok()) {
      failed[i] = stepped.status();  // cannot happen: gradient and moments were checked
      return;
    }
    weights[i].values = std::move(stepped->weight);
    biases[i].values = std::move(stepped->bias);
  });
  for (const absl::Status& status : failed) MX_RETURN_IF_ERROR(status);
  MutexLock lock(&mu_);
  auto it = models_.find(model_name);
  if (it == models_.end()) return ModelNotFound(model_name);  // deleted meanwhile: nothing to keep
  if (it->second->writer != writer) return ModelReplaced(model_name);
  Model& model = *it->second;
  const uint64_t version = model.version + 1;
  for (size_t i = 0; i < layers.size(); ++i) {
    const size_t index = layers[i].index;
    const LayerWeights& previous = *model.published[index];
    std::shared_ptr<const StoredTensor> bias;
    if (previous.spec().bias) bias = std::make_shared<const StoredTensor>(std::move(biases[i]));
    model.published[index] = std::make_shared<const LayerWeights>(
        previous.spec(), version, std::make_shared<const StoredTensor>(std::move(weights[i])),
        std::move(bias), copies_, prepare_, previous.CopiesInUse(), model.owner);
  }
  model.version = version;
  result.version = version;
  result.published = true;
  return result;
}

absl::StatusOr<ModelSummary> Registry::Describe(absl::string_view model_name) const {
  MutexLock lock(&mu_);
  absl::StatusOr<const Model*> model = FindModel(model_name);
  if (!model.ok()) return model.status();
  return Summarize(**model);
}

void Registry::List(absl::string_view after,
                    const std::function<bool(const ModelSummary&)>& take) const {
  MutexLock lock(&mu_);
  for (auto it = models_.upper_bound(after); it != models_.end(); ++it) {
    if (!take(Summarize(*it->second))) return;
  }
}

absl::StatusOr<uint64_t> Registry::Delete(absl::string_view model_name) {
  std::unique_ptr<Model> doomed;
  uint64_t bytes = 0;
  {
    MutexLock lock(&mu_);
    auto it = models_.find(model_name);
    if (it == models_.end()) return ModelNotFound(model_name);
    bytes = HeldBytes(*it->second);
    doomed = std::move(it->second);
    models_.erase(it);
  }
  return bytes;  // `doomed` frees outside the lock; readers still holding layers keep theirs
}

std::vector<std::pair<std::string, uint64_t>> Registry::DeleteExpired(
    std::chrono::steady_clock::time_point now) {
  std::vector<std::pair<std::string, uint64_t>> deleted;
  std::vector<std::unique_ptr<Model>> doomed;
  {
    MutexLock lock(&mu_);
    for (auto it = models_.begin(); it != models_.end();) {
      const Model& model = *it->second;
      if (model.lease_seconds > 0 &&
          now - model.last_used >= std::chrono::duration<double>(model.lease_seconds)) {
        deleted.emplace_back(model.name, HeldBytes(model));
        doomed.push_back(std::move(it->second));
        it = models_.erase(it);
      } else {
        ++it;
      }
    }
  }
  return deleted;  // `doomed` frees outside the lock, as in Delete
}

absl::StatusOr<std::string> Registry::SetPolicy(absl::string_view model_name,
                                                const std::string& policy) {
  MutexLock lock(&mu_);
  auto it = models_.find(model_name);
  if (it == models_.end()) return ModelNotFound(model_name);
  return std::exchange(it->second->policy, policy);
}

absl::Status Registry::SetToleranceOrder(absl::string_view model_name,
                                         const std::vector<std::string>& measured) {
  MutexLock lock(&mu_);
  auto it = models_.find(model_name);
  if (it == models_.end()) return ModelNotFound(model_name);
  Model& model = *it->second;
  std::vector<std::string> names;
  names.reserve(model.layers.size());
  for (const LayerSpec& spec : model.layers) names.push_back(spec.name);
  model.tolerance_rank = ToleranceRanks(names, measured);
  return absl::OkStatus();
}

bool Registry::PolicyInUse(absl::string_view policy) const {
  MutexLock lock(&mu_);
  for (const auto& [name, model] : models_) {
    if (model->policy == policy) return true;
  }
  return false;
}

bool Registry::ReleasePolicy(absl::string_view policy, absl::string_view owner,
                             const std::string& fallback, std::vector<std::string>& reset) {
  MutexLock lock(&mu_);
  for (const auto& [name, model] : models_) {
    if (model->policy == policy && (owner.empty() || model->owner == owner)) return false;
  }
  for (const auto& [name, model] : models_) {
    if (model->policy == policy) {
      model->policy = fallback;
      reset.push_back(name);
    }
  }
  return true;
}

absl::StatusOr<std::vector<LayerView>> Registry::PublishedLayers(
    absl::string_view model_name) const {
  MutexLock lock(&mu_);
  absl::StatusOr<const Model*> model = FindModel(model_name);
  if (!model.ok()) return model.status();
  std::vector<LayerView> out;
  const Model& m = **model;
  for (size_t i = 0; i < m.layers.size(); ++i) {
    if (m.published[i]) {
      out.push_back({m.name, m.published[i], ToleranceOf(m, i), m.policy, m.optimizers[i]});
    }
  }
  return out;
}

size_t Registry::model_count() const {
  MutexLock lock(&mu_);
  return models_.size();
}

}  // namespace mxserve
