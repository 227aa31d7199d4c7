// The avx512 level: tile kernels with AVX-512 F/BW/VL/DQ + VNNI intrinsics.
// This file is compiled with those flags; the driver calls in only after
// CpuSupports() said the CPU has them.
//
// A 16-column panel of W is exactly one zmm of int32 or float lanes, so a tile
// is up to 8 rows × one panel in eight accumulators — enough independent chains
// to keep two FMA/VNNI pipes busy through their latency, and at M = 8 (one
// decode step of a batch) W is read once — and the integer kinds need no int16
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
#include <bit>
#include <cstring>

#include "mx/kernels/gemm_internal.h"

namespace mx::kernels::internal {
namespace {

#include "mx/kernels/i8_weights_avx512.inc"
#include "mx/kernels/panel_avx512.inc"
#include "mx/kernels/bf16_avx512.inc"

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

// Every block of X's rows [row0, row0 + MR) against one panel of u8 W through
// vpdpbusd (kGroups groups of 4 k a block: 8 for MX, 4 for NVFP4's 16), from
// the block's offset correction, and the fast epilogue into y block by block.
template <int MR, bool kNibbles, int kGroups>
inline void I8BlocksInto(const Problem& p, const I8Weights512<kNibbles>& weights, int64_t row0,
                         int64_t panel, __m512* y) {
  const DecodedX& x = *p.x;
  const int64_t kp = x.k_padded;
  for (int64_t b = 0; b < x.blocks; ++b) {
    __m512i acc[MR];
    for (int r = 0; r < MR; ++r) {
      acc[r] = _mm512_set1_epi32(x.block_offset[(row0 + r) * x.blocks + b]);
    }
    for (int64_t group = b * kGroups; group < (b + 1) * kGroups; group += 2) {
      __m512i w0, w1;
      weights.Pair(group, w0, w1);
      for (int r = 0; r < MR; ++r) {
        const int8_t* xr = x.i8.data() + (row0 + r) * kp + group * 4;
        acc[r] = Dpbusd(acc[r], w0, Broadcast32(xr));
        acc[r] = Dpbusd(acc[r], w1, Broadcast32(xr + 4));
      }
    }
    const __m512 ws = _mm512_loadu_ps(p.w->scale.data() + (panel * x.blocks + b) * kPanel);
    for (int r = 0; r < MR; ++r) {
      y[r] = FastEpilogue(acc[r], x.scale[(row0 + r) * x.blocks + b], ws, y[r]);
    }
  }
}

// kMxI8: u8 (w + offset) · s8 x with vpdpbusd, one k-group of 4 per
// instruction, the offset's share subtracted through block_offset. MXFP4 W
// (kNibbles) holds two groups' 4-bit codes in one 64-byte load — the layout of
// gemm_internal.h puts each group's 16 lanes × 4 k in order — widened by vpshufb.
template <int MR, bool kNibbles>
void MxI8Tile(const Problem& p, int64_t row0, int, int64_t panel) {
  const I8Weights512<kNibbles> weights(*p.w, panel);
  const Out out(p, panel);
  __m512 y[MR];
  for (int r = 0; r < MR; ++r) y[r] = out.Start(p);
  I8BlocksInto<MR, kNibbles, kBlockSize / 4>(p, weights, row0, panel, y);
  for (int r = 0; r < MR; ++r) out.Store(p, row0 + r, y[r]);
}

// kNvI8: NVFP4's blocks of 16 k (four groups of 4) through vpdpbusd as kMxI8's
// wide storage (w + 12, block_offset −12 · Σx), the fast epilogue per block
// (always exact for it, gemm_internal.h); after the last block
// y · fp32(ts_x · ts_w), then + bias: the order of the other levels.
template <int MR>
void NvTile(const Problem& p, int64_t row0, int, int64_t panel) {
  const DecodedX& x = *p.x;
  const WeightPanels& w = *p.w;
  const I8Weights512<false> weights(w, panel);
  const Out out(p, panel);
  __m512 y[MR];
  for (int r = 0; r < MR; ++r) y[r] = _mm512_setzero_ps();
  I8BlocksInto<MR, false, 4>(p, weights, row0, panel, y);
  const __m512 tw = _mm512_maskz_loadu_ps(out.cols, w.tensor_scale.data() + out.n0);
  for (int r = 0; r < MR; ++r) {
    const __m512 v =
        _mm512_mul_ps(y[r], _mm512_mul_ps(_mm512_set1_ps(x.tensor_scale[row0 + r]), tw));
    out.Store(p, row0 + r, p.bias ? _mm512_add_ps(v, out.Start(p)) : v);  // no bias: −0 kept
  }
}

// acc[r] += Σ over X's block b of row r's int16 pairs · W's, per lane
// (vpdpwssd), W's 16 pairs of 16 lanes from `wp`: the inner loop of kMxI16 and
// of kMxF64's int16 path.
template <int MR>
void I16Block(const DecodedX& x, const int16_t* wp, int64_t row0, int64_t b, __m512i* acc) {
  const int16_t* xp = x.i16.data() + row0 * x.k_padded + b * kBlockSize;
  for (int pair = 0; pair < kBlockSize / 2; ++pair) {
    const __m512i wv = _mm512_loadu_si512(wp + pair * 2 * kPanel);
    for (int r = 0; r < MR; ++r) {
      acc[r] = Dpwssd(acc[r], wv, Broadcast32(xp + r * x.k_padded + 2 * pair));
    }
  }
}

// kMxI16: int16 pairs, vpdpwssd: one k-pair of the 16 lanes per instruction.
template <int MR>
void MxI16Tile(const Problem& p, int64_t row0, int, int64_t panel) {
  const DecodedX& x = *p.x;
  const WeightPanels& w = *p.w;
  const int16_t* wp = w.i16.data() + panel * x.k_padded * kPanel;
  const Out out(p, panel);
  __m512 y[MR];
  for (int r = 0; r < MR; ++r) y[r] = out.Start(p);
  for (int64_t b = 0; b < x.blocks; ++b) {
    __m512i acc[MR];
    for (int r = 0; r < MR; ++r) acc[r] = _mm512_setzero_si512();
    I16Block<MR>(x, wp + b * kBlockSize * kPanel, row0, b, acc);
    const __m512 ws = _mm512_loadu_ps(w.scale.data() + (panel * x.blocks + b) * kPanel);
    for (int r = 0; r < MR; ++r) {
      y[r] = FastEpilogue(acc[r], x.scale[(row0 + r) * x.blocks + b], ws, y[r]);
    }
  }
  for (int r = 0; r < MR; ++r) out.Store(p, row0 + r, y[r]);
}

// INT8: the whole K in int32 — vpdpbusd on W's u8 copy (w + 128) and X's bytes,
// from −128 · Σ x, four products per lane per instruction; exact: after any
// prefix of K the sum is Σ_prefix x·w − 128 · Σ_rest x, within 2^14 · K < 2^31
// (the driver caps K) — then
// (float(dot) · scale_x) · scale_w, then the bias, in the reference's order (no
// fused multiply-add).
template <int MR>
void Int8Tile(const Problem& p, int64_t row0, int, int64_t panel) {
  const DecodedX& x = *p.x;
  const WeightPanels& w = *p.w;
  const int64_t kp = x.k_padded;
  const uint8_t* wp = w.u8.data() + panel * kp * kPanel;
  const Out out(p, panel);
  __m512i acc[MR];
  for (int r = 0; r < MR; ++r) acc[r] = _mm512_set1_epi32(x.block_offset[row0 + r]);
  for (int64_t group = 0; group < kp / 4; ++group) {
    const __m512i wv = _mm512_loadu_si512(wp + group * 4 * kPanel);
    for (int r = 0; r < MR; ++r) {
      acc[r] = Dpbusd(acc[r], wv, Broadcast32(x.i8.data() + (row0 + r) * kp + group * 4));
    }
  }
  const __m512 ws = _mm512_loadu_ps(w.scale.data() + panel * kPanel);
  for (int r = 0; r < MR; ++r) {
    out.Store(p, row0 + r, Int8Epilogue(p, out, acc[r], x.scale[row0 + r], ws));
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

// The largest l1 bits of W's lanes for which MxF64SplitRowBlock is exact: the
// high byte's dot is below 2^(7 + l1) and must fit int32.
inline constexpr int kSplitRowMaxWL1 = 23;

// One row's block of kMxF64 that fails the int32 bound against some lane, its
// X block in one int16 limb x' or two, x' = h · 2^t + l (kSplitX: span 16 to
// 30). The int16 limb (x' or h) split into bytes, (v >> 8) · 2^8 + (v & 255):
// each part's dot with W, |v >> 8| < 2^7 and v & 255 < 2^8 against Σ|w'| < 2^l1
// with l1 <= kSplitRowMaxWL1, fits int32 (split W lanes joined there as in the
// int16 path), as does l's (l < 2^t, t + l1 <= 31: the caller checks); all are
// joined exactly in FP64 (below 2^53: spans <= 30 and l1 <= 23) and scaled
// there, one rounding to FP32. No FP16 conversions: on Zen 5 those made
// MxF64Block<1> cost some twenty int16 row blocks.
template <bool kSplitW, bool kSplitX>
__m512 MxF64SplitRowBlock(const Problem& p, int64_t row, int64_t panel, int64_t b) {
  const DecodedX& x = *p.x;
  const WeightPanels& w = *p.w;
  const int64_t pb = panel * x.blocks + b;
  const int16_t* wp = w.i16.data() + (panel * x.k_padded + b * kBlockSize) * kPanel;
  const int16_t* wl = kSplitW ? w.i16_lo.data() + w.split_at[pb] : nullptr;
  const int64_t at = row * x.k_padded + b * kBlockSize;
  const int16_t* xp = x.i16.data() + at;
  const int16_t* xq = kSplitX ? x.i16_lo.data() + at : nullptr;
  const __m512i low_byte = _mm512_set1_epi16(0x00FF);
  __m512i high[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
  __m512i low[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
  __m512i limb[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};  // kSplitX: Σ l·w'
  for (int pair = 0; pair < kBlockSize / 2; ++pair) {
    const __m512i wv = _mm512_loadu_si512(wp + pair * 2 * kPanel);
    const __m512i xv = Broadcast32(xp + 2 * pair);
    const __m512i xh = _mm512_srai_epi16(xv, 8), xl = _mm512_and_si512(xv, low_byte);
    high[0] = Dpwssd(high[0], wv, xh);
    low[0] = Dpwssd(low[0], wv, xl);
    if constexpr (kSplitX) limb[0] = Dpwssd(limb[0], wv, Broadcast32(xq + 2 * pair));
    if constexpr (kSplitW) {  // the low limbs, joined below
      const __m512i lv = _mm512_loadu_si512(wl + pair * 2 * kPanel);
      high[1] = Dpwssd(high[1], lv, xh);
      low[1] = Dpwssd(low[1], lv, xl);
      if constexpr (kSplitX) limb[1] = Dpwssd(limb[1], lv, Broadcast32(xq + 2 * pair));
    }
  }
  __m512i h = high[0], l = low[0], q = limb[0];
  if constexpr (kSplitW) {
    const __m512i shifts = LimbShifts(w, pb);
    h = JoinLimbs(h, high[1], shifts);
    l = JoinLimbs(l, low[1], shifts);
    q = JoinLimbs(q, limb[1], shifts);
  }
  // 2^t for X's high limb (1 unsplit).
  const __m512d limb_scale =
      _mm512_set1_pd(kSplitX ? static_cast<double>(1 << x.split_shift[row * x.blocks + b]) : 1.0);
  const __m512d xs = _mm512_set1_pd(x.scale[row * x.blocks + b]);
  const __m512 ws = _mm512_loadu_ps(w.scale.data() + pb * kPanel);
  __m256 half[2];
  for (int i = 0; i < 2; ++i) {
    __m512d dot = _mm512_fmadd_pd(_mm512_cvtepi32_pd(Half(h, i)), _mm512_set1_pd(256.0),
                                  _mm512_cvtepi32_pd(Half(l, i)));
    if constexpr (kSplitX) dot = _mm512_fmadd_pd(dot, limb_scale, _mm512_cvtepi32_pd(Half(q, i)));
    half[i] = _mm512_cvtpd_ps(_mm512_mul_pd(_mm512_mul_pd(dot, xs), _mm512_cvtps_pd(Half(ws, i))));
  }
  return Join(half[0], half[1]);
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

// kMxF64 (pairs with MXFP8) when the scales allow the fast epilogue for every
// block (FastScalesOk with 31-bit dots). Each row's block takes one of three
// paths that give the same correctly rounded block result, so the bits do not
// depend on which one ran:
//   int16: where the row's block pairs exactly with every lane's
//          (ShiftedPairFits, looked up in W's fit_below), vpdpwssd on the
//          shifted integers — 32 products per instruction against FP64's 8;
//          twice where W's block has split lanes, the limbs joined in int32 —
//          and the fast epilogue;
//   split: a row that fails the bound, X's limb split in bytes
//          (MxF64SplitRowBlock), where W's L1 and X's span allow;
//   FP64:  the rest (MxF64Block: one row, or the whole tile when every row
//          fails and some need it).
// A first pass finds the failing rows of every block and computes their block
// results in (block, row) order; the second runs the int16 path and adds each block, taking
// those results where it must, so the hot loop makes no calls (which would
// spill the sixteen accumulators). Gaussian data quantized to E4M3 or E5M2
// spans about 10 bits a block: most blocks take the int16 path, and the E4M3
// bench's other rows all take the split.
template <int MR>
void MxF64ShiftedTile(const Problem& p, int64_t row0, int, int64_t panel) {
  const DecodedX& x = *p.x;
  const WeightPanels& w = *p.w;
  constexpr unsigned kAllRows = (1u << MR) - 1;
  // Per block, bit r: row r fails the int16 path; and those rows' block results,
  // 16 floats each, in (block, row) order: at most every row of every block.
  uint8_t* const failing_rows = ScratchBytes(x.blocks);
  float* const row_results = ScratchFloats(x.blocks * MR * kPanel);
  float* result = row_results;
  for (int64_t b = 0; b < x.blocks; ++b) {
    const int64_t pb = panel * x.blocks + b;
    const uint8_t* fit = w.fit_below.data() + pb * (kShiftedI16Bits + 1);
    const bool split_w = w.split_at[pb] >= 0;
    const int w_l1 = w.panel_l1[pb];
    // Failing rows, and which of them the byte split takes (W's L1 within
    // 2^23; X in one limb, or two with the low limb's dot within int32); the
    // rest need FP64.
    unsigned rows = 0, one_limb = 0, two_limbs = 0;
    for (int r = 0; r < MR; ++r) {
      const int64_t at = (row0 + r) * x.blocks + b;
      const int x_span = x.span_bits[at];
      if (x_span <= kShiftedI16Bits && x.l1_bits[at] < fit[x_span]) continue;
      rows |= 1u << r;
      if (w_l1 > kSplitRowMaxWL1) continue;
      if (x_span <= kShiftedI16Bits) {
        one_limb |= 1u << r;
      } else if (x_span <= kShiftedSplitBits && x.split_shift[at] + w_l1 <= kShiftedDotBits) {
        two_limbs |= 1u << r;
      }
    }
    failing_rows[b] = static_cast<uint8_t>(rows);
    if (MR >= 4 && rows == kAllRows && (one_limb | two_limbs) != kAllRows) {
      // Every row fails and some need FP64: the whole tile there, its W
      // conversions shared (a lone row pays them alone).
      __m512 block[MR];
      MxF64Block<MR>(p, row0, panel, b, block);
      for (int r = 0; r < MR; ++r, result += kPanel) _mm512_storeu_ps(result, block[r]);
      continue;
    }
    for (int r = 0; r < MR; ++r) {
      if (!(rows >> r & 1)) continue;
      __m512 block[1];
      if (one_limb >> r & 1) {
        block[0] = split_w ? MxF64SplitRowBlock<true, false>(p, row0 + r, panel, b)
                           : MxF64SplitRowBlock<false, false>(p, row0 + r, panel, b);
      } else if (two_limbs >> r & 1) {
        block[0] = split_w ? MxF64SplitRowBlock<true, true>(p, row0 + r, panel, b)
                           : MxF64SplitRowBlock<false, true>(p, row0 + r, panel, b);
      } else {
        MxF64Block<1>(p, row0 + r, panel, b, block);
      }
      _mm512_storeu_ps(result, block[0]);
      result += kPanel;
    }
  }

  const int16_t* wi = w.i16.data() + panel * x.k_padded * kPanel;
  const float* next = row_results;
  const Out out(p, panel);
  __m512 y[MR];
  for (int r = 0; r < MR; ++r) y[r] = out.Start(p);
  for (int64_t b = 0; b < x.blocks; ++b) {
    const unsigned rows = failing_rows[b];
    if (rows == kAllRows) {
      for (int r = 0; r < MR; ++r, next += kPanel) y[r] = _mm512_add_ps(y[r], _mm512_loadu_ps(next));
      continue;
    }
    __m512i acc[MR];
    for (int r = 0; r < MR; ++r) acc[r] = _mm512_setzero_si512();
    const int64_t pb = panel * x.blocks + b;
    I16Block<MR>(x, wi + b * kBlockSize * kPanel, row0, b, acc);
    if (const int32_t lo = w.split_at[pb]; lo >= 0) {  // split lanes: Σ x'h · 2^s + Σ x'l
      __m512i low[MR];
      for (int r = 0; r < MR; ++r) low[r] = _mm512_setzero_si512();
      I16Block<MR>(x, w.i16_lo.data() + lo, row0, b, low);
      const __m512i shifts = LimbShifts(w, pb);
      for (int r = 0; r < MR; ++r) acc[r] = JoinLimbs(acc[r], low[r], shifts);
    }
    const __m512 ws = _mm512_loadu_ps(w.scale.data() + pb * kPanel);
    for (int r = 0; r < MR; ++r) {
      if (rows >> r & 1) {
        y[r] = _mm512_add_ps(y[r], _mm512_loadu_ps(next));
        next += kPanel;
      } else {
        y[r] = FastEpilogue(acc[r], x.scale[(row0 + r) * x.blocks + b], ws, y[r]);
      }
    }
  }
  for (int r = 0; r < MR; ++r) out.Store(p, row0 + r, y[r]);
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

TileFn MX_AVX512_ENTRY(Kind kind, const Problem& p) {
  switch (kind) {
    case Kind::kMxI8:
      if (!p.fast_scales) return nullptr;
      return p.w->nibbles ? MX_BY_ROWS_8(MxI8Tile, true) : MX_BY_ROWS_8(MxI8Tile, false);
    case Kind::kMxI16:
      if (!p.fast_scales) return nullptr;
      // MXINT8 × MXINT8: the u8/i8 copies through kMxI8's vpdpbusd tile.
      return !p.x->i8.empty() && !p.w->u8.empty() ? MX_BY_ROWS_8(MxI8Tile, false)
                                                  : MX_BY_ROWS_8(MxI16Tile);
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
      return p.fast_scales ? MX_BY_ROWS_8(MxF64ShiftedTile) : MX_BY_ROWS_8(MxF64Tile);
    case Kind::kInt8:
      return MX_BY_ROWS_8(Int8Tile);
    case Kind::kNvI8:
      return MX_BY_ROWS_8(NvTile);
  }
  return nullptr;
}

}  // namespace mx::kernels::internal
