// Raw little-endian tensor files, as mxctl and the test scripts exchange them:
// no header, just the values.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace mxctl {

// Reads a file of float32 values; fails if it is missing or its size is not a
// multiple of 4 bytes. `what` names the file's role in messages (e.g. "--a").
absl::StatusOr<std::vector<float>> ReadFloat32File(const std::string& path,
                                                   const std::string& what);
absl::Status WriteFloat32File(const std::string& path, std::span<const float> values);
absl::Status WriteBytesFile(const std::string& path, std::span<const uint8_t> bytes);

}  // namespace mxctl
