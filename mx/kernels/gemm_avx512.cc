// The avx512 level: tile kernels with AVX-512 F/BW/VL/DQ + VNNI intrinsics.
// This file is compiled with those flags; the driver calls in only after
// CpuSupports() said the CPU has them.
//
// A 16-column panel of W is exactly one zmm of int32 or float lanes, so a tile
// is up to 8 rows × one panel in eight accumulators — enough independent chains
// to keep two FMA/VNNI pipes busy through their latency, and at M = 8 (one
// decode step of a batch) W is read once; the integer tiles take two panels (a
// TileKernel of two), sixteen accumulators and one X broadcast for two
// vpdpwssd or vpdpbusd — and the integer kinds need no int16
// stage: vpdpbusd (u8·s8, four products per lane) and vpdpwssd (s16·s16, two)
// add straight into int32, exact for every pair those kinds take. Within a lane
// the sum over blocks runs in ascending block order, as everywhere.
//
// kMxF64 (pairs with MXFP8) runs its narrow blocks as shifted int16 through
// vpdpwssd and the rest as FP64 FMAs (MxF64ShiftedTile below); kInt8 and
// MXINT8 × MXINT8 the u8 copy of W (w + 128) through vpdpbusd. The
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

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>

#include "mx/kernels/gemm_internal.h"

namespace mx::kernels::internal {
namespace {

#include "mx/kernels/panel_avx512.inc"
#include "mx/kernels/bf16_avx512.inc"

// The kMxI8 bytes of one W panel, two groups of 4 k at a time: 64 bytes per
// group (16 lanes × 4 k), or, for MXFP4 W, both groups' 4-bit codes in one
// 64-byte load widened by vpshufb through the code table (gemm_internal.h has
// the layouts).
template <bool kNibbles>
struct I8Weights512 {
  const uint8_t* base;
  __m512i lut, low4;

  I8Weights512(const WeightPanels& w, int64_t panel)
      : base(U8Panel(w, panel, kNibbles)),
        lut(_mm512_broadcast_i32x4(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(w.nibble_lut.data())))),
        low4(_mm512_set1_epi8(0x0F)) {}

  // Groups `group` (even) and `group + 1`.
  void Pair(int64_t group, __m512i& first, __m512i& second) const {
    if constexpr (kNibbles) {
      const __m512i v = _mm512_loadu_si512(base + group / 2 * 64);
      first = _mm512_shuffle_epi8(lut, _mm512_and_si512(v, low4));
      second = _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(v, 4), low4));
    } else {
      first = _mm512_loadu_si512(base + group * 64);
      second = _mm512_loadu_si512(base + (group + 1) * 64);
    }
  }
};

inline __m512i Broadcast32(const void* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// vpdpbusd / vpdpwssd: acc += the lane's 4 u8·s8 / 2 s16·s16 products. GCC 12
// copies the accumulator into a fresh register around each VNNI intrinsic and
// spills under the pressure of eight rows (half the speed of MXINT8 at M = 512);
// the instruction accumulates in place, and so does this asm. Clang and the
// SIMDe build take the intrinsics.
inline __m512i Dpbusd(__m512i acc, __m512i u8, __m512i s8) {
#if defined(MX_KERNELS_EMULATED) || defined(__clang__)
  return _mm512_dpbusd_epi32(acc, u8, s8);
#else
  asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u8), "v"(s8));
  return acc;
