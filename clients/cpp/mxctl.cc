// mxctl: the mxserve command line. Local subcommands quantize tensors and run the
// reference GEMM on raw float32 files; remote ones talk to the daemon (mxserved)
// at --server: health, models, policies, energy, GEMMs and layer passes, and a
// load generator.
//
// Exit status: 0 on success; 1 when the daemon (or the RPC) failed; 2 on a usage
// or input error. Errors are one line on stderr, `mxctl: error: ...`.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "clients/cpp/cli_status.h"
#include "clients/cpp/commands.h"
#include "clients/cpp/demo.h"
#include "mx/format.h"

namespace mxctl {
namespace {

constexpr char kUsage[] = R"(usage: mxctl <command> [flags] [--server ADDR] [--timeout T]
             [--tls-ca FILE [--tls-cert FILE --tls-key FILE]] [--token-file FILE]

Commands (local, no server):
  quantize   quantize a raw float32 file to a format and back
      --format F [--rounding even|away|stochastic --seed S]
      [--scale-rule floor|nosat|ceil|rceil] --input IN.f32 --output OUT.f32 [--scales SCALES.u8] [--codes CODES.u8]
      Blocks are 32 consecutive values (NVFP4: 16, under one tensor scale for
      the file; NF4, BNB_FP4, LO_BCQ: 64); a short last block is padded with
      zeros. OUT is the dequantized result; SCALES one E8M0 byte per block (MX;
      NVFP4: UE4M3; NF4, BNB_FP4: the FP32 absmax, 4 bytes; LO_BCQ: the FP32
      scale then 8 codebook selectors as nibbles, 8 bytes); CODES one element
      code per byte, in the low bits (formats of <= 8 bits).
  gemm       C = A·B with the reference GEMM (the numerics contract), or on the
             daemon (Compute.Gemm) when --server is given; the same C either
             way, whatever the daemon's backend (mxserved --backend hls-sim
             runs the FPGA kernel's C++)
      --format F [--format-b F2] [--rounding even|away|stochastic --seed S]
      [--scale-rule floor|nosat|ceil|rceil]
      --a A.f32 --b B.f32 --m M --k K --n N --output C.f32 [--phase P]
      [--run TAG]
      A is MxK and B is KxN, row-major float32; both are quantized along K
      (A per row, B per column), A to F and B to F2 (default F). --phase
      (default rollout) and --run (default none) tag the daemon's request.
      Scale rules (an MX block's scale from its largest magnitude amax):
      floor 2^(floor(log2 amax) - emax), the OCP rule; nosat the same, one
      up where amax would round past max normal; ceil 2^(ceil(log2 amax) -
      emax); rceil 2^ceil(log2(amax / max normal)), cuBLAS's. Rounding
      stochastic rounds an element up with probability equal to the fraction
      of a step it lies above the grid, drawing bits from the key (S, the
      operand, its index in the tensor): the same S gives the same bits here
      and on the daemon.
  demo       quantize a tensor and run a GEMM in every format; print the errors
  formats    list the formats and their traits, with the bits an element costs
             stored (its share of the scales included)
  help       this text

Commands (on the daemon at --server, default 127.0.0.1:50051):
  health     grpc.health.v1 check; prints SERVING or NOT_SERVING (exit 0 only
             when serving)   [--service NAME]
  models list
  models register --name M (--layer NAME:OUTxIN[:bias] ... | --layers-json FILE)
             [--policy P]      FILE: [{"name", "out_features", "in_features", "bias"}]
  models upload --model M --layer L --weight W.f32 [--bias B.f32] [--publish]
             W is OUTxIN row-major float32, sent in chunks of at most 1 MiB
  models load --model M --path FILE.safetensors [--prefix P] [--publish]
             FILE is read by the daemon on its host, inside one of its --model-dir
  models publish|describe|delete M        (or --model M)
  policy put --file P.json | get NAME | list | delete NAME
  policy activate --model M --policy P
  policy resolve --model M [--policy P]   the phase x layer format table
  policy generate --model M --name P --kind fraction|budget|tolerance [...]
             a policy from the model's newest profile (mxctl profile), put on
             the daemon; prints its phase x layer table and its modelled J/token
             per phase against FP16. Per-phase values are V (every phase) or
             rollout=V,reward=V,update=V; phases not generated run in --high.
      fraction:  --fraction F --low FORMAT [--high FORMAT]   round(F x layers),
                 the most tolerant by --score, in --low
      budget:    --budget B | --relative-budget R   least summed score with
                 cost <= B per token (R: a fraction of all --high), solved exactly
      tolerance: --tolerance T   least cost with summed score <= T
      (learned, DynaQuant's RL search: Python's mxserve.torch.search, which
      runs the whole model; then policy put)
      [--phase rollout|reward|update ...] [--high FORMAT (default FP16)]
      [--score auto|rel_error|fisher|mse] [--metric energy|time|bits]
      [--candidates F,...] [--group 'GLOB|GLOB' ...] (globs of one block share
      a format) [--description TEXT] [--version V] [--dry-run]
  profile    a weight-only sensitivity profile of a model's published weights:
             the relative error ||W_F - W|| / ||W|| per layer and format, kept
             by the daemon (Python's mxserve.torch.profile adds calibration data)
      --model M [--formats F,...] [--csv FILE] [--layer L ...]
      [--batch-tokens N] [--fp64]   default formats: every MX format, INT8,
      BF16, FP16; FILE gets the daemon's CSV (one row per layer and format)
  energy     joules, busy seconds and requests per source and phase
      [--since SECONDS]   only the last SECONDS (default: since the daemon started)
      [--run TAG]         only what requests and power samples tagged TAG booked
                          (default: every run together)
  forward    Y = X·Wᵀ (+ bias) for a registered layer; prints how it ran
      --model M --layer L --phase P [--format F|policy] --input X.f32 --m M
      --output Y.f32 [--min-weight-version V] [--run TAG]   X is MxK, Y is MxOUT
  bench      load generator: a throwaway model with one NxK layer, C requests
             of an MxK input kept in flight, then requests/s, GFLOP/s and
             p50/p90/p99 latency
      --m M --k K --n N [--phase P] [--format F|policy] [--concurrency C]
      [--duration 10s] [--warmup 1s] [--stream] [--json] [--run TAG]

Global flags, before or after the command:
  --server ADDR   the daemon's address (host:port)
  --timeout T     deadline of each RPC (default 60s; e.g. 500ms, 2m)
  --tls-ca FILE   speak TLS; the daemon's certificate must be signed by this
                  PEM CA (mxserved --tls-cert); default: plaintext
  --tls-cert FILE, --tls-key FILE
                  a PEM client certificate and its key, for a daemon that
                  requires one (mxserved --tls-client-ca); needs --tls-ca
  --token-file FILE
                  send the token this file holds (alone, a trailing newline is
                  dropped) as `authorization: Bearer` metadata on every call
                  (mxserved --auth-tokens)

Phases: rollout, reward, update. Run tags (--run): 1-64 of [A-Za-z0-9_.:/-],
the experiment run a request's energy is booked to (see mxctl energy --run).
Files are raw little-endian float32.
Exit status: 0 ok, 1 the daemon or the RPC failed, 2 usage or input error.

Formats (case-insensitive): )";

// The token a --token-file holds, without its trailing newline.
absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  if (in) text << in.rdbuf();
  std::string token = text.str();
  while (!token.empty() && (token.back() == '\n' || token.back() == '\r')) token.pop_back();
  if (!in || token.empty()) {
    return UsageError(absl::StrCat("--token-file: cannot read a token from '", path,
                                   "' (missing, unreadable or empty)"));
  }
  if (token.find_first_of("\r\n") != std::string::npos) {
    return UsageError(absl::StrCat("--token-file: '", path, "' holds more than one line"));
  }
  return token;
}

// Takes the global flags (--server, --timeout, TLS, token) out of the command
// line, wherever they are.
absl::StatusOr<RemoteContext> TakeGlobalFlags(std::vector<std::string>& args) {
  RemoteContext context;
  std::vector<std::string> rest;
  std::vector<std::string> globals;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    bool global = false;
    for (const char* name :
         {"--server", "--timeout", "--tls-ca", "--tls-cert", "--tls-key", "--token-file"}) {
      if (arg != name && arg.rfind(absl::StrCat(name, "="), 0) != 0) continue;
      global = true;
      globals.push_back(arg);
      if (arg == name) {
        if (i + 1 >= args.size()) return UsageError(absl::StrCat("flag ", name, " needs a value"));
        globals.push_back(args[++i]);
      }
      break;
    }
    if (!global) rest.push_back(arg);
  }
  absl::StatusOr<Flags> flags =
      Flags::Parse(globals, {"server", "timeout", "tls-ca", "tls-cert", "tls-key", "token-file"});
  if (!flags.ok()) return flags.status();
  if (auto server = flags->Get("server")) {
    if (server->empty()) return UsageError("--server: expected host:port, got ''");
    context.server = *server;
    context.server_given = true;
  }
  absl::StatusOr<absl::Duration> timeout = flags->DurationOr("timeout", context.timeout);
  if (!timeout.ok()) return timeout.status();
  if (*timeout <= absl::ZeroDuration()) return UsageError("--timeout: must be positive");
  context.timeout = *timeout;
  context.tls_ca = flags->Get("tls-ca").value_or("");
  context.tls_cert = flags->Get("tls-cert").value_or("");
  context.tls_key = flags->Get("tls-key").value_or("");
  if (absl::Status tls = CheckTlsFlags(context); !tls.ok()) return tls;
  if (auto token_file = flags->Get("token-file")) {
    absl::StatusOr<std::string> token = ReadTokenFile(*token_file);
    if (!token.ok()) return token.status();
    context.token = *std::move(token);
  }
  args = std::move(rest);
  return context;
}

// Bits one element costs stored, its share of the scales included: an MX block's
// E8M0 byte over its 32 elements, a codebook block's FP32 absmax over 64 (a
// LO_BCQ array's scale and selectors, 8 bytes), INT8's FP32 per-row scale over
// the row's K.
std::string StoredBits(const mx::FormatTraits& t) {
  if (t.kind == mx::FormatKind::kNvFloat) {
    return absl::StrFormat("%.2f+32/T", t.bits_with_block_scale());
  }
  if (t.kind == mx::FormatKind::kInt8) return absl::StrCat(t.element_bits, "+32/K");
  if (t.is_block_scaled()) return absl::StrFormat("%.2f", t.bits_with_block_scale());
  return absl::StrCat(t.element_bits);
}

void PrintFormats() {
  std::printf("%-11s %4s %7s %8s %5s %13s %13s  %s\n", "format", "bits", "stored", "exp/man",
              "emax", "max normal", "min subnorm", "specials");
  for (const mx::FormatTraits& t : mx::AllFormats()) {
    std::printf("%-11s %4d %7s %4d/%-3d %5d %13.6g %13.6g  %s\n", std::string(t.name).c_str(),
                t.element_bits, StoredBits(t).c_str(), t.exponent_bits, t.mantissa_bits, t.emax,
                t.max_normal, t.min_subnormal, std::string(t.special_encodings).c_str());
  }
  std::printf("\nbits: one element; stored: with its share of the scales (an MX block's E8M0\n"
              "byte per 32 elements; NVFP4's UE4M3 byte per 16, plus one FP32 scale per\n"
              "tensor of T elements; NF4's and BNB_FP4's FP32 absmax per 64; LO_BCQ's FP32\n"
              "scale and 8 codebook selectors per 64; INT8's FP32 scale per row of K). NF4\n"
              "and BNB_FP4 elements are table values in [-1, 1]; LO_BCQ's are INT6 codebook\n"
              "entries times the array's scale (max normal, min subnorm: at scale 1).\n");
}

absl::StatusOr<int> Dispatch(const std::string& command, const RemoteContext& remote,
                             const Args& args) {
  static const auto* known = new std::set<std::string>{
      "help", "--help", "-h", "demo", "formats", "health", "quantize", "gemm",
      "models", "policy", "profile", "energy", "forward", "bench"};
  if (!known->contains(command)) {  // before --help: `mxctl nosuch --help` is a typo too
    return UsageError(absl::StrCat("unknown command '", command, "' (try 'mxctl help')"));
  }
  // `mxctl <command> --help` too: the usage covers every command's flags.
  const bool asks_help = std::find(args.begin(), args.end(), "--help") != args.end() ||
                         std::find(args.begin(), args.end(), "-h") != args.end();
  if (asks_help && (command == "models" || command == "policy")) {
    // `mxctl models bogus --help` is a typo too, not a request for help.
    const absl::Status verb =
        (command == "models" ? kModelsSubcommands : kPolicySubcommands).Check(args);
    if (!verb.ok()) return verb;
  }
  if (command == "help" || command == "--help" || command == "-h" || asks_help) {
    std::printf("%s%s\n", kUsage, std::string(mx::FormatNameList()).c_str());
    return 0;
  }
  if (command == "demo") return RunDemo();
  if (command == "formats") {
    PrintFormats();
    return 0;
  }
  if (command == "health") return RunHealth(remote, args);
  absl::Status status;
  if (command == "quantize") {
    status = RunQuantize(args);
  } else if (command == "gemm") {
    status = RunGemm(remote, args);
  } else if (command == "models") {
    status = RunModels(remote, args);
  } else if (command == "policy") {
    status = RunPolicy(remote, args);
  } else if (command == "profile") {
    status = RunProfile(remote, args);
  } else if (command == "energy") {
    status = RunEnergy(remote, args);
  } else if (command == "forward") {
    status = RunForward(remote, args);
  } else {
    status = RunBench(remote, args);
  }
  if (!status.ok()) return status;
  return 0;
}

int Main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  absl::StatusOr<RemoteContext> remote = TakeGlobalFlags(args);
  absl::StatusOr<int> exit_code = 0;
  if (!remote.ok()) {
    exit_code = remote.status();
  } else {
    if (args.empty()) {
      // No command is a usage error: the usage on stderr, exit 2 (a script that
      // lost its arguments must not read success).
      std::fprintf(stderr, "%s%s\n", kUsage, std::string(mx::FormatNameList()).c_str());
      return 2;
    }
    const std::string command = args.front();
    args.erase(args.begin());
    exit_code = Dispatch(command, *remote, args);
    if (!exit_code.ok()) exit_code = ExplainTransportError(*remote, exit_code.status());
  }
  if (!exit_code.ok()) {
    // One line, whatever the daemon's message holds.
    const std::string message =
        absl::StrReplaceAll(exit_code.status().message(), {{"\r", " "}, {"\n", " "}});
    std::fprintf(stderr, "mxctl: error: %s\n", message.c_str());
    return ExitCodeFor(exit_code.status());
  }
  return *exit_code;
}

}  // namespace
}  // namespace mxctl

int main(int argc, char** argv) { return mxctl::Main(argc, argv); }
