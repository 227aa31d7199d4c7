// The energy ledger's promises (server/telemetry/energy_ledger.h), with exact
// values: every amount below is a sum of binary fractions, so float sums are exact.
// The first tests account untagged energy only; the run tests follow.
#include "server/telemetry/energy_ledger.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <tuple>
#include <vector>

namespace mxserve {
namespace {

// A row as a comparable tuple: source, phase, joules, busy seconds, requests.
using Row = std::tuple<std::string, Phase, double, double, uint64_t>;

std::vector<Row> Rows(const EnergyLedger& ledger, double since, const std::string& run = kAllRuns) {
  std::vector<Row> rows;
  for (const EnergyRow& row : ledger.Report(since, run)) {
    rows.emplace_back(row.source, row.phase, row.amount.joules, row.amount.busy_seconds,
                      row.amount.requests);
  }
  return rows;
}

constexpr double kT = 1'700'000'000;  // a Unix time, on a whole second

TEST(EnergyLedger, AnEmptyLedgerReportsNoRows) {
  EnergyLedger ledger;
  EXPECT_TRUE(ledger.Report(0, kAllRuns).empty());
  EXPECT_TRUE(ledger.Report(kT, kAllRuns).empty());
  EXPECT_TRUE(ledger.Report(0, "a").empty());
}

TEST(EnergyLedger, SumsPerSourceAndPhaseSortedBySourceThenPhase) {
  EnergyLedger ledger;
  // Added out of order, sources and phases mixed.
  ledger.Add("gpu_baseline", Phase::kUpdate, kUntagged, kT + 3, {8, 2, 0});
  ledger.Add("fpga_model", Phase::kReward, kUntagged, kT, {1.5, 0.25, 1});
  ledger.Add("fpga", Phase::kRollout, kUntagged, kT + 1, {0.5, 0.125, 1});
  ledger.Add("fpga_model", Phase::kRollout, kUntagged, kT + 1, {2.25, 0.5, 1});
  ledger.Add("fpga_model", Phase::kReward, kUntagged, kT + 2.75, {0.75, 0.5, 2});
  ledger.Add("fpga_model", Phase::kRollout, kUntagged, kT + 1.5,
             {0.25, 0.25, 1});  // the same second
  ledger.Add("gpu_baseline", Phase::kUpdate, kUntagged, kT + 1000, {4, 1, 0});
  EXPECT_EQ(Rows(ledger, 0), (std::vector<Row>{
                                 {"fpga", Phase::kRollout, 0.5, 0.125, 1},
                                 {"fpga_model", Phase::kRollout, 2.5, 0.75, 2},
                                 {"fpga_model", Phase::kReward, 2.25, 0.75, 3},
                                 {"gpu_baseline", Phase::kUpdate, 12, 3, 0},
                             }));
}

TEST(EnergyLedger, SinceIsRoundedDownToTheSecond) {
  EnergyLedger ledger;
  ledger.Add("s", Phase::kRollout, kUntagged, kT + 0.25, {1, 0.5, 1});   // second kT
  ledger.Add("s", Phase::kRollout, kUntagged, kT + 0.875, {2, 0.5, 1});  // second kT
  ledger.Add("s", Phase::kRollout, kUntagged, kT + 1, {4, 0.5, 1});      // second kT + 1
  ledger.Add("s", Phase::kRollout, kUntagged, kT + 2.5, {8, 0.5, 1});    // second kT + 2
  auto joules = [&](double since) { return std::get<2>(Rows(ledger, since).at(0)); };
  EXPECT_EQ(joules(0), 15);  // 0: everything
  EXPECT_EQ(joules(kT - 1), 15);
  EXPECT_EQ(joules(kT), 15);
  // After the first two adds, but in their second: they count.
  EXPECT_EQ(joules(kT + 0.9), 15);
  EXPECT_EQ(joules(kT + 1), 12);
  EXPECT_EQ(joules(kT + 1.999), 12);
  EXPECT_EQ(joules(kT + 2), 8);
  EXPECT_EQ(joules(kT + 2.75), 8);
  // A start after everything: the key is still reported, with nothing in it.
  EXPECT_EQ(Rows(ledger, kT + 3), (std::vector<Row>{{"s", Phase::kRollout, 0, 0, 0}}));
  // Past the range of the seconds (int64) is after everything too, not a wrap
  // around to the beginning.
  EXPECT_EQ(joules(1e300), 0);
}

TEST(EnergyLedger, OldSecondsFoldAndAReportSinceStartStaysExact) {
  EnergyLedger ledger({.retention_seconds = 10});
  ledger.Add("s", Phase::kUpdate, kUntagged, kT, {1, 1, 1});
  ledger.Add("s", Phase::kUpdate, kUntagged, kT + 5, {2, 1, 1});
  ledger.Add("s", Phase::kUpdate, kUntagged, kT + 10, {4, 1, 1});  // kT is not older than 10 s yet
  EXPECT_EQ(Rows(ledger, kT + 1), (std::vector<Row>{{"s", Phase::kUpdate, 6, 2, 2}}));
  // kT + 21: everything before kT + 11 folds into one total (kT, kT + 5, kT + 10).
  ledger.Add("s", Phase::kUpdate, kUntagged, kT + 21, {8, 1, 1});
  EXPECT_EQ(Rows(ledger, 0), (std::vector<Row>{{"s", Phase::kUpdate, 15, 4, 4}}));
  // A start inside the folded part cannot split it: the whole total counts.
  EXPECT_EQ(Rows(ledger, kT + 1), (std::vector<Row>{{"s", Phase::kUpdate, 15, 4, 4}}));
  EXPECT_EQ(Rows(ledger, kT + 10.5), (std::vector<Row>{{"s", Phase::kUpdate, 15, 4, 4}}));
  // From the end of the folded part on, seconds are exact again.
  EXPECT_EQ(Rows(ledger, kT + 11), (std::vector<Row>{{"s", Phase::kUpdate, 8, 1, 1}}));
  EXPECT_EQ(Rows(ledger, kT + 22), (std::vector<Row>{{"s", Phase::kUpdate, 0, 0, 0}}));
}

TEST(EnergyLedger, EachKeyFoldsOnItsOwn) {
  EnergyLedger ledger({.retention_seconds = 10});
  ledger.Add("a", Phase::kRollout, kUntagged, kT, {1, 1, 1});
  ledger.Add("b", Phase::kRollout, kUntagged, kT, {2, 1, 1});
  ledger.Add("a", Phase::kRollout, kUntagged, kT + 100, {4, 1, 1});  // folds a's kT, not b's
  EXPECT_EQ(Rows(ledger, kT + 50),
            (std::vector<Row>{{"a", Phase::kRollout, 4, 1, 1}, {"b", Phase::kRollout, 0, 0, 0}}));
  EXPECT_EQ(Rows(ledger, kT + 0.5),
            (std::vector<Row>{{"a", Phase::kRollout, 5, 2, 2}, {"b", Phase::kRollout, 2, 1, 1}}));
}

TEST(EnergyLedger, ALateAddOfAnOldSecondDoesNotHideTheFoldedTotal) {
  // Power samples may be up to a day old, and several devices report under one
  // (source, phase): a second older than those already folded can fold later.
  EnergyLedger ledger({.retention_seconds = 10});
  ledger.Add("s", Phase::kRollout, kUntagged, kT + 100, {1, 1, 1});
  ledger.Add("s", Phase::kRollout, kUntagged, kT + 200, {2, 1, 1});  // folds kT + 100
  ledger.Add("s", Phase::kRollout, kUntagged, kT + 50, {4, 1, 1});   // late, older still
  ledger.Add("s", Phase::kRollout, kUntagged, kT + 201, {8, 1, 1});  // folds kT + 50
  EXPECT_EQ(Rows(ledger, 0), (std::vector<Row>{{"s", Phase::kRollout, 15, 4, 4}}));
  // kT + 60 is inside the folded part (which reaches kT + 101): the whole
  // total counts, never less than what was accounted since.
  EXPECT_EQ(Rows(ledger, kT + 60), (std::vector<Row>{{"s", Phase::kRollout, 15, 4, 4}}));
  EXPECT_EQ(Rows(ledger, kT + 101), (std::vector<Row>{{"s", Phase::kRollout, 10, 2, 2}}));
}

// ---------------------------------------------------------------------------
// Runs.

// Each (source, phase) of Rows' output summed over `reports`, for comparing an
// all-runs report with the per-run ones.
std::vector<Row> Summed(const std::vector<std::vector<Row>>& reports) {
  std::map<std::tuple<std::string, Phase>, EnergyAmount> sums;
  for (const auto& rows : reports) {
    for (const auto& [source, phase, joules, busy, requests] : rows) {
      sums[{source, phase}].Add({joules, busy, requests});
    }
  }
  std::vector<Row> rows;
  for (const auto& [key, a] : sums) {
    rows.emplace_back(std::get<0>(key), std::get<1>(key), a.joules, a.busy_seconds, a.requests);
  }
  return rows;
}

TEST(EnergyLedgerRuns, ARunsReportHoldsOnlyWhatWasAccountedUnderIt) {
  EnergyLedger ledger;
  ledger.Add("fpga_model", Phase::kRollout, "a", kT, {1, 0.5, 1});
  ledger.Add("fpga_model", Phase::kRollout, "b", kT, {2, 0.25, 1});
  ledger.Add("fpga_model", Phase::kUpdate, "b", kT + 1, {4, 0.125, 1});
  ledger.Add("gpu_baseline", Phase::kRollout, "a", kT + 2, {8, 1, 0});
  ledger.Add("fpga_model", Phase::kRollout, kUntagged, kT + 1, {16, 2, 1});
  EXPECT_EQ(Rows(ledger, 0, "a"), (std::vector<Row>{{"fpga_model", Phase::kRollout, 1, 0.5, 1},
                                                    {"gpu_baseline", Phase::kRollout, 8, 1, 0}}));
  EXPECT_EQ(Rows(ledger, 0, "b"), (std::vector<Row>{{"fpga_model", Phase::kRollout, 2, 0.25, 1},
                                                    {"fpga_model", Phase::kUpdate, 4, 0.125, 1}}));
  // Every run together: per (source, phase), the untagged energy included.
  EXPECT_EQ(Rows(ledger, 0), (std::vector<Row>{{"fpga_model", Phase::kRollout, 19, 2.75, 3},
                                               {"fpga_model", Phase::kUpdate, 4, 0.125, 1},
                                               {"gpu_baseline", Phase::kRollout, 8, 1, 0}}));
  // A run never used has no rows; a tag is matched exactly, not as a prefix.
  EXPECT_TRUE(Rows(ledger, 0, "c").empty());
  EXPECT_TRUE(Rows(ledger, 0, "a/").empty());
  EXPECT_EQ(ledger.run_count(), 2u);  // "a" and "b"; untagged is no run
}

TEST(EnergyLedgerRuns, AllRunsIsTheSumOfEveryRunsReport) {
  EnergyLedger ledger;
  const std::vector<std::string> runs = {"exp/fp16", "exp/policy-B", "exp:3", "x"};
  for (int i = 0; i < 40; ++i) {
    ledger.Add(i % 3 ? "fpga_model" : "gpu_baseline", static_cast<Phase>(i % 3), runs[i % 4],
               kT + i % 5, {0.25 * i, 0.125, static_cast<uint64_t>(i % 2)});
  }
  std::vector<std::vector<Row>> per_run;
  for (const std::string& run : runs) per_run.push_back(Rows(ledger, 0, run));
  EXPECT_EQ(Rows(ledger, 0), Summed(per_run));
  // Untagged energy is in the all-runs report only.
  ledger.Add("fpga_model", Phase::kReward, kUntagged, kT, {100, 1, 1});
  per_run.push_back({{"fpga_model", Phase::kReward, 100, 1, 1}});
  EXPECT_EQ(Rows(ledger, 0), Summed(per_run));
}

TEST(EnergyLedgerRuns, SinceAppliesToARunsReport) {
  EnergyLedger ledger;
  ledger.Add("s", Phase::kRollout, "a", kT + 0.5, {1, 0.5, 1});  // second kT
  ledger.Add("s", Phase::kRollout, "b", kT + 1, {2, 0.5, 1});
  ledger.Add("s", Phase::kRollout, "a", kT + 2, {4, 0.5, 1});
  ledger.Add("s", Phase::kRollout, "a", kT + 3.5, {8, 0.5, 1});
  EXPECT_EQ(Rows(ledger, kT, "a"), (std::vector<Row>{{"s", Phase::kRollout, 13, 1.5, 3}}));
  EXPECT_EQ(Rows(ledger, kT + 0.75, "a"), (std::vector<Row>{{"s", Phase::kRollout, 13, 1.5, 3}}));
  EXPECT_EQ(Rows(ledger, kT + 1, "a"), (std::vector<Row>{{"s", Phase::kRollout, 12, 1, 2}}));
  EXPECT_EQ(Rows(ledger, kT + 3, "a"), (std::vector<Row>{{"s", Phase::kRollout, 8, 0.5, 1}}));
  EXPECT_EQ(Rows(ledger, kT + 4, "a"), (std::vector<Row>{{"s", Phase::kRollout, 0, 0, 0}}));
  EXPECT_EQ(Rows(ledger, kT + 1, "b"), (std::vector<Row>{{"s", Phase::kRollout, 2, 0.5, 1}}));
  EXPECT_EQ(Rows(ledger, kT + 2, "b"), (std::vector<Row>{{"s", Phase::kRollout, 0, 0, 0}}));
  EXPECT_EQ(Rows(ledger, kT + 1), (std::vector<Row>{{"s", Phase::kRollout, 14, 1.5, 3}}));
  EXPECT_EQ(Rows(ledger, 1e300, "a"), (std::vector<Row>{{"s", Phase::kRollout, 0, 0, 0}}));
}

TEST(EnergyLedgerRuns, PastMaxRunsTheLeastRecentRunFoldsIntoUntaggedAndTotalsStayExact) {
  EnergyLedger ledger({.max_runs = 2});
  ledger.Add("fpga_model", Phase::kRollout, "a", kT, {1, 1, 1});
  ledger.Add("fpga_model", Phase::kRollout, "b", kT + 1, {2, 1, 1});
  ledger.Add("gpu_baseline", Phase::kUpdate, "b", kT + 2, {4, 1, 0});
  ledger.Add("fpga_model", Phase::kRollout, kUntagged, kT + 2, {8, 1, 1});  // no run: no effect
  ledger.Add("fpga_model", Phase::kReward, "a", kT + 3, {16, 1, 1});        // a is now the newest
  const std::vector<Row> before = Rows(ledger, 0);
  const std::vector<Row> before_since = Rows(ledger, kT + 2);
  const std::vector<Row> a_before = Rows(ledger, 0, "a");
  ASSERT_EQ(ledger.run_count(), 2u);

  // A third tag: b, the least recently accounted, folds into untagged.
  ledger.Add("fpga_model", Phase::kRollout, "c", kT + 4, {32, 1, 1});
  EXPECT_EQ(ledger.run_count(), 2u);
  EXPECT_TRUE(Rows(ledger, 0, "b").empty());
  EXPECT_EQ(Rows(ledger, 0, "a"), a_before);
  EXPECT_EQ(Rows(ledger, 0, "c"), (std::vector<Row>{{"fpga_model", Phase::kRollout, 32, 1, 1}}));
  // Every run together: what was there plus c, to the bit; b's seconds kept
  // theirs, so `since` still splits them.
  EXPECT_EQ(Rows(ledger, 0), Summed({before, {{"fpga_model", Phase::kRollout, 32, 1, 1}}}));
  EXPECT_EQ(Rows(ledger, kT + 2),
            Summed({before_since, {{"fpga_model", Phase::kRollout, 32, 1, 1}}}));

  // b again is a new run (a folds: c was accounted after it); it starts from nothing.
  ledger.Add("fpga_model", Phase::kRollout, "b", kT + 5, {64, 1, 1});
  EXPECT_EQ(Rows(ledger, 0, "b"), (std::vector<Row>{{"fpga_model", Phase::kRollout, 64, 1, 1}}));
  EXPECT_TRUE(Rows(ledger, 0, "a").empty());
  EXPECT_EQ(Rows(ledger, 0), Summed({before,
                                     {{"fpga_model", Phase::kRollout, 32, 1, 1}},
                                     {{"fpga_model", Phase::kRollout, 64, 1, 1}}}));
}

TEST(EnergyLedgerRuns, AThousandInventedTagsHoldOnlyMaxRuns) {
  EnergyLedger ledger({.max_runs = 4});
  for (int i = 0; i < 1000; ++i) {
    ledger.Add("fpga_model", Phase::kRollout, "hostile-" + std::to_string(i), kT + i, {1, 1, 1});
  }
  EXPECT_EQ(ledger.run_count(), 4u);
  EXPECT_EQ(Rows(ledger, 0), (std::vector<Row>{{"fpga_model", Phase::kRollout, 1000, 1000, 1000}}));
  // The four newest are held; the rest went to the untagged series.
  EXPECT_EQ(Rows(ledger, 0, "hostile-999"),
            (std::vector<Row>{{"fpga_model", Phase::kRollout, 1, 1, 1}}));
  EXPECT_EQ(Rows(ledger, 0, "hostile-996"),
            (std::vector<Row>{{"fpga_model", Phase::kRollout, 1, 1, 1}}));
  EXPECT_TRUE(Rows(ledger, 0, "hostile-995").empty());
}

TEST(EnergyLedgerRuns, PastTheSecondsBudgetTheLeastRecentRunsSecondsFoldAndTotalsStayExact) {
  // 8 one-second buckets for every tagged series together; past them, the least
  // recently accounted runs' buckets fold until 6 are left.
  EnergyLedger ledger({.max_runs = 4, .max_run_seconds = 8});
  for (int i = 0; i < 5; ++i) ledger.Add("s", Phase::kRollout, "old", kT + i, {1, 1, 1});
  for (int i = 0; i < 3; ++i) ledger.Add("s", Phase::kRollout, "new", kT + i, {2, 1, 1});
  EXPECT_EQ(ledger.run_seconds(), 8u);
  // The ninth bucket: "old" (least recent) folds its 5, leaving new's 4.
  ledger.Add("s", Phase::kRollout, "new", kT + 3, {2, 1, 1});
  EXPECT_EQ(ledger.run_seconds(), 4u);
  EXPECT_EQ(Rows(ledger, 0, "old"), (std::vector<Row>{{"s", Phase::kRollout, 5, 5, 5}}));
  EXPECT_EQ(Rows(ledger, 0, "new"), (std::vector<Row>{{"s", Phase::kRollout, 8, 4, 4}}));
  EXPECT_EQ(Rows(ledger, 0), (std::vector<Row>{{"s", Phase::kRollout, 13, 9, 9}}));
  // "old"'s seconds are one total now: a start inside them counts it whole...
  EXPECT_EQ(Rows(ledger, kT + 3, "old"), (std::vector<Row>{{"s", Phase::kRollout, 5, 5, 5}}));
  // ... and one after them nothing; "new" still splits by the second.
  EXPECT_EQ(Rows(ledger, kT + 5, "old"), (std::vector<Row>{{"s", Phase::kRollout, 0, 0, 0}}));
  EXPECT_EQ(Rows(ledger, kT + 3, "new"), (std::vector<Row>{{"s", Phase::kRollout, 2, 1, 1}}));
  // Seconds that fold (retention, the budget) or runs that fold stop counting.
  ledger.Add("s", Phase::kRollout, "x", kT, {1, 1, 1});
  ledger.Add("s", Phase::kRollout, "y", kT, {1, 1, 1});
  ledger.Add("s", Phase::kRollout, "z", kT, {1, 1, 1});  // "old" folds into untagged
  EXPECT_EQ(ledger.run_count(), 4u);
  EXPECT_EQ(ledger.run_seconds(), 7u);
  EXPECT_EQ(Rows(ledger, 0), (std::vector<Row>{{"s", Phase::kRollout, 16, 12, 12}}));
}

// Run ownership (issue 32, item 5): a run is bound to the principal whose
// booking made it; others may neither book into it nor read it, admins may.
const Principal kAlice{"alice", Role::kTrain};
const Principal kBob{"bob", Role::kCompute};
const Principal kRoot{"root", Role::kAdmin};

TEST(EnergyLedgerOwners, ARunIsItsFirstBookersAndOthersAreRefusedNamingTheRun) {
  EnergyLedger ledger;
  EXPECT_TRUE(ledger.CheckRun("exp", kBob, "run").ok());  // not held: anyone may start it
  ledger.Add("fpga_model", Phase::kRollout, "exp", kT, {1, 1, 1}, 1, kAlice);
  EXPECT_TRUE(ledger.CheckRun("exp", kAlice, "run").ok());
  EXPECT_TRUE(ledger.CheckRun("exp", kRoot, "run").ok());
  EXPECT_TRUE(ledger.CheckRun(kUntagged, kBob, "run").ok());
  const absl::Status refused = ledger.CheckRun("exp", kBob, "calls[2].run");
  EXPECT_EQ(refused.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(refused.message(),
            "calls[2].run: run 'exp' belongs to another principal (a run tag is bound to the "
            "principal that first booked into it); choose a tag of your own");
  EXPECT_EQ(refused.message().find("alice"), std::string::npos);  // the owner is not named
  EXPECT_EQ(ledger.runs_of("alice"), 1u);
  EXPECT_EQ(ledger.runs_of("bob"), 0u);
}

TEST(EnergyLedgerOwners, AnotherPrincipalsBookingNeverLandsInTheRunButTotalsStay) {
  EnergyLedger ledger;
  ledger.Add("fpga_model", Phase::kRollout, "exp", kT, {1, 1, 1}, 1, kAlice);
  // Past CheckRun (a race): bob's energy goes to the untagged series.
  ledger.Add("fpga_model", Phase::kRollout, "exp", kT, {2, 1, 1}, 1, kBob);
  EXPECT_EQ(Rows(ledger, 0, "exp"), (std::vector<Row>{{"fpga_model", Phase::kRollout, 1, 1, 1}}));
  EXPECT_EQ(Rows(ledger, 0), (std::vector<Row>{{"fpga_model", Phase::kRollout, 3, 2, 2}}));
  // An admin books into it, and it stays alice's.
  ledger.Add("fpga_model", Phase::kRollout, "exp", kT, {4, 1, 1}, 1, kRoot);
  EXPECT_EQ(Rows(ledger, 0, "exp"), (std::vector<Row>{{"fpga_model", Phase::kRollout, 5, 2, 2}}));
  EXPECT_EQ(ledger.CheckRun("exp", kBob, "run").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(ledger.runs_of("alice"), 1u);
  EXPECT_EQ(ledger.runs_of("root"), 0u);
}

TEST(EnergyLedgerOwners, AFoldedRunIsForgottenWithItsOwner) {
  EnergyLedger ledger({.max_runs = 1});
  ledger.Add("fpga_model", Phase::kRollout, "exp", kT, {1, 1, 1}, 1, kAlice);
  ledger.Add("fpga_model", Phase::kRollout, "other", kT, {2, 1, 1}, 1, kAlice);  // folds exp
  EXPECT_TRUE(ledger.CheckRun("exp", kBob, "run").ok());
  ledger.Add("fpga_model", Phase::kRollout, "exp", kT, {4, 1, 1}, 1, kBob);  // folds alice's other
  EXPECT_EQ(Rows(ledger, 0, "exp"), (std::vector<Row>{{"fpga_model", Phase::kRollout, 4, 1, 1}}));
  EXPECT_EQ(ledger.runs_of("bob"), 1u);
  EXPECT_EQ(ledger.runs_of("alice"), 0u);
}

// Folding is fair: a principal creating tag after tag folds its own least
// recent runs, never those of a principal holding fewer.
TEST(EnergyLedgerOwners, ManyNewTagsOfOnePrincipalFoldItsOwnRunsNotAnothers) {
  EnergyLedger ledger({.max_runs = 4});
  // Alice's run is the least recently accounted of all.
  ledger.Add("fpga_model", Phase::kRollout, "alice-run", kT, {1, 1, 1}, 1, kAlice);
  for (int i = 0; i < 1000; ++i) {
    ledger.Add("fpga_model", Phase::kRollout, "bob-" + std::to_string(i), kT + 1, {2, 1, 1}, 1,
               kBob);
  }
  EXPECT_EQ(ledger.run_count(), 4u);
  EXPECT_EQ(ledger.runs_of("alice"), 1u);
  EXPECT_EQ(ledger.runs_of("bob"), 3u);
  EXPECT_EQ(Rows(ledger, 0, "alice-run"),
            (std::vector<Row>{{"fpga_model", Phase::kRollout, 1, 1, 1}}));
  // Bob's three newest are held, the rest folded; the totals are exact.
  EXPECT_EQ(Rows(ledger, 0, "bob-999"), (std::vector<Row>{{"fpga_model", Phase::kRollout, 2, 1, 1}}));
  EXPECT_EQ(Rows(ledger, 0, "bob-997"), (std::vector<Row>{{"fpga_model", Phase::kRollout, 2, 1, 1}}));
  EXPECT_TRUE(Rows(ledger, 0, "bob-996").empty());
  EXPECT_EQ(Rows(ledger, 0), (std::vector<Row>{{"fpga_model", Phase::kRollout, 2001, 1001, 1001}}));
}

TEST(EnergyLedgerOwners, TheNewcomerFoldsTheLeastRecentRunOfWhoeverHoldsTheMost) {
  EnergyLedger ledger({.max_runs = 4});
  ledger.Add("s", Phase::kRollout, "a1", kT, {1, 1, 1}, 1, kAlice);
  ledger.Add("s", Phase::kRollout, "b1", kT, {1, 1, 1}, 1, kBob);  // the least recent of bob's
  ledger.Add("s", Phase::kRollout, "b2", kT, {1, 1, 1}, 1, kBob);
  ledger.Add("s", Phase::kRollout, "a2", kT, {1, 1, 1}, 1, kAlice);
  ledger.Add("s", Phase::kRollout, "a1", kT, {1, 1, 1}, 1, kAlice);  // a2 is alice's least recent
  // Root holds none; alice and bob two each, and bob's b1 is the least recent
  // run of the two.
  ledger.Add("s", Phase::kRollout, "r1", kT, {1, 1, 1}, 1, kRoot);
  EXPECT_TRUE(Rows(ledger, 0, "b1").empty());
  EXPECT_EQ(ledger.runs_of("alice"), 2u);
  EXPECT_EQ(ledger.runs_of("bob"), 1u);
  EXPECT_EQ(ledger.runs_of("root"), 1u);
  // Now alice holds the most: her least recent run, a2, goes for bob's next one.
  ledger.Add("s", Phase::kRollout, "b3", kT, {1, 1, 1}, 1, kBob);
  EXPECT_TRUE(Rows(ledger, 0, "a2").empty());
  EXPECT_FALSE(Rows(ledger, 0, "a1").empty());
  EXPECT_EQ(ledger.runs_of("alice"), 1u);
  EXPECT_EQ(ledger.runs_of("bob"), 2u);
  // Bob at the most, with root and alice at one: bob's own least recent, b2.
  ledger.Add("s", Phase::kRollout, "b4", kT, {1, 1, 1}, 1, kBob);
  EXPECT_TRUE(Rows(ledger, 0, "b2").empty());
  EXPECT_EQ(ledger.runs_of("bob"), 2u);
  EXPECT_EQ(Rows(ledger, 0), (std::vector<Row>{{"s", Phase::kRollout, 8, 8, 8}}));
}

// ---------------------------------------------------------------------------
// Energy per model (issue 37): totals since start, bounded by max_models.

using ModelRow = std::tuple<std::string, std::string, Phase, double, uint64_t>;

std::vector<ModelRow> ModelRows(const EnergyLedger& ledger) {
  std::vector<ModelRow> rows;
  for (const ModelEnergyRow& row : ledger.ModelReport()) {
    rows.emplace_back(row.model, row.source, row.phase, row.amount.joules, row.amount.requests);
  }
  return rows;
}

TEST(EnergyLedger, ModelsKeepTheirOwnTotalsAndFoldTheLeastRecentPastTheLimit) {
  EnergyLedger ledger(EnergyLedgerLimits{.max_models = 2});
  EXPECT_TRUE(ledger.ModelReport().empty());
  ledger.AddModel("a", "fpga_model", Phase::kRollout, {.joules = 0.5, .requests = 1});
  ledger.AddModel("b", "fpga_model", Phase::kUpdate, {.joules = 0.25, .requests = 1}, 3);
  ledger.AddModel("a", "fpga", Phase::kRollout, {.joules = 2, .requests = 1});
  EXPECT_EQ(ModelRows(ledger),
            (std::vector<ModelRow>{{"a", "fpga", Phase::kRollout, 2, 1},
                                   {"a", "fpga_model", Phase::kRollout, 0.5, 1},
                                   {"b", "fpga_model", Phase::kUpdate, 0.75, 3}}));
  EXPECT_EQ(ledger.model_count(), 2u);
  // A third model folds b, the least recently booked, into the other-models rows.
  ledger.AddModel("c", "fpga_model", Phase::kUpdate, {.joules = 1, .requests = 1});
  EXPECT_EQ(ModelRows(ledger),
            (std::vector<ModelRow>{{kOtherModels, "fpga_model", Phase::kUpdate, 0.75, 3},
                                   {"a", "fpga", Phase::kRollout, 2, 1},
                                   {"a", "fpga_model", Phase::kRollout, 0.5, 1},
                                   {"c", "fpga_model", Phase::kUpdate, 1, 1}}));
  EXPECT_EQ(ledger.model_count(), 2u);
  // b again starts anew (and folds a); the other-models rows add up.
  ledger.AddModel("b", "fpga_model", Phase::kUpdate, {.joules = 0.125, .requests = 1});
  EXPECT_EQ(ModelRows(ledger),
            (std::vector<ModelRow>{{kOtherModels, "fpga", Phase::kRollout, 2, 1},
                                   {kOtherModels, "fpga_model", Phase::kRollout, 0.5, 1},
                                   {kOtherModels, "fpga_model", Phase::kUpdate, 0.75, 3},
                                   {"b", "fpga_model", Phase::kUpdate, 0.125, 1},
                                   {"c", "fpga_model", Phase::kUpdate, 1, 1}}));
  // The per-model table is its own: the run ledger saw none of it.
  EXPECT_TRUE(ledger.Report(0, kAllRuns).empty());
}

}  // namespace
}  // namespace mxserve