#endif
}
inline __m512i Dpwssd(__m512i acc, __m512i a, __m512i b) {
#if defined(MX_KERNELS_EMULATED) || defined(__clang__)
  return _mm512_dpwssd_epi32(acc, a, b);
#else
  asm("vpdpwssd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
  return acc;
#endif
}

// The 8-lane halves of a 16-lane vector, and back.
inline __m256i Half(__m512i v, int i) {
  return i ? _mm512_extracti64x4_epi64(v, 1) : _mm512_castsi512_si256(v);
}
inline __m256 Half(__m512 v, int i) {
  return _mm256_castsi256_ps(Half(_mm512_castps_si512(v), i));
}
inline __m512 Join(__m256 lo, __m256 hi) {
  return _mm512_castsi512_ps(_mm512_inserti64x4(
      _mm512_castsi256_si512(_mm256_castps_si256(lo)), _mm256_castps_si256(hi), 1));
}

// make(q) for the NP panels of a call, q = panel .. panel + NP − 1 (NP <= 2).
template <int NP, typename Make>
auto PerPanel(int64_t panel, const Make& make) {
  static_assert(NP == 1 || NP == 2);
  if constexpr (NP == 1) {
    return std::array{make(panel)};
  } else {
    return std::array{make(panel), make(panel + 1)};
  }
}

// The TileKernel of a tile template tile<MR, NP, args...> (MX_BY_ROWS_8's rows)
// that takes two panels a call, NP = 1 where N leaves one.
#define MX_TWO_PANEL_CALL(mr, tile, ...)                                            \
  if (panel_ + 1 < p_.w->panels) {                                                  \
    return tile<mr, 2 __VA_OPT__(, ) __VA_ARGS__>(p_, row0_, rows_, panel_);        \
  }                                                                                 \
  return tile<mr, 1 __VA_OPT__(, ) __VA_ARGS__>(p_, row0_, rows_, panel_)
#define MX_TWO_PANELS(tile, ...)                                                    \
  TileKernel(+[](const Problem& p_, int64_t row0_, int rows_, int64_t panel_) {     \
    switch (rows_) {                                                                \
      case 1: MX_TWO_PANEL_CALL(1, tile, __VA_ARGS__);                              \
      case 2: MX_TWO_PANEL_CALL(2, tile, __VA_ARGS__);                              \
      case 3: MX_TWO_PANEL_CALL(3, tile, __VA_ARGS__);                              \
      case 4: MX_TWO_PANEL_CALL(4, tile, __VA_ARGS__);                              \
      case 5: MX_TWO_PANEL_CALL(5, tile, __VA_ARGS__);                              \
      case 6: MX_TWO_PANEL_CALL(6, tile, __VA_ARGS__);                              \
      case 7: MX_TWO_PANEL_CALL(7, tile, __VA_ARGS__);                              \
      default: MX_TWO_PANEL_CALL(8, tile, __VA_ARGS__);                             \
    }                                                                               \
  }, 2)

// Every block of X's rows [row0, row0 + MR) against NP panels of u8 W through
// vpdpbusd (kGroups groups of 4 k a block: 8 for MX, 4 for NVFP4's 16), from
// the block's offset correction, and the fast epilogue into y block by block;
// each X group broadcast once for the NP panels.
template <int MR, int NP, bool kNibbles, int kGroups>
inline void I8BlocksInto(const Problem& p, const std::array<I8Weights512<kNibbles>, NP>& weights,
                         int64_t row0, int64_t panel, __m512 (*y)[MR]) {
  const DecodedX& x = *p.x;
  const int64_t kp = x.k_padded;
  for (int64_t b = 0; b < x.blocks; ++b) {
    __m512i acc[NP][MR];
    for (int r = 0; r < MR; ++r) {
      const __m512i offset = _mm512_set1_epi32(x.block_offset[(row0 + r) * x.blocks + b]);
      for (int q = 0; q < NP; ++q) acc[q][r] = offset;
    }
    for (int64_t group = b * kGroups; group < (b + 1) * kGroups; group += 2) {
      __m512i w0[NP], w1[NP];
      for (int q = 0; q < NP; ++q) weights[q].Pair(group, w0[q], w1[q]);
      for (int r = 0; r < MR; ++r) {
        const int8_t* xr = x.i8.data() + (row0 + r) * kp + group * 4;
        const __m512i x0 = Broadcast32(xr), x1 = Broadcast32(xr + 4);
        for (int q = 0; q < NP; ++q) {
          acc[q][r] = Dpbusd(acc[q][r], w0[q], x0);
          acc[q][r] = Dpbusd(acc[q][r], w1[q], x1);
        }
      }
    }
    for (int q = 0; q < NP; ++q) {
      const __m512 ws =
          _mm512_loadu_ps(p.w->scale.data() + ((panel + q) * x.blocks + b) * kPanel);
      for (int r = 0; r < MR; ++r) {
        y[q][r] = FastEpilogue(acc[q][r], x.scale[(row0 + r) * x.blocks + b], ws, y[q][r]);
      }
    }
  }
}

// kMxI8: u8 (w + offset) · s8 x with vpdpbusd, one k-group of 4 per
// instruction, the offset's share subtracted through block_offset. MXFP4 W
// (kNibbles) holds two groups' 4-bit codes in one 64-byte load — the layout of
// gemm_internal.h puts each group's 16 lanes × 4 k in order — widened by vpshufb.
template <int MR, int NP, bool kNibbles>
void MxI8Tile(const Problem& p, int64_t row0, int, int64_t panel) {
  const auto weights =
      PerPanel<NP>(panel, [&](int64_t q) { return I8Weights512<kNibbles>(*p.w, q); });
  const auto out = PerPanel<NP>(panel, [&](int64_t q) { return Out(p, q); });
  __m512 y[NP][MR];
  for (int q = 0; q < NP; ++q) {
    for (int r = 0; r < MR; ++r) y[q][r] = out[q].Start(p);
  }
  I8BlocksInto<MR, NP, kNibbles, kBlockSize / 4>(p, weights, row0, panel, y);
  for (int q = 0; q < NP; ++q) {
    for (int r = 0; r < MR; ++r) out[q].Store(p, row0 + r, y[q][r]);
  }
}

// kNvI8: NVFP4's blocks of 16 k (four groups of 4) through vpdpbusd as kMxI8's
// wide storage (w + 12, block_offset −12 · Σx), the fast epilogue per block
// (always exact for it, gemm_internal.h); after the last block
// y · fp32(ts_x · ts_w), then + bias: the order of the other levels.
template <int MR, int NP>
void NvTile(const Problem& p, int64_t row0, int, int64_t panel) {
  const DecodedX& x = *p.x;
  const WeightPanels& w = *p.w;
  const auto weights = PerPanel<NP>(panel, [&](int64_t q) { return I8Weights512<false>(w, q); });
  const auto out = PerPanel<NP>(panel, [&](int64_t q) { return Out(p, q); });
  __m512 y[NP][MR];
  for (int q = 0; q < NP; ++q) {
    for (int r = 0; r < MR; ++r) y[q][r] = _mm512_setzero_ps();
  }
  I8BlocksInto<MR, NP, false, 4>(p, weights, row0, panel, y);
  for (int q = 0; q < NP; ++q) {
    const __m512 tw = _mm512_maskz_loadu_ps(out[q].cols, w.tensor_scale.data() + out[q].n0);
    for (int r = 0; r < MR; ++r) {
      const __m512 v =
          _mm512_mul_ps(y[q][r], _mm512_mul_ps(_mm512_set1_ps(x.tensor_scale[row0 + r]), tw));
      out[q].Store(p, row0 + r, p.bias ? _mm512_add_ps(v, out[q].Start(p)) : v);  // no bias: −0 kept
    }
  }
}

// acc[q][r] += row r's int16 pair `pair` · panel q's W pair (vpdpwssd, 16
// lanes): X's row r from xr[r], panel q's block from wp[q]; each X pair is
// broadcast once for the NP panels.
template <int MR, int NP>
inline void I16Pair(const int16_t* const* xr, const int16_t* const* wp, int pair,
                    __m512i (*acc)[MR]) {
  __m512i wv[NP];
  for (int q = 0; q < NP; ++q) wv[q] = _mm512_loadu_si512(wp[q] + pair * 2 * kPanel);
  for (int r = 0; r < MR; ++r) {
    const __m512i xv = Broadcast32(xr[r] + 2 * pair);
    for (int q = 0; q < NP; ++q) acc[q][r] = Dpwssd(acc[q][r], wv[q], xv);
  }
}
// One block's 16 pairs: the inner loop of kMxI16 and of kMxF64's int16 path.
template <int MR, int NP>
void I16Rows(const int16_t* const* xr, const int16_t* const* wp, __m512i (*acc)[MR]) {
  for (int pair = 0; pair < kBlockSize / 2; ++pair) I16Pair<MR, NP>(xr, wp, pair, acc);
}

// kMxI16: int16 pairs, vpdpwssd: one k-pair of the 16 lanes per instruction,
// NP panels a call: two share each X broadcast and give sixteen independent
// accumulators (1.08× one panel's rate for MXFP6_E3M2 at M = 512 on Zen 5).
template <int MR, int NP>
void MxI16Tile(const Problem& p, int64_t row0, int, int64_t panel) {
  const DecodedX& x = *p.x;
  const WeightPanels& w = *p.w;
  const auto out = PerPanel<NP>(panel, [&](int64_t q) { return Out(p, q); });
  __m512 y[NP][MR];
  for (int q = 0; q < NP; ++q) {
    for (int r = 0; r < MR; ++r) y[q][r] = out[q].Start(p);
  }
  for (int64_t b = 0; b < x.blocks; ++b) {
    const int16_t* xr[MR];
    for (int r = 0; r < MR; ++r) xr[r] = x.i16.data() + (row0 + r) * x.k_padded + b * kBlockSize;
    const int16_t* wp[NP];
    for (int q = 0; q < NP; ++q) wp[q] = w.i16.data() + ((panel + q) * x.k_padded + b * kBlockSize) * kPanel;
    __m512i acc[NP][MR];
    for (int q = 0; q < NP; ++q) {
      for (int r = 0; r < MR; ++r) acc[q][r] = _mm512_setzero_si512();
    }
    I16Rows<MR, NP>(xr, wp, acc);
    for (int q = 0; q < NP; ++q) {
      const __m512 ws = _mm512_loadu_ps(w.scale.data() + ((panel + q) * x.blocks + b) * kPanel);
      for (int r = 0; r < MR; ++r) {
        y[q][r] = FastEpilogue(acc[q][r], x.scale[(row0 + r) * x.blocks + b], ws, y[q][r]);
      }
    }
  }
  for (int q = 0; q < NP; ++q) {
    for (int r = 0; r < MR; ++r) out[q].Store(p, row0 + r, y[q][r]);
  }
}

// INT8: the whole K in int32 — vpdpbusd on W's u8 copy (w + 128) and X's bytes,
// from −128 · Σ x, four products per lane per instruction; exact: after any
// prefix of K the sum is Σ_prefix x·w − 128 · Σ_rest x, within 2^14 · K < 2^31
// (the driver caps K) — then
// (float(dot) · scale_x) · scale_w, then the bias, in the reference's order (no
// fused multiply-add).
template <int MR, int NP>
void Int8Tile(const Problem& p, int64_t row0, int, int64_t panel) {
  const DecodedX& x = *p.x;
  const WeightPanels& w = *p.w;
  const int64_t kp = x.k_padded;
  const auto out = PerPanel<NP>(panel, [&](int64_t q) { return Out(p, q); });
  __m512i acc[NP][MR];
  for (int r = 0; r < MR; ++r) {
    const __m512i offset = _mm512_set1_epi32(x.block_offset[row0 + r]);
    for (int q = 0; q < NP; ++q) acc[q][r] = offset;
  }
  for (int64_t group = 0; group < kp / 4; ++group) {
    __m512i wv[NP];
    for (int q = 0; q < NP; ++q) {
      wv[q] = _mm512_loadu_si512(w.u8.data() + ((panel + q) * kp + group * 4) * kPanel);
    }
    for (int r = 0; r < MR; ++r) {
      const __m512i xv = Broadcast32(x.i8.data() + (row0 + r) * kp + group * 4);
      for (int q = 0; q < NP; ++q) acc[q][r] = Dpbusd(acc[q][r], wv[q], xv);
    }
  }
  for (int q = 0; q < NP; ++q) {
    const __m512 ws = _mm512_loadu_ps(w.scale.data() + (panel + q) * kPanel);
    for (int r = 0; r < MR; ++r) {
      out[q].Store(p, row0 + r, Int8Epilogue(p, out[q], acc[q][r], x.scale[row0 + r], ws));
    }
  }
}

// One block of kMxF64 in FP64, rows [row0, row0 + MR): W's FP16 element values
// widened to doubles, 8 lanes per zmm, two per panel, FP64 FMAs (exact: the
// block sum fits 53 bits, or the driver redoes the output, RedoWideOutputs),
// then each row's block result float(dot · 2^ex · 2^ew) into out[r].
template <int MR>
inline void MxF64Block(const Problem& p, int64_t row0, int64_t panel, int64_t b, __m512* out) {
  const DecodedX& x = *p.x;
  const WeightPanels& w = *p.w;
  const int64_t kp = x.k_padded;
  const uint16_t* wp = w.f16.data() + panel * kp * kPanel;
  // Few rows make few FMA chains, each 32 deep: then k goes round kChains
  // accumulators. Any order of the sum is exact (every partial sum fits 53 bits,
  // or the driver redoes the output).
  constexpr int kChains = MR < 4 ? 4 : 1;
  __m512d acc[MR][kChains][2];
  for (int r = 0; r < MR; ++r) {
    for (int c = 0; c < kChains; ++c) acc[r][c][0] = acc[r][c][1] = _mm512_setzero_pd();
  }
  for (int64_t k0 = b * kBlockSize; k0 < (b + 1) * kBlockSize; k0 += kChains) {
    for (int c = 0; c < kChains; ++c) {
      const int64_t k = k0 + c;
      const __m512 wf =
          _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wp + k * kPanel)));
      const __m512d w0 = _mm512_cvtps_pd(_mm512_castps512_ps256(wf));
      const __m512d w1 = _mm512_cvtps_pd(
          _mm256_castsi256_ps(_mm512_extracti64x4_epi64(_mm512_castps_si512(wf), 1)));
      for (int r = 0; r < MR; ++r) {
        const __m512d xv = _mm512_set1_pd(x.f64[(row0 + r) * kp + k]);
        acc[r][c][0] = _mm512_fmadd_pd(xv, w0, acc[r][c][0]);
        acc[r][c][1] = _mm512_fmadd_pd(xv, w1, acc[r][c][1]);
      }
    }
  }
  for (int r = 0; r < MR; ++r) {
    for (int c = 1; c < kChains; ++c) {
      acc[r][0][0] = _mm512_add_pd(acc[r][0][0], acc[r][c][0]);
      acc[r][0][1] = _mm512_add_pd(acc[r][0][1], acc[r][c][1]);
    }
  }
  const double* ws = w.scale_d.data() + (panel * x.blocks + b) * kPanel;
  const __m512d ws0 = _mm512_loadu_pd(ws), ws1 = _mm512_loadu_pd(ws + 8);
  for (int r = 0; r < MR; ++r) {
    const __m512d xs = _mm512_set1_pd(x.scale_d[(row0 + r) * x.blocks + b]);
    out[r] = Join(_mm512_cvtpd_ps(_mm512_mul_pd(_mm512_mul_pd(acc[r][0][0], xs), ws0)),
                  _mm512_cvtpd_ps(_mm512_mul_pd(_mm512_mul_pd(acc[r][0][1], xs), ws1)));
  }
}

