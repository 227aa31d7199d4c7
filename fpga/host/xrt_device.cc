// XrtGemmDevice on XRT's native C++ API (xrt::device, xrt::xclbin via
// load_xclbin, xrt::kernel, xrt::bo, xrt::run). Compiled only with XRT.
#include "fpga/host/xrt_device.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <utility>

#include "absl/strings/str_cat.h"
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

struct XrtGemmDevice::Impl {
  XrtOptions options;
  xrt::device device;
  xrt::kernel kernel;
  std::mutex run_mu;    // one run at a time on the one kernel instance
  std::mutex cache_mu;  // the resident-weight cache

  // Resident weights, most recently used first.
  struct Resident {
    mx::kernels::PackedWeight weight;  // keeps the panels (the key) alive
    mx::Format format;
    xrt::bo elements, scales;
    uint64_t bytes;
  };
  std::list<Resident> lru;
  std::map<const void*, std::list<Resident>::iterator> by_panels;
  uint64_t resident_bytes = 0;

  Resident& Weight(const mx::kernels::PackedWeight& w) {
    const void* key = &w.panels();
    if (auto it = by_panels.find(key); it != by_panels.end()) {
      lru.splice(lru.begin(), lru, it->second);
      return lru.front();
    }
    const DeviceOperand d = ToDevice(w.Unpacked());
    const uint64_t bytes = (d.elements.size() + d.scales.size()) * sizeof(mxhls::Word);
    while (!lru.empty() && resident_bytes + bytes > options.weight_cache_bytes) {
      resident_bytes -= lru.back().bytes;
      by_panels.erase(&lru.back().weight.panels());
      lru.pop_back();
    }
    lru.push_front({w, d.format, ToDeviceBo(device, kernel, kW, d.elements),
                    ToDeviceBo(device, kernel, kWScales, d.scales), bytes});
    by_panels[key] = lru.begin();
    resident_bytes += bytes;
    return lru.front();
  }
};

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

absl::StatusOr<std::string> XrtGemmDevice::Linear(const mx::QuantizedMatrix& x,
                                                  const mx::kernels::PackedWeight& w,
                                                  std::span<const float> bias,
                                                  std::span<float> y) {
  if (absl::Status s = CheckKernelShapes(x.rows, w.rows(), x.cols, w.cols(), bias.size()); !s.ok()) {
    return s;
  }
  if (static_cast<int64_t>(y.size()) != x.rows * w.rows()) {
    return absl::InvalidArgumentError(
        absl::StrCat("y: expected ", x.rows * w.rows(), " values (M x N), got ", y.size()));
  }
  // Transfers happen outside the run lock, so one request's uploads and
  // downloads overlap another's kernel run: the pipelining of several scheduler
  // workers sharing one card.
  try {
    const xrt::device& device = impl_->device;
    const xrt::kernel& kernel = impl_->kernel;
    xrt::bo w_elements, w_scales;
    mx::Format w_format;
    {
      std::lock_guard<std::mutex> lock(impl_->cache_mu);
      Impl::Resident& weight = impl_->Weight(w);
      w_elements = weight.elements;  // xrt::bo copies share the buffer
      w_scales = weight.scales;
      w_format = weight.format;
    }
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
    const uint32_t control = ControlWord(x.format, w_format, !bias.empty());
    {
      std::lock_guard<std::mutex> lock(impl_->run_mu);
      xrt::run run = kernel(x_bo, xs_bo, w_elements, w_scales, bias_bo, y_bo,
                            static_cast<int>(x.rows), static_cast<int>(w.rows()),
                            static_cast<int>(x.cols), control);
      run.wait();
    }
    y_bo.sync(XCL_BO_SYNC_BO_FROM_DEVICE);
    y_bo.read(y.data(), y.size_bytes(), 0);
    return KernelName(x.format, w_format);
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("fpga: ", e.what()));
  }
}

}  // namespace fpga
