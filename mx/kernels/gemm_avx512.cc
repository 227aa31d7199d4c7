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
// kMxF64 (pairs with MXFP8) runs FP64 FMAs, 8 lanes per zmm, two per panel;
// kInt8 the int16 pairs of its packing through vpdpwssd over the whole K. The
// table of which kinds each level has is kHasKernel (gemm_internal.h), and the
// tests check that it and Avx512Tile below agree.
//
// Tests also compile this file against SIMDe's portable AVX-512 (with
// MX_KERNELS_EMULATED, tests/mx/kernels/simd_emulation.h), so its logic is
// checked bit for bit on machines without AVX-512; the entry point is then
// Avx512TileEmulated.
#ifdef MX_KERNELS_EMULATED
#define MX_AVX512_ENTRY Avx512TileEmulated
#else
#include "mx/kernels/avx512_intrinsics.h"
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

// acc[r] += Σ over k-pairs [first, last) of row r's int16 pair · the panel's, per
// lane (vpdpwssd): the inner loop of kMxI16 (one block's 16 pairs) and INT8 (all).
template <int MR>
void I16Pairs(const DecodedX& x, const int16_t* wp, int64_t row0, int64_t first, int64_t last,
              __m512i* acc) {
  const int64_t kp = x.k_padded;
  for (int64_t pair = first; pair < last; ++pair) {
    const __m512i wv = _mm512_loadu_si512(wp + pair * 2 * kPanel);
    for (int r = 0; r < MR; ++r) {
      acc[r] =
          _mm512_dpwssd_epi32(acc[r], wv, Broadcast32(x.i16.data() + (row0 + r) * kp + 2 * pair));
    }
  }
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
    I16Pairs<MR>(x, wp, row0, b * 16, b * 16 + 16, acc);
    const __m512 ws = _mm512_loadu_ps(w.scale.data() + (panel * x.blocks + b) * kPanel);
    for (int r = 0; r < MR; ++r) {
      y[r] = FastEpilogue(acc[r], x.scale[(row0 + r) * x.blocks + b], ws, y[r]);
    }
  }
  for (int r = 0; r < MR; ++r) StoreRow(tile, r, y[r]);
  tile.Store(p, row0, MR);
}

// INT8: the whole K in int32 (vpdpwssd on the int16 pairs; exact: the driver
// caps K at 2^17), then (float(dot) · scale_x) · scale_w, then the bias, in the
// reference's order (no fused multiply-add).
template <int MR>
void Int8Tile(const Problem& p, int64_t row0, int, int64_t panel) {
  const DecodedX& x = *p.x;
  const WeightPanels& w = *p.w;
  const int64_t kp = x.k_padded;
  const int16_t* wp = w.i16.data() + panel * kp * kPanel;
  Tile tile(p, panel, false);
  __m512i acc[MR];
  for (int r = 0; r < MR; ++r) acc[r] = _mm512_setzero_si512();
  I16Pairs<MR>(x, wp, row0, 0, kp / 2, acc);
  const __m512 ws = _mm512_loadu_ps(w.scale.data() + panel * kPanel);
  for (int r = 0; r < MR; ++r) {
    __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(acc[r]), _mm512_set1_ps(x.scale[row0 + r]));
    v = _mm512_mul_ps(v, ws);
    StoreRow(tile, r, v);
  }
  if (p.bias) {
    for (int r = 0; r < MR; ++r) {
      for (int j = 0; j < tile.cols; ++j) tile.y[r][j] += p.bias[tile.n0 + j];
    }
  }
  tile.Store(p, row0, MR);
}

// kMxF64: W's FP16 element values widened to doubles, 8 lanes per zmm, FP64 FMAs
// per block (exact: the driver checked that every block sum fits 53 bits), then
// the wide epilogue float(dot · 2^ex · 2^ew) added to y block by block.
template <int MR>
void MxF64Tile(const Problem& p, int64_t row0, int, int64_t panel) {
  const DecodedX& x = *p.x;
  const WeightPanels& w = *p.w;
  const int64_t kp = x.k_padded;
  const uint16_t* wp = w.f16.data() + panel * kp * kPanel;
  Tile tile(p, panel, true);
  __m512 y[MR];
  for (int r = 0; r < MR; ++r) y[r] = LoadRow(tile, r);
  for (int64_t b = 0; b < x.blocks; ++b) {
    __m512d acc[MR][2];
    for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_pd();
    for (int64_t k = b * kBlockSize; k < (b + 1) * kBlockSize; ++k) {
      const __m512 wf =
          _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wp + k * kPanel)));
      const __m512d w0 = _mm512_cvtps_pd(_mm512_castps512_ps256(wf));
      const __m512d w1 = _mm512_cvtps_pd(
          _mm256_castsi256_ps(_mm512_extracti64x4_epi64(_mm512_castps_si512(wf), 1)));
      for (int r = 0; r < MR; ++r) {
        const __m512d xv = _mm512_set1_pd(x.f64[(row0 + r) * kp + k]);
        acc[r][0] = _mm512_fmadd_pd(xv, w0, acc[r][0]);
        acc[r][1] = _mm512_fmadd_pd(xv, w1, acc[r][1]);
      }
    }
    const double* ws = w.scale_d.data() + (panel * x.blocks + b) * kPanel;
    const __m512d ws0 = _mm512_loadu_pd(ws), ws1 = _mm512_loadu_pd(ws + 8);
    for (int r = 0; r < MR; ++r) {
      const __m512d xs = _mm512_set1_pd(x.scale_d[(row0 + r) * x.blocks + b]);
      const __m256 lo = _mm512_cvtpd_ps(_mm512_mul_pd(_mm512_mul_pd(acc[r][0], xs), ws0));
      const __m256 hi = _mm512_cvtpd_ps(_mm512_mul_pd(_mm512_mul_pd(acc[r][1], xs), ws1));
      const __m512 block = _mm512_castsi512_ps(_mm512_inserti64x4(
          _mm512_castsi256_si512(_mm256_castps_si256(lo)), _mm256_castps_si256(hi), 1));
      y[r] = _mm512_add_ps(y[r], block);
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

}  // namespace

TileFn MX_AVX512_ENTRY(Kind kind, const Problem& p) {
  switch (kind) {
    case Kind::kMxI8:
      if (!p.fast_scales) return nullptr;
      return p.w->nibbles ? MX_BY_ROWS(MxI8Tile, true) : MX_BY_ROWS(MxI8Tile, false);
    case Kind::kMxI16:
      return p.fast_scales ? MX_BY_ROWS(MxI16Tile) : nullptr;
    case Kind::kF32:
      switch (p.w->float_store) {
        case Format::kFp16:
          return MX_BY_ROWS(F32Tile, Format::kFp16);
        case Format::kBf16:
          return MX_BY_ROWS(F32Tile, Format::kBf16);
        default:
          return MX_BY_ROWS(F32Tile, Format::kFp32);
      }
    case Kind::kMxF64:
      return MX_BY_ROWS(MxF64Tile);
    case Kind::kInt8:
      return MX_BY_ROWS(Int8Tile);
    case Kind::kNvI8:
      return nullptr;  // the avx2 level's kernel runs (kHasKernel)
  }
  return nullptr;
}

}  // namespace mx::kernels::internal
