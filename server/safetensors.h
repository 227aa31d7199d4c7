// Reading safetensors files, written from the format's published description:
// an 8-byte little-endian header length N, N bytes of JSON mapping each tensor
// name to {"dtype", "shape", "data_offsets": [begin, end]} (offsets relative to
// the data that follows the header; "__metadata__" holds free-form strings),
// then the raw little-endian tensor data.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "mx/format.h"

namespace mxserve {

struct SafetensorsTensor {
  std::string name;
  mx::Format dtype;  // kFp32, kBf16 or kFp16: the element types mxserve accepts
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte range in the data section
  uint64_t end = 0;
};

class SafetensorsFile {
 public:
  // Reads and validates the header; tensor data is read on demand. Errors name
  // the file and the offending tensor or field.
  static absl::StatusOr<SafetensorsFile> Open(const std::string& path);

  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }
  const SafetensorsTensor* Find(absl::string_view name) const;
  // The tensor's values widened to FP32 (exact for BF16 and FP16).
  absl::StatusOr<std::vector<float>> ReadFloat32(absl::string_view name) const;

 private:
  std::string path_;
  uint64_t data_start_ = 0;
  std::vector<SafetensorsTensor> tensors_;
};

}  // namespace mxserve
