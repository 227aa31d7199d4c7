// What the kernel tests need to run the avx512 and amx kernels on a CPU without
// those instructions: SIMDe's portable AVX-512 under the intrinsics' own names,
// the conversions SIMDe 0.7 lacks, and an emulation of the AMX tile
// instructions the amx kernels use. Included by the wrappers that compile a
// kernel source with MX_KERNELS_EMULATED (gemm_*_emulated.cc), built with AVX2
// and FMA so that SIMDe computes each 512-bit FMA as two native 256-bit ones:
// one rounding, as the hardware's.
#pragma once

#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "mx/element.h"

#define MX_KERNELS_EMULATED 1

namespace mx::kernels::emulated {

// int32 -> float rounds to nearest even; FP16 and u16 widen exactly.
inline __m512 Cvtepi32Ps(__m512i a) {
  int32_t in[16];
  float out[16];
  _mm512_storeu_si512(in, a);
  for (int i = 0; i < 16; ++i) out[i] = static_cast<float>(in[i]);
  return _mm512_loadu_ps(out);
}
inline __m512i Cvtepu16Epi32(__m256i a) {
  uint16_t in[16];
  int32_t out[16];
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(in), a);
  for (int i = 0; i < 16; ++i) out[i] = in[i];
  return _mm512_loadu_si512(out);
}
inline __m512 CvtphPs(__m256i a) {
  uint16_t in[16];
  float out[16];
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(in), a);
  for (int i = 0; i < 16; ++i) out[i] = Fp16ToFloat(in[i]);
  return _mm512_loadu_ps(out);
}
// float -> double widens exactly; double -> float rounds to nearest even.
inline __m512d CvtpsPd(__m256 a) {
  float in[8];
  double out[8];
  _mm256_storeu_ps(in, a);
  for (int i = 0; i < 8; ++i) out[i] = in[i];
  return _mm512_loadu_pd(out);
}
inline __m256 CvtpdPs(__m512d a) {
  double in[8];
  float out[8];
  _mm512_storeu_pd(in, a);
  for (int i = 0; i < 8; ++i) out[i] = static_cast<float>(in[i]);
  return _mm256_loadu_ps(out);
}

inline __m512d Cvtepi32Pd(__m256i a) {
  int32_t in[8];
  double out[8];
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(in), a);
  for (int i = 0; i < 8; ++i) out[i] = in[i];
  return _mm512_loadu_pd(out);
}
inline __m512i Cvtepu8Epi32(__m128i a) {
  uint8_t in[16];
  int32_t out[16];
  _mm_storeu_si128(reinterpret_cast<__m128i*>(in), a);
  for (int i = 0; i < 16; ++i) out[i] = in[i];
  return _mm512_loadu_si512(out);
}

// Masked loads and stores (SIMDe 0.7 has neither): only the lanes in the mask
// are read or written, as the hardware's, which never touches the others.
inline __m512 MaskzLoaduPs(uint16_t mask, const void* p) {
  float lanes[16] = {};
  for (int i = 0; i < 16; ++i) {
    if (mask >> i & 1) std::memcpy(&lanes[i], static_cast<const float*>(p) + i, 4);
  }
  return _mm512_loadu_ps(lanes);
}
inline __m512d MaskzLoaduPd(uint8_t mask, const void* p) {
  double lanes[8] = {};
  for (int i = 0; i < 8; ++i) {
    if (mask >> i & 1) std::memcpy(&lanes[i], static_cast<const double*>(p) + i, 8);
  }
  return _mm512_loadu_pd(lanes);
}
inline void MaskStoreuPs(void* p, uint16_t mask, __m512 v) {
  float lanes[16];
  _mm512_storeu_ps(lanes, v);
  for (int i = 0; i < 16; ++i) {
    if (mask >> i & 1) std::memcpy(static_cast<float*>(p) + i, &lanes[i], 4);
  }
}

