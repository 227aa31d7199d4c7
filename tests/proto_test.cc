// The wire API's Format enum and the mx library's formats map one to one through
// proto/convert (the one mapping; the Python client's table is checked against it
// by clients/python/tests/test_wire.py), and tensors survive a serialization round
// trip.
#include <gtest/gtest.h>

#include <cstring>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "mx/format.h"
#include "mxserve/v1/common.pb.h"
#include "mxserve/v1/compute.grpc.pb.h"
#include "mxserve/v1/models.pb.h"
#include "mxserve/v1/profiles.pb.h"
#include "mxserve/v1/telemetry.pb.h"
#include "proto/convert/enums.h"
#include "proto/convert/formats.h"

namespace {

namespace v1 = mxserve::v1;

TEST(Proto, FormatCountIsTheTableSize) {
  EXPECT_EQ(mx::kFormatCount, 14);
  EXPECT_EQ(mx::AllFormats().size(), static_cast<size_t>(mx::kFormatCount));
}

TEST(Proto, EveryMxFormatIsTheWireFormatOfItsName) {
  for (const mx::FormatTraits& t : mx::AllFormats()) {
    SCOPED_TRACE(t.name);
    const v1::Format wire = mxserve::ToProto(t.format);
    ASSERT_TRUE(v1::Format_IsValid(wire));
    EXPECT_EQ(v1::Format_Name(wire), "FORMAT_" + std::string(t.name));
    EXPECT_EQ(mxserve::ToMx(wire), t.format);
    absl::StatusOr<std::optional<mx::Format>> from = mxserve::FromProto(wire, "format");
    ASSERT_TRUE(from.ok()) << from.status();
    EXPECT_EQ(*from, t.format);
  }
}

TEST(Proto, EveryWireFormatButUnspecifiedIsAnMxFormat) {
  const google::protobuf::EnumDescriptor* formats = v1::Format_descriptor();
  ASSERT_EQ(formats->value_count(), mx::kFormatCount + 1);
  for (int i = 0; i < formats->value_count(); ++i) {
    const google::protobuf::EnumValueDescriptor* value = formats->value(i);
    SCOPED_TRACE(value->name());
    const auto wire = static_cast<v1::Format>(value->number());
    const std::optional<mx::Format> format = mxserve::ToMx(wire);
    if (wire == v1::FORMAT_UNSPECIFIED) {
      EXPECT_EQ(format, std::nullopt);
      continue;
    }
    ASSERT_TRUE(format.has_value());
    EXPECT_EQ("FORMAT_" + std::string(mx::FormatName(*format)), value->name());
    EXPECT_EQ(mxserve::ToProto(*format), wire);
  }
}

TEST(Proto, UnspecifiedIsNotGivenAndUnknownValuesNameTheField) {
  absl::StatusOr<std::optional<mx::Format>> unspecified =
      mxserve::FromProto(v1::FORMAT_UNSPECIFIED, "format");
  ASSERT_TRUE(unspecified.ok()) << unspecified.status();
  EXPECT_EQ(*unspecified, std::nullopt);
  for (int value : {-1, mx::kFormatCount + 1, 42}) {
    const auto wire = static_cast<v1::Format>(value);
    EXPECT_EQ(mxserve::ToMx(wire), std::nullopt) << value;
    absl::StatusOr<std::optional<mx::Format>> unknown = mxserve::FromProto(wire, "a.packed.format");
    EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(unknown.status().message(), "a.packed.format: unknown format value " +
                                              std::to_string(value) + "; expected one of " +
                                              std::string(mx::FormatNameList()));
  }
}

TEST(Proto, TensorBytesRoundTrip) {
  const float values[] = {1.0f, -2.5f, 3.0e-40f};
  mxserve::v1::LayerForwardRequest request;
  request.set_model("policy");
  request.set_phase(mxserve::v1::PHASE_ROLLOUT);
  mxserve::v1::Tensor* x = request.mutable_input()->mutable_tensor();
  x->add_shape(1);
  x->add_shape(3);
  x->set_dtype(mxserve::v1::DTYPE_FP32);
  x->set_data(reinterpret_cast<const char*>(values), sizeof(values));

  mxserve::v1::LayerForwardRequest parsed;
  ASSERT_TRUE(parsed.ParseFromString(request.SerializeAsString()));
  ASSERT_EQ(parsed.input().tensor().data().size(), sizeof(values));
  EXPECT_EQ(std::memcmp(parsed.input().tensor().data().data(), values, sizeof(values)), 0);
  EXPECT_EQ(parsed.phase(), mxserve::v1::PHASE_ROLLOUT);
}

}  // namespace

