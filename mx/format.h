// The number formats mxserve computes in, and one table of their traits.
//
// MX formats (OCP Microscaling v1.0) store blocks of 32 elements that share one
// E8M0 scale; NVFP4 stores blocks of 16 E2M1 elements that share one UE4M3 scale,
// under one FP32 scale per tensor; the codebook formats (bitsandbytes' NF4 and
// FP4) store 4-bit indices into a 16-entry table in blocks of 64 under one FP32
// absmax each; the other formats store plain elements (INT8 with one FP32 scale
// per row of an operand).
#pragma once

#include <cstdint>
#include <span>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace mx {

enum class Format : uint8_t {
  kMxfp8E4m3,
  kMxfp8E5m2,
  kMxfp6E3m2,
  kMxfp6E2m3,
  kMxfp4E2m1,
  kMxint8,
  kInt8,  // symmetric, one FP32 scale per row of an operand
  kBf16,
  kFp16,
  kFp32,
  // NVIDIA's FP4: E2M1 elements in blocks of 16 along K, one UE4M3 scale per
  // block, one FP32 scale per tensor (kept per row of an operand, so that rows
  // of several tensors can be stacked).
  kNvfp4,
  // bitsandbytes' codebook formats (mx/codebook.h): 4-bit indices into a
  // 16-entry table of values in [-1, 1], blocks of 64 along K, one FP32 absmax
  // per block. NF4 (QLoRA's NormalFloat) and bnb's FP4.
  kNf4,
  kBnbFp4,
  // LO-BCQ (mx/lobcq.h), the paper's W4A4 point: arrays of 64 along K under one
  // FP32 scale, blocks of 8 each choosing one of 16 frozen INT6 codebooks by a
  // 4-bit selector, 4-bit codes. The last: kFormatCount counts up to it.
  kLoBcq,
};

// How many formats there are: Format values are 0 .. kFormatCount - 1, and
// AllFormats() lists them in that order (format.cc checks both at compile time).
inline constexpr int kFormatCount = static_cast<int>(Format::kLoBcq) + 1;

enum class FormatKind : uint8_t {
  kMxFloat,  // MX block of minifloat elements
  kMxInt,    // MX block of two's-complement k·2^-6 elements
  kInt8,     // per-row scaled integers
  kFloat,    // IEEE-style floats: BF16, FP16, FP32
  kNvFloat,  // NVFP4: blocks of 16 minifloats, UE4M3 block scales, FP32 tensor scale
  kCodebook,  // NF4, BNB_FP4: blocks of 64 table indices, one FP32 absmax each
  kLoBcq,     // LO_BCQ: arrays of 64 codebook indices, an FP32 scale and 8 selectors each
};

// How a minifloat reserves codes for Inf and NaN.
enum class Specials : uint8_t {
  kNone,         // every code is finite (FP6, FP4, and the integer formats)
  kNanOnlyE4m3,  // S.1111.111 is NaN, there is no Inf (OCP E4M3)
  kIeee,         // the top exponent holds Inf (mantissa 0) and NaN (E5M2, FP16, BF16, FP32)
};

// The size of an MX block along the reduction dimension.
inline constexpr int kBlockSize = 32;
// The size of an NVFP4 block, and the largest magnitudes of its parts: the
// per-tensor scale is amax / (kNvScaleMax · kNvElementMax), so that the block
// holding amax gets the largest block scale.
inline constexpr int kNvBlockSize = 16;
inline constexpr float kNvElementMax = 6.0f;   // E2M1
inline constexpr float kNvScaleMax = 448.0f;   // UE4M3
inline constexpr float kNvScaleMin = 0x1p-6f;  // the smallest normal UE4M3, torchao's floor
// The UE4M3 byte of a block holding NaN or Inf (E4M3's NaN, S.1111.111 with S=0).
inline constexpr uint8_t kNvScaleNan = 0x7F;
// The size of a codebook format's block (bitsandbytes' default blocksize).
inline constexpr int kCodebookBlockSize = 64;
// LO_BCQ: the array (one FP32 scale) and the block (one codebook selector).
inline constexpr int kLoBcqArraySize = 64;
inline constexpr int kLoBcqBlockLen = 8;
// The E8M0 byte that encodes NaN; byte b otherwise means 2^(b - 127).
inline constexpr uint8_t kScaleNan = 0xFF;
inline constexpr int kScaleBias = 127;

