// The avx2 level of fast quantization: AVX2, FMA and F16C intrinsics, eight values
// per register, one MX block (four registers) per step. The scheme is the
// header's; the same codes as the scalar level and the reference.
//
// This file is compiled with -mavx2 -mfma -mf16c and only called after the CPU
// says it has them. Everything here has internal linkage, and it calls nothing
// inline from shared headers, so no AVX-encoded copy of a shared function can be
// the one the linker keeps for the scalar level.
//
// The library is built with -ffp-contract=off, but a fused multiply-add could not
// change a result here anyway: the only products feeding additions are
// multiplications by powers of two, exact except far below the smallest element,
// where both forms encode as 0.
#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "mx/kernels/quantize_fast.h"

namespace mx::kernels::internal {
namespace {

constexpr uint32_t kAbsMask = 0x7FFFFFFF;
constexpr uint32_t kInfBits = 0x7F800000;

template <Format S>
using SourceType = std::conditional_t<S == Format::kFp32, float, uint16_t>;

float FloatOf(uint32_t bits) {
  float v;
  std::memcpy(&v, &bits, 4);
  return v;
}

// The shared exponent by the floor rule for the bits of a finite block maximum
// (mx::SharedExponent with ScaleRule::kFloor).
int FloorRuleExponent(uint32_t amax_bits, int emax) {
  if (amax_bits == 0) return -kScaleBias;
  const int biased = static_cast<int>(amax_bits >> 23);
  // A subnormal's floor(log2) is the position of its leading one bit, minus 149.
  const int floor_log2 = biased != 0 ? biased - 127 : (31 - __builtin_clz(amax_bits)) - 149;
  const int e = floor_log2 - emax;
  return e < -kScaleBias ? -kScaleBias : (e > kScaleBias ? kScaleBias : e);
}

// 2^e as a broadcast float, e in [-126, 127].
__m256 Pow2(int e) { return _mm256_castsi256_ps(_mm256_set1_epi32((e + 127) << 23)); }

// --- Sources: eight values widened exactly to FP32. ---

template <Format S>
__m256 Load8(const SourceType<S>* p) {
  if constexpr (S == Format::kFp32) {
    return _mm256_loadu_ps(p);
  } else {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    if constexpr (S == Format::kBf16) {
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    } else {
      return _mm256_cvtph_ps(h);  // exact, subnormals included; NaN keeps its sign
    }
  }
}

// --- Codes of one block of 32 finite values (four registers), in element order,
// one per byte of the result. ---

// Packing of four registers of 32-bit lanes into bytes with packs/packus leaves
// the 4-byte groups in the order 0 2 4 6 | 1 3 5 7 (in units of 4 elements); this
// permutation restores element order.
__m256i FixPackOrder(__m256i bytes) {
  return _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// Minifloat elements: the header's steps 2 to 4, as in the scalar level's
// MinifloatCodec (quantize_fast.cc), which explains the magic constant.
template <Format F, const ElementShape& S, bool kAway>
struct MinifloatCodec {
  static constexpr Format kFormat = F;
  static constexpr int kEmax = S.emax;
  static constexpr int kBits = 1 + S.exponent_bits + S.mantissa_bits;
  static constexpr int kP = S.mantissa_bits;
  static constexpr uint32_t kMinNormalBits = static_cast<uint32_t>(128 - S.bias) << 23;
  static constexpr uint32_t kMagicOffset =
      (static_cast<uint32_t>(23 - kP) << 23) - (static_cast<uint32_t>(128 - S.bias) << kP);

  // The magnitude codes of eight values given as |v|, one per 32-bit lane.
  static __m256i Magnitudes(__m256 magnitude, __m256 inverse_scale) {
    const __m256 s =
        _mm256_min_ps(_mm256_mul_ps(magnitude, inverse_scale), _mm256_set1_ps(S.max_normal));
    const __m256i exponent = _mm256_and_si256(
        _mm256_max_epi32(_mm256_castps_si256(s), _mm256_set1_epi32(kMinNormalBits)),
        _mm256_set1_epi32(kInfBits));
    const __m256 c = _mm256_castsi256_ps(
        _mm256_add_epi32(_mm256_add_epi32(exponent, _mm256_srli_epi32(exponent, 23 - kP)),
                         _mm256_set1_epi32(kMagicOffset)));
    const __m256 sum = _mm256_add_ps(s, c);  // the one rounding, ties to even
    __m256i code = _mm256_and_si256(_mm256_castps_si256(sum), _mm256_set1_epi32(0xFF));
    if constexpr (kAway) {
      // A tie rounded down (s - r, exact, is half a step): one code up.
      const __m256 half =
          _mm256_castsi256_ps(_mm256_sub_epi32(exponent, _mm256_set1_epi32((kP + 1) << 23)));
      const __m256 tie = _mm256_cmp_ps(_mm256_sub_ps(s, _mm256_sub_ps(sum, c)), half, _CMP_EQ_OQ);
      code = _mm256_sub_epi32(code, _mm256_castps_si256(tie));  // a true lane is -1
    }
    return code;
  }

  static __m256i Encode(const __m256 v[4], const __m256 magnitude[4], int e) {
    const __m256 inverse_scale = Pow2(-e);  // e <= 127 - emax < 127 for a finite amax
    const __m256i magnitudes =
        _mm256_packus_epi16(_mm256_packus_epi32(Magnitudes(magnitude[0], inverse_scale),
                                                Magnitudes(magnitude[1], inverse_scale)),
                            _mm256_packus_epi32(Magnitudes(magnitude[2], inverse_scale),
                                                Magnitudes(magnitude[3], inverse_scale)));
    // The sign bits: signed saturation keeps each value's sign in its byte's top bit
    // (a negative zero is a negative integer too), in the same order as above.
    const __m256i sign_bytes = _mm256_packs_epi16(
        _mm256_packs_epi32(_mm256_castps_si256(v[0]), _mm256_castps_si256(v[1])),
        _mm256_packs_epi32(_mm256_castps_si256(v[2]), _mm256_castps_si256(v[3])));
    __m256i signs = _mm256_and_si256(sign_bytes, _mm256_set1_epi8(static_cast<char>(0x80)));
    if constexpr (kBits < 8) signs = _mm256_srli_epi16(signs, 8 - kBits);  // to bit kBits-1
    return FixPackOrder(_mm256_or_si256(magnitudes, signs));
  }
};

// MXINT8: k = round(|v| · 2^(6 - e)) clamped to 127, two's complement.
template <bool kAway>
struct Mxint8Codec {
  static constexpr Format kFormat = Format::kMxint8;
  static constexpr int kEmax = 0;
  static constexpr int kBits = 8;

  static __m256i Codes(__m256 v, __m256 magnitude, __m256 factor) {
    const __m256 x = _mm256_mul_ps(magnitude, factor);
    __m256 r = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    if constexpr (kAway) {
      const __m256 tie = _mm256_cmp_ps(_mm256_sub_ps(x, r), _mm256_set1_ps(0.5f), _CMP_EQ_OQ);
      r = _mm256_add_ps(r, _mm256_and_ps(tie, _mm256_set1_ps(1.0f)));
    }
    const __m256i k = _mm256_cvttps_epi32(_mm256_min_ps(r, _mm256_set1_ps(127.0f)));
    return _mm256_sign_epi32(k, _mm256_castps_si256(v));  // negative v: -k (k = 0 stays 0)
  }

  static __m256i Encode(const __m256 v[4], const __m256 magnitude[4], int e) {
    __m256 m[4] = {magnitude[0], magnitude[1], magnitude[2], magnitude[3]};
    int shift = 6 - e;
    if (shift > 127) {
      // e < -121: 2^(6 - e) is no float. Only tiny blocks get here; |v| · 2^6 is exact.
      for (__m256& x : m) x = _mm256_mul_ps(x, _mm256_set1_ps(64.0f));
      shift = -e;
    }
    const __m256 factor = Pow2(shift);
    return FixPackOrder(_mm256_packs_epi16(
        _mm256_packs_epi32(Codes(v[0], m[0], factor), Codes(v[1], m[1], factor)),
        _mm256_packs_epi32(Codes(v[2], m[2], factor), Codes(v[3], m[3], factor))));
  }
};

// Stores 32 codes (one per byte, element order) bit-packed as mx::PackBlock does.
template <int kBits>
void StoreBlock(__m256i codes, uint8_t* block) {
  if constexpr (kBits == 8) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(block), codes);
  } else if constexpr (kBits == 6) {
    // Each 4-byte group c0 c1 c2 c3 becomes the 24-bit c0 | c1 << 6 | c2 << 12 | c3 << 18.
    const __m256i pairs = _mm256_maddubs_epi16(codes, _mm256_set1_epi16(0x4001));   // c0 + 64 c1
    const __m256i words = _mm256_madd_epi16(pairs, _mm256_set1_epi32(0x10000001));  // + 4096 ·
    // Three bytes of each group, twelve per lane, then both lanes' twelve together.
    const __m256i squeezed = _mm256_shuffle_epi8(
        words, _mm256_setr_epi8(0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1, 0, 1, 2, 4,
                                5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1));
    const __m256i packed =
        _mm256_permutevar8x32_epi32(squeezed, _mm256_setr_epi32(0, 1, 2, 4, 5, 6, 3, 7));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(block), _mm256_castsi256_si128(packed));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(block + 16), _mm256_extracti128_si256(packed, 1));
  } else {
    static_assert(kBits == 4);
    // c0 | c1 << 4 in each 16-bit pair, then the low bytes of the sixteen pairs.
    const __m256i pairs = _mm256_maddubs_epi16(codes, _mm256_set1_epi16(0x1001));
    const __m256i bytes = _mm256_permute4x64_epi64(_mm256_packus_epi16(pairs, pairs), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(block), _mm256_castsi256_si128(bytes));
  }
}

