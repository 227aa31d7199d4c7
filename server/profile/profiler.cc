#include "server/profile/profiler.h"

#include <chrono>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "mx/kernels/quantize_fast.h"
#include "mx/status_macros.h"
#include "server/base/quote.h"
#include "server/telemetry/clock.h"

namespace mxserve {

namespace {

// rel_error = sqrt(error / reference) and its SQNR; +inf where nothing is left
// to compare against or nothing was lost.
void FillQuality(double error, double reference, FormatScore& score) {
  score.rel_error = reference > 0 ? std::sqrt(error / reference) : (error > 0 ? HUGE_VAL : 0.0);
  score.sqnr_db = score.rel_error > 0 ? -20.0 * std::log10(score.rel_error) : HUGE_VAL;
}

}  // namespace

absl::Status CheckFinite(std::span<const float> values, absl::string_view field) {
  for (size_t i = 0; i < values.size(); ++i) {
    if (!std::isfinite(values[i])) {
      return absl::InvalidArgumentError(absl::StrCat(field, ": element ", i, " is ",
                                                     std::isnan(values[i]) ? "NaN" : "infinite",
                                                     "; calibration data must be finite"));
    }
  }
  return absl::OkStatus();
}

// Sums over every batch of one layer, per format (double: millions of terms).
struct ProfileBuilder::Totals {
  uint64_t tokens = 0;
  uint64_t batches = 0;
  uint64_t batches_with_gradients = 0;
  double reference_energy = 0;       // Σ Y²
  std::vector<double> error_energy;  // Σ (Y_F − Y)², per format
  std::vector<double> fisher;        // Σ (dL/dY)² (Y_F − Y)², per format
};

// One layer's weight in every candidate format (and FP32 for the reference),
// packed for the kernels, and the budget's share for them.
struct ProfileBuilder::WeightCache {
  int layer = -1;
  std::vector<mx::kernels::PackedWeight> packed;       // per format
  std::optional<mx::kernels::PackedWeight> reference;  // FP32
  Reservation reservation;
};

ProfileBuilder::ProfileBuilder(std::string model, uint64_t version,
                               std::vector<std::shared_ptr<const LayerWeights>> layers,
                               Options options, const fpga_model::EnergyModelParams& energy,
                               mx::kernels::ThreadPool* pool, MemoryBudget* budget)
    : model_(std::move(model)),
      version_(version),
      layers_(std::move(layers)),
      options_(std::move(options)),
      energy_(energy),
      pool_(pool),
      budget_(budget),
      totals_(layers_.size()),
      weights_(std::make_unique<WeightCache>()) {
  for (Totals& t : totals_) {
    t.error_energy.assign(options_.formats.size(), 0.0);
    t.fisher.assign(options_.formats.size(), 0.0);
  }
}

ProfileBuilder::~ProfileBuilder() = default;

int ProfileBuilder::LayerIndex(absl::string_view name) const {
  for (size_t i = 0; i < layers_.size(); ++i) {
    if (layers_[i]->spec().name == name) return static_cast<int>(i);
  }
  return -1;
}

const LayerSpec& ProfileBuilder::spec(int layer) const { return layers_[layer]->spec(); }
size_t ProfileBuilder::layer_count() const { return layers_.size(); }

absl::Status ProfileBuilder::LoadWeights(int layer) {
  if (weights_->layer == layer) return absl::OkStatus();
  weights_ = std::make_unique<WeightCache>();  // frees the last layer's first
  const LayerWeights& w = *layers_[layer];
  const int64_t n = w.spec().out_features, k = w.spec().in_features;
  auto cache = std::make_unique<WeightCache>();
  uint64_t bytes = 0;
  for (mx::Format format : options_.formats) {
    MX_ASSIGN_OR_RETURN(
        mx::QuantizedMatrix q,
        mx::kernels::QuantizeRows(w.weight(), n, k, format, {}, mx::kernels::DefaultIsa(), pool_));
    MX_ASSIGN_OR_RETURN(mx::kernels::PackedWeight packed, mx::kernels::PackedWeight::Pack(q));
    bytes += packed.bytes();
    cache->packed.push_back(std::move(packed));
  }
  if (options_.reference == Reference::kFp32) {
    MX_ASSIGN_OR_RETURN(mx::QuantizedMatrix q,
                        mx::kernels::QuantizeRows(w.weight(), n, k, mx::Format::kFp32, {},
                                                  mx::kernels::DefaultIsa(), pool_));
    MX_ASSIGN_OR_RETURN(cache->reference, mx::kernels::PackedWeight::Pack(q));
    bytes += cache->reference->bytes();
  }
  MX_RETURN_IF_ERROR(ReserveInto(
      *budget_, bytes, absl::StrCat("the quantized copies of layer ", Quote(w.spec().name)),
      cache->reservation));
  cache->layer = layer;
  weights_ = std::move(cache);
  return absl::OkStatus();
}

void ProfileBuilder::Reference64(int layer, std::span<const float> x, int64_t rows,
                                 std::span<double> y) const {
  const LayerWeights& w = *layers_[layer];
  const int64_t n = w.spec().out_features, k = w.spec().in_features;
  const std::vector<float>& weight = w.weight();
  const std::span<const float> bias = w.bias();
  pool_->ParallelFor(rows, [&](int64_t m) {
    const float* xr = x.data() + m * k;
    for (int64_t j = 0; j < n; ++j) {
      const float* wr = weight.data() + j * k;
      // Four partial sums: FP64 products of FP32 values are exact, so this is
      // exact to FP64 rounding of the sums, whatever their order.
      double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
      int64_t i = 0;
      for (; i + 4 <= k; i += 4) {
        s0 += double{xr[i]} * wr[i];
        s1 += double{xr[i + 1]} * wr[i + 1];
        s2 += double{xr[i + 2]} * wr[i + 2];
        s3 += double{xr[i + 3]} * wr[i + 3];
      }
      for (; i < k; ++i) s0 += double{xr[i]} * wr[i];
      y[m * n + j] = (s0 + s1) + (s2 + s3) + (bias.empty() ? 0.0 : bias[j]);
    }
  });
}

absl::Status ProfileBuilder::AddBatch(int layer, std::span<const float> x, int64_t rows,
                                      std::span<const float> dy) {
  const auto start = std::chrono::steady_clock::now();
  const LayerWeights& w = *layers_[layer];
  const int64_t n = w.spec().out_features, k = w.spec().in_features;
  const size_t outputs = static_cast<size_t>(rows) * static_cast<size_t>(n);
  // Working memory: the reference and one format's outputs, and X in one format.
  Reservation scratch;
  MX_RETURN_IF_ERROR(ReserveInto(
      *budget_,
      outputs * (sizeof(double) + sizeof(float)) + static_cast<uint64_t>(rows) * k * sizeof(float),
      absl::StrCat("profiling a batch of layer ", Quote(w.spec().name)), scratch));
  MX_RETURN_IF_ERROR(LoadWeights(layer));

  std::vector<double> reference(outputs);
  std::vector<float> y(outputs);
  if (options_.reference == Reference::kFp64) {
    Reference64(layer, x, rows, reference);
  } else {
    MX_ASSIGN_OR_RETURN(mx::QuantizedMatrix xq,
                        mx::kernels::QuantizeRows(x, rows, k, mx::Format::kFp32, {},
                                                  mx::kernels::DefaultIsa(), pool_));
    MX_RETURN_IF_ERROR(
        mx::kernels::Linear(xq, *weights_->reference, w.bias(), y, {.pool = pool_}).status());
    for (size_t i = 0; i < outputs; ++i) reference[i] = y[i];
  }

  // Summed here first, added to the layer's totals only when every format's sums
  // are finite: a batch that overflows a format (finite but huge inputs, 3e38 in
  // FP16) is refused whole and leaves the profile as it was (issue 32, item 8).
  double reference_energy = 0;
  for (size_t i = 0; i < outputs; ++i) reference_energy += reference[i] * reference[i];
  std::vector<double> errors(options_.formats.size()), fishers(options_.formats.size());
  for (size_t f = 0; f < options_.formats.size(); ++f) {
    MX_ASSIGN_OR_RETURN(mx::QuantizedMatrix xq,
                        mx::kernels::QuantizeRows(x, rows, k, options_.formats[f], {},
                                                  mx::kernels::DefaultIsa(), pool_));
    MX_RETURN_IF_ERROR(
        mx::kernels::Linear(xq, weights_->packed[f], w.bias(), y, {.pool = pool_}).status());
    double error = 0, fisher = 0;
    for (size_t i = 0; i < outputs; ++i) {
      const double d = double{y[i]} - reference[i];
      error += d * d;
      if (!dy.empty()) fisher += double{dy[i]} * dy[i] * d * d;
    }
    if (!std::isfinite(error) || !std::isfinite(fisher) || !std::isfinite(reference_energy)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "inputs: layer ", Quote(w.spec().name), " in ", mx::FormatName(options_.formats[f]),
          " gives non-finite outputs or errors for this batch (values too large for the "
          "format or FP32); scale the calibration data down"));
    }
    errors[f] = error;
    fishers[f] = fisher;
  }
  Totals& totals = totals_[layer];
  totals.reference_energy += reference_energy;
  for (size_t f = 0; f < options_.formats.size(); ++f) {
    totals.error_energy[f] += errors[f];
    totals.fisher[f] += fishers[f];
  }
  totals.tokens += static_cast<uint64_t>(rows);
  ++totals.batches;
  if (!dy.empty()) ++totals.batches_with_gradients;
  ++batches_;
  compute_seconds_ +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return absl::OkStatus();
}

