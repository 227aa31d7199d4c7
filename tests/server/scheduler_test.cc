// The scheduler without a daemon: what it tells the queue-depth gauge, how it
// answers work that cannot run, and that queued work runs through Shutdown.
#include "server/compute/scheduler.h"

#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

namespace mxserve {
namespace {

// Work that records how it ended.
class Probe final : public WorkItem {
 public:
  explicit Probe(std::atomic<int>* ran, std::function<void()> body = {})
      : ran_(ran), body_(std::move(body)) {}
  void Run(std::span<WorkItem* const> batch) override {
    for (WorkItem* item : batch) static_cast<Probe*>(item)->Ran();
  }
  void Fail(absl::Status status) override { failed.set_value(status.code()); }
  bool Cancelled() const override { return cancelled; }

  std::promise<absl::StatusCode> failed;
  bool cancelled = false;

 private:
  void Ran() {
    if (body_) body_();
    ran_->fetch_add(1);
  }
  std::atomic<int>* ran_;
  std::function<void()> body_;
};

TEST(Scheduler, DepthReportsArriveInOrderAndEndAtZero) {
  // Reports made outside the scheduler's lock could arrive late: an idle queue
  // then read 1 (and a pending batch 0).
  std::mutex mu;
  std::vector<size_t> depths;
  std::atomic<int> ran{0};
  constexpr int kThreads = 4, kPerThread = 500;
  {
    Scheduler scheduler({.workers = 2, .queue_capacity = 1 << 20}, [&](size_t depth) {
      std::lock_guard lock(mu);
      depths.push_back(depth);
    });
    std::vector<std::thread> submitters;
    for (int t = 0; t < kThreads; ++t) {
      submitters.emplace_back([&] {
        for (int i = 0; i < kPerThread; ++i) {
          ASSERT_TRUE(scheduler.Submit(std::make_unique<Probe>(&ran)).ok());
        }
      });
    }
    for (auto& s : submitters) s.join();
    scheduler.Shutdown();
  }
  EXPECT_EQ(ran.load(), kThreads * kPerThread);
  ASSERT_FALSE(depths.empty());
  EXPECT_EQ(depths.back(), 0u);
  // In order: every submit adds exactly one to the depth before it.
  size_t submits = 0;
  for (size_t i = 1; i < depths.size(); ++i) {
    if (depths[i] > depths[i - 1]) {
      EXPECT_EQ(depths[i], depths[i - 1] + 1) << "report " << i;
      ++submits;
    }
  }
  EXPECT_EQ(submits + (depths.front() == 1), static_cast<size_t>(kThreads * kPerThread));
}

TEST(Scheduler, WorkThatCannotRunIsAnsweredWithTheReason) {
  std::atomic<int> ran{0};
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  Scheduler scheduler({.workers = 1, .queue_capacity = 4});
  // The blocker holds the only worker until released.
  auto blocker = std::make_unique<Probe>(&ran, [released] { released.wait(); });
  ASSERT_TRUE(scheduler.Submit(std::move(blocker)).ok());
  while (true) {  // until the worker has taken it
    auto probe = std::make_unique<Probe>(&ran);
    probe->cancelled = true;
    auto answer = probe->failed.get_future();
    ASSERT_TRUE(scheduler.Submit(std::move(probe)).ok());
    if (answer.wait_for(std::chrono::milliseconds(0)) == std::future_status::ready) continue;
    // Queued behind the blocker: cancelled by the client, long before a deadline.
    release.set_value();
    EXPECT_EQ(answer.get(), absl::StatusCode::kCancelled);
    break;
  }
  // A deadline already passed, and a cancellation at the deadline (the client's
  // timer fires first), are both DEADLINE_EXCEEDED; neither runs.
  auto expired = std::make_unique<Probe>(&ran);
  expired->deadline = Clock::now() - std::chrono::milliseconds(1);
  auto expired_answer = expired->failed.get_future();
  auto at_deadline = std::make_unique<Probe>(&ran);
  at_deadline->deadline = Clock::now() + kDeadlineSlack / 4;
  at_deadline->cancelled = true;
  auto at_deadline_answer = at_deadline->failed.get_future();
  ASSERT_TRUE(scheduler.Submit(std::move(expired)).ok());
  ASSERT_TRUE(scheduler.Submit(std::move(at_deadline)).ok());
  EXPECT_EQ(expired_answer.get(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(at_deadline_answer.get(), absl::StatusCode::kDeadlineExceeded);
  scheduler.Shutdown();
  EXPECT_EQ(ran.load(), 1);  // the blocker only
  EXPECT_EQ(scheduler.Submit(std::make_unique<Probe>(&ran)).code(),
            absl::StatusCode::kUnavailable);
}

TEST(Scheduler, ShutdownRunsEverythingQueued) {
  std::atomic<int> ran{0};
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  Scheduler scheduler({.workers = 1, .queue_capacity = 100});
  ASSERT_TRUE(scheduler.Submit(std::make_unique<Probe>(&ran, [released] { released.wait(); })).ok());
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(scheduler.Submit(std::make_unique<Probe>(&ran)).ok());
  std::thread stopper([&] { scheduler.Shutdown(); });
  release.set_value();
  stopper.join();
  EXPECT_EQ(ran.load(), 21);
}

}  // namespace
}  // namespace mxserve
