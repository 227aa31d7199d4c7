// The wire API's enums line up with the mx library's, which the server relies on
// to convert between them, and tensors survive a serialization round trip.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "mx/format.h"
#include "mxserve/v1/common.pb.h"
#include "mxserve/v1/compute.grpc.pb.h"

namespace {

TEST(Proto, FormatEnumIsMxFormatPlusOne) {
  for (const mx::FormatTraits& t : mx::AllFormats()) {
    const int wire = static_cast<int>(t.format) + 1;
    ASSERT_TRUE(mxserve::v1::Format_IsValid(wire));
    EXPECT_EQ(mxserve::v1::Format_Name(static_cast<mxserve::v1::Format>(wire)),
              "FORMAT_" + std::string(t.name));
  }
  EXPECT_FALSE(mxserve::v1::Format_IsValid(static_cast<int>(mx::AllFormats().size()) + 1));
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
