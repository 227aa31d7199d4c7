// The GEMM driver: validation, the choice of kind and kernel, X decoding, and
// the split of M × N into tiles across the caller's threads.
#include "mx/kernels/linear.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "mx/element.h"
#include "mx/kernels/gemm_internal.h"
#include "mx/kernels/operands.h"
#include "mx/reference_gemm.h"

namespace mx::kernels {
namespace {

using internal::Kind;

// Rows of X per task: 64 tiles of 4 (32 of 8 at avx512). A task walks its rows against the
// panels of W one tile call takes (one or two), which stay in L1 or L2 meanwhile; X's rows
// stay in L2 across panels.
constexpr int64_t kRowsPerTask = 256;
// Tiles start at multiples of their row count, and a tile's rows lie in one group of
// kFitRows where its count divides it (MxF64ShiftedTile relies on both).
static_assert(kRowsPerTask % internal::kFitRows == 0 &&
              kRowsPerTask % internal::kAmxTileRows == 0);

// INT8 sums over all of K in int32: 128 · 128 · K (a client may pack −128) must
// stay below 2^31.
constexpr int64_t kMaxInt8K = ((int64_t{1} << 31) - 1) / (128 * 128);

absl::Status CheckArguments(const QuantizedMatrix& x, const PackedWeight& w,
                            std::span<const float> bias, size_t y_size) {
  if (absl::Status s = ValidateLayout(x); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("x ", s.message()));
  }
  if (x.cols != w.cols()) {
    return absl::InvalidArgumentError(
        absl::StrCat("w: expected K = ", x.cols, " columns to match x, got ", w.cols()));
  }
  if (!bias.empty() && static_cast<int64_t>(bias.size()) != w.rows()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bias: expected ", w.rows(), " values (one per row of w), got ", bias.size()));
  }
  if (static_cast<int64_t>(y_size) != x.rows * w.rows()) {
    return absl::InvalidArgumentError(absl::StrCat("y: expected ", x.rows, "x", w.rows(), " = ",
                                                   x.rows * w.rows(), " values, got ", y_size));
  }
  return absl::OkStatus();
}

// Why the exact fast kernels cannot take this pair, or "" when they can.
std::string FallbackReason(const internal::DecodedX& x, const internal::WeightPanels& w) {
  if (x.has_special) return "x holds Inf/NaN element codes";
  if (w.has_special) return "w holds Inf/NaN element codes";
  if (x.kind == Kind::kInt8 && w.k > kMaxInt8K) {
    return absl::StrCat("INT8 with K = ", w.k, " > ", kMaxInt8K, " could overflow int32");
  }
  return "";
}

// A kMxF64 block sum is exact in FP64 when the spans of its two blocks (bits from
// the lowest set bit of any fixed-point element to the top of the largest) leave
// room for the carries of 32 terms: span_x + span_w + 5 <= 53. E4M3 blocks span
// at most 18 bits, so only E5M2 (32) can break it.
constexpr int kFp64Bits = 53, kCarryBits = 5;

bool MayHaveWideBlocks(const internal::DecodedX& x, const internal::WeightPanels& w) {
  return x.kind == Kind::kMxF64 && x.max_span_bits + w.max_span_bits + kCarryBits > kFp64Bits;
}

// One output, the reference's way: every block dot exact in 128-bit integers,
// rounded once to FP32, the blocks summed in FP32 in ascending order.
float ExactOutput(const internal::Problem& p, int64_t i, int64_t j) {
  const internal::DecodedX& x = *p.x;
  const internal::WeightPanels& w = *p.w;
  const int fx = FixedPointFractionBits(p.x_format), fw = FixedPointFractionBits(w.format);
  const int64_t kp = x.k_padded, panel = j / internal::kPanel, lane = j % internal::kPanel;
  const uint16_t* wp = w.f16.data() + panel * kp * internal::kPanel + lane;
  float sum = p.bias ? p.bias[j] : 0.0f;
  for (int64_t b = 0; b < x.blocks; ++b) {
    const double xs = x.scale_d[i * x.blocks + b];
    const double ws = w.scale_d[(panel * x.blocks + b) * internal::kPanel + lane];
    if (std::isnan(xs) || std::isnan(ws)) {
      sum += std::numeric_limits<float>::quiet_NaN();
      continue;
    }
    __int128 dot = 0;
    for (int64_t k = b * kBlockSize; k < (b + 1) * kBlockSize; ++k) {
      // Element values scaled to their fixed-point integers: exact (< 2^32).
      const auto xi = static_cast<int64_t>(std::ldexp(x.f64[i * kp + k], fx));
      const auto wi = static_cast<int64_t>(
          std::ldexp(static_cast<double>(Fp16ToFloat(wp[k * internal::kPanel])), fw));
      dot += static_cast<__int128>(xi) * wi;
    }
    sum += RoundScaledToFloat(dot, std::ilogb(xs) + std::ilogb(ws) - fx - fw);
  }
  return sum;
}

// After the tiles of rows [first, end) × one panel: outputs with a pair of blocks
// too wide for FP64 are computed again by ExactOutput. Rows and columns whose
// widest block cannot make such a pair are skipped without looking at blocks.
void RedoWideOutputs(const internal::Problem& p, int64_t first, int64_t end, int64_t panel) {
  const internal::DecodedX& x = *p.x;
  const internal::WeightPanels& w = *p.w;
  const int64_t blocks = x.blocks;
  const int64_t j0 = panel * internal::kPanel, j1 = std::min(p.n, j0 + internal::kPanel);
  std::array<int, internal::kPanel> col_max{};
  for (int64_t j = j0; j < j1; ++j) {
    const uint8_t* span = w.span_bits.data() + j * blocks;
    col_max[j - j0] = *std::max_element(span, span + blocks);
  }
  const int panel_max = *std::max_element(col_max.begin(), col_max.end());
  constexpr int kRoom = kFp64Bits - kCarryBits;
  for (int64_t i = first; i < end; ++i) {
    const uint8_t* x_span = x.span_bits.data() + i * blocks;
    const int row_max = *std::max_element(x_span, x_span + blocks);
    if (row_max + panel_max <= kRoom) continue;
    for (int64_t j = j0; j < j1; ++j) {
      if (row_max + col_max[j - j0] <= kRoom) continue;
      const uint8_t* w_span = w.span_bits.data() + j * blocks;
      for (int64_t b = 0; b < blocks; ++b) {
        if (x_span[b] + w_span[b] > kRoom) {
          p.y[i * p.n + j] = ExactOutput(p, i, j);
          break;
        }
      }
    }
  }
}

}  // namespace

