// `mxctl quantize`: quantize a raw float32 file to a format and back, optionally
// writing the block scales and element codes (local, no server).
#include "absl/strings/str_cat.h"
#include "clients/cpp/cli_status.h"
#include "clients/cpp/commands.h"
#include "clients/cpp/common_flags.h"
#include "clients/cpp/raw_io.h"
#include "mx/packed.h"
#include "mx/status_macros.h"

namespace mxctl {

absl::Status RunQuantize(const Args& args) {
  MX_ASSIGN_OR_RETURN(auto flags, Flags::Parse(args, {"format", "rounding", "seed", "scale-rule", "input",
                                                      "output", "scales", "codes"}));
  MX_ASSIGN_OR_RETURN(auto format, FormatFlag(flags, "format"));
  MX_ASSIGN_OR_RETURN(auto options, QuantizeOptionsFromFlags(flags));
  MX_ASSIGN_OR_RETURN(auto input_path, flags.Require("input"));
  MX_ASSIGN_OR_RETURN(auto output_path, flags.Require("output"));
  if (flags.Has("scales") && !mx::IsBlockScaled(format)) {
    return UsageError(absl::StrCat("--scales: ", mx::FormatName(format),
                                   " has no block scales (only MX formats and NVFP4 do)"));
  }
  if (flags.Has("codes") && mx::Traits(format).element_bits > 8) {
    return UsageError(
        absl::StrCat("--codes: ", mx::FormatName(format), " elements do not fit one byte"));
  }
  MX_ASSIGN_OR_RETURN(auto values, ReadFloat32File(input_path, "--input"));

  // The whole file is one row (one tensor): MX or NVFP4 blocks along it, or one
  // INT8 scale for it.
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

}  // namespace mxctl
