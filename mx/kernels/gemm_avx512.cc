// The avx512 level: tile kernels with AVX-512 F/BW/VL/DQ + VNNI intrinsics.
// This file is compiled with those flags; the driver calls in only after
// CpuSupports() said the CPU has them.
//
// A 16-column panel of W is exactly one zmm of int32 or float lanes, so a tile
// is up to 4 rows × one panel in four accumulators, and the integer kinds need
// no int16 stage: vpdpbusd (u8·s8, four products per lane) and vpdpwssd (s16·s16,
// two) add straight into int32, exact for every pair those kinds take. Within a
// lane the sum over blocks runs in ascending block order, as everywhere.
//
// Kinds without a kernel here (kMxF64, kInt8) run the avx2 ones; the table of
// which kinds each level has is kHasKernel (gemm_internal.h), and the tests check
// that it and Avx512Tile below agree.
//
// Tests also compile this file against SIMDe's portable AVX-512 (with
// MX_KERNELS_EMULATED, tests/mx/kernels/simd_emulation.h), so its logic is
// checked bit for bit on machines without AVX-512; the entry point is then
// Avx512TileEmulated.
#ifdef MX_KERNELS_EMULATED
#define MX_AVX512_ENTRY Avx512TileEmulated
#else
// GCC 12's avx512fintrin.h trips its own -Wuninitialized (the _mm512_undefined_*
// helpers behind _mm512_set1_*); the warnings point into the header.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#ifndef __clang__  // a GCC-only warning group
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#pragma GCC diagnostic pop
#define MX_AVX512_ENTRY Avx512Tile
#endif

#include <cstring>

#include "mx/kernels/gemm_internal.h"

