// The analytic cycle and energy model of the FPGA GEMM engine in fpga/hls: a
// pe_rows × pe_cols array, weight-stationary (a tile of pe_cols rows of W on
// chip, every row of X streamed past it), each PE retiring one 32-element block
// in 32 / macs_per_pe_cycle cycles. In emulation mode it is the only source of
// FPGA time and energy; on F2 it sits beside measured board power. Parameters
// live in fpga/model/energy_model.json.
//
//   tiles   = ceil(M / pe_rows) · ceil(N / pe_cols)      (ragged tiles run whole)
//   cycles  = tiles · ceil(K / 32) · 32 / macs_per_pe_cycle[format]
//   bytes   = packed W (once: it stays on chip)
//             + packed X · ceil(N / pe_cols) (streamed again for every W tile)
//             + FP32 Y                                   (the mx/ packed layout)
//   seconds = max(cycles / clock_hz, bytes / hbm_bytes_per_second)
//             (load, compute and store overlap in the kernel's dataflow region)
//   joules  = M·N·K · energy_per_mac[format] + bytes · energy_per_byte
//             + static_power · seconds
//
// A mixed pair runs at the rate and energy of the wider (slower) of its two formats.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "mx/format.h"

namespace fpga_model {

struct EnergyModelParams {
  double clock_hz = 0;
  int pe_rows = 0;
  int pe_cols = 0;
  std::array<double, mx::kFormatCount> macs_per_pe_cycle{};  // indexed by mx::Format
  std::array<double, mx::kFormatCount> energy_per_mac_pj{};
  double hbm_bytes_per_second = 0;
  double energy_per_byte_pj = 0;
  double static_power_watts = 0;
};

struct GemmEstimate {
  double macs = 0;
  double cycles = 0;  // PE-array cycles
  double bytes = 0;
  double seconds = 0;
  double joules = 0;
};

// Parses the JSON document. Every format needs a rate and an energy; errors name
// the field ("energy_model.macs_per_pe_cycle.FP16: missing").
absl::StatusOr<EnergyModelParams> ParseEnergyModel(absl::string_view json);
absl::StatusOr<EnergyModelParams> LoadEnergyModel(const std::string& path);

// Y (M×N) = X (M×K, format x) · Wᵀ (N×K, format w).
GemmEstimate EstimateGemm(const EnergyModelParams& params, mx::Format x, mx::Format w, int64_t m,
                          int64_t n, int64_t k);

}  // namespace fpga_model