// The largest of 32 magnitudes, as bits; NaN and Inf compare at or above Inf.
uint32_t BlockAmaxBits(const __m256 magnitude[4]) {
  const auto bits = [](__m256 x) { return _mm256_castps_si256(x); };
  const __m256i m = _mm256_max_epu32(_mm256_max_epu32(bits(magnitude[0]), bits(magnitude[1])),
                                     _mm256_max_epu32(bits(magnitude[2]), bits(magnitude[3])));
  __m128i h = _mm_max_epu32(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
  h = _mm_max_epu32(h, _mm_shuffle_epi32(h, 0x4E));
  h = _mm_max_epu32(h, _mm_shuffle_epi32(h, 0xB1));
  return static_cast<uint32_t>(_mm_cvtsi128_si32(h));
}

template <Format S, class Codec>
void MxRows(const RowsJob& job) {
  using T = SourceType<S>;
  const int64_t blocks = (job.cols + kBlockSize - 1) / kBlockSize;
  const int64_t full_blocks = job.cols / kBlockSize;
  constexpr int kBlockBytes = kBlockSize * Codec::kBits / 8;
  const bool floor_rule = job.options.scale_rule == ScaleRule::kFloor;
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(kAbsMask));
  for (int64_t r = 0; r < job.rows; ++r) {
    const T* row = static_cast<const T*>(job.values) + r * job.cols;
    uint8_t* scales = job.block_scales + r * blocks;
    uint8_t* out = job.elements + r * blocks * kBlockBytes;
    for (int64_t b = 0; b < blocks; ++b) {
      const T* in = row + b * kBlockSize;
      T padded[kBlockSize];
      if (b == full_blocks) {
        // A short last block, padded with +0 (code 0).
        std::memset(padded, 0, sizeof(padded));
        std::memcpy(padded, in, (job.cols - b * kBlockSize) * sizeof(T));
        in = padded;
      }
      const __m256 v[4] = {Load8<S>(in), Load8<S>(in + 8), Load8<S>(in + 16), Load8<S>(in + 24)};
      const __m256 magnitude[4] = {_mm256_and_ps(v[0], abs_mask), _mm256_and_ps(v[1], abs_mask),
                                   _mm256_and_ps(v[2], abs_mask), _mm256_and_ps(v[3], abs_mask)};
      const uint32_t amax = BlockAmaxBits(magnitude);
      if (amax >= kInfBits) {
        scales[b] = kScaleNan;
        std::memset(out + b * kBlockBytes, 0, kBlockBytes);
        continue;
      }
      const int e = floor_rule ? FloorRuleExponent(amax, Codec::kEmax)
                               : SharedExponent(Codec::kFormat, FloatOf(amax), job.options);
      scales[b] = static_cast<uint8_t>(e + kScaleBias);
      StoreBlock<Codec::kBits>(Codec::Encode(v, magnitude, e), out + b * kBlockBytes);
    }
  }
}

