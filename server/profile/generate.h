// Policies generated from a profile (DESIGN.md, "Profiles and generated
// policies"): per phase, which format each profiled layer runs in, written as an
// ordinary policy with one rule per layer that leaves the phase's default.
//
//   fraction   the given fraction of layers, most tolerant first by the chosen
//              score in `low`, in `low`; the rest in `high`: exactly
//              round(fraction · layers) low (ties: registration order)
//   budget     least summed score with summed cost ≤ budget, over the candidate
//              formats, layer groups sharing a format: a multiple-choice knapsack
//              solved exactly (knapsack.h)
//   tolerance  least summed cost with summed score ≤ the bound, the same way
//
// Costs are per token of the phase from the profile's FPGA-model columns: the
// forward GEMM for rollout and reward, forward and backward for update; or the
// bits the weights take. Phases not generated, and layers the profile does not
// cover, run in `high`.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "fpga/model/energy_model.h"
#include "mx/format.h"
#include "server/base/phase.h"
#include "server/policy/policy.h"
#include "server/profile/profile.h"

namespace mxserve {

// Each with every value and its name, the wire's name of it (rpc/profile_wire.h
// ties them to mxserve.v1's GenerationKind, Score and CostMetric by it).
enum class GenerationKind { kFraction, kBudget, kTolerance };
enum class ScoreKind { kAuto, kRelError, kFisher, kMse };
enum class CostMetric { kEnergy, kTime, kBits };
inline constexpr GenerationKind kAllGenerationKinds[] = {
    GenerationKind::kFraction, GenerationKind::kBudget, GenerationKind::kTolerance};
inline constexpr ScoreKind kAllScoreKinds[] = {ScoreKind::kAuto, ScoreKind::kRelError,
                                               ScoreKind::kFisher, ScoreKind::kMse};
inline constexpr CostMetric kAllCostMetrics[] = {CostMetric::kEnergy, CostMetric::kTime,
                                                 CostMetric::kBits};
// "fraction", "budget", "tolerance".
const char* KindName(GenerationKind kind);
// "auto", "rel_error", "fisher", "mse".
const char* ScoreName(ScoreKind score);
// "energy", "time", "bits".
const char* MetricName(CostMetric metric);

// At most this many group globs in one request.
inline constexpr size_t kMaxGenerationGroups = 64;

struct GenerationSpec {
  // A per-phase value (fraction, budget or bound); `field` names it in errors,
  // e.g. "fractions[1]". No phase: every generated phase.
  struct Value {
    std::optional<Phase> phase;
    double value = 0;
    std::string field;
  };

  std::string name;
  std::string description;  // put before the generated description
  GenerationKind kind = GenerationKind::kFraction;
  std::vector<Phase> phases;  // empty: the phases the values name, or all three
  ScoreKind score = ScoreKind::kAuto;
  std::vector<Value> values;
  bool relative = false;                   // budget: values are fractions of the all-`high` cost
  std::string values_field = "fractions";  // the field the values came in, for errors
  std::optional<mx::Format> low;           // fraction only
  mx::Format high = mx::Format::kFp16;
  std::vector<mx::Format> candidates;  // budget, tolerance; empty: the profile's formats
  CostMetric metric = CostMetric::kEnergy;
  // Each entry: globs separated by '|'. Layers one entry matches within one
  // block (BlockIndex) share a format. Budget and tolerance only.
  std::vector<std::string> groups;
};

struct PhasePlan {
  Phase phase = Phase::kRollout;
  bool generated = false;
  std::vector<mx::Format> formats;  // per profiled layer
  uint32_t low_layers = 0;          // fraction: layers in `low`
  double score = 0;                 // Σ the chosen score over profiled layers
  double joules_per_token = 0;
  double seconds_per_token = 0;
  double weight_bits = 0;
  double fp16_joules_per_token = 0;  // every profiled layer in FP16
  double fp16_seconds_per_token = 0;
  double budget = 0;  // budget and tolerance: the bound used
};

struct GeneratedPolicy {
  Policy policy;
  std::array<PhasePlan, 3> phases;  // indexed by Phase
};

// The profile's layers (indices into profile.layers), most tolerant first:
// ascending `score` (kAuto: Fisher for a gradients profile, else rel_error) in
// the profile's format `format` (an index into profile.formats), ties in
// registration order, a score that is not a number counted least tolerant.
// `fraction` generation puts the first round(fraction · layers) in `low`.
std::vector<int> ToleranceOrder(const Profile& profile, int format, ScoreKind score);

// The measured order a profile gives its model's tolerance ranking (policy
// rules "@tolerant:F" / "@sensitive:F", Registry::SetToleranceOrder): layer
// names by ToleranceOrder with score kAuto in MXFP4 E2M1, the format the
// presets run their tolerant layers in and where layers' errors differ most;
// when the profile lacks it, in its format of fewest element bits. Empty for a
// profile without formats or layers.
std::vector<std::string> ProfileToleranceOrder(const Profile& profile);

// INVALID_ARGUMENT naming the request field for a bad spec or an infeasible
// budget or bound (with the cheapest feasible budget, the least achievable
// bound); FAILED_PRECONDITION for a score the profile lacks. `model_layers`:
// every layer of the model now, to decide whether a phase's default can be
// anything but `high`.
absl::StatusOr<GeneratedPolicy> GeneratePolicy(const Profile& profile,
                                               const std::vector<std::string>& model_layers,
                                               const fpga_model::EnergyModelParams& energy,
                                               const GenerationSpec& spec);

}  // namespace mxserve
