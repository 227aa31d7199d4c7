// The FPGA cycle and energy model: the shipped parameter file loads, estimates
// match hand-computed figures, and bad documents name the field.
#include "fpga/model/energy_model.h"

#include <gtest/gtest.h>

namespace {

fpga_model::EnergyModelParams Shipped() {
  return fpga_model::LoadEnergyModel(MXSERVE_SOURCE_DIR "/fpga/model/energy_model.json").value();
}

TEST(EnergyModel, ShippedParametersLoad) {
  const fpga_model::EnergyModelParams p = Shipped();
  EXPECT_EQ(p.clock_hz, 3e8);
  EXPECT_EQ(p.pe_rows * p.pe_cols, 1024);
  EXPECT_EQ(p.macs_per_pe_cycle[static_cast<size_t>(mx::Format::kMxfp4E2m1)], 4.0);
  EXPECT_EQ(p.energy_per_mac_pj[static_cast<size_t>(mx::Format::kFp32)], 15.0);
}

// Decode step through Qwen2.5-0.5B's up projection in MXFP4: compute-bound.
// macs 34,865,152 → 8,512 cycles at 4 MAC/PE/cycle → 28.37 µs; bytes: X 8·476,
// W 4864·476 (28 blocks of 16 bytes + 28 scales per row), Y 8·4864·4.
TEST(EnergyModel, ComputeBoundEstimateMatchesHandFigures) {
  const auto e = fpga_model::EstimateGemm(Shipped(), mx::Format::kMxfp4E2m1, mx::Format::kMxfp4E2m1,
                                          8, 4864, 896);
  EXPECT_EQ(e.macs, 34865152.0);
  EXPECT_EQ(e.bytes, 2474720.0);
  EXPECT_NEAR(e.seconds, 2.8373333333333333e-05, 1e-15);
  EXPECT_NEAR(e.joules, 0.0008214097493333334, 1e-12);
}

// One token through a 896×896 FP16 layer: the weight transfer dominates.
TEST(EnergyModel, MemoryBoundEstimateUsesTransferTime) {
  const auto e =
      fpga_model::EstimateGemm(Shipped(), mx::Format::kFp16, mx::Format::kFp16, 1, 896, 896);
  EXPECT_EQ(e.bytes, 1611008.0);
  EXPECT_NEAR(e.seconds, 3.50219130434782e-06, 1e-15);
  EXPECT_NEAR(e.joules, 0.00014183231220869563, 1e-12);
}

TEST(EnergyModel, MixedPairsRunAtTheSlowerFormat) {
  const auto p = Shipped();
  const auto mixed =
      fpga_model::EstimateGemm(p, mx::Format::kMxfp4E2m1, mx::Format::kMxfp8E4m3, 512, 896, 896);
  const auto fp8 =
      fpga_model::EstimateGemm(p, mx::Format::kMxfp8E4m3, mx::Format::kMxfp8E4m3, 512, 896, 896);
  EXPECT_EQ(mixed.seconds, fp8.seconds);  // compute-bound at M = 512
  EXPECT_LT(mixed.bytes, fp8.bytes);
}

TEST(EnergyModel, BadDocumentsNameTheField) {
  EXPECT_EQ(fpga_model::ParseEnergyModel("[1]").status().message(),
            "energy_model: not a JSON object");
  EXPECT_EQ(fpga_model::ParseEnergyModel(R"({"clock_hz": 1})").status().message(),
            "energy_model.pe_rows: missing");
  EXPECT_EQ(fpga_model::ParseEnergyModel(R"({"clock_hz": -5})").status().message(),
            "energy_model.clock_hz: expected a positive number");
  const std::string base = R"({"clock_hz": 1, "pe_rows": 1, "pe_cols": 1,
      "hbm_bytes_per_second": 1, "energy_per_byte_pj": 1, "static_power_watts": 1,)";
  EXPECT_EQ(
      fpga_model::ParseEnergyModel(base + R"("macs_per_pe_cycle": {"FP7": 1}})").status().message(),
      "energy_model.macs_per_pe_cycle.FP7: unknown format");
  EXPECT_EQ(fpga_model::ParseEnergyModel(base + R"("macs_per_pe_cycle": {"FP16": 1}})")
                .status()
                .message(),
            "energy_model.macs_per_pe_cycle.MXFP8_E4M3: missing");
  EXPECT_EQ(fpga_model::LoadEnergyModel("/nonexistent.json").status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