// --- INT8: per-row scale amax / 127, codes round(v / scale) clamped to ±127. ---

template <Format S, bool kAway>
void Int8Rows(const RowsJob& job) {
  using T = SourceType<S>;
  const __m256i abs_mask = _mm256_set1_epi32(kAbsMask);
  const int64_t full = job.cols / kBlockSize * kBlockSize;
  for (int64_t r = 0; r < job.rows; ++r) {
    const T* row = static_cast<const T*>(job.values) + r * job.cols;
    uint8_t* out = job.elements + r * job.cols;
    // The tail, padded with +0: it changes neither the maximum nor the codes kept.
    T tail[kBlockSize] = {};
    std::memcpy(tail, row + full, (job.cols - full) * sizeof(T));
    __m256i max = _mm256_setzero_si256();
    for (int64_t i = 0; i < job.cols; i += 8) {
      const __m256 v = Load8<S>(i < full ? row + i : tail + (i - full));
      max = _mm256_max_epu32(max, _mm256_and_si256(_mm256_castps_si256(v), abs_mask));
    }
    __m128i h = _mm_max_epu32(_mm256_castsi256_si128(max), _mm256_extracti128_si256(max, 1));
    h = _mm_max_epu32(h, _mm_shuffle_epi32(h, 0x4E));
    h = _mm_max_epu32(h, _mm_shuffle_epi32(h, 0xB1));
    const uint32_t amax = static_cast<uint32_t>(_mm_cvtsi128_si32(h));
    if (amax >= kInfBits || amax == 0) {
      std::memset(out, 0, job.cols);
      job.row_scales[r] = amax == 0 ? 0.0f : std::numeric_limits<float>::quiet_NaN();
      continue;
    }
    const float scale = FloatOf(amax) / 127.0f;
    job.row_scales[r] = scale;
    const __m256 divisor = _mm256_set1_ps(scale);
    // A scale that underflowed to 0 makes 0 / 0 = NaN, whose code is 0.
    const bool may_be_nan = scale == 0.0f;
    const auto codes = [&](__m256 v) {
      const __m256 q = _mm256_div_ps(v, divisor);  // IEEE division, as the reference's
      const __m256 a = _mm256_and_ps(q, _mm256_castsi256_ps(abs_mask));
      __m256 rounded = _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      if constexpr (kAway) {
        const __m256 tie =
            _mm256_cmp_ps(_mm256_sub_ps(a, rounded), _mm256_set1_ps(0.5f), _CMP_EQ_OQ);
        rounded = _mm256_add_ps(rounded, _mm256_and_ps(tie, _mm256_set1_ps(1.0f)));
      }
      __m256i k = _mm256_cvttps_epi32(_mm256_min_ps(rounded, _mm256_set1_ps(127.0f)));
      if (may_be_nan) k = _mm256_and_si256(k, _mm256_castps_si256(_mm256_cmp_ps(q, q, _CMP_ORD_Q)));
      return _mm256_sign_epi32(k, _mm256_castps_si256(q));
    };
    const auto block = [&](const T* in) {
      return FixPackOrder(_mm256_packs_epi16(
          _mm256_packs_epi32(codes(Load8<S>(in)), codes(Load8<S>(in + 8))),
          _mm256_packs_epi32(codes(Load8<S>(in + 16)), codes(Load8<S>(in + 24)))));
    };
    for (int64_t i = 0; i < full; i += kBlockSize) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), block(row + i));
    }
    if (full < job.cols) {
      uint8_t bytes[kBlockSize];
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(bytes), block(tail));
      std::memcpy(out + full, bytes, job.cols - full);
    }
  }
}

