#include "clients/cpp/compute_stream.h"

#include <future>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "clients/cpp/grpc_status.h"

namespace mxclient {

absl::StatusOr<std::unique_ptr<ComputeStream>> ComputeStream::Open(v1::Compute::Stub* stub) {
  std::unique_ptr<ComputeStream> stream(new ComputeStream);
  stub->async()->Stream(&stream->context_, stream.get());
  stream->StartRead(&stream->read_);
  // Writes start from Submit, outside any reaction: the hold keeps the call alive
  // (OnDone away) until the write side is finished with it.
  stream->AddHold();
  stream->StartCall();
  return stream;
}

ComputeStream::~ComputeStream() {
  std::unique_lock lock(mu_);
  if (done_) return;
  lock.unlock();
  context_.TryCancel();
  lock.lock();
  done_cv_.wait(lock, [this] { return done_; });
}

absl::StatusOr<uint64_t> ComputeStream::Submit(v1::StreamRequest request, Done done) {
  WriteStep step;
  uint64_t id = request.request_id();
  {
    std::lock_guard lock(mu_);
    if (closing_ || ended_) {
      return absl::FailedPreconditionError(closing_ ? "Compute.Stream: the stream is closing"
                                                    : "Compute.Stream: the stream ended");
    }
    if (id == 0) {
      while (id == 0 || pending_.contains(id)) id = next_id_++;
      request.set_request_id(id);
    } else if (pending_.contains(id)) {
      return absl::InvalidArgumentError(
          absl::StrCat("Compute.Stream: request_id ", id, " is already in flight"));
    }
    pending_.emplace(id, std::move(done));
    writes_.push_back(std::move(request));
    if (!writing_) step = NextWriteStepLocked();
  }
  Perform(step);
  return id;
}

absl::StatusOr<v1::StreamResponse> ComputeStream::Call(v1::StreamRequest request) {
  auto outcome = std::make_shared<std::promise<absl::StatusOr<v1::StreamResponse>>>();
  std::future<absl::StatusOr<v1::StreamResponse>> result = outcome->get_future();
  absl::StatusOr<uint64_t> id =
      Submit(std::move(request), [outcome](absl::StatusOr<v1::StreamResponse> response) {
        outcome->set_value(std::move(response));
      });
  if (!id.ok()) return id.status();
  return result.get();
}

absl::Status ComputeStream::Close() {
  WriteStep step;
  std::unique_lock lock(mu_);
  if (!closing_) {
    closing_ = true;
    if (!writing_) step = NextWriteStepLocked();
  }
  lock.unlock();
  Perform(step);
  lock.lock();
  done_cv_.wait(lock, [this] { return done_; });
  return final_status_;
}

size_t ComputeStream::InFlight() const {
  std::lock_guard lock(mu_);
  return pending_.size();
}

ComputeStream::WriteStep ComputeStream::NextWriteStepLocked() {
  if (!ended_ && !writes_.empty()) {
    writing_ = true;
    return {WriteStep::kWrite, &writes_.front()};
  }
  if (!finishing_ && (ended_ || (closing_ && pending_.empty()))) {
    // The token is never given back: nothing is written after this.
    writing_ = true;
    finishing_ = true;
    return {ended_ ? WriteStep::kRelease : WriteStep::kWritesDone};
  }
  writing_ = false;
  return {};
}

void ComputeStream::Perform(const WriteStep& step) {
  switch (step.kind) {
    case WriteStep::kNone:
      break;
    case WriteStep::kWrite:
      StartWrite(step.message);
      break;
    case WriteStep::kWritesDone:
      StartWritesDone();
      RemoveHold();
      break;
    case WriteStep::kRelease:
      RemoveHold();
      break;
  }
}

void ComputeStream::OnWriteDone(bool ok) {
  WriteStep step;
  {
    std::lock_guard lock(mu_);
    writes_.pop_front();
    if (!ok) ended_ = true;  // the call is over; OnDone brings its status
    step = NextWriteStepLocked();
  }
  Perform(step);
}

void ComputeStream::OnReadDone(bool ok) {
  WriteStep step;
  if (!ok) {
    std::lock_guard lock(mu_);
    ended_ = true;
    if (!writing_) step = NextWriteStepLocked();
  } else {
    v1::StreamResponse response = std::move(read_);
    read_.Clear();
    StartRead(&read_);
    Done done;
    {
      std::lock_guard lock(mu_);
      if (auto it = pending_.find(response.request_id()); it != pending_.end()) {
        done = std::move(it->second);
        pending_.erase(it);
      }
      if (!writing_) step = NextWriteStepLocked();
    }
    // An id not in flight is the daemon's mistake; there is nobody to tell.
    if (done) {
      if (response.status_code() == 0) {
        done(std::move(response));
      } else {
        done(absl::Status(static_cast<absl::StatusCode>(response.status_code()),
                          response.status_message()));
      }
    }
  }
  Perform(step);
}

void ComputeStream::OnDone(const grpc::Status& status) {
  std::map<uint64_t, Done> unanswered;
  {
    std::lock_guard lock(mu_);
    unanswered.swap(pending_);
  }
  const absl::Status stream_status = FromGrpcStatus(status);
  for (auto& [id, done] : unanswered) {
    done(stream_status.ok() ? absl::UnavailableError(absl::StrCat(
                                  "Compute.Stream ended without answering request ", id))
                            : stream_status);
  }
  // Last touch of this object: a waiting destructor may run as soon as the lock
  // is released.
  std::lock_guard lock(mu_);
  done_ = true;
  final_status_ = stream_status;
  done_cv_.notify_all();
}

}  // namespace mxclient
