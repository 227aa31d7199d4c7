#include "server/safetensors.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "mx/element.h"

namespace mxserve {
namespace {

// Refuse absurd headers before allocating for them.
constexpr uint64_t kMaxHeaderBytes = uint64_t{100} << 20;

absl::Status Invalid(const std::string& path, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("safetensors '", path, "': ", what));
}

int ElementBytes(mx::Format dtype) { return mx::Traits(dtype).element_bits / 8; }

}  // namespace

absl::StatusOr<SafetensorsFile> SafetensorsFile::Open(const std::string& path) {
  std::error_code error;
  const uint64_t file_size = std::filesystem::file_size(path, error);
  if (error) return absl::NotFoundError(absl::StrCat("safetensors '", path, "': cannot read"));
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("safetensors '", path, "': cannot read"));

  uint8_t length_bytes[8];
  if (file_size < 8 || !in.read(reinterpret_cast<char*>(length_bytes), 8)) {
    return Invalid(path, "shorter than the 8-byte header length");
  }
  uint64_t header_size = 0;
  for (int i = 7; i >= 0; --i) header_size = header_size << 8 | length_bytes[i];
  if (header_size > kMaxHeaderBytes || header_size > file_size - 8) {
    return Invalid(path, absl::StrCat("header length ", header_size, " exceeds the file (",
                                      file_size, " bytes)"));
  }
  std::string header(header_size, '\0');
  if (!in.read(header.data(), static_cast<std::streamsize>(header_size))) {
    return Invalid(path, "truncated header");
  }
  const nlohmann::json json = nlohmann::json::parse(header, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object()) return Invalid(path, "header is not a JSON object");

  SafetensorsFile file;
  file.path_ = path;
  file.data_start_ = 8 + header_size;
  const uint64_t data_size = file_size - file.data_start_;
  for (const auto& [name, entry] : json.items()) {
    if (name == "__metadata__") continue;
    const std::string field = absl::StrCat("tensor '", name, "'");
    if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") ||
        !entry.contains("data_offsets")) {
      return Invalid(path, field + ": expected an object with dtype, shape and data_offsets");
    }
    SafetensorsTensor tensor;
    tensor.name = name;
    const std::string dtype = entry["dtype"].is_string() ? entry["dtype"].get<std::string>() : "";
    if (dtype == "F32") {
      tensor.dtype = mx::Format::kFp32;
    } else if (dtype == "BF16") {
      tensor.dtype = mx::Format::kBf16;
    } else if (dtype == "F16") {
      tensor.dtype = mx::Format::kFp16;
    } else {
      return Invalid(path, absl::StrCat(field, ": dtype '", dtype,
                                        "' unsupported; expected F32, BF16 or F16"));
    }
    uint64_t elements = 1;
    if (!entry["shape"].is_array()) return Invalid(path, field + ": shape must be an array");
    for (const auto& dim : entry["shape"]) {
      if (!dim.is_number_unsigned() || dim.get<uint64_t>() > (uint64_t{1} << 40)) {
        return Invalid(path, field + ": shape must hold non-negative integers");
      }
      tensor.shape.push_back(dim.get<int64_t>());
      elements *= dim.get<uint64_t>();
      if (elements > (uint64_t{1} << 40)) return Invalid(path, field + ": too many elements");
    }
    const auto& offsets = entry["data_offsets"];
    if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
        !offsets[1].is_number_unsigned()) {
      return Invalid(path, field + ": data_offsets must be [begin, end]");
    }
    tensor.begin = offsets[0].get<uint64_t>();
    tensor.end = offsets[1].get<uint64_t>();
    if (tensor.begin > tensor.end || tensor.end > data_size) {
      return Invalid(path, absl::StrCat(field, ": data_offsets [", tensor.begin, ", ", tensor.end,
                                        ") outside the ", data_size, "-byte data section"));
    }
    if (tensor.end - tensor.begin != elements * ElementBytes(tensor.dtype)) {
      return Invalid(path, absl::StrCat(field, ": ", tensor.end - tensor.begin,
                                        " bytes of data for ", elements, " ", dtype, " elements"));
    }
    file.tensors_.push_back(std::move(tensor));
  }
  return file;
}

const SafetensorsTensor* SafetensorsFile::Find(absl::string_view name) const {
  for (const SafetensorsTensor& t : tensors_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

absl::StatusOr<std::vector<float>> SafetensorsFile::ReadFloat32(absl::string_view name) const {
  const SafetensorsTensor* tensor = Find(name);
  if (tensor == nullptr) {
    return absl::NotFoundError(absl::StrCat("safetensors '", path_, "': no tensor '", name, "'"));
  }
  std::string bytes(tensor->end - tensor->begin, '\0');
  std::ifstream in(path_, std::ios::binary);
  in.seekg(static_cast<std::streamoff>(data_start_ + tensor->begin));
  if (!in.read(bytes.data(), static_cast<std::streamsize>(bytes.size()))) {
    return absl::DataLossError(absl::StrCat("safetensors '", path_, "': tensor '", name,
                                            "' could not be read (file changed?)"));
  }
  const int width = ElementBytes(tensor->dtype);
  std::vector<float> values(bytes.size() / width);
  mx::WidenToFloat(tensor->dtype, bytes.data(), values.size(), values.data());
  return values;
}

}  // namespace mxserve
