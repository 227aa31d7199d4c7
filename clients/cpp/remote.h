// What every remote mxctl subcommand shares: where the daemon is (--server, before
// or after the subcommand), the per-call timeout, and how an ExecutionInfo prints.
#pragma once

#include <memory>
#include <string>

#include "absl/time/time.h"
#include "clients/cpp/client.h"
#include "mxserve/v1/common.pb.h"

namespace mxctl {

inline constexpr char kDefaultServer[] = "127.0.0.1:50051";

struct RemoteContext {
  std::string server = kDefaultServer;
  bool server_given = false;                   // --server was on the command line
  absl::Duration timeout = absl::Seconds(60);  // --timeout, per RPC
  std::string tls_ca;    // --tls-ca FILE: TLS, the daemon's certificate signed by it
  std::string tls_cert;  // --tls-cert FILE, --tls-key FILE: a client certificate
  std::string tls_key;
  std::string token;  // read from --token-file FILE, the trailing newline stripped
};

// Checks the TLS files of `context` (readable, a valid combination); errors name
// the flag. TakeGlobalFlags calls it, so MakeClient cannot fail on them later.
absl::Status CheckTlsFlags(const RemoteContext& context);

std::unique_ptr<mxclient::Client> MakeClient(const RemoteContext& context);

// A failed RPC whose status says a TLS handshake failed or the connection closed
// as a plaintext client meets a TLS daemon (or the reverse, or a client
// certificate was refused) gets a message saying so and which flag to pass; any
// other status comes back unchanged.
absl::Status ExplainTransportError(const RemoteContext& context, const absl::Status& status);

// "format  MXFP4_E2M1 (weights MXFP4_E2M1)", "backend cpu", … one per line.
std::string FormatExecutionInfo(const mxserve::v1::ExecutionInfo& info);

// "1.5 MiB", "312 B".
std::string FormatBytes(uint64_t bytes);

}  // namespace mxctl
