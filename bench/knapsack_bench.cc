// knapsack_bench: the exact multiple-choice knapsack (server/profile/knapsack.h)
// on instances shaped like Qwen2.5-0.5B policy generation.
//
// Each instance has 168 items, one per linear layer (24 blocks × q, k, v, o,
// gate, up, down), and 6 formats. A layer's cost is its MACs per token times a
// per-format energy factor (MXFP4 1, MXFP6 1.6, MXFP8 2.2, MXINT8 2.2, BF16 4,
// FP16 4), so layers of one shape cost the same; its score is a lognormal
// layer sensitivity times 2^(-2·p) for the format's precision bits p, with
// some per-format noise, so more precision means a lower score.
//
// Lines: the budget form at 30/50/70/90 % of the all-FP16 cost, then the
// tolerance form with the scores those solutions reached as bounds; each with
// the time of one solve (best of a few), the states kept and generated, and the
// largest frontier. With --plain, also the budget form without the relaxation
// bound (the plain Pareto program), for scale. Usage: knapsack_bench [seeds=3] [--plain]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "server/profile/knapsack.h"

namespace {

using mxserve::KnapsackItem;
using mxserve::KnapsackStats;

std::vector<KnapsackItem> Qwen05B(unsigned seed) {
  const double macs[7] = {896.0 * 896,  128.0 * 896,  128.0 * 896, 896.0 * 896,
                          4864.0 * 896, 4864.0 * 896, 896.0 * 4864};
  const double energy[6] = {1, 1.6, 2.2, 2.2, 4, 4};  // MXFP4 MXFP6 MXFP8 MXINT8 BF16 FP16
  const double precision[6] = {2, 4, 4, 7, 8, 11};    // mantissa bits + 1
  const double picojoule = 1e-12 * 0.37;              // per MAC at energy factor 1
  std::mt19937_64 rng(seed);
  std::lognormal_distribution<double> layer(0.0, 1.5), noise(0.0, 0.3);
  std::vector<KnapsackItem> items;
  for (int block = 0; block < 24; ++block) {
    for (int kind = 0; kind < 7; ++kind) {
      KnapsackItem item;
      const double sensitivity = layer(rng) * (block == 0 || block == 23 ? 4 : 1);
      for (int f = 0; f < 6; ++f) {
        item.cost.push_back(macs[kind] * energy[f] * picojoule);
        item.score.push_back(sensitivity * std::exp2(-2 * precision[f]) * noise(rng));
      }
      items.push_back(item);
    }
  }
  return items;
}

template <typename Fn>
double BestSeconds(Fn fn, int reps) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    const auto t1 = std::chrono::steady_clock::now();
    best = std::min(best, std::chrono::duration<double>(t1 - t0).count());
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  int seeds = 3;
  bool plain = false;
  for (int a = 1; a < argc; ++a) {
    if (std::strcmp(argv[a], "--plain") == 0) {
      plain = true;
    } else {
      seeds = std::atoi(argv[a]);
    }
  }
  std::printf("%-6s %-10s %5s %10s %10s %11s %9s %9s %12s\n", "seed", "form", "level", "ms",
              "states", "generated", "peak", "bounded", "objective");
  for (int seed = 1; seed <= seeds; ++seed) {
    const std::vector<KnapsackItem> items = Qwen05B(seed);
    double fp16 = 0;
    for (const KnapsackItem& item : items) fp16 += item.cost[5];
    std::vector<double> reached;
    for (const double level : {0.3, 0.5, 0.7, 0.9}) {
      KnapsackStats stats;
      absl::StatusOr<std::optional<mxserve::KnapsackSolution>> result;
      const double s = BestSeconds(
          [&] { result = mxserve::MinScoreWithinBudget(items, level * fp16, {}, &stats); }, 3);
      if (!result.ok() || !result->has_value()) {
        std::printf("%-6d budget     %4.0f%% failed: %s\n", seed, level * 100,
                    result.ok() ? "infeasible" : result.status().ToString().c_str());
        reached.push_back(-1);
        continue;
      }
      reached.push_back((*result)->score);
      std::printf("%-6d %-10s %4.0f%% %10.3f %10zu %11zu %9zu %9zu %12.6g\n", seed, "budget",
                  level * 100, s * 1e3, stats.states, stats.candidates, stats.peak_frontier,
                  stats.pruned_bound, (*result)->score);
      if (plain) {
        mxserve::KnapsackOptions options;
        options.bound_by_relaxation = false;
        options.max_states = std::size_t{1} << 26;
        const double p = BestSeconds(
            [&] { result = mxserve::MinScoreWithinBudget(items, level * fp16, options, &stats); },
            1);
        if (!result.ok()) {
          std::printf("%-6d %-10s %4.0f%% %s\n", seed, "plain", level * 100,
                      result.status().ToString().c_str());
        } else {
          std::printf("%-6d %-10s %4.0f%% %10.3f %10zu %11zu %9zu %9s %12.6g\n", seed, "plain",
                      level * 100, p * 1e3, stats.states, stats.candidates, stats.peak_frontier,
                      "-", (*result)->score);
        }
      }
    }
    for (std::size_t l = 0; l < reached.size(); ++l) {
      if (reached[l] < 0) continue;
      KnapsackStats stats;
      absl::StatusOr<std::optional<mxserve::KnapsackSolution>> result;
      const double s = BestSeconds(
          [&] { result = mxserve::MinCostWithinScore(items, reached[l], {}, &stats); }, 3);
      if (!result.ok() || !result->has_value()) {
        std::printf("%-6d tolerance  %4zu failed: %s\n", seed, l,
                    result.ok() ? "infeasible" : result.status().ToString().c_str());
        continue;
      }
      std::printf("%-6d %-10s %4.0f%% %10.3f %10zu %11zu %9zu %9zu %12.6g\n", seed, "tolerance",
                  (*result)->cost / fp16 * 100, s * 1e3, stats.states, stats.candidates,
                  stats.peak_frontier, stats.pruned_bound, (*result)->cost);
    }
  }
  return 0;
}
