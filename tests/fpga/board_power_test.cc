// Board power as XRT reports it (xrt::info::device::electrical), parsed without
// XRT: the fpga backend's sampler feeds these watts to the "fpga" energy source.
#include "fpga/host/board_power.h"

#include <gtest/gtest.h>

namespace {

TEST(BoardPower, ReadsXrtsElectricalReport) {
  // The shape XRT prints: numbers as strings, beside rails and limits.
  EXPECT_EQ(fpga::ParseBoardPowerWatts(
                R"({"power_rails": [], "power_consumption_max_watts": "225",
                    "power_consumption_watts": "23.456", "power_consumption_warning": "false"})"),
            23.456);
  EXPECT_EQ(fpga::ParseBoardPowerWatts(R"({"power_consumption_watts": 41.5})"), 41.5);
}

TEST(BoardPower, NoSensorNoSample) {
  EXPECT_EQ(fpga::ParseBoardPowerWatts("{}"), std::nullopt);  // no xclbin loaded
  EXPECT_EQ(fpga::ParseBoardPowerWatts(R"({"power_consumption_watts": "N/A"})"), std::nullopt);
  EXPECT_EQ(fpga::ParseBoardPowerWatts(R"({"power_consumption_watts": "-1"})"), std::nullopt);
  EXPECT_EQ(fpga::ParseBoardPowerWatts(R"({"power_consumption_watts": "12W"})"), std::nullopt);
  EXPECT_EQ(fpga::ParseBoardPowerWatts("not json"), std::nullopt);
}

}  // namespace
