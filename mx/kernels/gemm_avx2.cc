// The avx2 level: tile kernels with AVX2/FMA/F16C intrinsics. This file is
// compiled with -mavx2 -mfma -mf16c; the driver calls in only after
// CpuSupports() said the CPU has them.
//
// Each tile is up to 4 rows of X by one 16-column panel of W, processed as two
// 8-column halves (one ymm of int32 or float lanes, two of doubles). Within a
// lane the sum over blocks runs in ascending block order: SIMD spans N only.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "mx/kernels/gemm_internal.h"

namespace mx::kernels::internal {
namespace {

inline __m256i Broadcast32(const void* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

// The fast epilogue of one row: y += (float(acc) · 2^ex) · 2^ew, one rounding
// (FastScalesOk holds, so both products are exact).
inline void FastEpilogue(__m256i acc, float x_scale, __m256 w_scale, float* y) {
  const __m256 t = _mm256_mul_ps(_mm256_cvtepi32_ps(acc), _mm256_set1_ps(x_scale));
  _mm256_store_ps(y, _mm256_fmadd_ps(t, w_scale, _mm256_load_ps(y)));
}

// The kMxI8 bytes of one W panel, two groups of 4 k at a time, from either
// storage (gemm_internal.h): 32 bytes per group and half, or the 4-bit codes of
// both groups in one load, widened by vpshufb through the code table.
template <bool kNibbles>
struct I8Weights {
  const uint8_t* base;
  __m256i lut, low4;

  I8Weights(const WeightPanels& w, int64_t panel)
      : base(U8Panel(w, panel, kNibbles)),
        lut(_mm256_broadcastsi128_si256(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(w.nibble_lut.data())))),
        low4(_mm256_set1_epi8(0x0F)) {}

  // Groups `group` (even) and `group + 1`, 8-column half h.
  void Pair(int64_t group, int h, __m256i& first, __m256i& second) const {
    if constexpr (kNibbles) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(base + (group + h) * 32));
      first = _mm256_shuffle_epi8(lut, _mm256_and_si256(v, low4));
      second = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(v, 4), low4));
    } else {
      first = One(group, h);
      second = One(group + 1, h);
    }
  }
  // One group (wide storage only).
  __m256i One(int64_t group, int h) const {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(base + group * 4 * kPanel + 32 * h));
  }
};

// kMxI8: u8 (w + offset) × s8 x with vpmaddubsw into int16 pairs, G k-groups of
// 4 summed in int16 (G chosen so they cannot overflow), then widened to int32
// with vpmaddwd. The offset's share comes back through block_offset. MXFP4 W
// (kNibbles) comes as 4-bit codes, two groups per load, and one vpshufb per
// group turns them into the same bytes: half the weight traffic.
template <int MR, int G, bool kNibbles>
void MxI8Tile(const Problem& p, int64_t row0, int, int64_t panel) {
  static_assert(!kNibbles || G % 2 == 0, "nibble storage holds groups in pairs");
  const DecodedX& x = *p.x;
  const WeightPanels& w = *p.w;
  const int64_t kp = x.k_padded;
  const I8Weights<kNibbles> weights(w, panel);
  const __m256i ones = _mm256_set1_epi16(1);
  Tile tile(p, panel, true);
  for (int h = 0; h < 2; ++h) {
    for (int64_t b = 0; b < x.blocks; ++b) {
      __m256i acc[MR];
      for (int r = 0; r < MR; ++r) {
        acc[r] = _mm256_set1_epi32(x.block_offset[(row0 + r) * x.blocks + b]);
      }
      for (int g0 = 0; g0 < 8; g0 += G) {
        __m256i acc16[MR];
        for (int r = 0; r < MR; ++r) acc16[r] = _mm256_setzero_si256();
        if constexpr (G == 1) {
          const int64_t group = b * 8 + g0;  // 4 consecutive k
          const __m256i wv = weights.One(group, h);
          for (int r = 0; r < MR; ++r) {
            const __m256i xv = Broadcast32(x.i8.data() + (row0 + r) * kp + group * 4);
            acc16[r] = _mm256_maddubs_epi16(wv, xv);
          }
        } else {
          for (int g = g0; g < g0 + G; g += 2) {
            const int64_t group = b * 8 + g;
            __m256i w0, w1;
            weights.Pair(group, h, w0, w1);
            for (int r = 0; r < MR; ++r) {
              const int8_t* xr = x.i8.data() + (row0 + r) * kp + group * 4;
              acc16[r] = _mm256_add_epi16(acc16[r], _mm256_maddubs_epi16(w0, Broadcast32(xr)));
              acc16[r] = _mm256_add_epi16(acc16[r], _mm256_maddubs_epi16(w1, Broadcast32(xr + 4)));
            }
          }
        }
        for (int r = 0; r < MR; ++r) {
          acc[r] = _mm256_add_epi32(acc[r], _mm256_madd_epi16(acc16[r], ones));
        }
      }
      const __m256 ws = _mm256_loadu_ps(w.scale.data() + (panel * x.blocks + b) * kPanel + 8 * h);
      for (int r = 0; r < MR; ++r) {
        FastEpilogue(acc[r], x.scale[(row0 + r) * x.blocks + b], ws, &tile.y[r][8 * h]);
      }
    }
  }
  tile.Store(p, row0, MR);
}

