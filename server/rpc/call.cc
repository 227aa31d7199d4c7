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
      info_(CallInfoOf(context, std::make_shared<std::atomic<bool>>(false))),
      principal_(AnonymousPrincipal()) {
  core_.calls->Begin();
  if (core_.access == nullptr) return;
  absl::StatusOr<Principal> who = core_.access->Admit(rpc, *context);
  if (!who.ok()) {
    admission_ = who.status();
    return;
  }
  principal_ = *std::move(who);
  admission_ = core_.access->BeginCall(principal_);
  counted_ = admission_.ok();
}

absl::Status CallRecord::CheckOwner(absl::string_view owner, absl::string_view what) const {
  if (core_.access == nullptr) return absl::OkStatus();
  return core_.access->CheckOwner(rpc_, principal_, owner, what);
}

absl::Status CallRecord::CheckModelOwner(absl::string_view model) const {
  if (core_.access == nullptr || principal_.role == Role::kAdmin) return absl::OkStatus();
  absl::StatusOr<std::string> owner = core_.registry->Owner(model);
  if (!owner.ok()) return absl::OkStatus();
  return CheckOwner(*owner, absl::StrCat("model ", Quote(model)));
}

absl::Status CallRecord::MayChangePolicy(const StoredPolicy& existing) const {
  return CheckOwner(existing.owner, absl::StrCat("policy ", Quote(existing.policy->name)));
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
  EndInflight();  // a call that ended without an answer (cancelled)
  core_.calls->End();
}

void CallRecord::EndInflight() {
  if (!counted_.exchange(false)) return;
  core_.access->EndCall(principal_);
}

}  // namespace mxserve
