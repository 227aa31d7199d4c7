// The amx level: kMxI8 on AMX tiles, the epilogue in AVX-512. This file is
// compiled with AMX-TILE/INT8 and the avx512 flags; the driver calls in only
// after CpuSupports() said the CPU has them and the kernel granted the tile
// state (cpu_features.cc).
//
// One call computes up to 16 rows of X against one 16-column panel of W. Per MX
// block (K = 32) a single TDPBSUD multiplies the 16 × 32 s8 tile of X by the
// 8 × 64 u8 tile of W — the panel layout already is AMX's: 4 consecutive k of
// 16 lanes per 64-byte row — into a 16 × 16 int32 tile, which is stored and
// scaled into the FP32 sums by AVX-512, block by block in ascending order. Each
// instruction covers one block only (the scales change every 32 k), so the
// epilogue, not the multiply, bounds this kernel.
//
// INT8 × INT8 (kInt8) runs TDPBSUD and BF16 × BF16 (kBf16) TDPBF16PS, each over
// all of K in one C tile with one epilogue (Int8Tile, Bf16Tile).
// Other kinds run the best level below that has them (kHasKernel in
// gemm_internal.h: avx512 for all of them).
//
// Tests compile this file against an AMX emulation and SIMDe
// (tests/mx/kernels/simd_emulation.h); the entry point is then AmxTileEmulated.
#ifdef MX_KERNELS_EMULATED
#define MX_AMX_ENTRY AmxTileEmulated
#else
#include "mx/kernels/avx512_intrinsics.h"
#define MX_AMX_ENTRY AmxTile
#endif

#include <algorithm>
#include <bit>

#include "mx/kernels/gemm_internal.h"

namespace mx::kernels::internal {
namespace {

#include "mx/kernels/i8_weights_avx512.inc"
#include "mx/kernels/panel_avx512.inc"
#include "mx/kernels/bf16_avx512.inc"

// Tile registers: C (int32 sums), A (X's block), B (W's block). Macros, not
// constants: the intrinsics paste the number into the instruction's text.
#define MX_TMM_C 0
#define MX_TMM_A 1
#define MX_TMM_B 2

// LDTILECFG's 64 bytes for `rows` rows of X (palette 1).
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};

  explicit TileConfig(int x_rows) {
    colsb[MX_TMM_C] = kPanel * 4;  // 16 int32
    rows[MX_TMM_C] = static_cast<uint8_t>(x_rows);
    colsb[MX_TMM_A] = kBlockSize;  // 32 s8
    rows[MX_TMM_A] = static_cast<uint8_t>(x_rows);
    colsb[MX_TMM_B] = kPanel * 4;  // 16 lanes × 4 k
    rows[MX_TMM_B] = kBlockSize / 4;
  }
};
static_assert(sizeof(TileConfig) == 64);

template <bool kNibbles>
void MxI8Tile(const Problem& p, int64_t row0, int rows, int64_t panel) {
  const DecodedX& x = *p.x;
  const WeightPanels& w = *p.w;
  const int64_t kp = x.k_padded;
  const I8Weights512<kNibbles> weights(w, panel);

  const TileConfig config(rows);
  _tile_loadconfig(&config);
  const Out out(p, panel);
  __m512 y[kAmxTileRows];
  for (int r = 0; r < rows; ++r) y[r] = out.Start(p);
  alignas(64) int32_t dots[kAmxTileRows][kPanel];
  alignas(64) uint8_t wide[kBlockSize / 4][64];  // nibbles widened: one block of B
  for (int64_t b = 0; b < x.blocks; ++b) {
    const uint8_t* wb = weights.Block(b, wide);
    _tile_zero(MX_TMM_C);
    _tile_loadd(MX_TMM_A, x.i8.data() + row0 * kp + b * kBlockSize, kp);
    _tile_loadd(MX_TMM_B, wb, 64);
    _tile_dpbsud(MX_TMM_C, MX_TMM_A, MX_TMM_B);
    _tile_stored(MX_TMM_C, dots, kPanel * 4);
    const __m512 ws = _mm512_loadu_ps(w.scale.data() + (panel * x.blocks + b) * kPanel);
    for (int r = 0; r < rows; ++r) {
      const int64_t at = (row0 + r) * x.blocks + b;
      const __m512i dot =
          _mm512_add_epi32(_mm512_load_si512(dots[r]), _mm512_set1_epi32(x.block_offset[at]));
      y[r] = FastEpilogue(dot, x.scale[at], ws, y[r]);
    }
  }
  _tile_release();
  for (int r = 0; r < rows; ++r) out.Store(p, row0 + r, y[r]);
}

