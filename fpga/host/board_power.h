// Board power out of XRT's electrical report (xrt::info::device::electrical),
// parsed without XRT so it is tested on any machine.
#pragma once

#include <optional>
#include <string>

namespace fpga {

// "power_consumption_watts" of the report's JSON; nullopt when absent or not a
// non-negative number (XRT writes "N/A" for a board without the sensor).
std::optional<double> ParseBoardPowerWatts(const std::string& electrical_json);

}  // namespace fpga
