#include "mx/reference_gemm.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "mx/element.h"

namespace mx {
namespace {

// One MX operand decoded for the exact dot: each element as an integer in units
// of its format's smallest step 2^-F, and per block whether it holds a NaN/Inf code
// (only possible in operands a client packed itself).
struct FixedPointOperand {
  int fraction_bits;
  int64_t blocks_per_row;
  std::vector<int64_t> elements;     // rows × blocks_per_row·32
  std::vector<uint8_t> has_special;  // rows × blocks_per_row
};

FixedPointOperand DecodeFixedPoint(const QuantizedMatrix& m) {
  FixedPointOperand out{FixedPointFractionBits(m.format), BlocksPerRow(m.cols), {}, {}};
  out.elements.resize(m.rows * out.blocks_per_row * kBlockSize);
  out.has_special.resize(m.rows * out.blocks_per_row);
  const int64_t row_bytes = RowBytes(m.format, m.cols);
  std::array<uint8_t, kBlockSize> codes;
  for (int64_t r = 0; r < m.rows; ++r) {
    for (int64_t b = 0; b < out.blocks_per_row; ++b) {
      UnpackBlock(m.format, m.elements.data() + r * row_bytes + b * BlockBytes(m.format), codes);
      const int64_t block = r * out.blocks_per_row + b;
      for (int i = 0; i < kBlockSize; ++i) {
        out.elements[block * kBlockSize + i] = ElementToFixed(m.format, codes[i]);
        out.has_special[block] |= IsSpecialCode(m.format, codes[i]);
      }
    }
  }
  return out;
}

// A block whose elements hold Inf or NaN: IEEE arithmetic on the decoded values
// gives the non-finite result (NaN, or ±Inf when only infinities of one sign meet
// non-zero finite values). Every code of the block counts, a short last block's
// padding included, as in the exact dot: each Inf/NaN code makes its product
// non-finite, so the sum is always the non-finite one IEEE gives (a bound at K
// would leave a padding-only Inf/NaN block to a finite, twice-rounded sum).
float NonFiniteBlockDot(const QuantizedMatrix& x, int64_t row_x, const QuantizedMatrix& w,
                        int64_t row_w, int64_t block) {
  double sum = 0.0;
  for (int64_t c = block * kBlockSize; c < (block + 1) * kBlockSize; ++c) {
    sum += double{DecodeElement(x.format, ElementCode(x, row_x, c))} *
           double{DecodeElement(w.format, ElementCode(w, row_w, c))};
  }
  return static_cast<float>(sum);
}

void LinearMxBlocks(const QuantizedMatrix& x, const QuantizedMatrix& w, std::span<const float> bias,
                    std::vector<float>& y) {
  const FixedPointOperand fx = DecodeFixedPoint(x);
  const FixedPointOperand fw = DecodeFixedPoint(w);
  const int64_t blocks = fx.blocks_per_row;
  for (int64_t i = 0; i < x.rows; ++i) {
    for (int64_t j = 0; j < w.rows; ++j) {
      float sum = bias.empty() ? 0.0f : bias[j];
      for (int64_t b = 0; b < blocks; ++b) {
        const uint8_t scale_x = x.block_scales[i * blocks + b];
        const uint8_t scale_w = w.block_scales[j * blocks + b];
        float block_result;
        if (scale_x == kScaleNan || scale_w == kScaleNan) {
          block_result = std::numeric_limits<float>::quiet_NaN();
        } else if (fx.has_special[i * blocks + b] || fw.has_special[j * blocks + b]) {
          block_result = NonFiniteBlockDot(x, i, w, j, b);
        } else {
          // Exact dot product. Each element is an integer below 2^32 in magnitude
          // (E5M2: 57344 · 2^16 < 2^32; every other format is smaller), so each
          // product is below 2^64 and the sum of 32 below 2^69: a signed 128-bit
          // accumulator holds every format pair, E5M2 × E5M2 included, exactly.
          const int64_t* ex = &fx.elements[(i * blocks + b) * kBlockSize];
          const int64_t* ew = &fw.elements[(j * blocks + b) * kBlockSize];
          __int128 dot = 0;
          for (int t = 0; t < kBlockSize; ++t) dot += static_cast<__int128>(ex[t]) * ew[t];
          const int exponent =
              (scale_x - kScaleBias) + (scale_w - kScaleBias) - fx.fraction_bits - fw.fraction_bits;
          block_result = RoundScaledToFloat(dot, exponent);
        }
        sum += block_result;  // FP32, ascending b: the order is part of the contract
      }
      y[i * w.rows + j] = sum;
    }
  }
}

void LinearInt8(const QuantizedMatrix& x, const QuantizedMatrix& w, std::span<const float> bias,
                std::vector<float>& y) {
  const auto code = [](const QuantizedMatrix& m, int64_t r, int64_t c) {
    return int64_t{static_cast<int8_t>(m.elements[r * m.cols + c])};
  };
  for (int64_t i = 0; i < x.rows; ++i) {
    for (int64_t j = 0; j < w.rows; ++j) {
      int64_t dot = 0;
      for (int64_t c = 0; c < x.cols; ++c) dot += code(x, i, c) * code(w, j, c);
      float v = static_cast<float>(dot) * x.row_scales[i] * w.row_scales[j];
      if (!bias.empty()) v += bias[j];
      y[i * w.rows + j] = v;
    }
  }
}

// NVFP4 × NVFP4: per 16-block the exact dot of the E2M1 elements times both
// UE4M3 scales — exact in FP32 (below 2^12 in units of 2^-2, times two 4-bit
// significands), so the block result needs no rounding of its own — summed in
// FP32 in ascending block order from +0.0; then times fp32(ts_x · ts_w) and
// plus the bias, one rounding each (torchao's order: the tensor scales are
// applied to the product, the bias after them).
void LinearNvBlocks(const QuantizedMatrix& x, const QuantizedMatrix& w,
                    std::span<const float> bias, std::vector<float>& y) {
  const int64_t blocks = BlocksPerRow(Format::kNvfp4, x.cols);
  // Every code of the padded row, as for MX: a client may pack non-zero codes
  // into a short last block's padding, and they count.
  const auto fixed = [](const QuantizedMatrix& m, int64_t r, int64_t c) -> int32_t {
    return static_cast<int32_t>(ElementToFixed(Format::kNvfp4, ElementCode(m, r, c)));
  };
  const auto scale = [&](const QuantizedMatrix& m, int64_t r, int64_t b) {
    return NvScaleValue(m.block_scales[r * blocks + b]);
  };
  for (int64_t i = 0; i < x.rows; ++i) {
    for (int64_t j = 0; j < w.rows; ++j) {
      float sum = 0.0f;
      for (int64_t b = 0; b < blocks; ++b) {
        int32_t dot = 0;  // units of 2^-2: |dot| <= 16 · 12 · 12
        for (int64_t c = b * kNvBlockSize; c < (b + 1) * kNvBlockSize; ++c) {
          dot += fixed(x, i, c) * fixed(w, j, c);
        }
        sum += static_cast<float>(dot) * 0.25f * scale(x, i, b) * scale(w, j, b);
      }
      float v = sum * (x.row_scales[i] * w.row_scales[j]);
      if (!bias.empty()) v += bias[j];
      y[i * w.rows + j] = v;
    }
  }
}

void LinearFloat(const QuantizedMatrix& x, const QuantizedMatrix& w, std::span<const float> bias,
                 std::vector<float>& y) {
  const std::vector<float> xf = Dequantize(x);
  const std::vector<float> wf = Dequantize(w);
  const int64_t k = x.cols;
  for (int64_t i = 0; i < x.rows; ++i) {
    for (int64_t j = 0; j < w.rows; ++j) {
      float sum = bias.empty() ? 0.0f : bias[j];
      for (int64_t c = 0; c < k; ++c) sum = std::fma(xf[i * k + c], wf[j * k + c], sum);
      y[i * w.rows + j] = sum;
    }
  }
}

}  // namespace

GemmPath GemmPathFor(Format x, Format w) {
  if (IsMx(x) && IsMx(w)) return GemmPath::kMxBlocks;
  if (x == Format::kNvfp4 && w == Format::kNvfp4) return GemmPath::kNvBlocks;
  if (x == Format::kInt8 && w == Format::kInt8) return GemmPath::kInt8;
  return GemmPath::kFloat;
}

float RoundScaledToFloat(__int128 value, int exponent) {
  if (value == 0) return 0.0f;
  const bool negative = value < 0;
  using U128 = unsigned __int128;
  const U128 magnitude = negative ? U128{0} - static_cast<U128>(value) : static_cast<U128>(value);
  const uint64_t high = static_cast<uint64_t>(magnitude >> 64);
  const int leading_bit = high != 0 ? 127 - std::countl_zero(high)
                                    : 63 - std::countl_zero(static_cast<uint64_t>(magnitude));
  const int value_exponent = leading_bit + exponent;  // floor(log2 |value · 2^exponent|)
  const float inf = std::numeric_limits<float>::infinity();
  if (value_exponent > 127) return negative ? -inf : inf;
  // The result's step: 24 significant bits, but never below the subnormal step 2^-149.
  const int step_exponent = std::max(value_exponent - 23, -149);
  const int shift = step_exponent - exponent;
  U128 q;
  if (shift <= 0) {
    q = magnitude << -shift;  // exact, fewer than 24 bits
  } else if (shift > 127) {
    q = (shift == 128 && magnitude > (U128{1} << 127)) ? 1 : 0;
  } else {
    q = magnitude >> shift;
    const U128 remainder = magnitude & ((U128{1} << shift) - 1);
    const U128 half = U128{1} << (shift - 1);
    if (remainder > half || (remainder == half && (q & 1))) ++q;
  }
  // q <= 2^24 is exact in FP32; scaling by a power of two is exact unless it
  // overflows, and then Inf is the correctly rounded result.
  const float result = std::ldexp(static_cast<float>(q), step_exponent);
  return negative ? -result : result;
}

absl::StatusOr<std::vector<float>> ReferenceLinear(const QuantizedMatrix& x,
                                                   const QuantizedMatrix& w,
                                                   std::span<const float> bias) {
  if (absl::Status s = ValidateLayout(x); !s.ok())
    return absl::InvalidArgumentError(absl::StrCat("x ", s.message()));
  if (absl::Status s = ValidateLayout(w); !s.ok())
    return absl::InvalidArgumentError(absl::StrCat("w ", s.message()));
  if (x.cols != w.cols) {
    return absl::InvalidArgumentError(
        absl::StrCat("w: expected K = ", x.cols, " columns to match x, got ", w.cols));
  }
  if (!bias.empty() && static_cast<int64_t>(bias.size()) != w.rows) {
    return absl::InvalidArgumentError(
        absl::StrCat("bias: expected ", w.rows, " values (one per row of w), got ", bias.size()));
  }
  std::vector<float> y(x.rows * w.rows);
  switch (GemmPathFor(x.format, w.format)) {
    case GemmPath::kMxBlocks:
      LinearMxBlocks(x, w, bias, y);
      break;
    case GemmPath::kNvBlocks:
      LinearNvBlocks(x, w, bias, y);
      break;
    case GemmPath::kInt8:
      LinearInt8(x, w, bias, y);
      break;
    case GemmPath::kFloat:
      LinearFloat(x, w, bias, y);
      break;
  }
  return y;
}

absl::StatusOr<std::vector<float>> ReferenceGemm(std::span<const float> a, Format format_a,
                                                 std::span<const float> b, Format format_b,
                                                 int64_t m, int64_t k, int64_t n,
                                                 const QuantizeOptions& options) {
  absl::StatusOr<QuantizedMatrix> qa =
      QuantizeRows(a, m, k, format_a, ForStream(options, OperandStream::kGemmA));
  if (!qa.ok()) return absl::InvalidArgumentError(absl::StrCat("a ", qa.status().message()));
  absl::StatusOr<QuantizedMatrix> qb =
      QuantizeColumns(b, k, n, format_b, ForStream(options, OperandStream::kGemmB));
  if (!qb.ok()) return absl::InvalidArgumentError(absl::StrCat("b ", qb.status().message()));
  return ReferenceLinear(*qa, *qb);
}

std::vector<float> ColumnSums(std::span<const float> dy, int64_t rows, int64_t cols) {
  std::vector<float> sums(static_cast<size_t>(cols), 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) sums[c] += dy[r * cols + c];
  }
  return sums;
}

}  // namespace mx
