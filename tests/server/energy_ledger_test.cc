// The energy ledger's promises (server/telemetry/energy_ledger.h), with exact
// values: every amount below is a sum of binary fractions, so float sums are exact.
#include "server/telemetry/energy_ledger.h"

#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <vector>

namespace mxserve {
namespace {

// A row as a comparable tuple: source, phase, joules, busy seconds, requests.
using Row = std::tuple<std::string, Phase, double, double, uint64_t>;

std::vector<Row> Rows(const EnergyLedger& ledger, double since) {
  std::vector<Row> rows;
  for (const EnergyRow& row : ledger.Report(since)) {
    rows.emplace_back(row.source, row.phase, row.amount.joules, row.amount.busy_seconds,
                      row.amount.requests);
  }
  return rows;
}

constexpr double kT = 1'700'000'000;  // a Unix time, on a whole second

TEST(EnergyLedger, AnEmptyLedgerReportsNoRows) {
  EnergyLedger ledger;
  EXPECT_TRUE(ledger.Report(0).empty());
  EXPECT_TRUE(ledger.Report(kT).empty());
}

TEST(EnergyLedger, SumsPerSourceAndPhaseSortedBySourceThenPhase) {
  EnergyLedger ledger;
  // Added out of order, sources and phases mixed.
  ledger.Add("gpu_baseline", Phase::kUpdate, kT + 3, {8, 2, 0});
  ledger.Add("fpga_model", Phase::kReward, kT, {1.5, 0.25, 1});
  ledger.Add("fpga", Phase::kRollout, kT + 1, {0.5, 0.125, 1});
  ledger.Add("fpga_model", Phase::kRollout, kT + 1, {2.25, 0.5, 1});
  ledger.Add("fpga_model", Phase::kReward, kT + 2.75, {0.75, 0.5, 2});
  ledger.Add("fpga_model", Phase::kRollout, kT + 1.5, {0.25, 0.25, 1});  // the same second
  ledger.Add("gpu_baseline", Phase::kUpdate, kT + 1000, {4, 1, 0});
  EXPECT_EQ(Rows(ledger, 0), (std::vector<Row>{
                                 {"fpga", Phase::kRollout, 0.5, 0.125, 1},
                                 {"fpga_model", Phase::kRollout, 2.5, 0.75, 2},
                                 {"fpga_model", Phase::kReward, 2.25, 0.75, 3},
                                 {"gpu_baseline", Phase::kUpdate, 12, 3, 0},
                             }));
}

TEST(EnergyLedger, SinceIsRoundedDownToTheSecond) {
  EnergyLedger ledger;
  ledger.Add("s", Phase::kRollout, kT + 0.25, {1, 0.5, 1});   // second kT
  ledger.Add("s", Phase::kRollout, kT + 0.875, {2, 0.5, 1});  // second kT
  ledger.Add("s", Phase::kRollout, kT + 1, {4, 0.5, 1});      // second kT + 1
  ledger.Add("s", Phase::kRollout, kT + 2.5, {8, 0.5, 1});    // second kT + 2
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
  EnergyLedger ledger(/*retention_seconds=*/10);
  ledger.Add("s", Phase::kUpdate, kT, {1, 1, 1});
  ledger.Add("s", Phase::kUpdate, kT + 5, {2, 1, 1});
  ledger.Add("s", Phase::kUpdate, kT + 10, {4, 1, 1});  // kT is not older than 10 s yet
  EXPECT_EQ(Rows(ledger, kT + 1), (std::vector<Row>{{"s", Phase::kUpdate, 6, 2, 2}}));
  // kT + 21: everything before kT + 11 folds into one total (kT, kT + 5, kT + 10).
  ledger.Add("s", Phase::kUpdate, kT + 21, {8, 1, 1});
  EXPECT_EQ(Rows(ledger, 0), (std::vector<Row>{{"s", Phase::kUpdate, 15, 4, 4}}));
  // A start inside the folded part cannot split it: the whole total counts.
  EXPECT_EQ(Rows(ledger, kT + 1), (std::vector<Row>{{"s", Phase::kUpdate, 15, 4, 4}}));
  EXPECT_EQ(Rows(ledger, kT + 10.5), (std::vector<Row>{{"s", Phase::kUpdate, 15, 4, 4}}));
  // From the end of the folded part on, seconds are exact again.
  EXPECT_EQ(Rows(ledger, kT + 11), (std::vector<Row>{{"s", Phase::kUpdate, 8, 1, 1}}));
  EXPECT_EQ(Rows(ledger, kT + 22), (std::vector<Row>{{"s", Phase::kUpdate, 0, 0, 0}}));
}

TEST(EnergyLedger, EachKeyFoldsOnItsOwn) {
  EnergyLedger ledger(/*retention_seconds=*/10);
  ledger.Add("a", Phase::kRollout, kT, {1, 1, 1});
  ledger.Add("b", Phase::kRollout, kT, {2, 1, 1});
  ledger.Add("a", Phase::kRollout, kT + 100, {4, 1, 1});  // folds a's kT, not b's
  EXPECT_EQ(Rows(ledger, kT + 50),
            (std::vector<Row>{{"a", Phase::kRollout, 4, 1, 1}, {"b", Phase::kRollout, 0, 0, 0}}));
  EXPECT_EQ(Rows(ledger, kT + 0.5),
            (std::vector<Row>{{"a", Phase::kRollout, 5, 2, 2}, {"b", Phase::kRollout, 2, 1, 1}}));
}

TEST(EnergyLedger, ALateAddOfAnOldSecondDoesNotHideTheFoldedTotal) {
  // Power samples may be up to a day old, and several devices report under one
  // (source, phase): a second older than those already folded can fold later.
  EnergyLedger ledger(/*retention_seconds=*/10);
  ledger.Add("s", Phase::kRollout, kT + 100, {1, 1, 1});
  ledger.Add("s", Phase::kRollout, kT + 200, {2, 1, 1});  // folds kT + 100
  ledger.Add("s", Phase::kRollout, kT + 50, {4, 1, 1});   // late, older still
  ledger.Add("s", Phase::kRollout, kT + 201, {8, 1, 1});  // folds kT + 50
  EXPECT_EQ(Rows(ledger, 0), (std::vector<Row>{{"s", Phase::kRollout, 15, 4, 4}}));
  // kT + 60 is inside the folded part (which reaches kT + 101): the whole
  // total counts, never less than what was accounted since.
  EXPECT_EQ(Rows(ledger, kT + 60), (std::vector<Row>{{"s", Phase::kRollout, 15, 4, 4}}));
  EXPECT_EQ(Rows(ledger, kT + 101), (std::vector<Row>{{"s", Phase::kRollout, 10, 2, 2}}));
}

}  // namespace
}  // namespace mxserve