// The BF16 dot-product step of VDPBF16PS and TDPBF16PS after the Intel SDM's
// pseudocode: acc += a1·b1, then acc += a0·b0 (the odd pair element first),
// with subnormal inputs and results flushed to zero (DAZ, FTZ) whatever MXCSR
// says. Here each product is rounded and flushed on its own before the add;
// hardware may fuse the two steps, but a product of two BF16 is exact in FP32
// unless subnormal, so this differs only where it flushes more — stricter, which
// suits a test of the guard. SIMDe's own dpbf16 keeps subnormals; this one must
// not, or the tests of the kernels' flush guard (kBf16 in gemm_internal.h)
// could not fail here.
inline float FlushSubnormal(float v) {
  return std::fpclassify(v) == FP_SUBNORMAL ? std::copysign(0.0f, v) : v;
}
inline float Bf16Value(uint16_t bits) {
  uint32_t u = uint32_t{bits} << 16;
  float v;
  std::memcpy(&v, &u, 4);
  return FlushSubnormal(v);
}
inline float Bf16PairStep(float acc, uint32_t a, uint32_t b) {
  acc = FlushSubnormal(acc + FlushSubnormal(Bf16Value(a >> 16) * Bf16Value(b >> 16)));
  return FlushSubnormal(acc + FlushSubnormal(Bf16Value(a & 0xffff) * Bf16Value(b & 0xffff)));
}
// (On the bits: the operands as __m512i, which the kernel's emulated branch passes.)
inline __m512 Dpbf16Ps(__m512 src, __m512i a, __m512i b) {
  float acc[16];
  uint32_t av[16], bv[16];
  _mm512_storeu_ps(acc, src);
  std::memcpy(av, &a, 64);
  std::memcpy(bv, &b, 64);
  for (int i = 0; i < 16; ++i) acc[i] = Bf16PairStep(FlushSubnormal(acc[i]), av[i], bv[i]);
  return _mm512_loadu_ps(acc);
}

// AMX: eight tile registers of up to 16 rows × 64 bytes per thread, shaped by
// the 64-byte configuration (palette 1: colsb[i] at bytes 16 + 2i, rows[i] at
// byte 48 + i), with the semantics of the Intel SDM for the instructions below.
struct TileState {
  uint8_t data[8][16][64] = {};
  uint16_t colsb[8] = {};
  uint8_t rows[8] = {};
  // LDTILECFG zeroes every tile.
  void ZeroData() { std::memset(data, 0, sizeof(data)); }
};
inline thread_local TileState tiles;

