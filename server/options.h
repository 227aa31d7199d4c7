// mxserved's configuration: command-line flags and an optional JSON config file
// holding the same names (`--config FILE`, {"workers": 4, "listen": "..."}).
// Flags given on the command line win over the file.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace mxserve {

struct DaemonOptions {
  std::string listen = "127.0.0.1:50051";
  std::string metrics_listen = "127.0.0.1:9464";  // "off" disables the exposer
  // TLS on the gRPC port: PEM certificate chain and key (both or neither), and
  // the CA that clients' certificates must be signed by (mutual TLS; needs the
  // pair). All empty: plaintext, as on a single-user machine.
  std::string tls_cert;
  std::string tls_key;
  std::string tls_client_ca;
  bool reflection = true;  // grpc.reflection.v1alpha.ServerReflection
  std::string backend = "cpu";
  std::string xclbin;      // fpga backend
  int fpga_device = 0;     // fpga backend
  int workers = 0;         // 0: one per hardware thread
  int kernel_threads = 1;  // 0: one per hardware thread
  int queue_size = 1024;
  int batch_window_us = 0;
  int max_batch = 16;
  int64_t max_message_bytes = int64_t{64} << 20;
  uint64_t weight_memory_bytes = uint64_t{8} << 30;
  std::string policy_dir;
  std::string default_policy = "D-phase-adaptive";
  std::string energy_model;  // empty: the built-in copy of fpga/model/energy_model.json
  double grace_seconds = 10;
  // The gRPC port's connections (server/listener.h): at most this many open at
  // once; a TLS handshake or the client's HTTP/2 preface must complete within
  // the handshake timeout; a connection without calls for the idle timeout is
  // closed (0: never); a connection older than the age limit is told to go
  // away, and closed that long again later, calls and all (0: never).
  int max_connections = 1024;
  double handshake_timeout_seconds = 10;
  double idle_timeout_seconds = 600;
  double max_connection_age_seconds = 0;
  // Directories LoadSafetensors may read from; none: file loading is off.
  std::vector<std::string> model_dirs;
  // ReportPower's bounds: distinct (source, device) pairs, the sources allowed
  // (empty: any that is not reserved), and the largest plausible sample.
  int max_power_series = 64;
  std::vector<std::string> power_sources;
  double max_power_watts = 10000;
  // Distinct run tags the energy ledger holds; a new one beyond folds the least
  // recently accounted run into the untagged energy.
  int max_energy_runs = 1024;
  int max_energy_models = 256;
  // mxserve_model_energy_joules_total: names models in the (unauthenticated)
  // /metrics, so off unless the operator asks.
  bool metrics_model_energy = false;
  // --update-copies: false ("slice") makes update-phase weight copies per call,
  // in slices, and holds none; true ("cache") caches them as rollout copies are.
  bool cache_update_copies = false;
  // --bf16-sums: false ("pairs") lets the cpu backend sum BF16 × BF16 on
  // vdpbf16ps/tdpbf16ps where the CPU has them, within the float paths' bound;
  // true ("exact") keeps the reference's order and bits on every CPU.
  bool exact_bf16 = false;
  // Access (server/rpc/access.h): the TOKEN PRINCIPAL ROLE file (empty: no
  // authentication, every caller is "anonymous" with role admin), and quotas
  // per principal, 0 meaning unlimited.
  std::string auth_tokens;
  uint64_t quota_weight_bytes = 0;
  int64_t quota_inflight = 0;
  int64_t quota_models = 0;
};

struct ParsedCommandLine {
  DaemonOptions options;
  bool help = false;
  bool version = false;
};

// Parses argv[1..]. Errors name the flag: "--workers: expected an integer in
// [0, 1024], got 'x'". The TLS files must be readable ("--tls-key: cannot read
// 'k.pem'") and come in the combinations TlsError allows.
absl::StatusOr<ParsedCommandLine> ParseCommandLine(const std::vector<std::string>& args);

// The --help text: every flag with its meaning and default.
std::string HelpText();

// "64M", "8G", "1Gi", "4096" → bytes (K/M/G are powers of 1024).
absl::StatusOr<uint64_t> ParseBytes(const std::string& text);

}  // namespace mxserve
