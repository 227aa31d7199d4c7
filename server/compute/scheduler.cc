#include "server/compute/scheduler.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace mxserve {

Scheduler::Scheduler(Options options, std::function<void(size_t)> on_depth)
    : options_(options),
      max_batch_(static_cast<size_t>(std::max(1, options.max_batch))),
      on_depth_(std::move(on_depth)) {
  MutexLock lock(&mu_);
  for (int i = 0; i < std::max(1, options_.workers); ++i) {
    workers_.emplace_back([this] { WorkerLoop(); });
  }
}

Scheduler::~Scheduler() { Shutdown(); }

absl::Status Scheduler::Submit(std::unique_ptr<WorkItem> item) {
  bool wake_one = false, wake_all = false;
  {
    MutexLock lock(&mu_);
    if (stopping_) return absl::UnavailableError("the daemon is shutting down");
    if (waiting_ >= static_cast<size_t>(options_.queue_capacity)) {
      return absl::ResourceExhaustedError(absl::StrCat("the ", options_.queue_name, " is full (",
                                                       options_.queue_capacity, " waiting; ",
                                                       options_.queue_limit, "); retry later"));
    }
    ++waiting_;
    // Told under the lock, so reports reach the gauge in the order the depth
    // changed (outside it, a late report could leave an idle queue reading 1).
    if (on_depth_) on_depth_(waiting_);

    const bool batched = item->runner != nullptr && !item->batch_key.empty() && max_batch_ > 1;
    const BatchKey key{item->runner, item->batch_key};
    auto joinable = batched ? joinable_.find(key) : joinable_.end();
    if (joinable != joinable_.end()) {
      Batch* batch = joinable->second;
      batch->items.push_back(std::move(item));
      if (batch->items.size() >= max_batch_) {  // full: no more joiners
        joinable_.erase(joinable);
        if (!batch->runnable) {
          MakeRunnable(batch);
          wake_one = true;
        }
      }
    } else {
      auto owned = std::make_unique<Batch>();
      Batch* batch = owned.get();
      batch->close_at = item->arrival + options_.batch_window;
      if (batched) joinable_.emplace(key, batch);
      batch->items.push_back(std::move(item));
      if (!batched || batch->close_at <= Clock::now()) {
        batch->runnable = true;
        runnable_.push_back(std::move(owned));
        wake_one = true;
      } else {
        // Collecting. An idle worker waits for the earliest window to end; when
        // this one ends first, the workers must choose their timeout again.
        wake_all = collecting_.empty() || batch->close_at < collecting_.begin()->first;
        batch->collecting = collecting_.emplace(batch->close_at, std::move(owned));
      }
    }
  }
  if (wake_all) {
    cv_.notify_all();
  } else if (wake_one) {
    cv_.notify_one();
  }
  return absl::OkStatus();
}

void Scheduler::MakeRunnable(Batch* batch) {
  auto node = collecting_.extract(batch->collecting);
  batch->runnable = true;
  runnable_.push_back(std::move(node.mapped()));
}

std::unique_ptr<Scheduler::Batch> Scheduler::Take() {
  while (true) {
    // Windows that ended, earliest first.
    const auto now = Clock::now();
    while (!collecting_.empty() && collecting_.begin()->first <= now) {
      MakeRunnable(collecting_.begin()->second.get());
    }
    if (!runnable_.empty()) {
      std::unique_ptr<Batch> batch = std::move(runnable_.front());
      runnable_.pop_front();
      const WorkItem& first = *batch->items.front();
      if (auto it = joinable_.find({first.runner, first.batch_key});
          it != joinable_.end() && it->second == batch.get()) {
        joinable_.erase(it);
      }
      waiting_ -= batch->items.size();
      if (on_depth_) on_depth_(waiting_);
      return batch;
    }
    if (stopping_) return nullptr;  // Shutdown made every open batch runnable
    // mu_ as the BasicLockable the wait releases and retakes.
    struct Lockable {
      Mutex& mu;
      void lock() ABSL_NO_THREAD_SAFETY_ANALYSIS { mu.Lock(); }
      void unlock() ABSL_NO_THREAD_SAFETY_ANALYSIS { mu.Unlock(); }
    } lockable{mu_};
    if (collecting_.empty()) {
      cv_.wait(lockable);
    } else {
      // A copy: the wait reads it with mu_ released, when the batch may be gone.
      const Clock::time_point window_ends = collecting_.begin()->first;
      cv_.wait_until(lockable, window_ends);
    }
  }
}

void Scheduler::WorkerLoop() {
  while (true) {
    std::unique_ptr<Batch> batch;
    {
      MutexLock lock(&mu_);
      batch = Take();
    }
    if (batch == nullptr) return;  // stopping and drained
    Execute(*batch);
  }
}

void Scheduler::Execute(Batch& batch) {
  const auto now = Clock::now();
  std::vector<WorkItem*> runnable;
  for (auto& item : batch.items) {
    const bool cancelled = item->Cancelled();
    if (item->deadline <= now ||
        (cancelled && GaveUpCode(now, item->deadline) == absl::StatusCode::kDeadlineExceeded)) {
      item->Fail(absl::DeadlineExceededError(
          "the request's deadline passed while it waited in the queue; it was not computed"));
    } else if (cancelled) {
      item->Fail(absl::CancelledError("the client cancelled the request before it ran"));
    } else {
      runnable.push_back(item.get());
    }
  }
  if (runnable.empty()) return;
  // Every item of a batch carries its runner; an item without one is alone.
  if (const BatchRunner* runner = runnable.front()->runner) {
    runner->Run(runnable);
  } else {
    runnable.front()->Run();
  }
}

void Scheduler::Stop() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
    // Open batches stop collecting: nothing more can join once Submit refuses.
    while (!collecting_.empty()) MakeRunnable(collecting_.begin()->second.get());
    joinable_.clear();
  }
  cv_.notify_all();
}

size_t Scheduler::CancelQueued(const absl::Status& status) {
  std::vector<std::unique_ptr<WorkItem>> cancelled;
  {
    MutexLock lock(&mu_);
    stopping_ = true;
    joinable_.clear();
    for (auto& [close_at, batch] : collecting_) {
      for (auto& item : batch->items) cancelled.push_back(std::move(item));
    }
    collecting_.clear();
    for (auto& batch : runnable_) {
      for (auto& item : batch->items) cancelled.push_back(std::move(item));
    }
    runnable_.clear();
    waiting_ = 0;
    if (on_depth_) on_depth_(waiting_);
  }
  cv_.notify_all();
  // Answered outside the lock: an answer may be large, and it reaches gRPC.
  for (auto& item : cancelled) item->Fail(status);
  return cancelled.size();
}

void Scheduler::Shutdown() {
  Stop();
  std::vector<std::thread> workers;
  {
    MutexLock lock(&mu_);
    workers.swap(workers_);
  }
  for (auto& worker : workers) worker.join();
}

}  // namespace mxserve
