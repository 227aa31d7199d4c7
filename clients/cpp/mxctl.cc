// mxctl: the mxserve command line. Local subcommands (no server) quantize tensors
// and run the reference GEMM on raw float32 files; `demo` shows each format's error.
//
// Exit status: 0 on success, 2 on a usage or input error (one line on stderr).
#include <cstdio>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "clients/cpp/demo.h"
#include "clients/cpp/flags.h"
#include "clients/cpp/raw_io.h"
#include "mx/format.h"
#include "mx/packed.h"
#include "mx/reference_gemm.h"
#include "mx/status_macros.h"

namespace mxctl {
namespace {

constexpr int kUsageError = 2;

constexpr char kUsage[] = R"(usage: mxctl <command> [flags]

Commands (local, no server):
  quantize   quantize a raw float32 file to a format and back
      --format F [--rounding even|away] [--scale-rule floor|nosat]
      --input IN.f32 --output OUT.f32 [--scales SCALES.u8] [--codes CODES.u8]
      Blocks are 32 consecutive values; a short last block is padded with zeros.
      OUT is the dequantized result; SCALES one E8M0 byte per block (MX formats);
      CODES one element code per byte, in the low bits (formats of <= 8 bits).
  gemm       C = A·B with the reference GEMM (the numerics contract)
      --format F [--format-b F2] [--rounding even|away] [--scale-rule floor|nosat]
      --a A.f32 --b B.f32 --m M --k K --n N --output C.f32
      A is MxK and B is KxN, row-major float32; both are quantized along K
      (A per row, B per column), A to F and B to F2 (default F).
  demo       quantize a tensor and run a GEMM in every format; print the errors
  formats    list the formats and their traits
  help       this text

Formats (case-insensitive): )";

absl::Status UsageError(std::string message) { return absl::InvalidArgumentError(message); }

absl::StatusOr<mx::QuantizeOptions> ParseOptions(const Flags& flags) {
  mx::QuantizeOptions options;
  const std::string rounding = flags.Get("rounding").value_or("even");
  if (rounding == "away") {
    options.rounding = mx::Rounding::kNearestAway;
  } else if (rounding != "even") {
    return UsageError(absl::StrCat("--rounding: expected 'even' or 'away', got '", rounding, "'"));
  }
  const std::string rule = flags.Get("scale-rule").value_or("floor");
  if (rule == "nosat") {
    options.scale_rule = mx::ScaleRule::kNoSaturation;
  } else if (rule != "floor") {
    return UsageError(absl::StrCat("--scale-rule: expected 'floor' or 'nosat', got '", rule, "'"));
  }
  return options;
}

absl::StatusOr<mx::Format> FormatFlag(const Flags& flags, const std::string& name) {
  absl::StatusOr<std::string> text = flags.Require(name);
  if (!text.ok()) return text.status();
  absl::StatusOr<mx::Format> format = mx::ParseFormat(*text);
  if (!format.ok()) return UsageError(absl::StrCat("--", name, ": ", format.status().message()));
  return format;
}

absl::Status Quantize(const std::vector<std::string>& args) {
  MX_ASSIGN_OR_RETURN(auto flags, Flags::Parse(args, {"format", "rounding", "scale-rule", "input",
                                                      "output", "scales", "codes"}));
  MX_ASSIGN_OR_RETURN(auto format, FormatFlag(flags, "format"));
  MX_ASSIGN_OR_RETURN(auto options, ParseOptions(flags));
  MX_ASSIGN_OR_RETURN(auto input_path, flags.Require("input"));
  MX_ASSIGN_OR_RETURN(auto output_path, flags.Require("output"));
  if (flags.Has("scales") && !mx::IsMx(format)) {
    return UsageError(absl::StrCat("--scales: ", mx::FormatName(format),
                                   " has no block scales (only MX formats do)"));
  }
  if (flags.Has("codes") && mx::Traits(format).element_bits > 8) {
    return UsageError(
        absl::StrCat("--codes: ", mx::FormatName(format), " elements do not fit one byte"));
  }
  MX_ASSIGN_OR_RETURN(auto values, ReadFloat32File(input_path, "--input"));

  // The whole file is one row: MX blocks along it, or one INT8 scale for it.
  const int64_t n = static_cast<int64_t>(values.size());
  MX_ASSIGN_OR_RETURN(auto quantized, mx::QuantizeRows(values, 1, n, format, options));
  MX_RETURN_IF_ERROR(WriteFloat32File(output_path, mx::Dequantize(quantized)));
  if (auto path = flags.Get("scales")) {
    MX_RETURN_IF_ERROR(WriteBytesFile(*path, quantized.block_scales));
  }
  if (auto path = flags.Get("codes")) {
    std::vector<uint8_t> codes(n);
    for (int64_t i = 0; i < n; ++i)
      codes[i] = static_cast<uint8_t>(mx::ElementCode(quantized, 0, i));
    MX_RETURN_IF_ERROR(WriteBytesFile(*path, codes));
  }
  return absl::OkStatus();
}

absl::Status Gemm(const std::vector<std::string>& args) {
  MX_ASSIGN_OR_RETURN(
      auto flags, Flags::Parse(args, {"format", "format-b", "rounding", "scale-rule", "a", "b", "m",
                                      "k", "n", "output"}));
  MX_ASSIGN_OR_RETURN(auto format_a, FormatFlag(flags, "format"));
  mx::Format format_b = format_a;
  if (flags.Has("format-b")) {
    MX_ASSIGN_OR_RETURN(format_b, FormatFlag(flags, "format-b"));
  }
  MX_ASSIGN_OR_RETURN(auto options, ParseOptions(flags));
  constexpr int64_t kMaxDim = int64_t{1} << 20;
  MX_ASSIGN_OR_RETURN(auto m, flags.RequireInt("m", 1, kMaxDim));
  MX_ASSIGN_OR_RETURN(auto k, flags.RequireInt("k", 1, kMaxDim));
  MX_ASSIGN_OR_RETURN(auto n, flags.RequireInt("n", 1, kMaxDim));
  MX_ASSIGN_OR_RETURN(auto a_path, flags.Require("a"));
  MX_ASSIGN_OR_RETURN(auto b_path, flags.Require("b"));
  MX_ASSIGN_OR_RETURN(auto output_path, flags.Require("output"));
  MX_ASSIGN_OR_RETURN(auto a, ReadFloat32File(a_path, "--a"));
  MX_ASSIGN_OR_RETURN(auto b, ReadFloat32File(b_path, "--b"));
  if (static_cast<int64_t>(a.size()) != m * k) {
    return UsageError(absl::StrCat("--a: '", a_path, "' holds ", a.size(),
                                   " floats, expected M*K = ", m, "*", k, " = ", m * k));
  }
  if (static_cast<int64_t>(b.size()) != k * n) {
    return UsageError(absl::StrCat("--b: '", b_path, "' holds ", b.size(),
                                   " floats, expected K*N = ", k, "*", n, " = ", k * n));
  }
  MX_ASSIGN_OR_RETURN(auto c, mx::ReferenceGemm(a, format_a, b, format_b, m, k, n, options));
  return WriteFloat32File(output_path, c);
}

void PrintFormats() {
  std::printf("%-11s %4s %8s %5s %13s %13s  %s\n", "format", "bits", "exp/man", "emax",
              "max normal", "min subnorm", "specials");
  for (const mx::FormatTraits& t : mx::AllFormats()) {
    std::printf("%-11s %4d %4d/%-3d %5d %13.6g %13.6g  %s\n", std::string(t.name).c_str(),
                t.element_bits, t.exponent_bits, t.mantissa_bits, t.emax, t.max_normal,
                t.min_subnormal, std::string(t.special_encodings).c_str());
  }
}

int Main(int argc, char** argv) {
  const std::string command = argc > 1 ? argv[1] : "help";
  const std::vector<std::string> args(argv + (argc > 1 ? 2 : 1), argv + argc);
  if (command == "help" || command == "--help" || command == "-h") {
    std::printf("%s%s\n", kUsage, std::string(mx::FormatNameList()).c_str());
    return 0;
  }
  if (command == "demo") return RunDemo();
  if (command == "formats") {
    PrintFormats();
    return 0;
  }
  absl::Status status;
  if (command == "quantize") {
    status = Quantize(args);
  } else if (command == "gemm") {
    status = Gemm(args);
  } else {
    status = UsageError(absl::StrCat("unknown command '", command, "' (try 'mxctl help')"));
  }
  if (!status.ok()) {
    std::fprintf(stderr, "mxctl: error: %s\n", std::string(status.message()).c_str());
    return kUsageError;
  }
  return 0;
}

}  // namespace
}  // namespace mxctl

int main(int argc, char** argv) { return mxctl::Main(argc, argv); }
