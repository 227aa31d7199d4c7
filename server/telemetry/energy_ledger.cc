#include "server/telemetry/energy_ledger.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "server/base/quote.h"

namespace mxserve {
namespace {

const std::string& UntaggedRun() {
  static const std::string* untagged = new std::string(kUntagged);
  return *untagged;
}

}  // namespace

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

void EnergyLedger::Add(const std::string& source, Phase phase, const std::string& tag,
                       double when, const EnergyAmount& amount, uint64_t times,
                       const Principal& who) {
  const int64_t second = static_cast<int64_t>(std::floor(when));
  MutexLock lock(&mu_);
  // Never into another principal's run: the untagged series keeps the totals.
  const std::string& run = tag.empty() || TouchRun(tag, who) ? tag : UntaggedRun();
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

absl::Status EnergyLedger::CheckRun(const std::string& run, const Principal& who,
                                    absl::string_view field) const {
  if (run.empty() || who.role == Role::kAdmin) return absl::OkStatus();
  MutexLock lock(&mu_);
  auto found = runs_.find(run);
  if (found == runs_.end() || found->second.owner == who.name) return absl::OkStatus();
  return absl::PermissionDeniedError(
      absl::StrCat(field, ": run ", Quote(run),
                   " belongs to another principal (a run tag is bound to the principal that "
                   "first booked into it); choose a tag of your own"));
}

bool EnergyLedger::TouchRun(const std::string& run, const Principal& who) {
  if (auto found = runs_.find(run); found != runs_.end()) {
    if (found->second.owner != who.name && who.role != Role::kAdmin) return false;
    recency_.splice(recency_.begin(), recency_, found->second.recency);
    return true;
  }
  if (runs_.size() >= std::max<size_t>(limits_.max_runs, 1)) FoldForNewRun(who.name);
  recency_.push_front(run);
  runs_.emplace(run, RunState{.recency = recency_.begin(), .seconds = 0, .owner = who.name});
  ++runs_per_owner_[who.name];
  return true;
}

void EnergyLedger::FoldForNewRun(const std::string& creator) {
  size_t most = 0;
  for (const auto& [owner, count] : runs_per_owner_) most = std::max(most, count);
  auto creator_runs = runs_per_owner_.find(creator);
  const bool creators = creator_runs != runs_per_owner_.end() && creator_runs->second == most;
  // Least recent first: the first run of a principal holding `most` (the
  // creator's, when it is one of them).
  for (auto it = recency_.rbegin(); it != recency_.rend(); ++it) {
    const std::string& owner = runs_.find(*it)->second.owner;
    if (creators ? owner == creator : runs_per_owner_.find(owner)->second == most) {
      FoldRunIntoUntagged(*it);
      return;
    }
  }
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
  if (auto owned = runs_per_owner_.find(state->second.owner); --owned->second == 0) {
    runs_per_owner_.erase(owned);
  }
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

void EnergyLedger::AddModel(const std::string& model, const std::string& source, Phase phase,
                            const EnergyAmount& amount, uint64_t times) {
  MutexLock lock(&mu_);
  auto found = models_.find(model);
  if (found == models_.end()) {
    if (models_.size() >= std::max<size_t>(limits_.max_models, 1)) {
      // The least recently booked model's totals go to the other-models rows.
      auto oldest = models_.find(models_recency_.back());
      for (const auto& [key, total] : oldest->second.totals) other_models_[key].Add(total);
      models_recency_.pop_back();
      models_.erase(oldest);
    }
    models_recency_.push_front(model);
    found = models_.emplace(model, ModelState{.totals = {}, .recency = models_recency_.begin()})
                .first;
  } else {
    models_recency_.splice(models_recency_.begin(), models_recency_, found->second.recency);
  }
  EnergyAmount& total = found->second.totals[{source, phase}];
  for (uint64_t i = 0; i < times; ++i) total.Add(amount);
}

std::vector<ModelEnergyRow> EnergyLedger::ModelReport() const {
  MutexLock lock(&mu_);
  std::vector<ModelEnergyRow> rows;
  for (const auto& [key, total] : other_models_) {
    rows.push_back({kOtherModels, key.first, key.second, total});
  }
  for (const auto& [model, state] : models_) {
    for (const auto& [key, total] : state.totals) {
      rows.push_back({model, key.first, key.second, total});
    }
  }
  return rows;
}

size_t EnergyLedger::model_count() const {
  MutexLock lock(&mu_);
  return models_.size();
}

size_t EnergyLedger::run_count() const {
  MutexLock lock(&mu_);
  return runs_.size();
}

size_t EnergyLedger::run_seconds() const {
  MutexLock lock(&mu_);
  return run_seconds_;
}

size_t EnergyLedger::runs_of(const std::string& principal) const {
  MutexLock lock(&mu_);
  auto found = runs_per_owner_.find(principal);
  return found == runs_per_owner_.end() ? 0 : found->second;
}

}  // namespace mxserve
