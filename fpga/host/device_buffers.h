// What the FPGA receives: operands laid out for the kernel's AXI ports, and the
// control word. The `hls-sim` backend and the XRT backend both use this code, so
// the buffers the tests check are the buffers the hardware gets.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fpga/hls/mx_gemm.h"
#include "mx/format.h"
#include "mx/packed.h"

namespace fpga {

// The hardware's number for a format (the control register's fields).
mxhls::HwFormat HwFormatOf(mx::Format format);
// Control word for X·Wᵀ: both formats, the datapath the contract prescribes for
// the pair, and the bias flag.
uint32_t ControlWord(mx::Format x, mx::Format w, bool bias);

// One operand as the kernel's ports read it (see fpga/hls/mx_gemm.h): rows of
// whole 32-element blocks, bits/2 words per block, scales in their own buffer.
struct DeviceOperand {
  mx::Format format = mx::Format::kFp32;
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<mxhls::Word> elements;
  std::vector<mxhls::Word> scales;  // at least one word, so every port has a buffer
};

// "hls/mx_integer", "hls/mx_wide", "hls/nv_blocks", "hls/int8" or "hls/float":
// the datapath a pair runs on, as ExecutionInfo.kernel names it.
std::string KernelName(mx::Format x, mx::Format w);

// Lays out a (valid) matrix for the device. MX elements are copied byte for byte
// (the mx/ packed layout already is the device's); NVFP4 rows of an odd count
// of 16-element blocks gain a zero one; INT8/BF16/FP16/FP32 rows are padded
// with zero codes to whole blocks.
DeviceOperand ToDevice(const mx::QuantizedMatrix& m);
// The inverse, for round-trip tests and debugging.
mx::QuantizedMatrix FromDevice(const DeviceOperand& d);

// INVALID_ARGUMENT unless X·Wᵀ fits the kernel: K equal on both sides, 1 ≤ K ≤
// mxhls::kMaxK (the on-chip W tile), M and N in [1, 2^31), bias empty or N
// values, y M·N values. Every host path (hls-sim, XRT) checks with this.
absl::Status CheckKernelShapes(int64_t m, int64_t n, int64_t k_x, int64_t k_w, size_t bias_size,
                               size_t y_size);

// Runs the kernel's C++ (the `hls-sim` path) on device buffers: Y (M×N) =
// X·Wᵀ (+ bias). Calls are serialized, as on the single kernel instance of the card.
absl::Status RunKernelOnHost(const DeviceOperand& x, const DeviceOperand& w,
                             std::span<const float> bias, std::span<float> y);

}  // namespace fpga
