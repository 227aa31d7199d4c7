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
// Other kinds run the best level below that has them (kHasKernel in
// gemm_internal.h: avx512 for all but kNvI8, which runs avx2).
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
#include <cstring>

#include "mx/kernels/gemm_internal.h"

namespace mx::kernels::internal {
namespace {

#include "mx/kernels/i8_weights_avx512.inc"

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
  // Outputs from the bias (or +0.0), the 16 valid-or-not columns of each row.
  const int64_t n0 = panel * kPanel;
  const int cols = static_cast<int>(std::min<int64_t>(kPanel, p.n - n0));
  float start[kPanel] = {};
  for (int j = 0; j < cols && p.bias; ++j) start[j] = p.bias[n0 + j];
  __m512 y[kAmxTileRows];
  for (int r = 0; r < rows; ++r) y[r] = _mm512_loadu_ps(start);
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
      const __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(dot), _mm512_set1_ps(x.scale[at]));
      y[r] = _mm512_fmadd_ps(t, ws, y[r]);
    }
  }
  _tile_release();
  for (int r = 0; r < rows; ++r) {
    float out[kPanel];
    _mm512_storeu_ps(out, y[r]);
    std::memcpy(p.y + (row0 + r) * p.n + n0, out, cols * sizeof(float));
  }
}

}  // namespace

TileFn MX_AMX_ENTRY(Kind kind, const Problem& p) {
  if (kind != Kind::kMxI8 || !p.fast_scales) return nullptr;
  return p.w->nibbles ? MxI8Tile<true> : MxI8Tile<false>;
}

}  // namespace mx::kernels::internal
