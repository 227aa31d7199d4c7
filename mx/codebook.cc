#include "mx/codebook.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>

namespace mx {
namespace {

// NF4: bitsandbytes' published FP32 constants, sorted (code = index).
constexpr std::array<float, 16> kNf4 = {
    -1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f,
    -0.28444138169288635f, -0.18477343022823334f, -0.09105003625154495f, 0.0f,
    0.07958029955625534f, 0.16093020141124725f, 0.24611230194568634f, 0.33791524171829224f,
    0.44070982933044434f, 0.5626170039176941f, 0.7229568362236023f, 1.0f};

// bitsandbytes FP4: the magnitude of each 3-bit code (sign in bit 3), its
// dequantization constants (each is the FP32 nearest the rational k/12).
constexpr std::array<float, 8> kFp4Magnitudes = {0.0f,        5.208333333e-03f, 0.66666667f,
                                                 1.0f,        0.33333333f,      0.5f,
                                                 0.16666667f, 0.25f};

// The 3-bit codes of the FP4 magnitudes in ascending order, and bitsandbytes'
// thresholds between them (dQuantizeFP4's decimal literals: the midpoints to six
// to eight digits, not the FP32 midpoints — 0.583333 lies 6 ULPs below 7/12).
constexpr std::array<uint8_t, 8> kFp4Ascending = {0b000, 0b001, 0b110, 0b111,
                                                  0b100, 0b101, 0b010, 0b011};
constexpr std::array<float, 7> kFp4Thresholds = {0.00260417f, 0.0859375f, 0.20833333f,
                                                 0.29166667f, 0.4166667f, 0.583333f,
                                                 0.8333333f};

constexpr float Midpoint(float a, float b) {
  // Exact in double (two FP32 values), then one rounding to FP32.
  return static_cast<float>((static_cast<double>(a) + static_cast<double>(b)) / 2.0);
}

// The FP4 table by code, negatives mirrored (code 8 is -0).
constexpr std::array<float, 16> kFp4 = [] {
  std::array<float, 16> t{};
  for (int code = 0; code < 16; ++code) {
    const float m = kFp4Magnitudes[code & 7];
    t[code] = code & 8 ? -m : m;
  }
  return t;
}();

// NF4: the FP32 nearest each exact midpoint, which is what bitsandbytes'
// dQuantizeNF4 literals round to (all 15 checked).
constexpr std::array<float, 15> kNf4Thresholds = [] {
  std::array<float, 15> t{};
  for (int i = 0; i < 15; ++i) t[i] = Midpoint(kNf4[i], kNf4[i + 1]);
  return t;
}();

// How many thresholds n lies above (strictly): its index among the entries.
template <size_t N>
int Above(const std::array<float, N>& thresholds, float n) {
  int i = 0;
  while (i < static_cast<int>(N) && n > thresholds[i]) ++i;
  return i;
}

}  // namespace

const std::array<float, 16>& CodebookTable(Format format) {
  assert(Traits(format).kind == FormatKind::kCodebook);
  return format == Format::kNf4 ? kNf4 : kFp4;
}

uint8_t CodebookCode(Format format, float n) {
  if (format == Format::kNf4) return static_cast<uint8_t>(Above(kNf4Thresholds, n));
  const uint8_t sign = n < 0.0f ? 8 : 0;
  return static_cast<uint8_t>(sign | kFp4Ascending[Above(kFp4Thresholds, std::fabs(n))]);
}

uint8_t CodebookZeroCode(Format format) { return format == Format::kNf4 ? 7 : 0; }

float QuantizeCodebookBlock(Format format, std::span<const float> values,
                            std::span<uint8_t> codes) {
  assert(values.size() <= kCodebookBlockSize && codes.size() == values.size());
  float absmax = 0.0f;
  bool special = false;
  for (const float v : values) {
    special |= !std::isfinite(v);
    absmax = std::max(absmax, std::fabs(v));
  }
  if (special || absmax == 0.0f) {
    std::fill(codes.begin(), codes.end(), CodebookZeroCode(format));
    return special ? std::numeric_limits<float>::quiet_NaN() : 0.0f;
  }
  const float reciprocal = 1.0f / absmax;
  const bool multiply = std::isfinite(reciprocal);
  for (size_t i = 0; i < values.size(); ++i) {
    const float n = multiply ? values[i] * reciprocal : values[i] / absmax;
    codes[i] = CodebookCode(format, n);
  }
  return absmax;
}

}  // namespace mx
