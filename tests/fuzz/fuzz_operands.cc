// Fuzz target: the operand decoders of every compute request, and what runs on
// what they accept. The first byte picks the decoder:
//   even  a PackedOperand (DecodePacked); an accepted MX, NVFP4 or INT8 operand then
//         runs through the fast kernels, the FPGA kernel's C++ (hls-sim's
//         device buffers; small operands) and the reference, which must agree
//         bit for bit (W: a fixed matrix of the same format and K)
//   odd   a dense Tensor (DecodeMatrix); an accepted one is quantized by the fast
//         quantizer and the reference into the format the second byte picks,
//         which must agree byte for byte
#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstdlib>

#include "fpga/host/device_buffers.h"
#include "mx/kernels/linear.h"
#include "mx/kernels/quantize_fast.h"
#include "mx/packed.h"
#include "mx/reference_gemm.h"
#include "server/compute/wire.h"
#include "tests/fuzz/fuzz_seeds.h"
#include "tests/same_bits.h"

namespace {

constexpr int64_t kMaxBytes = 16 << 10;

// Bit for bit (NaN payloads and zero signs included); empty vectors are equal.
using mx_test::Identical;

bool SameBytes(const mx::QuantizedMatrix& a, const mx::QuantizedMatrix& b) {
  return a.format == b.format && a.rows == b.rows && a.cols == b.cols && a.elements == b.elements &&
         a.block_scales == b.block_scales && Identical(a.row_scales, b.row_scales);
}

void Packed(const uint8_t* data, size_t size) {
  mxserve::v1::PackedOperand packed;
  if (!packed.ParseFromArray(data, static_cast<int>(size))) return;
  absl::StatusOr<mx::QuantizedMatrix> x = mxserve::DecodePacked(packed, "x", {}, kMaxBytes);
  if (!x.ok()) return;
  if (!mx::ValidateLayout(*x).ok()) std::abort();                      // accepted means well formed
  if (!mx::IsBlockScaled(x->format) && x->format != mx::Format::kInt8) return;  // floats: tolerance
  if (x->cols > 4096) return;
  absl::StatusOr<mx::QuantizedMatrix> w =
      mx::QuantizeRows(mx_fuzz::SeedValues(3 * x->cols, 5), 3, x->cols, x->format);
  if (!w.ok()) std::abort();
  absl::StatusOr<std::vector<float>> fast = mx::kernels::Linear(*x, *w);
  absl::StatusOr<std::vector<float>> reference = mx::ReferenceLinear(*x, *w);
  if (fast.ok() != reference.ok()) std::abort();
  if (!fast.ok()) return;
  // NVFP4's tensor scales and the lookup formats' scales come from the client here,
  // NaN payloads included; a NaN's payload is not part of the contract
  // (tests/same_bits.h).
  const bool client_nans = x->format == mx::Format::kNvfp4 || mx::Traits(x->format).is_lookup();
  const bool same = client_nans ? mx_test::SameBitsAll(*fast, *reference)
                                : Identical(*fast, *reference);
  if (!same) std::abort();
  // The FPGA kernel: any two NaNs are equal (the contract), the rest bit for bit.
  // LO_BCQ is not in it (the daemon's hls-sim and fpga backends refuse it).
  if (x->rows * x->cols > 4096 || x->format == mx::Format::kLoBcq) return;  // the PE array's C++ is slow; keep mutations fast
  std::vector<float> y(x->rows * w->rows);
  if (!fpga::RunKernelOnHost(fpga::ToDevice(*x), fpga::ToDevice(*w), {}, y).ok()) std::abort();
  if (!mx_test::SameBitsAll(y, *reference)) std::abort();
}

void Dense(uint8_t format_byte, const uint8_t* data, size_t size) {
  mxserve::v1::Tensor tensor;
  if (!tensor.ParseFromArray(data, static_cast<int>(size))) return;
  absl::StatusOr<mxserve::DenseMatrix> m = mxserve::DecodeMatrix(tensor, "x", {}, kMaxBytes);
  if (!m.ok()) return;
  const auto format = static_cast<mx::Format>(format_byte % mx::kFormatCount);
  for (mx::Rounding rounding : mx::kAllRoundings) {
    mx::QuantizeOptions options;
    options.rounding = rounding;
    options.seed = size;  // stochastic: any key; the fast path must draw the reference's bits
    absl::StatusOr<mx::QuantizedMatrix> fast = mxserve::QuantizeDense(*m, format, options);
    absl::StatusOr<mx::QuantizedMatrix> reference =
        mx::QuantizeRows(mxserve::ToFloat(*m), m->rows, m->cols, format, options);
    if (fast.ok() != reference.ok()) std::abort();
    if (fast.ok() && !SameBytes(*fast, *reference)) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  if (data[0] % 2 == 0) {
    Packed(data + 1, size - 1);
  } else {
    Dense(data[1], data + 2, size - 2);
  }
  return 0;
}
