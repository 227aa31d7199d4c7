#include "server/compute/wire.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "mx/element.h"
#include "mx/kernels/quantize_fast.h"
#include "mx/status_macros.h"
#include "proto/convert/enums.h"

namespace mxserve {
namespace {

absl::Status FieldError(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
}

std::string ShapeText(const google::protobuf::RepeatedField<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

std::string ExpectedText(const ExpectedShape& e) {
  const std::string rows = e.rows >= 0 ? absl::StrCat(e.rows) : std::string(e.rows_name);
  const std::string cols = e.cols >= 0 ? absl::StrCat(e.cols) : std::string(e.cols_name);
  return absl::StrCat("[", rows, ", ", cols, "]");
}

absl::Status CheckDim(absl::string_view field, int64_t got, int64_t want, absl::string_view what,
                      absl::string_view dim) {
  if (want < 0 || got == want) return absl::OkStatus();
  return FieldError(field, absl::StrCat("expected ", want, " ", dim, " (", what, "), got ", got));
}

bool DimensionOk(int64_t value) { return value >= 1 && value <= mx::kMaxDimension; }

// The daemon's phases tied to the wire's by name (proto/convert/enums.h).
const EnumMap<Phase, v1::Phase>& PhaseMap() {
  static const EnumMap<Phase, v1::Phase> map(kAllPhases, PhaseName);
  return map;
}

// "PHASE_ROLLOUT, PHASE_REWARD or PHASE_UPDATE": what a field of E expects.
template <typename E>
std::string Expected() {
  return WireNameList(DescriptorOf<E>(), /*full=*/true);
}

}  // namespace

v1::Phase ToProto(Phase phase) { return PhaseMap().ToWire(phase); }

absl::StatusOr<Phase> FromProto(v1::Phase phase, absl::string_view field) {
  if (std::optional<Phase> own = PhaseMap().FromWire(phase)) return *own;
  const std::string expected = PhaseMap().WireNames();
  if (phase == v1::PHASE_UNSPECIFIED) {
    return FieldError(field, absl::StrCat("required; expected ", expected));
  }
  return FieldError(field, absl::StrCat("unknown phase value ", static_cast<int>(phase),
                                        "; expected ", expected));
}

absl::StatusOr<mx::Rounding> FromProto(v1::Rounding rounding, absl::string_view field) {
  if (std::optional<mx::Rounding> own = ToMx(rounding)) return *own;
  return FieldError(field, absl::StrCat("unknown rounding value ", static_cast<int>(rounding),
                                        "; expected ", Expected<v1::Rounding>()));
}

absl::StatusOr<std::optional<mx::ScaleRule>> FromProto(v1::ScaleRule rule,
                                                       absl::string_view field) {
  if (rule == v1::SCALE_RULE_UNSPECIFIED) return std::optional<mx::ScaleRule>();
  if (std::optional<mx::ScaleRule> own = ToMx(rule)) return own;
  return FieldError(field, absl::StrCat("unknown scale rule value ", static_cast<int>(rule),
                                        "; expected ", Expected<v1::ScaleRule>()));
}

absl::StatusOr<mx::Format> FromProto(v1::DType dtype, absl::string_view field) {
  switch (dtype) {
    case v1::DTYPE_FP32:
      return mx::Format::kFp32;
    case v1::DTYPE_BF16:
      return mx::Format::kBf16;
    case v1::DTYPE_FP16:
      return mx::Format::kFp16;
    default: {
      const std::string name = v1::DType_Name(dtype);
      return FieldError(field, absl::StrCat("expected ", Expected<v1::DType>(),
                                            ", got ", name.empty() ? absl::StrCat(int{dtype}) : name));
    }
  }
}

absl::StatusOr<mx::LayoutSize> OperandSize(absl::string_view field, mx::Format format, int64_t rows,
                                           int64_t cols, int64_t max_bytes) {
  const std::optional<mx::LayoutSize> size = mx::CheckedLayoutSize(format, rows, cols);
  if (size && size->total_bytes() <= static_cast<uint64_t>(max_bytes)) return *size;
  return FieldError(
      field,
      absl::StrCat(
          "a ", rows, " x ", cols, " ", mx::FormatName(format), " operand takes ",
          size ? absl::StrCat(size->total_bytes(), " bytes") : std::string("more than 2^64 bytes"),
          ", more than one message may carry (", max_bytes, " bytes, --max-message-bytes)"));
}

absl::StatusOr<DenseMatrix> DecodeMatrix(const v1::Tensor& tensor, absl::string_view field,
                                         const ExpectedShape& expected, int64_t max_bytes) {
  DenseMatrix m;
  absl::StatusOr<mx::Format> dtype = FromProto(tensor.dtype(), absl::StrCat(field, ".dtype"));
  if (!dtype.ok()) return dtype.status();
  m.dtype = *dtype;
  const std::string shape_field = absl::StrCat(field, ".shape");
  if (tensor.shape_size() != 2) {
    return FieldError(shape_field, absl::StrCat("expected a matrix ", ExpectedText(expected),
                                                ", got ", ShapeText(tensor.shape())));
  }
  m.rows = tensor.shape(0);
  m.cols = tensor.shape(1);
  if (!DimensionOk(m.rows) || !DimensionOk(m.cols)) {
    return FieldError(shape_field, absl::StrCat("dimensions must be in [1, 2^31], got ",
                                                ShapeText(tensor.shape())));
  }
  if (expected.rows >= 0 && m.rows != expected.rows) {
    return FieldError(shape_field, absl::StrCat("expected ", ExpectedText(expected),
                                                " (rows: ", expected.rows_what, "), got ",
                                                ShapeText(tensor.shape())));
  }
  if (expected.cols >= 0 && m.cols != expected.cols) {
    return FieldError(shape_field, absl::StrCat("expected ", ExpectedText(expected),
                                                " (columns: ", expected.cols_what, "), got ",
                                                ShapeText(tensor.shape())));
  }
  MX_ASSIGN_OR_RETURN(const mx::LayoutSize size,
                      OperandSize(shape_field, m.dtype, m.rows, m.cols, max_bytes));
  const uint64_t bytes = size.element_bytes;
  if (tensor.data().size() != bytes) {
    return FieldError(absl::StrCat(field, ".data"),
                      absl::StrCat("expected ", bytes, " bytes (", m.rows, " x ", m.cols, " ",
                                   mx::FormatName(m.dtype), "), got ", tensor.data().size()));
  }
  m.data = &tensor.data();
  return m;
}

std::vector<float> ToFloat(const DenseMatrix& matrix) {
  const size_t n = static_cast<size_t>(matrix.rows * matrix.cols);
  std::vector<float> out(n);
  mx::WidenToFloat(matrix.dtype, matrix.data->data(), n, out.data());
  return out;
}

absl::StatusOr<mx::QuantizedMatrix> QuantizeDense(const DenseMatrix& matrix, mx::Format format,
                                                  const mx::QuantizeOptions& options) {
  const size_t n = static_cast<size_t>(matrix.rows * matrix.cols);
  if (matrix.dtype == mx::Format::kFp32) {
    std::span<const float> values(reinterpret_cast<const float*>(matrix.data->data()), n);
    return mx::kernels::QuantizeRows(values, matrix.rows, matrix.cols, format, options);
  }
  std::span<const uint16_t> codes(reinterpret_cast<const uint16_t*>(matrix.data->data()), n);
  return mx::kernels::QuantizeRows(codes, matrix.dtype, matrix.rows, matrix.cols, format, options);
}

absl::StatusOr<mx::QuantizedMatrix> DecodePacked(const v1::PackedOperand& packed,
                                                 absl::string_view field,
                                                 const ExpectedShape& expected, int64_t max_bytes) {
  auto format = FromProto(packed.format(), absl::StrCat(field, ".format"));
  if (!format.ok()) return format.status();
  if (!format->has_value()) {
    return FieldError(absl::StrCat(field, ".format"), "required for a packed operand");
  }
  const std::string rows_field = absl::StrCat(field, ".rows");
  const std::string cols_field = absl::StrCat(field, ".cols");
  if (!DimensionOk(packed.rows())) {
    return FieldError(rows_field, absl::StrCat("expected 1 to 2^31, got ", packed.rows()));
  }
  if (!DimensionOk(packed.cols())) {
    return FieldError(cols_field, absl::StrCat("expected 1 to 2^31, got ", packed.cols()));
  }
  MX_RETURN_IF_ERROR(
      CheckDim(rows_field, packed.rows(), expected.rows, expected.rows_what, "rows"));
  MX_RETURN_IF_ERROR(
      CheckDim(cols_field, packed.cols(), expected.cols, expected.cols_what, "cols"));
  mx::QuantizedMatrix m;
  m.format = **format;
  m.rows = packed.rows();
  m.cols = packed.cols();
  MX_ASSIGN_OR_RETURN(const mx::LayoutSize size,
                      OperandSize(field, m.format, m.rows, m.cols, max_bytes));
  if (packed.elements().size() != size.element_bytes) {
    return FieldError(absl::StrCat(field, ".elements"),
                      absl::StrCat("expected ", size.element_bytes, " bytes (", m.rows, " rows of ",
                                   mx::RowBytes(m.format, m.cols), " bytes in ",
                                   mx::FormatName(m.format), "), got ", packed.elements().size()));
  }
  if (packed.block_scales().size() != size.block_scale_bytes) {
    return FieldError(
        absl::StrCat(field, ".block_scales"),
        mx::IsBlockScaled(m.format)
            ? absl::StrCat("expected ", size.block_scale_bytes, " bytes (", m.rows, " rows x ",
                           mx::BlocksPerRow(m.format, m.cols), " blocks",
                           mx::Traits(m.format).block_scale_bytes() > 1
                               ? absl::StrCat(" x ", mx::Traits(m.format).block_scale_bytes())
                               : "",
                           "), got ",
                           packed.block_scales().size())
            : absl::StrCat("must be empty for ", mx::FormatName(m.format)));
  }
  if (static_cast<uint64_t>(packed.row_scales_size()) != size.row_scales) {
    return FieldError(absl::StrCat(field, ".row_scales"),
                      mx::HasRowScales(m.format)
                          ? absl::StrCat("expected ", m.rows, " values (one per row), got ",
                                         packed.row_scales_size())
                          : absl::StrCat("must be empty for ", mx::FormatName(m.format)));
  }
  if (m.format == mx::Format::kNvfp4) {
    // UE4M3 block scales have no sign (0x7F marks a NaN block); a tensor scale
    // is a positive finite number.
    for (size_t i = 0; i < packed.block_scales().size(); ++i) {
      const auto byte = static_cast<uint8_t>(packed.block_scales()[i]);
      if (byte > mx::kNvScaleNan) {
        return FieldError(absl::StrCat(field, ".block_scales"),
                          absl::StrCat("byte ", i, " is ", byte,
                                       ", not a UE4M3 scale: expected 0 to 126, or 127 for a NaN "
                                       "block"));
      }
    }
    for (int r = 0; r < packed.row_scales_size(); ++r) {
      const float scale = packed.row_scales(r);
      if (!(scale > 0.0f) || !std::isfinite(scale)) {
        return FieldError(absl::StrCat(field, ".row_scales"),
                          absl::StrCat("value ", r, " is ", scale,
                                       ": an NVFP4 tensor scale must be positive and finite"));
      }
    }
  }
  if (mx::Traits(m.format).is_lookup()) {
    // Each block's FP32 (its first 4 bytes: NF4/BNB_FP4's absmax, LO_BCQ's
    // array scale amax / 31) is a magnitude: non-negative and finite, or NaN
    // for a block that held NaN or Inf. LO_BCQ's 8 selector nibbles are all
    // valid.
    const bool lobcq = m.format == mx::Format::kLoBcq;
    const char* block = lobcq ? "array" : "block";
    const char* what = lobcq ? "scale" : "absmax";
    const size_t stride = mx::Traits(m.format).block_scale_bytes();
    for (size_t i = 0; i + stride <= packed.block_scales().size(); i += stride) {
      float v;
      std::memcpy(&v, packed.block_scales().data() + i, 4);
      if (!std::isnan(v) && !(v >= 0.0f && std::isfinite(v))) {
        return FieldError(absl::StrCat(field, ".block_scales"),
                          absl::StrCat(block, " ", i / stride, "'s ", what, " is ", v, ": a ",
                                       mx::FormatName(m.format), " ", what,
                                       " must be non-negative and finite, or NaN"));
      }
    }
  }
  m.elements.assign(packed.elements().begin(), packed.elements().end());
  m.block_scales.assign(packed.block_scales().begin(), packed.block_scales().end());
  m.row_scales.assign(packed.row_scales().begin(), packed.row_scales().end());
  return m;  // every buffer has its exact size: what mx::ValidateLayout checks
}

void EncodeMatrix(std::span<const float> values, int64_t rows, int64_t cols, v1::Tensor* tensor) {
  tensor->clear_shape();
  tensor->add_shape(rows);
  tensor->add_shape(cols);
  tensor->set_dtype(v1::DTYPE_FP32);
  tensor->mutable_data()->assign(reinterpret_cast<const char*>(values.data()),
                                 values.size() * sizeof(float));
}

void NarrowToBf16(v1::Tensor* tensor) {
  if (tensor->dtype() != v1::DTYPE_FP32) return;
  std::string& data = *tensor->mutable_data();
  const size_t count = data.size() / sizeof(float);
  FloatBytesToBf16(data.data(), count, data.data());
  data.resize(2 * count);
  tensor->set_dtype(v1::DTYPE_BF16);
}

void FloatBytesToBf16(const char* floats, size_t count, char* out) {
  // Element i's two bytes land at 2i, never past the 4i its float is read
  // from: in place, front to back.
  for (size_t i = 0; i < count; ++i) {
    float value;
    std::memcpy(&value, floats + 4 * i, sizeof(float));
    const uint16_t bits = mx::FloatToBf16(value);
    std::memcpy(out + 2 * i, &bits, sizeof(bits));
  }
}

void EncodeVector(std::span<const float> values, v1::Tensor* tensor) {
  tensor->clear_shape();
  tensor->add_shape(static_cast<int64_t>(values.size()));
  tensor->set_dtype(v1::DTYPE_FP32);
  tensor->mutable_data()->assign(reinterpret_cast<const char*>(values.data()),
                                 values.size() * sizeof(float));
}

// A matrix whose columns are one of the layer's dimensions: in_features (an
// input) or out_features (a grad_output); any number of rows.
ExpectedShape LayerColumns(const LayerSpec& spec, bool in_features) {
  ExpectedShape shape;
  shape.cols = in_features ? spec.in_features : spec.out_features;
  shape.cols_what =
      absl::StrCat(in_features ? "in_features" : "out_features", " of layer '", spec.name, "'");
  return shape;
}

}  // namespace mxserve
