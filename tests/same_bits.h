// "The same bits", once for every test and fuzz target (no GoogleTest here, so
// the fuzz targets can use it too).
//
// Two rules, for two kinds of data:
//   SameBits     the numerics contract: the same bit pattern, except that any two
//                NaNs are equal (a NaN's sign and payload are not part of it).
//   Identical    bytes that travel unchanged (wire tensors, packed scales): every
//                bit, NaN payloads and zero signs included.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <optional>
#include <span>

namespace mx_test {

inline bool SameBits(float a, float b) {
  return (std::isnan(a) && std::isnan(b)) ||
         std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b);
}

inline bool Identical(float a, float b) {
  return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b);
}

// The first index where `a` and `b` are not Identical (or the shorter length,
// when the sizes differ); nullopt when they are identical.
inline std::optional<size_t> FirstDifference(std::span<const float> a, std::span<const float> b) {
  const size_t n = a.size() < b.size() ? a.size() : b.size();
  for (size_t i = 0; i < n; ++i) {
    if (!Identical(a[i], b[i])) return i;
  }
  if (a.size() != b.size()) return n;
  return std::nullopt;
}

inline bool Identical(std::span<const float> a, std::span<const float> b) {
  return !FirstDifference(a, b).has_value();
}

// SameBits for every element, and the same length.
inline bool SameBitsAll(std::span<const float> a, std::span<const float> b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!SameBits(a[i], b[i])) return false;
  }
  return true;
}

}  // namespace mx_test
