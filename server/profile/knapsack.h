// Exact solvers for the multiple-choice knapsack behind policy generation: each
// item (a group of layers) takes exactly one of its choices (number formats),
// and each choice has a cost (joules or seconds per token, weight bits) and a
// score (sensitivity), both finite and >= 0.
//
// Method: a dynamic program over the items in their given order. Its states
// after each item are the Pareto-optimal (constraint sum, objective sum) pairs
// of the items so far; a pair is dropped when another is no worse in both.
// Floating-point addition is monotone, so a dropped pair can never lead to a
// better final sum, and since every sum is built in item order it is exactly
// the sum a caller gets by adding the chosen values again in item order. Within
// an item, dominated choices are removed first. Two bounds keep the frontier
// small: a state is dropped when even the cheapest completion breaks the
// constraint, or when the linear-programming relaxation of the remaining items
// (each item's choices cut to their lower convex hull, upgrades taken greedily
// by efficiency) shows that no completion beats a known feasible solution (a
// greedy one, improved by swaps). Both bounds keep a small slack for rounding,
// so they may keep a state too many but never drop one that is needed.
//
// Guarantee: the answer is optimal over all assignments, with sums taken in
// floating point in item order; ties in the objective go to the lower
// constraint sum, then deterministically to one fixed assignment.
//
// Cost: O(S · c · (c + log h)) time and 8 bytes of back pointer per kept state,
// where S is the number of states kept over all items (at most the Pareto
// frontiers' sizes, exponential in the worst case, in practice far smaller
// with the bounds), c the choices per item and h the hull segments of the
// remaining items. The search stops with RESOURCE_EXHAUSTED rather than keep
// more than KnapsackOptions::max_states states.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "absl/status/statusor.h"

namespace mxserve {

// One item: exactly one of its choices is taken. cost.size() == score.size() >= 1.
struct KnapsackItem {
  std::vector<double> cost;
  std::vector<double> score;
};

struct KnapsackSolution {
  std::vector<int> choice;  // per item, an index into its choices
  double cost = 0;          // Σ cost of the choices, summed in item order
  double score = 0;         // Σ score, summed in item order
};

struct KnapsackOptions {
  // States kept over all items, each with an 8-byte back pointer; 2^24 is
  // 128 MiB of back pointers (the live frontier costs about as much again at
  // most).
  std::size_t max_states = std::size_t{1} << 24;
  // Off, only dominance and the constraint prune: the plain Pareto dynamic
  // program, slower but a check on the bounds (tests use it).
  bool bound_by_relaxation = true;
  // Entries (24 bytes each) in the relaxation's tables, which are one per item
  // when they fit: 2^20 holds 168 items × 9 hull steps six times over. Past it,
  // the tables are kept every few items only and the bound is a little weaker.
  std::size_t max_table_entries = std::size_t{1} << 20;
};

// What a search did, for benchmarks and tests.
struct KnapsackStats {
  std::size_t states = 0;         // states kept, summed over the items
  std::size_t candidates = 0;     // states generated before dominance and bounds
  std::size_t peak_frontier = 0;  // most states kept after one item
  std::size_t pruned_bound = 0;   // dropped by the relaxation bound
  double incumbent = 0;           // objective of the starting feasible solution
};

// Least Σ score with Σ cost <= budget (ties: the lower cost, then one fixed
// assignment). nullopt when no assignment fits (budget below Σ min cost).
// INVALID_ARGUMENT for malformed items (empty, size mismatch, negative, NaN or
// infinite values; the message names "items[i].cost[j]" etc.) or a NaN budget;
// RESOURCE_EXHAUSTED if the exact search would keep more than
// options.max_states states.
absl::StatusOr<std::optional<KnapsackSolution>> MinScoreWithinBudget(
    std::span<const KnapsackItem> items, double budget);
absl::StatusOr<std::optional<KnapsackSolution>> MinScoreWithinBudget(
    std::span<const KnapsackItem> items, double budget, const KnapsackOptions& options,
    KnapsackStats* stats = nullptr);

// Least Σ cost with Σ score <= bound; same conventions.
absl::StatusOr<std::optional<KnapsackSolution>> MinCostWithinScore(
    std::span<const KnapsackItem> items, double bound);
absl::StatusOr<std::optional<KnapsackSolution>> MinCostWithinScore(
    std::span<const KnapsackItem> items, double bound, const KnapsackOptions& options,
    KnapsackStats* stats = nullptr);

}  // namespace mxserve
