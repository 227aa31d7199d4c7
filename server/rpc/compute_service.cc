#include "server/rpc/compute_service.h"

#include <deque>
#include <memory>
#include <mutex>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "mx/checked_math.h"
#include "server/compute/compute_work.h"
#include "server/compute/wire.h"
#include "server/base/quote.h"
#include "server/rpc/call.h"

namespace mxserve {
namespace {

// Prepares and submits; any failure on the way answers the call at once.
template <typename Prepare>
void Submit(const Core& core, Done done, Prepare prepare) {
  absl::StatusOr<std::unique_ptr<WorkItem>> item = prepare(done);
  if (!item.ok()) return done(item.status());
  if (absl::Status s = core.scheduler->Submit(*std::move(item)); !s.ok()) done(s);
}

// One Compute.Stream: requests are read one after another and each becomes its
// own work item; responses are written in the order they finish. The reactor
// finishes the stream once the client has half-closed and every request has been
// answered, so no work item outlives it. A message that is not a StreamRequest
// ends the reading: what was read before it is still answered, then the stream
// ends with INVALID_ARGUMENT naming it.
class StreamReactor final : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  StreamReactor(const Core& core, grpc::CallbackServerContext* context)
      : core_(core), context_(context), record_(core, Rpc::kStream, context) {
    if (!record_.admission().ok()) {
      finished_ = true;  // nothing is read, so no callback but OnDone follows
      record_.SetStatus(record_.admission().code());
      Finish(ToGrpc(record_.admission()));
      return;
    }
    StartRead(&incoming_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // half-close, cancellation or a broken connection
      std::unique_lock lock(mu_);
      reads_done_ = true;
      FinishIfDone(lock);
      return;
    }
    auto request = std::make_shared<v1::StreamRequest>();
    absl::Status parsed =
        ParseMessage(incoming_, request.get(), absl::StrCat("requests[", reads_, "]"));
    ++reads_;
    incoming_.Clear();
    if (!parsed.ok()) {
      std::unique_lock lock(mu_);
      stream_status_ = absl::InvalidArgumentError(
          absl::StrCat(parsed.message(),
                       "; the stream ends here, the requests before it are "
                       "answered"));
      core_.metrics->RecordStatus(Rpc::kStream, absl::StatusCode::kInvalidArgument);
      reads_done_ = true;
      FinishIfDone(lock);
      return;
    }
    Dispatch(std::move(request));
    StartRead(&incoming_);
  }

  void OnWriteDone(bool ok) override {
    std::unique_lock lock(mu_);
    outgoing_.pop_front();
    if (!ok) broken_ = true;
    if (!outgoing_.empty() && !broken_) {
      StartWrite(&outgoing_.front());
    } else {
      writing_ = false;
      if (broken_) outgoing_.clear();
      FinishIfDone(lock);
    }
  }

  void OnCancel() override { record_.MarkCancelled(); }

