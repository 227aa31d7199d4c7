// The scheduler without a daemon: what it tells the queue-depth gauge, how it
// answers work that cannot run, how it batches, and that queued work runs
// through Shutdown. Nothing here waits on the clock: gates (latches) hold the
// workers while the queue is arranged, and batch windows are either long (an
// hour, cut short by Shutdown or by the batch filling) or already over.
#include "server/compute/scheduler.h"

#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <latch>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace mxserve {
namespace {

// Work that records how it ended.
class Probe final : public WorkItem {
 public:
  explicit Probe(std::atomic<int>* ran, std::function<void()> body = {})
      : ran_(ran), body_(std::move(body)) {}
  void Run() override { Ran(); }
  void Fail(absl::Status status) override { failed.set_value(status.code()); }
  bool Cancelled() const override { return cancelled; }

  std::promise<absl::StatusCode> failed;
  std::atomic<bool> cancelled = false;

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
  EXPECT_EQ(scheduler.Submit(std::make_unique<Probe>(&ran)).code(), absl::StatusCode::kUnavailable);
}

TEST(Scheduler, ShutdownRunsEverythingQueued) {
  std::atomic<int> ran{0};
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  Scheduler scheduler({.workers = 1, .queue_capacity = 100});
  ASSERT_TRUE(
      scheduler.Submit(std::make_unique<Probe>(&ran, [released] { released.wait(); })).ok());
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(scheduler.Submit(std::make_unique<Probe>(&ran)).ok());
  std::thread stopper([&] { scheduler.Shutdown(); });
  release.set_value();
  stopper.join();
  EXPECT_EQ(ran.load(), 21);
}

// A worker that runs a gate's body stays inside it until the test releases it;
// the test learns when it entered. The state is shared with the body, and a gate
// that goes out of scope releases it, so a failed assertion cannot leave a
// worker blocked while the scheduler's destructor joins it.
class Gate {
 public:
  Gate() : state_(std::make_shared<State>()) {}
  ~Gate() { Release(); }
  std::function<void()> Body() const {
    return [state = state_] {
      state->entered.count_down();
      state->release.wait();
    };
  }
  void WaitEntered() const { state_->entered.wait(); }
  void Release() {
    if (!released_) state_->release.count_down();
    released_ = true;
  }

 private:
  struct State {
    std::latch entered{1};
    std::latch release{1};
  };
  std::shared_ptr<State> state_;
  bool released_ = false;
};

// The batches Tagged items ran in, by name, in the order they ran.
class RunLog {
 public:
  void Add(std::vector<std::string> batch) {
    std::lock_guard lock(mu_);
    batches_.push_back(std::move(batch));
  }
  std::vector<std::vector<std::string>> batches() {
    std::lock_guard lock(mu_);
    return batches_;
  }

 private:
  std::mutex mu_;
  std::vector<std::vector<std::string>> batches_;
};

// Work with a name and a batch key that writes its batch down when it runs.
class Tagged final : public WorkItem {
 public:
  Tagged(std::string name, std::string key, RunLog* log, std::function<void()> body = {})
      : name_(std::move(name)), log_(log), body_(std::move(body)) {
    runner = &kRunner;
    batch_key = std::move(key);
  }
  void Fail(absl::Status status) override { failed.set_value(std::move(status)); }
  bool Cancelled() const override { return cancelled; }

  std::promise<Clock::time_point> ran;  // when its batch finished
  std::promise<absl::Status> failed;
  std::atomic<bool> cancelled = false;

 private:
  // The batch's runner: writes the names down, runs the first item's body,
  // then marks every item run.
  class Runner final : public BatchRunner {
   public:
    void Run(std::span<WorkItem* const> batch) const override {
      std::vector<std::string> names;
      for (WorkItem* item : batch) names.push_back(static_cast<Tagged*>(item)->name_);
      Tagged& first = *static_cast<Tagged*>(batch.front());
      first.log_->Add(std::move(names));
      if (first.body_) first.body_();
      for (WorkItem* item : batch) static_cast<Tagged*>(item)->ran.set_value(Clock::now());
    }
  };
  static const Runner kRunner;

