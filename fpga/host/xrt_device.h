// The FPGA behind XRT's native C++ API: loads the xclbin, makes layer weights
// resident in HBM buffers (for as long as the daemon holds them), runs mx_gemm on the buffers
// fpga/host/device_buffers lays out (the same code the hls-sim backend and the tests use), and
// samples board power about 10 times a second.
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
#include "mx/packed.h"

namespace fpga {

struct XrtOptions {
  std::string xclbin_path;    // --xclbin
  unsigned device_index = 0;  // --fpga-device
  std::string kernel_name = "mx_gemm";
  double power_sample_hz = 10.0;
};

// A weight resident in the card's HBM, in the kernel's W buffers; freed when
// the last holder lets go. The daemon's registry decides how long it stays
// (its copies count against --weight-memory-bytes and are evicted from there).
class XrtWeight {
 public:
  ~XrtWeight();
  XrtWeight(const XrtWeight&) = delete;
  XrtWeight& operator=(const XrtWeight&) = delete;
  mx::Format format() const { return format_; }
  int64_t rows() const { return rows_; }     // N
  int64_t cols() const { return cols_; }     // K
  uint64_t bytes() const { return bytes_; }  // HBM the two buffers take

  struct Buffers;  // XRT's buffer objects (xrt_device.cc)
  const Buffers& buffers() const { return *buffers_; }

 private:
  friend class XrtGemmDevice;
  XrtWeight(std::unique_ptr<Buffers> buffers, mx::Format format, int64_t rows, int64_t cols,
            uint64_t bytes);
  std::unique_ptr<Buffers> buffers_;
  mx::Format format_;
  int64_t rows_, cols_;
  uint64_t bytes_;
};

class XrtGemmDevice {
 public:
  // Opens the device, loads the xclbin, finds the kernel and starts the power
  // sampler. UNAVAILABLE with XRT's own message when any step fails.
  static absl::StatusOr<std::unique_ptr<XrtGemmDevice>> Open(const XrtOptions& options);
  ~XrtGemmDevice();

  // Makes W (N rows of K) resident in HBM. INTERNAL with XRT's message on failure.
  absl::StatusOr<std::shared_ptr<const XrtWeight>> Upload(const mx::QuantizedMatrix& w);
  // Y = X·Wᵀ (+ bias) on the card with a resident W. Returns the datapath name,
  // as KernelName().
  absl::StatusOr<std::string> Linear(const mx::QuantizedMatrix& x, const XrtWeight& w,
                                     std::span<const float> bias, std::span<float> y);
  // The same with W for this call only (a Gemm's B, a backward pass's dYᵀ):
  // uploaded and dropped.
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
