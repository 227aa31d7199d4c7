// AdamW as torch.optim.AdamW steps it, bit for bit, for the daemon's optimizer
// (Models.StepOptimizer, optimizer.h).
//
// torch's default CPU AdamW (foreach off, amsgrad off, its kernels vectorized
// with FMA: every x86-64 CPU mxserve supports) does, per element, in FP32 with
// the Python scalars rounded to FP32 where they meet a tensor:
//
//   p  = p · f(1 - lr·wd)
//   m  = fma(g, f(1 - β1), m · f(β1))
//   v  = fma(g · f(1 - β2), g, v · f(β2))
//   p  = p + (f(-lr / (1 - β1^t)) · m) / (sqrt(v) / f(sqrt(1 - β2^t)) + f(eps))
//
// (f: round to FP32; the scalars inside f are worked out in double, as Python
// does). This file does exactly that, with std::fma and the file built without
// FP contraction, so the daemon's step is the trainer's step: the test
// (tests/server/model/adamw_test.cc) holds known answers from torch 1.13, and
// clients/python/tests/test_remote_optimizer.py compares against the torch the
// trainer runs.
//
// Global gradient-norm clipping follows torch.nn.utils.clip_grad_norm_: the
// total norm in FP32, coefficient = (1 / (total + 1e-6)) · max_norm, at most 1,
// every gradient multiplied by it (by 1 when not clipping: exact). The total
// norm itself is summed in FP64 here, in torch per tensor in FP32: the two agree
// to FP32 reordering, not bit for bit (say so where a test compares them).
#pragma once

#include <cstdint>
#include <span>

#include "absl/status/status.h"

namespace mxserve {

struct AdamWParams {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
};

// INVALID_ARGUMENT naming the field (`prefix` + "lr", ...) unless lr >= 0,
// 0 <= beta < 1, eps > 0, weight_decay >= 0, all finite: what torch accepts,
// less eps = 0 (a zero second moment would divide by zero).
absl::Status CheckAdamW(const AdamWParams& params, const char* prefix);

// One AdamW step of `param` (updated in place) with gradient `grad` times
// `grad_scale` (the clipping coefficient; 1 for none), moments `exp_avg` and
// `exp_avg_sq` (in place) and `step`, the step count after this step (1 on the
// first). All spans have one length.
void AdamWStep(std::span<float> param, std::span<const float> grad, float grad_scale,
               std::span<float> exp_avg, std::span<float> exp_avg_sq, int64_t step,
               const AdamWParams& params);

// Σ g², in FP64.
double SquaredNorm(std::span<const float> values);

// clip_grad_norm_'s coefficient for a total norm of sqrt(squared_norm):
// min(1, (1 / (f(total) + f(1e-6))) · f(max_norm)) in FP32. max_norm <= 0: 1
// (no clipping).
float ClipCoefficient(double squared_norm, double max_norm);

}  // namespace mxserve
