// The FPGA cycle and energy model: the shipped parameter file loads, estimates
// match hand-computed figures, and bad documents name the field.
#include "fpga/model/energy_model.h"

#include <gtest/gtest.h>

#include "fpga/hls/mx_gemm.h"

namespace {

fpga_model::EnergyModelParams Shipped() {
  return fpga_model::LoadEnergyModel(MXSERVE_SOURCE_DIR "/fpga/model/energy_model.json").value();
}

TEST(EnergyModel, ShippedParametersLoad) {
  const fpga_model::EnergyModelParams p = Shipped();
  EXPECT_EQ(p.clock_hz, 3e8);
  // The model describes the kernel as built: the same PE array as fpga/hls.
  EXPECT_EQ(p.pe_rows, mxhls::kPeRows);
  EXPECT_EQ(p.pe_cols, mxhls::kPeCols);
  EXPECT_EQ(p.hbm_bytes_per_second, 38.4e9);
  EXPECT_EQ(p.macs_per_pe_cycle[static_cast<size_t>(mx::Format::kMxfp4E2m1)], 4.0);
  EXPECT_EQ(p.energy_per_mac_pj[static_cast<size_t>(mx::Format::kFp32)], 15.0);
}

// Decode step through Qwen2.5-0.5B's up projection in MXFP4 (M 8, N 4864, K 896).
// Compute: 1 row tile · 38 W tiles · 28 blocks · 32/4 cycles = 8,512 cycles,
// 28.37 µs. Bytes: W 4864 · 476 (28 blocks of 16 bytes + 28 scales per row) =
// 2,315,264 once; X 8 · 476 = 3,808 for each of the 38 W tiles = 144,704; Y
// 8 · 4864 · 4 = 155,648; 2,615,616 in all, 68.115 µs at 38.4 GB/s: the ports,
// not the PEs, set the time. Joules: 34,865,152 MACs · 1 pJ + 2,615,616 B ·
// 31.2 pJ + 25 W · 68.115 µs.
TEST(EnergyModel, DecodeStepIsBoundByTheWeightPort) {
  const auto e = fpga_model::EstimateGemm(Shipped(), mx::Format::kMxfp4E2m1, mx::Format::kMxfp4E2m1,
                                          8, 4864, 896);
  EXPECT_EQ(e.macs, 34865152.0);
  EXPECT_EQ(e.cycles, 8512.0);
  EXPECT_EQ(e.bytes, 2615616.0);
  EXPECT_NEAR(e.seconds, 6.8115e-05, 1e-15);
  EXPECT_NEAR(e.joules, 0.0018193473712, 1e-12);
}

// A prefill of 512 tokens through the same layer: 64 row tiles · 38 · 28 · 8 =
// 544,768 cycles, 1.8159 ms, against 21,537,792 bytes, 0.561 ms: compute-bound.
TEST(EnergyModel, PrefillIsBoundByThePeArray) {
  const auto e = fpga_model::EstimateGemm(Shipped(), mx::Format::kMxfp4E2m1, mx::Format::kMxfp4E2m1,
                                          512, 4864, 896);
  EXPECT_EQ(e.cycles, 544768.0);
  EXPECT_EQ(e.bytes, 21537792.0);
  EXPECT_NEAR(e.seconds, 544768.0 / 3e8, 1e-15);
  EXPECT_NEAR(e.joules, 0.04830068217173334, 1e-12);
}

// Where the formula puts the crossover: for MXFP4 896×896, each tile of 8 rows
// adds 1,568 cycles (5.227 µs) of compute but only 8 · 6,916 bytes (1.441 µs)
// of transfers over the fixed 426,496 bytes of W (11.107 µs). Compute catches up
// at 11.107 / (5.227 - 1.441) = 2.93 row tiles: M = 16 is bound by the ports,
// M = 24 by the PEs.
TEST(EnergyModel, ComputeBandwidthCrossoverWhereTheFormulaSaysItIs) {
  const auto p = Shipped();
  const auto f = mx::Format::kMxfp4E2m1;
  const auto transfer = [&](const fpga_model::GemmEstimate& e) {
    return e.bytes / p.hbm_bytes_per_second;
  };
  const auto compute = [&](const fpga_model::GemmEstimate& e) { return e.cycles / p.clock_hz; };
  const auto at16 = fpga_model::EstimateGemm(p, f, f, 16, 896, 896);
  const auto at24 = fpga_model::EstimateGemm(p, f, f, 24, 896, 896);
  EXPECT_GT(transfer(at16), compute(at16));
  EXPECT_EQ(at16.seconds, transfer(at16));
  EXPECT_LT(transfer(at24), compute(at24));
  EXPECT_EQ(at24.seconds, compute(at24));
  const double per_tile_compute = 1568 / p.clock_hz, per_tile_bytes = 8 * 6916 / 38.4e9;
  const double crossover_tiles = (426496 / 38.4e9) / (per_tile_compute - per_tile_bytes);
  EXPECT_GT(crossover_tiles, 2.0);
  EXPECT_LT(crossover_tiles, 3.0);
}

// More work never takes less time or energy; a narrower format never more.
TEST(EnergyModel, MonotoneInShapeAndFormat) {
  const auto p = Shipped();
  const mx::Format by_width[] = {mx::Format::kMxfp4E2m1, mx::Format::kMxfp6E2m3,
                                 mx::Format::kMxfp8E4m3, mx::Format::kBf16, mx::Format::kFp32};
  for (mx::Format f : by_width) {
    fpga_model::GemmEstimate previous{};
    for (int64_t m : {1, 8, 9, 64, 512, 4096}) {
      const auto e = fpga_model::EstimateGemm(p, f, f, m, 896, 896);
      EXPECT_GE(e.seconds, previous.seconds) << mx::FormatName(f) << " M " << m;
      EXPECT_GT(e.joules, previous.joules) << mx::FormatName(f) << " M " << m;
      previous = e;
    }
    for (int64_t k : {32, 33, 896, 4864}) {
      const auto narrower = fpga_model::EstimateGemm(p, by_width[0], by_width[0], 64, 896, k);
      const auto e = fpga_model::EstimateGemm(p, f, f, 64, 896, k);
      EXPECT_GE(e.seconds, narrower.seconds) << mx::FormatName(f) << " K " << k;
      EXPECT_GE(e.joules, narrower.joules) << mx::FormatName(f) << " K " << k;
    }
  }
}

// Ragged tiles run whole: 9 rows cost two row tiles of cycles, 129 columns two W tiles.
TEST(EnergyModel, RaggedTilesRunWhole) {
  const auto p = Shipped();
  const auto f = mx::Format::kMxint8;
  EXPECT_EQ(fpga_model::EstimateGemm(p, f, f, 9, 128, 64).cycles,
            2 * fpga_model::EstimateGemm(p, f, f, 8, 128, 64).cycles);
  EXPECT_EQ(fpga_model::EstimateGemm(p, f, f, 8, 129, 64).cycles,
            2 * fpga_model::EstimateGemm(p, f, f, 8, 128, 64).cycles);
  EXPECT_EQ(fpga_model::EstimateGemm(p, f, f, 8, 128, 33).cycles,
            fpga_model::EstimateGemm(p, f, f, 8, 128, 64).cycles);
}

// fpga/README.md's throughput table comes from this sweep: all 168 linear layers
// of Qwen2.5-0.5B (24 blocks of q, k, v, o, gate, up, down) through the shipped
// model. The README's 8×64 alternative is the same sweep with pe_cols = 64.
double QwenSweepSeconds(const fpga_model::EnergyModelParams& p, mx::Format f, int64_t m,
                        double* joules = nullptr) {
  const int64_t layers[][2] = {{896, 896},  {128, 896},  {128, 896}, {896, 896},
                               {4864, 896}, {4864, 896}, {896, 4864}};
  double seconds = 0, energy = 0;
  for (const auto& [n, k] : layers) {
    const auto e = fpga_model::EstimateGemm(p, f, f, m, n, k);
    seconds += 24 * e.seconds;
    energy += 24 * e.joules;
  }
  if (joules) *joules = energy;
  return seconds;
}

TEST(EnergyModel, ReadmeThroughputTableIsWhatTheModelComputes) {
  const auto p = Shipped();
  struct Row {
    mx::Format format;
    double decode_ms, decode_mj, prefill_ms;
  } rows[] = {{mx::Format::kMxfp4E2m1, 5.513, 147.30, 149.094},
              {mx::Format::kMxfp6E2m3, 7.988, 213.86, 298.189},
              {mx::Format::kMxfp8E4m3, 10.464, 281.28, 596.378},
              {mx::Format::kBf16, 20.055, 539.72, 596.378},
              {mx::Format::kFp32, 39.857, 1087.11, 2385.510}};
  for (const Row& r : rows) {
    double joules = 0;
    EXPECT_NEAR(QwenSweepSeconds(p, r.format, 8, &joules) * 1e3, r.decode_ms, 1e-3)
        << mx::FormatName(r.format);
    EXPECT_NEAR(joules * 1e3, r.decode_mj, 1e-2) << mx::FormatName(r.format);
    EXPECT_NEAR(QwenSweepSeconds(p, r.format, 512) * 1e3, r.prefill_ms, 1e-3)
        << mx::FormatName(r.format);
  }
  fpga_model::EnergyModelParams half = p;
  half.pe_cols = 64;
  EXPECT_NEAR(QwenSweepSeconds(half, mx::Format::kMxfp4E2m1, 8) * 1e3, 5.823, 1e-3);
  EXPECT_NEAR(QwenSweepSeconds(half, mx::Format::kMxfp8E4m3, 8) * 1e3, 18.637, 1e-3);
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
  EXPECT_EQ(fpga_model::LoadEnergyModel("/nonexistent.json").status().message(),
            "cannot read '/nonexistent.json': No such file or directory");
  // A directory opened as a stream and aborted mxserved at the first read
  // (libstdc++ throws on EISDIR; a black-box test).
  const absl::Status directory = fpga_model::LoadEnergyModel("/").status();
  EXPECT_EQ(directory.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(directory.message(), "'/' is a directory, not a file");
}

}  // namespace
