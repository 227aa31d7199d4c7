#include "server/telemetry/energy_ledger.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace mxserve {

void EnergyLedger::Add(const std::string& source, Phase phase, double when,
                       const EnergyAmount& amount) {
  const int64_t second = static_cast<int64_t>(std::floor(when));
  MutexLock lock(&mu_);
  Series& series = series_[{source, phase}];
  series.seconds[second].Add(amount);
  const int64_t horizon = second - static_cast<int64_t>(retention_);
  while (!series.seconds.empty() && series.seconds.begin()->first < horizon) {
    series.folded.Add(series.seconds.begin()->second);
    // A late Add can fold a second older than those folded before: the folded
    // part still reaches as far as its newest second.
    series.folded_until =
        std::max(series.folded_until, static_cast<double>(series.seconds.begin()->first + 1));
    series.seconds.erase(series.seconds.begin());
  }
}

std::vector<EnergyRow> EnergyLedger::Report(double since) const {
  // Seconds are int64: a `since` past them (up to 1.8e308) is after everything,
  // not a cast that wraps around to the beginning.
  const int64_t from = since >= 0x1p63 ? std::numeric_limits<int64_t>::max()
                                       : static_cast<int64_t>(std::floor(since));
  MutexLock lock(&mu_);
  std::vector<EnergyRow> rows;
  for (const auto& [key, series] : series_) {
    EnergyRow row{.source = std::get<0>(key), .phase = std::get<1>(key), .amount = {}};
    // A start inside the folded part cannot be split any more: it counts whole.
    if (since <= 0 || since < series.folded_until) row.amount.Add(series.folded);
    for (auto it = series.seconds.lower_bound(since <= 0 ? INT64_MIN : from);
         it != series.seconds.end(); ++it) {
      row.amount.Add(it->second);
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

}  // namespace mxserve
