// LO-BCQ: locally optimal block-clustered quantization (Elangovan et al., "BCQ:
// Block Clustered Quantization for 4-bit (W4A4) LLM Inference"). Along K, an
// array of `array_len` values shares one FP32 scale; each block of `block_len`
// values inside it picks one of `codebooks` codebooks (a selector), each of 16
// INT6 entries; every value is the 4-bit code of an entry of its block's
// codebook. The codebooks are calibrated (clients/python/mxserve/torch/lobcq.py:
// alternate block clustering and Lloyd-Max codebook design to a local minimum of
// the squared error); the LO_BCQ format is the paper's W4A4 point (blocks of 8,
// 16 codebooks, arrays of 64: 4 + 4/8 + 32/64 = 5 bits per value) with one
// frozen set calibrated once (DefaultLoBcqCodebooks).
//
// The contract (mx/README.md, "LO-BCQ"), exact integer arithmetic after two
// IEEE FP32 operations:
//  - scale: s = fp32(amax / 31), amax the array's largest |value|; an array
//    holding NaN or Inf has scale NaN, selectors and codes 0;
//  - grid: y = fp32(x / s) clamped to [-32, 32], t = rint(256 · y) (half to
//    even; an integer); where s is 0 (an all-zero array, or amax / 31 below the
//    FP32 subnormals) every t is 0;
//  - selection: a block takes the codebook j with the least
//    Σ_i min_k (t_i − 256·C[j][k])² over its values (padding past K not
//    counted), the lowest j on ties; a value takes the entry k of that codebook
//    with the least |t − 256·C[j][k]|, the lowest k on ties. Padding codes are 0;
//  - value: fp32(C[selector][code] · s), one FP32 multiply. GEMMs take the float
//    path (reference_gemm.h), as for the other lookup formats.
//
// The rounding modes do not apply: the codebooks decide.
#pragma once

#include <array>
#include <cstdint>
#include <limits>
#include <span>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "mx/format.h"

namespace mx {

inline constexpr int kLoBcqEntryMax = 31;   // INT6 entries
inline constexpr int kLoBcqGrid = 256;      // t: scaled values in units of 1/256
inline constexpr int kLoBcqMaxCodebooks = 16;
inline constexpr int kLoBcqMaxArray = 256;

using LoBcqCodebook = std::array<int8_t, 16>;

struct LoBcqGeometry {
  int block_len = kLoBcqBlockLen;
  int array_len = kLoBcqArraySize;
  int codebooks = kLoBcqMaxCodebooks;
  int blocks_per_array() const { return array_len / block_len; }
};

// The LO_BCQ format's frozen codebooks (16 × 16 INT6 entries), calibrated by
// mxserve.torch.lobcq.default_codebooks() on seeded Gaussian, Laplace and
// Student-t arrays.
std::span<const LoBcqCodebook> DefaultLoBcqCodebooks();

// Checks a geometry (1 <= block_len <= 64, array_len a multiple of it up to 256,
// 1 to 16 codebooks) and codebooks for it (that many, entries in [-31, 31]).
absl::Status ValidateLoBcq(const LoBcqGeometry& geometry,
                           std::span<const LoBcqCodebook> codebooks);

// One array (at most geometry.array_len values; a short one is padded): writes a
// code per value and a selector per block (blocks_per_array of them; whole
// blocks of padding get 0) and returns the array's scale (NaN for NaN/Inf).
// INVALID_ARGUMENT for a bad geometry or codebooks (ValidateLoBcq), more values
// than array_len, or spans of the wrong size.
absl::StatusOr<float> QuantizeLoBcqArray(const LoBcqGeometry& geometry,
                                         std::span<const LoBcqCodebook> codebooks,
                                         std::span<const float> values, std::span<uint8_t> codes,
                                         std::span<uint8_t> selectors);

// An element's value: fp32(C[selector][code] · scale); NaN for a selector past
// the codebooks.
inline float LoBcqValue(std::span<const LoBcqCodebook> codebooks, uint32_t selector,
                        uint32_t code, float scale) {
  if (selector >= codebooks.size()) return std::numeric_limits<float>::quiet_NaN();
  return static_cast<float>(codebooks[selector][code & 15]) * scale;
}

}  // namespace mx
