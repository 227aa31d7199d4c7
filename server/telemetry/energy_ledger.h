// Energy bookkeeping per (source, phase, run): joules, busy seconds and requests,
// with one-second resolution so a report can start at any time ("since"). Sources
// are the FPGA model's estimates ("fpga_model"), measured board power ("fpga"),
// and whatever reports power or measured energy through Telemetry.ReportPower and
// ReportEnergy ("gpu_baseline", "gpu_baseline_sampled", ...).
// Runs are tags clients choose (an experiment's configuration), "" when untagged;
// a report reads one run, or every run summed per (source, phase).
//
// Memory stays bounded whatever the clients send:
// - buckets older than the retention window fold into a per-series total, so a
//   report since start stays exact;
// - at most `max_runs` distinct tags are held: a new one past that folds the
//   least recently accounted run into the untagged series, so the all-runs
//   totals stay exact while that run's own report becomes empty (a later Add
//   under its tag starts it anew);
// - the tagged series hold at most `max_run_seconds` one-second buckets
//   together: past that, the least recently accounted runs' buckets fold into
//   their series' totals (their totals stay exact; a `since` inside a folded
//   part counts all of it, as past the retention window).
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "server/base/mutex.h"
#include "server/base/phase.h"

namespace mxserve {

struct EnergyAmount {
  double joules = 0;
  double busy_seconds = 0;
  uint64_t requests = 0;
  // Of `requests`, the layer calls a client computed itself and reported
  // (Telemetry.ReportWork): booked as the daemon's own, and marked.
  uint64_t emulated_requests = 0;
  void Add(const EnergyAmount& other) {
    joules += other.joules;
    busy_seconds += other.busy_seconds;
    requests += other.requests;
    emulated_requests += other.emulated_requests;
  }
};

struct EnergyRow {
  std::string source;
  Phase phase;
  EnergyAmount amount;
};

// Report's `run` for every run together, and Add's for untagged energy.
inline constexpr const char* kAllRuns = "";
inline constexpr const char* kUntagged = "";

struct EnergyLedgerLimits {
  // One-second buckets older than this (relative to the newest Add of their
  // series) fold into the series' total.
  double retention_seconds = 24 * 3600;
  // Distinct run tags held (mxserved --max-energy-runs); at least 1.
  size_t max_runs = 1024;
  // One-second buckets all tagged series hold together: about 80 MB at the
  // default. Without it, every run accounted every second would keep a day of
  // buckets per (source, phase).
  size_t max_run_seconds = size_t{1} << 20;
};

class EnergyLedger {
 public:
  explicit EnergyLedger(EnergyLedgerLimits limits = {});

  // Accounts `amount` at Unix time `when` (seconds) to (source, phase, run);
  // `run` kUntagged ("") for untagged energy. With `times`, that many times over,
  // one addition after another: the same doubles as `times` calls of Add.
  void Add(const std::string& source, Phase phase, const std::string& run, double when,
           const EnergyAmount& amount, uint64_t times = 1);
  // Sums per (source, phase) of everything accounted at or after `since` (0: all),
  // rounded down to the second: of every run together (`run` kAllRuns), or of
  // one run (no rows for a run not held). Rows sorted by source, then phase.
  std::vector<EnergyRow> Report(double since, const std::string& run) const;

  // Distinct run tags held now, and one-second buckets their series hold.
  size_t run_count() const;
  size_t run_seconds() const;

 private:
  // Run first, so that one run's series are adjacent.
  using Key = std::tuple<std::string, std::string, Phase>;  // run, source, phase
  struct Series {
    EnergyAmount folded;                      // buckets folded (retention, a run's budget)
    double folded_until = 0;                  // Unix second the folded part ends at
    std::map<int64_t, EnergyAmount> seconds;  // Unix second → amount
  };
  struct RunState {
    std::list<std::string>::iterator recency;  // its place in recency_
    size_t seconds = 0;                        // one-second buckets its series hold
  };

  // Folds `series`' buckets before `horizon` into its total; returns how many.
  static size_t FoldSecondsBefore(Series& series, int64_t horizon);
  // The sum of what `series` holds at or after `since`.
  static EnergyAmount AmountSince(const Series& series, double since);
  // Makes `run` the most recently accounted, adding it (after folding the least
  // recent run away when max_runs are held) if it is new.
  void TouchRun(const std::string& run) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves every series of `run` into the untagged series of its (source, phase).
  void FoldRunIntoUntagged(const std::string& run) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Folds the buckets of the least recently accounted runs until the tagged
  // series hold at most 3/4 of max_run_seconds (so the next few Adds do not
  // each walk the runs again).
  void FoldLeastRecentRunSeconds() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const EnergyLedgerLimits limits_;
  mutable Mutex mu_;
  std::map<Key, Series> series_ ABSL_GUARDED_BY(mu_);
  std::list<std::string> recency_ ABSL_GUARDED_BY(mu_);  // tags, most recently accounted first
  std::map<std::string, RunState> runs_ ABSL_GUARDED_BY(mu_);
  size_t run_seconds_ ABSL_GUARDED_BY(mu_) = 0;  // buckets of every tagged series
};

}  // namespace mxserve
