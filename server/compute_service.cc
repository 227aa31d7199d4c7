#include "server/compute_service.h"

#include <deque>
#include <memory>
#include <mutex>
#include <set>

#include "absl/strings/str_cat.h"
#include "server/compute_work.h"
#include "server/wire.h"

namespace mxserve {
namespace {

// Prepares and submits; any failure on the way answers the call at once.
template <typename Prepare>
void Submit(const Core& core, Done done, Prepare prepare) {
  absl::StatusOr<std::unique_ptr<WorkItem>> item = prepare(done);
  if (!item.ok()) return done(item.status());
  if (absl::Status s = core.scheduler->Submit(*std::move(item)); !s.ok()) done(s);
}

Done UnaryDone(const Core& core, grpc::ServerUnaryReactor* reactor, Rpc rpc) {
  core.calls->Begin();
  return [metrics = core.metrics, calls = core.calls, reactor, rpc](absl::Status status) {
    metrics->RecordStatus(rpc, status.code());
    reactor->Finish(ToGrpc(status));
    calls->End();
  };
}

// One Compute.Stream: requests are read one after another and each becomes its
// own work item; responses are written in the order they finish. The reactor
// finishes the stream once the client has half-closed and every request has been
// answered, so no work item outlives it.
class StreamReactor final : public grpc::ServerBidiReactor<v1::StreamRequest, v1::StreamResponse> {
 public:
  StreamReactor(const Core& core, grpc::CallbackServerContext* context)
      : core_(core), context_(context) {
    core_.calls->Begin();
    StartRead(&incoming_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // half-close, cancellation or a broken connection
      std::unique_lock lock(mu_);
      reads_done_ = true;
      FinishIfDone(lock);
      return;
    }
    auto request = std::make_shared<v1::StreamRequest>(std::move(incoming_));
    incoming_.Clear();
    Dispatch(std::move(request));
    StartRead(&incoming_);
  }

  void OnWriteDone(bool ok) override {
    std::unique_lock lock(mu_);
    outgoing_.pop_front();
    if (!ok) broken_ = true;
    if (!outgoing_.empty() && !broken_) {
      StartWrite(outgoing_.front().get());
    } else {
      writing_ = false;
      if (broken_) outgoing_.clear();
      FinishIfDone(lock);
    }
  }

  void OnCancel() override { cancelled_->store(true, std::memory_order_relaxed); }

  void OnDone() override {
    core_.calls->End();
    delete this;
  }