// --- BF16, FP16 and FP32 outputs: element-wise conversions. ---

// FP32 to BF16 codes in 32-bit lanes: nearest even, overflow to Inf, NaN to the
// quiet NaN of its sign (mx::FloatToBf16).
__m256i ToBf16(__m256 v) {
  const __m256i x = _mm256_castps_si256(v);
  const __m256i high = _mm256_srli_epi32(x, 16);
  const __m256i lsb = _mm256_and_si256(high, _mm256_set1_epi32(1));
  const __m256i rounded =
      _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7FFF)), lsb), 16);
  const __m256i nan =
      _mm256_or_si256(_mm256_and_si256(high, _mm256_set1_epi32(0x8000)), _mm256_set1_epi32(0x7FC0));
  return _mm256_blendv_epi8(rounded, nan, _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
}

// FP32 to FP16 codes, the same rules (mx::FloatToFp16).
__m128i ToFp16(__m256 v) {
  const __m128i h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT);
  const __m256i nan32 = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  const __m128i nan16 =
      _mm_packs_epi32(_mm256_castsi256_si128(nan32), _mm256_extracti128_si256(nan32, 1));
  const __m128i quiet = _mm_or_si128(_mm_and_si128(h, _mm_set1_epi16(static_cast<short>(0x8000))),
                                     _mm_set1_epi16(0x7E00));
  return _mm_blendv_epi8(h, quiet, nan16);
}

