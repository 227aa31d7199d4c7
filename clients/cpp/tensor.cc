#include "clients/cpp/tensor.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "mx/element.h"

namespace mxclient {
namespace {

// product(shape), or an error for a negative dimension or an overflow.
absl::StatusOr<int64_t> ElementCount(std::span<const int64_t> shape) {
  int64_t count = 1;
  for (const int64_t dim : shape) {
    if (dim < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor shape ", ShapeString(shape), " has a negative dimension"));
    }
    if (dim != 0 && count > std::numeric_limits<int64_t>::max() / 8 / dim) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor shape ", ShapeString(shape), " is too large"));
    }
    count *= dim;
  }
  return count;
}

}  // namespace

std::string ShapeString(std::span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

absl::StatusOr<v1::Tensor> MakeFloat32Tensor(std::span<const float> values,
                                             std::span<const int64_t> shape) {
  absl::StatusOr<int64_t> count = ElementCount(shape);
  if (!count.ok()) return count.status();
  if (*count != static_cast<int64_t>(values.size())) {
    return absl::InvalidArgumentError(absl::StrCat("tensor shape ", ShapeString(shape), " needs ",
                                                   *count, " values, got ", values.size()));
  }
  v1::Tensor tensor;
  tensor.mutable_shape()->Add(shape.begin(), shape.end());
  tensor.set_dtype(v1::DTYPE_FP32);
  // x86-64 and the FPGA host are little-endian: the bytes are the wire format.
  tensor.set_data(reinterpret_cast<const char*>(values.data()), values.size_bytes());
  return tensor;
}

absl::StatusOr<std::vector<float>> TensorToFloats(const v1::Tensor& tensor,
                                                  std::span<const int64_t> expected_shape) {
  const std::span<const int64_t> shape(tensor.shape().data(), tensor.shape().size());
  if (!expected_shape.empty() &&
      !std::equal(shape.begin(), shape.end(), expected_shape.begin(), expected_shape.end())) {
    return absl::InvalidArgumentError(absl::StrCat("tensor shape ", ShapeString(shape),
                                                   ", expected ", ShapeString(expected_shape)));
  }
  absl::StatusOr<int64_t> count = ElementCount(shape);
  if (!count.ok()) return count.status();
  size_t element_bytes = 0;
  switch (tensor.dtype()) {
    case v1::DTYPE_FP32:
      element_bytes = 4;
      break;
    case v1::DTYPE_BF16:
    case v1::DTYPE_FP16:
      element_bytes = 2;
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("tensor dtype ", v1::DType_Name(tensor.dtype()),
                       " unsupported; expected DTYPE_FP32, DTYPE_BF16 or DTYPE_FP16"));
  }
  const std::string& data = tensor.data();
  if (data.size() != static_cast<size_t>(*count) * element_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor ", ShapeString(shape), " ", v1::DType_Name(tensor.dtype()), " holds ",
                     data.size(), " bytes, expected ", *count * element_bytes));
  }
  std::vector<float> values(*count);
  const mx::Format source = tensor.dtype() == v1::DTYPE_FP32   ? mx::Format::kFp32
                            : tensor.dtype() == v1::DTYPE_BF16 ? mx::Format::kBf16
                                                               : mx::Format::kFp16;
  mx::WidenToFloat(source, data.data(), values.size(), values.data());
  return values;
}

}  // namespace mxclient
