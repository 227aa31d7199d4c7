// Fuzz target: the policy JSON parser. What it accepts must survive a round
// trip (normalized JSON parses to the same normalized JSON) and resolve for any
// layer and phase.
#include <cstdint>
#include <cstdlib>

#include "absl/strings/string_view.h"
#include "server/policy/policy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view input(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<mxserve::Policy> policy = mxserve::ParsePolicyJson(input);
  if (!policy.ok()) {
    // Client text is cut in messages: a short answer whatever the input.
    if (policy.status().message().size() > 2048) std::abort();
    return 0;
  }
  const std::string json = mxserve::PolicyToJson(*policy);
  absl::StatusOr<mxserve::Policy> again = mxserve::ParsePolicyJson(json);
  if (!again.ok() || mxserve::PolicyToJson(*again) != json) std::abort();
  for (mxserve::Phase phase : mxserve::kAllPhases) {
    for (const char* layer : {"model.layers.0.self_attn.q_proj", "lm_head", "", "a.b.c"}) {
      // Both ends and the middle of a ranking, and a one-layer model.
      for (mxserve::LayerTolerance tolerance :
           {mxserve::LayerTolerance{0, 1}, mxserve::LayerTolerance{0, 29},
            mxserve::LayerTolerance{14, 29}, mxserve::LayerTolerance{28, 29}}) {
        const mxserve::ResolvedFormat resolved = mxserve::Resolve(*policy, phase, layer, tolerance);
        if (resolved.rule < -1 || resolved.rule >= static_cast<int>(policy->rules.size())) {
          std::abort();
        }
      }
    }
  }
  return 0;
}
