#include "server/backend.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "mx/reference_gemm.h"

namespace mxserve {
namespace {

absl::Status CheckShapes(const mx::QuantizedMatrix& x, const mx::QuantizedMatrix& w,
                         std::span<const float> bias, std::span<float> y) {
  if (x.cols != w.cols) {
    return absl::InternalError(absl::StrCat("backend: K mismatch ", x.cols, " vs ", w.cols));
  }
  if (!bias.empty() && static_cast<int64_t>(bias.size()) != w.rows) {
    return absl::InternalError("backend: bias size differs from N");
  }
  if (static_cast<int64_t>(y.size()) != x.rows * w.rows) {
    return absl::InternalError("backend: output size differs from M x N");
  }
  return absl::OkStatus();
}

// The CPU emulation. Today it runs the reference kernels of mx/ (the contract's
// definition); the vectorized kernels plug in here when they land.
class CpuBackend final : public Backend {
 public:
  absl::string_view name() const override { return "cpu"; }
  absl::Status Linear(const mx::QuantizedMatrix& x, const mx::QuantizedMatrix& w,
                      std::span<const float> bias, std::span<float> y) override {
    if (absl::Status s = CheckShapes(x, w, bias, y); !s.ok()) return s;
    absl::StatusOr<std::vector<float>> out = mx::ReferenceLinear(x, w, bias);
    if (!out.ok()) return out.status();
    std::copy(out->begin(), out->end(), y.begin());
    return absl::OkStatus();
  }
};

class NullBackend final : public Backend {
 public:
  absl::string_view name() const override { return "null"; }
  bool computes() const override { return false; }
  absl::Status Linear(const mx::QuantizedMatrix& x, const mx::QuantizedMatrix& w,
                      std::span<const float> bias, std::span<float> y) override {
    if (absl::Status s = CheckShapes(x, w, bias, y); !s.ok()) return s;
    std::fill(y.begin(), y.end(), 0.0f);
    return absl::OkStatus();
  }
};

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(absl::string_view name) {
  if (name == "cpu") return std::make_unique<CpuBackend>();
  if (name == "null") return std::make_unique<NullBackend>();
  return absl::InvalidArgumentError(
      absl::StrCat("--backend: unknown backend '", name, "'; expected one of ", kBackendNames));
}

}  // namespace mxserve
