#include "fpga/host/device_buffers.h"

#include <algorithm>
#include <cstring>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "mx/codebook.h"

namespace fpga {
namespace {

int64_t WordsPerRow(mx::Format format, int64_t cols) {
  return mx::BlocksPerRow(cols) * mxhls::WordsPerBlock(HwFormatOf(format));
}

// Bytes one element of a non-MX format occupies in mx/'s layout.
int64_t DenseElementBytes(mx::Format format) { return mx::Traits(format).element_bits / 8; }

// NVFP4 (mx_gemm.h): mx/ packs a row as ceil(K/16) one-word half blocks, the
// device as ceil(K/32) two-word blocks, so a row with an odd count gains a zero
// word and its scale row a zero byte; the tensor scales follow the scale bytes
// from word NvRowScaleWord. Row by row, in both directions.
struct NvRows {
  int64_t halves;       // mx/: words (and scale bytes) per row
  int64_t device_pairs;  // device: blocks per row
  int64_t row_scale_word;
};
NvRows NvLayout(int64_t rows, int64_t cols) {
  const int64_t blocks = mx::BlocksPerRow(cols);
  return {mx::BlocksPerRow(mx::Format::kNvfp4, cols), blocks,
          mxhls::NvRowScaleWord(rows, blocks)};
}

void Nvfp4ToDevice(const mx::QuantizedMatrix& m, int64_t row_words, DeviceOperand& d) {
  const NvRows l = NvLayout(m.rows, m.cols);
  d.scales.assign(l.row_scale_word + (m.rows + 1) / 2 + 1, 0);
  auto* scale_bytes = reinterpret_cast<uint8_t*>(d.scales.data());
  for (int64_t r = 0; r < m.rows; ++r) {
    std::memcpy(d.elements.data() + r * row_words, m.elements.data() + r * l.halves * 8,
                l.halves * 8);
    std::memcpy(scale_bytes + r * l.device_pairs * 2, m.block_scales.data() + r * l.halves,
                l.halves);
  }
  if (!m.row_scales.empty()) {  // memcpy from an empty vector's null data is UB
    std::memcpy(d.scales.data() + l.row_scale_word, m.row_scales.data(),
                m.row_scales.size() * sizeof(float));
  }
}

void Nvfp4FromDevice(const DeviceOperand& d, mx::QuantizedMatrix& m) {
  const NvRows l = NvLayout(d.rows, d.cols);
  const int64_t row_words = l.device_pairs * 2;
  const auto* scale_bytes = reinterpret_cast<const uint8_t*>(d.scales.data());
  for (int64_t r = 0; r < d.rows; ++r) {
    std::memcpy(m.elements.data() + r * l.halves * 8, d.elements.data() + r * row_words,
                l.halves * 8);
    std::memcpy(m.block_scales.data() + r * l.halves, scale_bytes + r * l.device_pairs * 2,
                l.halves);
  }
  if (!m.row_scales.empty()) {
    std::memcpy(m.row_scales.data(), d.scales.data() + l.row_scale_word,
                m.row_scales.size() * sizeof(float));
  }
}

bool IsCodebook(mx::Format format) {
  return mx::Traits(format).kind == mx::FormatKind::kCodebook;
}

// NF4, BNB_FP4: mx/ packs a row as ceil(K/64) blocks of 32 bytes, the device as
// ceil(K/32) blocks of 16 (the same nibbles, a row's last half block of padding
// left out), and the scale port holds each device block's FP32 absmax (its
// 64-element block's, so each twice).
void CodebookToDevice(const mx::QuantizedMatrix& m, int64_t row_words, DeviceOperand& d) {
  const int64_t blocks = mx::BlocksPerRow(m.cols), mx_row_bytes = mx::RowBytes(m.format, m.cols);
  d.scales.assign((m.rows * blocks + 1) / 2 + 1, 0);
  auto* scales = reinterpret_cast<uint8_t*>(d.scales.data());
  for (int64_t r = 0; r < m.rows; ++r) {
    std::memcpy(d.elements.data() + r * row_words, m.elements.data() + r * mx_row_bytes,
                row_words * 8);
    for (int64_t b = 0; b < blocks; ++b) {
      const float absmax = mx::LookupScale(m, r, b / 2);
      std::memcpy(scales + 4 * (r * blocks + b), &absmax, 4);
    }
  }
}

void CodebookFromDevice(const DeviceOperand& d, mx::QuantizedMatrix& m) {
  const int64_t blocks = mx::BlocksPerRow(d.cols), mx_row_bytes = mx::RowBytes(d.format, d.cols);
  const int64_t row_words = blocks * 2, scale_row = mx::ScaleBytesPerRow(d.format, d.cols);
  const auto* scales = reinterpret_cast<const uint8_t*>(d.scales.data());
  for (int64_t r = 0; r < d.rows; ++r) {
    // The padding half block the device does not hold is the code of 0, as mx/ writes it.
    std::fill_n(m.elements.data() + r * mx_row_bytes, mx_row_bytes,
                static_cast<uint8_t>(mx::CodebookZeroCode(d.format) * 0x11));
    std::memcpy(m.elements.data() + r * mx_row_bytes, d.elements.data() + r * row_words,
                row_words * 8);
    for (int64_t b = 0; b < blocks; b += 2) {
      std::memcpy(m.block_scales.data() + r * scale_row + 2 * b, scales + 4 * (r * blocks + b), 4);
    }
  }
}

}  // namespace

mxhls::HwFormat HwFormatOf(mx::Format format) {
  switch (format) {
    case mx::Format::kMxfp8E4m3: return mxhls::kHwE4m3;
    case mx::Format::kMxfp8E5m2: return mxhls::kHwE5m2;
    case mx::Format::kMxfp6E3m2: return mxhls::kHwE3m2;
    case mx::Format::kMxfp6E2m3: return mxhls::kHwE2m3;
    case mx::Format::kMxfp4E2m1: return mxhls::kHwE2m1;
    case mx::Format::kMxint8: return mxhls::kHwMxInt8;
    case mx::Format::kInt8: return mxhls::kHwInt8;
    case mx::Format::kBf16: return mxhls::kHwBf16;
    case mx::Format::kFp16: return mxhls::kHwFp16;
    case mx::Format::kFp32: return mxhls::kHwFp32;
    case mx::Format::kNvfp4: return mxhls::kHwNvfp4;
    case mx::Format::kNf4: return mxhls::kHwNf4;
    case mx::Format::kBnbFp4: return mxhls::kHwBnbFp4;
    case mx::Format::kLoBcq: break;  // not in the kernel: the backends refuse it before any layout
  }
  return mxhls::kHwFp32;
}

uint32_t ControlWord(mx::Format x, mx::Format w, bool bias) {
  const mxhls::HwFormat hx = HwFormatOf(x), hw = HwFormatOf(w);
  return mxhls::Control(hx, hw, mxhls::DatapathFor(hx, hw), bias);
}

std::string KernelName(mx::Format x, mx::Format w) {
  switch (mxhls::DatapathFor(HwFormatOf(x), HwFormatOf(w))) {
    case mxhls::kPathMxInteger: return "hls/mx_integer";
    case mxhls::kPathMxWide: return "hls/mx_wide";
    case mxhls::kPathInt8: return "hls/int8";
    case mxhls::kPathFloat: return "hls/float";
    case mxhls::kPathNv: return "hls/nv_blocks";
  }
  return "hls";
}

DeviceOperand ToDevice(const mx::QuantizedMatrix& m) {
  DeviceOperand d{m.format, m.rows, m.cols, {}, {}};
  const int64_t row_words = WordsPerRow(m.format, m.cols);
  d.elements.assign(std::max<int64_t>(m.rows * row_words, 1), 0);
  auto* out = reinterpret_cast<uint8_t*>(d.elements.data());
  if (m.format == mx::Format::kNvfp4) {
    Nvfp4ToDevice(m, row_words, d);
    return d;
  }
  if (IsCodebook(m.format)) {
    CodebookToDevice(m, row_words, d);
    return d;
  }
  if (mx::IsMx(m.format)) {
    std::memcpy(out, m.elements.data(), m.elements.size());
    d.scales.assign((m.block_scales.size() + 7) / 8 + 1, 0);
    std::memcpy(d.scales.data(), m.block_scales.data(), m.block_scales.size());
    return d;
  }
  const int64_t row_bytes = m.cols * DenseElementBytes(m.format);
  for (int64_t r = 0; r < m.rows; ++r) {
    std::memcpy(out + r * row_words * 8, m.elements.data() + r * row_bytes, row_bytes);
  }
  d.scales.assign((m.row_scales.size() + 1) / 2 + 1, 0);
  // Only INT8 has row scales; memcpy from an empty vector's null data is UB.
  if (!m.row_scales.empty()) {
    std::memcpy(d.scales.data(), m.row_scales.data(), m.row_scales.size() * sizeof(float));
  }
  return d;
}

mx::QuantizedMatrix FromDevice(const DeviceOperand& d) {
  mx::QuantizedMatrix m = mx::AllocateQuantized(d.format, d.rows, d.cols);
  const auto* in = reinterpret_cast<const uint8_t*>(d.elements.data());
  if (d.format == mx::Format::kNvfp4) {
    Nvfp4FromDevice(d, m);
    return m;
  }
  if (IsCodebook(d.format)) {
    CodebookFromDevice(d, m);
    return m;
  }
  if (mx::IsMx(d.format)) {
    std::memcpy(m.elements.data(), in, m.elements.size());
    std::memcpy(m.block_scales.data(), d.scales.data(), m.block_scales.size());
    return m;
  }
  const int64_t row_words = WordsPerRow(d.format, d.cols);
  const int64_t row_bytes = d.cols * DenseElementBytes(d.format);
  for (int64_t r = 0; r < d.rows; ++r) {
    std::memcpy(m.elements.data() + r * row_bytes, in + r * row_words * 8, row_bytes);
  }
  if (!m.row_scales.empty()) {
    std::memcpy(m.row_scales.data(), d.scales.data(), m.row_scales.size() * sizeof(float));
  }
  return m;
}

absl::Status CheckKernelShapes(int64_t m, int64_t n, int64_t k_x, int64_t k_w, size_t bias_size,
                               size_t y_size) {
  if (k_x != k_w) {
    return absl::InvalidArgumentError(
        absl::StrCat("w: expected K = ", k_x, " columns to match x, got ", k_w));
  }
  if (k_x < 1 || k_x > mxhls::kMaxK) {
    return absl::InvalidArgumentError(absl::StrCat(
        "K: the FPGA kernel holds 1 to ", mxhls::kMaxK, " columns in its on-chip W tile, got ", k_x));
  }
  constexpr int64_t kMaxRows = (int64_t{1} << 31) - 1;
  if (m < 1 || m > kMaxRows || n < 1 || n > kMaxRows) {
    return absl::InvalidArgumentError(
        absl::StrCat("shape: the FPGA kernel takes M and N in [1, 2^31), got ", m, "x", n));
  }
  if (bias_size != 0 && static_cast<int64_t>(bias_size) != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("bias: expected ", n, " values (one per row of w), got ", bias_size));
  }
  if (static_cast<int64_t>(y_size) != m * n) {
    return absl::InvalidArgumentError(
        absl::StrCat("y: expected ", m * n, " values (M x N), got ", y_size));
  }
  return absl::OkStatus();
}

absl::Status RunKernelOnHost(const DeviceOperand& x, const DeviceOperand& w,
                             std::span<const float> bias, std::span<float> y) {
  if (absl::Status s = CheckKernelShapes(x.rows, w.rows, x.cols, w.cols, bias.size(), y.size());
      !s.ok()) {
    return s;
  }
  // The kernel keeps its W tile in static storage: one call at a time.
  static std::mutex kernel_mutex;
  std::lock_guard<std::mutex> lock(kernel_mutex);
  mx_gemm(x.elements.data(), x.scales.data(), w.elements.data(), w.scales.data(),
          bias.empty() ? nullptr : bias.data(), y.data(), static_cast<int>(x.rows),
          static_cast<int>(w.rows), static_cast<int>(x.cols),
          ControlWord(x.format, w.format, !bias.empty()));
  return absl::OkStatus();
}

}  // namespace fpga