// W's split lanes of panel block pb joined: high · 2^s + low per lane, in
// wrapping int32 (exact wherever the joined sum fits, as the callers know).
inline __m512i LimbShifts(const WeightPanels& w, int64_t pb) {
  return _mm512_cvtepu8_epi32(
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(w.split_shift.data() + pb * kPanel)));
}
inline __m512i JoinLimbs(__m512i high, __m512i low, __m512i shifts) {
  return _mm512_add_epi32(_mm512_sllv_epi32(high, shifts), low);
}

// The largest l1 bits of W's lanes for which a row that fails the int16 bound
// still runs in int16 (MxF64ShiftedTile): its residue dot, below 2^(t + l1)
// with t = span_x + l1 − 31 and span_x <= 15, must fit int32.
inline constexpr int kShiftedRowMaxWL1 = 23;

// Bit r: row row0 + r's block b may not pair exactly with every lane of W's
// panel block pb (ShiftedPairFits on the lanes' largest magnitudes): up to
// eight rows in three FP64 products and compares. The rows must lie in one group
// of kFitRows (the driver's tiles do: tasks start at multiples of 256 rows and
// step by the tile's rows, which divide 8; linear.cc checks it).
inline unsigned FailingRows(const DecodedX& x, const WeightPanels& w, int64_t pb, int64_t row0,
                            int rows, int64_t b) {
  const int64_t at = FitAt(row0, b, x.blocks);
  const auto rows_mask = static_cast<__mmask8>((1u << rows) - 1);
  const __m512d limit = _mm512_set1_pd(2147483648.0);
  const __m512d squared_limit = _mm512_set1_pd(0x1p62);
  const __mmask8 fits =
      _mm512_cmp_pd_mask(_mm512_mul_pd(_mm512_maskz_loadu_pd(rows_mask, x.fit_max.data() + at),
                                       _mm512_set1_pd(w.fit_l1[pb])),
                         limit, _CMP_LT_OQ) |
      _mm512_cmp_pd_mask(_mm512_mul_pd(_mm512_maskz_loadu_pd(rows_mask, x.fit_l1.data() + at),
                                       _mm512_set1_pd(w.fit_max[pb])),
                         limit, _CMP_LT_OQ) |
      _mm512_cmp_pd_mask(_mm512_mul_pd(_mm512_maskz_loadu_pd(rows_mask, x.fit_sq.data() + at),
                                       _mm512_set1_pd(w.fit_sq[pb])),
                         squared_limit, _CMP_LT_OQ);
  return ~static_cast<unsigned>(fits) & rows_mask;
}

