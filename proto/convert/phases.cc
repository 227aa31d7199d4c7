#include "proto/convert/phases.h"

#include "absl/strings/str_cat.h"

namespace mxserve {

std::string PhaseName(v1::Phase phase) {
  switch (phase) {
    case v1::PHASE_ROLLOUT:
      return "rollout";
    case v1::PHASE_REWARD:
      return "reward";
    case v1::PHASE_UPDATE:
      return "update";
    case v1::PHASE_UNSPECIFIED:
      return "unspecified";
    default:
      return absl::StrCat("phase#", static_cast<int>(phase));
  }
}

}  // namespace mxserve
