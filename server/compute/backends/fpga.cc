// The card: the same buffers as hls-sim, run by the synthesized kernel through
// XRT. A prepared weight is resident in the card's HBM for as long as the
// registry keeps it. Built into the daemon only where CMake found XRT.
#include "server/compute/backends/backend.h"

#ifdef MXSERVE_HAVE_XRT
#include "fpga/host/xrt_device.h"
#endif

namespace mxserve {

#ifdef MXSERVE_HAVE_XRT
namespace {

class ResidentWeight final : public PreparedWeight {
 public:
  explicit ResidentWeight(std::shared_ptr<const fpga::XrtWeight> weight)
      : PreparedWeight(weight->format(), weight->rows(), weight->cols()),
        weight_(std::move(weight)) {}
  uint64_t bytes() const override { return weight_->bytes(); }
  const fpga::XrtWeight& weight() const { return *weight_; }

 private:
  const std::shared_ptr<const fpga::XrtWeight> weight_;
};

class FpgaBackend final : public Backend {
 public:
  explicit FpgaBackend(std::unique_ptr<fpga::XrtGemmDevice> device) : device_(std::move(device)) {}
  absl::string_view name() const override { return "fpga"; }
  absl::Status Serves(mx::Format format) const override {
    return CheckKernelFormat(format, name());
  }
  std::optional<int64_t> MaxK() const override { return FpgaMaxK(); }

  absl::StatusOr<std::shared_ptr<const PreparedWeight>> PrepareWeight(
      mx::QuantizedMatrix w) override {
    // Refused before anything is uploaded to the card or charged to the budget.
    if (absl::Status s = CheckWeightFits(w); !s.ok()) return s;
    absl::StatusOr<std::shared_ptr<const fpga::XrtWeight>> resident = device_->Upload(w);
    if (!resident.ok()) return resident.status();
    return std::make_shared<const ResidentWeight>(*std::move(resident));
  }
  absl::StatusOr<std::string> Linear(const mx::QuantizedMatrix& x, const PreparedWeight& w,
                                     std::span<const float> bias, std::span<float> y) override {
    absl::StatusOr<const ResidentWeight*> own = Own<ResidentWeight>(w, name());
    if (!own.ok()) return own.status();
    return device_->Linear(x, (*own)->weight(), bias, y);
  }
  absl::StatusOr<std::string> Linear(const mx::QuantizedMatrix& x, const mx::QuantizedMatrix& w,
                                     std::span<const float> bias, std::span<float> y) override {
    return device_->Linear(x, w, bias, y);
  }
  std::optional<double> BoardPowerWatts() const override { return device_->LatestPowerWatts(); }

 private:
  std::unique_ptr<fpga::XrtGemmDevice> device_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> MakeFpgaBackend(const BackendOptions& options) {
  absl::StatusOr<std::unique_ptr<fpga::XrtGemmDevice>> device = fpga::XrtGemmDevice::Open(
      {.xclbin_path = options.xclbin, .device_index = options.fpga_device});
  if (!device.ok()) return device.status();
  return std::make_unique<FpgaBackend>(*std::move(device));
}
#else
absl::StatusOr<std::unique_ptr<Backend>> MakeFpgaBackend(const BackendOptions&) {
  return absl::InternalError("unreachable: CheckBackendName accepted an unbuilt backend");
}
#endif

}  // namespace mxserve