// W's low limbs of a k-pair that has none: zeros, so that a residue's dot takes
// the same instructions either way (JoinLimbs with shifts 0 adds 0).
alignas(64) constexpr int16_t kNoLowLimbs[2 * kPanel] = {};

// W's low limbs of pair `pair` of a panel block (at wl, bit j of low_pairs: pair
// j has some; the block's split_pairs, 0 unsplit), or kNoLowLimbs. Only those
// pairs are read: the others' lines hold zeros, and in a decode step, where W
// streams from memory, only these were prefetched (PrefetchLowLimbs) — reading
// the rest cost the MXFP8 model sweep a tenth of its time in misses.
inline const int16_t* LowLimbPair(const int16_t* wl, unsigned low_pairs, int pair) {
  return low_pairs >> pair & 1 ? wl + pair * 2 * kPanel : kNoLowLimbs;
}

// Σ v·w' over the k-pairs where the row's int16 block v (32 values at `v`) is
// non-zero, per lane of NP panels' W blocks (wp[q], their low limbs at wl[q]
// joined by shifts[q], LowLimbPair), into dot[q]: the residues of a shifted row
// are a few small elements, so this visits a pair or two, not sixteen, and
// broadcasts each once for the NP panels. Wrapping int32, exact wherever the
// true sum fits (the callers' bounds).
template <int NP>
void SparseDots(const int16_t* v, const int16_t* const* wp, const int16_t* const* wl,
                const unsigned* low_pairs, const __m512i* shifts, __m512i* dot) {
  const __m512i values = _mm512_loadu_si512(v);
  __m512i high[NP], low[NP];
  for (int q = 0; q < NP; ++q) high[q] = low[q] = _mm512_setzero_si512();
  for (unsigned pairs = _mm512_test_epi32_mask(values, values); pairs != 0; pairs &= pairs - 1) {
    const int pair = std::countr_zero(pairs);
    const __m512i xv = Broadcast32(v + 2 * pair);
    for (int q = 0; q < NP; ++q) {
      high[q] = Dpwssd(high[q], _mm512_loadu_si512(wp[q] + pair * 2 * kPanel), xv);
      low[q] = Dpwssd(low[q], _mm512_loadu_si512(LowLimbPair(wl[q], low_pairs[q], pair)), xv);
    }
  }
  for (int q = 0; q < NP; ++q) dot[q] = JoinLimbs(high[q], low[q], shifts[q]);
}

