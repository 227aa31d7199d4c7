#include "fpga/host/board_power.h"

#include <cstdlib>
#include <nlohmann/json.hpp>

namespace fpga {

std::optional<double> ParseBoardPowerWatts(const std::string& electrical_json) {
  const nlohmann::json report = nlohmann::json::parse(electrical_json, nullptr, false);
  if (report.is_discarded() || !report.is_object()) return std::nullopt;
  const auto it = report.find("power_consumption_watts");
  if (it == report.end()) return std::nullopt;
  // XRT writes numbers as strings ("23.456"), and "N/A" when the board has no sensor.
  if (it->is_number()) return it->get<double>();
  if (!it->is_string()) return std::nullopt;
  const std::string text = it->get<std::string>();
  char* end = nullptr;
  const double watts = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || *end != '\0' || !(watts >= 0)) return std::nullopt;
  return watts;
}

}  // namespace fpga
