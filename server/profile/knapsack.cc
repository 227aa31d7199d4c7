// The exact multiple-choice knapsack of knapsack.h: a Pareto dynamic program
// over the items in order, bounded by a feasible incumbent and the LP
// relaxation of the items still to come.
//
// Both problems are one problem here: hold Σg <= bound, minimize Σf. For the
// budget form g is the cost and f the score; for the tolerance form the other
// way round.
#include "server/profile/knapsack.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace mxserve {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kUnitRoundoff = std::numeric_limits<double>::epsilon() / 2;

// A choice that survived dominance: strictly more g than the one before it in
// its item, strictly less f.
struct Choice {
  double g;
  double f;
  int index;  // into the caller's item
};

// One step along an item's lower convex hull: dg more of g buys df less of f.
struct Segment {
  double dg;
  double df;
  double efficiency;  // df / dg
  int item;
  int from, to;  // positions in the item's Choice list
};

struct BackPointer {
  uint32_t parent;  // the state's index in the previous item's frontier
  uint32_t choice;  // into the item's Choice list
};

absl::Status CheckValue(double v, std::size_t item, const char* field, std::size_t j) {
  if (std::isnan(v)) {
    return absl::InvalidArgumentError(
        absl::StrCat("items[", item, "].", field, "[", j, "] is NaN"));
  }
  if (std::isinf(v)) {
    return absl::InvalidArgumentError(
        absl::StrCat("items[", item, "].", field, "[", j, "] is infinite"));
  }
  if (v < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("items[%d].%s[%d] is negative (%g)", item, field, j, v));
  }
  return absl::OkStatus();
}

