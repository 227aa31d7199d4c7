// The profile room's enums on the wire: each tied to its mxserve.v1 enum by the
// one naming rule (proto/convert/enums.h), so no value-by-value table is written
// here and a wire value with no name in the room is found by
// tests/server/rpc/profile_wire_test.cc.
#pragma once

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "mxserve/v1/profiles.pb.h"
#include "server/profile/generate.h"
#include "server/profile/profile.h"

namespace mxserve {

v1::ProfileSource ToProto(ProfileSource source);
v1::Reference ToProto(Reference reference);
v1::GenerationKind ToProto(GenerationKind kind);
v1::Score ToProto(ScoreKind score);
v1::CostMetric ToProto(CostMetric metric);

// A value with no counterpart (UNSPECIFIED, a number outside the enum) is
// INVALID_ARGUMENT: "<field>: expected REFERENCE_FP32 or REFERENCE_FP64, got 7".
absl::StatusOr<ProfileSource> FromProto(v1::ProfileSource source, absl::string_view field);
absl::StatusOr<Reference> FromProto(v1::Reference reference, absl::string_view field);
absl::StatusOr<GenerationKind> FromProto(v1::GenerationKind kind, absl::string_view field);
absl::StatusOr<ScoreKind> FromProto(v1::Score score, absl::string_view field);
absl::StatusOr<CostMetric> FromProto(v1::CostMetric metric, absl::string_view field);

}  // namespace mxserve
