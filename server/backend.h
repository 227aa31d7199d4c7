// The backend interface: where a GEMM actually runs. Every compute request of the
// daemon reaches a backend as one call, Y = X·Wᵀ (+ bias), with both operands
// already in their packed formats (a Gemm's B arrives transposed, a backward
// pass's operands are arranged the same way by the caller).
//
//   cpu   the emulation of the FPGA datapath on the host (mx/ kernels)
//   hls-sim  the FPGA kernel's C++ (fpga/hls) on the host: slow, bit-exact, and
//            fed the very buffers the card would get
//   null  computes nothing and writes zeros of the right shape, so the daemon's
//         own overhead can be measured apart from the arithmetic
#pragma once

#include <memory>
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
  // The same with W packed for this call only: a Gemm's B, a backward pass's dYᵀ.
  absl::StatusOr<std::string> Linear(const mx::QuantizedMatrix& x, const mx::QuantizedMatrix& w,
                                     std::span<const float> bias, std::span<float> y);
};

// The backend names --backend accepts, for help and errors.
inline constexpr absl::string_view kBackendNames = "cpu, hls-sim, null";

struct BackendOptions {
  // Threads one GEMM is split across (the CPU backend's pool, the caller
  // included). Several scheduler workers share the pool: a GEMM that finds it
  // busy runs on its worker's thread alone, so cores are never oversubscribed.
  int kernel_threads = 1;
};

// INVALID_ARGUMENT naming --backend for an unknown name.
absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(absl::string_view name,
                                                     const BackendOptions& options = {});

}  // namespace mxserve
