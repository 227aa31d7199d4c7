// Checked size arithmetic. Every element or byte count computed from a shape
// that came from outside (a request, a file) goes through these, so a product
// that does not fit in 64 bits is an error instead of a small wrapped number.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>

namespace mx {

// a · b, or nullopt when the product does not fit in 64 bits.
inline std::optional<uint64_t> CheckedMul(uint64_t a, uint64_t b) {
  uint64_t product;
  if (__builtin_mul_overflow(a, b, &product)) return std::nullopt;
  return product;
}

// The product of all factors, or nullopt on overflow.
inline std::optional<uint64_t> CheckedProduct(std::initializer_list<uint64_t> factors) {
  uint64_t product = 1;
  for (uint64_t factor : factors) {
    if (__builtin_mul_overflow(product, factor, &product)) return std::nullopt;
  }
  return product;
}

// a + b, or nullopt on overflow.
inline std::optional<uint64_t> CheckedAdd(uint64_t a, uint64_t b) {
  uint64_t sum;
  if (__builtin_add_overflow(a, b, &sum)) return std::nullopt;
  return sum;
}

}  // namespace mx