  std::string name_;
  RunLog* log_;
  std::function<void()> body_;
};
const Tagged::Runner Tagged::kRunner;

// Guards the waits a bug would turn into a hang (a batch that never closes):
// the test then fails instead of stalling. Correct code is ready at once.
template <typename T>
bool Ready(const std::future<T>& future) {
  return future.wait_for(std::chrono::seconds(60)) == std::future_status::ready;
}

template <typename T>
bool NotYet(const std::future<T>& future) {
  return future.wait_for(std::chrono::seconds(0)) == std::future_status::timeout;
}

// True when the item was destroyed without setting the promise (it never ran,
// or it was never answered).
template <typename T>
bool Abandoned(std::future<T> future) {
  try {
    static_cast<void>(future.get());
  } catch (const std::future_error& e) {
    return e.code() == std::future_errc::broken_promise;
  }
  return false;
}

using Batches = std::vector<std::vector<std::string>>;
constexpr std::chrono::microseconds kHour = std::chrono::hours(1);

TEST(SchedulerBatching, ItemsOfOneKeyFuseUpToMaxBatchAndKeysStayApart) {
  RunLog log;
  Gate gate;
  Scheduler scheduler({.workers = 1, .max_batch = 2});  // window 0
  ASSERT_TRUE(scheduler.Submit(std::make_unique<Tagged>("block", "", &log, gate.Body())).ok());
  gate.WaitEntered();
  // Queued behind the gate, so all of them are waiting when the worker comes back.
  for (const char* name : {"a1", "b1", "a2", "a3", "b2", "a4", "a5", "u1", "u2"}) {
    const std::string key = name[0] == 'u' ? "" : std::string(1, name[0]);  // u: no key
    ASSERT_TRUE(scheduler.Submit(std::make_unique<Tagged>(name, key, &log)).ok());
  }
  gate.Release();
  scheduler.Shutdown();
  // A batch runs where its first item was queued; unkeyed items never fuse.
  EXPECT_EQ(log.batches(),
            (Batches{{"block"}, {"a1", "a2"}, {"b1", "b2"}, {"a3", "a4"}, {"a5"}, {"u1"}, {"u2"}}));
}

TEST(SchedulerBatching, ALongWindowClosesAsSoonAsTheBatchIsFull) {
  RunLog log;
  std::vector<size_t> depths;  // reported under the scheduler's lock
  Scheduler scheduler({.workers = 1, .batch_window = kHour, .max_batch = 3},
                      [&](size_t depth) { depths.push_back(depth); });
  std::vector<std::future<Clock::time_point>> ran;
  for (const char* name : {"a1", "a2", "a3"}) {
    auto item = std::make_unique<Tagged>(name, "a", &log);
    ran.push_back(item->ran.get_future());
    ASSERT_TRUE(scheduler.Submit(std::move(item)).ok());
  }
  for (auto& r : ran) ASSERT_TRUE(Ready(r));  // without Shutdown, hours early
  EXPECT_EQ(log.batches(), (Batches{{"a1", "a2", "a3"}}));
  // The full batch took no more: the next item of the key opens a new one,
  // which waits for its window, until Shutdown cuts it short.
  auto a4 = std::make_unique<Tagged>("a4", "a", &log);
  auto a4_ran = a4->ran.get_future();
  ASSERT_TRUE(scheduler.Submit(std::move(a4)).ok());
  EXPECT_TRUE(NotYet(a4_ran));
  scheduler.Shutdown();
  EXPECT_TRUE(Ready(a4_ran));
  EXPECT_EQ(log.batches(), (Batches{{"a1", "a2", "a3"}, {"a4"}}));
  // Three waiting, taken at once as one batch; then a4 waiting, then taken.
  EXPECT_EQ(depths, (std::vector<size_t>{1, 2, 3, 0, 1, 0}));
}

TEST(SchedulerBatching, WithWindowZeroOnlyQueuedItemsFuse) {
  RunLog log;
  Gate gate;
  Scheduler scheduler({.workers = 1, .max_batch = 16});  // window 0
  // a1 is alone when submitted: it runs at once, in a batch of its own, and
  // holds the worker.
  ASSERT_TRUE(scheduler.Submit(std::make_unique<Tagged>("a1", "a", &log, gate.Body())).ok());
  gate.WaitEntered();
  // a2 and a3 come while a1 runs: they cannot join a running batch, but they
  // are queued together, so they fuse.
  ASSERT_TRUE(scheduler.Submit(std::make_unique<Tagged>("a2", "a", &log)).ok());
  ASSERT_TRUE(scheduler.Submit(std::make_unique<Tagged>("a3", "a", &log)).ok());
  gate.Release();
  scheduler.Shutdown();
  EXPECT_EQ(log.batches(), (Batches{{"a1"}, {"a2", "a3"}}));
}

TEST(SchedulerBatching, AnOpenBatchHoldsNoWorker) {
  RunLog log;
  Scheduler scheduler({.workers = 1, .batch_window = kHour, .max_batch = 16});
  auto k1 = std::make_unique<Tagged>("k1", "k", &log);
  auto k1_ran = k1->ran.get_future();
  ASSERT_TRUE(scheduler.Submit(std::move(k1)).ok());
  // The batch of k collects for an hour; the only worker still runs other work.
  auto other = std::make_unique<Tagged>("other", "", &log);
  auto other_ran = other->ran.get_future();
  ASSERT_TRUE(scheduler.Submit(std::move(other)).ok());
  ASSERT_TRUE(Ready(other_ran));
  auto k2 = std::make_unique<Tagged>("k2", "k", &log);
  auto k2_ran = k2->ran.get_future();
  ASSERT_TRUE(scheduler.Submit(std::move(k2)).ok());  // joins the open batch
  EXPECT_TRUE(NotYet(k1_ran));
  EXPECT_EQ(log.batches(), (Batches{{"other"}}));
  // Shutdown closes the open batch and runs it.
  scheduler.Shutdown();
  EXPECT_TRUE(Ready(k1_ran));
  EXPECT_TRUE(Ready(k2_ran));
  EXPECT_EQ(log.batches(), (Batches{{"other"}, {"k1", "k2"}}));
}

TEST(SchedulerBatching, ABatchRunsWhenItsWindowEndsAndNotBefore) {
  RunLog log;
  Scheduler scheduler({.workers = 1, .batch_window = kHour, .max_batch = 16});
  // The idle worker waits for the end of this hour-long window...
  auto late = std::make_unique<Tagged>("late", "late", &log);
  auto late_ran = late->ran.get_future();
  ASSERT_TRUE(scheduler.Submit(std::move(late)).ok());
  // ... until a batch whose window ends sooner opens: its first item arrived
  // (nearly) an hour ago, so its window ends in a few milliseconds.
  auto soon = std::make_unique<Tagged>("soon", "soon", &log);
  soon->arrival = Clock::now() - kHour + std::chrono::milliseconds(5);
  const Clock::time_point close_at = soon->arrival + kHour;
  auto soon_ran = soon->ran.get_future();
  ASSERT_TRUE(scheduler.Submit(std::move(soon)).ok());
  ASSERT_TRUE(Ready(soon_ran));  // without Shutdown
  EXPECT_GE(soon_ran.get(), close_at);
  EXPECT_TRUE(NotYet(late_ran));
  // A batch whose window is over when its first item comes is runnable at once.
  auto over = std::make_unique<Tagged>("over", "over", &log);
  over->arrival = Clock::now() - 2 * kHour;
  auto over_ran = over->ran.get_future();
  ASSERT_TRUE(scheduler.Submit(std::move(over)).ok());
  ASSERT_TRUE(Ready(over_ran));
  EXPECT_TRUE(NotYet(late_ran));
  scheduler.Shutdown();
  EXPECT_EQ(log.batches(), (Batches{{"soon"}, {"over"}, {"late"}}));
}

TEST(SchedulerQueue, AFullQueueRefusesWithItsSize) {
  RunLog log;
  Gate gate1, gate2;
  Scheduler scheduler({.workers = 2, .queue_capacity = 3});
  ASSERT_TRUE(scheduler.Submit(std::make_unique<Tagged>("block1", "", &log, gate1.Body())).ok());
  ASSERT_TRUE(scheduler.Submit(std::make_unique<Tagged>("block2", "", &log, gate2.Body())).ok());
  gate1.WaitEntered();
  gate2.WaitEntered();  // both workers busy, the queue empty
  for (const char* name : {"q1", "q2", "q3"}) {
    ASSERT_TRUE(scheduler.Submit(std::make_unique<Tagged>(name, "", &log)).ok());
  }
  auto refused = std::make_unique<Tagged>("refused", "", &log);
  auto refused_failed = refused->failed.get_future();
  const absl::Status status = scheduler.Submit(std::move(refused));
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(status.message(), "the request queue is full (3 waiting; --queue-size); retry later");
  // Refused at the door: the caller answers it, the scheduler does not.
  EXPECT_TRUE(Abandoned(std::move(refused_failed)));
  gate1.Release();
  gate2.Release();
  scheduler.Shutdown();
  std::multiset<std::string> ran;
  for (const auto& batch : log.batches()) ran.insert(batch.begin(), batch.end());
  EXPECT_EQ(ran, (std::multiset<std::string>{"block1", "block2", "q1", "q2", "q3"}));
}

TEST(SchedulerQueue, ItemsInAnOpenBatchCountAsWaiting) {
  RunLog log;
  std::vector<size_t> depths;
  Scheduler scheduler({.workers = 1, .queue_capacity = 2, .batch_window = kHour},
                      [&](size_t depth) { depths.push_back(depth); });
  ASSERT_TRUE(scheduler.Submit(std::make_unique<Tagged>("k1", "k", &log)).ok());
  ASSERT_TRUE(scheduler.Submit(std::make_unique<Tagged>("k2", "k", &log)).ok());
  // The worker is idle, but two items wait in the open batch.
  EXPECT_EQ(scheduler.Submit(std::make_unique<Tagged>("other", "", &log)).code(),
            absl::StatusCode::kResourceExhausted);
  scheduler.Shutdown();
  EXPECT_EQ(log.batches(), (Batches{{"k1", "k2"}}));
  EXPECT_EQ(depths, (std::vector<size_t>{1, 2, 0}));
}

TEST(SchedulerAnswers, WorkPastItsDeadlineOrCancelledWhileQueuedNeverRuns) {
  RunLog log;
  Gate gate;
  Scheduler scheduler({.workers = 1, .max_batch = 16});
  ASSERT_TRUE(scheduler.Submit(std::make_unique<Tagged>("block", "", &log, gate.Body())).ok());
  gate.WaitEntered();
  // One batch: a1 and a4 run; a2's deadline has passed; a3's client cancels
  // while it waits, an hour before its deadline.
  auto a1 = std::make_unique<Tagged>("a1", "a", &log);
  auto a2 = std::make_unique<Tagged>("a2", "a", &log);
  a2->deadline = Clock::now() - std::chrono::milliseconds(1);
  auto a3 = std::make_unique<Tagged>("a3", "a", &log);
  a3->deadline = Clock::now() + std::chrono::hours(1);
  auto a4 = std::make_unique<Tagged>("a4", "a", &log);
  // Alone, unbatched: cancelled without a deadline.
  auto u = std::make_unique<Tagged>("u", "", &log);
  auto a2_failed = a2->failed.get_future();
  auto a3_failed = a3->failed.get_future();
  auto u_failed = u->failed.get_future();
  auto a1_ran = a1->ran.get_future(), a2_ran = a2->ran.get_future();
  auto a3_ran = a3->ran.get_future(), a4_ran = a4->ran.get_future(), u_ran = u->ran.get_future();
  Tagged* a3_queued = a3.get();
  Tagged* u_queued = u.get();
  for (auto* item : {&a1, &a2, &a3, &a4, &u}) {
    ASSERT_TRUE(scheduler.Submit(std::move(*item)).ok());
  }
  // Queued, not yet looked at: the worker is in the gate.
  a3_queued->cancelled = true;
  u_queued->cancelled = true;
  gate.Release();
  scheduler.Shutdown();

  EXPECT_EQ(log.batches(), (Batches{{"block"}, {"a1", "a4"}}));
  const absl::Status a2_status = a2_failed.get();
  EXPECT_EQ(a2_status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(a2_status.message(),
            "the request's deadline passed while it waited in the queue; it was not computed");
  for (auto* failed : {&a3_failed, &u_failed}) {
    const absl::Status status = failed->get();
    EXPECT_EQ(status.code(), absl::StatusCode::kCancelled);
    EXPECT_EQ(status.message(), "the client cancelled the request before it ran");
  }
  EXPECT_TRUE(Ready(a1_ran));
  EXPECT_TRUE(Ready(a4_ran));
  EXPECT_TRUE(Abandoned(std::move(a2_ran)));
  EXPECT_TRUE(Abandoned(std::move(a3_ran)));
  EXPECT_TRUE(Abandoned(std::move(u_ran)));
}

TEST(SchedulerAnswers, SubmitAfterShutdownIsUnavailable) {
  RunLog log;
  Scheduler scheduler({.workers = 2, .batch_window = kHour});
  scheduler.Shutdown();
  scheduler.Shutdown();  // a second Shutdown (and the destructor's) is a no-op
  for (const char* key : {"", "k"}) {
    const absl::Status status = scheduler.Submit(std::make_unique<Tagged>("late", key, &log));
    EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
    EXPECT_EQ(status.message(), "the daemon is shutting down");
  }
  EXPECT_TRUE(log.batches().empty());
}

// The end of a shutdown's grace: what waits (runnable or in an open batch) is
// answered with the given status and never runs; what runs finishes.
TEST(SchedulerAnswers, CancelQueuedFailsWhatWaitsAndLetsTheRunningFinish) {
  std::atomic<int> ran{0};
  Gate gate;
  Scheduler scheduler({.workers = 1, .queue_capacity = 100, .batch_window = kHour});
  auto running = std::make_unique<Probe>(&ran, gate.Body());
  ASSERT_TRUE(scheduler.Submit(std::move(running)).ok());
  gate.WaitEntered();
  std::vector<std::future<absl::StatusCode>> answers;
  for (int i = 0; i < 6; ++i) {
    auto probe = std::make_unique<Probe>(&ran);
    probe->batch_key = i % 2 == 0 ? "open-batch" : "";  // half wait in an open batch
    answers.push_back(probe->failed.get_future());
    ASSERT_TRUE(scheduler.Submit(std::move(probe)).ok());
  }
  scheduler.Stop();
  EXPECT_EQ(scheduler.CancelQueued(absl::UnavailableError("grace over")), 6u);
  for (auto& answer : answers) EXPECT_EQ(answer.get(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(scheduler.Submit(std::make_unique<Probe>(&ran)).code(), absl::StatusCode::kUnavailable);
  gate.Release();
  scheduler.Shutdown();
  EXPECT_EQ(ran.load(), 1) << "only the item already running ran";
  EXPECT_EQ(scheduler.CancelQueued(absl::UnavailableError("again")), 0u);
}

}  // namespace
}  // namespace mxserve
