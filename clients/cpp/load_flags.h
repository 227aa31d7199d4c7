// The flags of a load run, parsed one way for both load generators (mxctl bench
// and bench/bare_client), so their figures are comparable by construction:
// --m --k --n (required), --concurrency (1), --duration (10s), --warmup (1s).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "clients/cpp/flags.h"
#include "clients/cpp/load_generator.h"

namespace mxctl {

// `own` plus the flag names ParseLoadFlags reads, for Flags::Parse.
inline std::vector<std::string> WithLoadFlags(std::vector<std::string> own) {
  own.insert(own.end(), {"m", "k", "n", "concurrency", "duration", "warmup"});
  return own;
}

struct LoadRun {
  int64_t m = 0, k = 0, n = 0;  // X is M×K, W is N×K
  mxclient::LoadOptions load;   // concurrency, duration, warmup, 2·M·N·K FLOPs per request
};

absl::StatusOr<LoadRun> ParseLoadFlags(const Flags& flags);

}  // namespace mxctl