struct FormatTraits {
  Format format;
  absl::string_view name;  // as in the golden set, e.g. "MXFP8_E4M3"
  FormatKind kind;
  int element_bits;  // bits one element occupies in the packed layout
  // Minifloat fields (sign bit not counted). For MXINT8 and INT8 these are 0 and
  // the element is a two's-complement byte.
  int exponent_bits;
  int mantissa_bits;
  int exponent_bias;
  // Exponent of the largest normal element (emax_elem of the MX spec). For
  // MXINT8 it is 0: elements are k·2^-6 with |k| <= 127, so below 2^1.
  int emax;
  double max_normal;
  double min_normal;     // 0 where the format has no normal/subnormal split
  double min_subnormal;  // smallest positive element (for MXINT8 the step 2^-6)
  Specials specials;
  absl::string_view special_encodings;  // in words, for docs and --help

  bool is_mx() const { return kind == FormatKind::kMxFloat || kind == FormatKind::kMxInt; }
  // Elements are looked up in a table (NF4, BNB_FP4, LO_BCQ): GEMMs take the
  // float path and the rounding modes do not apply.
  bool is_lookup() const { return kind == FormatKind::kCodebook || kind == FormatKind::kLoBcq; }
  // Elements share a scale per block along K: the MX, NVFP4 and lookup formats.
  bool is_block_scaled() const { return is_mx() || kind == FormatKind::kNvFloat || is_lookup(); }
  // Elements per block along K (0 for the formats without blocks).
  int block_size() const {
    return is_mx()                          ? kBlockSize
           : kind == FormatKind::kNvFloat   ? kNvBlockSize
           : kind == FormatKind::kCodebook  ? kCodebookBlockSize
           : kind == FormatKind::kLoBcq     ? kLoBcqArraySize
                                            : 0;
  }
  // Bytes of one block's scale in block_scales: E8M0 and UE4M3 one, a codebook
  // block's FP32 absmax four (little-endian), a LO_BCQ array's FP32 scale and its
  // 8 selectors (nibbles, low first) eight; 0 without blocks.
  int block_scale_bytes() const {
    return kind == FormatKind::kCodebook ? 4
           : kind == FormatKind::kLoBcq  ? 8
           : is_block_scaled()           ? 1
                                         : 0;
  }
  // Bits an element costs stored with its block's scale share (MX 8.25 for
  // FP8, NF4 4.5, LO_BCQ 5); INT8's row scale and NVFP4's tensor scale are not
  // in it (they depend on K and the tensor).
  double bits_with_block_scale() const {
    return element_bits +
           (is_block_scaled() ? 8.0 * block_scale_bytes() / block_size() : 0.0);
  }
};

// Every format, in the order of the enum.
std::span<const FormatTraits> AllFormats();
const FormatTraits& Traits(Format format);
inline absl::string_view FormatName(Format format) { return Traits(format).name; }
inline bool IsMx(Format format) { return Traits(format).is_mx(); }
inline bool IsBlockScaled(Format format) { return Traits(format).is_block_scaled(); }

// A shorthand ParseFormat accepts besides the names in the table.
struct FormatAlias {
  absl::string_view name;  // e.g. "MXFP8"
  Format format;           // e.g. Format::kMxfp8E4m3
};
// MXFP8 (= MXFP8_E4M3), MXFP6 (= MXFP6_E2M3) and MXFP4 (= MXFP4_E2M1).
std::span<const FormatAlias> FormatAliases();

// Parses a format name: the golden set's names (MXFP8_E4M3, ..., MXINT8) and INT8,
// BF16, FP16, FP32, case-insensitive, plus the aliases mxfp8 (= E4M3), mxfp6
// (= E2M3) and mxfp4. The error names the accepted spellings.
absl::StatusOr<Format> ParseFormat(absl::string_view name);

// "MXFP8_E4M3, MXFP8_E5M2, ..." for messages and --help.
absl::string_view FormatNameList();

}  // namespace mx
