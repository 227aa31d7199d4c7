// The exact multiple-choice knapsack: against brute force on small instances,
// at the bound's edge, on malformed input, and on a model-sized instance.
#include "server/profile/knapsack.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <optional>
#include <random>
#include <vector>

namespace mxserve {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

using Items = std::vector<KnapsackItem>;

// The optimum by enumeration: least Σf with Σg <= bound, ties to the least Σg;
// g and f name the constrained and the minimized value. Sums in item order.
struct Best {
  bool feasible = false;
  double f = 0;
  double g = 0;
};

Best BruteForce(const Items& items, double bound, bool bound_on_cost) {
  Best best;
  std::vector<std::size_t> pick(items.size(), 0);
  while (true) {
    double g = 0, f = 0;
    for (std::size_t i = 0; i < items.size(); ++i) {
      const double cost = items[i].cost[pick[i]], score = items[i].score[pick[i]];
      g += bound_on_cost ? cost : score;
      f += bound_on_cost ? score : cost;
    }
    if (g <= bound && (!best.feasible || f < best.f || (f == best.f && g < best.g))) {
      best = {true, f, g};
    }
    std::size_t i = 0;
    while (i < items.size() && ++pick[i] == items[i].cost.size()) pick[i++] = 0;
    if (i == items.size()) return best;
  }
}

// The solution's sums, re-added in item order.
void ExpectConsistent(const Items& items, const KnapsackSolution& s) {
  ASSERT_EQ(s.choice.size(), items.size());
  double cost = 0, score = 0;
  for (std::size_t i = 0; i < items.size(); ++i) {
    ASSERT_GE(s.choice[i], 0);
    ASSERT_LT(static_cast<std::size_t>(s.choice[i]), items[i].cost.size());
    cost += items[i].cost[s.choice[i]];
    score += items[i].score[s.choice[i]];
  }
  EXPECT_EQ(s.cost, cost);
  EXPECT_EQ(s.score, score);
}

// A random value of one of several kinds: ties, zeros, decimals that do not
// add exactly in binary, plain reals, forty decades of magnitude, values whose
// sums overflow to infinity, and powers of two with denormals among them.
double RandomValue(std::mt19937_64& rng, int kind) {
  std::uniform_int_distribution<int> small(0, 4);
  std::uniform_real_distribution<double> real(0, 10);
  switch (kind) {
    case 0:
      return small(rng);
    case 1:
      return 0.1 * small(rng);
    case 2:
      return small(rng) == 0 ? 0.0 : real(rng);
    case 3:
      return std::pow(10.0, std::uniform_real_distribution<double>(-20, 20)(rng));
    case 4:
      return small(rng) * 4e307;
    case 5:
      return small(rng) == 0 ? 5e-324 * small(rng) : std::ldexp(1.0, small(rng)) + 0.1 * small(rng);
    default:
      return real(rng);
  }
}

Items RandomItems(std::mt19937_64& rng, int max_items, int max_choices) {
  const int n = std::uniform_int_distribution<int>(1, max_items)(rng);
  const int kind = std::uniform_int_distribution<int>(0, 6)(rng);
  Items items(n);
  for (KnapsackItem& item : items) {
    const int m = std::uniform_int_distribution<int>(1, max_choices)(rng);
    for (int j = 0; j < m; ++j) {
      item.cost.push_back(RandomValue(rng, kind));
      item.score.push_back(RandomValue(rng, kind));
    }
  }
  return items;
}

// Bounds worth trying: every exact sum of a few random assignments (the
// boundary), values between, below the least and above the most.
std::vector<double> Bounds(std::mt19937_64& rng, const Items& items, bool on_cost) {
  std::vector<double> bounds = {-1, 0, kInf};
  for (int t = 0; t < 4; ++t) {
    double sum = 0;
    for (const KnapsackItem& item : items) {
      const std::vector<double>& v = on_cost ? item.cost : item.score;
      sum += v[std::uniform_int_distribution<std::size_t>(0, v.size() - 1)(rng)];
    }
    bounds.push_back(sum);
    bounds.push_back(std::nextafter(sum, -kInf));
    bounds.push_back(sum * std::uniform_real_distribution<double>(0.5, 1.5)(rng));
  }
  return bounds;
}

void CheckAgainstBruteForce(const Items& items, double bound, bool on_cost,
                            const KnapsackOptions& options) {
  SCOPED_TRACE(testing::Message() << (on_cost ? "budget " : "score bound ") << bound);
  const absl::StatusOr<std::optional<KnapsackSolution>> got =
      on_cost ? MinScoreWithinBudget(items, bound, options)
              : MinCostWithinScore(items, bound, options);
  ASSERT_TRUE(got.ok()) << got.status();
  const Best want = BruteForce(items, bound, on_cost);
  ASSERT_EQ(got->has_value(), want.feasible);
  if (!want.feasible) return;
  const KnapsackSolution& s = **got;
  ExpectConsistent(items, s);
  EXPECT_LE(on_cost ? s.cost : s.score, bound);
  EXPECT_EQ(on_cost ? s.score : s.cost, want.f);  // the optimum, exactly
  EXPECT_EQ(on_cost ? s.cost : s.score, want.g);  // and the tie-break
}

TEST(Knapsack, EqualsBruteForceOnSmallInstances) {
  std::mt19937_64 rng(20240611);
  for (int trial = 0; trial < 400; ++trial) {
    SCOPED_TRACE(testing::Message() << "trial " << trial);
    const Items items = RandomItems(rng, 8, 5);
    for (const bool on_cost : {true, false}) {
      for (const double bound : Bounds(rng, items, on_cost)) {
        CheckAgainstBruteForce(items, bound, on_cost, {});
        if (testing::Test::HasFatalFailure()) return;
      }
    }
  }
}

TEST(Knapsack, BoundsAgreeWithThePlainParetoProgram) {
  // Too many items for enumeration; the unbounded dynamic program is exact too.
  std::mt19937_64 rng(7);
  KnapsackOptions plain;
  plain.bound_by_relaxation = false;
  KnapsackOptions sparse;  // relaxation tables only every few items
  sparse.max_table_entries = 16;
  for (int trial = 0; trial < 40; ++trial) {
    SCOPED_TRACE(testing::Message() << "trial " << trial);
    Items items = RandomItems(rng, 40, 6);
    for (const bool on_cost : {true, false}) {
      for (const double bound : Bounds(rng, items, on_cost)) {
        const auto fast =
            on_cost ? MinScoreWithinBudget(items, bound) : MinCostWithinScore(items, bound);
        const auto slow = on_cost ? MinScoreWithinBudget(items, bound, plain)
                                  : MinCostWithinScore(items, bound, plain);
        const auto strided = on_cost ? MinScoreWithinBudget(items, bound, sparse)
                                     : MinCostWithinScore(items, bound, sparse);
        ASSERT_TRUE(fast.ok() && slow.ok() && strided.ok());
        ASSERT_EQ(fast->has_value(), slow->has_value());
        ASSERT_EQ(strided->has_value(), slow->has_value());
        if (!fast->has_value()) continue;
        EXPECT_EQ((*fast)->cost, (*slow)->cost);
        EXPECT_EQ((*fast)->score, (*slow)->score);
        EXPECT_EQ((*strided)->cost, (*slow)->cost);
        EXPECT_EQ((*strided)->score, (*slow)->score);
      }
    }
  }
}

TEST(Knapsack, NeverExceedsTheBudgetAsSummedInItemOrder) {
  // 0.1 + 0.2 + 0.3 is 0.6000000000000001 in item order: over a budget of 0.6.
  const Items items = {{{0.1}, {1}}, {{0.2}, {1}}, {{0.3}, {1}}};
  EXPECT_EQ(MinScoreWithinBudget(items, 0.6).value(), std::nullopt);
  EXPECT_TRUE(MinScoreWithinBudget(items, 0.1 + 0.2 + 0.3).value().has_value());
  // With a way out, the solver takes it rather than round its way in.
  const Items choice = {{{0.1, 0.0}, {0, 1}}, {{0.2}, {0}}, {{0.3}, {0}}};
  const auto s = MinScoreWithinBudget(choice, 0.6).value();
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->choice, (std::vector<int>{1, 0, 0}));
  EXPECT_EQ(s->score, 1);
  const auto t =
      MinCostWithinScore(Items{{{1}, {0.1}}, {{1}, {0.2}}, {{1, 2}, {0.3, 0.0}}}, 0.6).value();
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->choice, (std::vector<int>{0, 0, 1}));
}