// kMxI8 when a whole block fits the int16 sums (G = 8: FP4 or E2M3 W with FP4 or
// E2M3 X): both 8-column halves in one pass, so each broadcast of x feeds two
// multiplies, and no int32 sums are carried between groups.
// Block b of `kGroups` k-groups of 4 (8: an MX block, 4: an NVFP4 block) for
// MR rows and both 8-column halves: u8 × s8 products summed in int16 (the
// callers' formats keep a whole block within int16), then widened, offset and
// scaled into the tile by the fast epilogue — one rounding per block.
template <int MR, bool kNibbles, int kGroups>
inline void I8BlockIntoTile(const Problem& p, const I8Weights<kNibbles>& weights, int64_t row0,
                            int64_t panel, int64_t b, Tile& tile) {
  const DecodedX& x = *p.x;
  const WeightPanels& w = *p.w;
  const int64_t kp = x.k_padded;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i acc[MR][2];
  for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
  for (int64_t group = b * kGroups; group < (b + 1) * kGroups; group += 2) {
    __m256i w0[2], w1[2];  // [half]: groups `group` and `group + 1`
    for (int h = 0; h < 2; ++h) weights.Pair(group, h, w0[h], w1[h]);
    for (int r = 0; r < MR; ++r) {
      const int8_t* xr = x.i8.data() + (row0 + r) * kp + group * 4;
      const __m256i x0 = Broadcast32(xr), x1 = Broadcast32(xr + 4);
      for (int h = 0; h < 2; ++h) {
        acc[r][h] = _mm256_add_epi16(acc[r][h], _mm256_maddubs_epi16(w0[h], x0));
        acc[r][h] = _mm256_add_epi16(acc[r][h], _mm256_maddubs_epi16(w1[h], x1));
      }
    }
  }
  const float* ws = w.scale.data() + (panel * x.blocks + b) * kPanel;
  for (int r = 0; r < MR; ++r) {
    const __m256i offset = _mm256_set1_epi32(x.block_offset[(row0 + r) * x.blocks + b]);
    const float xs = x.scale[(row0 + r) * x.blocks + b];
    for (int h = 0; h < 2; ++h) {
      const __m256i dot = _mm256_add_epi32(offset, _mm256_madd_epi16(acc[r][h], ones));
      FastEpilogue(dot, xs, _mm256_loadu_ps(ws + 8 * h), &tile.y[r][8 * h]);
    }
  }
}

template <int MR, bool kNibbles>
void MxI8WholeBlockTile(const Problem& p, int64_t row0, int, int64_t panel) {
  const I8Weights<kNibbles> weights(*p.w, panel);
  Tile tile(p, panel, true);
  for (int64_t b = 0; b < p.x->blocks; ++b) {
    I8BlockIntoTile<MR, kNibbles, 8>(p, weights, row0, panel, b, tile);
  }
  tile.Store(p, row0, MR);
}

