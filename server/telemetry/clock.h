// Wall-clock time as the energy ledger and the power series keep it, and
// steady-clock durations as the latency figures report them.
#pragma once

#include <chrono>

namespace mxserve {

// Unix time now, in seconds.
inline double UnixSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// A steady-clock duration in seconds.
inline double Seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

}  // namespace mxserve
