#include "server/options.h"

#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>

#include "absl/algorithm/container.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "mx/read_file.h"
#include "mx/status_macros.h"
#include "server/base/label.h"
#include "server/base/strict_json.h"
#include "server/compute/backends/backend.h"
#include "server/listener.h"
#include "server/rpc/telemetry_service.h"

namespace mxserve {
namespace {

struct FlagSpec {
  std::string name;
  std::string value_name;  // empty for a boolean switch
  std::string help;
  std::function<std::string(const DaemonOptions&)> default_text;
  std::function<absl::Status(const std::string&, DaemonOptions&)> set;
  // Repeatable flags add a value each time (a config file gives them as a list).
  bool repeatable = false;
};

absl::Status FlagError(const std::string& name, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("--", name, ": ", what));
}

template <typename Int>
std::function<absl::Status(const std::string&, DaemonOptions&)> IntSetter(std::string name,
                                                                          Int DaemonOptions::*field,
                                                                          Int min, Int max) {
  return [name, field, min, max](const std::string& text, DaemonOptions& o) {
    Int value;
    if (!absl::SimpleAtoi(text, &value) || value < min || value > max) {
      return FlagError(
          name, absl::StrCat("expected an integer in [", min, ", ", max, "], got '", text, "'"));
    }
    o.*field = value;
    return absl::OkStatus();
  };
}

// Seconds in [0, max].
std::function<absl::Status(const std::string&, DaemonOptions&)> SecondsSetter(
    std::string name, double DaemonOptions::*field, double max) {
  return [name, field, max](const std::string& text, DaemonOptions& o) {
    double value;
    if (!absl::SimpleAtod(text, &value) || !(value >= 0) || value > max) {
      return FlagError(name, absl::StrCat("expected seconds in [0, ", max, "], got '", text, "'"));
    }
    o.*field = value;
    return absl::OkStatus();
  };
}

// A byte size (ParseBytes: K/M/G suffixes).
std::function<absl::Status(const std::string&, DaemonOptions&)> BytesSetter(
    std::string name, uint64_t DaemonOptions::*field) {
  return [name, field](const std::string& text, DaemonOptions& o) {
    absl::StatusOr<uint64_t> bytes = ParseBytes(text);
    if (!bytes.ok()) return FlagError(name, bytes.status().message());
    o.*field = *bytes;
    return absl::OkStatus();
  };
}

// A flag "NO|YES" for a bool field (--update-copies slice|cache, --bf16-sums
// pairs|exact): `no` sets it false, `yes` true; the text --help shows, and the
// setter.
std::function<std::string(const DaemonOptions&)> ChoiceText(bool DaemonOptions::*field,
                                                            std::string no, std::string yes) {
  return [=](const DaemonOptions& o) { return o.*field ? yes : no; };
}
std::function<absl::Status(const std::string&, DaemonOptions&)> ChoiceSetter(
    std::string name, bool DaemonOptions::*field, std::string no, std::string yes) {
  return [=](const std::string& text, DaemonOptions& o) {
    if (text != no && text != yes) {
      return FlagError(name, absl::StrCat("expected ", no, " or ", yes, ", got '", text, "'"));
    }
    o.*field = text == yes;
    return absl::OkStatus();
  };
}

// A flag "BOOL" (true|false) for a bool field, shown as ChoiceText(field,
// "false", "true"); its setter's message names true first, as --help does.
std::function<absl::Status(const std::string&, DaemonOptions&)> BoolSetter(
    std::string name, bool DaemonOptions::*field) {
  return [=](const std::string& text, DaemonOptions& o) {
    if (text != "true" && text != "false") {
      return FlagError(name, absl::StrCat("expected true or false, got '", text, "'"));
    }
    o.*field = text == "true";
    return absl::OkStatus();
  };
}

std::function<absl::Status(const std::string&, DaemonOptions&)> StringSetter(
    std::string DaemonOptions::*field) {
  return [field](const std::string& text, DaemonOptions& o) {
    o.*field = text;
    return absl::OkStatus();
  };
}

// A PEM file flag: the path is kept; ParseCommandLine checks it can be read once
// every flag is in (so the error names the flag whatever its source).
std::function<absl::Status(const std::string&, DaemonOptions&)> FileSetter(
    std::string name, std::string DaemonOptions::*field) {
  return [name, field](const std::string& text, DaemonOptions& o) {
    if (text.empty()) return FlagError(name, "expected a file, got ''");
    o.*field = text;
    return absl::OkStatus();
  };
}

std::string FormatBytes(uint64_t bytes) {
  if (bytes % (uint64_t{1} << 30) == 0) return absl::StrCat(bytes >> 30, "G");
  if (bytes % (uint64_t{1} << 20) == 0) return absl::StrCat(bytes >> 20, "M");
  return absl::StrCat(bytes);
}

// A bare port ("9464": every interface, as CivetServer takes it), or nullopt.
std::optional<int> BarePort(absl::string_view address) {
  int port = -1;
  if (address.empty() || !absl::c_all_of(address, absl::ascii_isdigit) ||
      !absl::SimpleAtoi(address, &port)) {
    return std::nullopt;
  }
  return port;
}

const std::vector<FlagSpec>& Flags() {
  static const auto* flags = new std::vector<FlagSpec>{
      {"listen", "ADDR", "gRPC address; port 0 picks a free port (logged at start)",
       [](const DaemonOptions& o) { return o.listen; }, StringSetter(&DaemonOptions::listen)},
      {"metrics-listen", "ADDR",
       "Prometheus /metrics address; port 0 picks a free port; 'off' disables it",
       [](const DaemonOptions& o) { return o.metrics_listen; },
       // Checked here: CivetServer's own refusal ("null context when constructing
       // CivetServer") says nothing of the form.
       // CivetServer also takes a bare port (every interface) and a comma list.
       [](const std::string& text, DaemonOptions& o) {
         const auto valid = [](absl::string_view item) {
           const std::optional<int> port = BarePort(item);
           return ValidHostPort(std::string(item)) || (port && *port <= 65535);
         };
         if (text != "off" && !absl::c_all_of(absl::StrSplit(text, ','), valid)) {
           return FlagError("metrics-listen",
                            absl::StrCat("expected HOST:PORT, [IPV6]:PORT or PORT (a port in "
                                         "[0, 65535]; several with commas), or off, got '",
                                         text, "'"));
         }
         o.metrics_listen = text;
         return absl::OkStatus();
       }},
      {"tls-cert", "FILE",
       "PEM certificate chain of the gRPC port; with --tls-key the port speaks TLS only. "
       "Re-read with --tls-key and --tls-client-ca on SIGHUP (new connections get the new "
       "files; open ones are kept)",
       [](const DaemonOptions& o) { return o.tls_cert.empty() ? "'' (plaintext)" : o.tls_cert; },
       FileSetter("tls-cert", &DaemonOptions::tls_cert)},
      {"tls-key", "FILE", "PEM private key of --tls-cert",
       [](const DaemonOptions& o) { return o.tls_key.empty() ? "''" : o.tls_key; },
       FileSetter("tls-key", &DaemonOptions::tls_key)},
      {"tls-client-ca", "FILE",
       "PEM CA bundle: clients must present a certificate signed by it (mutual TLS); needs "
       "--tls-cert and --tls-key",
       [](const DaemonOptions& o) {
         return o.tls_client_ca.empty() ? "'' (no client certificates)" : o.tls_client_ca;
       },
       FileSetter("tls-client-ca", &DaemonOptions::tls_client_ca)},
      {"reflection", "BOOL",
       "serve gRPC server reflection (grpcurl, grpc_cli list the services); open to every "
       "caller that reaches the port",
       ChoiceText(&DaemonOptions::reflection, "false", "true"),
       BoolSetter("reflection", &DaemonOptions::reflection)},
      {"backend", "NAME", absl::StrCat("where GEMMs run: ", kBackendNames),
       [](const DaemonOptions& o) { return o.backend; },
       [](const std::string& text, DaemonOptions& o) {
         MX_RETURN_IF_ERROR(CheckBackendName(text));
         o.backend = text;
         return absl::OkStatus();
       }},
      {"xclbin", "FILE",
       "fpga backend only (refused with another): the mx_gemm kernel's .xclbin (see fpga/build)",
       [](const DaemonOptions& o) { return o.xclbin.empty() ? "''" : o.xclbin; },
       StringSetter(&DaemonOptions::xclbin)},
      {"fpga-device", "N", "fpga backend only (refused with another): XRT device index of the card",
       [](const DaemonOptions& o) { return absl::StrCat(o.fpga_device); },
       IntSetter("fpga-device", &DaemonOptions::fpga_device, 0, 63)},
      {"workers", "N", "compute worker threads; 0 means one per hardware thread",
       [](const DaemonOptions& o) { return absl::StrCat(o.workers); },
       IntSetter("workers", &DaemonOptions::workers, 0, 1024)},
      {"kernel-threads", "N",
       "threads one GEMM is split across (cpu backend); 0 means one per hardware thread",
       [](const DaemonOptions& o) { return absl::StrCat(o.kernel_threads); },
       IntSetter("kernel-threads", &DaemonOptions::kernel_threads, 0, 1024)},
      {"queue-size", "N",
       "compute requests that may wait for a worker; beyond it calls fail RESOURCE_EXHAUSTED",
       [](const DaemonOptions& o) { return absl::StrCat(o.queue_size); },
       IntSetter("queue-size", &DaemonOptions::queue_size, 1, 1 << 20)},
      {"batch-window-us", "US",
       "how long a LayerForward waits for others of its (model, layer, format, version) to fuse "
       "with; 0 fuses only requests already queued",
       [](const DaemonOptions& o) { return absl::StrCat(o.batch_window_us); },
       IntSetter("batch-window-us", &DaemonOptions::batch_window_us, 0, 10'000'000)},
      {"max-batch", "N", "most LayerForward requests fused into one GEMM (1 disables batching)",
       [](const DaemonOptions& o) { return absl::StrCat(o.max_batch); },
       IntSetter("max-batch", &DaemonOptions::max_batch, 1, 4096)},
      {"max-message-bytes", "BYTES",
       "largest gRPC message received or sent (K/M/G suffixes, powers of 1024)",
       [](const DaemonOptions& o) { return FormatBytes(o.max_message_bytes); },
       [](const std::string& text, DaemonOptions& o) {
         absl::StatusOr<uint64_t> bytes = ParseBytes(text);
         if (!bytes.ok() || *bytes < 4096 || *bytes > (uint64_t{2} << 30) - 1) {
           return FlagError("max-message-bytes",
                            absl::StrCat("expected a size from 4K to 2G-1, got '", text, "'"));
         }
         o.max_message_bytes = static_cast<int64_t>(*bytes);
         return absl::OkStatus();
       }},
      {"weight-memory-bytes", "BYTES",
       "memory for weights: FP32 masters, staged uploads and quantized copies",
       [](const DaemonOptions& o) { return FormatBytes(o.weight_memory_bytes); },
       BytesSetter("weight-memory-bytes", &DaemonOptions::weight_memory_bytes)},
      {"update-copies", "slice|cache",
       "update-phase weight copies: 'slice' quantizes them per call, in slices of at most 8 Mi "
       "weights, and holds none (a trainer changes its weights every step); 'cache' keeps them "
       "like rollout copies (faster for several update calls per weight version, e.g. "
       "micro-batches; holds one copy per format and layout)",
       ChoiceText(&DaemonOptions::cache_update_copies, "slice", "cache"),
       ChoiceSetter("update-copies", &DaemonOptions::cache_update_copies, "slice", "cache")},
      {"bf16-sums", "pairs|exact",
       "cpu backend, BF16 x BF16 GEMMs: 'pairs' sums pairs of products on vdpbf16ps/tdpbf16ps "
       "where the CPU has them (AVX512_BF16, AMX), within the float formats' bound; 'exact' "
       "keeps the reference's order, so its bits (those of the FPGA's float path) on every CPU, "
       "about 1.6x slower where the pairs run",
       ChoiceText(&DaemonOptions::exact_bf16, "pairs", "exact"),
       ChoiceSetter("bf16-sums", &DaemonOptions::exact_bf16, "pairs", "exact")},
      {"policy-dir", "DIR",
       "where user policies persist as NAME.json (loaded at start); empty keeps them in memory",
       [](const DaemonOptions& o) { return o.policy_dir.empty() ? "''" : o.policy_dir; },
       StringSetter(&DaemonOptions::policy_dir)},
      {"default-policy", "NAME",
       "active policy of models registered without one (a built-in answers to its short name too: "
       "fp16, A, B, C, D)",
       [](const DaemonOptions& o) { return o.default_policy; },
       StringSetter(&DaemonOptions::default_policy)},
      {"energy-model", "FILE",
       "FPGA cycle and energy model parameters (fpga/model/energy_model.json); empty uses the "
       "copy built in",
       [](const DaemonOptions& o) { return o.energy_model.empty() ? "''" : o.energy_model; },
       StringSetter(&DaemonOptions::energy_model)},
      {"model-dir", "DIR",
       "a directory Models.LoadSafetensors may read files from (repeatable); a client's path "
       "must lie inside one, after symbolic links. Without any, file loading is off",
       [](const DaemonOptions& o) {
         return o.model_dirs.empty() ? std::string("none (loading off)")
                                     : absl::StrJoin(o.model_dirs, ", ");
       },
       [](const std::string& text, DaemonOptions& o) {
         if (text.empty()) return FlagError("model-dir", "expected a directory, got ''");
         o.model_dirs.push_back(text);
         return absl::OkStatus();
       },
       /*repeatable=*/true},
      {"max-power-series", "N",
       "most distinct (source, device) pairs Telemetry.ReportPower and ReportEnergy may create "
       "together (each is a metric series); a new pair beyond it is refused RESOURCE_EXHAUSTED",
       [](const DaemonOptions& o) { return absl::StrCat(o.max_power_series); },
       IntSetter("max-power-series", &DaemonOptions::max_power_series, 1, 4096)},
      {"power-sources", "LIST",
       "comma-separated source names ReportPower and ReportEnergy accept, e.g. "
       "gpu_baseline,gpu_baseline_sampled (the GPU baseline's counter and samples); empty accepts "
       "any name except the daemon's own (fpga, fpga_model)",
       [](const DaemonOptions& o) {
         return o.power_sources.empty() ? std::string("any") : absl::StrJoin(o.power_sources, ",");
       },
       [](const std::string& text, DaemonOptions& o) {
         o.power_sources = absl::StrSplit(text, ',', absl::SkipWhitespace());
         for (std::string& source : o.power_sources) {
           source = std::string(absl::StripAsciiWhitespace(source));
           // Checked as ReportPower checks a source: 'a b' or fpga started a
           // daemon that could never accept them (a black-box test).
           if (!IsPlainLabel(source)) {
             return FlagError("power-sources",
                              absl::StrCat("expected names of 1-", kMaxLabelChars,
                                           " characters of [A-Za-z0-9_.:/-], got '", source, "'"));
           }
           for (const char* reserved : kReservedPowerSources) {
             if (source == reserved) {
               return FlagError("power-sources",
                                absl::StrCat("'", source,
                                             "' is the daemon's own (fpga, fpga_model): "
                                             "clients cannot report it"));
             }
           }
         }
         return absl::OkStatus();
       }},
      {"max-power-watts", "W",
       "largest power a ReportPower sample may claim (and a ReportEnergy interval, times its "
       "length + 0.25 s); more is refused as implausible",
       [](const DaemonOptions& o) { return absl::StrCat(o.max_power_watts); },
       [](const std::string& text, DaemonOptions& o) {
         double value;
         if (!absl::SimpleAtod(text, &value) || !(value > 0) || value > 1e7) {
           return FlagError("max-power-watts",
                            absl::StrCat("expected watts in (0, 1e7], got '", text, "'"));
         }
         o.max_power_watts = value;
         return absl::OkStatus();
       }},
      {"max-energy-runs", "N",
       "most distinct run tags the energy report keeps apart; a new tag beyond it folds the least "
       "recently accounted run of the principal holding the most runs into the untagged energy "
       "(totals stay exact, that run's own report becomes empty)",
       [](const DaemonOptions& o) { return absl::StrCat(o.max_energy_runs); },
       IntSetter("max-energy-runs", &DaemonOptions::max_energy_runs, 1, 65536)},
      {"metrics-model-energy", "BOOL",
       "export mxserve_model_energy_joules_total{model, phase} (the first 32 models named, later "
       "ones as model=\"other\"): puts model names in /metrics, which anyone reaching the "
       "metrics port reads, so for daemons whose models are no secret",
       ChoiceText(&DaemonOptions::metrics_model_energy, "false", "true"),
       BoolSetter("metrics-model-energy", &DaemonOptions::metrics_model_energy)},
      {"max-energy-models", "N",
       "most models whose energy the energy report (by_model) keeps apart; a new model beyond it "
       "folds the least recently booked one into the 'other models' rows (totals stay exact)",
       [](const DaemonOptions& o) { return absl::StrCat(o.max_energy_models); },
       IntSetter("max-energy-models", &DaemonOptions::max_energy_models, 1, 65536)},
      {"auth-tokens", "FILE",
       "who may call: one 'TOKEN PRINCIPAL ROLE' per line ('#' comments), ROLE compute, train or "
       "admin; clients send 'authorization: Bearer TOKEN' metadata; a TOKEN 'cert:NAME' stands "
       "for an mTLS client certificate whose subject common name is NAME. Without it every "
       "caller is 'anonymous' with role admin (single-user machines only)",
       [](const DaemonOptions& o) { return o.auth_tokens.empty() ? "''" : o.auth_tokens; },
       [](const std::string& text, DaemonOptions& o) {
         if (text.empty()) return FlagError("auth-tokens", "expected a file, got ''");
         o.auth_tokens = text;
         return absl::OkStatus();
       }},
      {"quota-weight-bytes", "BYTES",
       "FP32 weights one principal's models may hold, staged and published (as "
       "ModelInfo.quota_bytes counts them), checked when weights are staged; cached quantized "
       "copies are the daemon's cache under --weight-memory-bytes and are not charged; 0 is "
       "unlimited",
       [](const DaemonOptions& o) { return FormatBytes(o.quota_weight_bytes); },
       BytesSetter("quota-weight-bytes", &DaemonOptions::quota_weight_bytes)},
      {"quota-inflight", "N",
       "calls one principal may have admitted and not yet answered (a stream counts once); "
       "beyond it calls fail RESOURCE_EXHAUSTED; 0 is unlimited",
       [](const DaemonOptions& o) { return absl::StrCat(o.quota_inflight); },
       IntSetter<int64_t>("quota-inflight", &DaemonOptions::quota_inflight, 0, int64_t{1} << 30)},
      {"quota-models", "N", "models one principal may have registered at once; 0 is unlimited",
       [](const DaemonOptions& o) { return absl::StrCat(o.quota_models); },
       IntSetter<int64_t>("quota-models", &DaemonOptions::quota_models, 0, int64_t{1} << 30)},
      {"grace-seconds", "S",
       "on SIGTERM/SIGINT, how long open calls and queued work may take to finish; then queued "
       "work is cancelled, calls still open are answered UNAVAILABLE and the daemon exits (within "
       "about a second more), abandoning computations still running",
       [](const DaemonOptions& o) { return absl::StrCat(o.grace_seconds); },
       SecondsSetter("grace-seconds", &DaemonOptions::grace_seconds, 3600)},
      {"max-connections", "N",
       "gRPC connections open at once; one beyond it is closed as soon as it is accepted (the "
       "client retries). Lowered to fit the open-file limit (raised to its hard limit at start)",
       [](const DaemonOptions& o) { return absl::StrCat(o.max_connections); },
       IntSetter("max-connections", &DaemonOptions::max_connections, 1, 1 << 20)},
      {"handshake-timeout-seconds", "S",
       "a new connection must complete its TLS handshake and send the HTTP/2 preface within this, "
       "or it is closed",
       [](const DaemonOptions& o) { return absl::StrCat(o.handshake_timeout_seconds); },
       SecondsSetter("handshake-timeout-seconds", &DaemonOptions::handshake_timeout_seconds, 3600)},
      {"idle-timeout-seconds", "S",
       "a connection with no call open for this long is closed (clients reconnect on their next "
       "call); 0 never",
       [](const DaemonOptions& o) { return absl::StrCat(o.idle_timeout_seconds); },
       SecondsSetter("idle-timeout-seconds", &DaemonOptions::idle_timeout_seconds, 86400 * 7)},
      {"max-connection-age-seconds", "S",
       "a connection this old is told to go away (new calls go to a new connection) and is "
       "closed, with the calls still on it, after as long again: bounds a call that trickles its "
       "message in. 0 never (Compute.Stream sessions of a trainer may last hours)",
       [](const DaemonOptions& o) { return absl::StrCat(o.max_connection_age_seconds); },
       SecondsSetter("max-connection-age-seconds", &DaemonOptions::max_connection_age_seconds,
                     86400 * 7)},
  };
  return *flags;
}

// Empties a repeatable flag's list before the command line fills it.
void ClearRepeatable(absl::string_view name, DaemonOptions& options) {
  if (name == "model-dir") options.model_dirs.clear();
}

const FlagSpec* FindFlag(absl::string_view name) {
  for (const FlagSpec& flag : Flags()) {
    if (flag.name == name) return &flag;
  }
  return nullptr;
}

absl::Status ApplyConfigFile(const std::string& path, DaemonOptions& options) {
  const absl::StatusOr<std::string> text = mx::ReadWholeFile(path);
  if (!text.ok()) {
    return FlagError("config", absl::IsNotFound(text.status())
                                   ? absl::StrCat("cannot open '", path, "'")
                                   : std::string(text.status().message()));  // a directory
  }
  std::string repeated, syntax;
  nlohmann::json json = ParseJsonRefusingRepeats(*text, &repeated, &syntax);
  if (json.is_discarded()) {
    return FlagError("config", absl::StrCat("'", path, "' is not valid JSON: ", syntax));
  }
  if (!json.is_object()) {
    return FlagError("config", absl::StrCat("'", path, "' is not a JSON object"));
  }
  if (!repeated.empty()) {
    return FlagError("config", absl::StrCat("'", path, "': setting '", repeated,
                                            "' is given twice (a list takes an array)"));
  }
  for (const auto& [key, value] : json.items()) {
    const FlagSpec* flag = FindFlag(key);
    if (flag == nullptr) {
      return FlagError("config", absl::StrCat("'", path, "': unknown setting '", key, "'"));
    }
    const bool list = flag->repeatable && value.is_array();
    for (const auto& item : list ? value : nlohmann::json::array({value})) {
      std::string text_value;
      if (item.is_string()) {
        text_value = item.get<std::string>();
      } else if (item.is_number() || item.is_boolean()) {
        text_value = item.dump();  // a JSON true is the flag's "true"
      } else {
        return FlagError("config", absl::StrCat("'", path, "': ", key, ": expected a string",
                                                flag->repeatable ? ", a list of strings" : "",
                                                ", a number or a boolean"));
      }
      if (absl::Status s = flag->set(text_value, options); !s.ok()) {
        return FlagError("config", absl::StrCat("'", path, "': ", s.message()));
      }
    }
  }
  return absl::OkStatus();
}

// The TLS flags together: a cert without its key (or the reverse), a client CA
// without both, and files that cannot be read are refused, naming the flag.
absl::Status CheckTlsFlags(const DaemonOptions& o) {
  if (o.tls_cert.empty() != o.tls_key.empty()) {
    return o.tls_cert.empty() ? FlagError("tls-key", "needs --tls-cert (its certificate chain)")
                              : FlagError("tls-cert", "needs --tls-key (its private key)");
  }
  if (!o.tls_client_ca.empty() && o.tls_cert.empty()) {
    return FlagError("tls-client-ca",
                     "needs --tls-cert and --tls-key: mutual TLS is TLS with client certificates");
  }
  const std::pair<const char*, const std::string*> files[] = {
      {"tls-cert", &o.tls_cert}, {"tls-key", &o.tls_key}, {"tls-client-ca", &o.tls_client_ca}};
  for (const auto& [name, path] : files) {
    if (path->empty()) continue;
    std::ifstream in(*path);
    if (!in || in.peek() == std::ifstream::traits_type::eof()) {
      return FlagError(name,
                       absl::StrCat("cannot read '", *path, "' (missing, unreadable or empty)"));
    }
  }
  return absl::OkStatus();
}

// The host and port of a HOST:PORT, [IPV6]:PORT or bare PORT address (the host
// "" for a bare port: every interface), or nullopt for another form.
std::optional<std::pair<std::string, int>> HostAndPort(absl::string_view address) {
  if (const std::optional<int> port = BarePort(address)) {
    return std::make_pair(std::string(), *port);
  }
  int port = -1;
  const size_t colon = address.rfind(':');
  if (colon == absl::string_view::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port)) {
    return std::nullopt;
  }
  absl::string_view host = address.substr(0, colon);
  if (absl::ConsumePrefix(&host, "[")) absl::ConsumeSuffix(&host, "]");
  return std::make_pair(std::string(host), port);
}