bool internal::HasKernel(Isa level, Kind kind) {
  return kHasKernel[static_cast<int>(kind)][static_cast<int>(level)];
}

Isa internal::LevelFor(Kind kind, Isa requested) {
  Isa level = requested;
  while (level != Isa::kScalar && !HasKernel(level, kind)) {
    level = static_cast<Isa>(static_cast<int>(level) - 1);
  }
  return level;
}

std::string internal::KernelName(Isa level, Kind kind) {
  return absl::StrCat(IsaName(level), "/", KindName(kind));
}

internal::TileKernel internal::TileAt(Isa level, Kind kind, const Problem& p) {
  switch (level) {
    case Isa::kScalar:
      return ScalarTile(kind);
    case Isa::kAvx2:
      return Avx2Tile(kind, p);
    case Isa::kAvx512:
      return Avx512Tile(kind, p);
    case Isa::kAmx:
      return AmxTile(kind, p);
  }
  return nullptr;
}

std::string KernelNameFor(Format x, Format w, Isa isa) {
  const Kind kind = internal::KindFor(x, w);
  return internal::KernelName(internal::LevelFor(kind, Resolve(isa)), kind);
}

absl::StatusOr<PackedWeight> PackedWeight::Pack(const QuantizedMatrix& w) {
  if (absl::Status s = ValidateLayout(w); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("w ", s.message()));
  }
  PackedWeight packed;
  packed.panels_ = internal::PackPanels(w, internal::KindFor(w.format, w.format));
  // The reference needs the original for Inf/NaN codes; a lookup-format W runs as
  // its FP32 values (the float kind), which do not give its codes back.
  if (packed.panels_->has_special || Traits(w.format).is_lookup()) {
    packed.original_ = std::make_shared<const QuantizedMatrix>(w);
  }
  return packed;
}

Format PackedWeight::format() const { return panels_->format; }
int64_t PackedWeight::rows() const { return panels_->n; }
int64_t PackedWeight::cols() const { return panels_->k; }
size_t PackedWeight::bytes() const {
  size_t bytes = panels_->bytes();
  if (original_) {
    bytes += original_->elements.size() + original_->block_scales.size() +
             4 * original_->row_scales.size();
  }
  return bytes;
}
QuantizedMatrix PackedWeight::Unpacked() const {
  return original_ ? *original_ : internal::UnpackPanels(*panels_);
}

absl::StatusOr<KernelInfo> Linear(const QuantizedMatrix& x, const PackedWeight& w,
                                  std::span<const float> bias, std::span<float> y,
                                  const GemmOptions& options) {
  return internal::LinearWith(x, w, bias, y, options, nullptr);
}

