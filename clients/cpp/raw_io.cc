#include "clients/cpp/raw_io.h"

#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "mx/read_file.h"

namespace mxctl {
namespace {

absl::Status WriteRaw(const std::string& path, const void* data, size_t size) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return absl::NotFoundError(absl::StrCat("cannot write '", path, "'"));
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(size));
  if (!out.flush()) return absl::DataLossError(absl::StrCat("short write to '", path, "'"));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<float>> ReadFloat32File(const std::string& path,
                                                   const std::string& what) {
  absl::StatusOr<std::string> read = mx::ReadWholeFile(path);
  if (!read.ok()) {
    return absl::Status(read.status().code(), absl::StrCat(what, ": ", read.status().message()));
  }
  const std::string& bytes = *read;
  if (bytes.size() % 4 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": '", path, "' is ", bytes.size(),
                                                   " bytes, not a whole number of float32"));
  }
  std::vector<float> values(bytes.size() / 4);
  std::memcpy(values.data(), bytes.data(), bytes.size());  // x86-64 and the FPGA host are LE
  return values;
}

absl::Status WriteFloat32File(const std::string& path, std::span<const float> values) {
  return WriteRaw(path, values.data(), values.size_bytes());
}

absl::Status WriteBytesFile(const std::string& path, std::span<const uint8_t> bytes) {
  return WriteRaw(path, bytes.data(), bytes.size());
}

}  // namespace mxctl
