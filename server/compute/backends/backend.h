// The backend interface: where a GEMM actually runs. Every compute request of the
// daemon reaches a backend as one call, Y = X·Wᵀ (+ bias), with both operands
// quantized (a Gemm's B arrives transposed, a backward pass's operands are
// arranged the same way by the caller). A layer's weight reaches it prepared:
// the backend made it once, in its own form, when the registry first needed it.
//
//   cpu      the emulation of the FPGA datapath on the host (mx/ kernels);
//            weights are the kernels' packed panels            (cpu.cc)
//   hls-sim  the FPGA kernel's C++ (fpga/hls) on the host: slow, bit-exact, and
//            fed the very buffers the card would get; weights are those
//            buffers                                           (hls_sim.cc)
//   fpga     the card through XRT (fpga/host/xrt_device); weights are resident
//            in HBM. Only in builds where CMake found XRT       (fpga.cc)
//   null     computes nothing and writes zeros of the right shape, so the
//            daemon's own overhead can be measured apart from the arithmetic;
//            weights are nothing                               (null.cc)
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "mx/packed.h"
#include "server/model/prepared_weight.h"

namespace mxserve {

class Backend {
 public:
  virtual ~Backend() = default;
  // "cpu", "null", ...; the `backend` label of metrics and ExecutionInfo.
  virtual absl::string_view name() const = 0;
  // False for `null`: the daemon then skips quantizing operands as well (it
  // hands such a backend shape-only operands and weights: compute/operands.h),
  // so what is left to measure is its own overhead (validation, scheduling,
  // batching, serialization), and answers zeros of the right shape.
  virtual bool computes() const { return true; }
  // OK when this backend computes `format`, else the status a request in it
  // gets (UNIMPLEMENTED naming the backends that serve it). Requests are
  // checked against it when they are prepared, before anything is quantized
  // (compute_work.cc), so Linear never sees such a format; profiles leave such
  // formats out of their default candidates.
  virtual absl::Status Serves(mx::Format) const { return absl::OkStatus(); }
  // A layer's quantized weight (N rows of K) in this backend's own form, made
  // once per (layer version, format, layout) and shared by every request.
  virtual absl::StatusOr<std::shared_ptr<const PreparedWeight>> PrepareWeight(
      mx::QuantizedMatrix w) = 0;
  // Y (x.rows × w.rows(), row-major) = X·Wᵀ + bias. x.cols == w.cols(), bias
  // empty or w.rows() values, y sized x.rows · w.rows(). Bits follow the numerics
  // contract. `w` is one this backend prepared. Returns the name of the kernel
  // that ran (ExecutionInfo.kernel).
  virtual absl::StatusOr<std::string> Linear(const mx::QuantizedMatrix& x, const PreparedWeight& w,
                                             std::span<const float> bias, std::span<float> y) = 0;
  // The same with W for this call only: a Gemm's B, a backward pass's dYᵀ.
  virtual absl::StatusOr<std::string> Linear(const mx::QuantizedMatrix& x,
                                             const mx::QuantizedMatrix& w,
                                             std::span<const float> bias, std::span<float> y) = 0;
  // Latest measured board power, watts (the fpga backend's sampler); nullopt
  // where nothing is measured. The daemon charges it to the "fpga" energy
  // source for the time each request keeps the device busy.
  virtual std::optional<double> BoardPowerWatts() const { return std::nullopt; }
  // The longest K (the summed dimension) one GEMM of this backend takes;
  // nullopt: no limit. Requests are checked against it when they are prepared,
  // where their own fields can be named: a backward pass's grad_weight sums over
  // its M rows.
  virtual std::optional<int64_t> MaxK() const { return std::nullopt; }
  // Whether the FPGA model's joules of a served request are booked (ledger and
  // mxserve_energy_joules_total, source fpga_model). False where no GEMM runs
  // (null): the estimate still goes back in ExecutionInfo, but it is not energy
  // anything spent.
  virtual bool BooksModelEnergy() const { return true; }
};

// The backend names --backend accepts, for help and errors.
inline constexpr absl::string_view kBackendNames = "cpu, hls-sim, fpga, null";

struct BackendOptions {
  // Threads one GEMM is split across (the CPU backend's pool, the caller
  // included). Several scheduler workers share the pool: a GEMM that finds it
  // busy runs on its worker's thread alone, so cores are never oversubscribed.
  int kernel_threads = 1;
  // cpu backend: BF16 × BF16 in the reference's order (--bf16-sums exact).
  bool exact_bf16 = false;
  // fpga backend: the kernel's xclbin and the card's XRT index.
  std::string xclbin;
  unsigned fpga_device = 0;
};

// OK for a name MakeBackend knows and this build can make, without opening
// anything; INVALID_ARGUMENT naming --backend otherwise.
absl::Status CheckBackendName(absl::string_view name);

// INVALID_ARGUMENT naming --backend for an unknown name. The fpga backend has
// opened its card and loaded the xclbin when this returns.
absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(absl::string_view name,
                                                     const BackendOptions& options = {});

// Each backend's maker (backends/<name>.cc).
std::unique_ptr<Backend> MakeCpuBackend(const BackendOptions& options);
std::unique_ptr<Backend> MakeHlsSimBackend();
std::unique_ptr<Backend> MakeNullBackend();
absl::StatusOr<std::unique_ptr<Backend>> MakeFpgaBackend(const BackendOptions& options);

// For the FPGA backends (hls-sim, fpga): OK when the kernel can take W as the
// right operand of a GEMM (fpga::CheckKernelShapes with W's own K), else its
// INVALID_ARGUMENT.
absl::Status CheckWeightFits(const mx::QuantizedMatrix& w);
// For the FPGA backends' Serves and PrepareWeight (the publish warm-up prepares
// copies outside any request): OK when the kernel has a datapath for `format`,
// else UNIMPLEMENTED naming the format and the backends that serve it (LO_BCQ).
absl::Status CheckKernelFormat(mx::Format format, absl::string_view backend);
// For the FPGA backends' MaxK: the columns of the kernel's on-chip W tile.
int64_t FpgaMaxK();

// The prepared weight `backend` made, as its own type; INTERNAL if another
// backend made it (a daemon wiring error, never a client's).
template <typename Prepared>
absl::StatusOr<const Prepared*> Own(const PreparedWeight& w, absl::string_view backend) {
  if (const auto* own = dynamic_cast<const Prepared*>(&w)) return own;
  return absl::InternalError(std::string(backend) + ": the weight was prepared by another backend");
}

}  // namespace mxserve