// SparseDots for a residue of at most two non-zero k-pairs (almost every
// shifted row's), with no branch on which: the pairs' indices come from the
// mask's two lowest bits, and a missing one reads the zero pair stored past
// the residue (v[32], v[33]) against W's pair 0. More pairs: SparseDots.
template <int NP>
inline void ResidueDots(const int16_t* v, const int16_t* const* wp, const int16_t* const* wl,
                        const unsigned* low_pairs, const __m512i* shifts, __m512i* dot) {
  const __m512i values = _mm512_load_si512(v);
  const unsigned pairs = _mm512_test_epi32_mask(values, values);
  if (std::popcount(pairs) > 2) [[unlikely]] {
    SparseDots<NP>(v, wp, wl, low_pairs, shifts, dot);
    return;
  }
  constexpr int kPairs = kBlockSize / 2;
  const int first = std::countr_zero(pairs | 1u << kPairs);  // kPairs: none
  const int second = std::countr_zero((pairs & (pairs - 1)) | 1u << kPairs);
  const __m512i x0 = Broadcast32(v + 2 * first), x1 = Broadcast32(v + 2 * second);
  const int p0 = first % kPairs, p1 = second % kPairs;
  const auto two_pairs = [&](const int16_t* w0, const int16_t* w1) {
    return Dpwssd(Dpwssd(_mm512_setzero_si512(), _mm512_loadu_si512(w0), x0),
                  _mm512_loadu_si512(w1), x1);
  };
  for (int q = 0; q < NP; ++q) {
    const __m512i high = two_pairs(wp[q] + p0 * 2 * kPanel, wp[q] + p1 * 2 * kPanel);
    const __m512i low = two_pairs(LowLimbPair(wl[q], low_pairs[q], p0),
                                  LowLimbPair(wl[q], low_pairs[q], p1));
    dot[q] = JoinLimbs(high, low, shifts[q]);
  }
}

// The lanes' int32 values widened to FP64, in two halves of 8.
inline void WidenHalves(__m512i v, __m512d* half) {
  half[0] = _mm512_cvtepi32_pd(Half(v, 0));
  half[1] = _mm512_cvtepi32_pd(Half(v, 1));
}

// kMxF64 without the int16 path (scales the fast epilogue cannot take): every
// block in FP64, added to y block by block.
template <int MR>
void MxF64Tile(const Problem& p, int64_t row0, int, int64_t panel) {
  const Out out(p, panel);
  __m512 y[MR];
  for (int r = 0; r < MR; ++r) y[r] = out.Start(p);
  for (int64_t b = 0; b < p.x->blocks; ++b) {
    __m512 block[MR];
    MxF64Block<MR>(p, row0, panel, b, block);
    for (int r = 0; r < MR; ++r) y[r] = _mm512_add_ps(y[r], block[r]);
  }
  for (int r = 0; r < MR; ++r) out.Store(p, row0 + r, y[r]);
}

// For a row's block that fails the int16 bound against W's block (the
// largest l1 bits of whose lanes are w_l1): the shift t1 that makes its int16
// values h = v >> t1 pair exactly (v: x' or X's high limb xh), or −1 where the
// residue's dots would not fit int32 (MxF64ShiftedTile: then FP64).
inline int ShiftedRowShift(const DecodedX& x, int64_t at, int w_l1) {
  const int x_span = x.span_bits[at];
  if (w_l1 > kShiftedRowMaxWL1 || x_span > kShiftedSplitBits ||
      (x_span > kShiftedI16Bits && x.split_shift[at] + w_l1 > kShiftedDotBits)) {
    return -1;
  }
  // The int16 values' span: X's, or its high limb's (the constant by value:
  // std::min's reference would make this object define it, a weak symbol).
  const int h_span = x_span > kShiftedI16Bits ? int{kShiftedI16Bits} : x_span;
  return std::max(0, h_span + w_l1 - kShiftedDotBits);
}

// The block results of a row that fails the int16 bound (MxF64ShiftedTile)
// against the NP panels of a call, into out[q], from dots[q], its shifted
// values' dot Σ h·w' with panel q (the shift ShiftedRowShift's for w_l1, the
// tile's; where it said −1, from FP64: MxF64Block): Σ h·w' · 2^(t0 + t1) +
// Σ (v mod 2^t1)·w' · 2^t0 + Σ xl·w' in FP64, exact, scaled there and rounded
// once. The residue is shared by the panels, so one call serves them all.
template <int NP>
[[gnu::noinline]] void FailingRowBlocks(const Problem& p, int64_t row, int64_t panel, int64_t b,
                                        int w_l1, const __m512i* dots, __m512* out) {
  const DecodedX& x = *p.x;
  const WeightPanels& w = *p.w;
  const int64_t at = row * x.blocks + b;
  // Again the tile's shift: handing it over in an array cost MXFP8 M = 512 about
  // 3 % (Zen 5, interleaved runs); these few compares cost nothing measurable.
  const int t1 = ShiftedRowShift(x, at, w_l1);
  if (t1 < 0) {
    for (int q = 0; q < NP; ++q) MxF64Block<1>(p, row, panel + q, b, &out[q]);
    return;
  }
  const int16_t* wp[NP];
  const int16_t* wl[NP];
  unsigned low_pairs[NP];
  __m512i shifts[NP];
  for (int q = 0; q < NP; ++q) {
    const int64_t pb = (panel + q) * x.blocks + b;
    wp[q] = w.i16.data() + ((panel + q) * x.k_padded + b * kBlockSize) * kPanel;
    // Unsplit blocks' split_pairs and split_shift are zeros: not read, as
    // they would be misses in a decode step (nothing prefetched them), and wl
    // is not read where low_pairs is 0 (LowLimbPair).
    wl[q] = nullptr;
    low_pairs[q] = 0;
    shifts[q] = _mm512_setzero_si512();
    if (const int32_t split_at = w.split_at[pb]; split_at >= 0) {
      wl[q] = w.i16_lo.data() + split_at;
      low_pairs[q] = w.split_pairs[pb];
      shifts[q] = LimbShifts(w, pb);
    }
  }
  const int64_t k0 = row * x.k_padded + b * kBlockSize;
  const int t0 = x.span_bits[at] > kShiftedI16Bits ? x.split_shift[at] : 0;
  alignas(64) int16_t residue[kBlockSize + 2];  // v − (v >> t1) · 2^t1, then a zero pair
  const __m512i v = _mm512_loadu_si512(x.i16.data() + k0);
  _mm512_store_si512(residue, _mm512_sub_epi16(v, _mm512_slli_epi16(_mm512_srai_epi16(v, t1), t1)));
  residue[kBlockSize] = residue[kBlockSize + 1] = 0;
  __m512i high_residue[NP], low_limb[NP];
  ResidueDots<NP>(residue, wp, wl, low_pairs, shifts, high_residue);
  if (t0 > 0) SparseDots<NP>(x.i16_lo.data() + k0, wp, wl, low_pairs, shifts, low_limb);
  const __m512d high = _mm512_set1_pd(static_cast<double>(1 << t1));
  const __m512d limb = _mm512_set1_pd(static_cast<double>(1 << t0));
  const __m512d xs = _mm512_set1_pd(x.scale[at]);
  for (int q = 0; q < NP; ++q) {
    __m512d exact[2], part[2];
    WidenHalves(dots[q], exact);
    WidenHalves(high_residue[q], part);
    for (int i = 0; i < 2; ++i) exact[i] = _mm512_fmadd_pd(exact[i], high, part[i]);
    if (t0 > 0) {
      WidenHalves(low_limb[q], part);
      for (int i = 0; i < 2; ++i) exact[i] = _mm512_fmadd_pd(exact[i], limb, part[i]);
    }
    const __m512 ws = _mm512_loadu_ps(w.scale.data() + ((panel + q) * x.blocks + b) * kPanel);
    __m256 half[2];
    for (int i = 0; i < 2; ++i) {
      half[i] = _mm512_cvtpd_ps(
          _mm512_mul_pd(_mm512_mul_pd(exact[i], xs), _mm512_cvtps_pd(Half(ws, i))));
    }
    out[q] = Join(half[0], half[1]);
  }
}

