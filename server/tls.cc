#include "server/tls.h"

#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <fstream>
#include <mutex>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "grpc/grpc.h"
#include "grpc/grpc_security.h"
#include "mx/status_macros.h"

namespace mxserve {
namespace {

struct PemSet {
  std::string cert, key, client_ca;
};

absl::StatusOr<std::string> ReadFile(const char* flag, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  if (in) text << in.rdbuf();
  if (!in || text.str().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, ": cannot read '", path, "' (missing, unreadable or empty)"));
  }
  return text.str();
}

struct BioDeleter {
  void operator()(BIO* bio) const { BIO_free(bio); }
};
using Bio = std::unique_ptr<BIO, BioDeleter>;
struct X509Deleter {
  void operator()(X509* cert) const { X509_free(cert); }
};
using Cert = std::unique_ptr<X509, X509Deleter>;

Bio MemoryBio(const std::string& pem) {
  return Bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

// The first certificate of a PEM bundle, or null.
Cert FirstCertificate(const std::string& pem) {
  Bio bio = MemoryBio(pem);
  return Cert(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
}

// An encrypted key would make OpenSSL prompt on the terminal: refuse instead.
int NoPassword(char*, int, int, void*) { return 0; }

absl::StatusOr<PemSet> Load(const TlsFiles& files) {
  PemSet set;
  MX_ASSIGN_OR_RETURN(set.cert, ReadFile("tls-cert", files.cert));
  MX_ASSIGN_OR_RETURN(set.key, ReadFile("tls-key", files.key));
  const Cert cert = FirstCertificate(set.cert);
  if (!cert) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tls-cert: '", files.cert, "' holds no PEM certificate"));
  }
  Bio key_bio = MemoryBio(set.key);
  std::unique_ptr<EVP_PKEY, void (*)(EVP_PKEY*)> key(
      PEM_read_bio_PrivateKey(key_bio.get(), nullptr, &NoPassword, nullptr), &EVP_PKEY_free);
  if (!key) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tls-key: '", files.key, "' holds no PEM private key (or an encrypted one)"));
  }
  if (X509_check_private_key(cert.get(), key.get()) != 1) {
    return absl::InvalidArgumentError(absl::StrCat("--tls-key: '", files.key,
                                                   "' is not the key of the certificate in '",
                                                   files.cert, "' (--tls-cert)"));
  }
  if (!files.client_ca.empty()) {
    MX_ASSIGN_OR_RETURN(set.client_ca, ReadFile("tls-client-ca", files.client_ca));
    if (!FirstCertificate(set.client_ca)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--tls-client-ca: '", files.client_ca, "' holds no PEM certificate"));
    }
  }
  return set;
}

}  // namespace

// The current PEM set, with a generation that Reload bumps, and one Port per
// listening port: gRPC makes one security connector per port, and each asks the
// fetcher on its own, so each remembers which generation it has.
struct TlsCredentials::State {
  TlsFiles files;
  bool mutual = false;
  std::mutex mu;
  PemSet pem;           // guarded by mu
  uint64_t generation;  // guarded by mu
  struct Port {
    State* state;
    uint64_t served = 0;  // the generation this port's handshakes use; 0: none yet
  };
  std::vector<std::unique_ptr<Port>> ports;  // guarded by mu; live as long as the server

  // grpc_ssl_server_certificate_config_callback: called by gRPC before each new
  // handshake of the port.
  static grpc_ssl_certificate_config_reload_status Fetch(
      void* user_data, grpc_ssl_server_certificate_config** config) {
    auto* port = static_cast<Port*>(user_data);
    State& state = *port->state;
    std::lock_guard<std::mutex> lock(state.mu);
    if (port->served == state.generation) return GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_UNCHANGED;
    const grpc_ssl_pem_key_cert_pair pair = {state.pem.key.c_str(), state.pem.cert.c_str()};
    // gRPC 1.51 asserts that a fetched config has client roots, even when no
    // client certificate is asked for (then they are never used): without
    // --tls-client-ca, the server's own chain stands in. The strings are copied.
    const std::string& roots = state.pem.client_ca.empty() ? state.pem.cert : state.pem.client_ca;
    *config = grpc_ssl_server_certificate_config_create(roots.c_str(), &pair, 1);
    port->served = state.generation;
    return GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_NEW;
  }
};

namespace {

// grpc::ServerCredentials whose ports use State's fetcher. Adding a port is the
// one thing ServerBuilder asks of credentials (a private virtual of the base).
class FetcherServerCredentials : public grpc::ServerCredentials {
 public:
  explicit FetcherServerCredentials(std::shared_ptr<TlsCredentials::State> state)
      : state_(std::move(state)) {}

  // Authentication is the services' (ServerContext::auth_context() carries the
  // client certificate's subject).
  void SetAuthMetadataProcessor(const std::shared_ptr<grpc::AuthMetadataProcessor>&) override {}

 private:
  int AddPortToServer(const std::string& addr, grpc_server* server) override {
    TlsCredentials::State::Port* port;
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      state_->ports.push_back(
          std::make_unique<TlsCredentials::State::Port>(TlsCredentials::State::Port{state_.get()}));
      port = state_->ports.back().get();
    }
    grpc_ssl_server_credentials_options* options =
        grpc_ssl_server_credentials_create_options_using_config_fetcher(
            state_->mutual ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                           : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE,
            &TlsCredentials::State::Fetch, port);
    grpc_server_credentials* credentials =
        grpc_ssl_server_credentials_create_with_options(options);  // takes options
    const int bound = grpc_server_add_http2_port(server, addr.c_str(), credentials);
    grpc_server_credentials_release(credentials);
    return bound;
  }

  std::shared_ptr<TlsCredentials::State> state_;
};

}  // namespace

TlsCredentials::TlsCredentials(std::shared_ptr<State> state) : state_(std::move(state)) {}
TlsCredentials::~TlsCredentials() = default;

absl::StatusOr<std::shared_ptr<TlsCredentials>> TlsCredentials::Create(const TlsFiles& files) {
  auto state = std::make_shared<State>();
  state->files = files;
  state->mutual = !files.client_ca.empty();
  MX_ASSIGN_OR_RETURN(state->pem, Load(files));
  state->generation = 1;
  return std::shared_ptr<TlsCredentials>(new TlsCredentials(std::move(state)));
}

std::shared_ptr<grpc::ServerCredentials> TlsCredentials::ServerCredentials() {
  return std::make_shared<FetcherServerCredentials>(state_);
}

absl::Status TlsCredentials::Reload() {
  MX_ASSIGN_OR_RETURN(PemSet pem, Load(state_->files));
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->pem = std::move(pem);
  ++state_->generation;
  return absl::OkStatus();
}

}  // namespace mxserve
