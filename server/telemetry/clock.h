// Wall-clock time as the energy ledger and the power series keep it.
#pragma once

#include <chrono>

namespace mxserve {

// Unix time now, in seconds.
inline double UnixSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace mxserve
