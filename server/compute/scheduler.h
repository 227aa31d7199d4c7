// The per-device scheduler: a bounded queue in front of a pool of worker threads.
//
//   Submit  → RESOURCE_EXHAUSTED when the queue is full, UNAVAILABLE once stopping
//   worker  → drops cancelled work (CANCELLED) and work past its deadline
//             (DEADLINE_EXCEEDED) without computing it; otherwise runs it
//   batches → items with the same non-empty batch key (model, layer, formats,
//             weight version) are fused: a worker that takes one keeps the batch
//             open for the batching window, and items of that key submitted in the
//             meantime join it directly, up to the maximum batch size. With a
//             window of 0 only items already queued are fused.
//
// Compute never runs on gRPC's threads: services prepare a WorkItem and submit it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"

namespace mxserve {

using Clock = std::chrono::steady_clock;

// A client's deadline timer starts before the daemon's by the request's transit
// time, so the client gives up (and the daemon sees a cancellation) a little
// before the daemon's own deadline. A cancellation this close to the deadline
// is counted as the deadline passing, which is what the client saw.
inline constexpr Clock::duration kDeadlineSlack = std::chrono::milliseconds(20);

// What a client that gave up at `when` saw: DEADLINE_EXCEEDED when that was
// (nearly) its deadline, CANCELLED otherwise.
inline absl::StatusCode GaveUpCode(Clock::time_point when, Clock::time_point deadline) {
  return deadline != Clock::time_point::max() && when >= deadline - kDeadlineSlack
             ? absl::StatusCode::kDeadlineExceeded
             : absl::StatusCode::kCancelled;
}

class WorkItem {
 public:
  virtual ~WorkItem() = default;

  // Runs `batch` (this item first, then the others of its key). Must answer every
  // item of the batch.
  virtual void Run(std::span<WorkItem* const> batch) = 0;
  // Answers this item with an error; it will not run.
  virtual void Fail(absl::Status status) = 0;
  // True once the client gave up on the request.
  virtual bool Cancelled() const { return false; }

  std::string batch_key;                     // empty: never batched
  Clock::time_point arrival = Clock::now();  // when the request arrived
  Clock::time_point deadline = Clock::time_point::max();
};

class Scheduler {
 public:
  struct Options {
    int workers = 2;
    int queue_capacity = 1024;  // items waiting, batches included
    std::chrono::microseconds batch_window{0};
    int max_batch = 16;
  };
  // `on_depth` (may be empty) is told the number of waiting items on every
  // change, in order, under the scheduler's lock: it must be quick and must not
  // call back into the scheduler.
  Scheduler(Options options, std::function<void(size_t)> on_depth = {});
  ~Scheduler();

  absl::Status Submit(std::unique_ptr<WorkItem> item);
  // Stops accepting, runs everything already queued, joins the workers.
  void Shutdown();

 private:
  struct OpenBatch {
    std::vector<std::unique_ptr<WorkItem>> items;
  };
  void WorkerLoop();
  void Execute(std::vector<std::unique_ptr<WorkItem>> batch);

  const Options options_;
  const std::function<void(size_t)> on_depth_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<WorkItem>> queue_;
  std::map<std::string, OpenBatch*> open_batches_;  // key → batch a worker is collecting
  size_t waiting_ = 0;                              // queued + in open batches
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace mxserve
