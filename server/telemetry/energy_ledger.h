// Energy bookkeeping per (source, phase, run): joules, busy seconds and requests,
// with one-second resolution so a report can start at any time ("since"). Sources
// are the FPGA model's estimates ("fpga_model"), measured board power ("fpga"),
// and whatever reports power or measured energy through Telemetry.ReportPower and
// ReportEnergy ("gpu_baseline", "gpu_baseline_sampled", ...).
// Runs are tags clients choose (an experiment's configuration), "" when untagged;
// a report reads one run, or every run summed per (source, phase).
//
// A run has an owner: the principal whose booking created it. Only it may book
// into the run or read the run's report; admins may book into and read any run
// (without changing its owner). Without --auth-tokens every caller is the admin
// "anonymous", so every run is everyone's. A folded run (below) is forgotten
// with its owner: its tag is free again.
//
// Memory stays bounded whatever the clients send:
// - buckets older than the retention window fold into a per-series total, so a
//   report since start stays exact;
// - at most `max_runs` distinct tags are held: a new one past that folds a run
//   into the untagged series, so the all-runs totals stay exact while that
//   run's own report becomes empty (a later Add under its tag starts it anew).
//   The run folded is the least recently accounted run of the principal holding
//   the most runs (the new run's principal when it is one of those): a
//   principal creating tag after tag folds its own runs, never those of a
//   principal holding fewer;
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
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "server/base/auth_tokens.h"
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

// A model's energy: what its layer calls booked, since the daemon started.
struct ModelEnergyRow {
  std::string model;  // kOtherModels for the models folded away
  std::string source;
  Phase phase;
  EnergyAmount amount;
};

// ModelReport's row for the models no longer held one by one (past max_models).
inline constexpr const char* kOtherModels = "";

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
  // Models whose energy is held one by one (mxserved --max-energy-models); at
  // least 1. Past it, booking a new model folds the least recently booked one
  // into the kOtherModels rows.
  size_t max_models = 256;
};

class EnergyLedger {
 public:
  explicit EnergyLedger(EnergyLedgerLimits limits = {});

  // Accounts `amount` at Unix time `when` (seconds) to (source, phase, run);
  // `run` kUntagged ("") for untagged energy. With `times`, that many times over,
  // one addition after another: the same doubles as `times` calls of Add.
  // `who` books it: a new run becomes its own. A run another principal owns
  // takes it only from an admin; anyone else's booking goes to the untagged
  // series (callers check with CheckRun first; this covers the run changing
  // hands in between, after a fold).
  void Add(const std::string& source, Phase phase, const std::string& run, double when,
           const EnergyAmount& amount, uint64_t times = 1,
           const Principal& who = AnonymousPrincipal());
  // Whether `who` may book into or read `run`: OK for "", for a run not held
  // (the first booking binds it), for the run's owner and for an admin; else
  // PERMISSION_DENIED "<field>: run 'x' belongs to another principal ..." (the
  // owner is not named).
  absl::Status CheckRun(const std::string& run, const Principal& who,
                        absl::string_view field) const;
  // Sums per (source, phase) of everything accounted at or after `since` (0: all),
  // rounded down to the second: of every run together (`run` kAllRuns), or of
  // one run (no rows for a run not held). Rows sorted by source, then phase.
  // Callers check CheckRun for one run first.
  std::vector<EnergyRow> Report(double since, const std::string& run) const;

  // Books `amount` (`times` over, as Add) to `model`'s totals of (source,
  // phase): the energy per model, every run together, since start. A new model
  // past max_models folds the least recently booked one into kOtherModels, so
  // the totals over models stay exact.
  void AddModel(const std::string& model, const std::string& source, Phase phase,
                const EnergyAmount& amount, uint64_t times = 1);
  // Every model's totals, sorted by model (kOtherModels first), source, phase.
  std::vector<ModelEnergyRow> ModelReport() const;
  // Models held one by one now.
  size_t model_count() const;

  // Distinct run tags held now, and one-second buckets their series hold.
  size_t run_count() const;
  size_t run_seconds() const;
  // Runs held now whose owner is `principal`.
  size_t runs_of(const std::string& principal) const;

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
    std::string owner;                         // the principal whose booking made it
  };

  // Folds `series`' buckets before `horizon` into its total; returns how many.
  static size_t FoldSecondsBefore(Series& series, int64_t horizon);
  // The sum of what `series` holds at or after `since`.
  static EnergyAmount AmountSince(const Series& series, double since);
  // Makes `run` the most recently accounted, adding it as `who`'s (after
  // folding a run away when max_runs are held: FoldForNewRun) if it is new.
  // False, touching nothing, when another principal owns it and `who` is not
  // an admin.
  bool TouchRun(const std::string& run, const Principal& who) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Folds the least recently accounted run of the principal holding the most
  // runs (`creator`, when it holds as many as any other) into the untagged series.
  void FoldForNewRun(const std::string& creator) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
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
  std::map<std::string, size_t> runs_per_owner_ ABSL_GUARDED_BY(mu_);  // none at 0
  size_t run_seconds_ ABSL_GUARDED_BY(mu_) = 0;  // buckets of every tagged series
  // Per model: (source, phase) totals, and its place in models_recency_.
  struct ModelState {
    std::map<std::pair<std::string, Phase>, EnergyAmount> totals;
    std::list<std::string>::iterator recency;
  };
  std::map<std::string, ModelState> models_ ABSL_GUARDED_BY(mu_);
  std::list<std::string> models_recency_ ABSL_GUARDED_BY(mu_);  // most recently booked first
  std::map<std::pair<std::string, Phase>, EnergyAmount> other_models_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mxserve
