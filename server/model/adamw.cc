#include "server/model/adamw.h"

#include <cmath>

#include "absl/strings/str_cat.h"

// Built with -ffp-contract=off, -fno-math-errno and -O3 (CMakeLists.txt): every
// fused multiply-add below is an explicit std::fma, every other product rounds
// on its own, as in torch; the loop vectorizes (sqrt, division and fma are
// exact per lane).

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

namespace {

// The step's scalars, rounded to FP32 where torch rounds them.
struct StepScalars {
  float decay, beta1, one_minus_beta1, beta2, one_minus_beta2, neg_step_size,
      bias_correction2_sqrt, eps;
};

// The element loop, inlined into each instruction set's copy below. Vector
// lanes compute what the scalar code does (sqrt, division, fma are exact per
// lane), so every copy gives the same bits.
[[gnu::always_inline]] inline void StepLoop(float* param, const float* grad, float grad_scale,
                                            float* exp_avg, float* exp_avg_sq, size_t n,
                                            const StepScalars& s) {
  for (size_t i = 0; i < n; ++i) {
    const float g = grad[i] * grad_scale;
    const float m = std::fma(g, s.one_minus_beta1, exp_avg[i] * s.beta1);
    const float v = std::fma(g * s.one_minus_beta2, g, exp_avg_sq[i] * s.beta2);
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    const float denom = std::sqrt(v) / s.bias_correction2_sqrt + s.eps;
    param[i] = param[i] * s.decay + (s.neg_step_size * m) / denom;
  }
}

// Without FMA hardware std::fma is a library call per element: the portable
// copy is exact but slow, the x86-64 one (every CPU mxserve runs on has FMA)
// vectorizes.
void StepPortable(float* param, const float* grad, float grad_scale, float* exp_avg,
                  float* exp_avg_sq, size_t n, const StepScalars& s) {
  StepLoop(param, grad, grad_scale, exp_avg, exp_avg_sq, n, s);
}

#if defined(__x86_64__)
[[gnu::target("avx2,fma")]] void StepAvx2Fma(float* param, const float* grad, float grad_scale,
                                             float* exp_avg, float* exp_avg_sq, size_t n,
                                             const StepScalars& s) {
  StepLoop(param, grad, grad_scale, exp_avg, exp_avg_sq, n, s);
}
#endif

}  // namespace

void AdamWStep(std::span<float> param, std::span<const float> grad, float grad_scale,
               std::span<float> exp_avg, std::span<float> exp_avg_sq, int64_t step,
               const AdamWParams& p) {
  const double t = static_cast<double>(step);
  const double bias_correction1 = 1.0 - std::pow(p.beta1, t);
  const double bias_correction2 = 1.0 - std::pow(p.beta2, t);
  const StepScalars s{
      .decay = static_cast<float>(1.0 - p.lr * p.weight_decay),
      .beta1 = static_cast<float>(p.beta1),
      .one_minus_beta1 = static_cast<float>(1.0 - p.beta1),
      .beta2 = static_cast<float>(p.beta2),
      .one_minus_beta2 = static_cast<float>(1.0 - p.beta2),
      .neg_step_size = static_cast<float>(-(p.lr / bias_correction1)),
      .bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2)),
      .eps = static_cast<float>(p.eps),
  };
#if defined(__x86_64__)
  static const bool fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (fma) {
    return StepAvx2Fma(param.data(), grad.data(), grad_scale, exp_avg.data(), exp_avg_sq.data(),
                       param.size(), s);
  }
#endif
  StepPortable(param.data(), grad.data(), grad_scale, exp_avg.data(), exp_avg_sq.data(),
               param.size(), s);
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