  void OnDone() override {
    record_.Done();
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
        QueueLocked(Serialized(*response), lock);
        return;
      }
    }
    // Each request's own arrival and the stream's deadline and cancellation.
    CallInfo call = CallInfoOf(context_, record_.info().cancelled);
    call.principal = record_.principal();
    // The request and response live until `done` runs: the closure holds both.
    auto make_done = [this, request, response](Rpc op) {
      return Done([this, request, response, op](absl::Status status) {
        core_.metrics->RecordStatus(op, status.code());
        Answer(request->request_id(), *response, status);
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

  static grpc::ByteBuffer Serialized(const v1::StreamResponse& response) {
    grpc::ByteBuffer buffer;
    SerializeMessage(response, &buffer);
    return buffer;
  }

  void Answer(uint64_t id, v1::StreamResponse& response, const absl::Status& status) {
    if (!status.ok()) {
      response.clear_result();
      response.set_status_code(static_cast<int>(status.code()));
      response.set_status_message(CapMessage(status.message()));
    }
    grpc::ByteBuffer buffer = Serialized(response);  // outside the lock: it may be large
    std::unique_lock lock(mu_);
    in_flight_.erase(id);
    QueueLocked(std::move(buffer), lock);
  }

  // One answer is ready: write it (or drop it on a broken stream).
  void QueueLocked(grpc::ByteBuffer response, std::unique_lock<std::mutex>& lock) {
    --pending_;
    if (broken_) {
      FinishIfDone(lock);
      return;
    }
    outgoing_.push_back(std::move(response));
    if (!writing_) {
      writing_ = true;
      StartWrite(&outgoing_.front());
    }
  }

  // Finishes the stream when nothing is left to read, compute or write. Finish is
  // called without the lock: its completion may run OnDone, which deletes `this`.
  void FinishIfDone(std::unique_lock<std::mutex>& lock) {
    if (!reads_done_ || pending_ != 0 || writing_ || finished_) return;
    finished_ = true;
    const absl::Status status = stream_status_;
    lock.unlock();
    record_.SetStatus(status.code());
    Finish(ToGrpc(status));
  }

  const Core& core_;
  grpc::CallbackServerContext* context_;
  CallRecord record_;
  grpc::ByteBuffer incoming_;
  uint64_t reads_ = 0;  // messages read so far (only the reading thread touches it)
  std::mutex mu_;
  std::deque<grpc::ByteBuffer> outgoing_;  // front is being written
  std::set<uint64_t> in_flight_;
  int pending_ = 0;  // requests read but not yet answered
  bool reads_done_ = false;
  bool writing_ = false;
  bool broken_ = false;
  bool finished_ = false;
  absl::Status stream_status_;  // OK unless a message could not be parsed
};

// A unary Compute call: prepare, submit, answered by the worker that runs it.
template <typename Request, typename Response, typename Prepare>
grpc::ServerUnaryReactor* ServeCompute(const Core& core, Rpc rpc,
                                       grpc::CallbackServerContext* context,
                                       const grpc::ByteBuffer* request, grpc::ByteBuffer* response,
                                       Prepare prepare) {
  using Call = UnaryCall<Request, Response>;
  return Call::Start(core, rpc, context, request, response, [&](Call& call) {
    CallInfo info = call.info();
    info.principal = call.record().principal();  // whose run tags these are
    Submit(core, call.Answerer(), [&](Done done) {
      return prepare(call.request(), call.response(), info, std::move(done));
    });
  });
}

}  // namespace

grpc::ServerUnaryReactor* ComputeService::Gemm(grpc::CallbackServerContext* context,
                                               const grpc::ByteBuffer* request,
                                               grpc::ByteBuffer* response) {
  return ServeCompute<v1::GemmRequest, v1::GemmResponse>(
      core_, Rpc::kGemm, context, request, response,
      [this](const v1::GemmRequest& r, v1::GemmResponse* out, CallInfo call, Done done) {
        return PrepareGemm(core_, r, out, call, std::move(done));
      });
}

grpc::ServerUnaryReactor* ComputeService::LayerForward(grpc::CallbackServerContext* context,
                                                       const grpc::ByteBuffer* request,
                                                       grpc::ByteBuffer* response) {
  return ServeCompute<v1::LayerForwardRequest, v1::LayerForwardResponse>(
      core_, Rpc::kLayerForward, context, request, response,
      [this](const v1::LayerForwardRequest& r, v1::LayerForwardResponse* out, CallInfo call,
             Done done) { return PrepareForward(core_, r, out, call, std::move(done)); });
}

grpc::ServerUnaryReactor* ComputeService::LayerBackward(grpc::CallbackServerContext* context,
                                                        const grpc::ByteBuffer* request,
                                                        grpc::ByteBuffer* response) {
  return ServeCompute<v1::LayerBackwardRequest, v1::LayerBackwardResponse>(
      core_, Rpc::kLayerBackward, context, request, response,
      [this](const v1::LayerBackwardRequest& r, v1::LayerBackwardResponse* out, CallInfo call,
             Done done) { return PrepareBackward(core_, r, out, call, std::move(done)); });
}

namespace {

// One LayersForward in flight: a LayerForwardRequest per layer, all pointing
// at one copy of the input (the work items read it until they are done, and
// each holds this through its Done), and the countdown to the answer.
struct FusedForward {
  std::unique_ptr<v1::Operand> input;
  std::vector<v1::LayerForwardRequest> requests;
  std::mutex mu;
  int remaining = 0;
  absl::Status status;  // the first failure, naming its layer
  Done answer;

  FusedForward() = default;
  FusedForward(const FusedForward&) = delete;
  FusedForward& operator=(const FusedForward&) = delete;
  ~FusedForward() {
    // The requests borrow `input`: give it back before they are destroyed.
    for (v1::LayerForwardRequest& request : requests) (void)request.unsafe_arena_release_input();
  }
};

constexpr int kMaxFusedLayers = 16;

// RESOURCE_EXHAUSTED naming `layers` when the outputs of every layer (M rows
// of its out_features, FP32) together exceed what one answer may carry. A layer
// or shape the daemon cannot resolve here is left to its own LayerForward to
// report.
absl::Status CheckFusedOutputs(const Core& core, const v1::LayersForwardRequest& r) {
  const v1::Operand& input = r.request().input();
  int64_t m = -1;
  if (input.has_tensor() && input.tensor().shape_size() == 2) m = input.tensor().shape(0);
  if (input.has_packed()) m = input.packed().rows();
  if (m <= 0) return absl::OkStatus();
  uint64_t bytes = 0;
  for (const std::string& layer : r.layers()) {
    absl::StatusOr<LayerSpec> spec = core.registry->FindLayer(r.request().model(), layer, "layers");
    if (!spec.ok()) return absl::OkStatus();
    const std::optional<uint64_t> one = mx::CheckedMul(
        static_cast<uint64_t>(m), static_cast<uint64_t>(spec->out_features) * sizeof(float));
    const std::optional<uint64_t> sum = one ? mx::CheckedAdd(bytes, *one) : std::nullopt;
    if (!sum) return absl::InvalidArgumentError("layers: the outputs' size overflows");
    bytes = *sum;
  }
  // Room for each output's shape and ExecutionInfo, as a LayerForward's check.
  const uint64_t envelope = kEnvelopeBytes * static_cast<uint64_t>(r.layers_size());
  if (bytes + envelope > static_cast<uint64_t>(core.max_message_bytes)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "layers: their outputs (", m, " rows each, FP32) take ", bytes,
        " bytes, more than one answer carries (--max-message-bytes ", core.max_message_bytes,
        "); ask for fewer layers or fewer rows per call"));
  }
  return absl::OkStatus();
}

}  // namespace

