// XrtGemmDevice on XRT's native C++ API (xrt::device, xrt::xclbin via
// load_xclbin, xrt::kernel, xrt::bo, xrt::run). Compiled only with XRT.
#include "fpga/host/xrt_device.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"
#include "fpga/host/board_power.h"
#include "xrt/xrt_bo.h"
#include "xrt/xrt_device.h"
#include "xrt/xrt_kernel.h"

namespace fpga {
namespace {

// mx_gemm's arguments, in order (fpga/hls/mx_gemm.h).
enum Arg { kX = 0, kXScales, kW, kWScales, kBias, kY, kM, kN, kK, kControl };

xrt::bo ToDeviceBo(const xrt::device& device, const xrt::kernel& kernel, int arg,
                   std::span<const mxhls::Word> words) {
  xrt::bo bo(device, words.size_bytes(), kernel.group_id(arg));
  bo.write(words.data(), words.size_bytes(), 0);
  bo.sync(XCL_BO_SYNC_BO_TO_DEVICE);
  return bo;
}

}  // namespace

// W in device buffers (xrt::bo copies share the buffer).
struct XrtWeight::Buffers {
  xrt::bo elements, scales;
  mx::Format format;
  uint64_t bytes;  // HBM the two buffers take
};

struct XrtGemmDevice::Impl {
  XrtOptions options;
  xrt::device device;
  xrt::kernel kernel;
  std::mutex run_mu;  // one run at a time on the one kernel instance

  using DeviceWeight = XrtWeight::Buffers;
  DeviceWeight Upload(const mx::QuantizedMatrix& w) {
    const DeviceOperand d = ToDevice(w);
    return {ToDeviceBo(device, kernel, kW, d.elements),
            ToDeviceBo(device, kernel, kWScales, d.scales), d.format,
            (d.elements.size() + d.scales.size()) * sizeof(mxhls::Word)};
  }

  // X up, the kernel run, Y down. Transfers happen outside the run lock, so one
  // request's uploads and downloads overlap another's kernel run: the
  // pipelining of several scheduler workers sharing one card.
  std::string Run(const mx::QuantizedMatrix& x, const DeviceWeight& w, int64_t n,
                  std::span<const float> bias, std::span<float> y) {
    const DeviceOperand dx = ToDevice(x);
    xrt::bo x_bo = ToDeviceBo(device, kernel, kX, dx.elements);
    xrt::bo xs_bo = ToDeviceBo(device, kernel, kXScales, dx.scales);
    // The bias port always gets a buffer; the control word says whether it is read.
    xrt::bo bias_bo(device, std::max<size_t>(bias.size_bytes(), sizeof(float)),
                    kernel.group_id(kBias));
    if (!bias.empty()) {
      bias_bo.write(bias.data(), bias.size_bytes(), 0);
      bias_bo.sync(XCL_BO_SYNC_BO_TO_DEVICE);
    }
    xrt::bo y_bo(device, y.size_bytes(), kernel.group_id(kY));
    {
      std::lock_guard<std::mutex> lock(run_mu);
      xrt::run run = kernel(x_bo, xs_bo, w.elements, w.scales, bias_bo, y_bo,
                            static_cast<int>(x.rows), static_cast<int>(n), static_cast<int>(x.cols),
                            ControlWord(x.format, w.format, !bias.empty()));
      run.wait();
    }
    y_bo.sync(XCL_BO_SYNC_BO_FROM_DEVICE);
    y_bo.read(y.data(), y.size_bytes(), 0);
    return KernelName(x.format, w.format);
  }
};

XrtWeight::XrtWeight(std::unique_ptr<Buffers> buffers, mx::Format format, int64_t rows,
                     int64_t cols, uint64_t bytes)
    : buffers_(std::move(buffers)), format_(format), rows_(rows), cols_(cols), bytes_(bytes) {}

XrtWeight::~XrtWeight() = default;

absl::StatusOr<std::unique_ptr<XrtGemmDevice>> XrtGemmDevice::Open(const XrtOptions& options) {
  if (options.xclbin_path.empty()) {
    return absl::InvalidArgumentError("--xclbin: the fpga backend needs the kernel's .xclbin");
  }
  try {
    auto impl = std::make_unique<Impl>();
    impl->options = options;
    impl->device = xrt::device(options.device_index);
    const xrt::uuid uuid = impl->device.load_xclbin(options.xclbin_path);
    impl->kernel = xrt::kernel(impl->device, uuid, options.kernel_name);
    return std::unique_ptr<XrtGemmDevice>(new XrtGemmDevice(std::move(impl)));
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("fpga: device ", options.device_index, ", xclbin '",
                                               options.xclbin_path, "': ", e.what()));
  }
}

XrtGemmDevice::XrtGemmDevice(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {
  sampler_ = std::thread([this] { SamplePower(); });
}

XrtGemmDevice::~XrtGemmDevice() {
  stop_ = true;
  if (sampler_.joinable()) sampler_.join();
}

void XrtGemmDevice::SamplePower() {
  const auto period = std::chrono::duration<double>(1.0 / impl_->options.power_sample_hz);
  while (!stop_) {
    try {
      const std::string report = impl_->device.get_info<xrt::info::device::electrical>();
      if (std::optional<double> watts = ParseBoardPowerWatts(report)) power_watts_ = *watts;
    } catch (const std::exception&) {
      // A board without the sensor: no samples, and the "fpga" source stays empty.
    }
    std::this_thread::sleep_for(period);
  }
}

std::optional<double> XrtGemmDevice::LatestPowerWatts() const {
  const double watts = power_watts_;
  if (watts < 0) return std::nullopt;
  return watts;
}

absl::StatusOr<std::shared_ptr<const XrtWeight>> XrtGemmDevice::Upload(
    const mx::QuantizedMatrix& w) {
  try {
    auto buffers = std::make_unique<XrtWeight::Buffers>(impl_->Upload(w));
    const uint64_t bytes = buffers->bytes;
    return std::shared_ptr<const XrtWeight>(
        new XrtWeight(std::move(buffers), w.format, w.rows, w.cols, bytes));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("fpga: uploading a weight: ", e.what()));
  }
}

absl::StatusOr<std::string> XrtGemmDevice::Linear(const mx::QuantizedMatrix& x, const XrtWeight& w,
                                                  std::span<const float> bias, std::span<float> y) {
  if (absl::Status s = CheckKernelShapes(x.rows, w.rows(), x.cols, w.cols(), bias.size(), y.size());
      !s.ok()) {
    return s;
  }
  try {
    return impl_->Run(x, w.buffers(), w.rows(), bias, y);
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("fpga: ", e.what()));
  }
}

absl::StatusOr<std::string> XrtGemmDevice::Linear(const mx::QuantizedMatrix& x,
                                                  const mx::QuantizedMatrix& w,
                                                  std::span<const float> bias, std::span<float> y) {
  if (absl::Status s = CheckKernelShapes(x.rows, w.rows, x.cols, w.cols, bias.size(), y.size());
      !s.ok()) {
    return s;
  }
  try {
    return impl_->Run(x, impl_->Upload(w), w.rows, bias, y);
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("fpga: ", e.what()));
  }
}

}  // namespace fpga
