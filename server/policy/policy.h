// Policies: the format each (phase, layer) runs in when a request leaves it open.
//
// A policy is data. Its JSON form:
//   {"name": "B-balanced", "description": "...",
//    "defaults": {"rollout": "MXFP4", "reward": "MXFP4", "update": "FP16"},
//    "rules": [{"phase": "rollout", "layers": "@sensitive", "format": "MXFP8"}]}
// Rules are tried in order and the first match wins; no match means the phase's
// default. A rule's "phase" is a phase or "*"; its "layers" is a glob over layer
// names (server/policy/glob.h) or "@sensitive" / "@tolerant".
#pragma once

#include <array>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "mx/format.h"
#include "server/base/phase.h"

namespace mxserve {

inline constexpr absl::string_view kSensitiveLayers = "@sensitive";
inline constexpr absl::string_view kTolerantLayers = "@tolerant";

struct PolicyRule {
  std::optional<Phase> phase;  // nullopt: every phase ("*")
  std::string layers;          // a glob, "@sensitive" or "@tolerant"
  mx::Format format;
};

struct Policy {
  std::string name;
  std::string description;
  std::array<mx::Format, 3> defaults;  // indexed by Phase
  std::vector<PolicyRule> rules;
};

// Bounds on a policy document (server/README.md documents them): resolving
// runs every rule's glob against a layer name, so both stay small.
inline constexpr size_t kMaxPolicyBytes = 64 << 10;
inline constexpr size_t kMaxPolicyRules = 1024;
inline constexpr size_t kMaxPolicyGlobChars = 256;

// Parses and validates a policy document. Errors are INVALID_ARGUMENT and name the
// field: "policy.rules[1].format: unknown format 'MXFP5'; expected one of ...".
absl::StatusOr<Policy> ParsePolicyJson(absl::string_view json);

// The normalized document: canonical format names, every field present.
std::string PolicyToJson(const Policy& policy);

struct ResolvedFormat {
  mx::Format format;
  int rule;  // index of the matching rule, -1 for the phase default
};

// The format `policy` gives `layer` in `phase`; `sensitive` says whether the layer
// counts as sensitive (for "@sensitive"/"@tolerant" rules).
ResolvedFormat Resolve(const Policy& policy, Phase phase, absl::string_view layer, bool sensitive);

// The presets of DESIGN.md: fp16-baseline, A-conservative, B-balanced,
// C-aggressive, D-phase-adaptive.
const std::vector<Policy>& BuiltinPolicies();
inline constexpr absl::string_view kDefaultPolicy = "D-phase-adaptive";
// A built-in's full name for its short one (fp16, A, B, C, D); any other name as
// given. Every lookup by name goes through it, so the short names work wherever a
// policy is named, and models hold the full name.
absl::string_view CanonicalPolicyName(absl::string_view name);

}  // namespace mxserve
