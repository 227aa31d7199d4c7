// The float paths' bound (DESIGN.md: FP32 accumulation in any order, held to an
// FP64 reference): for Y = X·Wᵀ + bias with X and W as the operands' dequantized
// values, |y − y64| <= K · 2^-24 · (Σ|x·w| + |bias|): K roundings, each of a
// partial sum that may hold the bias (the reference adds it first). BF16 × BF16
// runs on pair instructions at avx512 and amx (mx/README.md, "BF16 on pair
// instructions"), so its outputs are held to this, not to the reference's bits.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "mx/packed.h"

namespace mx_test {

// FP64's y64 and the bound for output (i, j), from the dequantized operands
// (x: rows × k, w: n × k) and the bias (empty or n values).
struct FloatBound {
  double exact, bound;
};
inline FloatBound FloatBoundAt(std::span<const float> xv, std::span<const float> wv,
                               std::span<const float> bias, int64_t k, int64_t i, int64_t j) {
  const double b = bias.empty() ? 0.0 : double{bias[j]};
  double exact = b, magnitude = std::fabs(b);
  for (int64_t c = 0; c < k; ++c) {
    const double product = double{xv[i * k + c]} * wv[j * k + c];
    exact += product;
    magnitude += std::fabs(product);
  }
  return {exact, k * std::ldexp(magnitude, -24)};
}

// x: m × k and w: n × k, quantized along their rows to `format`; bias: n or none.
// `slack` multiplies the bound (2 compares two results that each keep it).
inline ::testing::AssertionResult WithinFloatBound(const std::vector<float>& got,
                                                   const std::vector<float>& x,
                                                   const std::vector<float>& w,
                                                   const std::vector<float>& bias, int64_t m,
                                                   int64_t k, int64_t n, mx::Format format,
                                                   const std::vector<float>* other = nullptr,
                                                   double slack = 1) {
  const std::vector<float> xv = mx::Dequantize(*mx::QuantizeRows(x, m, k, format));
  const std::vector<float> wv = mx::Dequantize(*mx::QuantizeRows(w, n, k, format));
  if (got.size() != static_cast<size_t>(m * n)) {
    return ::testing::AssertionFailure() << "size " << got.size() << ", expected " << m * n;
  }
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      const FloatBound at = FloatBoundAt(xv, wv, bias, k, i, j);
      const double want = other ? double{(*other)[i * n + j]} : at.exact;
      const double bound = slack * at.bound;
      if (!(std::fabs(got[i * n + j] - want) <= bound)) {
        return ::testing::AssertionFailure()
               << "y[" << i << "][" << j << "] = " << got[i * n + j] << ", expected " << want
               << " ± " << bound;
      }
    }
  }
  return ::testing::AssertionSuccess();
}

// b (k × n, row-major) as n × k.
inline std::vector<float> Transposed(const std::vector<float>& b, int64_t k, int64_t n) {
  std::vector<float> t(b.size());
  for (int64_t r = 0; r < k; ++r) {
    for (int64_t c = 0; c < n; ++c) t[c * k + r] = b[r * n + c];
  }
  return t;
}

}  // namespace mx_test
