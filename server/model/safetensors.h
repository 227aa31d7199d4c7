// Reading safetensors files, written from the format's published description:
// an 8-byte little-endian header length N, N bytes of JSON mapping each tensor
// name to {"dtype", "shape", "data_offsets": [begin, end]} (offsets relative to
// the data that follows the header; "__metadata__" holds free-form strings),
// then the raw little-endian tensor data. Tensors' byte ranges must not overlap.
//
// Errors describe the file's structure, never its bytes: a file that is not a
// safetensors file says so without repeating what it holds.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "mx/format.h"
#include "server/base/unique_fd.h"

namespace mxserve {

struct SafetensorsTensor {
  std::string name;
  mx::Format dtype;  // kFp32, kBf16 or kFp16: the element types mxserve accepts
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte range in the data section
  uint64_t end = 0;
};

// Largest header accepted (the format's own readers use the same bound).
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = uint64_t{100} << 20;

// Parses and validates a header (the JSON text) for a data section of
// `data_bytes`. INVALID_ARGUMENT naming the tensor and field; tensors in the
// order of their data.
absl::StatusOr<std::vector<SafetensorsTensor>> ParseSafetensorsHeader(absl::string_view json,
                                                                      uint64_t data_bytes);

class SafetensorsFile {
 public:
  // Reads and validates the header of an open file; tensor data is read on
  // demand through the same descriptor. `name` is how errors refer to the file.
  static absl::StatusOr<SafetensorsFile> Read(UniqueFd fd, std::string name);
  // Opens `path` and reads it as above (tools and tests; the daemon opens
  // files through ModelDirs).
  static absl::StatusOr<SafetensorsFile> Open(const std::string& path);

  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }
  const SafetensorsTensor* Find(absl::string_view name) const;
  // The tensor's values widened to FP32 (exact for BF16 and FP16).
  absl::StatusOr<std::vector<float>> ReadFloat32(absl::string_view name) const;

 private:
  std::shared_ptr<const UniqueFd> fd_;
  std::string name_;
  uint64_t data_start_ = 0;
  std::vector<SafetensorsTensor> tensors_;
};

}  // namespace mxserve