// W's low limbs live apart from its int16 stream (i16_lo), one cache line per
// k-pair that has one (one or two a split block), and their shifts
// (split_shift) a line per few blocks, read only where a block is split: in no
// pattern the hardware prefetcher follows. Where W streams from memory (a
// decode step: MxF64ShiftedTile<..., kStreaming>) each was a miss that
// AddLowLimbs and SparseDots waited for; the tile asks for the next block's
// while it works on this one. MXFP8 E4M3 model sweep at M = 8 on the AMD EPYC
// Zen 5: 113–115 ms → 106–107 (interleaved runs). Where W is reused from cache
// the same loop cost M = 512 about 4 %, so only the streaming tile has it. Asm,
// because GCC 12 drops __builtin_prefetch here.
inline void Prefetch(const void* line) {
  // The address as a register: an "m" operand would tell GCC the asm reads
  // memory that may alias the tile's spilled sums (__m512i is may_alias).
  asm volatile("prefetcht0 (%0)" : : "r"(line));
}
inline void PrefetchLowLimbs(const WeightPanels& w, int64_t pb) {
  const int32_t at = w.split_at[pb];
  if (at < 0) return;
  Prefetch(w.split_shift.data() + pb * kPanel);  // LimbShifts
  for (unsigned pairs = w.split_pairs[pb]; pairs != 0; pairs &= pairs - 1) {
    Prefetch(w.i16_lo.data() + at + std::countr_zero(pairs) * 2 * kPanel);
  }
}

// acc[r] = Σ x'h · 2^s + Σ x'l for a panel block with split lanes, from
// acc[r] = Σ x'h: shifted first, then the low limbs' pairs that are not all zero
// (split_pairs) dotted straight into it — wrapping int32, the same sum as
// JoinLimbs's, with no accumulators of its own: MXFP8 E4M3 on the AMD EPYC
// Zen 5, five interleaved rounds, M = 512 39.2 -> 37.6 ms, model sweep 91.4 ->
// 88.7. Still out of line: inlined (and so in the hot loop's registers) M = 512
// took 42.4.
template <int MR>
[[gnu::noinline]] void AddLowLimbs(const WeightPanels& w, int64_t pb, const int16_t* const* xr,
                                   __m512i* acc) {
  const int16_t* const wl = w.i16_lo.data() + w.split_at[pb];
  const __m512i shifts = LimbShifts(w, pb);
  for (int r = 0; r < MR; ++r) acc[r] = _mm512_sllv_epi32(acc[r], shifts);
  auto* sums = reinterpret_cast<__m512i(*)[MR]>(acc);
  for (unsigned pairs = w.split_pairs[pb]; pairs != 0; pairs &= pairs - 1) {
    I16Pair<MR, 1>(xr, &wl, std::countr_zero(pairs), sums);  // a zero W pair adds nothing
  }
}