absl::Status Validate(std::span<const KnapsackItem> items, double bound, const char* bound_name) {
  if (std::isnan(bound)) return absl::InvalidArgumentError(absl::StrCat(bound_name, " is NaN"));
  for (std::size_t i = 0; i < items.size(); ++i) {
    const KnapsackItem& item = items[i];
    if (item.cost.size() != item.score.size()) {
      return absl::InvalidArgumentError(absl::StrCat("items[", i, "] has ", item.cost.size(),
                                                     " costs but ", item.score.size(), " scores"));
    }
    if (item.cost.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("items[", i, "] has no choices"));
    }
    if (item.cost.size() > (std::size_t{1} << 30)) {
      return absl::InvalidArgumentError(
          absl::StrCat("items[", i, "] has ", item.cost.size(), " choices, more than 2^30"));
    }
    for (std::size_t j = 0; j < item.cost.size(); ++j) {
      if (absl::Status s = CheckValue(item.cost[j], i, "cost", j); !s.ok()) return s;
      if (absl::Status s = CheckValue(item.score[j], i, "score", j); !s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

// An item's choices without the dominated ones, g ascending. Of equal
// choices the lowest index stays.
std::vector<Choice> Undominated(const std::vector<double>& g, const std::vector<double>& f) {
  std::vector<Choice> all(g.size());
  for (std::size_t j = 0; j < g.size(); ++j) all[j] = {g[j], f[j], static_cast<int>(j)};
  std::sort(all.begin(), all.end(), [](const Choice& a, const Choice& b) {
    if (a.g != b.g) return a.g < b.g;
    if (a.f != b.f) return a.f < b.f;
    return a.index < b.index;
  });
  std::vector<Choice> kept;
  for (const Choice& c : all) {
    if (kept.empty() || c.f < kept.back().f) kept.push_back(c);
  }
  return kept;
}

// Whether a < b even allowing for a few roundings in each: dropping a hull
// point is only safe when it certainly lies above the chord.
bool ClearlyLess(double a, double b) {
  if (std::isinf(b)) return a <= std::numeric_limits<double>::max() / 2;
  return a < b * (1 - 16 * kUnitRoundoff);
}

// The positions (into `choices`) of the item's lower convex hull, first to
// last. A point is dropped only when the slope into it is clearly gentler than
// the slope out of it (slopes as f saved per g added, divided rather than
// cross-multiplied so that nothing overflows); a near-collinear point stays,
// which only costs the relaxation a little strength, never its validity.
std::vector<int> LowerHull(const std::vector<Choice>& choices) {
  std::vector<int> hull;
  for (int p = 0; p < static_cast<int>(choices.size()); ++p) {
    while (hull.size() >= 2) {
      const Choice& a = choices[hull[hull.size() - 2]];
      const Choice& b = choices[hull.back()];
      const Choice& c = choices[p];
      const double into = (a.f - b.f) / (b.g - a.g), out = (b.f - c.f) / (c.g - b.g);
      if (!ClearlyLess(into, out)) break;
      hull.pop_back();
    }
    hull.push_back(p);
  }
  return hull;
}

// A power of two that brings x into [0.5, 1); 1 for zero or infinity.
double UnitScale(double x) {
  if (!(x > 0) || std::isinf(x)) return 1;
  return std::ldexp(1.0, -(std::ilogb(x) + 1));
}

// Σg and Σf of an assignment, in item order, exactly as the caller will sum them.
std::pair<double, double> Sums(const std::vector<std::vector<Choice>>& items,
                               const std::vector<int>& position) {
  double g = 0, f = 0;
  for (std::size_t i = 0; i < items.size(); ++i) {
    g += items[i][position[i]].g;
    f += items[i][position[i]].f;
  }
  return {g, f};
}

class Solver {
 public:
  Solver(std::vector<std::vector<Choice>> items, double bound, const KnapsackOptions& options,
         KnapsackStats* stats)
      : items_(std::move(items)),
        n_(items_.size()),
        bound_(bound),
        options_(options),
        stats_(stats) {}

  // The optimum as indices into the caller's items, nullopt when nothing fits.
  absl::StatusOr<std::optional<std::vector<int>>> Solve();

 private:
  void BuildBounds();
  // A lower bound on Σf over items k.. when they may add at most `capacity`
  // to Σg (+inf when they cannot fit at all), both scaled.
  double LowerBound(std::size_t k, double capacity) const;
  std::vector<int> Incumbent() const;
  void Improve(std::vector<int>& position, double& g, double& f) const;

  const std::vector<std::vector<Choice>> items_;
  const std::size_t n_;
  double bound_;
  const KnapsackOptions& options_;
  KnapsackStats* stats_;

  double tol_g_ = 0;             // rounding slack on Σg
  std::vector<double> reach_g_;  // Σg of the first choices of items k..n-1

  // The relaxation works on g and f scaled by powers of two so that the
  // largest sums are about 1: efficiencies neither overflow nor underflow in
  // any way that matters, and its slack is a fixed fraction.
  double scale_g_ = 1, scale_f_ = 1;
  double unit_tol_g_ = 0, unit_tol_f_ = 0;
  std::vector<Segment> segments_;  // every item's hull steps, most efficient first
  // Suffix sums over items k..n-1, scaled: g and f of the first choice, least f.
  std::vector<double> first_g_, first_f_, least_f_;
  // Checkpoints of the relaxation: items k.. with k a multiple of stride_ (and
  // n_); cumulative dg and df of their segments in efficiency order.
  std::size_t stride_ = 1;
  std::vector<std::size_t> table_begin_;  // per checkpoint, into the arrays below
  std::vector<double> cum_dg_, cum_df_, efficiency_;
};

void Solver::BuildBounds() {
  std::vector<std::vector<Choice>> scaled(n_);
  for (std::size_t i = 0; i < n_; ++i) {
    for (const Choice& c : items_[i]) {
      scaled[i].push_back({c.g * scale_g_, c.f * scale_f_, c.index});
    }
  }
  first_g_.assign(n_ + 1, 0);
  first_f_.assign(n_ + 1, 0);
  least_f_.assign(n_ + 1, 0);
  for (std::size_t k = n_; k-- > 0;) {
    first_g_[k] = first_g_[k + 1] + scaled[k].front().g;
    first_f_[k] = first_f_[k + 1] + scaled[k].front().f;
    least_f_[k] = least_f_[k + 1] + scaled[k].back().f;
  }
  for (std::size_t i = 0; i < n_; ++i) {
    const std::vector<int> hull = LowerHull(scaled[i]);
    for (std::size_t s = 1; s < hull.size(); ++s) {
      const Choice& a = scaled[i][hull[s - 1]];
      const Choice& b = scaled[i][hull[s]];
      const double dg = b.g - a.g, df = a.f - b.f;
      // A step whose saving underflowed saves nothing: leaving it out only
      // relaxes further, and keeps 0/0 out of the efficiencies.
      if (!(df > 0)) continue;
      segments_.push_back({dg, df, df / dg, static_cast<int>(i), hull[s - 1], hull[s]});
    }
  }
  std::sort(segments_.begin(), segments_.end(), [](const Segment& a, const Segment& b) {
    if (a.efficiency != b.efficiency) return a.efficiency > b.efficiency;
    if (a.item != b.item) return a.item < b.item;
    return a.from < b.from;
  });
  // Entries if every item had its own checkpoint: segments of items >= k, summed over k.
  std::size_t entries = 0;
  for (const Segment& s : segments_) entries += static_cast<std::size_t>(s.item) + 1;
  const std::size_t most = std::max<std::size_t>(1, options_.max_table_entries);
  stride_ = std::max<std::size_t>(1, (entries + most - 1) / most);
  cum_dg_.reserve(entries / stride_ + segments_.size());
  cum_df_.reserve(entries / stride_ + segments_.size());
  efficiency_.reserve(entries / stride_ + segments_.size());
  for (std::size_t k = 0;; k = std::min(k + stride_, n_)) {
    table_begin_.push_back(cum_dg_.size());
    double dg = 0, df = 0;
    for (const Segment& s : segments_) {
      if (static_cast<std::size_t>(s.item) < k) continue;
      dg += s.dg;
      df += s.df;
      cum_dg_.push_back(dg);
      cum_df_.push_back(df);
      efficiency_.push_back(s.efficiency);
    }
    if (k == n_) break;
  }
  table_begin_.push_back(cum_dg_.size());
}

double Solver::LowerBound(std::size_t k, double capacity) const {
  // Items k..c-1 before the checkpoint c count at their least f and first g.
  const std::size_t checkpoint = std::min(n_, (k + stride_ - 1) / stride_ * stride_);
  const std::size_t table = checkpoint == n_ ? table_begin_.size() - 2 : checkpoint / stride_;
  const double before = least_f_[k] - least_f_[checkpoint];
  const double room = capacity - first_g_[k];
  if (room < 0) return kInf;
  const double* dg = cum_dg_.data() + table_begin_[table];
  const double* df = cum_df_.data() + table_begin_[table];
  const std::size_t len = table_begin_[table + 1] - table_begin_[table];
  // Whole segments that fit, then a fraction of the next.
  const std::size_t whole = std::upper_bound(dg, dg + len, room) - dg;
  double saved = whole > 0 ? df[whole - 1] : 0;
  if (whole < len) {
    saved += (room - (whole > 0 ? dg[whole - 1] : 0)) * efficiency_[table_begin_[table] + whole];
  }
  return before + (first_f_[checkpoint] - saved);
}

// Improves a feasible assignment by single and paired swaps, each confirmed
// with exact in-order sums.
void Solver::Improve(std::vector<int>& position, double& g, double& f) const {
  // Paired moves cost (items × choices)^2 a pass: only where that is small.
  std::size_t choices = 0;
  for (const std::vector<Choice>& item : items_) choices += item.size();
  const bool pairs = choices <= 2048;
  for (int pass = 0; pass < 8; ++pass) {
    // The best single or paired move, judged by real-valued deltas, then
    // confirmed with exact sums.
    double best_gain = 0;
    std::size_t bi = 0, bj = 0;
    int bp = -1, bq = -1;
    const double room = bound_ - g;
    for (std::size_t i = 0; i < n_; ++i) {
      const Choice& ci = items_[i][position[i]];
      for (int p = 0; p < static_cast<int>(items_[i].size()); ++p) {
        const double dgi = items_[i][p].g - ci.g, dfi = ci.f - items_[i][p].f;
        if (dgi <= room && dfi > best_gain) {
          best_gain = dfi, bi = i, bp = p, bq = -1;
        }
        if (!pairs || dfi <= 0) continue;  // a paired move raises i and lowers j
        for (std::size_t j = 0; j < n_; ++j) {
          if (j == i) continue;
          const Choice& cj = items_[j][position[j]];
          for (int q = 0; q < position[j]; ++q) {
            const double dg = dgi + (items_[j][q].g - cj.g);
            const double gain = dfi + (cj.f - items_[j][q].f);
            if (dg <= room && gain > best_gain) best_gain = gain, bi = i, bp = p, bj = j, bq = q;
          }
        }
      }
    }
    if (bp < 0) break;
    std::vector<int> next = position;
    next[bi] = bp;
    if (bq >= 0) next[bj] = bq;
    const auto [ng, nf] = Sums(items_, next);
    if (!(ng <= bound_ && nf < f)) break;
    position = std::move(next);
    g = ng, f = nf;
  }
}

// A good feasible assignment: the LP relaxation's integral part, then swaps.
// Assumes the all-first assignment fits.
std::vector<int> Solver::Incumbent() const {
  const std::vector<int> first(n_, 0);
  std::vector<int> position(n_, 0);  // the Choice position reached per item
  std::vector<bool> blocked(n_, false);
  double room = (bound_ - reach_g_[0]) * scale_g_;
  for (const Segment& s : segments_) {
    if (blocked[s.item] || position[s.item] != s.from) continue;
    if (s.dg > room) {
      blocked[s.item] = true;  // later steps need this one
      continue;
    }
    room -= s.dg;
    position[s.item] = s.to;
  }
  auto [g, f] = Sums(items_, position);
  if (!(g <= bound_)) {
    position = first;
    std::tie(g, f) = Sums(items_, first);
  }
  Improve(position, g, f);
  return position;
}

absl::StatusOr<std::optional<std::vector<int>>> Solver::Solve() {
  // The least Σg any assignment can have, and the most.
  const std::vector<int> first(n_, 0);
  const double least_g = Sums(items_, first).first;
  if (!(least_g <= bound_)) return std::nullopt;
  double most_g = 0, most_f = 0;
  for (std::size_t i = 0; i < n_; ++i) {
    double mg = 0, mf = 0;
    for (const Choice& c : items_[i]) mg = std::max(mg, c.g), mf = std::max(mf, c.f);
    most_g += mg;
    most_f += mf;
  }
  // No assignment's Σg exceeds most_g (rounding is monotone), so a larger
  // bound changes nothing; clamping keeps the slack below finite.
  bound_ = std::min(bound_, most_g);
  const double slack = (8.0 * static_cast<double>(n_) + 32.0) * kUnitRoundoff;
  tol_g_ = slack * most_g;
  reach_g_.assign(n_ + 1, 0);
  for (std::size_t k = n_; k-- > 0;) reach_g_[k] = reach_g_[k + 1] + items_[k].front().g;
  // After scaling, the largest sums are in [0.5, 1): rounding there is
  // relative, and underflow far below the slack. Sums past the largest double
  // leave the scale at 1 and the slack infinite, which turns the bound off.
  scale_g_ = UnitScale(most_g);
  scale_f_ = UnitScale(most_f);
  unit_tol_g_ = std::isinf(most_g) ? kInf : slack;
  unit_tol_f_ = std::isinf(most_f) ? kInf : slack;

  BuildBounds();
  const std::vector<int> incumbent = Incumbent();
  const double upper = Sums(items_, incumbent).second;  // Σf of a feasible assignment
  if (stats_ != nullptr) stats_->incumbent = upper;
  // Scaled, like the relaxation.
  const double prune_above = options_.bound_by_relaxation ? upper * scale_f_ + unit_tol_f_ : kInf;

  // Back pointers index a frontier with 32 bits.
  const std::size_t max_states =
      std::min<std::size_t>(options_.max_states, std::numeric_limits<uint32_t>::max());
  std::vector<double> cur_g{0.0}, cur_f{0.0};
  std::vector<double> next_g, next_f;
  std::vector<std::vector<BackPointer>> back(n_);
  std::size_t kept = 0;
  struct Stream {
    std::size_t pos;
    double head;  // Σg of the stream's next state
    bool live;    // it has one that may still fit
  };
  std::vector<Stream> streams;
  for (std::size_t k = 0; k < n_; ++k) {
    const std::vector<Choice>& choices = items_[k];
    // States past this can never fit, whatever follows.
    double limit = bound_ + tol_g_ - reach_g_[k + 1];
    if (std::isnan(limit)) limit = kInf;  // sums past the largest double: prune nothing
    streams.assign(choices.size(), {0, 0, false});
    const std::size_t count = cur_g.size();
    for (std::size_t c = 0; c < choices.size(); ++c) {
      if (count == 0) continue;
      streams[c].head = cur_g[0] + choices[c].g;
      streams[c].live = streams[c].head <= limit;
    }
    next_g.clear();
    next_f.clear();
    std::vector<BackPointer>& bp = back[k];
    // The least f of any state so far in this merge, dropped or not (a sum can
    // be +inf, so "none yet" is a flag of its own).
    bool any = false;
    double least_f = 0;
    bool open = false;  // a group of states with equal g is being gathered
    double group_g = 0, group_f = 0;
    BackPointer group_bp{0, 0};
    auto flush = [&] {
      if (!open || (any && !(group_f < least_f))) return;
      any = true;
      least_f = group_f;
      if (prune_above < kInf &&
          group_f * scale_f_ + LowerBound(k + 1, (bound_ - group_g) * scale_g_ + unit_tol_g_) >
              prune_above) {
        if (stats_ != nullptr) ++stats_->pruned_bound;
        return;
      }
      next_g.push_back(group_g);
      next_f.push_back(group_f);
      bp.push_back(group_bp);
    };
    std::size_t generated = 0;
    while (true) {
      std::size_t best = streams.size();
      for (std::size_t c = 0; c < streams.size(); ++c) {
        if (streams[c].live && (best == streams.size() || streams[c].head < streams[best].head)) {
          best = c;
        }
      }
      if (best == streams.size()) break;
      Stream& s = streams[best];
      const double g = s.head;
      const double f = cur_f[s.pos] + choices[best].f;
      ++generated;
      if (open && g == group_g) {
        if (f < group_f) {
          group_f = f;
          group_bp = {static_cast<uint32_t>(s.pos), static_cast<uint32_t>(best)};
        }
      } else {
        flush();
        open = true;
        group_g = g, group_f = f;
        group_bp = {static_cast<uint32_t>(s.pos), static_cast<uint32_t>(best)};
      }
      if (kept + next_g.size() > max_states) {
        return absl::ResourceExhaustedError(absl::StrFormat(
            "the exact knapsack search needs more than %d states (the limit, %d MiB of back "
            "pointers) by item %d of %d",
            max_states, max_states * sizeof(BackPointer) >> 20, k + 1, n_));
      }
      ++s.pos;
      s.live = s.pos < count;
      if (s.live) {
        s.head = cur_g[s.pos] + choices[best].g;
        s.live = s.head <= limit;
      }
    }
    flush();
    kept += next_g.size();
    if (stats_ != nullptr) {
      stats_->candidates += generated;
      stats_->states += next_g.size();
      stats_->peak_frontier = std::max(stats_->peak_frontier, next_g.size());
    }
    std::swap(cur_g, next_g);
    std::swap(cur_f, next_f);
    bp.shrink_to_fit();
  }
  // g rises and f falls along the frontier: the answer is the last state that fits.
  std::size_t pick = cur_g.size();
  while (pick > 0 && !(cur_g[pick - 1] <= bound_)) --pick;
  if (pick == 0) {
    return absl::InternalError("knapsack: no state fits although the least assignment does");
  }
  std::vector<int> choice(n_);
  std::size_t state = pick - 1;
  for (std::size_t k = n_; k-- > 0;) {
    choice[k] = items_[k][back[k][state].choice].index;
    state = back[k][state].parent;
  }
  return choice;
}

absl::StatusOr<std::optional<KnapsackSolution>> Solve(std::span<const KnapsackItem> items,
                                                      double bound, bool bound_on_cost,
                                                      const KnapsackOptions& options,
                                                      KnapsackStats* stats) {
  if (absl::Status s = Validate(items, bound, bound_on_cost ? "budget" : "bound"); !s.ok()) {
    return s;
  }
  if (stats != nullptr) *stats = KnapsackStats{};
  std::vector<std::vector<Choice>> prepared(items.size());
  for (std::size_t i = 0; i < items.size(); ++i) {
    prepared[i] = bound_on_cost ? Undominated(items[i].cost, items[i].score)
                                : Undominated(items[i].score, items[i].cost);
  }
  Solver solver(std::move(prepared), bound, options, stats);
  absl::StatusOr<std::optional<std::vector<int>>> choice = solver.Solve();
  if (!choice.ok()) return choice.status();
  if (!choice->has_value()) return std::nullopt;
  KnapsackSolution solution;
  solution.choice = std::move(**choice);
  for (std::size_t i = 0; i < items.size(); ++i) {
    solution.cost += items[i].cost[solution.choice[i]];
    solution.score += items[i].score[solution.choice[i]];
  }
  const double held = bound_on_cost ? solution.cost : solution.score;
  if (!(held <= bound)) {
    return absl::InternalError(
        absl::StrCat("knapsack: the solution's sum ", held, " exceeds the bound ", bound));
  }
  return solution;
}

}  // namespace

absl::StatusOr<std::optional<KnapsackSolution>> MinScoreWithinBudget(
    std::span<const KnapsackItem> items, double budget) {
  return Solve(items, budget, /*bound_on_cost=*/true, KnapsackOptions{}, nullptr);
}

absl::StatusOr<std::optional<KnapsackSolution>> MinScoreWithinBudget(
    std::span<const KnapsackItem> items, double budget, const KnapsackOptions& options,
    KnapsackStats* stats) {
  return Solve(items, budget, /*bound_on_cost=*/true, options, stats);
}

absl::StatusOr<std::optional<KnapsackSolution>> MinCostWithinScore(
    std::span<const KnapsackItem> items, double bound) {
  return Solve(items, bound, /*bound_on_cost=*/false, KnapsackOptions{}, nullptr);
}

absl::StatusOr<std::optional<KnapsackSolution>> MinCostWithinScore(
    std::span<const KnapsackItem> items, double bound, const KnapsackOptions& options,
    KnapsackStats* stats) {
  return Solve(items, bound, /*bound_on_cost=*/false, options, stats);
}

}  // namespace mxserve
