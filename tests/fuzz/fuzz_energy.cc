// Fuzz target: Telemetry.ReportEnergy of a daemon in this process, checked
// against its own energy report. fuzz_rpc sends every RPC mutated bytes and
// looks for crashes and statuses that should never be; this one also checks
// the books: whatever the intervals, the joules the report gained are exactly
// those of the intervals the daemon accepted, before it refused one.
//
// Input: a sequence of messages, each preceded by a 2-byte little-endian
// length, as fuzz_rpc's streams. A message that parses as an EnergyInterval
// has its start and end taken as seconds relative to now when they are small
// (|t| < 10^6), so that an input stays plausible whatever day it runs; it is
// re-serialized with the shifted times. Other bytes are sent as they are.
//
// What counts as a failure:
// - a status other than OK, INVALID_ARGUMENT, RESOURCE_EXHAUSTED;
// - OK, but not every interval counted, or joules_added not their sum;
// - a refusal that does not name `intervals[k]`, or a report that gained
//   anything but the joules of intervals 0..k-1 (what came before stays
//   accounted; nothing of the refused one does);
// - any joules over --max-power-watts × (length + 0.25 s) of its interval.
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "mxserve/v1/telemetry.pb.h"
#include "server/daemon.h"
#include "server/telemetry/log.h"
#include "tests/daemon/raw_call.h"
#include "tests/fuzz/fuzz_daemon.h"
#include "tests/fuzz/fuzz_seeds.h"

namespace {

namespace v1 = mxserve::v1;

constexpr double kMaxWatts = 10000;  // the daemon's --max-power-watts below
constexpr double kSlackSeconds = 0.25;
constexpr const char* kMethod = "/mxserve.v1.Telemetry/ReportEnergy";

std::shared_ptr<grpc::Channel> channel;

void Fail(const std::string& what) {
  std::fprintf(stderr, "fuzz_energy: %s\n", what.c_str());
  std::abort();
}

double Now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Joules of every source the clients report (all but the daemon's own), every
// run together: folding runs away keeps this total exact.
double ReportedJoules() {
  const v1::EnergyReport report = mx_fuzz::EnergyReport(channel, "fuzz_energy");
  double joules = 0;
  for (const auto& e : report.entries()) {
    if (e.source() != "fpga_model" && e.source() != "fpga") joules += e.joules();
  }
  return joules;
}

void Setup() {
  channel = mx_fuzz::StartFuzzDaemon("fuzz_energy", [](mxserve::DaemonOptions& options) {
    options.max_message_bytes = 64 << 10;
    options.max_power_watts = kMaxWatts;
  });
  // The seeds' series exists before mutated names can fill --max-power-series.
  const auto seed = mx_fuzz::SeedIntervals(Now() - 10);
  const mx_test::RawResult first = mx_test::RawCall(channel, kMethod, {seed[0].SerializeAsString()});
  if (!first.status.ok()) Fail("the seed interval was refused: " + first.status.error_message());
}

// The k of "intervals[k]" at the start of a refusal, or -1.
long RefusedIndex(const std::string& message) {
  constexpr char kPrefix[] = "intervals[";
  if (message.rfind(kPrefix, 0) != 0) return -1;
  char* end = nullptr;
  const long k = std::strtol(message.c_str() + sizeof(kPrefix) - 1, &end, 10);
  return (end != nullptr && *end == ']') ? k : -1;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  Setup();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const double now = Now();
  std::vector<std::string> messages;
  // Per message: its joules if it parsed (what the daemon books if it accepts it).
  std::vector<double> joules;
  const char* rest = reinterpret_cast<const char*>(data);
  size_t left = size;
  while (left >= 2) {
    const size_t length = std::min<size_t>(left - 2, uint8_t(rest[0]) | uint8_t(rest[1]) << 8);
    std::string bytes(rest + 2, length);
    rest += 2 + length;
    left -= 2 + length;
    v1::EnergyInterval interval;
    if (interval.ParseFromString(bytes)) {
      if (std::fabs(interval.start_seconds()) < 1e6) {
        interval.set_start_seconds(now + interval.start_seconds());
      }
      if (std::fabs(interval.end_seconds()) < 1e6) {
        interval.set_end_seconds(now + interval.end_seconds());
      }
      bytes = interval.SerializeAsString();
      joules.push_back(interval.joules());
      const double most =
          kMaxWatts * (interval.end_seconds() - interval.start_seconds() + kSlackSeconds);
      // Not a failure yet: the daemon must refuse it; checked below by the books.
      if (!(interval.joules() <= most)) joules.back() = NAN;
    } else {
      joules.push_back(NAN);  // unparseable: must be refused
    }
    messages.push_back(std::move(bytes));
  }

  const double before = ReportedJoules();
  const mx_test::RawResult result = mx_test::RawCall(channel, kMethod, messages, 5.0);
  const double gained = ReportedJoules() - before;

  size_t booked = 0;  // how many intervals the daemon says it accepted
  switch (result.status.error_code()) {
    case grpc::StatusCode::OK: {
      v1::ReportEnergyResponse response;
      if (result.responses.size() != 1 || !response.ParseFromString(result.responses[0])) {
        Fail("OK without a ReportEnergyResponse");
      }
      if (response.intervals_accepted() != messages.size()) {
        Fail("OK, but " + std::to_string(response.intervals_accepted()) + " of " +
             std::to_string(messages.size()) + " intervals accepted");
      }
      booked = messages.size();
      double sum = 0;
      for (double j : joules) sum += j;
      if (!(std::fabs(response.joules_added() - sum) <= 1e-9 * std::fabs(sum) + 1e-9)) {
        Fail("joules_added " + std::to_string(response.joules_added()) + ", intervals " +
             std::to_string(sum));
      }
      break;
    }
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::RESOURCE_EXHAUSTED: {
      const long k = RefusedIndex(result.status.error_message());
      if (k < 0 || static_cast<size_t>(k) >= messages.size()) {
        Fail("a refusal that names no interval sent: " + result.status.error_message());
      }
      booked = static_cast<size_t>(k);
      break;
    }
    default:
      Fail("ReportEnergy answered " + std::to_string(result.status.error_code()) + ": " +
           result.status.error_message());
  }
  double expected = 0;
  for (size_t i = 0; i < booked; ++i) {
    if (std::isnan(joules[i])) {
      Fail("interval " + std::to_string(i) + " was accepted, though unparseable or over " +
           "--max-power-watts × its length");
    }
    expected += joules[i];
  }
  // The report's total grows with every input; its rounding is relative to it.
  const double tolerance = 1e-12 * std::fabs(before) + 1e-9 * expected + 1e-6;
  if (!(std::fabs(gained - expected) <= tolerance)) {
    Fail("the report gained " + std::to_string(gained) + " J; the " + std::to_string(booked) +
         " accepted intervals hold " + std::to_string(expected) + " J");
  }
  return 0;
}
