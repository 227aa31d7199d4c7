#include "server/compute/backends/backend.h"

#include "absl/strings/str_cat.h"
#include "fpga/host/device_buffers.h"

namespace mxserve {

absl::Status CheckKernelFormat(mx::Format format, absl::string_view backend) {
  if (format != mx::Format::kLoBcq) return absl::OkStatus();
  return absl::UnimplementedError(absl::StrCat(
      "format: LO_BCQ is not in the FPGA kernel (--backend ", backend,
      "): its float path has no codebook selector per 8 elements; --backend cpu and the "
      "torch emulator compute it exactly (fpga/README.md)"));
}

int64_t FpgaMaxK() { return mxhls::kMaxK; }

absl::Status CheckWeightFits(const mx::QuantizedMatrix& w) {
  if (absl::Status s = CheckKernelFormat(w.format, "hls-sim or fpga"); !s.ok()) return s;
  return fpga::CheckKernelShapes(/*m=*/1, w.rows, w.cols, w.cols, /*bias_size=*/0,
                                 static_cast<size_t>(w.rows));
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
  if (name == "cpu") return MakeCpuBackend(options);
  if (name == "null") return MakeNullBackend();
  if (name == "hls-sim") return MakeHlsSimBackend();
  return MakeFpgaBackend(options);
}

}  // namespace mxserve
