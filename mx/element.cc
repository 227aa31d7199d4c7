#include "mx/element.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "mx/codebook.h"

namespace mx {
namespace {

// The shape of a minifloat element: enough to encode and decode it.
struct Minifloat {
  int exponent_bits;
  int mantissa_bits;
  int bias;
  Specials specials;
  bool saturate;  // clamp overflow to ±max normal (MX) rather than to ±Inf (IEEE)

  int max_exponent_field() const { return (1 << exponent_bits) - 1; }
  int emin() const { return 1 - bias; }
  int emax() const {
    return (specials == Specials::kIeee ? max_exponent_field() - 1 : max_exponent_field()) - bias;
  }
  // The largest significand (implicit bit included) at exponent emax.
  uint32_t max_significand() const {
    const uint32_t all_ones = (2u << mantissa_bits) - 1;
    return specials == Specials::kNanOnlyE4m3 ? all_ones - 1 : all_ones;
  }
};

Minifloat MinifloatOf(Format format) {
  const FormatTraits& t = Traits(format);
  return {t.exponent_bits, t.mantissa_bits, t.exponent_bias, t.specials,
          t.kind != FormatKind::kFloat};
}

// The magnitude of a finite, non-zero float: |v| = significand · 2^(exponent - 23).
// For a subnormal, exponent is -126 and the significand has no implicit bit.
struct FloatParts {
  uint64_t significand;
  int exponent;
};

FloatParts Split(uint32_t bits) {
  const int biased = static_cast<int>((bits >> 23) & 0xFF);
  const uint64_t fraction = bits & 0x7FFFFF;
  if (biased == 0) return {fraction, -126};
  return {fraction | 0x800000, biased - 127};
}

// Whether a remainder r of a step 2^shift (0 <= r < 2^shift, shift >= 1) rounds
// up stochastically with random bits u: r / 2^shift · 2^32 > u, compared exactly.
bool StochasticUp(uint64_t remainder, int shift, uint32_t u) {
  if (remainder == 0) return false;
  if (shift <= 32) return (remainder << (32 - shift)) > u;
  // r > u · 2^(shift - 32); r < 2^25 wherever this is called, so a non-zero u
  // shifted by 32 or more always wins.
  if (u == 0) return true;
  if (shift - 32 >= 32) return false;
  return remainder > (uint64_t{u} << (shift - 32));
}

// m / 2^shift rounded to an integer, shift >= 0 (m < 2^25).
uint64_t ShiftRightRounded(uint64_t m, int shift, Rounding rounding, uint32_t random_bits) {
  if (shift == 0) return m;
  if (shift >= 63) {  // the quotient is far below 1/2
    return rounding == Rounding::kStochastic && StochasticUp(m, shift, random_bits) ? 1 : 0;
  }
  const uint64_t quotient = m >> shift;
  const uint64_t remainder = m & ((uint64_t{1} << shift) - 1);
  if (rounding == Rounding::kStochastic) {
    return quotient + (StochasticUp(remainder, shift, random_bits) ? 1 : 0);
  }
  const uint64_t half = uint64_t{1} << (shift - 1);
  const bool round_up =
      remainder > half ||
      (remainder == half && (rounding == Rounding::kNearestAway || (quotient & 1)));
  return quotient + (round_up ? 1 : 0);
}

EncodeResult EncodeMinifloat(const Minifloat& f, float v, Rounding rounding, int scale_exponent,
                             uint32_t random_bits = 0) {
  const uint32_t bits = std::bit_cast<uint32_t>(v);
  const int p = f.mantissa_bits;
  const uint32_t sign_code = (bits >> 31) << (f.exponent_bits + p);
  const uint32_t max_code =
      sign_code | static_cast<uint32_t>(f.emax() + f.bias) << p | (f.max_significand() - (1u << p));
  const uint32_t inf_code = sign_code | static_cast<uint32_t>(f.max_exponent_field()) << p;
  const EncodeResult overflow = {f.saturate || f.specials != Specials::kIeee ? max_code : inf_code,
                                 true};

  const uint32_t magnitude = bits & 0x7FFFFFFF;
  if (magnitude > 0x7F800000) {  // NaN keeps its sign; formats without NaN give +0
    switch (f.specials) {
      case Specials::kIeee:
        return {inf_code | (1u << (p - 1)), false};
      case Specials::kNanOnlyE4m3:
        return {sign_code | ((1u << (f.exponent_bits + p)) - 1), false};
      case Specials::kNone:
        return {0, false};
    }
  }
  if (magnitude == 0x7F800000) {
    return f.specials == Specials::kIeee ? EncodeResult{inf_code, false} : overflow;
  }
  if (magnitude == 0) return {sign_code, false};

  const FloatParts parts = Split(bits);
  const int leading_bit = 63 - std::countl_zero(parts.significand);
  // True exponent of the scaled value, and the exponent whose step the result uses.
  const int exponent = parts.exponent - scale_exponent - (23 - leading_bit);
  if (exponent > f.emax()) return overflow;
  int step_exponent = exponent < f.emin() ? f.emin() : exponent;
  // Significand in units of 2^(step_exponent - p): |v|/2^scale / 2^(step_exponent - p).
  const int shift = step_exponent - p - (parts.exponent - scale_exponent - 23);
  uint64_t q = shift >= 0 ? ShiftRightRounded(parts.significand, shift, rounding, random_bits)
                          : parts.significand << -shift;  // exact: only FP32 subnormals
  if (q >> (p + 1)) {                                     // rounded up into the next binade
    q >>= 1;
    ++step_exponent;
  }
  if (step_exponent > f.emax() || (step_exponent == f.emax() && q > f.max_significand())) {
    return overflow;
  }
  if (q == 0) return {sign_code, false};
  if (q < (1u << p)) return {sign_code | static_cast<uint32_t>(q), false};  // subnormal
  return {sign_code | static_cast<uint32_t>(step_exponent + f.bias) << p |
              static_cast<uint32_t>(q - (1u << p)),
          false};
}

// Two's-complement byte holding round(v / 2^scale_exponent · 2^fraction_bits),
// clamped to ±127. NaN gives 0 (the caller records NaN elsewhere).
EncodeResult EncodeClampedInt8(float v, Rounding rounding, int scale_exponent, int fraction_bits,
                               uint32_t random_bits) {
  const uint32_t bits = std::bit_cast<uint32_t>(v);
  const uint32_t magnitude = bits & 0x7FFFFFFF;
  if (magnitude > 0x7F800000 || magnitude == 0) return {0, false};
  const bool negative = (bits >> 31) != 0;
  uint64_t q = 128;  // anything past 127 clamps; Inf lands here too
  if (magnitude < 0x7F800000) {
    const FloatParts parts = Split(bits);
    const int shift = 23 - fraction_bits + scale_exponent - parts.exponent;
    if (shift >= 0) q = ShiftRightRounded(parts.significand, shift, rounding, random_bits);
  }
  const bool overflowed = q > 127;
  const int k = overflowed ? 127 : static_cast<int>(q);
  return {static_cast<uint8_t>(negative ? -k : k), overflowed};
}

float DecodeMinifloat(const Minifloat& f, uint32_t code) {
  const int p = f.mantissa_bits;
  const bool negative = (code >> (f.exponent_bits + p)) & 1;
  const int exponent_field = static_cast<int>((code >> p) & f.max_exponent_field());
  const uint32_t mantissa = code & ((1u << p) - 1);
  float magnitude;
  if (f.specials == Specials::kIeee && exponent_field == f.max_exponent_field()) {
    magnitude = mantissa == 0 ? INFINITY : NAN;
  } else if (f.specials == Specials::kNanOnlyE4m3 && exponent_field == f.max_exponent_field() &&
             mantissa == (1u << p) - 1) {
    magnitude = NAN;
  } else if (exponent_field == 0) {
    magnitude = std::ldexp(static_cast<float>(mantissa), f.emin() - p);
  } else {
    magnitude = std::ldexp(static_cast<float>((1u << p) | mantissa), exponent_field - f.bias - p);
  }
  return negative ? -magnitude : magnitude;
}

}  // namespace

EncodeResult EncodeElementDetailed(Format format, float v, Rounding rounding, int scale_exponent,
                                   uint32_t random_bits) {
  switch (Traits(format).kind) {
    case FormatKind::kMxInt:
      return EncodeClampedInt8(v, rounding, scale_exponent, /*fraction_bits=*/6, random_bits);
    case FormatKind::kInt8:
      return EncodeClampedInt8(v, rounding, scale_exponent, /*fraction_bits=*/0, random_bits);
    case FormatKind::kCodebook:  // v already normalized; the thresholds decide
      return {CodebookCode(format, std::ldexp(v, -scale_exponent)), false};
    case FormatKind::kLoBcq:  // a block's codebook decides (mx/lobcq.h), not one value
      return {0, false};
    case FormatKind::kMxFloat:
    case FormatKind::kNvFloat:
    case FormatKind::kFloat:
      if (format == Format::kFp32) {
        return {std::bit_cast<uint32_t>(std::ldexp(v, -scale_exponent)), false};
      }
      return EncodeMinifloat(MinifloatOf(format), v, rounding, scale_exponent, random_bits);
  }
  return {0, false};
}

float DecodeElement(Format format, uint32_t code) {
  switch (Traits(format).kind) {
    case FormatKind::kMxInt:
      return static_cast<float>(static_cast<int8_t>(code)) / 64.0f;
    case FormatKind::kInt8:
      return static_cast<float>(static_cast<int8_t>(code));
    case FormatKind::kCodebook:
      return CodebookTable(format)[code & 15];
    case FormatKind::kLoBcq:  // the entry of code 4 bits says nothing without its block
      return NAN;
    case FormatKind::kMxFloat:
    case FormatKind::kNvFloat:
    case FormatKind::kFloat:
      if (format == Format::kFp32) return std::bit_cast<float>(code);
      return DecodeMinifloat(MinifloatOf(format), code);
  }
  return NAN;
}

bool IsSpecialCode(Format format, uint32_t code) {
  const FormatTraits& t = Traits(format);
  const int p = t.mantissa_bits;
  const uint32_t exponent_mask = (1u << t.exponent_bits) - 1;
  switch (t.specials) {
    case Specials::kNone:
      return false;
    case Specials::kNanOnlyE4m3:
      return (code & 0x7F) == 0x7F;
    case Specials::kIeee:
      return ((code >> p) & exponent_mask) == exponent_mask;
  }
  return false;
}

uint64_t CodeCount(Format format) { return uint64_t{1} << Traits(format).element_bits; }

int FixedPointFractionBits(Format format) {
  const FormatTraits& t = Traits(format);
  if (t.kind == FormatKind::kMxInt) return 6;
  // The smallest subnormal is 2^(emin - p) = 2^(1 - bias - p).
  return t.mantissa_bits + t.exponent_bias - 1;
}

int64_t ElementToFixed(Format format, uint32_t code) {
  const FormatTraits& t = Traits(format);
  if (t.kind == FormatKind::kMxInt) return static_cast<int8_t>(code);
  const int p = t.mantissa_bits;
  const uint32_t exponent_field = (code >> p) & ((1u << t.exponent_bits) - 1);
  const uint32_t mantissa = code & ((1u << p) - 1);
  const int64_t magnitude = exponent_field == 0
                                ? int64_t{mantissa}
                                : int64_t{(1u << p) | mantissa} << (exponent_field - 1);
  return ((code >> (t.exponent_bits + p)) & 1) ? -magnitude : magnitude;
}

uint16_t FloatToBf16(float v) {
  return static_cast<uint16_t>(
      EncodeMinifloat(MinifloatOf(Format::kBf16), v, Rounding::kNearestEven, 0).code);
}
float Bf16ToFloat(uint16_t bits) { return std::bit_cast<float>(uint32_t{bits} << 16); }
uint16_t FloatToFp16(float v) {
  return static_cast<uint16_t>(
      EncodeMinifloat(MinifloatOf(Format::kFp16), v, Rounding::kNearestEven, 0).code);
}
float Fp16ToFloat(uint16_t bits) { return DecodeMinifloat(MinifloatOf(Format::kFp16), bits); }

void WidenToFloat(Format source, const void* raw, size_t count, float* out) {
  const auto* bytes = static_cast<const unsigned char*>(raw);
  if (source == Format::kFp32) {
    std::memcpy(out, bytes, count * sizeof(float));
    return;
  }
  for (size_t i = 0; i < count; ++i) {
    uint16_t code;
    std::memcpy(&code, bytes + 2 * i, 2);
    out[i] = source == Format::kBf16 ? Bf16ToFloat(code) : Fp16ToFloat(code);
  }
}

}  // namespace mx
