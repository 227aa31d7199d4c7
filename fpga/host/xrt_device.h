// The FPGA behind XRT's native C++ API: loads the xclbin, keeps registered weights
// resident in HBM buffers, runs mx_gemm on the buffers fpga/host/device_buffers
// lays out (the same code the hls-sim backend and the tests use), and samples
// board power about 10 times a second.
//
// Built only where CMake finds XRT (MXSERVE_HAVE_XRT); see fpga/README.md for what
// has and has not run.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fpga/host/device_buffers.h"
#include "mx/kernels/linear.h"
#include "mx/packed.h"

namespace fpga {

struct XrtOptions {
  std::string xclbin_path;           // --xclbin
  unsigned device_index = 0;         // --fpga-device
  std::string kernel_name = "mx_gemm";
  // HBM the resident-weight cache may hold; the least recently used weight
  // leaves first.
  uint64_t weight_cache_bytes = uint64_t{8} << 30;
  double power_sample_hz = 10.0;
};

class XrtGemmDevice {
 public:
  // Opens the device, loads the xclbin, finds the kernel and starts the power
  // sampler. UNAVAILABLE with XRT's own message when any step fails.
  static absl::StatusOr<std::unique_ptr<XrtGemmDevice>> Open(const XrtOptions& options);
  ~XrtGemmDevice();

  // Y = X·Wᵀ (+ bias) on the card. W is made resident on first use and stays so
  // (keyed by its packed panels, which the cache entry keeps alive) until
  // evicted. Returns the datapath name, as KernelName().
  absl::StatusOr<std::string> Linear(const mx::QuantizedMatrix& x,
                                     const mx::kernels::PackedWeight& w,
                                     std::span<const float> bias, std::span<float> y);
  // The same with W for this call only (a Gemm's B, a backward pass's dYᵀ):
  // uploaded and dropped, so one-off operands never push registered weights out
  // of the resident cache.
  absl::StatusOr<std::string> Linear(const mx::QuantizedMatrix& x, const mx::QuantizedMatrix& w,
                                     std::span<const float> bias, std::span<float> y);

  // The most recent board power sample, watts; nullopt before the first sample
  // or when the board does not report power.
  std::optional<double> LatestPowerWatts() const;

 private:
  struct Impl;
  explicit XrtGemmDevice(std::unique_ptr<Impl> impl);
  void SamplePower();

  std::unique_ptr<Impl> impl_;
  std::atomic<double> power_watts_{-1.0};
  std::atomic<bool> stop_{false};
  std::thread sampler_;
};

}  // namespace fpga
