// The CPU emulation: mx/kernels at the best ISA level this CPU has (MX_ISA caps
// it), bit for bit the reference (BF16 × BF16 within the float bound unless
// --bf16-sums exact), split across a pool of --kernel-threads. A prepared weight
// is the kernels' packed panels.
#include <utility>

#include "mx/kernels/linear.h"
#include "server/compute/backends/backend.h"

namespace mxserve {
namespace {

class CpuWeight final : public PreparedWeight {
 public:
  explicit CpuWeight(mx::kernels::PackedWeight packed)
      : PreparedWeight(packed.format(), packed.rows(), packed.cols()), packed_(std::move(packed)) {}
  uint64_t bytes() const override { return packed_.bytes(); }
  const mx::kernels::PackedWeight& packed() const { return packed_; }

 private:
  const mx::kernels::PackedWeight packed_;
};

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const BackendOptions& options)
      : pool_(options.kernel_threads), exact_bf16_(options.exact_bf16) {}
  absl::string_view name() const override { return "cpu"; }

  absl::StatusOr<std::shared_ptr<const PreparedWeight>> PrepareWeight(
      mx::QuantizedMatrix w) override {
    absl::StatusOr<mx::kernels::PackedWeight> packed = mx::kernels::PackedWeight::Pack(w);
    if (!packed.ok()) return packed.status();
    return std::make_shared<const CpuWeight>(*std::move(packed));
  }

  absl::StatusOr<std::string> Linear(const mx::QuantizedMatrix& x, const PreparedWeight& w,
                                     std::span<const float> bias, std::span<float> y) override {
    absl::StatusOr<const CpuWeight*> own = Own<CpuWeight>(w, name());
    if (!own.ok()) return own.status();
    return Run(x, (*own)->packed(), bias, y);
  }

  absl::StatusOr<std::string> Linear(const mx::QuantizedMatrix& x, const mx::QuantizedMatrix& w,
                                     std::span<const float> bias, std::span<float> y) override {
    absl::StatusOr<mx::kernels::PackedWeight> packed = mx::kernels::PackedWeight::Pack(w);
    if (!packed.ok()) return packed.status();
    return Run(x, *packed, bias, y);
  }

 private:
  absl::StatusOr<std::string> Run(const mx::QuantizedMatrix& x, const mx::kernels::PackedWeight& w,
                                  std::span<const float> bias, std::span<float> y) {
    // mx::kernels::Linear checks every shape itself.
    absl::StatusOr<mx::kernels::KernelInfo> info =
        mx::kernels::Linear(x, w, bias, y, {.pool = &pool_, .exact_bf16 = exact_bf16_});
    if (!info.ok()) return info.status();
    return std::move(info->name);
  }

  mx::kernels::ThreadPool pool_;
  const bool exact_bf16_;
};

}  // namespace

std::unique_ptr<Backend> MakeCpuBackend(const BackendOptions& options) {
  return std::make_unique<CpuBackend>(options);
}

}  // namespace mxserve
