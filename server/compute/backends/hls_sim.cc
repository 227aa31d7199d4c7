// The FPGA kernel's own C++ run on the host, with the exact buffers the card
// would get: slow and exact, the bridge between the emulator and the hardware.
// A prepared weight is those buffers, laid out once.
#include <utility>

#include "fpga/host/device_buffers.h"
#include "server/compute/backends/backend.h"

namespace mxserve {
namespace {

class DeviceWeight final : public PreparedWeight {
 public:
  explicit DeviceWeight(fpga::DeviceOperand operand)
      : PreparedWeight(operand.format, operand.rows, operand.cols), operand_(std::move(operand)) {}
  uint64_t bytes() const override {
    return (operand_.elements.size() + operand_.scales.size()) * sizeof(mxhls::Word);
  }
  const fpga::DeviceOperand& operand() const { return operand_; }

 private:
  const fpga::DeviceOperand operand_;
};

class HlsSimBackend final : public Backend {
 public:
  absl::string_view name() const override { return "hls-sim"; }
  absl::Status Serves(mx::Format format) const override {
    return CheckKernelFormat(format, name());
  }
  std::optional<int64_t> MaxK() const override { return FpgaMaxK(); }

  absl::StatusOr<std::shared_ptr<const PreparedWeight>> PrepareWeight(
      mx::QuantizedMatrix w) override {
    // A weight the kernel cannot take is refused here, before it is laid out
    // and charged to the budget (the message a GEMM with it would give).
    if (absl::Status s = CheckWeightFits(w); !s.ok()) return s;
    return std::make_shared<const DeviceWeight>(fpga::ToDevice(w));
  }

  absl::StatusOr<std::string> Linear(const mx::QuantizedMatrix& x, const PreparedWeight& w,
                                     std::span<const float> bias, std::span<float> y) override {
    absl::StatusOr<const DeviceWeight*> own = Own<DeviceWeight>(w, name());
    if (!own.ok()) return own.status();
    return Run(x, (*own)->operand(), bias, y);
  }

  absl::StatusOr<std::string> Linear(const mx::QuantizedMatrix& x, const mx::QuantizedMatrix& w,
                                     std::span<const float> bias, std::span<float> y) override {
    return Run(x, fpga::ToDevice(w), bias, y);
  }

 private:
  static absl::StatusOr<std::string> Run(const mx::QuantizedMatrix& x, const fpga::DeviceOperand& w,
                                         std::span<const float> bias, std::span<float> y) {
    if (absl::Status s = fpga::RunKernelOnHost(fpga::ToDevice(x), w, bias, y); !s.ok()) return s;
    return fpga::KernelName(x.format, w.format);
  }
};

}  // namespace

std::unique_ptr<Backend> MakeHlsSimBackend() { return std::make_unique<HlsSimBackend>(); }

}  // namespace mxserve