// kMxF64 (pairs with MXFP8) when the scales allow the fast epilogue for every
// block (FastScalesOk with 31-bit dots): the int16 path, with every row's block
// in one of three classes that all add the same correctly rounded block
// result, so the bits do not depend on which one ran:
//   fits:    the row's block pairs exactly with every lane's (ShiftedPairFits;
//            FailingRows tests eight rows at once): its int16 dot and the fast
//            epilogue;
//   shifted: the dot could pass 2^31. The row goes through the same int16 dot
//            as h = x' >> T (X's two limbs: x' = xh · 2^t0 + xl and
//            h = xh >> t1, T = t0 + t1), T just large enough that
//            |Σ h·w'| < 2^(span_h + l1_w) <= 2^31, and the residue
//            x' − h · 2^T, a few small elements, dotted apart (ResidueDots
//            and SparseDots: (xh mod 2^t1) and xl, each below 2^31 while t1,
//            t0 <= 31 − l1_w);
//            the three joined in FP64 (below 2^(span_x + l1_w) <= 2^53: exact)
//            and scaled there, one rounding to FP32;
//   wide:    the rest (W lanes past 2^23 in L1, X limbs that do not fit):
//            the block in FP64 (MxF64Block).
// Every row of the tile shares W's loads in one pass over the block (a row's
// pointer says where its int16 values are: X itself, or the shifted copy); a
// row that fails costs its residue's pair or two, not a pass of its own, and
// W's low limbs only the pairs where some lane has one (split_pairs).
// Gaussian data quantized to E4M3 or E5M2 spans about 10 bits a block: in
// mx_bench's layer 3.4% of E4M3 row blocks are shifted, far fewer wide. The
// two panels of a call share each row's shift, and so its class: a row that
// one panel's block sends to FP64 (a W lane past 2^23 in L1, or past two
// limbs) goes there against both — exact either way, slower only there.
template <int MR, int NP, bool kStreaming>
void MxF64ShiftedTile(const Problem& p, int64_t row0, int, int64_t panel) {
  const DecodedX& x = *p.x;
  const WeightPanels& w = *p.w;
  const int64_t kp = x.k_padded;
  constexpr unsigned kAllRows = (1u << MR) - 1;
  alignas(64) int16_t shifted_x[MR][kBlockSize];  // shifted rows' h, wide rows' zeros
  const auto out = PerPanel<NP>(panel, [&](int64_t q) { return Out(p, q); });
  __m512 y[NP][MR];
  for (int q = 0; q < NP; ++q) {
    for (int r = 0; r < MR; ++r) y[q][r] = out[q].Start(p);
  }
  if constexpr (kStreaming) {
    // The bound test's and the split lanes' per-block arrays for the call's
    // panels: a few lines each, which the hardware did not fetch ahead of the
    // tile in a decode step (five thin streams beside W's). MXFP8 E4M3 model
    // sweep on the AMD EPYC Zen 5: 98.4 -> 91.2 ms (five interleaved rounds).
    const int64_t first = panel * x.blocks, count = NP * x.blocks;
    const auto fetch = [&](const auto* array) {
      const char* begin = reinterpret_cast<const char*>(array + first);
      const char* end = reinterpret_cast<const char*>(array + first + count);
      for (const char* line = begin; line < end; line += 64) Prefetch(line);
      Prefetch(end - 1);
    };
    fetch(w.fit_max.data());
    fetch(w.fit_l1.data());
    fetch(w.fit_sq.data());
    fetch(w.panel_l1.data());
    fetch(w.split_at.data());
  }
  for (int64_t b = 0; b < x.blocks; ++b) {
    int64_t pb[NP];
    const int16_t* wp[NP];
    unsigned failing = 0;
    int w_l1 = 0;  // the panels' largest: one shift per row serves both
    for (int q = 0; q < NP; ++q) {
      pb[q] = (panel + q) * x.blocks + b;
      if (kStreaming && b + 1 < x.blocks) PrefetchLowLimbs(w, pb[q] + 1);
      wp[q] = w.i16.data() + ((panel + q) * kp + b * kBlockSize) * kPanel;
      failing |= FailingRows(x, w, pb[q], row0, MR, b);
      w_l1 = std::max<int>(w_l1, w.panel_l1[pb[q]]);
    }
    const int16_t* xr[MR];
    for (int r = 0; r < MR; ++r) xr[r] = x.i16.data() + (row0 + r) * kp + b * kBlockSize;

    // Failing rows (a few blocks in ten have one): shifted copies, or zeros.
    unsigned wide = 0;
    for (unsigned rows = failing; rows != 0; rows &= rows - 1) {
      const int r = std::countr_zero(rows);
      const int t1 = ShiftedRowShift(x, (row0 + r) * x.blocks + b, w_l1);
      if (t1 < 0) wide |= 1u << r;
      _mm512_store_si512(shifted_x[r], t1 < 0 ? _mm512_setzero_si512()
                                              : _mm512_srai_epi16(_mm512_loadu_si512(xr[r]), t1));
      xr[r] = shifted_x[r];
    }
    if (MR >= 4 && wide != 0 && failing == kAllRows) {
      // Every row fails and some need FP64: the whole tile there, W's
      // conversions shared (a lone row pays them alone).
      for (int q = 0; q < NP; ++q) {
        __m512 block[MR];
        MxF64Block<MR>(p, row0, panel + q, b, block);
        for (int r = 0; r < MR; ++r) y[q][r] = _mm512_add_ps(y[q][r], block[r]);
      }
      continue;
    }
    __m512i acc[NP][MR];
    for (int q = 0; q < NP; ++q) {
      for (int r = 0; r < MR; ++r) acc[q][r] = _mm512_setzero_si512();
    }
    I16Rows<MR, NP>(xr, wp, acc);
    __m512 ws[NP];
    for (int q = 0; q < NP; ++q) {
      if (w.split_at[pb[q]] >= 0) AddLowLimbs<MR>(w, pb[q], xr, acc[q]);  // Σ x'h · 2^s + Σ x'l
      ws[q] = _mm512_loadu_ps(w.scale.data() + pb[q] * kPanel);
    }
    for (int r = 0; r < MR; ++r) {
      if (failing >> r & 1) {
        __m512i dots[NP];
        __m512 blocks[NP];
        for (int q = 0; q < NP; ++q) dots[q] = acc[q][r];
        FailingRowBlocks<NP>(p, row0 + r, panel, b, w_l1, dots, blocks);
        for (int q = 0; q < NP; ++q) y[q][r] = _mm512_add_ps(y[q][r], blocks[q]);
      } else {
        const float xs = x.scale[(row0 + r) * x.blocks + b];
        for (int q = 0; q < NP; ++q) y[q][r] = FastEpilogue(acc[q][r], xs, ws[q], y[q][r]);
      }
    }
  }
  for (int q = 0; q < NP; ++q) {
    for (int r = 0; r < MR; ++r) out[q].Store(p, row0 + r, y[q][r]);
  }
}

// Float kind: per output, fma over k ascending from the bias — the reference's
// order, so these bits equal the other levels' — 16 columns per instruction.
// W's 16 values of k: [k][16] in its precision, or BF16 in pairs of k
// (Bf16Lanes).
template <Format kStore>
inline __m512 LoadFloats(const WeightPanels& w, int64_t base, int64_t k) {
  if constexpr (kStore == Format::kFp32) {
    return _mm512_loadu_ps(w.f32.data() + base + k * kPanel);
  } else if constexpr (kStore == Format::kFp16) {
    return _mm512_cvtph_ps(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.f16.data() + base + k * kPanel)));
  } else {
    return Bf16Lanes(w.f16.data() + base, k);
  }
}