grpc::ServerUnaryReactor* ComputeService::LayersForward(grpc::CallbackServerContext* context,
                                                        const grpc::ByteBuffer* request,
                                                        grpc::ByteBuffer* response) {
  using Call = UnaryCall<v1::LayersForwardRequest, v1::LayersForwardResponse>;
  return Call::Start(core_, Rpc::kLayersForward, context, request, response, [this](Call& call) {
    const v1::LayersForwardRequest& r = call.request();
    const int n = r.layers_size();
    if (n < 1 || n > kMaxFusedLayers) {
      return call.Answer(absl::InvalidArgumentError(absl::StrCat(
          "layers: expected 1 to ", kMaxFusedLayers, " layers, got ", n)));
    }
    if (!r.request().layer().empty()) {
      return call.Answer(absl::InvalidArgumentError(absl::StrCat(
          "request.layer: expected empty (the layers are named in `layers`), got ",
          Quote(r.request().layer()))));
    }
    if (r.seeds_size() != 0 && r.seeds_size() != n) {
      return call.Answer(absl::InvalidArgumentError(absl::StrCat(
          "seeds: expected none or one per layer (", n, "), got ", r.seeds_size())));
    }
    // Every output comes back in one answer: refuse what could not, before
    // any work (each layer's own check sees its output alone).
    if (absl::Status s = CheckFusedOutputs(core_, r); !s.ok()) return call.Answer(s);
    auto fused = std::make_shared<FusedForward>();
    v1::LayerForwardRequest shell = r.request();  // the one copy of the input
    fused->input.reset(shell.release_input());
    fused->requests.resize(static_cast<size_t>(n));
    fused->remaining = n;
    fused->answer = call.Answerer();
    for (int i = 0; i < n; ++i) {
      v1::LayerForwardRequest& one = fused->requests[static_cast<size_t>(i)];
      one = shell;
      one.unsafe_arena_set_allocated_input(fused->input.get());
      one.set_layer(r.layers(i));
      if (r.seeds_size() > 0) one.set_seed(r.seeds(i));
      call.response()->add_outputs();
    }
    CallInfo info = call.info();
    info.principal = call.record().principal();
    for (int i = 0; i < n; ++i) {
      Done done = [fused, i](absl::Status status) {
        std::unique_lock lock(fused->mu);
        if (!status.ok() && fused->status.ok()) {
          fused->status = absl::Status(status.code(),
                                       absl::StrCat("layers[", i, "]: ", status.message()));
        }
        if (--fused->remaining > 0) return;
        const absl::Status answer = fused->status;
        lock.unlock();
        fused->answer(answer);  // the call's response is complete: every item is done
      };
      Submit(core_, std::move(done), [&](Done item_done) {
        return PrepareForward(core_, fused->requests[static_cast<size_t>(i)],
                              call.response()->mutable_outputs(i), info, std::move(item_done));
      });
    }
  });
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* ComputeService::Stream(
    grpc::CallbackServerContext* context) {
  return new StreamReactor(core_, context);
}

}  // namespace mxserve