// kInt8: TDPBSUD over all of K in one C tile — X's s8 rows (A) by W's u8 copy
// w + 128 (B, already AMX's layout), 64 k per instruction and a last 32 where
// the blocks are odd (tiles 3 and 4, configured for it) — from zero, wrapping;
// then X's −128 · Σx per row (block_offset) makes each sum exact mod 2^32, and
// so exact: the driver caps K so that the true sum fits int32 (avx512's Int8Tile
// says why). The epilogue is the reference's: (float(dot) · scale_x) · scale_w,
// then the bias.
#define MX_TMM_A_TAIL 3
#define MX_TMM_B_TAIL 4
void Int8Tile(const Problem& p, int64_t row0, int rows, int64_t panel) {
  const DecodedX& x = *p.x;
  const WeightPanels& w = *p.w;
  const int64_t kp = x.k_padded;
  TileConfig config(rows);
  config.colsb[MX_TMM_A] = 2 * kBlockSize;  // 64 s8
  config.rows[MX_TMM_B] = 2 * kBlockSize / 4;
  config.colsb[MX_TMM_A_TAIL] = kBlockSize;
  config.rows[MX_TMM_A_TAIL] = static_cast<uint8_t>(rows);
  config.colsb[MX_TMM_B_TAIL] = kPanel * 4;
  config.rows[MX_TMM_B_TAIL] = kBlockSize / 4;
  _tile_loadconfig(&config);
  _tile_zero(MX_TMM_C);
  const int8_t* xp = x.i8.data() + row0 * kp;
  const uint8_t* wp = w.u8.data() + panel * kp * kPanel;
  int64_t k = 0;
  for (; k + 2 * kBlockSize <= kp; k += 2 * kBlockSize) {
    _tile_loadd(MX_TMM_A, xp + k, kp);
    _tile_loadd(MX_TMM_B, wp + k * kPanel, 64);
    _tile_dpbsud(MX_TMM_C, MX_TMM_A, MX_TMM_B);
  }
  if (k < kp) {
    _tile_loadd(MX_TMM_A_TAIL, xp + k, kp);
    _tile_loadd(MX_TMM_B_TAIL, wp + k * kPanel, 64);
    _tile_dpbsud(MX_TMM_C, MX_TMM_A_TAIL, MX_TMM_B_TAIL);
  }
  alignas(64) int32_t dots[kAmxTileRows][kPanel];
  _tile_stored(MX_TMM_C, dots, kPanel * 4);
  _tile_release();
  const Out out(p, panel);
  const __m512 ws = _mm512_loadu_ps(w.scale.data() + panel * kPanel);
  for (int r = 0; r < rows; ++r) {
    const __m512i dot =
        _mm512_add_epi32(_mm512_load_si512(dots[r]), _mm512_set1_epi32(x.block_offset[row0 + r]));
    out.Store(p, row0 + r, Int8Epilogue(p, out, dot, x.scale[row0 + r], ws));
  }
}

// kBf16: TDPBF16PS, 32 k per instruction — X's 16 × 32 BF16 as they are (A),
// W's pair layout as it is (B: 16 pairs of k × 16 lanes × 2) — summed in the C
// tile over all of K, then the bias added once: no per-block epilogue, so the
// tile unit, not AVX-512, sets the pace. Within the float paths' bound like
// avx512's Bf16PairTile, whose per-output guard (Bf16Checked) it shares.
void Bf16Tile(const Problem& p, int64_t row0, int rows, int64_t panel) {
  const DecodedX& x = *p.x;
  const WeightPanels& w = *p.w;
  const int64_t kp = x.k_padded;
  TileConfig config(rows);
  config.colsb[MX_TMM_A] = kBlockSize * 2;  // 32 BF16
  config.rows[MX_TMM_B] = kBlockSize / 2;   // 16 pairs of k
  _tile_loadconfig(&config);
  _tile_zero(MX_TMM_C);
  const uint16_t* wp = w.f16.data() + panel * kp * kPanel;
  const uint16_t* xp = x.bf16.data() + row0 * kp;
  for (int64_t k = 0; k < kp; k += kBlockSize) {
    _tile_loadd(MX_TMM_A, xp + k, kp * 2);
    _tile_loadd(MX_TMM_B, wp + k * kPanel, kPanel * 4);
    _tile_dpbf16ps(MX_TMM_C, MX_TMM_A, MX_TMM_B);
  }
  alignas(64) float sums[kAmxTileRows][kPanel];
  _tile_stored(MX_TMM_C, sums, kPanel * 4);
  _tile_release();
  const Out out(p, panel);
  const __m512 bias = out.Start(p);
  for (int r = 0; r < rows; ++r) {  // the outputs the guard refuses again, in exact order
    const __m512 v = _mm512_add_ps(bias, _mm512_load_ps(sums[r]));
    out.Store(p, row0 + r, Bf16Checked(p, row0 + r, panel, v, bias));
  }
}

}  // namespace

TileKernel MX_AMX_ENTRY(Kind kind, const Problem& p) {
  switch (kind) {
    case Kind::kMxI8:
      if (!p.fast_scales) return nullptr;
      return p.w->nibbles ? MxI8Tile<true> : MxI8Tile<false>;
    case Kind::kInt8:
      return Int8Tile;
    case Kind::kBf16:
      return Bf16Tile;
    default:
      return nullptr;
  }
}

}  // namespace mx::kernels::internal
