// The one mapping between mx::Format and the wire's mxserve.v1.Format, for the
// daemon, the C++ client and the tests. The wire enum names each format
// FORMAT_<mx::FormatName>; 0 (FORMAT_UNSPECIFIED) means "not given" (the model's
// policy chooses). tests/proto_test.cc pins the table to the proto enum, and
// clients/python/tests/test_wire.py pins the Python client's table to this one.
#pragma once

#include <optional>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "mx/format.h"
#include "mx/quantize.h"
#include "mxserve/v1/common.pb.h"

namespace mxserve {

v1::Format ToProto(mx::Format format);

// The mx format a wire value names; nullopt for FORMAT_UNSPECIFIED and for values
// outside the enum.
std::optional<mx::Format> ToMx(v1::Format format);

// For a request field: nullopt for FORMAT_UNSPECIFIED; INVALID_ARGUMENT naming
// `field` for a value outside the enum.
absl::StatusOr<std::optional<mx::Format>> FromProto(v1::Format format, absl::string_view field);

// mx's scale rules (mx/quantize.h) on the wire's ScaleRule, tied by name
// (enums.h: SCALE_RULE_RCEIL is "rceil", mx::ScaleRuleName(kRceil)).
v1::ScaleRule ToProto(mx::ScaleRule rule);
// The mx rule a wire value names; nullopt for values outside the enum.
std::optional<mx::ScaleRule> ToMx(v1::ScaleRule rule);

// mx's roundings (mx/element.h) on the wire's Rounding, tied by name
// (ROUNDING_STOCHASTIC is "stochastic", mx::RoundingName(kStochastic)).
v1::Rounding ToProto(mx::Rounding rounding);
// The mx rounding a wire value names; nullopt for values outside the enum.
std::optional<mx::Rounding> ToMx(v1::Rounding rounding);

}  // namespace mxserve
