// The weight memory budget (server/model/memory_budget.h): reservations are
// exact, a refusal names the limit, and the reclaimer is asked to make room.
#include "server/model/memory_budget.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace mxserve {
namespace {

std::string Refusal(absl::string_view what, uint64_t bytes, uint64_t limit, uint64_t used) {
  return absl::StrCat(what, " needs ", bytes, " bytes, but the weight memory limit is ", limit,
                      " bytes and ", used,
                      " are in use (--weight-memory-bytes; copies in use by running requests "
                      "cannot be evicted)");
}

TEST(MemoryBudget, ReservesUpToTheLimitExactlyAndReleases) {
  MemoryBudget budget(100);
  EXPECT_EQ(budget.limit(), 100u);
  ASSERT_TRUE(budget.Reserve(60, "w1").ok());
  ASSERT_TRUE(budget.Reserve(40, "w2").ok());  // exactly full
  EXPECT_EQ(budget.used(), 100u);
  EXPECT_TRUE(budget.Reserve(0, "nothing").ok());
  EXPECT_TRUE(budget.Fits(0));
  EXPECT_FALSE(budget.Fits(1));
  const absl::Status refused = budget.Reserve(1, "layer l of model m");
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(refused.message(), Refusal("layer l of model m", 1, 100, 100));
  EXPECT_EQ(budget.used(), 100u);  // a refusal reserves nothing
  budget.Release(40);
  EXPECT_EQ(budget.used(), 60u);
  EXPECT_TRUE(budget.Fits(40));
  EXPECT_FALSE(budget.Fits(41));
  budget.Release(60);
  EXPECT_EQ(budget.used(), 0u);
}

TEST(MemoryBudget, MoreThanTheLimitIsRefusedWithoutOverflow) {
  MemoryBudget budget(100);
  ASSERT_TRUE(budget.Reserve(10, "w").ok());
  constexpr uint64_t kHuge = std::numeric_limits<uint64_t>::max();
  EXPECT_FALSE(budget.Fits(101));
  EXPECT_FALSE(budget.Fits(kHuge));  // used + bytes would wrap around
  const absl::Status refused = budget.Reserve(kHuge, "w");
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(refused.message(), Refusal("w", kHuge, 100, 10));
  EXPECT_EQ(budget.used(), 10u);
  MemoryBudget none(0);
  EXPECT_TRUE(none.Reserve(0, "w").ok());
  EXPECT_EQ(none.Reserve(1, "w").message(), Refusal("w", 1, 0, 0));
}

TEST(MemoryBudget, AReservationReleasesItsBytesOnceWhenItGoes) {
  MemoryBudget budget(100);
  {
    Reservation a;
    ASSERT_TRUE(ReserveInto(budget, 30, "a", a).ok());
    EXPECT_EQ(a.bytes(), 30u);
    EXPECT_EQ(budget.used(), 30u);
    Reservation b(std::move(a));  // the bytes move along, counted once
    EXPECT_EQ(a.bytes(), 0u);     // NOLINT(bugprone-use-after-move): moved-from is empty
    EXPECT_EQ(b.bytes(), 30u);
    EXPECT_EQ(budget.used(), 30u);
    Reservation c;
    ASSERT_TRUE(ReserveInto(budget, 50, "c", c).ok());
    EXPECT_EQ(budget.used(), 80u);
    c = std::move(b);  // c's own 50 bytes go back; b's 30 are c's now
    EXPECT_EQ(c.bytes(), 30u);
    EXPECT_EQ(budget.used(), 30u);
    Reservation& same = c;
    c = std::move(same);  // moving onto itself keeps it
    EXPECT_EQ(c.bytes(), 30u);
    EXPECT_EQ(budget.used(), 30u);
  }
  EXPECT_EQ(budget.used(), 0u);
}

TEST(MemoryBudget, AFailedReserveIntoLeavesTheOldReservation) {
  MemoryBudget budget(100);
  Reservation r;
  ASSERT_TRUE(ReserveInto(budget, 70, "old", r).ok());
  const absl::Status refused = ReserveInto(budget, 40, "new", r);
  EXPECT_EQ(refused.message(), Refusal("new", 40, 100, 70));
  EXPECT_EQ(r.bytes(), 70u);
  EXPECT_EQ(budget.used(), 70u);
}

TEST(MemoryBudget, TheReclaimerIsAskedOnceToMakeRoom) {
  MemoryBudget budget(100);
  ASSERT_TRUE(budget.Reserve(90, "cached copies").ok());
  std::vector<uint64_t> asked;
  std::vector<std::string> first;  // whose copies it was told to evict first
  uint64_t frees = 0;  // what the reclaimer frees when asked
  budget.SetReclaimer([&](uint64_t bytes, absl::string_view whose) {
    asked.push_back(bytes);
    first.emplace_back(whose);
    budget.Release(frees);
  });
  // Fits: the reclaimer is not asked.
  ASSERT_TRUE(budget.Reserve(10, "w").ok());
  EXPECT_TRUE(asked.empty());
  // Does not fit: asked for the bytes needed, and what it frees is used.
  frees = 30;
  ASSERT_TRUE(budget.Reserve(25, "w", "alice").ok());
  EXPECT_EQ(asked, (std::vector<uint64_t>{25}));
  EXPECT_EQ(first, (std::vector<std::string>{"alice"}));  // passed on as given
  EXPECT_EQ(budget.used(), 95u);
  // Freeing too little: asked once, then refused with what is in use after it.
  frees = 5;
  const absl::Status refused = budget.Reserve(20, "w");
  EXPECT_EQ(asked, (std::vector<uint64_t>{25, 20}));
  EXPECT_EQ(first, (std::vector<std::string>{"alice", ""}));
  EXPECT_EQ(refused.message(), Refusal("w", 20, 100, 90));
  EXPECT_EQ(budget.used(), 90u);
  // More than the limit: no reclaiming can help, so it is not asked.
  EXPECT_EQ(budget.Reserve(101, "w").code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(asked.size(), 2u);
}

TEST(MemoryBudget, MakeRoomAsksTheReclaimerOnlyWhenNeeded) {
  MemoryBudget budget(100);
  EXPECT_TRUE(budget.MakeRoom(100));  // no reclaimer, fits
  EXPECT_FALSE(budget.MakeRoom(101));
  ASSERT_TRUE(budget.Reserve(80, "cached copies").ok());
  EXPECT_FALSE(budget.MakeRoom(30));  // no reclaimer, does not fit
  std::vector<uint64_t> asked;
  budget.SetReclaimer([&](uint64_t bytes, absl::string_view) {
    asked.push_back(bytes);
    budget.Release(10);
  });
  EXPECT_TRUE(budget.MakeRoom(20));  // fits already
  EXPECT_TRUE(asked.empty());
  EXPECT_TRUE(budget.MakeRoom(30));  // after the reclaimer freed 10
  EXPECT_EQ(asked, (std::vector<uint64_t>{30}));
  EXPECT_EQ(budget.used(), 70u);      // making room reserves nothing
  EXPECT_FALSE(budget.MakeRoom(50));  // freed 10 more: 40 free, not 50
  EXPECT_EQ(asked, (std::vector<uint64_t>{30, 50}));
  EXPECT_FALSE(budget.MakeRoom(101));  // never fits: not asked
  EXPECT_EQ(asked.size(), 2u);
}

}  // namespace
}  // namespace mxserve
