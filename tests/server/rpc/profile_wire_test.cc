// The profile room's enums on the wire (server/rpc/profile_wire.h): every wire
// value but an UNSPECIFIED has a name in the room, and each own value goes out
// and comes back as itself. A value added to a .proto enum and not to the room
// fails here, not in a client's request.
#include "server/rpc/profile_wire.h"

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "proto/convert/enums.h"

namespace mxserve {
namespace {

// Own values through the wire and back, with their names the wire's.
template <typename Own, size_t N, typename Name>
void ExpectRoundTrips(const Own (&all)[N], Name name) {
  for (const Own own : all) {
    const auto wire = ToProto(own);
    EXPECT_EQ(WireName(wire), name(own));
    const absl::StatusOr<Own> back = FromProto(wire, "field");
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, own);
  }
}

// Every wire value but UNSPECIFIED reads as an own value; numbers outside the
// enum are INVALID_ARGUMENT naming the field.
template <typename Own, typename Wire>
void ExpectEveryWireValueIsKnown() {
  const EnumDescriptor& e = DescriptorOf<Wire>();
  for (int i = 0; i < e.value_count(); ++i) {
    const auto wire = static_cast<Wire>(e.value(i)->number());
    const absl::StatusOr<Own> own = FromProto(wire, "field");
    if (absl::EndsWith(e.value(i)->name(), "_UNSPECIFIED")) {
      EXPECT_FALSE(own.ok()) << e.value(i)->name();
    } else {
      EXPECT_TRUE(own.ok()) << e.value(i)->name() << ": " << own.status();
    }
  }
  const absl::StatusOr<Own> outside = FromProto(static_cast<Wire>(77), "config.field");
  EXPECT_EQ(outside.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(outside.status().message(), "config.field: expected "))
      << outside.status();
  EXPECT_TRUE(absl::EndsWith(outside.status().message(), ", got 77")) << outside.status();
}

TEST(ProfileWire, SourcesTravelByTheirNames) {
  ExpectRoundTrips(kAllProfileSources, SourceName);
  ExpectEveryWireValueIsKnown<ProfileSource, v1::ProfileSource>();
}

TEST(ProfileWire, ReferencesTravelByTheirNames) {
  ExpectRoundTrips(kAllReferences, ReferenceName);
  ExpectEveryWireValueIsKnown<Reference, v1::Reference>();
}

TEST(ProfileWire, GenerationKindsTravelByTheirNames) {
  ExpectRoundTrips(kAllGenerationKinds, KindName);
  ExpectEveryWireValueIsKnown<GenerationKind, v1::GenerationKind>();
}

TEST(ProfileWire, ScoresTravelByTheirNames) {
  ExpectRoundTrips(kAllScoreKinds, ScoreName);
  ExpectEveryWireValueIsKnown<ScoreKind, v1::Score>();
}

TEST(ProfileWire, CostMetricsTravelByTheirNames) {
  ExpectRoundTrips(kAllCostMetrics, MetricName);
  ExpectEveryWireValueIsKnown<CostMetric, v1::CostMetric>();
}

TEST(ProfileWire, AnUnknownValueNamesWhatIsExpected) {
  EXPECT_EQ(FromProto(static_cast<v1::Reference>(7), "config.reference").status().message(),
            "config.reference: expected REFERENCE_FP32 or REFERENCE_FP64, got 7");
  EXPECT_EQ(FromProto(v1::GENERATION_KIND_UNSPECIFIED, "kind").status().message(),
            "kind: expected GENERATION_KIND_FRACTION, GENERATION_KIND_BUDGET or "
            "GENERATION_KIND_TOLERANCE, got 0");
}

}  // namespace
}  // namespace mxserve
