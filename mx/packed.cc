#include "mx/packed.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "mx/checked_math.h"
#include "mx/codebook.h"
#include "mx/lobcq.h"
#include "mx/element.h"
#include "mx/stochastic.h"

namespace mx {
namespace {

// Largest rows or cols accepted: keeps every byte count well inside int64.

// Reads `bits` (<= 8) bits starting at bit `position` of a little-endian bit string.
uint32_t ReadBits(const uint8_t* data, int64_t position, int bits) {
  const uint8_t* p = data + position / 8;
  const int offset = static_cast<int>(position % 8);
  uint32_t word = p[0];
  if (offset + bits > 8) word |= uint32_t{p[1]} << 8;
  return (word >> offset) & ((1u << bits) - 1);
}

// Where one row's elements draw their stochastic-rounding bits: element c draws
// index first + c · step (QuantizeOptions). Inactive for the other roundings.
struct RowDraws {
  const StochasticBits* bits = nullptr;  // null: not stochastic
  uint64_t first = 0;
  uint64_t step = 1;

  uint32_t operator()(size_t c) const { return (*bits)(first + c * step); }
};

void QuantizeRowMx(std::span<const float> row, Format format, const QuantizeOptions& options,
                   const RowDraws& draws, uint8_t* elements, uint8_t* scales) {
  const int64_t blocks = BlocksPerRow(static_cast<int64_t>(row.size()));
  std::array<uint32_t, kBlockSize> random{};
  for (int64_t b = 0; b < blocks; ++b) {
    const size_t begin = static_cast<size_t>(b) * kBlockSize;
    const size_t count = std::min<size_t>(kBlockSize, row.size() - begin);
    std::array<uint8_t, kBlockSize> codes{};  // the padding of a short block stays code 0
    std::span<const uint32_t> block_random;
    if (draws.bits != nullptr) {
      for (size_t i = 0; i < count; ++i) random[i] = draws(begin + i);
      block_random = std::span<const uint32_t>(random.data(), count);
    }
    scales[b] = QuantizeBlock(format, row.subspan(begin, count),
                              std::span<uint8_t>(codes.data(), count), options, block_random);
    PackBlock(format, codes, elements + b * BlockBytes(format));
  }
}

// INT8: scale = amax / 127 in FP32, code = round(v / scale) clamped to ±127.
float QuantizeRowInt8(std::span<const float> row, const QuantizeOptions& options,
                      const RowDraws& draws, uint8_t* elements) {
  float amax = 0.0f;
  for (float v : row) {
    if (!std::isfinite(v)) {
      std::fill(elements, elements + row.size(), 0);
      return std::numeric_limits<float>::quiet_NaN();
    }
    amax = std::max(amax, std::fabs(v));
  }
  if (amax == 0.0f) {
    std::fill(elements, elements + row.size(), 0);
    return 0.0f;
  }
  const float scale = amax / 127.0f;
  for (size_t i = 0; i < row.size(); ++i) {
    elements[i] = static_cast<uint8_t>(EncodeElement(Format::kInt8, row[i] / scale,
                                                     options.rounding, 0,
                                                     draws.bits != nullptr ? draws(i) : 0));
  }
  return scale;
}

// Codes (4 bits each, an even count) two to a byte, low nibble first: NVFP4's,
// the codebooks' and LO_BCQ's elements, and LO_BCQ's selectors.
void PackNibbles(std::span<const uint8_t> codes, uint8_t* out) {
  for (size_t i = 0; i < codes.size() / 2; ++i) {
    out[i] = static_cast<uint8_t>(codes[2 * i] | (codes[2 * i + 1] << 4));
  }
}

// A codebook row: blocks of 64 (the last padded with the code of 0), codes
// nibble-packed low nibble first, each block's absmax as 4 little-endian bytes.
void QuantizeRowCodebook(std::span<const float> row, Format format, uint8_t* elements,
                         uint8_t* scales) {
  const int64_t blocks = BlocksPerRow(format, static_cast<int64_t>(row.size()));
  for (int64_t b = 0; b < blocks; ++b) {
    const size_t begin = static_cast<size_t>(b) * kCodebookBlockSize;
    const size_t count = std::min<size_t>(kCodebookBlockSize, row.size() - begin);
    std::array<uint8_t, kCodebookBlockSize> codes;
    codes.fill(CodebookZeroCode(format));
    const float absmax = QuantizeCodebookBlock(format, row.subspan(begin, count),
                                               std::span<uint8_t>(codes.data(), count));
    std::memcpy(scales + 4 * b, &absmax, 4);  // little-endian host
    PackNibbles(codes, elements + b * BlockBytes(format));
  }
}

// A LO_BCQ row: arrays of 64 (the last padded with code 0), codes nibble-packed
// low nibble first; each array's FP32 scale (4 little-endian bytes) then its 8
// selectors, nibble-packed low first.
void QuantizeRowLoBcq(std::span<const float> row, uint8_t* elements, uint8_t* scales) {
  const LoBcqGeometry geometry;
  const int64_t arrays = BlocksPerRow(Format::kLoBcq, static_cast<int64_t>(row.size()));
  for (int64_t a = 0; a < arrays; ++a) {
    const size_t begin = static_cast<size_t>(a) * kLoBcqArraySize;
    const size_t count = std::min<size_t>(kLoBcqArraySize, row.size() - begin);
    std::array<uint8_t, kLoBcqArraySize> codes{};
    std::array<uint8_t, kLoBcqArraySize / kLoBcqBlockLen> selectors{};
    // The format's own geometry and frozen codebooks: always valid.
    const float scale =
        *QuantizeLoBcqArray(geometry, DefaultLoBcqCodebooks(), row.subspan(begin, count),
                            std::span<uint8_t>(codes.data(), count), selectors);
    std::memcpy(scales + 8 * a, &scale, 4);  // little-endian host
    PackNibbles(selectors, scales + 8 * a + 4);
    PackNibbles(codes, elements + a * BlockBytes(Format::kLoBcq));
  }
}

// NVFP4: 16-element blocks under the tensor scale, codes nibble-packed.
void QuantizeRowNv(std::span<const float> row, float tensor_scale, const QuantizeOptions& options,
                   const RowDraws& draws, uint8_t* elements, uint8_t* scales) {
  const int64_t blocks = BlocksPerRow(Format::kNvfp4, static_cast<int64_t>(row.size()));
  std::array<uint32_t, kNvBlockSize> random{};
  for (int64_t b = 0; b < blocks; ++b) {
    const size_t begin = static_cast<size_t>(b) * kNvBlockSize;
    const size_t count = std::min<size_t>(kNvBlockSize, row.size() - begin);
    std::array<uint8_t, kNvBlockSize> codes{};
    std::span<const uint32_t> block_random;
    if (draws.bits != nullptr) {
      for (size_t i = 0; i < count; ++i) random[i] = draws(begin + i);
      block_random = std::span<const uint32_t>(random.data(), count);
    }
    scales[b] = QuantizeNvBlock(row.subspan(begin, count), tensor_scale,
                                std::span<uint8_t>(codes.data(), count), options, block_random);
    PackNibbles(codes, elements + b * BlockBytes(Format::kNvfp4));
  }
}

void StoreFloats(std::span<const float> row, Format format, uint8_t* elements) {
  for (size_t i = 0; i < row.size(); ++i) {
    if (format == Format::kFp32) {
      std::memcpy(elements + 4 * i, &row[i], 4);
    } else {
      const uint16_t code = format == Format::kBf16 ? FloatToBf16(row[i]) : FloatToFp16(row[i]);
      elements[2 * i] = static_cast<uint8_t>(code);
      elements[2 * i + 1] = static_cast<uint8_t>(code >> 8);
    }
  }
}

}  // namespace

absl::Status ValidateShape(size_t value_count, int64_t rows, int64_t cols, const char* what) {
  if (rows < 0 || cols < 0 || rows > kMaxDimension || cols > kMaxDimension) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": dimensions must be in [0, 2^31], got ", rows, "x", cols));
  }
  if (CheckedMul(static_cast<uint64_t>(rows), static_cast<uint64_t>(cols)) != value_count) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": expected ", rows, "x", cols, " = ",
                                                   rows * cols, " values, got ", value_count));
  }
  return absl::OkStatus();
}

