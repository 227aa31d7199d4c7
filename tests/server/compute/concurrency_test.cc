// The daemon's shared state under many threads, without a daemon: what
// `make test-tsan` runs under ThreadSanitizer (with the scheduler's tests).
//
// Requests take quantized copies while uploads publish new weight versions into
// a budget so tight that copies are evicted all the time; at the end every
// byte is accounted for. The energy ledger is written and read at once.
#include <gtest/gtest.h>

#include <atomic>
#include <random>
#include <thread>
#include <vector>

#include "server/compute/backends/backend.h"
#include "server/model/memory_budget.h"
#include "server/model/registry.h"
#include "server/telemetry/energy_ledger.h"

namespace mxserve {
namespace {

constexpr int64_t kOut = 64, kIn = 128;
constexpr uint64_t kMasterBytes = kOut * kIn * sizeof(float);

StoredTensor Master(MemoryBudget& budget, uint32_t seed) {
  StoredTensor t;
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  t.values.resize(kOut * kIn);
  for (float& v : t.values) v = normal(rng);
  // Readers may still hold older versions (masters and copies) for a moment;
  // they let go on their next lookup, and evictions make room for the rest.
  while (!ReserveInto(budget, kMasterBytes, "master", t.reservation).ok()) {
    std::this_thread::yield();
  }
  return t;
}

TEST(Concurrency, CopiesUploadsAndEvictionsKeepTheBudgetExact) {
  // Two masters (a version and the next being staged) and room for four
  // masters' worth of copies. The eight copies (4 formats, 2 layouts; a BF16
  // copy is as large as the master) need more, so copies are evicted all the
  // time; readers briefly pin older versions, which the next master waits out.
  MemoryBudget budget(6 * kMasterBytes);
  std::atomic<int> evictions{0};
  {
    std::unique_ptr<Backend> cpu = MakeCpuBackend({});
    Registry registry(
        &budget, [&](mx::QuantizedMatrix w) { return cpu->PrepareWeight(std::move(w)); },
        [&](int n) { evictions += n; });
    ASSERT_TRUE(registry.Register("m", {{"fc", kOut, kIn, false}}, "D-phase-adaptive").ok());
    std::vector<std::pair<StagedTensorKey, StoredTensor>> first;
    first.emplace_back(StagedTensorKey{"fc", false}, Master(budget, 1));
    ASSERT_TRUE(registry.Stage("m", std::move(first), /*publish=*/true).ok());

    std::atomic<bool> stop{false};
    std::atomic<int> served{0}, refused{0};
    std::vector<std::thread> readers;
    const mx::Format formats[] = {mx::Format::kMxfp4E2m1, mx::Format::kMxfp8E4m3, mx::Format::kBf16,
                                  mx::Format::kMxint8};
    for (int t = 0; t < 3; ++t) {
      readers.emplace_back([&, t] {
        for (int i = 0; !stop.load(); ++i) {
          absl::StatusOr<LayerView> view = registry.Lookup("m", "fc", 0);
          ASSERT_TRUE(view.ok()) << view.status();
          const mx::Format f = formats[(t + i) % 4];
          auto copy = view->weights->Get(
              f, i % 3 ? WeightLayout::kForward : WeightLayout::kTransposed, budget);
          if (copy.ok()) {
            EXPECT_EQ(copy->weight->format(), f);
            ++served;
          } else {
            EXPECT_EQ(copy.status().code(), absl::StatusCode::kResourceExhausted);
            ++refused;
          }
        }
      });
    }
    for (uint32_t version = 2; version <= 40; ++version) {
      // Every version is read a few times before the next replaces it, however
      // the threads are scheduled (on a loaded machine the publishes could
      // otherwise all finish before a reader ran).
      const int reads = served.load() + refused.load();
      while (served.load() + refused.load() < reads + 8) std::this_thread::yield();
      std::vector<std::pair<StagedTensorKey, StoredTensor>> next;
      next.emplace_back(StagedTensorKey{"fc", false}, Master(budget, version));
      EXPECT_TRUE(registry.Stage("m", std::move(next), /*publish=*/true).ok());
    }
    stop = true;
    for (auto& r : readers) r.join();
    EXPECT_GT(served.load(), 0);
    EXPECT_GT(evictions.load(), 0);
    EXPECT_LE(budget.used(), budget.limit());
    // What the registry says it holds is what the budget has reserved, and
    // deleting the model gives all of it back.
    const uint64_t held = budget.used();
    EXPECT_EQ(registry.Describe("m")->bytes, held);
    EXPECT_EQ(registry.Delete("m").value(), held);
    EXPECT_EQ(budget.used(), 0u);
  }
  EXPECT_EQ(budget.used(), 0u);  // every reservation went back
}

TEST(Concurrency, TheLedgerAddsUpWhileItIsRead) {
  // Eight run tags and room for three, and a small bucket budget: runs fold
  // into the untagged series and their seconds into totals while others add.
  EnergyLedger ledger({.retention_seconds = 5, .max_runs = 3, .max_run_seconds = 64});
  constexpr int kThreads = 4, kAdds = 5000, kRuns = 8;
  std::atomic<bool> stop{false};
  std::thread reader([&] {
    for (int i = 0; !stop.load(); ++i) {
      for (const EnergyRow& row : ledger.Report(0, i % 2 ? kAllRuns : "run-1")) {
        EXPECT_GE(row.amount.joules, 0);
      }
    }
  });
  std::vector<std::thread> writers;
  for (int t = 0; t < kThreads; ++t) {
    writers.emplace_back([&, t] {
      for (int i = 0; i < kAdds; ++i) {
        // Seconds far apart, so old ones fold into the per-key total meanwhile.
        const std::string run = i % (kRuns + 1) == 0 ? "" : "run-" + std::to_string(i % kRuns);
        ledger.Add("source", static_cast<Phase>(t % 3), run, 1e9 + i,
                   {.joules = 0.5, .busy_seconds = 0.25, .requests = 1});
      }
    });
  }
  for (auto& w : writers) w.join();
  stop = true;
  reader.join();
  double joules = 0;
  uint64_t requests = 0;
  for (const EnergyRow& row : ledger.Report(0, kAllRuns)) {
    joules += row.amount.joules;
    requests += row.amount.requests;
  }
  EXPECT_EQ(requests, uint64_t{kThreads} * kAdds);
  EXPECT_DOUBLE_EQ(joules, 0.5 * kThreads * kAdds);
  EXPECT_LE(ledger.run_count(), 3u);
  EXPECT_LE(ledger.run_seconds(), 64u);
}

}  // namespace
}  // namespace mxserve
