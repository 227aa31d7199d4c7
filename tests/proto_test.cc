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
#include "proto/convert/formats.h"

namespace {

namespace v1 = mxserve::v1;

TEST(Proto, FormatCountIsTheTableSize) {
  EXPECT_EQ(mx::kFormatCount, 10);
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
