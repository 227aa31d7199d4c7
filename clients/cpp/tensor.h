// v1::Tensor ↔ float values: tensors travel as raw little-endian bytes with a
// shape and a dtype, never as repeated floats (DESIGN.md, "API sketch").
#pragma once

#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "mxserve/v1/common.pb.h"

namespace mxclient {

namespace v1 = ::mxserve::v1;

// An FP32 tensor of `shape` holding `values`; fails unless product(shape) equals
// values.size() and every dimension is >= 0.
absl::StatusOr<v1::Tensor> MakeFloat32Tensor(std::span<const float> values,
                                             std::span<const int64_t> shape);
inline absl::StatusOr<v1::Tensor> MakeFloat32Tensor(std::span<const float> values,
                                                    std::initializer_list<int64_t> shape) {
  return MakeFloat32Tensor(values, std::span<const int64_t>(shape.begin(), shape.size()));
}

// The values of an FP32, BF16 or FP16 tensor as floats. Fails when the dtype is
// unknown, a dimension is negative, the byte count is not product(shape) times
// the element size, or (when `expected_shape` is given) the shape differs.
absl::StatusOr<std::vector<float>> TensorToFloats(const v1::Tensor& tensor,
                                                  std::span<const int64_t> expected_shape = {});
inline absl::StatusOr<std::vector<float>> TensorToFloats(const v1::Tensor& tensor,
                                                         std::initializer_list<int64_t> shape) {
  return TensorToFloats(tensor, std::span<const int64_t>(shape.begin(), shape.size()));
}

// "[8, 896]", for messages.
std::string ShapeString(std::span<const int64_t> shape);

}  // namespace mxclient
