#include "server/rpc/profile_wire.h"

#include <optional>

#include "absl/strings/str_cat.h"
#include "proto/convert/enums.h"

namespace mxserve {
namespace {

// Each enum's tie, made once; picked by overload on the own type.
const EnumMap<ProfileSource, v1::ProfileSource>& Tie(ProfileSource) {
  static const EnumMap<ProfileSource, v1::ProfileSource> map(kAllProfileSources, SourceName);
  return map;
}
const EnumMap<Reference, v1::Reference>& Tie(Reference) {
  static const EnumMap<Reference, v1::Reference> map(kAllReferences, ReferenceName);
  return map;
}
const EnumMap<GenerationKind, v1::GenerationKind>& Tie(GenerationKind) {
  static const EnumMap<GenerationKind, v1::GenerationKind> map(kAllGenerationKinds, KindName);
  return map;
}
const EnumMap<ScoreKind, v1::Score>& Tie(ScoreKind) {
  static const EnumMap<ScoreKind, v1::Score> map(kAllScoreKinds, ScoreName);
  return map;
}
const EnumMap<CostMetric, v1::CostMetric>& Tie(CostMetric) {
  static const EnumMap<CostMetric, v1::CostMetric> map(kAllCostMetrics, MetricName);
  return map;
}

template <typename Own, typename Wire>
absl::StatusOr<Own> From(Wire wire, absl::string_view field) {
  const auto& map = Tie(Own{});
  if (std::optional<Own> own = map.FromWire(wire)) return *own;
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": expected ", map.WireNames(), ", got ", static_cast<int>(wire)));
}

}  // namespace

v1::ProfileSource ToProto(ProfileSource v) { return Tie(v).ToWire(v); }
v1::Reference ToProto(Reference v) { return Tie(v).ToWire(v); }
v1::GenerationKind ToProto(GenerationKind v) { return Tie(v).ToWire(v); }
v1::Score ToProto(ScoreKind v) { return Tie(v).ToWire(v); }
v1::CostMetric ToProto(CostMetric v) { return Tie(v).ToWire(v); }

absl::StatusOr<ProfileSource> FromProto(v1::ProfileSource v, absl::string_view field) {
  return From<ProfileSource>(v, field);
}
absl::StatusOr<Reference> FromProto(v1::Reference v, absl::string_view field) {
  return From<Reference>(v, field);
}
absl::StatusOr<GenerationKind> FromProto(v1::GenerationKind v, absl::string_view field) {
  return From<GenerationKind>(v, field);
}
absl::StatusOr<ScoreKind> FromProto(v1::Score v, absl::string_view field) {
  return From<ScoreKind>(v, field);
}
absl::StatusOr<CostMetric> FromProto(v1::CostMetric v, absl::string_view field) {
  return From<CostMetric>(v, field);
}

}  // namespace mxserve