absl::StatusOr<KernelInfo> internal::LinearWith(const QuantizedMatrix& x, const PackedWeight& w,
                                                std::span<const float> bias, std::span<float> y,
                                                const GemmOptions& options,
                                                const TileOverride* tiles) {
  if (absl::Status s = CheckArguments(x, w, bias, y.size()); !s.ok()) return s;
  // exact_bf16: the float kind, whose kernels keep the reference's order (and
  // share BF16 W's layout).
  const Kind pair_kind = internal::KindFor(x.format, w.format());
  const Kind kind = options.exact_bf16 && pair_kind == Kind::kBf16 ? Kind::kF32 : pair_kind;

  // A pair whose kind differs from the one W was packed for gets a temporary layout.
  std::shared_ptr<const internal::WeightPanels> temporary;
  if (!internal::SharesLayout(w.panels().kind, kind)) {
    temporary = internal::PackPanels(w.Unpacked(), kind);
  }
  const internal::WeightPanels* panels = temporary ? temporary.get() : &w.panels();
  const internal::DecodedX decoded = internal::DecodeActivations(x, kind, w.format(), options.pool);

  KernelInfo info;
  info.fallback_reason = FallbackReason(decoded, *panels);
  if (!info.fallback_reason.empty()) {
    absl::StatusOr<std::vector<float>> out = ReferenceLinear(x, w.Unpacked(), bias);
    if (!out.ok()) return out.status();
    std::copy(out->begin(), out->end(), y.begin());
    info.name = "reference";
    return info;
  }

  internal::Problem problem{&decoded,
                            panels,
                            bias.empty() ? nullptr : bias.data(),
                            y.data(),
                            x.format,
                            w.rows(),
                            internal::FastScalesOk(decoded, *panels)};
  // The best level that has a kernel for this kind (kHasKernel) and takes these
  // operands: a level may decline scales its fast epilogue cannot take exactly,
  // and then the next level down that has the kind runs, scalar in the end.
  internal::TileKernel tile = tiles ? tiles->select(kind, problem) : nullptr;
  if (tile) {
    info.name = absl::StrCat(tiles->name, "/", internal::KindName(kind));
  }
  int tile_rows = tiles && tile ? tiles->rows : internal::kMaxTileRows;
  for (Isa isa = internal::LevelFor(kind, Resolve(options.isa)); !tile;) {
    tile = internal::TileAt(isa, kind, problem);
    if (tile) {
      info.name = internal::KernelName(isa, kind);
      tile_rows = internal::TileRows(isa);
      break;
    }
    if (isa == Isa::kScalar) {
      return absl::InternalError(absl::StrCat("no kernel for ", internal::KindName(kind)));
    }
    isa = internal::LevelFor(kind, static_cast<Isa>(static_cast<int>(isa) - 1));
  }

  if (kind == Kind::kMxF64 && internal::kFitRows % tile_rows != 0) {
    // MxF64ShiftedTile reads a tile's rows from one group of X's fit arrays.
    return absl::InternalError(absl::StrCat(info.name, " takes ", tile_rows,
                                            " rows a tile, not a divisor of ", internal::kFitRows));
  }
  const bool redo_wide = MayHaveWideBlocks(decoded, *panels);
  if (redo_wide) absl::StrAppend(&info.name, "+exact_wide");

  // A task: a group of rows against the panels of one call of the tile.
  const int64_t row_groups = (x.rows + kRowsPerTask - 1) / kRowsPerTask;
  const int64_t panel_groups = (panels->panels + tile.panels - 1) / tile.panels;
  const int64_t tasks = row_groups * panel_groups;
  const auto run_task = [&](int64_t task) {
    const int64_t panel = task % panel_groups * tile.panels;
    const int64_t first = (task / panel_groups) * kRowsPerTask;
    const int64_t end = std::min(x.rows, first + kRowsPerTask);
    for (int64_t row = first; row < end; row += tile_rows) {
      tile.fn(problem, row, static_cast<int>(std::min<int64_t>(tile_rows, end - row)), panel);
    }
    if (redo_wide) {
      for (int64_t q = panel; q < std::min(panels->panels, panel + tile.panels); ++q) {
        RedoWideOutputs(problem, first, end, q);
      }
    }
  };
  if (options.pool != nullptr) {
    options.pool->ParallelFor(tasks, run_task);
  } else {
    for (int64_t task = 0; task < tasks; ++task) run_task(task);
  }
  return info;
}

absl::StatusOr<std::vector<float>> Linear(const QuantizedMatrix& x, const QuantizedMatrix& w,
                                          std::span<const float> bias,
                                          const GemmOptions& options) {
  absl::StatusOr<PackedWeight> packed = PackedWeight::Pack(w);
  if (!packed.ok()) return packed.status();
  std::vector<float> y(x.rows * w.rows);
  absl::StatusOr<KernelInfo> info = Linear(x, *packed, bias, y, options);
  if (!info.ok()) return info.status();
  return y;
}

}  // namespace mx::kernels
