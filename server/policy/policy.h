// Policies: the format each (phase, layer) runs in when a request leaves it open.
//
// A policy is data. Its JSON form:
//   {"name": "B-balanced", "description": "...",
//    "defaults": {"rollout": "MXFP4", "reward": "MXFP4", "update": "FP16"},
//    "rules": [{"phase": "rollout", "layers": "@sensitive", "format": "MXFP8"}],
//    "scale_rules": {"update": "rceil"},   (optional; every phase floor without it)
//    "roundings": {"update": "stochastic"}} (optional; nearest_even without it)
// Rules are tried in order and the first match wins; no match means the phase's
// default. A rule's "phase" is a phase or "*"; its "layers" is a glob over layer
// names (server/policy/glob.h) or a layer class that selects by the model's
// tolerance ranking (layer_sensitivity.h; rank 0 = most tolerant, n layers):
//   "@tolerant:F"   the round(F·n) most tolerant layers, F in (0, 1]
//   "@sensitive:F"  the round(F·n) least tolerant layers, F in (0, 1]
//   "@sensitive"    = "@sensitive:0.25"
//   "@tolerant"     every layer "@sensitive" does not select (its exact complement)
// round() takes halves up (std::lround), as `fraction` generation does
// (server/profile/generate.h), so "@tolerant:0.8" is the layer set a generated
// 80 % policy would put low on the same ranking. "@tolerant:F" and
// "@sensitive:1-F" are counted independently: when F·n ends in .5 they overlap
// by one layer (first match wins).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "mx/format.h"
#include "mx/quantize.h"
#include "server/base/phase.h"

namespace mxserve {

inline constexpr absl::string_view kSensitiveLayers = "@sensitive";
inline constexpr absl::string_view kTolerantLayers = "@tolerant";
// The share of a model's layers bare "@sensitive" selects: the least tolerant
// quarter. The origin puts 20-50 % of layers in the precise format in its
// middle configurations; a quarter keeps B and C's "sensitive" set a minority
// (the LM head, then the first and last blocks' attention, on the built-in
// ranking) instead of most of a small model.
inline constexpr double kDefaultSensitiveFraction = 0.25;

// Where a layer stands in its model's tolerance ranking.
struct LayerTolerance {
  uint32_t rank = 0;    // 0: the model's most tolerant layer
  uint32_t layers = 1;  // how many layers the ranking has (every layer of the model)
};

// A parsed "@..." layer class: which end of the ranking, and how much of it.
struct LayerClass {
  bool tolerant = false;  // "@tolerant...", else "@sensitive..."
  double fraction = kDefaultSensitiveFraction;
  bool complement = false;  // bare "@tolerant": every layer bare "@sensitive" leaves
};

// Parses "@sensitive", "@tolerant", "@sensitive:F" or "@tolerant:F" (F a decimal
// such as 0.8 or .25 in (0, 1]); INVALID_ARGUMENT with the problem (no field
// name: the caller adds it).
absl::StatusOr<LayerClass> ParseLayerClass(absl::string_view text);

// How many layers of `layers` "@tolerant:F" / "@sensitive:F" select:
// round(F·layers), halves up, at most `layers`.
uint32_t SelectedLayers(double fraction, uint32_t layers);

// Whether `tolerance` falls in `layer_class`.
bool InLayerClass(const LayerClass& layer_class, LayerTolerance tolerance);

struct PolicyRule {
  std::optional<Phase> phase;  // nullopt: every phase ("*")
  std::string layers;          // a glob or a layer class ("@tolerant:0.8", ...)
  mx::Format format;
};

struct Policy {
  std::string name;
  std::string description;
  std::array<mx::Format, 3> defaults;  // indexed by Phase
  std::vector<PolicyRule> rules;
  // The MX scale rule, by phase, of the operands a request brings when it leaves
  // its scale_rule unspecified; the document's optional "scale_rules" object
  // ({"update": "rceil"}) names the phases that do not use floor.
  std::array<mx::ScaleRule, 3> scale_rules = {mx::ScaleRule::kFloor, mx::ScaleRule::kFloor,
                                              mx::ScaleRule::kFloor};
  // Likewise the rounding ("roundings": {"update": "stochastic"}), for a
  // request that sends none; nearest_even where the document names none.
  std::array<mx::Rounding, 3> roundings = {mx::Rounding::kNearestEven, mx::Rounding::kNearestEven,
                                           mx::Rounding::kNearestEven};
};

// Bounds on a policy document (server/README.md documents them): resolving
// runs every rule's glob against a layer name, so both stay small.
inline constexpr size_t kMaxPolicyBytes = 64 << 10;
inline constexpr size_t kMaxPolicyRules = 1024;
inline constexpr size_t kMaxPolicyGlobChars = 256;

// Parses and validates a policy document. Errors are INVALID_ARGUMENT and name the
// field: "policy.rules[1].format: unknown format 'MXFP5'; expected one of ...".
absl::StatusOr<Policy> ParsePolicyJson(absl::string_view json);

// The normalized document: canonical format names, every field present but
// "scale_rules" and "roundings", which name only the phases whose rule is not
// floor (rounding not nearest_even), absent when none is, so a document written
// before them reads the same.
std::string PolicyToJson(const Policy& policy);

struct ResolvedFormat {
  mx::Format format;
  int rule;  // index of the matching rule, -1 for the phase default
};

// The format `policy` gives `layer` in `phase`; `tolerance` is the layer's place
// in its model's ranking (for "@..." rules).
ResolvedFormat Resolve(const Policy& policy, Phase phase, absl::string_view layer,
                       LayerTolerance tolerance);

// The presets of DESIGN.md: fp16-baseline, A-conservative, B-balanced,
// C-aggressive, D-phase-adaptive.
const std::vector<Policy>& BuiltinPolicies();
inline constexpr absl::string_view kDefaultPolicy = "D-phase-adaptive";
// A built-in's full name for its short one (fp16, A, B, C, D); any other name as
// given. Every lookup by name goes through it, so the short names work wherever a
// policy is named, and models hold the full name.
absl::string_view CanonicalPolicyName(absl::string_view name);

}  // namespace mxserve
