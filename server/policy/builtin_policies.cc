// The built-in presets of DESIGN.md, from the project's origin. "Sensitive" layers
// are the ones server/policy/layer_sensitivity.h (or a measured profile) marks.
#include "server/policy/policy.h"

namespace mxserve {

const std::vector<Policy>& BuiltinPolicies() {
  using F = mx::Format;
  static const auto* policies = new std::vector<Policy>{
      {"fp16-baseline",
       "FP16 everywhere: the uniform baseline every saving is measured against",
       {F::kFp16, F::kFp16, F::kFp16},
       {}},
      {"A-conservative",
       "MXFP8 for rollout and reward on all layers, FP16 for the update",
       {F::kMxfp8E4m3, F::kMxfp8E4m3, F::kFp16},
       {}},
      {"B-balanced",
       "rollout and reward: MXFP4 on tolerant layers, MXFP8 on sensitive ones; update FP16",
       {F::kMxfp4E2m1, F::kMxfp4E2m1, F::kFp16},
       {{Phase::kRollout, "@sensitive", F::kMxfp8E4m3},
        {Phase::kReward, "@sensitive", F::kMxfp8E4m3}}},
      {"C-aggressive",
       "MXFP4 for rollout and reward; update MXFP8 on sensitive layers, MXFP4 rest",
       {F::kMxfp4E2m1, F::kMxfp4E2m1, F::kMxfp4E2m1},
       {{Phase::kUpdate, "@sensitive", F::kMxfp8E4m3}}},
      // "Most layers": in each phase the sensitive layers run one step more precise.
      {"D-phase-adaptive",
       "rollout MXFP4, reward MXFP8, update FP16 on most layers; sensitive layers one step "
       "more precise (MXFP8, FP16, FP32)",
       {F::kMxfp4E2m1, F::kMxfp8E4m3, F::kFp16},
       {{Phase::kRollout, "@sensitive", F::kMxfp8E4m3},
        {Phase::kReward, "@sensitive", F::kFp16},
        {Phase::kUpdate, "@sensitive", F::kFp32}}},
  };
  return *policies;
}

absl::string_view CanonicalPolicyName(absl::string_view name) {
  // A built-in's short name is the part before its first '-': fp16, A, B, C, D.
  for (const Policy& policy : BuiltinPolicies()) {
    const absl::string_view full = policy.name;
    if (name == full.substr(0, full.find('-'))) return full;
  }
  return name;
}

}  // namespace mxserve
