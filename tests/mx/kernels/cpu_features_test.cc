#include "mx/kernels/cpu_features.h"

#include <gtest/gtest.h>

#include <string>

namespace mx::kernels {
namespace {

TEST(CpuFeaturesTest, NamesRoundTrip) {
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512, Isa::kAmx}) {
    EXPECT_EQ(ParseIsa(IsaName(isa)).value(), isa);
  }
  EXPECT_EQ(ParseIsa("AVX2").value(), Isa::kAvx2);
  EXPECT_EQ(ParseIsa("sse9").status().message(),
            "unknown ISA level 'sse9'; expected one of scalar, avx2, avx512, amx");
}

TEST(CpuFeaturesTest, AvailableLevelsStartAtScalarAndStayWithinTheCpu) {
  const auto levels = AvailableIsas();
  ASSERT_FALSE(levels.empty());
  EXPECT_EQ(levels.front(), Isa::kScalar);
  for (size_t i = 0; i < levels.size(); ++i) EXPECT_EQ(static_cast<size_t>(levels[i]), i);
  EXPECT_LE(levels.back(), CpuSupports());
  EXPECT_LE(levels.back(), KernelsBuiltFor());
  EXPECT_EQ(Resolve(Isa::kAmx), levels.back());
  EXPECT_EQ(Resolve(Isa::kScalar), Isa::kScalar);
}

TEST(CpuFeaturesTest, MxIsaCapsTheLevel) {
  std::string warning;
  EXPECT_EQ(ChooseIsa(nullptr, &warning), AvailableIsas().back());
  EXPECT_EQ(ChooseIsa("scalar", &warning), Isa::kScalar);
  EXPECT_EQ(warning, "");
  EXPECT_EQ(ChooseIsa("bogus", &warning), AvailableIsas().back());
  EXPECT_EQ(warning.rfind("MX_ISA: unknown ISA level 'bogus'", 0), 0u) << warning;
  if (AvailableIsas().back() < Isa::kAmx) {
    warning.clear();
    EXPECT_EQ(ChooseIsa("amx", &warning), AvailableIsas().back());
    EXPECT_NE(warning.find("MX_ISA=amx: not available here"), std::string::npos) << warning;
  }
}

}  // namespace
}  // namespace mx::kernels
