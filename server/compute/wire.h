// The edge between the wire (mxserve.v1 messages) and the mx/ library: enum
// conversions, and dense or packed operands decoded and validated into the types
// the scheduler and backends use. Every error is INVALID_ARGUMENT and starts with
// the request field it is about ("input.tensor.shape: expected [M, 896] ...").
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "mx/format.h"
#include "mx/packed.h"
#include "mxserve/v1/common.pb.h"
#include "proto/convert/formats.h"
#include "server/base/phase.h"
#include "server/model/registry.h"

namespace mxserve {

// Formats: ToProto(mx::Format) and FromProto(v1::Format, field) are in
// proto/convert/formats.h, shared with the client.

v1::Phase ToProto(Phase phase);
// PHASE_UNSPECIFIED and unknown values are INVALID_ARGUMENT naming `field`.
absl::StatusOr<Phase> FromProto(v1::Phase phase, absl::string_view field);

// INVALID_ARGUMENT naming `field` for a value outside the enum.
absl::StatusOr<mx::Rounding> FromProto(v1::Rounding rounding, absl::string_view field);

// nullopt for SCALE_RULE_UNSPECIFIED; INVALID_ARGUMENT naming `field` for a
// value outside the enum.
absl::StatusOr<std::optional<mx::ScaleRule>> FromProto(v1::ScaleRule rule,
                                                       absl::string_view field);

// DTYPE_FP32/BF16/FP16 as mx::Format::kFp32/kBf16/kFp16; anything else is
// INVALID_ARGUMENT naming `field`.
absl::StatusOr<mx::Format> FromProto(v1::DType dtype, absl::string_view field);

// A dense matrix in FP32, or in BF16/FP16 as raw 16-bit codes (quantizing from
// those widens exactly, so no FP32 copy is made).
struct DenseMatrix {
  int64_t rows = 0;
  int64_t cols = 0;
  mx::Format dtype = mx::Format::kFp32;  // kFp32, kBf16 or kFp16
  const std::string* data = nullptr;     // points into the request; little-endian
};

// Validates a [rows, cols] tensor. `rows`/`cols` < 0 accept any size; otherwise
// the dimension must match and `what` explains where the number comes from.
// `rows_name`/`cols_name` name a free dimension in messages ("expected [M, 896]").
struct ExpectedShape {
  int64_t rows = -1;
  int64_t cols = -1;
  std::string rows_what;              // e.g. "M (rows of a)"
  std::string cols_what;              // e.g. "in_features of layer 'q'"
  absl::string_view rows_name = "M";  // always a literal
  absl::string_view cols_name = "K";
};

// Every operand's size check: the buffer sizes of a rows × cols operand of
// `format`, in checked arithmetic, which must fit in one message of `max_bytes`.
// INVALID_ARGUMENT naming `field` otherwise, before anything is allocated.
absl::StatusOr<mx::LayoutSize> OperandSize(absl::string_view field, mx::Format format, int64_t rows,
                                           int64_t cols, int64_t max_bytes);

// A matrix whose columns are one of the layer's dimensions: in_features (an
// input) or out_features (a grad_output); any number of rows.
ExpectedShape LayerColumns(const LayerSpec& spec, bool in_features);

// A dense [rows, cols] tensor, its data exactly rows · cols elements of its dtype.
// `max_bytes` is the largest message the daemon takes (--max-message-bytes).
absl::StatusOr<DenseMatrix> DecodeMatrix(const v1::Tensor& tensor, absl::string_view field,
                                         const ExpectedShape& expected, int64_t max_bytes);

// The values of a dense matrix widened to FP32.
std::vector<float> ToFloat(const DenseMatrix& matrix);

// Quantizes along rows (K = cols) to `format`.
absl::StatusOr<mx::QuantizedMatrix> QuantizeDense(const DenseMatrix& matrix, mx::Format format,
                                                  const mx::QuantizeOptions& options);

// A packed operand, checked against the layout rules and the expected shape.
absl::StatusOr<mx::QuantizedMatrix> DecodePacked(const v1::PackedOperand& packed,
                                                 absl::string_view field,
                                                 const ExpectedShape& expected, int64_t max_bytes);

// An FP32 [rows, cols] tensor holding `values`.
void EncodeMatrix(std::span<const float> values, int64_t rows, int64_t cols, v1::Tensor* tensor);
// An FP32 vector tensor [n].
void EncodeVector(std::span<const float> values, v1::Tensor* tensor);
// An FP32 tensor rounded to BF16 (nearest even) in place: half its bytes.
void NarrowToBf16(v1::Tensor* tensor);
// `count` FP32 values (their bytes at `floats`) as BF16 (nearest even), value
// i's two bytes at out + 2i; `out` may be `floats` (front to back, in place).
void FloatBytesToBf16(const char* floats, size_t count, char* out);

// Room an answer keeps for its fields besides the tensor data (shape,
// ExecutionInfo, names) when data is sized against --max-message-bytes.
inline constexpr uint64_t kEnvelopeBytes = 4096;

}  // namespace mxserve