// kNvI8: blocks of 16 k (four groups of 4) through I8BlockIntoTile (an int16
// lane holds at most 4 · 2 · 24 · 12); after the blocks y · fp32(ts_x · ts_w),
// then + bias.
template <int MR>
void NvTile(const Problem& p, int64_t row0, int, int64_t panel) {
  const DecodedX& x = *p.x;
  const WeightPanels& w = *p.w;
  const I8Weights<false> weights(w, panel);
  Tile tile(p, panel, /*with_bias=*/false);
  for (int64_t b = 0; b < x.blocks; ++b) {
    I8BlockIntoTile<MR, false, 4>(p, weights, row0, panel, b, tile);
  }
  for (int h = 0; h < 2; ++h) {
    const __m256 tw = _mm256_loadu_ps(w.tensor_scale.data() + tile.n0 + 8 * h);
    const __m256 bias = p.bias != nullptr && tile.cols == kPanel
                            ? _mm256_loadu_ps(p.bias + tile.n0 + 8 * h)
                            : _mm256_setzero_ps();
    for (int r = 0; r < MR; ++r) {
      const __m256 ts = _mm256_mul_ps(_mm256_set1_ps(x.tensor_scale[row0 + r]), tw);
      __m256 v = _mm256_mul_ps(_mm256_load_ps(&tile.y[r][8 * h]), ts);
      if (p.bias != nullptr && tile.cols == kPanel) v = _mm256_add_ps(v, bias);
      _mm256_store_ps(&tile.y[r][8 * h], v);
    }
  }
  if (p.bias != nullptr && tile.cols < kPanel) {  // a last, partial panel: no reads past N
    for (int r = 0; r < MR; ++r) {
      for (int j = 0; j < tile.cols; ++j) tile.y[r][j] += p.bias[tile.n0 + j];
    }
  }
  tile.Store(p, row0, MR);
}

// The int16 pair product shared by kMxI16 and kInt8: acc += Σ over k-pairs
// [first, last) of x·w, for MR rows and one 8-column half.
template <int MR>
inline void I16Pairs(const DecodedX& x, const int16_t* wp, int64_t row0, int h, int64_t first,
                     int64_t last, __m256i* acc) {
  const int64_t kp = x.k_padded;
  for (int64_t pair = first; pair < last; ++pair) {
    const __m256i wv =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wp + pair * 2 * kPanel + 16 * h));
    for (int r = 0; r < MR; ++r) {
      const __m256i xv = Broadcast32(x.i16.data() + (row0 + r) * kp + 2 * pair);
      acc[r] = _mm256_add_epi32(acc[r], _mm256_madd_epi16(wv, xv));
    }
  }
}

template <int MR>
void MxI16Tile(const Problem& p, int64_t row0, int, int64_t panel) {
  const DecodedX& x = *p.x;
  const WeightPanels& w = *p.w;
  const int16_t* wp = w.i16.data() + panel * x.k_padded * kPanel;
  Tile tile(p, panel, true);
  for (int h = 0; h < 2; ++h) {
    for (int64_t b = 0; b < x.blocks; ++b) {
      __m256i acc[MR];
      for (int r = 0; r < MR; ++r) acc[r] = _mm256_setzero_si256();
      I16Pairs<MR>(x, wp, row0, h, b * 16, b * 16 + 16, acc);
      const __m256 ws = _mm256_loadu_ps(w.scale.data() + (panel * x.blocks + b) * kPanel + 8 * h);
      for (int r = 0; r < MR; ++r) {
        FastEpilogue(acc[r], x.scale[(row0 + r) * x.blocks + b], ws, &tile.y[r][8 * h]);
      }
    }
  }
  tile.Store(p, row0, MR);
}

// INT8: the whole K in int32, then (float(dot) · scale_x) · scale_w + bias, in
// the reference's order (no fused multiply-add).
template <int MR>
void Int8Tile(const Problem& p, int64_t row0, int, int64_t panel) {
  const DecodedX& x = *p.x;
  const WeightPanels& w = *p.w;
  const int16_t* wp = w.i16.data() + panel * x.k_padded * kPanel;
  Tile tile(p, panel, false);
  for (int h = 0; h < 2; ++h) {
    __m256i acc[MR];
    for (int r = 0; r < MR; ++r) acc[r] = _mm256_setzero_si256();
    I16Pairs<MR>(x, wp, row0, h, 0, x.k_padded / 2, acc);
    const __m256 ws = _mm256_loadu_ps(w.scale.data() + panel * kPanel + 8 * h);
    for (int r = 0; r < MR; ++r) {
      __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(acc[r]), _mm256_set1_ps(x.scale[row0 + r]));
      v = _mm256_mul_ps(v, ws);
      _mm256_store_ps(&tile.y[r][8 * h], v);
    }
  }
  if (p.bias) {
    for (int r = 0; r < MR; ++r) {
      for (int j = 0; j < tile.cols; ++j) tile.y[r][j] += p.bias[tile.n0 + j];
    }
  }
  tile.Store(p, row0, MR);
}