// ---------------------------------------------------------------------------
// The naming rule of every wire enum (proto/convert/enums.h), the one C++ place
// that names their values; clients/python/tests/test_enums.py pins Python's.

namespace enums {

using mxserve::DescriptorOf;
using mxserve::EnumMap;
using mxserve::ParseWireName;
using mxserve::WireName;
using mxserve::WireNameList;

TEST(WireEnums, ThePrefixIsTheTypeNameInUpperSnakeCase) {
  EXPECT_EQ(mxserve::WireEnumPrefix(DescriptorOf<v1::Phase>()), "PHASE_");
  EXPECT_EQ(mxserve::WireEnumPrefix(DescriptorOf<v1::CostMetric>()), "COST_METRIC_");
  EXPECT_EQ(mxserve::WireEnumPrefix(DescriptorOf<v1::WorkCallKind>()), "WORK_CALL_KIND_");
  EXPECT_EQ(mxserve::WireEnumPrefix(DescriptorOf<v1::DType>()), "DTYPE_");  // no word break in "DT"
}

// Known answers: one per enum, the tricky ones (several words, digits) included.
TEST(WireEnums, NamesAreTheValueNamesLowerCasedWithoutThePrefix) {
  EXPECT_EQ(WireName(v1::PHASE_ROLLOUT), "rollout");
  EXPECT_EQ(WireName(v1::PHASE_UNSPECIFIED), "unspecified");
  EXPECT_EQ(WireName(v1::SCORE_REL_ERROR), "rel_error");
  EXPECT_EQ(WireName(v1::COST_METRIC_TIME), "time");
  EXPECT_EQ(WireName(v1::GENERATION_KIND_TOLERANCE), "tolerance");
  EXPECT_EQ(WireName(v1::REFERENCE_FP64), "fp64");
  EXPECT_EQ(WireName(v1::PROFILE_SOURCE_GRADIENTS), "gradients");
  EXPECT_EQ(WireName(v1::WORK_CALL_KIND_BACKWARD), "backward");
  EXPECT_EQ(WireName(v1::TENSOR_ROLE_BIAS), "bias");
  EXPECT_EQ(WireName(v1::ROUNDING_NEAREST_AWAY), "nearest_away");
  EXPECT_EQ(WireName(v1::FORMAT_MXFP8_E4M3), "mxfp8_e4m3");
  EXPECT_EQ(WireName(v1::DTYPE_BF16), "bf16");
  EXPECT_EQ(WireName(static_cast<v1::Phase>(9)), "phase#9");
  EXPECT_EQ(WireName(static_cast<v1::CostMetric>(-1)), "costmetric#-1");
}

TEST(WireEnums, ParsingTakesTheShortOrTheFullNameInAnyCase) {
  for (const char* text : {"rollout", "ROLLOUT", "Rollout", "PHASE_ROLLOUT", "phase_rollout"}) {
    EXPECT_EQ(ParseWireName<v1::Phase>(text), v1::PHASE_ROLLOUT) << text;
  }
  EXPECT_EQ(ParseWireName<v1::Score>("REL_ERROR"), v1::SCORE_REL_ERROR);
  EXPECT_EQ(ParseWireName<v1::Phase>("unspecified"), v1::PHASE_UNSPECIFIED);
  for (const char* text : {"", "roll", "rollout ", "PHASE_", "phase#1", "1", "SCORE_AUTO"}) {
    EXPECT_EQ(ParseWireName<v1::Phase>(text), std::nullopt) << text;
  }
}

TEST(WireEnums, EveryValueOfEveryEnumRoundTripsThroughItsName) {
  const google::protobuf::FileDescriptor* files[] = {
      v1::Tensor::descriptor()->file(), v1::RegisterModelRequest::descriptor()->file(),
      v1::ProfileRequest::descriptor()->file(), v1::ReportWorkRequest::descriptor()->file()};
  int checked = 0;
  for (const auto* file : files) {
    for (int i = 0; i < file->enum_type_count(); ++i) {
      const auto& e = *file->enum_type(i);
      for (int v = 0; v < e.value_count(); ++v) {
        const int number = e.value(v)->number();
        EXPECT_EQ(mxserve::ParseWireName(e, WireName(e, number)), number) << e.value(v)->name();
        EXPECT_EQ(mxserve::ParseWireName(e, e.value(v)->name()), number);
        ++checked;
      }
    }
  }
  // Phase, Format, DType, Rounding, ScaleRule; TensorRole; Reference,
  // ProfileSource, GenerationKind, Score, CostMetric; WorkCallKind.
  EXPECT_EQ(checked, 4 + 15 + 4 + 3 + 5 + 2 + 2 + 4 + 4 + 4 + 3 + 3);
}

TEST(WireEnums, ListsReadAsAMessagesExpectedValues) {
  EXPECT_EQ(WireNameList(DescriptorOf<v1::Phase>(), /*full=*/false),
            "rollout, reward or update");
  EXPECT_EQ(WireNameList(DescriptorOf<v1::Phase>(), /*full=*/true),
            "PHASE_ROLLOUT, PHASE_REWARD or PHASE_UPDATE");
  EXPECT_EQ(WireNameList(DescriptorOf<v1::Reference>(), /*full=*/true),
            "REFERENCE_FP32 or REFERENCE_FP64");
  EXPECT_EQ(mxserve::JoinWithOr({"a"}), "a");
  EXPECT_EQ(mxserve::JoinWithOr({}), "");
}

TEST(WireEnums, EveryScaleRuleIsTheWireValueOfItsName) {
  for (const mx::ScaleRule rule : mx::kAllScaleRules) {
    EXPECT_EQ(WireName(mxserve::ToProto(rule)), mx::ScaleRuleName(rule));
    EXPECT_EQ(mxserve::ToMx(mxserve::ToProto(rule)), rule);
  }
  EXPECT_EQ(mxserve::ToProto(mx::ScaleRule::kFloor), v1::SCALE_RULE_FLOOR);  // the default
  EXPECT_EQ(mxserve::ToMx(v1::SCALE_RULE_UNSPECIFIED), std::nullopt);  // the policy's
  EXPECT_EQ(mxserve::ToMx(static_cast<v1::ScaleRule>(5)), std::nullopt);
  EXPECT_EQ(v1::ScaleRule_descriptor()->value_count(), std::size(mx::kAllScaleRules) + 1);
}

TEST(WireEnums, EveryRoundingIsTheWireValueOfItsName) {
  for (const mx::Rounding rounding : mx::kAllRoundings) {
    EXPECT_EQ(WireName(mxserve::ToProto(rounding)), mx::RoundingName(rounding));
    EXPECT_EQ(mxserve::ToMx(mxserve::ToProto(rounding)), rounding);
  }
  EXPECT_EQ(mxserve::ToProto(mx::Rounding::kNearestEven), v1::ROUNDING_NEAREST_EVEN);  // 0
  EXPECT_EQ(mxserve::ToProto(mx::Rounding::kStochastic), v1::ROUNDING_STOCHASTIC);
  EXPECT_EQ(mxserve::ToMx(static_cast<v1::Rounding>(3)), std::nullopt);
  EXPECT_EQ(v1::Rounding_descriptor()->value_count(), std::size(mx::kAllRoundings));
}

enum class Own { kReward, kRollout };
absl::string_view OwnName(Own own) { return own == Own::kReward ? "reward" : "rollout"; }
constexpr Own kAllOwn[] = {Own::kReward, Own::kRollout};

TEST(WireEnums, AnEnumMapTiesAnOwnEnumToTheWireByName) {
  const EnumMap<Own, v1::Phase> map(kAllOwn, OwnName);
  EXPECT_EQ(map.ToWire(Own::kReward), v1::PHASE_REWARD);
  EXPECT_EQ(map.ToWire(Own::kRollout), v1::PHASE_ROLLOUT);
  EXPECT_EQ(map.FromWire(v1::PHASE_REWARD), Own::kReward);
  EXPECT_EQ(map.FromWire(v1::PHASE_UPDATE), std::nullopt);  // no own name for it
  EXPECT_EQ(map.FromWire(v1::PHASE_UNSPECIFIED), std::nullopt);
  EXPECT_EQ(map.FromWire(static_cast<v1::Phase>(42)), std::nullopt);
  EXPECT_EQ(map.WireNames(), "PHASE_REWARD or PHASE_ROLLOUT");
}

absl::string_view Misnamed(Own) { return "rolling"; }

TEST(WireEnumsDeathTest, AnOwnNameTheWireLacksStopsTheProgram) {
  EXPECT_DEATH((EnumMap<Own, v1::Phase>(kAllOwn, Misnamed)),
               "'rolling' names no value of mxserve.v1.Phase \\(expected one of unspecified, "
               "rollout, reward or update\\)");
}

}  // namespace enums
