// Fast Y = X·Wᵀ (+ bias) on the CPU, bit for bit the numerics contract.
//
//   mx::kernels::PackedWeight w = *PackedWeight::Pack(quantized_w);   // once
//   mx::kernels::ThreadPool pool(2);                                  // caller-owned
//   mx::kernels::Linear(quantized_x, w, bias, y, {.pool = &pool});     // per call
//
// MX formats (any pair), NVFP4 and INT8 give exactly the bits of
// mx::ReferenceLinear; so do FP16/FP32 (and pairs of different kinds), whose FMA
// chains keep the reference's order. BF16 × BF16 does below avx512; at avx512
// (with AVX512_BF16) and amx it sums pairs of products in its own order, within
// the float paths' bound of mx/README.md ("BF16 on pair instructions"). Operands that the fast
// kernels cannot take exactly — element codes that are Inf or NaN (only a client
// packing its own operand can send them), INT8 with K above 131071 — run the
// reference instead; the returned KernelInfo says so. MXFP8_E5M2 block pairs whose
// products span more than FP64 holds cost only the outputs they touch: those are
// computed again exactly (KernelInfo.name ends in "+exact_wide" when the call had
// blocks wide enough to look for them).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "mx/kernels/cpu_features.h"
#include "mx/kernels/thread_pool.h"
#include "mx/packed.h"

namespace mx::kernels {
namespace internal {
struct WeightPanels;
struct TileOverride;
}

// A weight (N×K, blocked along K) converted to the kernels' own layout. The
// conversion is part of registering a weight; it keeps no reference to the
// QuantizedMatrix it came from. Immutable once built, so shareable across threads.
class PackedWeight {
 public:
  // Packs `w` for its own format paired with itself (the daemon's case). Other
  // activation formats still work with it; pairs that need a different layout
  // convert a temporary copy per call. INVALID_ARGUMENT for a malformed layout.
  static absl::StatusOr<PackedWeight> Pack(const QuantizedMatrix& w);

  Format format() const;
  int64_t rows() const;  // N
  int64_t cols() const;  // K
  // Bytes it occupies (for memory accounting): the panels only, unless W held
  // Inf/NaN element codes, when the original is kept beside them.
  size_t bytes() const;
  // W in the exchange layout again, rebuilt from the panels (the reference
  // fallback and pairs that need another layout use it; both are rare).
  QuantizedMatrix Unpacked() const;
  const internal::WeightPanels& panels() const { return *panels_; }

 private:
  std::shared_ptr<const internal::WeightPanels> panels_;
  // Only for W with Inf/NaN element codes, which panels cannot represent.
  std::shared_ptr<const QuantizedMatrix> original_;
};

struct GemmOptions {
  // The level to run at; capped to what this machine has (Resolve()).
  Isa isa = DefaultIsa();
  // Threads to split M and N across (never K); nullptr runs on the caller only.
  ThreadPool* pool = nullptr;
  // BF16 × BF16 in the reference's order at every level (its bits, as the FPGA's
  // float path), never on the pair instructions ("BF16 on pair instructions",
  // mx/README.md): about 1.6× slower where those run, the same bits on every CPU.
  bool exact_bf16 = false;
};

// Which code computed a call: "<isa>/<kind>", e.g. "avx2/mx_i8", or
// "reference" when the call fell back to mx::ReferenceLinear, and why.
struct KernelInfo {
  std::string name;
  std::string fallback_reason;  // empty unless name == "reference"
};

// Y (x.rows × w.rows(), row-major, y.size() == x.rows · w.rows()) = X·Wᵀ + bias.
// x.cols == w.cols(); bias empty or w.rows() values. INVALID_ARGUMENT names the
// mismatched argument.
absl::StatusOr<KernelInfo> Linear(const QuantizedMatrix& x, const PackedWeight& w,
                                  std::span<const float> bias, std::span<float> y,
                                  const GemmOptions& options = {});

// The KernelInfo::name that Linear reports for operands in formats x and w with
// GemmOptions::isa = `isa`: "<level>/<kind>", the level being the best one at or
// below Resolve(isa) that has a kernel for the pair's kind (gemm_internal.h,
// kHasKernel). That is the name for ordinary operands; besides, a call whose
// scales the fast epilogue cannot take exactly runs a lower level (scalar in the
// end), Inf/NaN element codes or INT8 with K > 131071 run "reference", and a call
// with MXFP8_E5M2 blocks wide enough to look for pairs past FP64 adds
// "+exact_wide".
std::string KernelNameFor(Format x, Format w, Isa isa);

namespace internal {
// Linear with a test's tile kernels tried before the levels' own
// (gemm_internal.h); Linear is this with none.
absl::StatusOr<KernelInfo> LinearWith(const QuantizedMatrix& x, const PackedWeight& w,
                                      std::span<const float> bias, std::span<float> y,
                                      const GemmOptions& options, const TileOverride* tiles);
}  // namespace internal

// The same with W packed for this call only (tests, one-off GEMMs).
absl::StatusOr<std::vector<float>> Linear(const QuantizedMatrix& x, const QuantizedMatrix& w,
                                          std::span<const float> bias = {},
                                          const GemmOptions& options = {});

}  // namespace mx::kernels