// kMxF64: W's FP16 element values widened to doubles, FP64 FMAs (exact: the
// driver checked that every block sum fits 53 bits), then the wide epilogue.
template <int MR>
void MxF64Tile(const Problem& p, int64_t row0, int, int64_t panel) {
  const DecodedX& x = *p.x;
  const WeightPanels& w = *p.w;
  const int64_t kp = x.k_padded;
  const uint16_t* wp = w.f16.data() + panel * kp * kPanel;
  Tile tile(p, panel, true);
  for (int h = 0; h < 2; ++h) {
    for (int64_t b = 0; b < x.blocks; ++b) {
      __m256d acc[MR][2];
      for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_pd();
      for (int64_t k = b * kBlockSize; k < (b + 1) * kBlockSize; ++k) {
        const __m256 wf = _mm256_cvtph_ps(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(wp + k * kPanel + 8 * h)));
        const __m256d w0 = _mm256_cvtps_pd(_mm256_castps256_ps128(wf));
        const __m256d w1 = _mm256_cvtps_pd(_mm256_extractf128_ps(wf, 1));
        for (int r = 0; r < MR; ++r) {
          const __m256d xv = _mm256_broadcast_sd(x.f64.data() + (row0 + r) * kp + k);
          acc[r][0] = _mm256_fmadd_pd(xv, w0, acc[r][0]);
          acc[r][1] = _mm256_fmadd_pd(xv, w1, acc[r][1]);
        }
      }
      const double* ws = w.scale_d.data() + (panel * x.blocks + b) * kPanel + 8 * h;
      const __m256d ws0 = _mm256_loadu_pd(ws), ws1 = _mm256_loadu_pd(ws + 4);
      for (int r = 0; r < MR; ++r) {
        const __m256d xs = _mm256_set1_pd(x.scale_d[(row0 + r) * x.blocks + b]);
        const __m128 lo = _mm256_cvtpd_ps(_mm256_mul_pd(_mm256_mul_pd(acc[r][0], xs), ws0));
        const __m128 hi = _mm256_cvtpd_ps(_mm256_mul_pd(_mm256_mul_pd(acc[r][1], xs), ws1));
        float* y = &tile.y[r][8 * h];
        _mm256_store_ps(y, _mm256_add_ps(_mm256_load_ps(y), _mm256_set_m128(hi, lo)));
      }
    }
  }
  tile.Store(p, row0, MR);
}

// Float kind: per output, fma over k ascending from the bias (the reference's
// order), 16 columns at a time.
// BF16 W in pairs of k (gemm_internal.h): each 32-bit word holds one lane's
// (k even, k odd); the even one becomes an FP32 by a left shift of 16, the odd
// one by clearing the low half: one shift (by 16 or 0) and one mask.
inline __m256 WidenBf16(__m256i pairs, int odd) {
  const __m256i shifted = _mm256_sll_epi32(pairs, _mm_cvtsi32_si128(odd ? 0 : 16));
  return _mm256_castsi256_ps(_mm256_and_si256(shifted, _mm256_set1_epi32(-65536)));
}

// Offset of W's 16 values of k in a panel starting at `base`: [k][16], or for
// BF16 the pair of k's 32 halves (WidenBf16 picks k's).
template <Format kStore>
constexpr int64_t FloatsAt(int64_t base, int64_t k) {
  return base + (kStore == Format::kBf16 ? (k & ~int64_t{1}) : k) * kPanel;
}

// 16 W values of one k as two vectors of 8 floats, from W's own precision
// (`odd`: k is odd, for BF16's pairs).
template <Format kStore>
inline void LoadFloats(const WeightPanels& w, int64_t at, int odd, __m256& w0, __m256& w1) {
  if constexpr (kStore == Format::kFp32) {
    w0 = _mm256_loadu_ps(w.f32.data() + at);
    w1 = _mm256_loadu_ps(w.f32.data() + at + 8);
  } else {
    const __m128i* h = reinterpret_cast<const __m128i*>(w.f16.data() + at);
    if constexpr (kStore == Format::kFp16) {
      w0 = _mm256_cvtph_ps(_mm_loadu_si128(h));
      w1 = _mm256_cvtph_ps(_mm_loadu_si128(h + 1));
    } else {  // BF16 (the top half of an FP32) in pairs of k: see WidenBf16
      w0 = WidenBf16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(h)), odd);
      w1 = WidenBf16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(h) + 1), odd);
    }
  }
}

