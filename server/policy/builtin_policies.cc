// The built-in presets of DESIGN.md, from the project's origin (ORIGIN.md's MX
// table). Layer classes select by the model's tolerance ranking
// (layer_sensitivity.h: a measured profile, else the built-in ranking): bare
// "@sensitive" is its least tolerant quarter. No preset runs any layer of any
// phase above FP16, so none costs more than fp16-baseline (the FPGA model's
// cost grows with precision; tests/server/profile/preset_energy_test.cc checks it).
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
       "rollout and reward: MXFP4 on tolerant layers, MXFP8 on sensitive ones (the least "
       "tolerant 25 %); update FP16",
       {F::kMxfp4E2m1, F::kMxfp4E2m1, F::kFp16},
       {{Phase::kRollout, "@sensitive", F::kMxfp8E4m3},
        {Phase::kReward, "@sensitive", F::kMxfp8E4m3}}},
      {"C-aggressive",
       "MXFP4 for rollout and reward; update MXFP8 on sensitive layers (the least tolerant "
       "25 %), MXFP4 rest",
       {F::kMxfp4E2m1, F::kMxfp4E2m1, F::kMxfp4E2m1},
       {{Phase::kUpdate, "@sensitive", F::kMxfp8E4m3}}},
      // "Mostly" is a share of layers ranked by tolerance (ORIGIN.md, "Two policy
      // families": 80 / 50 / 20 % of layers in low precision). Rollout and reward
      // run their 80 % most tolerant layers low and the rest one step more
      // precise; the update is FP16 but for its 20 % most tolerant layers. No
      // layer goes above FP16 (the old D ran sensitive layers in FP32 for the
      // update, above the FP16 baseline there).
      {"D-phase-adaptive",
       "rollout MXFP4 on the 80 % most tolerant layers, MXFP8 on the rest; reward MXFP8 on "
       "the 80 % most tolerant, FP16 on the rest; update FP16, MXFP8 on the 20 % most tolerant",
       {F::kMxfp8E4m3, F::kFp16, F::kFp16},
       {{Phase::kRollout, "@tolerant:0.8", F::kMxfp4E2m1},
        {Phase::kReward, "@tolerant:0.8", F::kMxfp8E4m3},
        {Phase::kUpdate, "@tolerant:0.2", F::kMxfp8E4m3}}},
      // B with NVIDIA's 4-bit format in place of MXFP4: the per-phase comparison
      // of the two 4-bit formats on the same layers (issue 34).
      {"NV-balanced",
       "B-balanced with NVFP4 for MXFP4: rollout and reward NVFP4 on tolerant layers, MXFP8 "
       "on sensitive ones (the least tolerant 25 %); update FP16",
       {F::kNvfp4, F::kNvfp4, F::kFp16},
       {{Phase::kRollout, "@sensitive", F::kMxfp8E4m3},
        {Phase::kReward, "@sensitive", F::kMxfp8E4m3}}},
  };
  return *policies;
}

absl::string_view CanonicalPolicyName(absl::string_view name) {
  // A built-in's short name is the part before its first '-': fp16, A, B, C, D, NV.
  for (const Policy& policy : BuiltinPolicies()) {
    const absl::string_view full = policy.name;
    if (name == full.substr(0, full.find('-'))) return full;
  }
  return name;
}

}  // namespace mxserve