// FP16 widened to FP32 for an FP32 output: NaN becomes the quiet NaN of its sign,
// as mx::Fp16ToFloat gives.
__m256 Fp16ToFp32Canonical(__m256 x) {
  const __m256 quiet = _mm256_or_ps(_mm256_and_ps(x, _mm256_set1_ps(-0.0f)),
                                    _mm256_castsi256_ps(_mm256_set1_epi32(0x7FC00000)));
  return _mm256_blendv_ps(x, quiet, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

template <Format S>
void FloatRows(const RowsJob& job) {
  using T = SourceType<S>;
  const T* in = static_cast<const T*>(job.values);
  const int64_t count = job.rows * job.cols;
  const int64_t element_bytes = job.format == Format::kFp32 ? 4 : 2;
  if constexpr (S == Format::kFp32) {
    if (job.format == Format::kFp32) {
      std::memcpy(job.elements, in, count * sizeof(float));
      return;
    }
  }
  // 16 values per step; the tail through a buffer padded with zeros.
  constexpr int kStep = 16;
  const auto convert = [&](const T* src, uint8_t* dst) {
    const __m256 v0 = Load8<S>(src), v1 = Load8<S>(src + 8);
    if (job.format == Format::kFp32) {
      const auto widen = [](__m256 x) { return S == Format::kFp16 ? Fp16ToFp32Canonical(x) : x; };
      _mm256_storeu_ps(reinterpret_cast<float*>(dst), widen(v0));
      _mm256_storeu_ps(reinterpret_cast<float*>(dst + 32), widen(v1));
    } else if (job.format == Format::kBf16) {
      const __m256i codes =
          _mm256_permute4x64_epi64(_mm256_packus_epi32(ToBf16(v0), ToBf16(v1)), 0xD8);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), codes);
    } else {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), ToFp16(v0));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 16), ToFp16(v1));
    }
  };
  const int64_t full = count / kStep * kStep;
  for (int64_t i = 0; i < full; i += kStep) convert(in + i, job.elements + i * element_bytes);
  if (full < count) {
    T tail[kStep] = {};
    std::memcpy(tail, in + full, (count - full) * sizeof(T));
    uint8_t bytes[kStep * 4];
    convert(tail, bytes);
    std::memcpy(job.elements + full * element_bytes, bytes, (count - full) * element_bytes);
  }
}

#include "mx/kernels/quantize_dispatch.inc"

