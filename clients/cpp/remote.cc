#include "clients/cpp/remote.h"

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "clients/cpp/table.h"
#include "clients/cpp/wire_names.h"

namespace mxctl {

namespace {

mxclient::ClientOptions OptionsFor(const RemoteContext& context) {
  // pick_first, not the library's round_robin: a command works on one daemon's
  // models and policies (bench registers, uploads, then calls its model), which
  // round_robin would split across the daemons of a multi-address --server.
  return mxclient::ClientOptions{.address = context.server,
                                 .timeout = context.timeout,
                                 .load_balancing_policy = "",
                                 .tls_ca_file = context.tls_ca,
                                 .tls_cert_file = context.tls_cert,
                                 .tls_key_file = context.tls_key,
                                 .token = context.token};
}

}  // namespace

absl::Status CheckTlsFlags(const RemoteContext& context) {
  const auto credentials = mxclient::ChannelCredentialsFor(OptionsFor(context));
  if (credentials.ok()) return absl::OkStatus();
  // The library names its fields; the command line, its flags.
  return absl::InvalidArgumentError(
      absl::StrReplaceAll(credentials.status().message(), {{"tls_ca_file", "--tls-ca"},
                                                           {"tls_cert_file", "--tls-cert"},
                                                           {"tls_key_file", "--tls-key"}}));
}

std::unique_ptr<mxclient::Client> MakeClient(const RemoteContext& context) {
  return std::make_unique<mxclient::Client>(OptionsFor(context));
}

absl::Status ExplainTransportError(const RemoteContext& context, const absl::Status& status) {
  if (status.code() != absl::StatusCode::kUnavailable) return status;
  const absl::string_view raw = status.message();
  const bool handshake = absl::StrContains(raw, "andshake") || absl::StrContains(raw, "SSL") ||
                         absl::StrContains(raw, "TLS") || absl::StrContains(raw, "certificate");
  // A plaintext HTTP/2 preface sent to a TLS port: the daemon closes the socket.
  const bool closed = absl::StrContains(raw, "Socket closed") ||
                      absl::StrContains(raw, "Connection reset") ||
                      absl::StrContains(raw, "Broken pipe") || absl::StrContains(raw, "EOF");
  std::string explained;
  if (context.tls_ca.empty() && (closed || handshake)) {
    explained = absl::StrCat("the daemon at ", context.server,
                             " closed the connection: it may speak TLS; pass --tls-ca FILE "
                             "(and --tls-cert/--tls-key if it asks for a client certificate)");
  } else if (!context.tls_ca.empty() && absl::StrContains(raw, "wrong version number")) {
    explained = absl::StrCat("the daemon at ", context.server,
                             " does not speak TLS: drop --tls-ca (and --tls-cert/--tls-key)");
  } else if (!context.tls_ca.empty() && absl::StrContains(raw, "certificate verify failed")) {
    explained = absl::StrCat("the daemon at ", context.server,
                             " speaks TLS with a certificate not signed by --tls-ca ",
                             context.tls_ca, " (or not issued for that address)");
  } else if (!context.tls_ca.empty() && handshake) {
    explained = absl::StrCat("the daemon at ", context.server,
                             " does not speak TLS (or its certificate is not signed by --tls-ca ",
                             context.tls_ca, ", or it refused ",
                             context.tls_cert.empty()
                                 ? "a client without --tls-cert/--tls-key"
                                 : absl::StrCat("the client certificate ", context.tls_cert),
                             ")");
  } else if (!context.tls_ca.empty() && closed) {
    explained =
        absl::StrCat("the daemon at ", context.server,
                     " closed the TLS connection: it may want a client certificate ",
                     context.tls_cert.empty()
                         ? "(pass --tls-cert and --tls-key)"
                         : absl::StrCat("signed by its --tls-client-ca, not ", context.tls_cert));
  } else {
    return status;
  }
  absl::Status wrapped(status.code(), absl::StrCat(explained, " [", raw, "]"));
  status.ForEachPayload(
      [&](absl::string_view url, const absl::Cord& payload) { wrapped.SetPayload(url, payload); });
  return wrapped;
}

std::string FormatExecutionInfo(const mxserve::v1::ExecutionInfo& info) {
  std::string format = mxclient::WireFormatName(info.format());
  if (info.weight_format() != info.format()) {
    absl::StrAppend(&format, " (weights ", mxclient::WireFormatName(info.weight_format()), ")");
  }
  return FormatKeyValues({
      {"format", format},
      {"backend", info.backend()},
      {"weight_version", absl::StrCat(info.weight_version())},
      {"batch_size", absl::StrCat(info.batch_size())},
      {"queue_ms", absl::StrFormat("%.4g", info.queue_seconds() * 1e3)},
      {"compute_ms", absl::StrFormat("%.4g", info.compute_seconds() * 1e3)},
      {"model_ms", absl::StrFormat("%.4g", info.model_seconds() * 1e3)},
      {"model_joules", absl::StrFormat("%.4g", info.model_joules())},
  });
}

std::string FormatBytes(uint64_t bytes) {
  if (bytes < 1024) return absl::StrCat(bytes, " B");
  const char* units[] = {"KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes) / 1024;
  int unit = 0;
  while (value >= 1024 && unit < 3) {
    value /= 1024;
    ++unit;
  }
  return absl::StrFormat("%.1f %s", value, units[unit]);
}

}  // namespace mxctl