namespace mx::kernels::internal {
namespace {

#include "mx/kernels/i8_weights_avx512.inc"

inline __m512i Broadcast32(const void* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// The tile's 16 columns of row r in a register, and back.
inline __m512 LoadRow(const Tile& tile, int r) { return _mm512_loadu_ps(tile.y[r]); }
inline void StoreRow(Tile& tile, int r, __m512 v) { _mm512_storeu_ps(tile.y[r], v); }

// The fast epilogue: y += (float(dot) · 2^ex) · 2^ew, one rounding (FastScalesOk).
inline __m512 FastEpilogue(__m512i dot, float x_scale, __m512 w_scale, __m512 y) {
  const __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(dot), _mm512_set1_ps(x_scale));
  return _mm512_fmadd_ps(t, w_scale, y);
}

// kMxI8: u8 (w + offset) · s8 x with vpdpbusd, one k-group of 4 per
// instruction, the offset's share subtracted through block_offset. MXFP4 W
// (kNibbles) holds two groups' 4-bit codes in one 64-byte load — the layout of
// gemm_internal.h puts each group's 16 lanes × 4 k in order — widened by vpshufb.
template <int MR, bool kNibbles>
void MxI8Tile(const Problem& p, int64_t row0, int, int64_t panel) {
  const DecodedX& x = *p.x;
  const WeightPanels& w = *p.w;
  const int64_t kp = x.k_padded;
  const I8Weights512<kNibbles> weights(w, panel);
  Tile tile(p, panel, true);
  __m512 y[MR];
  for (int r = 0; r < MR; ++r) y[r] = LoadRow(tile, r);
  for (int64_t b = 0; b < x.blocks; ++b) {
    __m512i acc[MR];
    for (int r = 0; r < MR; ++r) {
      acc[r] = _mm512_set1_epi32(x.block_offset[(row0 + r) * x.blocks + b]);
    }
    for (int64_t group = b * 8; group < b * 8 + 8; group += 2) {
      __m512i w0, w1;
      weights.Pair(group, w0, w1);
      for (int r = 0; r < MR; ++r) {
        const int8_t* xr = x.i8.data() + (row0 + r) * kp + group * 4;
        acc[r] = _mm512_dpbusd_epi32(acc[r], w0, Broadcast32(xr));
        acc[r] = _mm512_dpbusd_epi32(acc[r], w1, Broadcast32(xr + 4));
      }
    }
    const __m512 ws = _mm512_loadu_ps(w.scale.data() + (panel * x.blocks + b) * kPanel);
    for (int r = 0; r < MR; ++r) {
      y[r] = FastEpilogue(acc[r], x.scale[(row0 + r) * x.blocks + b], ws, y[r]);
    }
  }
  for (int r = 0; r < MR; ++r) StoreRow(tile, r, y[r]);
  tile.Store(p, row0, MR);
}

// kMxI16: int16 pairs, vpdpwssd: one k-pair of the 16 lanes per instruction.
template <int MR>
void MxI16Tile(const Problem& p, int64_t row0, int, int64_t panel) {
  const DecodedX& x = *p.x;
  const WeightPanels& w = *p.w;
  const int64_t kp = x.k_padded;
  const int16_t* wp = w.i16.data() + panel * kp * kPanel;
  Tile tile(p, panel, true);
  __m512 y[MR];
  for (int r = 0; r < MR; ++r) y[r] = LoadRow(tile, r);
  for (int64_t b = 0; b < x.blocks; ++b) {
    __m512i acc[MR];
    for (int r = 0; r < MR; ++r) acc[r] = _mm512_setzero_si512();
    for (int64_t pair = b * 16; pair < b * 16 + 16; ++pair) {
      const __m512i wv = _mm512_loadu_si512(wp + pair * 2 * kPanel);
      for (int r = 0; r < MR; ++r) {
        acc[r] = _mm512_dpwssd_epi32(acc[r], wv, Broadcast32(x.i16.data() + (row0 + r) * kp + 2 * pair));
      }
    }
    const __m512 ws = _mm512_loadu_ps(w.scale.data() + (panel * x.blocks + b) * kPanel);
    for (int r = 0; r < MR; ++r) {
      y[r] = FastEpilogue(acc[r], x.scale[(row0 + r) * x.blocks + b], ws, y[r]);
    }
  }
  for (int r = 0; r < MR; ++r) StoreRow(tile, r, y[r]);
  tile.Store(p, row0, MR);
}

// Float kind: per output, fma over k ascending from the bias — the reference's
// order, so these bits equal the other levels' — 16 columns per instruction.
template <Format kStore>
inline __m512 LoadFloats(const WeightPanels& w, int64_t at) {
  if constexpr (kStore == Format::kFp32) {
    return _mm512_loadu_ps(w.f32.data() + at);
  } else {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.f16.data() + at));
    if constexpr (kStore == Format::kFp16) {
      return _mm512_cvtph_ps(h);
    } else {  // BF16: the top half of an FP32
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
  }
}

template <int MR, Format kStore>
void F32Tile(const Problem& p, int64_t row0, int, int64_t panel) {
  const DecodedX& x = *p.x;
  const WeightPanels& w = *p.w;
  const int64_t kp = x.k_padded;
  Tile tile(p, panel, true);
  __m512 y[MR];
  for (int r = 0; r < MR; ++r) y[r] = LoadRow(tile, r);
  const int64_t w_base = panel * kp * kPanel;
  for (int64_t k = 0; k < w.k; ++k) {
    const __m512 wv = LoadFloats<kStore>(w, w_base + k * kPanel);
    for (int r = 0; r < MR; ++r) {
      y[r] = _mm512_fmadd_ps(_mm512_set1_ps(x.f32[(row0 + r) * kp + k]), wv, y[r]);
    }
  }
  for (int r = 0; r < MR; ++r) StoreRow(tile, r, y[r]);
  tile.Store(p, row0, MR);
}

template <bool kNibbles>
struct I8 {
  template <int MR>
  struct K {
    static void Run(const Problem& p, int64_t r, int n, int64_t c) {
      MxI8Tile<MR, kNibbles>(p, r, n, c);
    }
  };
};
template <int MR>
struct I16K {
  static void Run(const Problem& p, int64_t r, int n, int64_t c) { MxI16Tile<MR>(p, r, n, c); }
};
template <Format kStore>
struct F32 {
  template <int MR>
  struct K {
    static void Run(const Problem& p, int64_t r, int n, int64_t c) {
      F32Tile<MR, kStore>(p, r, n, c);
    }
  };
};

}  // namespace

TileFn MX_AVX512_ENTRY(Kind kind, const Problem& p) {
  switch (kind) {
    case Kind::kMxI8:
      if (!p.fast_scales) return nullptr;
      return p.w->nibbles ? ByRows<I8<true>::K> : ByRows<I8<false>::K>;
    case Kind::kMxI16:
      return p.fast_scales ? ByRows<I16K> : nullptr;
    case Kind::kF32:
      switch (p.w->float_store) {
        case Format::kFp16: return ByRows<F32<Format::kFp16>::K>;
        case Format::kBf16: return ByRows<F32<Format::kBf16>::K>;
        default: return ByRows<F32<Format::kFp32>::K>;
      }
    case Kind::kMxF64:
    case Kind::kInt8:
      return nullptr;
  }
  return nullptr;
}

}  // namespace mx::kernels::internal
