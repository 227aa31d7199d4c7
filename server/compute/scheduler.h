// The per-device scheduler: a bounded queue in front of a pool of worker threads.
//
//   Submit  → RESOURCE_EXHAUSTED when the queue is full (queued items, those in
//             open batches included), UNAVAILABLE once stopping
//   worker  → drops cancelled work (CANCELLED) and work past its deadline
//             (DEADLINE_EXCEEDED) without computing it; otherwise runs it
//   batches → items with the same runner and non-empty batch key (model,
//             layer, formats, weight version) are fused, up to the maximum
//             batch size, and handed to that runner (BatchRunner). The first
//             item of a key opens a batch; items of that key submitted later join
//             it. The batch is runnable once its window (from the first item's
//             arrival) has ended or it is full, and it keeps taking items of its
//             key until a worker takes it. An open batch holds no worker: workers
//             run other queued work meanwhile, and an idle one wakes when the
//             earliest window ends. With a window of 0 a batch is runnable at
//             once, so only items queued before a worker takes it are fused.
//   runnable work runs in the order it became runnable.
//   Stop     → stops accepting, closes the open batches (their windows cut
//             short); what is queued still runs
//   CancelQueued → stops accepting and fails everything queued (the end of a
//             shutdown's grace); what is running runs on
//   Shutdown → Stop, runs everything queued, joins the workers.
//
// Compute never runs on gRPC's threads: services prepare a WorkItem and submit it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "server/base/mutex.h"

namespace mxserve {

using Clock = std::chrono::steady_clock;

// A client's deadline timer starts before the daemon's by the request's transit
// time, so the client gives up (and the daemon sees a cancellation) a little
// before the daemon's own deadline. A cancellation this close to the deadline
// is counted as the deadline passing, which is what the client saw. 20 ms was
// too little on a loaded 2-core machine under ASan (a call whose deadline
// passed was counted CANCELLED); 100 ms only misreads a client's own cancel in
// the last 100 ms before its deadline.
inline constexpr Clock::duration kDeadlineSlack = std::chrono::milliseconds(100);

// What a client that gave up at `when` saw: DEADLINE_EXCEEDED when that was
// (nearly) its deadline, CANCELLED otherwise.
inline absl::StatusCode GaveUpCode(Clock::time_point when, Clock::time_point deadline) {
  return deadline != Clock::time_point::max() && when >= deadline - kDeadlineSlack
             ? absl::StatusCode::kDeadlineExceeded
             : absl::StatusCode::kCancelled;
}

class WorkItem;

// Runs a batch: items that share a runner and a batch key, fused into one
// computation. One runner serves every batch of its kind (LayerForward's), so
// it holds no state of its own.
class BatchRunner {
 public:
  virtual ~BatchRunner() = default;
  // Runs `batch`, items that carry this runner and one key, in arrival order.
  // Must answer every item.
  virtual void Run(std::span<WorkItem* const> batch) const = 0;
};

class WorkItem {
 public:
  virtual ~WorkItem() = default;

  // Runs this item alone. An item with a runner is a batch of one (the
  // scheduler never calls this for it); one without must override it.
  virtual void Run() {
    WorkItem* self = this;
    runner->Run({&self, 1});
  }
  // Answers this item with an error; it will not run.
  virtual void Fail(absl::Status status) = 0;
  // True once the client gave up on the request.
  virtual bool Cancelled() const { return false; }

  // Set both to be batched: items with the same runner and the same non-empty
  // key are fused and handed to the runner together (a batch of one included).
  const BatchRunner* runner = nullptr;
  std::string batch_key;
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
    // How a full queue is named in RESOURCE_EXHAUSTED: "the <queue_name> is
    // full (N waiting; <queue_limit>); retry later".
    std::string queue_name = "request queue";
    std::string queue_limit = "--queue-size";
  };
  // `on_depth` (may be empty) is told the number of waiting items on every
  // change, in order, under the scheduler's lock: it must be quick and must not
  // call back into the scheduler.
  Scheduler(Options options, std::function<void(size_t)> on_depth = {});
  ~Scheduler();

  absl::Status Submit(std::unique_ptr<WorkItem> item) ABSL_LOCKS_EXCLUDED(mu_);
  // Stops accepting; what is queued (open batches too, without waiting for their
  // windows) still runs.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);
  // Stops accepting and fails every queued item with `status` instead of running
  // it; returns how many. Work already running is not interrupted.
  size_t CancelQueued(const absl::Status& status) ABSL_LOCKS_EXCLUDED(mu_);
  // Stop, then runs everything already queued and joins the workers.
  void Shutdown() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // Items that may join one batch: the same runner and key.
  using BatchKey = std::pair<const BatchRunner*, std::string>;
  struct Batch {
    std::vector<std::unique_ptr<WorkItem>> items;  // one runner and key (or one item alone)
    Clock::time_point close_at;  // runnable from then on, if not full before
    bool runnable = false;       // in runnable_; else in collecting_, at `collecting`
    std::multimap<Clock::time_point, std::unique_ptr<Batch>>::iterator collecting;
  };

  void WorkerLoop() ABSL_LOCKS_EXCLUDED(mu_);
  // Waits for a runnable batch and takes it; null once stopping and drained.
  std::unique_ptr<Batch> Take() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves a collecting batch to the runnable queue.
  void MakeRunnable(Batch* batch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Fails the items whose client gave up or whose deadline passed, then hands
  // the rest to the batch's runner (or runs the one item).
  void Execute(Batch& batch);

  const Options options_;
  const size_t max_batch_;  // options_.max_batch, at least 1
  const std::function<void(size_t)> on_depth_;
  Mutex mu_;
  // Waits with mu_ as its lock (condition_variable_any). Not absl::CondVar: this Abseil's timed
  // waits run on the wall clock, so a clock stepped back would stall a window.
  std::condition_variable_any cv_;  // runnable work, an earlier window, or stopping
  // Open batches still in their window, by the time it ends.
  std::multimap<Clock::time_point, std::unique_ptr<Batch>> collecting_ ABSL_GUARDED_BY(mu_);
  // Batches a worker may take, in the order they became runnable.
  std::deque<std::unique_ptr<Batch>> runnable_ ABSL_GUARDED_BY(mu_);
  // Key → the batch that items of that key join: collecting, or runnable and not
  // yet taken, and not full.
  std::map<BatchKey, Batch*> joinable_ ABSL_GUARDED_BY(mu_);
  size_t waiting_ ABSL_GUARDED_BY(mu_) = 0;  // items in collecting_ and runnable_
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_ ABSL_GUARDED_BY(mu_);  // handed to the first Shutdown
};

}  // namespace mxserve