// Always four rows in eight named accumulators (GCC spills an array of them to
// the stack on every k); a shorter tile repeats its last row and drops it.
template <int MR, Format kStore>
void F32Tile(const Problem& p, int64_t row0, int, int64_t panel) {
  const DecodedX& x = *p.x;
  const WeightPanels& w = *p.w;
  const int64_t kp = x.k_padded;
  Tile tile(p, panel, true);
  const float* x0 = x.f32.data() + row0 * kp;
  const float* x1 = x.f32.data() + (row0 + std::min(1, MR - 1)) * kp;
  const float* x2 = x.f32.data() + (row0 + std::min(2, MR - 1)) * kp;
  const float* x3 = x.f32.data() + (row0 + std::min(3, MR - 1)) * kp;
  __m256 c00 = _mm256_load_ps(&tile.y[0][0]), c01 = _mm256_load_ps(&tile.y[0][8]);
  __m256 c10 = c00, c11 = c01, c20 = c00, c21 = c01, c30 = c00, c31 = c01;
  const int64_t k_end = w.k;
  const int64_t w_base = panel * kp * kPanel;
  for (int64_t k = 0; k < k_end; ++k) {
    __m256 w0, w1;
    LoadFloats<kStore>(w, FloatsAt<kStore>(w_base, k), static_cast<int>(k & 1), w0, w1);
    __m256 xv = _mm256_broadcast_ss(x0 + k);
    c00 = _mm256_fmadd_ps(xv, w0, c00);
    c01 = _mm256_fmadd_ps(xv, w1, c01);
    xv = _mm256_broadcast_ss(x1 + k);
    c10 = _mm256_fmadd_ps(xv, w0, c10);
    c11 = _mm256_fmadd_ps(xv, w1, c11);
    xv = _mm256_broadcast_ss(x2 + k);
    c20 = _mm256_fmadd_ps(xv, w0, c20);
    c21 = _mm256_fmadd_ps(xv, w1, c21);
    xv = _mm256_broadcast_ss(x3 + k);
    c30 = _mm256_fmadd_ps(xv, w0, c30);
    c31 = _mm256_fmadd_ps(xv, w1, c31);
  }
  _mm256_store_ps(&tile.y[0][0], c00);
  _mm256_store_ps(&tile.y[0][8], c01);
  _mm256_store_ps(&tile.y[1][0], c10);
  _mm256_store_ps(&tile.y[1][8], c11);
  _mm256_store_ps(&tile.y[2][0], c20);
  _mm256_store_ps(&tile.y[2][8], c21);
  _mm256_store_ps(&tile.y[3][0], c30);
  _mm256_store_ps(&tile.y[3][8], c31);
  tile.Store(p, row0, MR);
}

// k-groups that may be summed in int16: each vpmaddubsw lane is at most
// 2 · (2·offset) · max|x|, and G of them must stay within 32767.
int I8Groups(const Problem& p) {
  const int max_x = I8Offset(p.x_format);
  const int lane_bound = 2 * (2 * p.w->i8_offset) * max_x;
  for (int g : {8, 4, 2}) {
    if (g * lane_bound <= 32767) return g;
  }
  return 1;
}

}  // namespace

TileKernel Avx2Tile(Kind kind, const Problem& p) {
  switch (kind) {
    case Kind::kMxI8:
      if (!p.fast_scales) return nullptr;
      if (p.w->nibbles) {
        // FP4 W (offset 12) against |x| <= 127 allows at least G = 4.
        return I8Groups(p) == 8 ? MX_BY_ROWS(MxI8WholeBlockTile, true)
                                  : MX_BY_ROWS(MxI8Tile, 4, true);
      }
      switch (I8Groups(p)) {
        case 8: return MX_BY_ROWS(MxI8WholeBlockTile, false);
        case 4: return MX_BY_ROWS(MxI8Tile, 4, false);
        case 2: return MX_BY_ROWS(MxI8Tile, 2, false);
        default: return MX_BY_ROWS(MxI8Tile, 1, false);
      }
    case Kind::kMxI16:
      return p.fast_scales ? MX_BY_ROWS(MxI16Tile) : nullptr;
    case Kind::kMxF64: return MX_BY_ROWS(MxF64Tile);
    case Kind::kInt8: return MX_BY_ROWS(Int8Tile);
    case Kind::kNvI8: return MX_BY_ROWS(NvTile);
    case Kind::kF32:
    case Kind::kBf16:
      switch (p.w->float_store) {
        case Format::kFp16: return MX_BY_ROWS(F32Tile, Format::kFp16);
        case Format::kBf16: return MX_BY_ROWS(F32Tile, Format::kBf16);
        default: return MX_BY_ROWS(F32Tile, Format::kFp32);
      }
  }
  return nullptr;
}

}  // namespace mx::kernels::internal
