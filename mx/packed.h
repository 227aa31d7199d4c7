// QuantizedMatrix: an operand in its storage format, in the packed layout that GEMM
// kernels, the wire protocol and the FPGA's DMA engine all read. See mx/README.md
// for the picture.
//
// An operand is always `rows` × `cols` with the reduction dimension K along cols:
// X (M×K) and W (N×K) of Y = X·Wᵀ directly, and B (K×N) of C = A·B transposed
// (QuantizeColumns). MX rows are padded to whole 32-element blocks with code 0.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "mx/format.h"
#include "mx/quantize.h"

namespace mx {

struct QuantizedMatrix {
  Format format = Format::kFp32;
  int64_t rows = 0;
  int64_t cols = 0;
  // Elements, row-major. MX: each block of 32 codes bit-packed little-endian into
  // 32·bits/8 bytes (16 for FP4, 24 for FP6, 32 for 8-bit formats), blocks of a row
  // back to back. INT8: one byte per element. BF16/FP16: two bytes, FP32: four,
  // little-endian.
  std::vector<uint8_t> elements;
  // MX: rows × BlocksPerRow(cols) E8M0 bytes, row-major. NVFP4: rows ×
  // BlocksPerRow(kNvfp4, cols) UE4M3 bytes (blocks of 16; elements nibble-packed
  // like MXFP4's, 8 bytes a block, the row padded to whole blocks). NF4,
  // BNB_FP4: rows × BlocksPerRow(format, cols) FP32 absmax values, 4 bytes each,
  // little-endian (blocks of 64; elements nibble-packed, 32 bytes a block).
  // LO_BCQ: rows × BlocksPerRow(kLoBcq, cols) arrays of 8 bytes, the FP32 scale
  // (little-endian) then 8 codebook selectors nibble-packed low first (arrays of
  // 64; elements nibble-packed, 32 bytes an array).
  std::vector<uint8_t> block_scales;
  // INT8: one FP32 scale per row (value = code · scale; NaN for a row that held
  // NaN or Inf). NVFP4: the per-tensor FP32 scale of the tensor each row came
  // from (value = fp32(fp32(element · block scale) · row scale)).
  std::vector<float> row_scales;
};

// Largest rows or cols of an operand: keeps every byte count well inside 64
// bits, and is what ValidateShape, ValidateLayout and the daemon accept.
inline constexpr int64_t kMaxDimension = int64_t{1} << 31;

// Layout arithmetic, shared by every producer and consumer of the layout.
inline int64_t BlocksPerRow(int64_t cols) { return (cols + kBlockSize - 1) / kBlockSize; }
// Blocks of a row of a block-scaled format (MX: 32 elements, NVFP4: 16).
inline int64_t BlocksPerRow(Format format, int64_t cols) {
  const int64_t size = Traits(format).block_size();
  return size == 0 ? 0 : (cols + size - 1) / size;  // 0 for formats without blocks
}
// Bytes of one packed block (MX: 32 elements, NVFP4: 16, codebooks: 64).
inline int64_t BlockBytes(Format format) {
  return Traits(format).block_size() * Traits(format).element_bits / 8;
}
// Bytes of one row's block scales (BlocksPerRow × the format's scale bytes).
inline int64_t ScaleBytesPerRow(Format format, int64_t cols) {
  return BlocksPerRow(format, cols) * Traits(format).block_scale_bytes();
}
// A lookup format's FP32 block scale, block `block` of row `row`: NF4's and
// BNB_FP4's absmax, LO_BCQ's array scale (the first 4 bytes of its 8).
float LookupScale(const QuantizedMatrix& m, int64_t row, int64_t block);
// LO_BCQ: the codebook selector of the block holding column `col`.
uint32_t LoBcqSelector(const QuantizedMatrix& m, int64_t row, int64_t col);
// Whether an operand in `format` carries row_scales (INT8, NVFP4).
inline bool HasRowScales(Format format) {
  return format == Format::kInt8 || format == Format::kNvfp4;
}
// Bytes of one packed row of `cols` elements.
int64_t RowBytes(Format format, int64_t cols);

// The buffer sizes of a rows × cols matrix in `format`'s layout, computed with
// checked arithmetic: nullopt when rows or cols is negative or a size does not
// fit in 64 bits. Every check of an operand's size from outside uses this.
struct LayoutSize {
  uint64_t element_bytes = 0;
  uint64_t block_scale_bytes = 0;  // MX formats
  uint64_t row_scales = 0;         // INT8: FP32 values, one per row
  // All three in bytes; fits, because each part does and they are small multiples.
  uint64_t total_bytes() const { return element_bytes + block_scale_bytes + 4 * row_scales; }
};
std::optional<LayoutSize> CheckedLayoutSize(Format format, int64_t rows, int64_t cols);

// INVALID_ARGUMENT unless rows and cols are in [0, 2^31] and rows · cols equals
// value_count; `what` names the argument ("values: expected 2x3 = 6 values, ...").
absl::Status ValidateShape(size_t value_count, int64_t rows, int64_t cols, const char* what);

// A rows × cols matrix of `format` with every buffer sized and zeroed (MX block
// scales byte 0, INT8 row scales 0): what the quantizers fill.
QuantizedMatrix AllocateQuantized(Format format, int64_t rows, int64_t cols);

// Bit-packs 32 element codes (low bits of each byte) into one block:
// element i occupies bits [i·b, i·b + b) of the block read as a little-endian
// bit string, b = element_bits.
void PackBlock(Format format, std::span<const uint8_t, kBlockSize> codes, uint8_t* block);
void UnpackBlock(Format format, const uint8_t* block, std::span<uint8_t, kBlockSize> codes);

// Quantizes a row-major rows × cols FP32 matrix along its rows (K = cols).
absl::StatusOr<QuantizedMatrix> QuantizeRows(std::span<const float> values, int64_t rows,
                                             int64_t cols, Format format,
                                             const QuantizeOptions& options = {});
// The same for BF16 or FP16 input given as raw 16-bit codes (`source` says which):
// each value widens to FP32 exactly, then quantizes as above.
absl::StatusOr<QuantizedMatrix> QuantizeRows(std::span<const uint16_t> values, Format source,
                                             int64_t rows, int64_t cols, Format format,
                                             const QuantizeOptions& options = {});
// Quantizes a row-major K × N FP32 matrix along its columns. The result holds the
// transpose: N rows of K.
absl::StatusOr<QuantizedMatrix> QuantizeColumns(std::span<const float> values, int64_t k, int64_t n,
                                                Format format, const QuantizeOptions& options = {});

// QuantizeRows whose element (r, c) draws its stochastic-rounding bits at index
// options.index_offset + r · row_step + c · col_step (options.index_row_stride
// is not read): for kernels that hand the reference a part of a matrix, or its
// transpose (col_step = the source's width, row_step = 1).
absl::StatusOr<QuantizedMatrix> QuantizeRowsDrawing(std::span<const float> values, int64_t rows,
                                                    int64_t cols, Format format,
                                                    const QuantizeOptions& options,
                                                    uint64_t row_step, uint64_t col_step);

// The rows of `parts`, in order, as one matrix: several requests' inputs to one
// weight as a single operand. Quantization is per row (per block along K), so
// each row's bits are those it had alone. INVALID_ARGUMENT unless every part
// has the first one's format and column count; `parts` must not be empty.
absl::StatusOr<QuantizedMatrix> StackRows(std::span<const QuantizedMatrix> parts);

// The element code at (row, col) and the value it stands for (scale applied).
// For block-scaled formats `col` may also address the padding of the last block
// (ElementCode only).
uint32_t ElementCode(const QuantizedMatrix& m, int64_t row, int64_t col);
float ElementValue(const QuantizedMatrix& m, int64_t row, int64_t col);

// All values back to FP32, rows × cols row-major, in the matrix's orientation.
std::vector<float> Dequantize(const QuantizedMatrix& m);

// Checks that the buffers of `m` have the sizes its format and shape require;
// the message names the field and the expected size.
absl::Status ValidateLayout(const QuantizedMatrix& m);

}  // namespace mx