template <int MR, Format kStore>
void F32Tile(const Problem& p, int64_t row0, int, int64_t panel) {
  const DecodedX& x = *p.x;
  const WeightPanels& w = *p.w;
  const int64_t kp = x.k_padded;
  const Out out(p, panel);
  __m512 y[MR];
  for (int r = 0; r < MR; ++r) y[r] = out.Start(p);
  const int64_t w_base = panel * kp * kPanel;
  for (int64_t k = 0; k < w.k; ++k) {
    const __m512 wv = LoadFloats<kStore>(w, w_base, k);
    for (int r = 0; r < MR; ++r) {
      y[r] = _mm512_fmadd_ps(_mm512_set1_ps(x.f32[(row0 + r) * kp + k]), wv, y[r]);
    }
  }
  for (int r = 0; r < MR; ++r) out.Store(p, row0 + r, y[r]);
}

// vdpbf16ps with X's pair broadcast: acc += w.even · x.even + w.odd · x.odd per
// lane (kBf16, gemm_internal.h). The avx512 flags leave AVX512_BF16 out (the
// assembler takes the instruction anyway); the driver calls in only where
// CpuHasAvx512Bf16(). Asm for the embedded broadcast ({1to16}: the pair is
// read by the multiply's own load, no vpbroadcastd µop; 0.82× → 0.90× oneDNN
// at M = 512 on Zen 5), with the pair's address as a register operand: an "m"
// operand would let GCC assume the read may alias the accumulators (__m512 is
// may_alias) and store all sixteen to the stack before every instruction. The
// compiler does not know the asm reads memory, so the caller must put X's bits
// there first and keep them: Bf16PairTile's barrier does, and nothing writes X
// during a GEMM.
inline __m512 Dpbf16(__m512 acc, __m512i w, const uint16_t* x_pair) {
#ifdef MX_KERNELS_EMULATED
  return _mm512_dpbf16_ps(acc, Broadcast32(x_pair), w);  // simd_emulation.h's, on the bits
#else
  asm("vdpbf16ps (%2)%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "r"(x_pair));
  return acc;
#endif
}

// kBf16: pairs of k through vdpbf16ps, W's pair layout as it is. Two sums per
// row (k mod 4 = 0, 1 and 2, 3), added at the end, then the bias: sixteen
// chains cover the instruction's latency where eight rows alone would not. FP32 accumulation in
// another order than the reference's, within the float paths' bound where
// the instruction's flushes cannot matter (Bf16Checked redoes the rest).
template <int MR>
void Bf16PairTile(const Problem& p, int64_t row0, int, int64_t panel) {
  const DecodedX& x = *p.x;
  const WeightPanels& w = *p.w;
  const int64_t kp = x.k_padded;
  const Out out(p, panel);
  __m512 y0[MR], y1[MR];
  for (int r = 0; r < MR; ++r) y0[r] = y1[r] = _mm512_setzero_ps();
  const uint16_t* wp = w.f16.data() + panel * kp * kPanel;
  const uint16_t* xp = x.bf16.data() + row0 * kp;
  // Dpbf16's reads go in as addresses, unannounced: this barrier puts every
  // earlier store in memory first, and the reads, whose addresses derive from
  // its output, cannot move above it.
  asm volatile("" : "+r"(xp) : : "memory");
  const int64_t k_end = (w.k + 3) & ~int64_t{3};  // <= kp; both operands are 0 past w.k
  for (int64_t k = 0; k < k_end; k += 4) {
    const __m512i w0 = _mm512_loadu_si512(wp + k * kPanel);
    const __m512i w1 = _mm512_loadu_si512(wp + (k + 2) * kPanel);
    for (int r = 0; r < MR; ++r) {
      y0[r] = Dpbf16(y0[r], w0, xp + r * kp + k);
      y1[r] = Dpbf16(y1[r], w1, xp + r * kp + k + 2);
    }
  }
  // The bias after the sums, never through vdpbf16ps, which would flush a
  // subnormal one; then the outputs the guard refuses, again in exact order.
  const __m512 bias = out.Start(p);
  for (int r = 0; r < MR; ++r) {
    const __m512 v = _mm512_add_ps(bias, _mm512_add_ps(y0[r], y1[r]));
    out.Store(p, row0 + r, Bf16Checked(p, row0 + r, panel, v, bias));
  }
}

// Whether this CPU runs Bf16PairTile: always under SIMDe.
bool HasBf16Pairs() {
#ifdef MX_KERNELS_EMULATED
  return true;
#else
  return CpuHasAvx512Bf16();
#endif
}

}  // namespace

TileKernel MX_AVX512_ENTRY(Kind kind, const Problem& p) {
  switch (kind) {
    case Kind::kMxI8:
      if (!p.fast_scales) return nullptr;
      return p.w->nibbles ? MX_TWO_PANELS(MxI8Tile, true) : MX_TWO_PANELS(MxI8Tile, false);
    case Kind::kMxI16:
      if (!p.fast_scales) return nullptr;
      // MXINT8 × MXINT8: the u8/i8 copies through kMxI8's vpdpbusd tile.
      return !p.x->i8.empty() && !p.w->u8.empty() ? MX_TWO_PANELS(MxI8Tile, false)
                                                  : MX_TWO_PANELS(MxI16Tile);
    case Kind::kBf16:
      if (HasBf16Pairs()) return MX_BY_ROWS_8(Bf16PairTile);
      [[fallthrough]];  // no AVX512_BF16: the exact-order FMA tile, the reference's bits
    case Kind::kF32:
      switch (p.w->float_store) {
        case Format::kFp16:
          return MX_BY_ROWS_8(F32Tile, Format::kFp16);
        case Format::kBf16:
          return MX_BY_ROWS_8(F32Tile, Format::kBf16);
        default:
          return MX_BY_ROWS_8(F32Tile, Format::kFp32);
      }
    case Kind::kMxF64:
      if (!p.fast_scales) return MX_BY_ROWS_8(MxF64Tile);
      // One tile of rows (a decode step): each panel's W is read once, from
      // memory, and the tile prefetches what the hardware would not.
      return p.x->rows <= kAvx512TileRows ? MX_TWO_PANELS(MxF64ShiftedTile, true)
                                          : MX_TWO_PANELS(MxF64ShiftedTile, false);
    case Kind::kInt8:
      return MX_TWO_PANELS(Int8Tile);
    case Kind::kNvI8:
      return MX_TWO_PANELS(NvTile);
  }
  return nullptr;
}

}  // namespace mx::kernels::internal