QuantizedMatrix AllocateQuantized(Format format, int64_t rows, int64_t cols) {
  QuantizedMatrix m;
  m.format = format;
  m.rows = rows;
  m.cols = cols;
  m.elements.resize(rows * RowBytes(format, cols));
  if (IsBlockScaled(format)) m.block_scales.resize(rows * ScaleBytesPerRow(format, cols));
  if (HasRowScales(format)) m.row_scales.resize(rows);
  return m;
}

std::optional<LayoutSize> CheckedLayoutSize(Format format, int64_t rows, int64_t cols) {
  if (rows < 0 || cols < 0) return std::nullopt;
  const uint64_t r = static_cast<uint64_t>(rows), c = static_cast<uint64_t>(cols);
  LayoutSize size;
  if (IsBlockScaled(format)) {
    const uint64_t block = static_cast<uint64_t>(Traits(format).block_size());
    const uint64_t blocks = c / block + (c % block != 0);
    const std::optional<uint64_t> scales =
        CheckedProduct({r, blocks, static_cast<uint64_t>(Traits(format).block_scale_bytes())});
    const std::optional<uint64_t> elements =
        CheckedProduct({r, blocks, static_cast<uint64_t>(BlockBytes(format))});
    if (!scales || !elements) return std::nullopt;
    size.block_scale_bytes = *scales;
    size.element_bytes = *elements;
    if (format == Format::kNvfp4) size.row_scales = r;
  } else {
    const std::optional<uint64_t> elements =
        CheckedProduct({r, c, static_cast<uint64_t>(Traits(format).element_bits / 8)});
    if (!elements) return std::nullopt;
    size.element_bytes = *elements;
    if (format == Format::kInt8) size.row_scales = r;
  }
  // total_bytes() must not wrap either: every part is at most 2^64 / 4 here or
  // the sum is refused.
  const std::optional<uint64_t> scales = CheckedMul(size.row_scales, 4);
  if (!scales || !CheckedAdd(size.element_bytes, size.block_scale_bytes) ||
      !CheckedAdd(size.element_bytes + size.block_scale_bytes, *scales)) {
    return std::nullopt;
  }
  return size;
}