TEST(Knapsack, BoundEqualToAnAchievableSumIsMet) {
  const Items items = {{{1, 2, 3}, {9, 5, 1}}, {{1.5, 2.5}, {4, 3}}};
  const auto s = MinScoreWithinBudget(items, 4.5).value();
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->choice, (std::vector<int>{2, 0}));
  EXPECT_EQ(s->cost, 4.5);
  EXPECT_EQ(s->score, 5);
  EXPECT_EQ(MinScoreWithinBudget(items, std::nextafter(4.5, 0)).value()->score, 9);
  const auto t = MinCostWithinScore(items, 5).value();
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->choice, (std::vector<int>{2, 0}));
  EXPECT_EQ(t->score, 5);
  EXPECT_EQ(t->cost, 4.5);
  EXPECT_EQ(MinCostWithinScore(items, std::nextafter(5.0, 0)).value()->cost, 5.5);
}

TEST(Knapsack, InfeasibleIsNullopt) {
  const Items items = {{{2, 3}, {1, 0}}, {{1}, {0}}};
  EXPECT_EQ(MinScoreWithinBudget(items, 2.9).value(), std::nullopt);
  EXPECT_EQ(MinScoreWithinBudget(items, -kInf).value(), std::nullopt);
  EXPECT_EQ(MinCostWithinScore(items, -0.5).value(), std::nullopt);
  EXPECT_TRUE(MinScoreWithinBudget(items, 3).value().has_value());
  EXPECT_TRUE(MinCostWithinScore(items, 0).value().has_value());
}