// /metrics on the gRPC port: the metrics server bound it first, and the daemon
// then failed with "--listen: cannot listen on ...: Address already in use",
// blaming the flag that was not the cause.
absl::Status CheckListenAddresses(const DaemonOptions& o) {
  const auto grpc = HostAndPort(o.listen);
  if (!grpc || grpc->second == 0 || o.metrics_listen == "off") return absl::OkStatus();
  const auto every_interface = [](const std::string& host) {
    return host.empty() || host == "0.0.0.0" || host == "::" || host == "*";
  };
  for (absl::string_view item : absl::StrSplit(o.metrics_listen, ',')) {
    const auto metrics = HostAndPort(item);
    if (!metrics || metrics->second != grpc->second) continue;
    if (metrics->first == grpc->first || every_interface(metrics->first) ||
        every_interface(grpc->first)) {
      return FlagError("metrics-listen",
                       absl::StrCat("'", item, "' takes --listen's port ", grpc->second, " ('",
                                    o.listen, "'); give /metrics a port of its own"));
    }
  }
  return absl::OkStatus();
}

// The fpga backend's flags with another backend: ignored before, so a daemon
// meant for the board served the CPU emulation without a word.
absl::Status CheckBackendFlags(const DaemonOptions& o) {
  if (o.backend == "fpga") return absl::OkStatus();
  if (!o.xclbin.empty()) {
    return FlagError("xclbin", absl::StrCat("only the fpga backend loads an xclbin; --backend is '",
                                            o.backend, "'"));
  }
  if (o.fpga_device != 0) {
    return FlagError(
        "fpga-device",
        absl::StrCat("only the fpga backend opens a device; --backend is '", o.backend, "'"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<uint64_t> ParseBytes(const std::string& text) {
  absl::string_view rest = absl::StripAsciiWhitespace(text);
  uint64_t unit = 1;
  absl::ConsumeSuffix(&rest, "B");
  absl::ConsumeSuffix(&rest, "i");
  if (absl::ConsumeSuffix(&rest, "K") || absl::ConsumeSuffix(&rest, "k")) {
    unit = uint64_t{1} << 10;
  } else if (absl::ConsumeSuffix(&rest, "M")) {
    unit = uint64_t{1} << 20;
  } else if (absl::ConsumeSuffix(&rest, "G")) {
    unit = uint64_t{1} << 30;
  } else if (absl::ConsumeSuffix(&rest, "T")) {
    unit = uint64_t{1} << 40;
  }
  uint64_t value;
  if (!absl::SimpleAtoi(rest, &value) || value > UINT64_MAX / unit) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected a byte size such as 512M or 8G, got '", text, "'"));
  }
  return value * unit;
}

absl::StatusOr<ParsedCommandLine> ParseCommandLine(const std::vector<std::string>& args) {
  ParsedCommandLine parsed;
  // name → value, in order; --config applies first so the command line wins.
  std::vector<std::pair<std::string, std::string>> given;
  std::optional<std::string> config;
  for (size_t i = 0; i < args.size(); ++i) {
    absl::string_view arg = args[i];
    if (arg == "--help" || arg == "-h") {
      parsed.help = true;
      continue;
    }
    if (arg == "--version") {
      parsed.version = true;
      continue;
    }
    if (!absl::ConsumePrefix(&arg, "--")) {
      return absl::InvalidArgumentError(
          absl::StrCat("unexpected argument '", arg, "'; flags look like --name=value"));
    }
    std::string name(arg), value;
    bool has_value = false;
    if (size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    if (name != "config" && FindFlag(name) == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", name, ": unknown flag (mxserved --help lists them)"));
    }
    if (!has_value) {
      if (i + 1 >= args.size()) return FlagError(name, "missing value");
      value = args[++i];
    }
    if (name == "config") {
      // A second file replaced the first without a word, and an empty one
      // started with the defaults (a black-box test).
      if (config.has_value()) {
        return FlagError("config", absl::StrCat("given twice ('", *config, "', then '", value,
                                                "'); one file holds every setting"));
      }
      if (value.empty()) return FlagError("config", "expected a file, got ''");
      config = value;
    } else {
      given.emplace_back(name, value);
    }
  }
  if (config.has_value()) MX_RETURN_IF_ERROR(ApplyConfigFile(*config, parsed.options));
  // A repeatable flag on the command line replaces the file's list, as any flag
  // given there wins.
  for (const auto& [name, value] : given) {
    if (FindFlag(name)->repeatable) ClearRepeatable(name, parsed.options);
  }
  for (const auto& [name, value] : given) {
    MX_RETURN_IF_ERROR(FindFlag(name)->set(value, parsed.options));
  }
  if (!parsed.help && !parsed.version) {
    MX_RETURN_IF_ERROR(CheckTlsFlags(parsed.options));
    MX_RETURN_IF_ERROR(CheckBackendFlags(parsed.options));
    MX_RETURN_IF_ERROR(CheckListenAddresses(parsed.options));
  }
  return parsed;
}

// Breaks `text` into lines of at most `width` columns, each starting with `indent`.
std::string Wrap(const std::string& text, size_t width, const std::string& indent) {
  std::string out, line;
  for (absl::string_view word : absl::StrSplit(text, ' ', absl::SkipEmpty())) {
    if (!line.empty() && indent.size() + line.size() + 1 + word.size() > width) {
      absl::StrAppend(&out, indent, line, "\n");
      line.clear();
    }
    absl::StrAppend(&line, line.empty() ? "" : " ", word);
  }
  if (!line.empty()) absl::StrAppend(&out, indent, line, "\n");
  return out;
}

std::string HelpText() {
  const DaemonOptions defaults;
  std::string text =
      "usage: mxserved [flags]\n\n"
      "mxserve's daemon: MX-format GEMMs and linear-layer passes over gRPC, tagged with\n"
      "RLHF phase, formats chosen per (phase, layer) by policies, Prometheus metrics.\n\n"
      "Flags (--name=value or --name value):\n";
  for (const FlagSpec& flag : Flags()) {
    absl::StrAppend(&text, "  --", flag.name, " ", flag.value_name, "\n",
                    Wrap(flag.help, 80, "      "), "      default: ", flag.default_text(defaults),
                    "\n");
  }
  absl::StrAppend(&text,
                  "  --config FILE\n      a JSON object of the flags above, e.g. "
                  "{\"workers\": 4};\n      command-line flags win\n"
                  "  --help, --version\n\n"
                  "Signals: SIGTERM or SIGINT stop accepting calls, let in-flight ones "
                  "finish\nwithin --grace-seconds, and exit 0. SIGHUP re-reads the TLS files "
                  "(a bad\nset is logged and the old one kept). Logs are logfmt lines on "
                  "stderr.\n");
  return text;
}

}  // namespace mxserve
