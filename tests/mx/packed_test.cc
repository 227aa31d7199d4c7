// The packed layout: bit positions, sizes, orientation, and validation messages.
#include "mx/packed.h"

#include <gtest/gtest.h>

#include <array>
#include <random>

namespace {

using mx::Format;

TEST(Packed, BlockAndRowSizes) {
  EXPECT_EQ(mx::BlockBytes(Format::kMxfp4E2m1), 16);
  EXPECT_EQ(mx::BlockBytes(Format::kMxfp6E3m2), 24);
  EXPECT_EQ(mx::BlockBytes(Format::kMxfp6E2m3), 24);
  EXPECT_EQ(mx::BlockBytes(Format::kMxfp8E4m3), 32);
  EXPECT_EQ(mx::BlockBytes(Format::kMxint8), 32);
  EXPECT_EQ(mx::RowBytes(Format::kMxfp4E2m1, 100), 4 * 16);  // 100 → 4 blocks
  EXPECT_EQ(mx::RowBytes(Format::kMxfp6E2m3, 64), 48);
  EXPECT_EQ(mx::RowBytes(Format::kInt8, 100), 100);
  EXPECT_EQ(mx::RowBytes(Format::kBf16, 100), 200);
  EXPECT_EQ(mx::RowBytes(Format::kFp32, 100), 400);
}

// FP4: element 2i in the low nibble of byte i, 2i+1 in the high nibble.
TEST(Packed, Fp4PutsTwoElementsPerByteLowNibbleFirst) {
  std::array<uint8_t, 32> codes;
  for (int i = 0; i < 32; ++i) codes[i] = static_cast<uint8_t>(i % 16);
  std::array<uint8_t, 16> block;
  mx::PackBlock(Format::kMxfp4E2m1, codes, block.data());
  EXPECT_EQ(block[0], 0x10);
  EXPECT_EQ(block[1], 0x32);
  EXPECT_EQ(block[7], 0xFE);
  EXPECT_EQ(block[8], 0x10);
}

// FP6: four elements in three bytes, as the little-endian 24-bit word
// e0 | e1 << 6 | e2 << 12 | e3 << 18.
TEST(Packed, Fp6PutsFourElementsInThreeBytes) {
  std::array<uint8_t, 32> codes{};
  codes[0] = 0x3F;  // 111111
  codes[1] = 0x01;  // 000001
  codes[2] = 0x2A;  // 101010
  codes[3] = 0x15;  // 010101
  std::array<uint8_t, 24> block;
  mx::PackBlock(Format::kMxfp6E2m3, codes, block.data());
  const uint32_t word = 0x3Fu | 0x01u << 6 | 0x2Au << 12 | 0x15u << 18;
  EXPECT_EQ(block[0], word & 0xFF);
  EXPECT_EQ(block[1], (word >> 8) & 0xFF);
  EXPECT_EQ(block[2], word >> 16);
  for (int i = 3; i < 24; ++i) EXPECT_EQ(block[i], 0) << i;
}

TEST(Packed, PackUnpackRoundTripsRandomCodes) {
  std::mt19937 rng(3);
  for (Format format : {Format::kMxfp4E2m1, Format::kMxfp6E3m2, Format::kMxfp6E2m3,
                        Format::kMxfp8E4m3, Format::kMxfp8E5m2, Format::kMxint8}) {
    const int bits = mx::Traits(format).element_bits;
    for (int trial = 0; trial < 200; ++trial) {
      std::array<uint8_t, 32> codes, back;
      for (uint8_t& c : codes) c = static_cast<uint8_t>(rng() & ((1u << bits) - 1));
      std::vector<uint8_t> block(mx::BlockBytes(format));
      mx::PackBlock(format, codes, block.data());
      mx::UnpackBlock(format, block.data(), back);
      ASSERT_EQ(codes, back) << mx::FormatName(format);
    }
  }
}

TEST(Packed, QuantizeColumnsHoldsTheTranspose) {
  std::mt19937 rng(4);
  std::normal_distribution<float> normal;
  const int64_t k = 70, n = 5;
  std::vector<float> b(k * n), bt(n * k);
  for (float& v : b) v = normal(rng);
  for (int64_t i = 0; i < k; ++i)
    for (int64_t j = 0; j < n; ++j) bt[j * k + i] = b[i * n + j];
  for (Format format : {Format::kMxfp6E3m2, Format::kInt8, Format::kBf16}) {
    const auto by_columns = mx::QuantizeColumns(b, k, n, format).value();
    const auto by_rows = mx::QuantizeRows(bt, n, k, format).value();
    EXPECT_EQ(by_columns.rows, n);
    EXPECT_EQ(by_columns.cols, k);
    EXPECT_EQ(by_columns.elements, by_rows.elements);
    EXPECT_EQ(by_columns.block_scales, by_rows.block_scales);
    EXPECT_EQ(by_columns.row_scales, by_rows.row_scales);
  }
}

TEST(Packed, FloatFormatsStoreTheirLittleEndianCodes) {
  const std::vector<float> x = {1.0f, -2.5f};
  const auto bf16 = mx::QuantizeRows(x, 1, 2, Format::kBf16).value();
  EXPECT_EQ(bf16.elements, (std::vector<uint8_t>{0x80, 0x3F, 0x20, 0xC0}));
  const auto fp16 = mx::QuantizeRows(x, 1, 2, Format::kFp16).value();
  EXPECT_EQ(fp16.elements, (std::vector<uint8_t>{0x00, 0x3C, 0x00, 0xC1}));
  EXPECT_EQ(mx::Dequantize(fp16), x);
  EXPECT_EQ(mx::Dequantize(mx::QuantizeRows(x, 1, 2, Format::kFp32).value()), x);
}

TEST(Packed, ShapeErrorsNameTheFieldAndTheExpectation) {
  const std::vector<float> x(10);
  const auto wrong = mx::QuantizeRows(x, 3, 4, Format::kMxfp8E4m3);
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(wrong.status().message(), "values: expected 3x4 = 12 values, got 10");
  EXPECT_FALSE(mx::QuantizeRows(x, -1, 4, Format::kMxfp8E4m3).ok());

  mx::QuantizedMatrix m =
      mx::QuantizeRows(std::vector<float>(64), 2, 32, Format::kMxfp4E2m1).value();
  EXPECT_TRUE(mx::ValidateLayout(m).ok());
  m.elements.pop_back();
  EXPECT_EQ(mx::ValidateLayout(m).message(),
            "elements (bytes): expected 32 for a 2x32 MXFP4_E2M1 matrix, got 31");
  m.elements.push_back(0);
  m.block_scales.push_back(0);
  EXPECT_EQ(mx::ValidateLayout(m).message(),
            "block_scales (bytes): expected 2 for a 2x32 MXFP4_E2M1 matrix, got 3");
}

TEST(StackRows, EachRowKeepsTheBitsItHadAlone) {
  // Rows are quantized independently, so a batch's stacked input is bit for bit
  // the quantization of the stacked FP32 rows, in every format — NVFP4's under
  // the tensor scale each part had alone, which its rows keep.
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  constexpr int64_t kCols = 70;  // a partial last block
  std::vector<float> a(2 * kCols), b(3 * kCols);
  for (float& v : a) v = normal(rng);
  for (float& v : b) v = normal(rng);
  std::vector<float> both = a;
  both.insert(both.end(), b.begin(), b.end());
  for (const mx::FormatTraits& traits : mx::AllFormats()) {
    const Format f = traits.format;
    SCOPED_TRACE(traits.name);
    const std::vector<mx::QuantizedMatrix> parts = {mx::QuantizeRows(a, 2, kCols, f).value(),
                                                    mx::QuantizeRows(b, 3, kCols, f).value()};
    const mx::QuantizedMatrix stacked = mx::StackRows(parts).value();
    mx::QuantizedMatrix whole = mx::QuantizeRows(both, 5, kCols, f).value();
    if (f == Format::kNvfp4) {
      // Each part is a tensor of its own: the whole with each part's scale.
      mx::QuantizeOptions options;
      options.tensor_scale = parts[0].row_scales[0];
      const auto first = mx::QuantizeRows(a, 2, kCols, f, options).value();
      options.tensor_scale = parts[1].row_scales[0];
      const auto second = mx::QuantizeRows(b, 3, kCols, f, options).value();
      ASSERT_NE(parts[0].row_scales[0], parts[1].row_scales[0]);
      whole = mx::StackRows(std::vector<mx::QuantizedMatrix>{first, second}).value();
      EXPECT_EQ(stacked.row_scales, (std::vector<float>{parts[0].row_scales[0],
                                                        parts[0].row_scales[0],
                                                        parts[1].row_scales[0],
                                                        parts[1].row_scales[0],
                                                        parts[1].row_scales[0]}));
    }
    EXPECT_EQ(stacked.rows, 5);
    EXPECT_EQ(stacked.cols, kCols);
    EXPECT_EQ(stacked.elements, whole.elements);
    EXPECT_EQ(stacked.block_scales, whole.block_scales);
    EXPECT_EQ(stacked.row_scales, whole.row_scales);
    EXPECT_TRUE(mx::ValidateLayout(stacked).ok());
  }
}

TEST(StackRows, RefusesPartsThatDoNotAgree) {
  const std::vector<float> row(32, 1.0f);
  const std::vector<mx::QuantizedMatrix> formats = {
      mx::QuantizeRows(row, 1, 32, Format::kMxfp8E4m3).value(),
      mx::QuantizeRows(row, 1, 32, Format::kMxfp4E2m1).value()};
  EXPECT_EQ(mx::StackRows(formats).status().message(),
            "StackRows: a MXFP4_E2M1 part of 32 columns among MXFP8_E4M3 parts of 32");
  const std::vector<float> wide(64, 1.0f);
  const std::vector<mx::QuantizedMatrix> widths = {
      mx::QuantizeRows(row, 1, 32, Format::kInt8).value(),
      mx::QuantizeRows(wide, 1, 64, Format::kInt8).value()};
  EXPECT_EQ(mx::StackRows(widths).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(mx::StackRows({}).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
