// The backend interface: where a GEMM actually runs. Every compute request of the
// daemon reaches a backend as one call, Y = X·Wᵀ (+ bias), with both operands
// already in their packed formats (a Gemm's B arrives transposed, a backward
// pass's operands are arranged the same way by the caller).
//
//   cpu   the emulation of the FPGA datapath on the host (mx/ kernels)
//   hls-sim  the FPGA kernel's C++ (fpga/hls) on the host: slow, bit-exact, and
//            fed the very buffers the card would get
//   fpga     the card through XRT (fpga/host/xrt_device); only in builds where
//            CMake found XRT
//   null  computes nothing and writes zeros of the right shape, so the daemon's
//         own overhead can be measured apart from the arithmetic
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "mx/kernels/linear.h"
#include "mx/packed.h"

namespace mxserve {

class Backend {
 public:
  virtual ~Backend() = default;
  // "cpu", "null", ...; the `backend` label of metrics and ExecutionInfo.
  virtual absl::string_view name() const = 0;
  // False for `null`: the daemon then skips quantizing operands as well, so what
  // is left to measure is its own overhead (validation, scheduling, batching,
  // serialization), and answers zeros of the right shape.
  virtual bool computes() const { return true; }
  // Y (x.rows × w.rows(), row-major) = X·Wᵀ + bias. x.cols == w.cols(), bias
  // empty or w.rows() values, y sized x.rows · w.rows(). Bits follow the numerics
  // contract. W comes packed once, when the registry first quantized it. Returns
  // the name of the kernel that ran (ExecutionInfo.kernel).
  virtual absl::StatusOr<std::string> Linear(const mx::QuantizedMatrix& x,
                                             const mx::kernels::PackedWeight& w,
                                             std::span<const float> bias,
                                             std::span<float> y) = 0;
  // Latest measured board power, watts (the fpga backend's sampler); nullopt
  // where nothing is measured. The daemon charges it to the "fpga" energy
  // source for the time each request keeps the device busy.
  virtual std::optional<double> BoardPowerWatts() const { return std::nullopt; }
  // The same with W for this call only: a Gemm's B, a backward pass's dYᵀ. By
  // default W is packed for the CPU kernels; backends that take the exchange
  // layout (hls-sim, fpga) override it and skip that round trip.
  virtual absl::StatusOr<std::string> Linear(const mx::QuantizedMatrix& x,
                                             const mx::QuantizedMatrix& w,
                                             std::span<const float> bias, std::span<float> y);
};

// The backend names --backend accepts, for help and errors.
inline constexpr absl::string_view kBackendNames = "cpu, hls-sim, fpga, null";

struct BackendOptions {
  // Threads one GEMM is split across (the CPU backend's pool, the caller
  // included). Several scheduler workers share the pool: a GEMM that finds it
  // busy runs on its worker's thread alone, so cores are never oversubscribed.
  int kernel_threads = 1;
  // fpga backend: the kernel's xclbin and the card's XRT index.
  std::string xclbin;
  unsigned fpga_device = 0;
};

// OK for a name MakeBackend knows and this build can make, without opening
// anything; INVALID_ARGUMENT naming --backend otherwise.
absl::Status CheckBackendName(absl::string_view name);

// INVALID_ARGUMENT naming --backend for an unknown name.
absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(absl::string_view name,
                                                     const BackendOptions& options = {});

}  // namespace mxserve
