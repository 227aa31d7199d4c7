#include "server/core.h"

namespace mxserve {

double UnixSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

CallInfo CallInfo::From(const grpc::CallbackServerContext* context, CancelFlag cancelled) {
  CallInfo call;
  call.cancelled = std::move(cancelled);
  const auto deadline = context->deadline();
  const auto system_now = std::chrono::system_clock::now();
  // gRPC reports "no deadline" as a time far in the future.
  if (deadline < system_now + std::chrono::hours(24 * 365)) {
    call.deadline = call.arrival + std::chrono::duration_cast<Clock::duration>(deadline - system_now);
  }
  return call;
}

}  // namespace mxserve
