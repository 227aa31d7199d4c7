#include "server/telemetry/energy_ledger.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace mxserve {

EnergyLedger::EnergyLedger(EnergyLedgerLimits limits) : limits_(limits) {}

size_t EnergyLedger::FoldSecondsBefore(Series& series, int64_t horizon) {
  size_t folded = 0;
  while (!series.seconds.empty() && series.seconds.begin()->first < horizon) {
    series.folded.Add(series.seconds.begin()->second);
    // A late Add can fold a second older than those folded before: the folded
    // part still reaches as far as its newest second.
    series.folded_until =
        std::max(series.folded_until, static_cast<double>(series.seconds.begin()->first + 1));
    series.seconds.erase(series.seconds.begin());
    ++folded;
  }
  return folded;
}

EnergyAmount EnergyLedger::AmountSince(const Series& series, double since) {
  EnergyAmount amount;
  // A start inside the folded part cannot be split any more: it counts whole.
  if (since <= 0 || since < series.folded_until) amount.Add(series.folded);
  // Seconds are int64: a `since` past them (up to 1.8e308) is after everything,
  // not a cast that wraps around to the beginning.
  const int64_t from = since <= 0        ? std::numeric_limits<int64_t>::min()
                       : since >= 0x1p63 ? std::numeric_limits<int64_t>::max()
                                         : static_cast<int64_t>(std::floor(since));
  for (auto it = series.seconds.lower_bound(from); it != series.seconds.end(); ++it) {
    amount.Add(it->second);
  }
  return amount;
}

void EnergyLedger::Add(const std::string& source, Phase phase, const std::string& run, double when,
                       const EnergyAmount& amount, uint64_t times) {
  const int64_t second = static_cast<int64_t>(std::floor(when));
  MutexLock lock(&mu_);
  if (!run.empty()) TouchRun(run);
  Series& series = series_[{run, source, phase}];
  auto [bucket, added] = series.seconds.try_emplace(second);
  for (uint64_t i = 0; i < times; ++i) bucket->second.Add(amount);
  const size_t folded =
      FoldSecondsBefore(series, second - static_cast<int64_t>(limits_.retention_seconds));
  if (run.empty()) return;
  // Buckets of tagged series are counted against max_run_seconds.
  RunState& state = runs_.find(run)->second;
  state.seconds = state.seconds + (added ? 1 : 0) - folded;
  run_seconds_ = run_seconds_ + (added ? 1 : 0) - folded;
  if (run_seconds_ > limits_.max_run_seconds) FoldLeastRecentRunSeconds();
}

void EnergyLedger::TouchRun(const std::string& run) {
  if (auto found = runs_.find(run); found != runs_.end()) {
    recency_.splice(recency_.begin(), recency_, found->second.recency);
    return;
  }
  if (runs_.size() >= std::max<size_t>(limits_.max_runs, 1)) FoldRunIntoUntagged(recency_.back());
  recency_.push_front(run);
  runs_.emplace(run, RunState{.recency = recency_.begin(), .seconds = 0});
}

void EnergyLedger::FoldRunIntoUntagged(const std::string& run) {
  // `run` may be the list's own element: keep a copy while it goes.
  const std::string tag = run;
  auto it = series_.lower_bound({tag, "", Phase{}});
  while (it != series_.end() && std::get<0>(it->first) == tag) {
    Series& untagged = series_[{kUntagged, std::get<1>(it->first), std::get<2>(it->first)}];
    const Series& folding = it->second;
    untagged.folded.Add(folding.folded);
    untagged.folded_until = std::max(untagged.folded_until, folding.folded_until);
    for (const auto& [second, amount] : folding.seconds) untagged.seconds[second].Add(amount);
    it = series_.erase(it);
  }
  auto state = runs_.find(tag);
  run_seconds_ -= state->second.seconds;
  recency_.erase(state->second.recency);
  runs_.erase(state);
}

void EnergyLedger::FoldLeastRecentRunSeconds() {
  const size_t target = limits_.max_run_seconds / 4 * 3;
  for (auto run = recency_.rbegin(); run != recency_.rend() && run_seconds_ > target; ++run) {
    RunState& state = runs_.find(*run)->second;
    if (state.seconds == 0) continue;
    for (auto it = series_.lower_bound({*run, "", Phase{}});
         it != series_.end() && std::get<0>(it->first) == *run; ++it) {
      FoldSecondsBefore(it->second, std::numeric_limits<int64_t>::max());
    }
    run_seconds_ -= state.seconds;
    state.seconds = 0;
  }
}

std::vector<EnergyRow> EnergyLedger::Report(double since, const std::string& run) const {
  MutexLock lock(&mu_);
  std::vector<EnergyRow> rows;
  if (!run.empty()) {
    // One run's series are adjacent, in (source, phase) order.
    for (auto it = series_.lower_bound({run, "", Phase{}});
         it != series_.end() && std::get<0>(it->first) == run; ++it) {
      rows.push_back({.source = std::get<1>(it->first),
                      .phase = std::get<2>(it->first),
                      .amount = AmountSince(it->second, since)});
    }
    return rows;
  }
  std::map<std::tuple<std::string, Phase>, EnergyAmount> sums;
  for (const auto& [key, series] : series_) {
    sums[{std::get<1>(key), std::get<2>(key)}].Add(AmountSince(series, since));
  }
  for (const auto& [key, amount] : sums) {
    rows.push_back({.source = std::get<0>(key), .phase = std::get<1>(key), .amount = amount});
  }
  return rows;
}

size_t EnergyLedger::run_count() const {
  MutexLock lock(&mu_);
  return runs_.size();
}

size_t EnergyLedger::run_seconds() const {
  MutexLock lock(&mu_);
  return run_seconds_;
}

}  // namespace mxserve
