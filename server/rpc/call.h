// The ends of every RPC the daemon serves, in one place.
//
// Services take their messages as raw bytes (gRPC's "raw callback" methods) and
// parse them here, so a message that is not a valid mxserve.v1 message gets
// INVALID_ARGUMENT naming it. (With generated message types, gRPC answers an
// unparseable unary request with a bare UNIMPLEMENTED, and ends a client stream
// at an unparseable message as if the client had half-closed: a corrupt upload
// chunk would then stage the chunks before it.)
//
// Every call is counted from its start until gRPC's OnDone, when its status and
// response have left the daemon or it was cancelled; shutdown waits for that, not
// merely for Finish(), so a fused batch's large responses are still being sent
// when the connections close. OnDone also records the status the client saw:
// a call answered OK after its deadline passed reached the client as
// DEADLINE_EXCEEDED, and is counted so.
//
// Every call is also admitted here, before any message of it is parsed: its
// caller identified and its role checked against the RPC's (access.h), and
// counted against --quota-inflight. A call refused there is answered with the
// refusal and does nothing else.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/server_callback.h"
#include "grpcpp/support/status.h"
#include "server/base/quote.h"
#include "server/rpc/core.h"

namespace mxserve {

// Counts the calls that have work outstanding, so shutdown can wait for them
// and then close every connection at once instead of waiting out the grace
// period for clients that keep their channel open.
class CallTracker {
 public:
  void Begin() {
    std::lock_guard lock(mu_);
    ++active_;
  }
  void End() {
    std::lock_guard lock(mu_);
    --active_;
    idle_.notify_all();
  }
  // True when every call ended before `deadline`.
  bool WaitIdle(std::chrono::steady_clock::time_point deadline) { return WaitAtMost(0, deadline); }
  // True when at most `calls` are open before `deadline`.
  bool WaitAtMost(int64_t calls, std::chrono::steady_clock::time_point deadline) {
    std::unique_lock lock(mu_);
    return idle_.wait_until(lock, deadline, [&] { return active_ <= calls; });
  }
  int64_t active() {
    std::lock_guard lock(mu_);
    return active_;
  }

 private:
  std::mutex mu_;
  std::condition_variable idle_;
  int64_t active_ = 0;
};

// absl and gRPC share the canonical status codes. Messages are capped
// (CapMessage): client text in them is already cut, this bounds the rest.
inline grpc::Status ToGrpc(const absl::Status& status) {
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), CapMessage(status.message()));
}

// Parses `buffer` into `message`. INVALID_ARGUMENT naming `what` (e.g.
// "request" or "chunks[3]") and the expected message type when it is not one.
template <typename Message>
absl::Status ParseMessage(const grpc::ByteBuffer& buffer, Message* message,
                          absl::string_view what) {
  grpc::ByteBuffer copy(buffer);  // shares the slices; Deserialize consumes it
  if (grpc::SerializationTraits<Message>::Deserialize(&copy, message).ok()) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(what, ": not a valid ",
                                                 Message::descriptor()->full_name(),
                                                 " message (protobuf parsing failed)"));
}

// Serializes `message` into `buffer`; false only if protobuf refuses (a message
// over 2 GiB, which --max-message-bytes rules out).
template <typename Message>
bool SerializeMessage(const Message& message, grpc::ByteBuffer* buffer) {
  bool own_buffer = false;
  return grpc::SerializationTraits<Message>::Serialize(message, buffer, &own_buffer).ok();
}

// The call's arrival, its deadline as gRPC reports it (none when gRPC gives a
// time more than a year away), and `cancelled`.
CallInfo CallInfoOf(const grpc::CallbackServerContext* context, CancelFlag cancelled);

// The bookkeeping every reactor shares: counted as open from construction until
// Done() (called from OnDone), and its status recorded there as the client saw it.
// Against --quota-inflight a call counts from admission until it is answered
// (Settle or SetStatus, before Finish), not until OnDone: gRPC may run OnDone a
// moment after the client has its status, and a client calling one RPC after
// another must not find its previous call still counted. A call its client gave
// up on (OnCancel) stops counting then, though its computation may run on.
class CallRecord {
 public:
  CallRecord(const Core& core, Rpc rpc, grpc::CallbackServerContext* context);
  CallRecord(const CallRecord&) = delete;
  CallRecord& operator=(const CallRecord&) = delete;

  // The status a reactor finishes with: `status`, or INTERNAL if the response
  // of an OK answer cannot be serialized into `raw`; recorded as what the
  // daemon answered. Every reactor's Finish goes through this.
  template <typename Message>
  absl::Status Settle(absl::Status status, const Message& response, grpc::ByteBuffer* raw) {
    if (status.ok() && !SerializeMessage(response, raw)) {
      status = absl::InternalError("the response could not be serialized");
    }
    code_ = status.code();
    EndInflight();
    return status;
  }
  // The same for a stream whose answers went out as it ran (no final message).
  void SetStatus(absl::StatusCode code) {
    code_ = code;
    EndInflight();
  }
  // From OnDone: records the status by what reached the client and ends the
  // call's count.
  void Done();

