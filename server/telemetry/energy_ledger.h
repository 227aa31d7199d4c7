// Energy bookkeeping per (source, phase): joules, busy seconds and requests, with
// one-second resolution so a report can start at any time ("since"). Sources are
// the FPGA model's estimates ("fpga_model"), measured board power ("fpga"), and
// whatever reports power through Telemetry.ReportPower ("gpu_baseline", ...).
//
// Buckets older than the retention window fold into a per-key total, so memory
// stays bounded while a report since start stays exact.
#pragma once

#include <cstdint>
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
  void Add(const EnergyAmount& other) {
    joules += other.joules;
    busy_seconds += other.busy_seconds;
    requests += other.requests;
  }
};

struct EnergyRow {
  std::string source;
  Phase phase;
  EnergyAmount amount;
};

class EnergyLedger {
 public:
  explicit EnergyLedger(double retention_seconds = 24 * 3600) : retention_(retention_seconds) {}

  // Accounts `amount` at Unix time `when` (seconds).
  void Add(const std::string& source, Phase phase, double when, const EnergyAmount& amount);
  // Sums per (source, phase) of everything accounted at or after `since` (0: all),
  // rounded down to the second. Rows sorted by source, then phase.
  std::vector<EnergyRow> Report(double since) const;

 private:
  using Key = std::tuple<std::string, Phase>;
  struct Series {
    EnergyAmount folded;                      // buckets older than the retention window
    double folded_until = 0;                  // Unix second the folded part ends at
    std::map<int64_t, EnergyAmount> seconds;  // Unix second → amount
  };
  const double retention_;
  mutable Mutex mu_;
  std::map<Key, Series> series_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mxserve
