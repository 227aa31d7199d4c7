#include "server/rpc/call.h"

namespace mxserve {

CallInfo CallInfoOf(const grpc::CallbackServerContext* context, CancelFlag cancelled) {
  CallInfo call;
  call.cancelled = std::move(cancelled);
  const auto deadline = context->deadline();
  const auto system_now = std::chrono::system_clock::now();
  // gRPC reports "no deadline" as a time far in the future.
  if (deadline < system_now + std::chrono::hours(24 * 365)) {
    call.deadline =
        call.arrival + std::chrono::duration_cast<Clock::duration>(deadline - system_now);
  }
  return call;
}

CallRecord::CallRecord(const Core& core, Rpc rpc, grpc::CallbackServerContext* context)
    : core_(core),
      rpc_(rpc),
      context_(context),
      info_(CallInfoOf(context, std::make_shared<std::atomic<bool>>(false))) {
  core_.calls->Begin();
}

void CallRecord::Done() {
  // IsCancelled: the call failed before its status reached the client (the
  // client cancelled, its deadline passed, the connection broke), whatever the
  // daemon answered. When that happened at the deadline, the client saw
  // DEADLINE_EXCEEDED.
  absl::StatusCode seen = code_;
  if (context_->IsCancelled()) {
    seen = GaveUpCode(cancelled_at_.value_or(Clock::now()), info_.deadline);
  }
  core_.metrics->RecordStatus(rpc_, seen);
  core_.calls->End();
}

}  // namespace mxserve
