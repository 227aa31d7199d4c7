#include "server/profile/profile.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>

#include "absl/strings/str_cat.h"
#include "mx/packed.h"

namespace mxserve {

std::vector<mx::Format> DefaultProfileFormats() {
  std::vector<mx::Format> formats;
  for (const mx::FormatTraits& t : mx::AllFormats()) {
    if (t.format != mx::Format::kFp32) formats.push_back(t.format);
  }
  return formats;
}

int Profile::FormatIndex(mx::Format format) const {
  auto it = std::find(formats.begin(), formats.end(), format);
  return it == formats.end() ? -1 : static_cast<int>(it - formats.begin());
}

LayerCost CostOf(const fpga_model::EnergyModelParams& params, mx::Format format,
                 int64_t out_features, int64_t in_features, int64_t batch_tokens) {
  const int64_t m = batch_tokens, n = out_features, k = in_features;
  const fpga_model::GemmEstimate forward =
      fpga_model::EstimateGemm(params, format, format, m, n, k);
  // grad_input = dY·W (M×K, reduced over N); grad_weight = dYᵀ·X (N×K, reduced over M).
  const fpga_model::GemmEstimate grad_input =
      fpga_model::EstimateGemm(params, format, format, m, k, n);
  const fpga_model::GemmEstimate grad_weight =
      fpga_model::EstimateGemm(params, format, format, n, k, m);
  const double tokens = static_cast<double>(m);
  LayerCost cost;
  cost.seconds_per_token = forward.seconds / tokens;
  cost.joules_per_token = forward.joules / tokens;
  cost.train_seconds_per_token =
      (forward.seconds + grad_input.seconds + grad_weight.seconds) / tokens;
  cost.train_joules_per_token = (forward.joules + grad_input.joules + grad_weight.joules) / tokens;
  const std::optional<mx::LayoutSize> size = mx::CheckedLayoutSize(format, n, k);
  cost.weight_bits = size ? 8.0 * static_cast<double>(size->total_bytes()) : HUGE_VAL;
  return cost;
}

const char* SourceName(ProfileSource source) {
  switch (source) {
    case ProfileSource::kWeights:
      return "weights";
    case ProfileSource::kActivations:
      return "activations";
    case ProfileSource::kGradients:
      return "gradients";
  }
  return "?";
}

const char* ReferenceName(Reference reference) {
  return reference == Reference::kFp64 ? "fp64" : "fp32";
}

namespace {

// Shortest text that reads back as the same double ("inf" for +inf).
std::string Number(double v) {
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char text[32];
  for (int precision = 6;; ++precision) {  // 17 digits always read back
    std::snprintf(text, sizeof(text), "%.*g", precision, v);
    if (precision == 17 || std::strtod(text, nullptr) == v) return text;
  }
}

// A CSV field: quoted when it holds a comma, quote or line break.
std::string Field(const std::string& text) {
  if (text.find_first_of(",\"\r\n") == std::string::npos) return text;
  std::string out = "\"";
  for (char c : text) {
    if (c == '"') out.push_back('"');
    out.push_back(c);
  }
  out.push_back('"');
  return out;
}

}  // namespace

std::string ProfileToCsv(const Profile& profile) {
  std::string csv = absl::StrCat(kProfileCsvHeader, "\n");
  for (const LayerProfile& layer : profile.layers) {
    for (const FormatScore& s : layer.scores) {
      absl::StrAppend(
          &csv, Field(layer.layer), ",", mx::FormatName(s.format), ",", layer.out_features, ",",
          layer.in_features, ",", layer.tokens, ",", Number(s.rel_error), ",", Number(s.sqnr_db),
          ",", s.has_fisher ? Number(s.fisher) : "", ",", Number(s.cost.seconds_per_token), ",",
          Number(s.cost.joules_per_token), ",", Number(s.cost.train_seconds_per_token), ",",
          Number(s.cost.train_joules_per_token), ",", Number(s.cost.weight_bits), "\n");
    }
  }
  return csv;
}

}  // namespace mxserve
