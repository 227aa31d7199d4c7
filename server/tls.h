// TLS on the gRPC port, reloadable while serving.
//
// gRPC 1.51's TlsServerCredentials take a certificate provider that is either
// static or polls files on a timer; neither reloads on demand. Its SSL server
// credentials, though, ask a "certificate config fetcher" before each new
// handshake, and swap certificates when it returns a new set: open connections
// keep theirs. TlsCredentials wraps that fetcher in grpc::ServerCredentials, so
// SIGHUP (Reload) replaces the certificate, key and client CA without dropping
// anyone. A set that fails to load is refused and the current one kept.
#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "grpcpp/security/server_credentials.h"

namespace mxserve {

struct TlsFiles {
  std::string cert;       // PEM certificate chain
  std::string key;        // PEM private key of its first certificate
  std::string client_ca;  // PEM CA bundle; empty: no client certificates asked
};

class TlsCredentials {
 public:
  // Reads and checks the files (the key matches the certificate, each holds
  // PEM of its kind). Errors name the flag of the bad file.
  static absl::StatusOr<std::shared_ptr<TlsCredentials>> Create(const TlsFiles& files);
  ~TlsCredentials();

  // For ServerBuilder::AddListeningPort. With a client CA the handshake
  // requires and verifies a client certificate (mutual TLS).
  std::shared_ptr<grpc::ServerCredentials> ServerCredentials();

  // Re-reads the same paths; on success new handshakes use them, on error
  // nothing changes and the error says which file.
  absl::Status Reload();

  struct State;

 private:
  explicit TlsCredentials(std::shared_ptr<State> state);
  std::shared_ptr<State> state_;
};

}  // namespace mxserve