// What the hardware refuses with #UD or #GP (SDM, LDTILECFG and TDP*): the
// emulation stops the test with a message instead of computing something.
[[noreturn]] inline void TileFault(const char* what, int t) {
  std::fprintf(stderr, "AMX emulation: %s (tile %d)\n", what, t);
  std::abort();
}
inline void TileLoadConfig(const void* config) {
  const auto* c = static_cast<const uint8_t*>(config);
  if (c[0] != 1) TileFault("palette is not 1", -1);
  for (int t = 0; t < 8; ++t) {
    std::memcpy(&tiles.colsb[t], c + 16 + 2 * t, 2);
    tiles.rows[t] = c[48 + t];
    if (tiles.rows[t] > 16 || tiles.colsb[t] > 64 || tiles.colsb[t] % 4 != 0 ||
        (tiles.rows[t] == 0) != (tiles.colsb[t] == 0)) {
      TileFault("rows > 16, colsb > 64 or not a multiple of 4, or one of them 0", t);
    }
  }
  tiles.ZeroData();
}
inline void TileRelease() { tiles = TileState{}; }
inline void TileUsed(int t) {
  if (t < 0 || t >= 8 || tiles.rows[t] == 0) TileFault("unconfigured tile used", t);
}
inline void TileZero(int t) {
  TileUsed(t);
  std::memset(tiles.data[t], 0, sizeof(tiles.data[t]));
}
// The shapes TDPBF16PS takes: C rows × colsb = A rows × (B colsb),
// A's colsb / 4 = B's rows.
inline void TileShapes(int c, int a, int b) {
  TileUsed(c);
  TileUsed(a);
  TileUsed(b);
  if (tiles.rows[c] != tiles.rows[a] || tiles.colsb[c] != tiles.colsb[b] ||
      tiles.colsb[a] / 4 != tiles.rows[b] || c == a || c == b || a == b) {
    TileFault("tile shapes of a product do not match", c);
  }
}
// Rows beyond the configured ones, and bytes beyond colsb, read as zero.
inline void TileLoad(int t, const void* base, int64_t stride) {
  TileZero(t);
  for (int r = 0; r < tiles.rows[t]; ++r) {
    std::memcpy(tiles.data[t][r], static_cast<const uint8_t*>(base) + r * stride, tiles.colsb[t]);
  }
}
inline void TileStore(int t, void* base, int64_t stride) {
  TileUsed(t);
  for (int r = 0; r < tiles.rows[t]; ++r) {
    std::memcpy(static_cast<uint8_t*>(base) + r * stride, tiles.data[t][r], tiles.colsb[t]);
  }
}
// TDPBF16PS: C[m][n] = Bf16PairStep over k < colsb(A) / 4 of the pair A[m][k]
// (two BF16) and B[k][n], in ascending k, as the SDM's pseudocode.
inline void TileDpbf16ps(int c, int a, int b) {
  TileShapes(c, a, b);
  for (int m = 0; m < tiles.rows[c]; ++m) {
    for (int n = 0; n < tiles.colsb[c] / 4; ++n) {
      float acc;
      std::memcpy(&acc, &tiles.data[c][m][4 * n], 4);
      acc = FlushSubnormal(acc);
      for (int k = 0; k < tiles.colsb[a] / 4; ++k) {
        uint32_t x, w;
        std::memcpy(&x, &tiles.data[a][m][4 * k], 4);
        std::memcpy(&w, &tiles.data[b][k][4 * n], 4);
        acc = Bf16PairStep(acc, x, w);
      }
      std::memcpy(&tiles.data[c][m][4 * n], &acc, 4);
    }
  }
}

}  // namespace mx::kernels::emulated

// SIMDe includes the compiler's own immintrin.h, which defines the AMX macros
// (for the real instructions) whatever the target flags.
#undef _tile_loadconfig
#undef _tile_release
#undef _tile_zero
#undef _tile_loadd
#undef _tile_stored
#undef _tile_dpbf16ps
#undef _mm512_dpbf16_ps
#define _mm512_cvtepi32_ps mx::kernels::emulated::Cvtepi32Ps
#define _mm512_cvtepu16_epi32 mx::kernels::emulated::Cvtepu16Epi32
#define _mm512_cvtepu8_epi32 mx::kernels::emulated::Cvtepu8Epi32
#define _mm512_cvtepi32_pd mx::kernels::emulated::Cvtepi32Pd
#define _mm512_cvtph_ps mx::kernels::emulated::CvtphPs
#define _mm512_cvtps_pd mx::kernels::emulated::CvtpsPd
#define _mm512_cvtpd_ps mx::kernels::emulated::CvtpdPs
#define _mm512_maskz_loadu_ps mx::kernels::emulated::MaskzLoaduPs
#define _mm512_maskz_loadu_pd mx::kernels::emulated::MaskzLoaduPd
#define _mm512_mask_storeu_ps mx::kernels::emulated::MaskStoreuPs
#define _tile_loadconfig(config) mx::kernels::emulated::TileLoadConfig(config)
#define _tile_release() mx::kernels::emulated::TileRelease()
#define _tile_zero(t) mx::kernels::emulated::TileZero(t)
#define _tile_loadd(t, base, stride) mx::kernels::emulated::TileLoad(t, base, stride)
#define _tile_stored(t, base, stride) mx::kernels::emulated::TileStore(t, base, stride)
#define _tile_dpbf16ps(c, a, b) mx::kernels::emulated::TileDpbf16ps(c, a, b)
#define _mm512_dpbf16_ps mx::kernels::emulated::Dpbf16Ps