uint32_t LoBcqSelector(const QuantizedMatrix& m, int64_t row, int64_t col) {
  const int64_t array = col / kLoBcqArraySize;
  const int64_t block = (col % kLoBcqArraySize) / kLoBcqBlockLen;
  const uint8_t byte =
      m.block_scales[row * ScaleBytesPerRow(m.format, m.cols) + 8 * array + 4 + block / 2];
  return (byte >> ((block & 1) * 4)) & 15;
}

float LookupScale(const QuantizedMatrix& m, int64_t row, int64_t block) {
  float scale;
  std::memcpy(&scale,
              m.block_scales.data() + row * ScaleBytesPerRow(m.format, m.cols) +
                  block * Traits(m.format).block_scale_bytes(),
              4);
  return scale;
}

int64_t RowBytes(Format format, int64_t cols) {
  if (IsBlockScaled(format)) return BlocksPerRow(format, cols) * BlockBytes(format);
  return cols * Traits(format).element_bits / 8;
}

void PackBlock(Format format, std::span<const uint8_t, kBlockSize> codes, uint8_t* block) {
  const int bits = Traits(format).element_bits;
  std::memset(block, 0, BlockBytes(format));
  for (int i = 0; i < kBlockSize; ++i) {
    const uint32_t code = codes[i] & ((1u << bits) - 1);
    const int position = i * bits;
    block[position / 8] |= static_cast<uint8_t>(code << (position % 8));
    if (position % 8 + bits > 8)
      block[position / 8 + 1] |= static_cast<uint8_t>(code >> (8 - position % 8));
  }
}

void UnpackBlock(Format format, const uint8_t* block, std::span<uint8_t, kBlockSize> codes) {
  const int bits = Traits(format).element_bits;
  for (int i = 0; i < kBlockSize; ++i)
    codes[i] = static_cast<uint8_t>(ReadBits(block, i * bits, bits));
}