  const CallInfo& info() const { return info_; }
  // OK, or why the caller may not make this call (UNAUTHENTICATED,
  // PERMISSION_DENIED, RESOURCE_EXHAUSTED): answer it and do nothing else.
  const absl::Status& admission() const { return admission_; }
  // The caller ("anonymous" without --auth-tokens).
  const Principal& principal() const { return principal_; }
  // Below admin, for an RPC that changes an owned thing: PERMISSION_DENIED
  // unless the caller is `owner`; `what` names it ("model 'm'").
  absl::Status CheckOwner(absl::string_view owner, absl::string_view what) const;
  // CheckOwner for the registered model `model`; OK when there is none (the
  // handler reports that).
  absl::Status CheckModelOwner(absl::string_view model) const;
  // CheckOwner for a stored policy a Put or Delete would replace or remove.
  absl::Status MayChangePolicy(const StoredPolicy& existing) const;
  // For OnCancel: the client gave up now. Its --quota-inflight slot frees at
  // once: the client waits for nothing more, though a computation already
  // running goes on until it ends.
  void MarkCancelled() {
    cancelled_at_ = Clock::now();
    info_.cancelled->store(true, std::memory_order_relaxed);
    EndInflight();
  }

 private:
  // Stops counting the call against --quota-inflight (once).
  void EndInflight();

  const Core& core_;
  const Rpc rpc_;
  grpc::CallbackServerContext* const context_;
  CallInfo info_;
  Principal principal_;
  absl::Status admission_;
  // Against --quota-inflight, until answered, cancelled or Done(): the first of
  // them (a worker's answer and gRPC's OnCancel may race) ends the count.
  std::atomic<bool> counted_ = false;
  absl::StatusCode code_ = absl::StatusCode::kUnknown;
  std::optional<Clock::time_point> cancelled_at_;  // set in OnCancel, read in OnDone
};

// One unary call: owns its request and response, parses the one and serializes
// the other, and answers exactly once.
template <typename Request, typename Response>
class UnaryCall final : public grpc::ServerUnaryReactor {
 public:
  // Admits the call, parses the request and runs `handler(call)` on it, or
  // answers the refusal or INVALID_ARGUMENT. The reactor deletes itself in OnDone.
  template <typename Handler>
  static grpc::ServerUnaryReactor* Start(const Core& core, Rpc rpc,
                                         grpc::CallbackServerContext* context,
                                         const grpc::ByteBuffer* raw_request,
                                         grpc::ByteBuffer* raw_response, Handler&& handler) {
    auto* call = new UnaryCall(core, rpc, context, raw_response);
    if (!call->record_.admission().ok()) {
      call->Answer(call->record_.admission());
    } else if (absl::Status s = ParseMessage(*raw_request, &call->request_, "request"); !s.ok()) {
      call->Answer(s);
    } else {
      handler(*call);
    }
    return call;
  }

  const Request& request() const { return request_; }
  Response* response() { return &response_; }
  const CallInfo& info() const { return record_.info(); }
  const CallRecord& record() const { return record_; }

  // Answers the call: the response when `status` is OK, else the error.
  void Answer(const absl::Status& status) {
    Finish(ToGrpc(record_.Settle(status, response_, raw_response_)));
  }
  // Answer() as a callable that may outlive the handler (work items hold it).
  Done Answerer() {
    return [this](absl::Status status) { Answer(status); };
  }

  void OnCancel() override { record_.MarkCancelled(); }
  void OnDone() override {
    record_.Done();
    delete this;
  }

 private:
  UnaryCall(const Core& core, Rpc rpc, grpc::CallbackServerContext* context,
            grpc::ByteBuffer* raw_response)
      : record_(core, rpc, context), raw_response_(raw_response) {}

  CallRecord record_;
  grpc::ByteBuffer* raw_response_;
  Request request_;
  Response response_;
};

// A worker-thread job: any function run once, failing cleanly when dropped
// (queue full, shutdown, the call cancelled or past its deadline).
class FunctionItem final : public WorkItem {
 public:
  FunctionItem(CallInfo call, std::function<void()> run, std::function<void(absl::Status)> fail)
      : call_(std::move(call)), run_(std::move(run)), fail_(std::move(fail)) {
    arrival = call_.arrival;
    deadline = call_.deadline;
  }
  void Run() override { run_(); }
  void Fail(absl::Status status) override { fail_(std::move(status)); }
  bool Cancelled() const override { return call_.Cancelled(); }

 private:
  CallInfo call_;
  std::function<void()> run_;
  std::function<void(absl::Status)> fail_;
};

// Submits `run` to `queue` (the loader pool, the profiler); `fail` answers when
// it cannot run.
inline void RunOn(Scheduler& queue, CallInfo call, std::function<void()> run,
                  std::function<void(absl::Status)> fail) {
  auto item = std::make_unique<FunctionItem>(std::move(call), std::move(run), fail);
  if (absl::Status s = queue.Submit(std::move(item)); !s.ok()) fail(s);
}

// A unary call answered on gRPC's thread by `body(request, response)`, or
// `body(request, response, record)` for a body that needs the caller.
template <typename Request, typename Response, typename Body>
grpc::ServerUnaryReactor* ServeNow(const Core& core, Rpc rpc, grpc::CallbackServerContext* context,
                                   const grpc::ByteBuffer* request, grpc::ByteBuffer* response,
                                   Body body) {
  using Call = UnaryCall<Request, Response>;
  return Call::Start(core, rpc, context, request, response, [&](Call& call) {
    if constexpr (std::is_invocable_v<Body, const Request&, Response*, const CallRecord&>) {
      call.Answer(body(call.request(), call.response(), call.record()));
    } else {
      call.Answer(body(call.request(), call.response()));
    }
  });
}

}  // namespace mxserve