absl::StatusOr<std::vector<FormatScore>> ProfileBuilder::WeightOnlyScores(int layer) {
  const LayerWeights& w = *layers_[layer];
  const int64_t n = w.spec().out_features, k = w.spec().in_features;
  const std::vector<float>& weight = w.weight();
  double energy = 0;
  for (float v : weight) energy += double{v} * v;
  std::vector<FormatScore> scores;
  for (mx::Format format : options_.formats) {
    MX_ASSIGN_OR_RETURN(
        mx::QuantizedMatrix q,
        mx::kernels::QuantizeRows(weight, n, k, format, {}, mx::kernels::DefaultIsa(), pool_));
    const std::vector<float> back = mx::Dequantize(q);
    double error = 0;
    for (size_t i = 0; i < weight.size(); ++i) {
      const double d = double{back[i]} - weight[i];
      error += d * d;
    }
    FormatScore score;
    score.format = format;
    FillQuality(error, energy, score);
    scores.push_back(score);
  }
  return scores;
}

absl::StatusOr<Profile> ProfileBuilder::Finish() {
  const auto start = std::chrono::steady_clock::now();
  weights_ = std::make_unique<WeightCache>();
  if (batches_ > 0) {
    std::vector<std::string> missing;
    for (size_t i = 0; i < layers_.size(); ++i) {
      if (totals_[i].batches == 0) missing.push_back(Quote(layers_[i]->spec().name));
    }
    if (!missing.empty()) {
      const size_t shown = std::min<size_t>(missing.size(), 8);
      return absl::FailedPreconditionError(absl::StrCat(
          "batches: ", missing.size(), " of ", layers_.size(),
          " profiled layers got no calibration data: ",
          absl::StrJoin(missing.begin(), missing.begin() + shown, ", "),
          missing.size() > shown ? ", ..." : "",
          "; send a batch for every layer, or name the layers to profile in config.layers"));
    }
  }
  Profile profile;
  profile.model = model_;
  profile.weight_version = version_;
  profile.reference = options_.reference;
  profile.batch_tokens = options_.batch_tokens;
  profile.formats = options_.formats;
  bool gradients = batches_ > 0;
  for (size_t i = 0; i < layers_.size(); ++i) {
    const LayerSpec& spec = layers_[i]->spec();
    const Totals& totals = totals_[i];
    LayerProfile layer{.layer = spec.name,
                       .out_features = spec.out_features,
                       .in_features = spec.in_features,
                       .tokens = totals.tokens,
                       .scores = {}};
    const bool has_fisher = totals.batches > 0 && totals.batches_with_gradients == totals.batches;
    gradients = gradients && has_fisher;
    if (batches_ == 0) {
      MX_ASSIGN_OR_RETURN(layer.scores, WeightOnlyScores(static_cast<int>(i)));
    } else {
      for (size_t f = 0; f < options_.formats.size(); ++f) {
        FormatScore score;
        score.format = options_.formats[f];
        FillQuality(totals.error_energy[f], totals.reference_energy, score);
        score.has_fisher = has_fisher;
        score.fisher = has_fisher ? totals.fisher[f] : 0.0;
        layer.scores.push_back(score);
      }
    }
    for (FormatScore& s : layer.scores) {
      s.cost =
          CostOf(energy_, s.format, spec.out_features, spec.in_features, options_.batch_tokens);
    }
    profile.tokens += totals.tokens;
    profile.layers.push_back(std::move(layer));
  }
  profile.source = batches_ == 0 ? ProfileSource::kWeights
                   : gradients   ? ProfileSource::kGradients
                                 : ProfileSource::kActivations;
  profile.created_unix_seconds = UnixSeconds();
  profile.compute_seconds =
      compute_seconds_ +
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return profile;
}

}  // namespace mxserve
