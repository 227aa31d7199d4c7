// mxclient::ComputeStream: one Compute.Stream session. Requests go out with ids;
// responses come back in whatever order the daemon finishes them, each to the
// callback given with its request.
//
//   MX_ASSIGN_OR_RETURN(auto stream, client.OpenStream());
//   stream->Submit(request, [](absl::StatusOr<v1::StreamResponse> r) { ... });
//   MX_RETURN_IF_ERROR(stream->Close());  // waits for every response
//
// Thread-safe. Callbacks run on gRPC threads, possibly concurrently with each
// other, and must not block for long. Destroying an open stream cancels it.
#pragma once

#include <grpcpp/client_context.h>
#include <grpcpp/support/client_callback.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "mxserve/v1/compute.grpc.pb.h"

namespace mxclient {

namespace v1 = ::mxserve::v1;

class ComputeStream : private grpc::ClientBidiReactor<v1::StreamRequest, v1::StreamResponse> {
 public:
  // A request's outcome: its response when the daemon answered with status 0;
  // otherwise the request's own status (code and message from the response), or
  // the stream's status when the stream ended first.
  using Done = std::function<void(absl::StatusOr<v1::StreamResponse>)>;

  // Starts a session on `stub` (which must outlive it).
  static absl::StatusOr<std::unique_ptr<ComputeStream>> Open(v1::Compute::Stub* stub);
  ~ComputeStream() override;
  ComputeStream(const ComputeStream&) = delete;
  ComputeStream& operator=(const ComputeStream&) = delete;

  // Queues `request` for sending and returns its id. A request_id of 0 gets a
  // fresh id; any other must not be in flight already. Fails once the stream is
  // closing or has ended (then `done` is never called).
  absl::StatusOr<uint64_t> Submit(v1::StreamRequest request, Done done);
  // Submit, then wait for the outcome.
  absl::StatusOr<v1::StreamResponse> Call(v1::StreamRequest request);
  // Stops new submissions, waits for every outstanding response, half-closes and
  // returns the stream's final status. Idempotent.
  absl::Status Close();
  // Cancels the call: outstanding requests finish with CANCELLED.
  void Cancel() { context_.TryCancel(); }
  // Requests submitted and not yet answered.
  size_t InFlight() const;

 private:
  // What the holder of the write token does next, outside the lock.
  struct WriteStep {
    enum Kind { kNone, kWrite, kWritesDone, kRelease } kind = kNone;
    const v1::StreamRequest* message = nullptr;
  };

  ComputeStream() = default;
  // Chooses the next write-side operation and takes or releases the token.
  WriteStep NextWriteStepLocked();
  void Perform(const WriteStep& step);

  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnDone(const grpc::Status& status) override;

  grpc::ClientContext context_;
  v1::StreamResponse read_;  // target of the one outstanding read

  mutable std::mutex mu_;
  std::condition_variable done_cv_;
  std::deque<v1::StreamRequest> writes_;  // front() is on the wire while writing_
  bool writing_ = false;                  // the write token: one StartWrite/WritesDone at a time
  bool closing_ = false;                  // Close() called: no new submissions
  bool ended_ = false;                    // reads ended or a write failed: nothing more is sent
  bool finishing_ = false;                // WritesDone or the hold's release issued
  bool done_ = false;                     // OnDone ran
  absl::Status final_status_;
  std::map<uint64_t, Done> pending_;
  uint64_t next_id_ = 1;
};

}  // namespace mxclient
