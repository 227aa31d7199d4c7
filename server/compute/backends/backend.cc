#include "server/compute/backends/backend.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "fpga/host/device_buffers.h"
#ifdef MXSERVE_HAVE_XRT
#include "fpga/host/xrt_device.h"
#endif

namespace mxserve {
namespace {

// The null backend's own check (the CPU backend's kernels check for themselves).
absl::Status CheckShapes(const mx::QuantizedMatrix& x, const mx::kernels::PackedWeight& w,
                         std::span<const float> bias, std::span<float> y) {
  if (x.cols != w.cols()) {
    return absl::InternalError(absl::StrCat("backend: K mismatch ", x.cols, " vs ", w.cols()));
  }
  if (!bias.empty() && static_cast<int64_t>(bias.size()) != w.rows()) {
    return absl::InternalError("backend: bias size differs from N");
  }
  if (static_cast<int64_t>(y.size()) != x.rows * w.rows()) {
    return absl::InternalError("backend: output size differs from M x N");
  }
  return absl::OkStatus();
}

// The CPU emulation: mx/kernels at the best ISA level this CPU has (MX_ISA caps
// it), bit for bit the reference, split across a pool of --kernel-threads.
class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const BackendOptions& options) : pool_(options.kernel_threads) {}
  absl::string_view name() const override { return "cpu"; }
  absl::StatusOr<std::string> Linear(const mx::QuantizedMatrix& x,
                                     const mx::kernels::PackedWeight& w,
                                     std::span<const float> bias, std::span<float> y) override {
    // mx::kernels::Linear checks every shape itself.
    absl::StatusOr<mx::kernels::KernelInfo> info =
        mx::kernels::Linear(x, w, bias, y, {.pool = &pool_});
    if (!info.ok()) return info.status();
    return std::move(info->name);
  }

 private:
  mx::kernels::ThreadPool pool_;
};

// The FPGA kernel's own C++ run on the host, with the exact buffers the card
// would get: slow and exact, the bridge between the emulator and the hardware.
class HlsSimBackend final : public Backend {
 public:
  absl::string_view name() const override { return "hls-sim"; }
  absl::StatusOr<std::string> Linear(const mx::QuantizedMatrix& x,
                                     const mx::kernels::PackedWeight& w,
                                     std::span<const float> bias, std::span<float> y) override {
    return Linear(x, w.Unpacked(), bias, y);
  }
  absl::StatusOr<std::string> Linear(const mx::QuantizedMatrix& x, const mx::QuantizedMatrix& w,
                                     std::span<const float> bias, std::span<float> y) override {
    if (absl::Status s = fpga::RunKernelOnHost(fpga::ToDevice(x), fpga::ToDevice(w), bias, y);
        !s.ok()) {
      return s;
    }
    return fpga::KernelName(x.format, w.format);
  }
};

#ifdef MXSERVE_HAVE_XRT
// The card: the same buffers as hls-sim, run by the synthesized kernel.
class FpgaBackend final : public Backend {
 public:
  explicit FpgaBackend(std::unique_ptr<fpga::XrtGemmDevice> device) : device_(std::move(device)) {}
  absl::string_view name() const override { return "fpga"; }
  absl::StatusOr<std::string> Linear(const mx::QuantizedMatrix& x,
                                     const mx::kernels::PackedWeight& w,
                                     std::span<const float> bias, std::span<float> y) override {
    return device_->Linear(x, w, bias, y);
  }
  absl::StatusOr<std::string> Linear(const mx::QuantizedMatrix& x, const mx::QuantizedMatrix& w,
                                     std::span<const float> bias, std::span<float> y) override {
    return device_->Linear(x, w, bias, y);
  }
  std::optional<double> BoardPowerWatts() const override { return device_->LatestPowerWatts(); }

 private:
  std::unique_ptr<fpga::XrtGemmDevice> device_;
};
#endif

class NullBackend final : public Backend {
 public:
  absl::string_view name() const override { return "null"; }
  bool computes() const override { return false; }
  absl::StatusOr<std::string> Linear(const mx::QuantizedMatrix& x,
                                     const mx::kernels::PackedWeight& w,
                                     std::span<const float> bias, std::span<float> y) override {
    if (absl::Status s = CheckShapes(x, w, bias, y); !s.ok()) return s;
    std::fill(y.begin(), y.end(), 0.0f);
    return std::string();
  }
};

}  // namespace

absl::StatusOr<std::string> Backend::Linear(const mx::QuantizedMatrix& x,
                                            const mx::QuantizedMatrix& w,
                                            std::span<const float> bias, std::span<float> y) {
  absl::StatusOr<mx::kernels::PackedWeight> packed = mx::kernels::PackedWeight::Pack(w);
  if (!packed.ok()) return packed.status();
  return Linear(x, *packed, bias, y);
}

absl::Status CheckBackendName(absl::string_view name) {
  if (name == "cpu" || name == "null" || name == "hls-sim") return absl::OkStatus();
  if (name == "fpga") {
#ifdef MXSERVE_HAVE_XRT
    return absl::OkStatus();
#else
    return absl::InvalidArgumentError(
        "--backend: this build has no fpga backend (CMake found no XRT; see fpga/README.md); "
        "--backend hls-sim runs the same kernel on the host");
#endif
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--backend: unknown backend '", name, "'; expected one of ", kBackendNames));
}

absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(absl::string_view name,
                                                     const BackendOptions& options) {
  if (absl::Status s = CheckBackendName(name); !s.ok()) return s;
  if (name == "cpu") return std::make_unique<CpuBackend>(options);
  if (name == "null") return std::make_unique<NullBackend>();
  if (name == "hls-sim") return std::make_unique<HlsSimBackend>();
#ifdef MXSERVE_HAVE_XRT
  absl::StatusOr<std::unique_ptr<fpga::XrtGemmDevice>> device =
      fpga::XrtGemmDevice::Open({.xclbin_path = options.xclbin, .device_index = options.fpga_device});
  if (!device.ok()) return device.status();
  return std::make_unique<FpgaBackend>(*std::move(device));
#else
  return absl::InternalError("unreachable: CheckBackendName accepted an unbuilt backend");
#endif
}

}  // namespace mxserve
