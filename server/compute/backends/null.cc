// No arithmetic: zeros of the right shape, so the daemon's own overhead can be
// measured apart from the arithmetic. A prepared weight is only its shape.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "server/compute/backends/backend.h"

namespace mxserve {
namespace {

class ShapeOnly final : public PreparedWeight {
 public:
  using PreparedWeight::PreparedWeight;
  uint64_t bytes() const override { return 0; }
};

class NullBackend final : public Backend {
 public:
  absl::string_view name() const override { return "null"; }
  bool BooksModelEnergy() const override { return false; }
  bool computes() const override { return false; }

  absl::StatusOr<std::shared_ptr<const PreparedWeight>> PrepareWeight(
      mx::QuantizedMatrix w) override {
    return std::make_shared<const ShapeOnly>(w.format, w.rows, w.cols);
  }
  absl::StatusOr<std::string> Linear(const mx::QuantizedMatrix& x, const PreparedWeight& w,
                                     std::span<const float> bias, std::span<float> y) override {
    return Zeros(x, w.rows(), w.cols(), bias, y);
  }
  absl::StatusOr<std::string> Linear(const mx::QuantizedMatrix& x, const mx::QuantizedMatrix& w,
                                     std::span<const float> bias, std::span<float> y) override {
    return Zeros(x, w.rows, w.cols, bias, y);
  }

 private:
  // The null backend's own shape check (the others' kernels check for themselves).
  static absl::StatusOr<std::string> Zeros(const mx::QuantizedMatrix& x, int64_t n, int64_t k,
                                           std::span<const float> bias, std::span<float> y) {
    if (x.cols != k) {
      return absl::InternalError(absl::StrCat("backend: K mismatch ", x.cols, " vs ", k));
    }
    if (!bias.empty() && static_cast<int64_t>(bias.size()) != n) {
      return absl::InternalError("backend: bias size differs from N");
    }
    if (static_cast<int64_t>(y.size()) != x.rows * n) {
      return absl::InternalError("backend: output size differs from M x N");
    }
    std::fill(y.begin(), y.end(), 0.0f);
    return std::string();
  }
};

}  // namespace

std::unique_ptr<Backend> MakeNullBackend() { return std::make_unique<NullBackend>(); }

}  // namespace mxserve