 private:
  void Dispatch(std::shared_ptr<v1::StreamRequest> request) {
    const uint64_t id = request->request_id();
    auto response = std::make_shared<v1::StreamResponse>();
    response->set_request_id(id);
    {
      std::unique_lock lock(mu_);
      ++pending_;
      if (!in_flight_.insert(id).second) {
        // Answer the duplicate without disturbing the request that owns the id.
        response->set_status_code(static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
        response->set_status_message(
            absl::StrCat("request_id: ", id, " is already in flight on this stream"));
        core_.metrics->RecordStatus(Rpc::kStream, absl::StatusCode::kInvalidArgument);
        QueueLocked(std::move(response), lock);
        return;
      }
    }
    const CallInfo call = CallInfo::From(context_, cancelled_);
    // The request and response live until `done` runs: the closure holds both.
    auto make_done = [this, request, response](Rpc op) {
      return Done([this, request, response, op](absl::Status status) {
        core_.metrics->RecordStatus(op, status.code());
        Answer(request->request_id(), response, status);
      });
    };
    switch (request->op_case()) {
      case v1::StreamRequest::kGemm:
        Submit(core_, make_done(Rpc::kGemm), [&](Done done) {
          return PrepareGemm(core_, request->gemm(), response->mutable_gemm(), call, done);
        });
        break;
      case v1::StreamRequest::kForward:
        Submit(core_, make_done(Rpc::kLayerForward), [&](Done done) {
          return PrepareForward(core_, request->forward(), response->mutable_forward(), call, done);
        });
        break;
      case v1::StreamRequest::kBackward:
        Submit(core_, make_done(Rpc::kLayerBackward), [&](Done done) {
          return PrepareBackward(core_, request->backward(), response->mutable_backward(), call,
                                 done);
        });
        break;
      default:
        make_done(Rpc::kStream)(
            absl::InvalidArgumentError("op: required; expected gemm, forward or backward"));
    }
  }

  void Answer(uint64_t id, std::shared_ptr<v1::StreamResponse> response, const absl::Status& status) {
    if (!status.ok()) {
      response->clear_result();
      response->set_status_code(static_cast<int>(status.code()));
      response->set_status_message(std::string(status.message()));
    }
    std::unique_lock lock(mu_);
    in_flight_.erase(id);
    QueueLocked(std::move(response), lock);
  }

  // One answer is ready: write it (or drop it on a broken stream).
  void QueueLocked(std::shared_ptr<v1::StreamResponse> response,
                   std::unique_lock<std::mutex>& lock) {
    --pending_;
    if (broken_) {
      FinishIfDone(lock);
      return;
    }
    outgoing_.push_back(std::move(response));
    if (!writing_) {
      writing_ = true;
      StartWrite(outgoing_.front().get());
    }
  }

  // Finishes the stream when nothing is left to read, compute or write. Finish is
  // called without the lock: its completion may run OnDone, which deletes `this`.
  void FinishIfDone(std::unique_lock<std::mutex>& lock) {
    if (!reads_done_ || pending_ != 0 || writing_ || finished_) return;
    finished_ = true;
    lock.unlock();
    core_.metrics->RecordStatus(Rpc::kStream, absl::StatusCode::kOk);
    Finish(grpc::Status::OK);
  }

  const Core& core_;
  grpc::CallbackServerContext* context_;
  CancelFlag cancelled_ = std::make_shared<std::atomic<bool>>(false);
  v1::StreamRequest incoming_;
  std::mutex mu_;
  std::deque<std::shared_ptr<v1::StreamResponse>> outgoing_;  // front is being written
  std::set<uint64_t> in_flight_;
  int pending_ = 0;  // requests read but not yet answered
  bool reads_done_ = false;
  bool writing_ = false;
  bool broken_ = false;
  bool finished_ = false;
};

}  // namespace

grpc::ServerUnaryReactor* ComputeService::Gemm(grpc::CallbackServerContext* context,
                                               const v1::GemmRequest* request,
                                               v1::GemmResponse* response) {
  auto* reactor = new CancellableReactor;
  Submit(core_, UnaryDone(core_, reactor, Rpc::kGemm), [&](Done done) {
    return PrepareGemm(core_, *request, response, CallInfo::From(context, reactor->cancelled()),
                       done);
  });
  return reactor;
}

grpc::ServerUnaryReactor* ComputeService::LayerForward(grpc::CallbackServerContext* context,
                                                       const v1::LayerForwardRequest* request,
                                                       v1::LayerForwardResponse* response) {
  auto* reactor = new CancellableReactor;
  Submit(core_, UnaryDone(core_, reactor, Rpc::kLayerForward), [&](Done done) {
    return PrepareForward(core_, *request, response,
                          CallInfo::From(context, reactor->cancelled()), done);
  });
  return reactor;
}

grpc::ServerUnaryReactor* ComputeService::LayerBackward(grpc::CallbackServerContext* context,
                                                        const v1::LayerBackwardRequest* request,
                                                        v1::LayerBackwardResponse* response) {
  auto* reactor = new CancellableReactor;
  Submit(core_, UnaryDone(core_, reactor, Rpc::kLayerBackward), [&](Done done) {
    return PrepareBackward(core_, *request, response,
                           CallInfo::From(context, reactor->cancelled()), done);
  });
  return reactor;
}

grpc::ServerBidiReactor<v1::StreamRequest, v1::StreamResponse>* ComputeService::Stream(
    grpc::CallbackServerContext* context) {
  return new StreamReactor(core_, context);
}

}  // namespace mxserve
