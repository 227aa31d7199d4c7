// Helpers shared by the GEMM kernel tests (linear_test, avx512_emulated_test):
// inputs, and the bit-for-bit comparison of a kernel run with the reference.
#pragma once

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "mx/kernels/gemm_internal.h"
#include "mx/kernels/linear.h"
#include "mx/packed.h"
#include "mx/reference_gemm.h"

namespace mx::kernels {

inline constexpr Format kMxFormats[] = {Format::kMxfp8E4m3, Format::kMxfp8E5m2,
                                        Format::kMxfp6E3m2, Format::kMxfp6E2m3,
                                        Format::kMxfp4E2m1, Format::kMxint8};

inline std::vector<float> Gaussian(size_t count, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(count);
  for (float& x : v) x = normal(rng);
  return v;
}

// Same value, or both NaN (the sign and payload of a NaN are not part of the contract).
inline bool SameBits(float a, float b) {
  return (std::isnan(a) && std::isnan(b)) || std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b);
}

// Runs Linear (or, with `tiles`, the driver with those tried first) and compares
// every output with the reference; on a mismatch, says where.
inline void ExpectSameAsReference(const QuantizedMatrix& x, const QuantizedMatrix& w,
                                  std::span<const float> bias, Isa isa, const std::string& what,
                                  ThreadPool* pool = nullptr, KernelInfo* info_out = nullptr,
                                  const internal::TileOverride* tiles = nullptr) {
  const std::vector<float> expected = ReferenceLinear(x, w, bias).value();
  absl::StatusOr<PackedWeight> packed = PackedWeight::Pack(w);
  ASSERT_TRUE(packed.ok()) << packed.status();
  std::vector<float> y(x.rows * w.rows, -1.0f);
  const GemmOptions options{.isa = isa, .pool = pool};
  absl::StatusOr<KernelInfo> info = tiles ? internal::LinearWith(x, *packed, bias, y, options, tiles)
                                          : Linear(x, *packed, bias, y, options);
  ASSERT_TRUE(info.ok()) << info.status();
  if (info_out) *info_out = *info;
  int mismatches = 0;
  for (int64_t i = 0; i < x.rows && mismatches < 5; ++i) {
    for (int64_t j = 0; j < w.rows && mismatches < 5; ++j) {
      const float got = y[i * w.rows + j], want = expected[i * w.rows + j];
      if (!SameBits(got, want)) {
        ++mismatches;
        ADD_FAILURE() << what << " kernel " << info->name << ": y[" << i << "][" << j
                      << "] = " << got << " (0x" << std::hex << std::bit_cast<uint32_t>(got)
                      << "), reference " << want << " (0x" << std::bit_cast<uint32_t>(want)
                      << std::dec << ")";
      }
    }
  }
}

inline QuantizedMatrix Quantize(const std::vector<float>& v, int64_t rows, int64_t cols,
                                Format f) {
  return QuantizeRows(v, rows, cols, f).value();
}

}  // namespace mx::kernels
