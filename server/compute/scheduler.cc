#include "server/compute/scheduler.h"

#include "absl/strings/str_cat.h"

namespace mxserve {

Scheduler::Scheduler(Options options, std::function<void(size_t)> on_depth)
    : options_(options), on_depth_(std::move(on_depth)) {
  for (int i = 0; i < std::max(1, options_.workers); ++i) {
    workers_.emplace_back([this] { WorkerLoop(); });
  }
}

Scheduler::~Scheduler() { Shutdown(); }

absl::Status Scheduler::Submit(std::unique_ptr<WorkItem> item) {
  {
    std::lock_guard lock(mu_);
    if (stopping_) return absl::UnavailableError("the daemon is shutting down");
    if (waiting_ >= static_cast<size_t>(options_.queue_capacity)) {
      return absl::ResourceExhaustedError(absl::StrCat("the request queue is full (",
                                                       options_.queue_capacity,
                                                       " waiting; --queue-size); retry later"));
    }
    ++waiting_;
    // Told under the lock, so reports reach the gauge in the order the depth
    // changed (outside it, a late report could leave an idle queue reading 1).
    if (on_depth_) on_depth_(waiting_);
    auto open = item->batch_key.empty() ? open_batches_.end() : open_batches_.find(item->batch_key);
    if (open != open_batches_.end() &&
        open->second->items.size() < static_cast<size_t>(options_.max_batch)) {
      open->second->items.push_back(std::move(item));
    } else {
      queue_.push_back(std::move(item));
    }
  }
  cv_.notify_all();
  return absl::OkStatus();
}

void Scheduler::WorkerLoop() {
  std::unique_lock lock(mu_);
  while (true) {
    cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping and drained
    OpenBatch batch;
    batch.items.push_back(std::move(queue_.front()));
    queue_.pop_front();
    const std::string key = batch.items.front()->batch_key;
    const size_t max_batch = static_cast<size_t>(std::max(1, options_.max_batch));
    if (!key.empty() && max_batch > 1) {
      auto take_queued = [&] {
        for (auto it = queue_.begin(); it != queue_.end() && batch.items.size() < max_batch;) {
          if ((*it)->batch_key == key) {
            batch.items.push_back(std::move(*it));
            it = queue_.erase(it);
          } else {
            ++it;
          }
        }
      };
      take_queued();
      const auto close_at = batch.items.front()->arrival + options_.batch_window;
      if (batch.items.size() < max_batch && options_.batch_window.count() > 0 &&
          Clock::now() < close_at && !open_batches_.contains(key)) {
        // Keep the batch open: Submit adds items of this key to it directly.
        open_batches_[key] = &batch;
        cv_.wait_until(lock, close_at,
                       [&] { return stopping_ || batch.items.size() >= max_batch; });
        open_batches_.erase(key);
        take_queued();
      }
    }
    waiting_ -= batch.items.size();
    if (on_depth_) on_depth_(waiting_);
    lock.unlock();
    Execute(std::move(batch.items));
    lock.lock();
  }
}

void Scheduler::Execute(std::vector<std::unique_ptr<WorkItem>> batch) {
  const auto now = Clock::now();
  std::vector<WorkItem*> runnable;
  for (auto& item : batch) {
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
  if (!runnable.empty()) runnable.front()->Run(runnable);
}

void Scheduler::Shutdown() {
  {
    std::lock_guard lock(mu_);
    if (stopping_ && workers_.empty()) return;
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& worker : workers_) {
    if (worker.joinable()) worker.join();
  }
  workers_.clear();
}

}  // namespace mxserve
