#include "server/model/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "mx/checked_math.h"
#include "mx/element.h"
#include "server/base/quote.h"
#include "server/base/strict_json.h"

namespace mxserve {
namespace {

// More elements than any tensor mxserve takes (layers are at most 2^20 × 2^20).
constexpr uint64_t kMaxElements = uint64_t{1} << 40;

absl::Status Invalid(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("safetensors header: ", what));
}

int ElementBytes(mx::Format dtype) { return mx::Traits(dtype).element_bits / 8; }

// pread until `size` bytes are in, or an error or end of file.
bool ReadAt(int fd, uint64_t offset, char* out, uint64_t size) {
  while (size > 0) {
    const ssize_t n = ::pread(fd, out, size, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    out += n;
    offset += static_cast<uint64_t>(n);
    size -= static_cast<uint64_t>(n);
  }
  return true;
}

absl::StatusOr<SafetensorsTensor> ParseEntry(const std::string& name, const nlohmann::json& entry,
                                             uint64_t data_bytes) {
  const std::string field = absl::StrCat("tensor ", Quote(name));
  if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") ||
      !entry.contains("data_offsets")) {
    return Invalid(field + ": expected an object with dtype, shape and data_offsets");
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
    return Invalid(
        absl::StrCat(field, ": dtype ", Quote(dtype), " unsupported; expected F32, BF16 or F16"));
  }
  uint64_t elements = 1;
  if (!entry["shape"].is_array()) return Invalid(field + ": shape must be an array");
  for (const auto& dim : entry["shape"]) {
    if (!dim.is_number_unsigned() || dim.get<uint64_t>() > kMaxElements) {
      return Invalid(field + ": shape must hold non-negative integers");
    }
    tensor.shape.push_back(dim.get<int64_t>());
    const std::optional<uint64_t> product = mx::CheckedMul(elements, dim.get<uint64_t>());
    if (!product || *product > kMaxElements) return Invalid(field + ": too many elements");
    elements = *product;
  }
  const auto& offsets = entry["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
      !offsets[1].is_number_unsigned()) {
    return Invalid(field + ": data_offsets must be [begin, end]");
  }
  tensor.begin = offsets[0].get<uint64_t>();
  tensor.end = offsets[1].get<uint64_t>();
  if (tensor.begin > tensor.end || tensor.end > data_bytes) {
    return Invalid(absl::StrCat(field, ": data_offsets [", tensor.begin, ", ", tensor.end,
                                ") outside the ", data_bytes, "-byte data section"));
  }
  if (tensor.end - tensor.begin != elements * ElementBytes(tensor.dtype)) {
    return Invalid(absl::StrCat(field, ": ", tensor.end - tensor.begin, " bytes of data for ",
                                elements, " ", dtype, " elements"));
  }
  return tensor;
}

}  // namespace

absl::StatusOr<std::vector<SafetensorsTensor>> ParseSafetensorsHeader(absl::string_view json,
                                                                      uint64_t data_bytes) {
  std::string repeated, syntax;
  const nlohmann::json header = ParseJsonRefusingRepeats(json, &repeated, &syntax);
  if (header.is_discarded()) return Invalid(absl::StrCat("not valid JSON: ", syntax));
  if (!header.is_object()) return Invalid("not a JSON object");
  if (!repeated.empty()) {
    return Invalid(absl::StrCat(Quote(repeated),
                                " is given twice; each tensor and field may appear once"));
  }
  std::vector<SafetensorsTensor> tensors;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    absl::StatusOr<SafetensorsTensor> tensor = ParseEntry(name, entry, data_bytes);
    if (!tensor.ok()) return tensor.status();
    tensors.push_back(*std::move(tensor));
  }
  // The format forbids overlapping byte ranges: two names must not alias data.
  std::sort(tensors.begin(), tensors.end(), [](const auto& a, const auto& b) {
    return std::tie(a.begin, a.end) < std::tie(b.begin, b.end);
  });
  for (size_t i = 1; i < tensors.size(); ++i) {
    if (tensors[i].begin < tensors[i - 1].end) {
      return Invalid(absl::StrCat("tensors ", Quote(tensors[i - 1].name), " and ",
                                  Quote(tensors[i].name), " overlap (data_offsets [",
                                  tensors[i - 1].begin, ", ", tensors[i - 1].end, ") and [",
                                  tensors[i].begin, ", ", tensors[i].end, "))"));
    }
  }
  return tensors;
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::Read(UniqueFd fd, std::string name) {
  struct stat info;
  if (::fstat(fd.get(), &info) != 0 || !S_ISREG(info.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": not a regular file"));
  }
  const uint64_t file_size = static_cast<uint64_t>(info.st_size);
  unsigned char length_bytes[8];
  if (file_size < 8 || !ReadAt(fd.get(), 0, reinterpret_cast<char*>(length_bytes), 8)) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": not a safetensors file (shorter than the 8-byte header length)"));
  }
  uint64_t header_size = 0;
  for (int i = 7; i >= 0; --i) header_size = header_size << 8 | length_bytes[i];
  // The length field's value is the file's first bytes: it is not repeated.
  if (header_size > kMaxSafetensorsHeaderBytes || header_size > file_size - 8) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": not a safetensors file (its header length field exceeds the file's ",
                     file_size, " bytes or the ", kMaxSafetensorsHeaderBytes, "-byte limit)"));
  }
  std::string header(header_size, '\0');
  if (!ReadAt(fd.get(), 8, header.data(), header_size)) {
    return absl::DataLossError(absl::StrCat(name, ": the header could not be read"));
  }
  SafetensorsFile file;
  file.data_start_ = 8 + header_size;
  absl::StatusOr<std::vector<SafetensorsTensor>> tensors =
      ParseSafetensorsHeader(header, file_size - file.data_start_);
  if (!tensors.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": ", tensors.status().message()));
  }
  file.tensors_ = *std::move(tensors);
  file.fd_ = std::make_shared<const UniqueFd>(std::move(fd));
  file.name_ = std::move(name);
  return file;
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::Open(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) {
    return absl::NotFoundError(absl::StrCat("safetensors ", Quote(path), ": cannot read"));
  }
  return Read(std::move(fd), absl::StrCat("safetensors ", Quote(path)));
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
    return absl::NotFoundError(absl::StrCat(name_, ": no tensor ", Quote(name)));
  }
  std::string bytes(tensor->end - tensor->begin, '\0');
  if (!ReadAt(fd_->get(), data_start_ + tensor->begin, bytes.data(), bytes.size())) {
    return absl::DataLossError(
        absl::StrCat(name_, ": tensor ", Quote(name), " could not be read (file changed?)"));
  }
  const int width = ElementBytes(tensor->dtype);
  std::vector<float> values(bytes.size() / width);
  mx::WidenToFloat(tensor->dtype, bytes.data(), values.size(), values.data());
  return values;
}

}  // namespace mxserve
