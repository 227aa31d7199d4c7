// A real mxserved for integration tests: started as a child process on
// 127.0.0.1 with port 0, its ports read from the `listening` log line, its
// stderr kept (tests read the log), stopped with SIGTERM at the end.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "grpcpp/channel.h"

namespace mx_test {

class DaemonProcess {
 public:
  // Starts `MXSERVED_PATH --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 <flags>`
  // and waits (up to 20 s) for it to listen. Fails the test (ADD_FAILURE) and
  // leaves `ok()` false when it does not.
  // `open_file_limit` > 0: the child's soft and hard RLIMIT_NOFILE, set before exec.
  explicit DaemonProcess(std::vector<std::string> flags = {}, int open_file_limit = 0);
  ~DaemonProcess();

  bool ok() const { return !grpc_address_.empty(); }
  const std::string& grpc_address() const { return grpc_address_; }
  const std::string& metrics_address() const { return metrics_address_; }
  std::shared_ptr<grpc::Channel> channel() const { return channel_; }
  pid_t pid() const { return pid_; }

  // Sends SIGTERM and waits up to `timeout_seconds`; returns the exit status
  // (-1 when it had to be killed).
  int Stop(double timeout_seconds = 20);
  // Everything the daemon wrote to stderr so far.
  std::string Log() const;
  // The log once it holds `needle` (a reader thread copies the daemon's stderr,
  // so a line written as an RPC returns may arrive just after), or as it is
  // when `timeout` passes without it.
  std::string AwaitLog(const std::string& needle,
                       std::chrono::milliseconds timeout = std::chrono::seconds(10)) const;

 private:
  void ReadLoop(int fd);
  pid_t pid_ = -1;
  std::thread reader_;
  mutable std::mutex mu_;
  std::string log_;
  std::string grpc_address_;
  std::string metrics_address_;
  std::shared_ptr<grpc::Channel> channel_;
  bool stopped_ = false;
};

// GET http://ADDRESS/metrics over a plain socket; empty on failure.
std::string ScrapeMetrics(const std::string& address);

// The value of the sample line `series` (e.g. `mxserve_models` or
// `mxserve_requests_total{backend="cpu",...}` with labels in exposition order),
// or -1 when absent.
double MetricValue(const std::string& exposition, const std::string& series);

// Scrapes until `series` reads `want` or `timeout_seconds` pass; returns the
// last value read (-1: absent). The daemon counts an RPC's status once gRPC is
// done with the call, a moment after the client has its answer.
double AwaitMetric(const std::string& address, const std::string& series, double want,
                   double timeout_seconds = 10);

// For a suite's shared daemon, from TearDownTestSuite: expects a clean exit (0)
// from a daemon that started, with its log on failure, then frees it.
void StopSuiteDaemon(DaemonProcess*& daemon);

}  // namespace mx_test
