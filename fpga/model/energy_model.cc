#include "fpga/model/energy_model.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "mx/packed.h"
#include "mx/read_file.h"

namespace fpga_model {
namespace {

using Json = nlohmann::json;

absl::Status FieldError(absl::string_view field, absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat("energy_model.", field, ": ", problem));
}

absl::StatusOr<double> PositiveNumber(const Json& object, const std::string& key,
                                      const std::string& field) {
  const auto it = object.find(key);
  if (it == object.end()) return FieldError(field, "missing");
  if (!it->is_number() || !std::isfinite(it->get<double>()) || it->get<double>() <= 0) {
    return FieldError(field, "expected a positive number");
  }
  return it->get<double>();
}

absl::Status PerFormat(const Json& json, const std::string& key,
                       std::array<double, mx::kFormatCount>& out) {
  const auto it = json.find(key);
  if (it == json.end() || !it->is_object())
    return FieldError(key, "expected an object of format: number");
  for (const auto& [name, value] : it->items()) {
    if (!mx::ParseFormat(name).ok()) return FieldError(key + "." + name, "unknown format");
  }
  for (const mx::FormatTraits& t : mx::AllFormats()) {
    const std::string name(t.name);
    absl::StatusOr<double> v = PositiveNumber(*it, name, key + "." + name);
    if (!v.ok()) return v.status();
    out[static_cast<size_t>(t.format)] = *v;
  }
  return absl::OkStatus();
}

// Bytes a matrix of rows × k takes in the packed layout, scales included.
double PackedBytes(mx::Format format, int64_t rows, int64_t k) {
  double bytes = static_cast<double>(rows) * static_cast<double>(mx::RowBytes(format, k));
  if (mx::IsBlockScaled(format))
    bytes += static_cast<double>(rows) * static_cast<double>(mx::ScaleBytesPerRow(format, k));
  if (mx::HasRowScales(format)) bytes += 4.0 * static_cast<double>(rows);
  return bytes;
}

}  // namespace

absl::StatusOr<EnergyModelParams> ParseEnergyModel(absl::string_view text) {
  const Json json = Json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object()) {
    return absl::InvalidArgumentError("energy_model: not a JSON object");
  }
  EnergyModelParams p;
  const auto number = [&](const char* key, double& out) -> absl::Status {
    absl::StatusOr<double> v = PositiveNumber(json, key, key);
    if (!v.ok()) return v.status();
    out = *v;
    return absl::OkStatus();
  };
  double rows = 0, cols = 0;
  for (absl::Status s :
       {number("clock_hz", p.clock_hz), number("pe_rows", rows), number("pe_cols", cols),
        number("hbm_bytes_per_second", p.hbm_bytes_per_second),
        number("energy_per_byte_pj", p.energy_per_byte_pj),
        number("static_power_watts", p.static_power_watts),
        PerFormat(json, "macs_per_pe_cycle", p.macs_per_pe_cycle),
        PerFormat(json, "energy_per_mac_pj", p.energy_per_mac_pj)}) {
    if (!s.ok()) return s;
  }
  p.pe_rows = static_cast<int>(rows);
  p.pe_cols = static_cast<int>(cols);
  return p;
}

absl::StatusOr<EnergyModelParams> LoadEnergyModel(const std::string& path) {
  absl::StatusOr<std::string> text = mx::ReadWholeFile(path);
  if (!text.ok()) return text.status();
  absl::StatusOr<EnergyModelParams> params = ParseEnergyModel(*text);
  if (!params.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", params.status().message()));
  }
  return params;
}

GemmEstimate EstimateGemm(const EnergyModelParams& p, mx::Format x, mx::Format w, int64_t m,
                          int64_t n, int64_t k) {
  const size_t ix = static_cast<size_t>(x), iw = static_cast<size_t>(w);
  const double rate = std::min(p.macs_per_pe_cycle[ix], p.macs_per_pe_cycle[iw]);
  const double mac_pj = std::max(p.energy_per_mac_pj[ix], p.energy_per_mac_pj[iw]);
  const auto ceil_div = [](int64_t a, int64_t b) { return static_cast<double>((a + b - 1) / b); };
  const double w_tiles = ceil_div(n, p.pe_cols);
  GemmEstimate e;
  e.macs = static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  e.cycles = ceil_div(m, p.pe_rows) * w_tiles * ceil_div(k, mx::kBlockSize) * mx::kBlockSize / rate;
  e.bytes = PackedBytes(w, n, k) + PackedBytes(x, m, k) * w_tiles + 4.0 * static_cast<double>(m) * n;
  e.seconds = std::max(e.cycles / p.clock_hz, e.bytes / p.hbm_bytes_per_second);
  e.joules =
      (e.macs * mac_pj + e.bytes * p.energy_per_byte_pj) * 1e-12 + p.static_power_watts * e.seconds;
  return e;
}

}  // namespace fpga_model
