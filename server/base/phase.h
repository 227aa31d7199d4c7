// RLHF phases as the server sees them.
#pragma once

#include <array>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "server/base/quote.h"

namespace mxserve {

enum class Phase { kRollout, kReward, kUpdate };
inline constexpr std::array<Phase, 3> kAllPhases = {Phase::kRollout, Phase::kReward,
                                                    Phase::kUpdate};

inline absl::string_view PhaseName(Phase phase) {
  switch (phase) {
    case Phase::kRollout:
      return "rollout";
    case Phase::kReward:
      return "reward";
    case Phase::kUpdate:
      return "update";
  }
  return "?";
}

// "rollout", "reward" or "update", case-insensitive.
inline absl::StatusOr<Phase> ParsePhase(absl::string_view name) {
  const std::string lower = absl::AsciiStrToLower(name);
  for (Phase phase : kAllPhases) {
    if (lower == PhaseName(phase)) return phase;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown phase ", Quote(name), "; expected rollout, reward or update"));
}

}  // namespace mxserve
