// The name of a wire phase as the daemon's metrics label it and people read it:
// "rollout", "reward", "update". Shared by the C++ client and the tests;
// tests/server/compute/wire_test.cc pins it to the daemon's own PhaseName.
#pragma once

#include <string>

#include "mxserve/v1/common.pb.h"

namespace mxserve {

// "unspecified" for PHASE_UNSPECIFIED, "phase#N" for a value outside the enum.
std::string PhaseName(v1::Phase phase);

}  // namespace mxserve