absl::StatusOr<QuantizedMatrix> QuantizeRowsDrawing(std::span<const float> values, int64_t rows,
                                                    int64_t cols, Format format,
                                                    const QuantizeOptions& options,
                                                    uint64_t row_step, uint64_t col_step) {
  if (absl::Status s = ValidateShape(values.size(), rows, cols, "values"); !s.ok()) return s;
  QuantizedMatrix m = AllocateQuantized(format, rows, cols);
  const int64_t row_bytes = RowBytes(format, cols);
  const bool stochastic = options.rounding == Rounding::kStochastic;
  const StochasticBits bits(options.seed, options.stream);
  // NVFP4: one scale for the whole matrix, unless the caller brings it.
  const float tensor_scale =
      format != Format::kNvfp4      ? 0.0f
      : BringsTensorScale(options) ? options.tensor_scale
                                   : NvTensorScale(FiniteAmax(values));
  for (int64_t r = 0; r < rows; ++r) {
    const std::span<const float> row = values.subspan(r * cols, cols);
    uint8_t* elements = m.elements.data() + r * row_bytes;
    const RowDraws draws{stochastic ? &bits : nullptr,
                         static_cast<uint64_t>(options.index_offset) + r * row_step, col_step};
    if (IsMx(format)) {
      QuantizeRowMx(row, format, options, draws, elements,
                    m.block_scales.data() + r * BlocksPerRow(cols));
    } else if (format == Format::kInt8) {
      m.row_scales[r] = QuantizeRowInt8(row, options, draws, elements);
    } else if (format == Format::kNvfp4) {
      QuantizeRowNv(row, tensor_scale, options, draws, elements,
                    m.block_scales.data() + r * BlocksPerRow(format, cols));
      m.row_scales[r] = tensor_scale;
    } else if (Traits(format).kind == FormatKind::kCodebook) {
      QuantizeRowCodebook(row, format, elements, m.block_scales.data() + r * ScaleBytesPerRow(format, cols));
    } else if (format == Format::kLoBcq) {
      QuantizeRowLoBcq(row, elements, m.block_scales.data() + r * ScaleBytesPerRow(format, cols));
    } else {
      StoreFloats(row, format, elements);
    }
  }
  return m;
}

namespace {

uint64_t SourceStride(const QuantizeOptions& options, int64_t width) {
  return static_cast<uint64_t>(options.index_row_stride != 0 ? options.index_row_stride : width);
}

}  // namespace

absl::StatusOr<QuantizedMatrix> QuantizeRows(std::span<const float> values, int64_t rows,
                                             int64_t cols, Format format,
                                             const QuantizeOptions& options) {
  return QuantizeRowsDrawing(values, rows, cols, format, options, SourceStride(options, cols), 1);
}

absl::StatusOr<QuantizedMatrix> QuantizeRows(std::span<const uint16_t> values, Format source,
                                             int64_t rows, int64_t cols, Format format,
                                             const QuantizeOptions& options) {
  if (source != Format::kBf16 && source != Format::kFp16) {
    return absl::InvalidArgumentError(
        absl::StrCat("source: expected BF16 or FP16, got ", FormatName(source)));
  }
  std::vector<float> widened(values.size());
  WidenToFloat(source, values.data(), values.size(), widened.data());
  return QuantizeRows(widened, rows, cols, format, options);
}

absl::StatusOr<QuantizedMatrix> QuantizeColumns(std::span<const float> values, int64_t k, int64_t n,
                                                Format format, const QuantizeOptions& options) {
  if (absl::Status s = ValidateShape(values.size(), k, n, "values"); !s.ok()) return s;
  std::vector<float> transposed(values.size());
  for (int64_t i = 0; i < k; ++i) {
    for (int64_t j = 0; j < n; ++j) transposed[j * k + i] = values[i * n + j];
  }
  return QuantizeRowsDrawing(transposed, n, k, format, options, 1, SourceStride(options, n));
}

uint32_t ElementCode(const QuantizedMatrix& m, int64_t row, int64_t col) {
  const uint8_t* base = m.elements.data() + row * RowBytes(m.format, m.cols);
  const int bits = Traits(m.format).element_bits;
  // NVFP4 and the codebooks: nibbles back to back (their blocks hold no padding).
  if (m.format == Format::kNvfp4 || Traits(m.format).is_lookup()) {
    return ReadBits(base, col * 4, 4);
  }
  if (IsMx(m.format)) {
    return ReadBits(base + (col / kBlockSize) * BlockBytes(m.format), (col % kBlockSize) * bits,
                    bits);
  }
  uint32_t code = 0;
  std::memcpy(&code, base + col * (bits / 8), bits / 8);  // little-endian host
  return code;
}

