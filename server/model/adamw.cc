#include "server/model/adamw.h"

#include <cmath>

#include "absl/strings/str_cat.h"

// Built with -ffp-contract=off (CMakeLists.txt): every fused multiply-add below
// is an explicit std::fma, every other product rounds on its own, as in torch.

namespace mxserve {

absl::Status CheckAdamW(const AdamWParams& p, const char* prefix) {
  auto bad = [&](const char* field, double value, const char* expected) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, field, ": expected ", expected, ", got ", value));
  };
  if (!std::isfinite(p.lr) || p.lr < 0) return bad("lr", p.lr, "a finite value >= 0");
  if (!(p.beta1 >= 0 && p.beta1 < 1)) return bad("beta1", p.beta1, "0 <= beta1 < 1");
  if (!(p.beta2 >= 0 && p.beta2 < 1)) return bad("beta2", p.beta2, "0 <= beta2 < 1");
  if (!std::isfinite(p.eps) || p.eps <= 0) return bad("eps", p.eps, "a finite value > 0");
  if (!std::isfinite(p.weight_decay) || p.weight_decay < 0) {
    return bad("weight_decay", p.weight_decay, "a finite value >= 0");
  }
  return absl::OkStatus();
}

void AdamWStep(std::span<float> param, std::span<const float> grad, float grad_scale,
               std::span<float> exp_avg, std::span<float> exp_avg_sq, int64_t step,
               const AdamWParams& p) {
  const double t = static_cast<double>(step);
  const float decay = static_cast<float>(1.0 - p.lr * p.weight_decay);
  const float beta1 = static_cast<float>(p.beta1);
  const float one_minus_beta1 = static_cast<float>(1.0 - p.beta1);
  const float beta2 = static_cast<float>(p.beta2);
  const float one_minus_beta2 = static_cast<float>(1.0 - p.beta2);
  const double bias_correction1 = 1.0 - std::pow(p.beta1, t);
  const double bias_correction2 = 1.0 - std::pow(p.beta2, t);
  const float neg_step_size = static_cast<float>(-(p.lr / bias_correction1));
  const float bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
  const float eps = static_cast<float>(p.eps);
  for (size_t i = 0; i < param.size(); ++i) {
    const float g = grad[i] * grad_scale;
    const float m = std::fma(g, one_minus_beta1, exp_avg[i] * beta1);
    const float v = std::fma(g * one_minus_beta2, g, exp_avg_sq[i] * beta2);
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    const float denom = std::sqrt(v) / bias_correction2_sqrt + eps;
    param[i] = param[i] * decay + (neg_step_size * m) / denom;
  }
}

double SquaredNorm(std::span<const float> values) {
  double sum = 0;
  for (float v : values) sum += static_cast<double>(v) * v;
  return sum;
}

float ClipCoefficient(double squared_norm, double max_norm) {
  if (!(max_norm > 0)) return 1.0f;
  const float total = static_cast<float>(std::sqrt(squared_norm));
  const float coefficient = (1.0f / (total + static_cast<float>(1e-6))) * static_cast<float>(max_norm);
  return coefficient > 1.0f ? 1.0f : coefficient;  // NaN stays NaN, as torch.clamp keeps it
}

}  // namespace mxserve
