// Operand decoding without a daemon: what DecodeMatrix and DecodePacked accept,
// the exact INVALID_ARGUMENT each refusal gives (field first), and that what
// they accept reaches the mx/ library bit for bit.
#include "server/compute/wire.h"

#include <gtest/gtest.h>

#include <bit>
#include <cstring>
#include <vector>

#include "mx/element.h"
#include "mx/kernels/quantize_fast.h"
#include "proto/convert/enums.h"

namespace mxserve {
namespace {

constexpr int64_t kMaxBytes = 64 << 20;

v1::Tensor Tensor(std::vector<int64_t> shape, v1::DType dtype, std::string data) {
  v1::Tensor t;
  for (int64_t d : shape) t.add_shape(d);
  t.set_dtype(dtype);
  t.set_data(std::move(data));
  return t;
}

std::string Bytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

ExpectedShape Layer(int64_t in_features) {
  ExpectedShape e;
  e.cols = in_features;
  e.cols_what = "in_features of layer 'fc'";
  return e;
}

std::string Message(const absl::Status& s) {
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  return std::string(s.message());
}

TEST(Wire, DenseFp32AndBf16ReachTheQuantizerBitForBit) {
  const std::vector<float> values = {1.0f, -2.5f, 3.25f, 1e-3f, -0.0f, 448.0f};
  const v1::Tensor fp32 = Tensor({2, 3}, v1::DTYPE_FP32, Bytes(values));
  const DenseMatrix m = DecodeMatrix(fp32, "input", Layer(3), kMaxBytes).value();
  EXPECT_EQ(m.rows, 2);
  EXPECT_EQ(m.cols, 3);
  EXPECT_EQ(m.dtype, mx::Format::kFp32);
  const std::vector<float> widened = ToFloat(m);
  ASSERT_EQ(widened.size(), values.size());
  EXPECT_EQ(std::memcmp(widened.data(), values.data(), values.size() * 4), 0);

  // BF16 codes widen exactly, and quantizing them is quantizing their values.
  std::vector<uint16_t> codes;
  for (float v : values) codes.push_back(static_cast<uint16_t>(std::bit_cast<uint32_t>(v) >> 16));
  const v1::Tensor bf16 =
      Tensor({2, 3}, v1::DTYPE_BF16, std::string(reinterpret_cast<const char*>(codes.data()), 12));
  const DenseMatrix h = DecodeMatrix(bf16, "input", Layer(3), kMaxBytes).value();
  EXPECT_EQ(h.dtype, mx::Format::kBf16);
  const std::vector<float> from_codes = ToFloat(h);
  for (size_t i = 0; i < codes.size(); ++i) EXPECT_EQ(from_codes[i], mx::Bf16ToFloat(codes[i]));
  for (mx::Format f : {mx::Format::kMxfp4E2m1, mx::Format::kMxint8, mx::Format::kInt8}) {
    const mx::QuantizedMatrix q = QuantizeDense(h, f, {}).value();
    const mx::QuantizedMatrix want = mx::QuantizeRows(from_codes, 2, 3, f).value();
    EXPECT_EQ(q.elements, want.elements) << mx::FormatName(f);
    EXPECT_EQ(q.block_scales, want.block_scales) << mx::FormatName(f);
    EXPECT_EQ(q.row_scales, want.row_scales) << mx::FormatName(f);
  }
}

TEST(Wire, DenseRefusalsNameTheFieldAndWhatWasExpected) {
  const std::string six = Bytes(std::vector<float>(6, 1.0f));
  EXPECT_EQ(
      Message(
          DecodeMatrix(Tensor({6}, v1::DTYPE_FP32, six), "input", Layer(3), kMaxBytes).status()),
      "input.shape: expected a matrix [M, 3], got [6]");
  EXPECT_EQ(
      Message(
          DecodeMatrix(Tensor({3, 2}, v1::DTYPE_FP32, six), "input", Layer(3), kMaxBytes).status()),
      "input.shape: expected [M, 3] (columns: in_features of layer 'fc'), got [3, 2]");
  EXPECT_EQ(
      Message(
          DecodeMatrix(Tensor({0, 3}, v1::DTYPE_FP32, ""), "input", Layer(3), kMaxBytes).status()),
      "input.shape: dimensions must be in [1, 2^31], got [0, 3]");
  EXPECT_EQ(Message(DecodeMatrix(Tensor({2, 3}, v1::DTYPE_FP32, six.substr(4)), "input", Layer(3),
                                 kMaxBytes)
                        .status()),
            "input.data: expected 24 bytes (2 x 3 FP32), got 20");
  EXPECT_EQ(
      Message(DecodeMatrix(Tensor({2, 3}, v1::DTYPE_UNSPECIFIED, six), "input", Layer(3), kMaxBytes)
                  .status()),
      "input.dtype: expected DTYPE_FP32, DTYPE_BF16 or DTYPE_FP16, got DTYPE_UNSPECIFIED");
  // A shape whose bytes exceed one message is refused from the shape alone.
  EXPECT_EQ(Message(DecodeMatrix(Tensor({int64_t{1} << 31, 3}, v1::DTYPE_FP32, ""), "input",
                                 Layer(3), kMaxBytes)
                        .status()),
            "input.shape: a 2147483648 x 3 FP32 operand takes 25769803776 bytes, more than one "
            "message may carry (67108864 bytes, --max-message-bytes)");
}

TEST(Wire, PackedOperandsAreCheckedBufferByBuffer) {
  std::vector<float> values(2 * 40);
  for (size_t i = 0; i < values.size(); ++i) values[i] = 0.25f * static_cast<float>(i) - 7.0f;
  const mx::QuantizedMatrix q = mx::QuantizeRows(values, 2, 40, mx::Format::kMxfp4E2m1).value();
  v1::PackedOperand p;
  p.set_format(v1::FORMAT_MXFP4_E2M1);
  p.set_rows(2);
  p.set_cols(40);
  p.set_elements(std::string(q.elements.begin(), q.elements.end()));
  p.set_block_scales(std::string(q.block_scales.begin(), q.block_scales.end()));
  const mx::QuantizedMatrix back = DecodePacked(p, "b.packed", Layer(40), kMaxBytes).value();
  EXPECT_EQ(back.elements, q.elements);
  EXPECT_EQ(back.block_scales, q.block_scales);
  EXPECT_TRUE(mx::ValidateLayout(back).ok());

  v1::PackedOperand bad = p;
  bad.set_cols(41);
  EXPECT_EQ(Message(DecodePacked(bad, "b.packed", Layer(40), kMaxBytes).status()),
            "b.packed.cols: expected 40 cols (in_features of layer 'fc'), got 41");
  bad = p;
  bad.mutable_elements()->pop_back();
  EXPECT_EQ(Message(DecodePacked(bad, "b.packed", Layer(40), kMaxBytes).status()),
            "b.packed.elements: expected 64 bytes (2 rows of 32 bytes in MXFP4_E2M1), got 63");
  bad = p;
  bad.set_block_scales("x");
  EXPECT_EQ(Message(DecodePacked(bad, "b.packed", Layer(40), kMaxBytes).status()),
            "b.packed.block_scales: expected 4 bytes (2 rows x 2 blocks), got 1");
  bad = p;
  bad.clear_format();
  EXPECT_EQ(Message(DecodePacked(bad, "b.packed", Layer(40), kMaxBytes).status()),
            "b.packed.format: required for a packed operand");

  // INT8 carries one FP32 scale per row and no block scales.
  const mx::QuantizedMatrix i8 = mx::QuantizeRows(values, 2, 40, mx::Format::kInt8).value();
  v1::PackedOperand int8;
  int8.set_format(v1::FORMAT_INT8);
  int8.set_rows(2);
  int8.set_cols(40);
  int8.set_elements(std::string(i8.elements.begin(), i8.elements.end()));
  int8.add_row_scales(i8.row_scales[0]);
  EXPECT_EQ(Message(DecodePacked(int8, "a.packed", {}, kMaxBytes).status()),
            "a.packed.row_scales: expected 2 values (one per row), got 1");
  int8.add_row_scales(i8.row_scales[1]);
  int8.set_block_scales("\x7f");
  EXPECT_EQ(Message(DecodePacked(int8, "a.packed", {}, kMaxBytes).status()),
            "a.packed.block_scales: must be empty for INT8");
  int8.clear_block_scales();
  EXPECT_EQ(DecodePacked(int8, "a.packed", {}, kMaxBytes)->row_scales, i8.row_scales);
}

TEST(Wire, EnumsOutsideTheirRangeAreRefusedByName) {
  EXPECT_EQ(Message(FromProto(v1::PHASE_UNSPECIFIED, "phase").status()),
            "phase: required; expected PHASE_ROLLOUT, PHASE_REWARD or PHASE_UPDATE");
  EXPECT_EQ(Message(FromProto(static_cast<v1::Phase>(9), "phase").status()),
            "phase: unknown phase value 9; expected PHASE_ROLLOUT, PHASE_REWARD or PHASE_UPDATE");
  EXPECT_EQ(Message(FromProto(static_cast<v1::Rounding>(7), "rounding").status()),
            "rounding: unknown rounding value 7; expected ROUNDING_NEAREST_EVEN, "
            "ROUNDING_NEAREST_AWAY or ROUNDING_STOCHASTIC");
  for (Phase phase : kAllPhases) EXPECT_EQ(FromProto(ToProto(phase), "phase").value(), phase);
}

// The daemon labels its metrics with its own phase names; the client and the
// tests read them through proto/convert's names of the wire phases.
TEST(Wire, WirePhaseNamesAreTheDaemonsLabels) {
  for (Phase phase : kAllPhases) {
    EXPECT_EQ(WireName(ToProto(phase)), std::string(PhaseName(phase)));
  }
  EXPECT_EQ(WireName(v1::PHASE_UNSPECIFIED), "unspecified");
  EXPECT_EQ(WireName(static_cast<v1::Phase>(9)), "phase#9");
}

TEST(Wire, NarrowToBf16RoundsToNearestEvenInPlace) {
  // 1; 1 + 2^-8 (a tie: down to even); 1 + 3·2^-8 (a tie: up to even); just
  // above a tie (up); -0; the largest float (rounds up to Inf); a NaN.
  const std::vector<uint32_t> in = {0x3f800000, 0x3f808000, 0x3f818000, 0x3f808001,
                                    0x80000000, 0x7f7fffff, 0x7fc00001};
  const std::vector<uint16_t> want = {0x3f80, 0x3f80, 0x3f82, 0x3f81, 0x8000, 0x7f80, 0};
  v1::Tensor tensor;
  tensor.set_dtype(v1::DTYPE_FP32);
  tensor.add_shape(1);
  tensor.add_shape(static_cast<int64_t>(in.size()));
  tensor.mutable_data()->assign(reinterpret_cast<const char*>(in.data()), in.size() * 4);
  NarrowToBf16(&tensor);
  EXPECT_EQ(tensor.dtype(), v1::DTYPE_BF16);
  ASSERT_EQ(tensor.data().size(), in.size() * 2);
  std::vector<uint16_t> got(in.size());
  std::memcpy(got.data(), tensor.data().data(), tensor.data().size());
  for (size_t i = 0; i + 1 < in.size(); ++i) EXPECT_EQ(got[i], want[i]) << i;
  EXPECT_EQ(got.back() & 0x7f80, 0x7f80);  // a NaN stays a NaN
  EXPECT_NE(got.back() & 0x007f, 0);
  NarrowToBf16(&tensor);  // not FP32 any more: left alone
  EXPECT_EQ(tensor.data().size(), in.size() * 2);
}

}  // namespace
}  // namespace mxserve