float ElementValue(const QuantizedMatrix& m, int64_t row, int64_t col) {
  if (m.format == Format::kLoBcq) {
    return LoBcqValue(DefaultLoBcqCodebooks(), LoBcqSelector(m, row, col),
                      ElementCode(m, row, col), LookupScale(m, row, col / kLoBcqArraySize));
  }
  const float element = DecodeElement(m.format, ElementCode(m, row, col));
  if (IsMx(m.format)) {
    const uint8_t scale = m.block_scales[row * BlocksPerRow(m.cols) + col / kBlockSize];
    if (scale == kScaleNan) return std::numeric_limits<float>::quiet_NaN();
    // Exact: an MX element has at most 4 significant bits and its lowest step times
    // the smallest scale, 2^-16 · 2^-127, is still an FP32 subnormal.
    return std::ldexp(element, scale - kScaleBias);
  }
  if (m.format == Format::kInt8) return element * m.row_scales[row];
  if (Traits(m.format).kind == FormatKind::kCodebook) {
    return CodebookValue(m.format, ElementCode(m, row, col),
                         LookupScale(m, row, col / kCodebookBlockSize));
  }
  if (m.format == Format::kNvfp4) {
    // element · block scale is exact (2 and 4 significant bits; NaN for a NaN
    // block); the tensor scale's product is the one rounding.
    return element *
           NvScaleValue(m.block_scales[row * BlocksPerRow(m.format, m.cols) + col / kNvBlockSize]) *
           m.row_scales[row];
  }
  return element;
}

std::vector<float> Dequantize(const QuantizedMatrix& m) {
  std::vector<float> out(m.rows * m.cols);
  for (int64_t r = 0; r < m.rows; ++r) {
    for (int64_t c = 0; c < m.cols; ++c) out[r * m.cols + c] = ElementValue(m, r, c);
  }
  return out;
}

absl::Status ValidateLayout(const QuantizedMatrix& m) {
  if (m.rows < 0 || m.cols < 0 || m.rows > kMaxDimension || m.cols > kMaxDimension) {
    return absl::InvalidArgumentError(
        absl::StrCat("shape: rows and cols must be in [0, 2^31], got ", m.rows, "x", m.cols));
  }
  const std::optional<LayoutSize> size = CheckedLayoutSize(m.format, m.rows, m.cols);
  if (!size) {
    return absl::InvalidArgumentError(absl::StrCat("shape: a ", m.rows, "x", m.cols, " ",
                                                   FormatName(m.format),
                                                   " matrix has more bytes than 64 bits count"));
  }
  const auto expect = [&](const char* field, size_t actual, uint64_t expected) {
    return actual == expected ? absl::OkStatus()
                              : absl::InvalidArgumentError(absl::StrCat(
                                    field, ": expected ", expected, " for a ", m.rows, "x", m.cols,
                                    " ", FormatName(m.format), " matrix, got ", actual));
  };
  if (absl::Status s = expect("elements (bytes)", m.elements.size(), size->element_bytes);
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          expect("block_scales (bytes)", m.block_scales.size(), size->block_scale_bytes);
      !s.ok()) {
    return s;
  }
  return expect("row_scales (floats)", m.row_scales.size(), size->row_scales);
}

absl::StatusOr<QuantizedMatrix> StackRows(std::span<const QuantizedMatrix> parts) {
  if (parts.empty()) return absl::InvalidArgumentError("StackRows: no parts");
  QuantizedMatrix out;
  out.format = parts.front().format;
  out.cols = parts.front().cols;
  for (const QuantizedMatrix& part : parts) {
    if (part.format != out.format || part.cols != out.cols) {
      return absl::InvalidArgumentError(
          absl::StrCat("StackRows: a ", FormatName(part.format), " part of ", part.cols,
                       " columns among ", FormatName(out.format), " parts of ", out.cols));
    }
    out.rows += part.rows;
    out.elements.insert(out.elements.end(), part.elements.begin(), part.elements.end());
    out.block_scales.insert(out.block_scales.end(), part.block_scales.begin(),
                            part.block_scales.end());
    out.row_scales.insert(out.row_scales.end(), part.row_scales.begin(), part.row_scales.end());
  }
  return out;
}

}  // namespace mx