TEST(Knapsack, NoItemsIsTheEmptySolution) {
  const auto s = MinScoreWithinBudget({}, 0).value();
  ASSERT_TRUE(s.has_value());
  EXPECT_TRUE(s->choice.empty());
  EXPECT_EQ(s->cost, 0);
  EXPECT_EQ(s->score, 0);
  EXPECT_TRUE(MinCostWithinScore({}, 0).value().has_value());
  EXPECT_EQ(MinScoreWithinBudget({}, -1).value(), std::nullopt);
}

TEST(Knapsack, UnboundedTakesTheBestOfEachItem) {
  const Items items = {{{1, 2, 3}, {5, 4, 4}}, {{0, 7}, {2, 1}}};
  const auto s = MinScoreWithinBudget(items, kInf).value();
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->choice, (std::vector<int>{1, 1}));  // score 4 at the lower cost
  const auto t = MinCostWithinScore(items, kInf).value();
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->choice, (std::vector<int>{0, 0}));
}

TEST(Knapsack, MalformedItemsNameTheField) {
  struct Case {
    Items items;
    const char* field;
  };
  const std::vector<Case> cases = {
      {{{{1}, {1}}, {{}, {}}}, "items[1] has no choices"},
      {{{{1, 2}, {1}}}, "items[0] has 2 costs but 1 scores"},
      {{{{1}, {1}}, {{1, 2, -1}, {0, 0, 0}}}, "items[1].cost[2] is negative"},
      {{{{1, kNaN}, {0, 0}}}, "items[0].cost[1] is NaN"},
      {{{{1}, {kInf}}}, "items[0].score[0] is infinite"},
      {{{{1}, {1}}, {{1}, {1}}, {{0, 1}, {1, -kInf}}}, "items[2].score[1] is infinite"},
      {{{{1}, {-1e-300}}}, "items[0].score[0] is negative"},
  };
  for (const Case& c : cases) {
    for (const bool on_cost : {true, false}) {
      const auto got =
          on_cost ? MinScoreWithinBudget(c.items, 10) : MinCostWithinScore(c.items, 10);
      ASSERT_FALSE(got.ok()) << c.field;
      EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_NE(got.status().message().find(c.field), std::string::npos) << got.status();
    }
  }
  const Items fine = {{{1}, {1}}};
  EXPECT_EQ(MinScoreWithinBudget(fine, kNaN).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MinCostWithinScore(fine, kNaN).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(Knapsack, StateLimitIsResourceExhausted) {
  std::mt19937_64 rng(3);
  Items items(30);
  std::uniform_real_distribution<double> u(0, 1);
  for (KnapsackItem& item : items) {
    for (int j = 0; j < 4; ++j) item.cost.push_back(u(rng)), item.score.push_back(u(rng));
  }
  KnapsackOptions tight;
  tight.max_states = 10;
  tight.bound_by_relaxation = false;
  const auto got = MinScoreWithinBudget(items, 10, tight);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(got.status().message().find("10 states (the limit"), std::string::npos) << got.status();
}

// 168 layers as in Qwen2.5-0.5B: four layer shapes, so four cost profiles, and
// six formats whose scores fall as the cost rises.
Items ModelSized(unsigned seed) {
  const double macs[7] = {896.0 * 896,  128.0 * 896,  128.0 * 896, 896.0 * 896,
                          4864.0 * 896, 4864.0 * 896, 896.0 * 4864};
  const double energy[6] = {1, 1.6, 2.2, 2.2, 4, 4};
  const double precision[6] = {2, 4, 4, 7, 8, 11};
  std::mt19937_64 rng(seed);
  std::lognormal_distribution<double> layer(0, 1.5), noise(0, 0.3);
  Items items;
  for (int block = 0; block < 24; ++block) {
    for (int kind = 0; kind < 7; ++kind) {
      KnapsackItem item;
      const double sensitivity = layer(rng);
      for (int f = 0; f < 6; ++f) {
        item.cost.push_back(macs[kind] * energy[f] * 0.37e-12);
        item.score.push_back(sensitivity * std::exp2(-2 * precision[f]) * noise(rng));
      }
      items.push_back(item);
    }
  }
  return items;
}

// Cheapest everywhere, then the upgrade with the most score saved per cost
// added, while one fits.
double GreedyScore(const Items& items, double budget) {
  std::vector<int> pick(items.size());
  double cost = 0;
  for (std::size_t i = 0; i < items.size(); ++i) {
    for (std::size_t j = 0; j < items[i].cost.size(); ++j) {
      if (items[i].cost[j] < items[i].cost[pick[i]]) pick[i] = static_cast<int>(j);
    }
    cost += items[i].cost[pick[i]];
  }
  while (true) {
    double best = 0;
    std::size_t bi = 0, bj = 0;
    for (std::size_t i = 0; i < items.size(); ++i) {
      for (std::size_t j = 0; j < items[i].cost.size(); ++j) {
        const double dc = items[i].cost[j] - items[i].cost[pick[i]];
        const double ds = items[i].score[pick[i]] - items[i].score[j];
        if (dc > 0 && ds > 0 && cost + dc <= budget && ds / dc > best)
          best = ds / dc, bi = i, bj = j;
      }
    }
    if (best == 0) break;
    cost += items[bi].cost[bj] - items[bi].cost[pick[bi]];
    pick[bi] = static_cast<int>(bj);
  }
  double score = 0;
  for (std::size_t i = 0; i < items.size(); ++i) score += items[i].score[pick[i]];
  return score;
}

TEST(Knapsack, ModelSizedInstanceBeatsGreedy) {
  const Items items = ModelSized(42);
  double fp16 = 0;
  for (const KnapsackItem& item : items) fp16 += item.cost[5];
  for (const double level : {0.3, 0.5, 0.7, 0.9}) {
    SCOPED_TRACE(testing::Message() << "budget " << level << " of FP16");
    const double budget = level * fp16;
    const auto s = MinScoreWithinBudget(items, budget);
    ASSERT_TRUE(s.ok()) << s.status();
    ASSERT_TRUE(s->has_value());
    ExpectConsistent(items, **s);
    EXPECT_LE((*s)->cost, budget);
    EXPECT_LE((*s)->score, GreedyScore(items, budget));
    // The tolerance form at the score reached costs no more than the budget.
    const auto t = MinCostWithinScore(items, (*s)->score);
    ASSERT_TRUE(t.ok()) << t.status();
    ASSERT_TRUE(t->has_value());
    ExpectConsistent(items, **t);
    EXPECT_LE((*t)->score, (*s)->score);
    EXPECT_LE((*t)->cost, (*s)->cost);
  }
}

TEST(Knapsack, SameInputSameChoices) {
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 20; ++trial) {
    const Items items = trial == 0 ? ModelSized(5) : RandomItems(rng, 30, 6);
    double total = 0;
    for (const KnapsackItem& item : items) total += item.cost.back();
    const Items copy = items;
    const auto a = MinScoreWithinBudget(items, 0.6 * total);
    const auto b = MinScoreWithinBudget(copy, 0.6 * total);
    ASSERT_TRUE(a.ok() && b.ok());
    ASSERT_EQ(a->has_value(), b->has_value());
    if (a->has_value()) {
      EXPECT_EQ((*a)->choice, (*b)->choice);
    }
  }
}

}  // namespace
}  // namespace mxserve
