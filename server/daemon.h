// The daemon assembled: backend, registry, policies, scheduler, metrics, the four
// mxserve.v1 services, health and reflection on one gRPC server, and the
// Prometheus exposer. main.cc adds flags and signals; tests could embed it too.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "server/options.h"

namespace mxserve {

class Daemon {
 public:
  // Builds everything and starts serving. Health says NOT_SERVING until the
  // backend is ready, then SERVING.
  static absl::StatusOr<std::unique_ptr<Daemon>> Start(const DaemonOptions& options);
  ~Daemon();

  // The addresses actually bound (port 0 resolved); metrics empty when off.
  const std::string& grpc_address() const;
  const std::string& metrics_address() const;

  // With --tls-cert: re-reads the TLS files; new connections get them, open ones
  // keep theirs. On error (the message names the flag) the current files stay.
  // Without TLS: FAILED_PRECONDITION.
  absl::Status ReloadTls();

  // Health turns NOT_SERVING; new compute work is refused (UNAVAILABLE); queued
  // work runs; open calls (streams, uploads) get the grace period; the answers
  // leave the kernel's send queues (within the grace); then every connection
  // closes. Safe to call twice; the destructor calls it.
  void Shutdown();

  struct State;

 private:
  explicit Daemon(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace mxserve