// Transposes the 8 × 8 floats in r[0..7] in place.
void Transpose8x8(__m256 r[8]) {
  __m256 t[8], u[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 2; ++i) {
    u[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
    u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
    u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
    u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
    r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
  }
}

#include "mx/kernels/ue4m3.inc"

// E2M1 magnitudes of eight |q| ≤ 6 by comparisons with the grid's midpoints:
// each true comparison (all ones, -1) subtracted once.
template <bool kAway>
__m256i E2m1Magnitudes(__m256 a) {
  constexpr int kUp = kAway ? _CMP_GE_OQ : _CMP_GT_OQ;  // at the ties that go to the even code down
  __m256i m = _mm256_setzero_si256();
  const auto count = [&](__m256 mask) { m = _mm256_sub_epi32(m, _mm256_castps_si256(mask)); };
  count(_mm256_cmp_ps(a, _mm256_set1_ps(0.25f), kUp));
  count(_mm256_cmp_ps(a, _mm256_set1_ps(0.75f), _CMP_GE_OQ));
  count(_mm256_cmp_ps(a, _mm256_set1_ps(1.25f), kUp));
  count(_mm256_cmp_ps(a, _mm256_set1_ps(1.75f), _CMP_GE_OQ));
  count(_mm256_cmp_ps(a, _mm256_set1_ps(2.5f), kUp));
  count(_mm256_cmp_ps(a, _mm256_set1_ps(3.5f), _CMP_GE_OQ));
  count(_mm256_cmp_ps(a, _mm256_set1_ps(5.0f), kUp));
  return m;
}

template <bool kAway>
void NvRowsOf(const float* values, int64_t rows, int64_t cols, float ts, uint8_t* elements,
              uint8_t* scales, float* row_scales) {
  constexpr int kBlock = 16;
  const int64_t blocks = (cols + kBlock - 1) / kBlock;
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(kAbsMask)));
  const __m256i sign_to_bit3 = _mm256_set1_epi32(8);
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = values + r * cols;
    row_scales[r] = ts;
    for (int64_t b = 0; b < blocks; ++b) {
      alignas(32) float v[kBlock] = {};
      const int64_t count = cols - b * kBlock < kBlock ? cols - b * kBlock : kBlock;
      std::memcpy(v, row + b * kBlock, count * sizeof(float));
      const __m256 v0 = _mm256_load_ps(v), v1 = _mm256_load_ps(v + 8);
      const __m256i m0 = _mm256_castps_si256(_mm256_and_ps(v0, abs_mask));
      const __m256i m1 = _mm256_castps_si256(_mm256_and_ps(v1, abs_mask));
      alignas(32) uint32_t lanes[8];
      _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), _mm256_max_epu32(m0, m1));
      uint32_t max_bits = 0;
      for (uint32_t lane : lanes) max_bits = lane > max_bits ? lane : max_bits;
      uint8_t* block = elements + r * blocks * 8 + b * 8;
      if (max_bits >= kInfBits) {
        scales[r * blocks + b] = 0x7F;  // kNvScaleNan
        std::memset(block, 0, 8);
        continue;
      }
      float s = FloatOf(max_bits) / 6.0f / ts;
      s = s < 0x1p-6f ? 0x1p-6f : s > 448.0f ? 448.0f : s;
      float scale_value;
      scales[r * blocks + b] = RoundUe4m3(s, scale_value);
      const __m256 total = _mm256_set1_ps(ts * scale_value);
      const __m256 six = _mm256_set1_ps(6.0f);
      alignas(32) int32_t codes[kBlock];
      for (int h = 0; h < 2; ++h) {
        const __m256 q = _mm256_div_ps(h == 0 ? v0 : v1, total);
        const __m256 a = _mm256_min_ps(_mm256_and_ps(q, abs_mask), six);
        const __m256i sign = _mm256_and_si256(
            _mm256_srli_epi32(_mm256_castps_si256(q), 28), sign_to_bit3);
        _mm256_store_si256(reinterpret_cast<__m256i*>(codes + 8 * h),
                           _mm256_or_si256(E2m1Magnitudes<kAway>(a), sign));
      }
      for (int i = 0; i < kBlock / 2; ++i) {
        block[i] = static_cast<uint8_t>(codes[2 * i] | (codes[2 * i + 1] << 4));
      }
    }
  }
}

}  // namespace

void QuantizeRowsAvx2(const RowsJob& job) { RowsOfJob(job); }

void NvRowsAvx2(const float* values, int64_t rows, int64_t cols, float ts, bool away,
                uint8_t* elements, uint8_t* scales, float* row_scales) {
  if (away) {
    NvRowsOf<true>(values, rows, cols, ts, elements, scales, row_scales);
  } else {
    NvRowsOf<false>(values, rows, cols, ts, elements, scales, row_scales);
  }
}

void TransposePanelAvx2(const float* values, int64_t k, int64_t n, int64_t j0, int width,
                        float* panel) {
  const int64_t k8 = k / 8 * 8;
  const int width8 = width / 8 * 8;
  for (int64_t i0 = 0; i0 < k8; i0 += 8) {
    for (int jj = 0; jj < width8; jj += 8) {
      __m256 r[8];
      for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(values + (i0 + i) * n + j0 + jj);
      Transpose8x8(r);
      for (int j = 0; j < 8; ++j) _mm256_storeu_ps(panel + (jj + j) * k + i0, r[j]);
    }
    for (int j = width8; j < width; ++j) {
      for (int64_t i = i0; i < i0 + 8; ++i) panel[j * k + i] = values[i * n + j0 + j];
    }
  }
  for (int64_t i = k8; i < k; ++i) {
    for (int j = 0; j < width; ++j) panel[j * k + i] = values[i * n + j0 + j];
  }
}

}  // namespace mx::kernels::internal
