// The client library's helpers that need no daemon: tensors to and from the
// wire, and the names of the wire enums.
#include "clients/cpp/tensor.h"

#include <gtest/gtest.h>

#include <cstring>

#include "clients/cpp/wire_names.h"

namespace {

namespace v1 = ::mxserve::v1;

TEST(Tensor, Float32RoundTripAndChecks) {
  const std::vector<float> values = {1.0f, -2.5f, 3.0e-40f, 7.0f, 0.0f, -0.0f};
  absl::StatusOr<v1::Tensor> tensor = mxclient::MakeFloat32Tensor(values, {2, 3});
  ASSERT_TRUE(tensor.ok()) << tensor.status();
  EXPECT_EQ(tensor->dtype(), v1::DTYPE_FP32);
  EXPECT_EQ(tensor->data().size(), 24u);
  absl::StatusOr<std::vector<float>> back = mxclient::TensorToFloats(*tensor, {2, 3});
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(std::memcmp(back->data(), values.data(), 24), 0);

  EXPECT_EQ(mxclient::MakeFloat32Tensor(values, {4, 2}).status().message(),
            "tensor shape [4, 2] needs 8 values, got 6");
  EXPECT_EQ(mxclient::TensorToFloats(*tensor, {3, 2}).status().message(),
            "tensor shape [2, 3], expected [3, 2]");
  v1::Tensor short_data = *tensor;
  short_data.mutable_data()->resize(20);
  EXPECT_EQ(mxclient::TensorToFloats(short_data).status().message(),
            "tensor [2, 3] DTYPE_FP32 holds 20 bytes, expected 24");
  v1::Tensor no_dtype = *tensor;
  no_dtype.set_dtype(v1::DTYPE_UNSPECIFIED);
  EXPECT_FALSE(mxclient::TensorToFloats(no_dtype).ok());
}

TEST(Tensor, HalfPrecisionDecodes) {
  v1::Tensor tensor;
  tensor.add_shape(2);
  tensor.set_dtype(v1::DTYPE_BF16);
  const uint16_t bf16[] = {0x3F80, 0xC020};  // 1.0, -2.5
  tensor.set_data(reinterpret_cast<const char*>(bf16), sizeof bf16);
  EXPECT_EQ(mxclient::TensorToFloats(tensor).value(), (std::vector<float>{1.0f, -2.5f}));
  tensor.set_dtype(v1::DTYPE_FP16);
  const uint16_t fp16[] = {0x3C00, 0xC100};  // 1.0, -2.5
  tensor.set_data(reinterpret_cast<const char*>(fp16), sizeof fp16);
  EXPECT_EQ(mxclient::TensorToFloats(tensor).value(), (std::vector<float>{1.0f, -2.5f}));
}

TEST(WireNames, PhasesAndFormats) {
  EXPECT_EQ(mxclient::ParsePhase("Rollout").value(), v1::PHASE_ROLLOUT);
  EXPECT_EQ(mxclient::ParsePhase("PHASE_UPDATE").value(), v1::PHASE_UPDATE);
  EXPECT_FALSE(mxclient::ParsePhase("train").ok());
  EXPECT_EQ(mxclient::ParseWireFormat("mxfp4").value(), v1::FORMAT_MXFP4_E2M1);
  EXPECT_EQ(mxclient::ParseWireFormat("FORMAT_BF16").value(), v1::FORMAT_BF16);
  EXPECT_EQ(mxclient::ParseWireFormat("policy").value(), v1::FORMAT_UNSPECIFIED);
  EXPECT_EQ(mxclient::WireFormatName(v1::FORMAT_MXINT8), "MXINT8");
  EXPECT_EQ(mxclient::WireFormatName(v1::FORMAT_UNSPECIFIED), "policy");
  EXPECT_EQ(mxclient::WireFormatName(static_cast<v1::Format>(42)), "format#42");
}

}  // namespace
