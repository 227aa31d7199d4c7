// AdamW and gradient clipping against known answers from torch 1.13's
// torch.optim.AdamW and torch.nn.utils.clip_grad_norm_ (CPU, FP32), bit for bit.
#include "server/model/adamw.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <vector>

namespace mxserve {
namespace {

using ::testing::HasSubstr;

constexpr size_t kN = 19;
// Made by torch (lr 3e-4, betas (0.9, 0.95), eps 1e-8, weight_decay 0.1; the
// gradients of steps 2 and 3 clipped by 0.8315 and 0.25 with g.mul_(coef)).
// Edge elements: W 0, -0 and 3e38; grads 0, -0, 1e-30 (its square underflows)
// and 6e4 (its square is 3.6e9).
constexpr uint32_t kParam0[kN] = {0x00000000, 0x80000000, 0x7f61b1e6, 0xbe28f74c, 0x3dcb352e, 0x3ec835ea, 0x3f05017b, 0xbeb97989, 0xbed95213, 0xbf1bc458, 0xbd25eea5, 0xbe30c38e, 0xbf83ef41, 0x3eac91dd, 0xbf296365, 0xbf2e0ce9, 0xbedde028, 0xbe9062be, 0xbf839d15};
constexpr uint32_t kGrad1[kN] = {0x3e6b59ad, 0x3dc403b8, 0xbd878cec, 0x00000000, 0x80000000, 0x0da24260, 0x476a6000, 0x3d14ebb1, 0xbd01495f, 0xbd59f083, 0x3cf50e98, 0xbd118458, 0x3d9a7569, 0x3d8d5665, 0xbc6c5bcd, 0x3e2512d7, 0x3e207936, 0xbdc04636, 0xbdfd54c8};
constexpr uint32_t kParam1[kN] = {0xb99d4951, 0xb99d4952, 0x7f61b02b, 0xbe28f600, 0x3dcb339f, 0x3ec83461, 0x3f04eccd, 0xbeb99f6f, 0xbed92916, 0xbf1baf7d, 0xbd2727f2, 0xbe30738e, 0xbf83f813, 0x3eac6938, 0xbf294e6f, 0xbf2e1f3c, 0xbede05c6, 0xbe903a50, 0xbf83923d};
constexpr uint32_t kM1[kN] = {0x3cbc47be, 0x3c1ccfc7, 0xbbd8e17a, 0x00000000, 0x00000000, 0x0c01ceb3, 0x45bb8000, 0x3b6e45e8, 0xbb4edbcb, 0xbbae5a03, 0x3b440bad, 0xbb68d3c0, 0x3bf72242, 0x3be223d5, 0xbabd163e, 0x3c840f13, 0x3c8060f8, 0xbc19d1c5, 0xbc4aaa3a};
constexpr uint32_t kV1[kN] = {0x3b2d17d0, 0x39f022b7, 0x3965ac95, 0x00000000, 0x00000000, 0x00000000, 0x4d2ba950, 0x388a9bc9, 0x3850f015, 0x39146e1a, 0x383baa5a, 0x3884584d, 0x39951bf4, 0x3979b41b, 0x372e944f, 0x3aaa4ede, 0x3aa0f2c8, 0x39e70f07, 0x3a488d5a};
constexpr uint32_t kGrad2[kN] = {0xbbbed64d, 0xbbc9a2db, 0x3c7de3bc, 0x00000000, 0x80000000, 0x0da24260, 0x476a6000, 0x3c38e7b5, 0x3ab99893, 0xbbb2daf3, 0xbbafe7ee, 0xbc7bc05c, 0xbbb6bdee, 0xbb8fa22f, 0x3c3d97ee, 0x3a69288e, 0x3b2e3e36, 0xbaf9ee0e, 0x3b7b6baf};
constexpr uint32_t kParam2[kN] = {0xba02c00f, 0xba00c42f, 0x7f61ae70, 0xbe28f4b4, 0x3dcb3210, 0x3ec832d8, 0x3f04d841, 0xbeb9bf34, 0xbed90ddb, 0xbf1b9fbe, 0xbd27d6b4, 0xbe302c1f, 0xbf83fd44, 0x3eac4ed0, 0xbf294a48, 0xbf2e2b4f, 0xbede1f2c, 0xbe901e06, 0xbf838ac0};
constexpr uint32_t kM2[kN] = {0x3ca57c35, 0x3c04bf58, 0xbb98f88a, 0x00000000, 0x00000000, 0x0c60c2f5, 0x46225400, 0x3b89f8fc, 0xbb3274e0, 0xbbabc9cb, 0x3b133019, 0xbb92a373, 0x3bcf39b6, 0x3bbf9535, 0xb9b03e11, 0x3c6eeaed, 0x3c6ab431, 0xbc0d0901, 0xbc312c0b};
constexpr uint32_t kV2[kN] = {0x3b2483e5, 0x39e4d0aa, 0x3962e51c, 0x00000000, 0x00000000, 0x00000000, 0x4d8ce1bf, 0x388ce975, 0x3846c819, 0x390e16a9, 0x383675eb, 0x388ed83e, 0x398e37a9, 0x396dea32, 0x377383bf, 0x3aa1cbd7, 0x3a98eed7, 0x39db9259, 0x3a3ea86e};
constexpr uint32_t kGrad3[kN] = {0xba27213c, 0xbacee97d, 0x3a295881, 0x00000000, 0x80000000, 0x0da24260, 0x476a6000, 0x3a1521fe, 0x390bc7e8, 0x3a12cd91, 0xba40b688, 0x3990733a, 0xba74bfae, 0xb92028a2, 0xba0aed3b, 0x3abe848e, 0xbaca0989, 0xb9adc7be, 0x3a104cf8};
constexpr uint32_t kParam3[kN] = {0xba2b8317, 0xba27cc40, 0x7f61acb5, 0xbe28f368, 0x3dcb3081, 0x3ec8314f, 0x3f04c5d6, 0xbeb9d7de, 0xbed8f834, 0xbf1b9330, 0xbd285dff, 0xbe2ff3fe, 0xbf840117, 0x3eac39dd, 0xbf2946a7, 0xbf2e3481, 0xbede32a0, 0xbe90079d, 0xbf8384ad};
constexpr uint32_t kM3[kN] = {0x3c94ce5c, 0x3beda6f5, 0xbb892502, 0x00000000, 0x00000000, 0x0c6abcbc, 0x46298866, 0x3b794862, 0xbb206479, 0xbb9a2692, 0x3b0343bf, 0xbb83bfb9, 0x3bb9bcf0, 0x3bac4ca7, 0xb9a59085, 0x3c579f0c, 0x3c529a24, 0xbbfe2284, 0xbc1f3ab8};
constexpr uint32_t kV3[kN] = {0x3b1c4a1e, 0x39d960e1, 0x39578d34, 0x00000000, 0x00000000, 0x00000000, 0x4d8b33c0, 0x3885de54, 0x383cd7c0, 0x3906fc30, 0x382d583c, 0x3887b3f5, 0x39871ba5, 0x396204e8, 0x37675a87, 0x3a99b512, 0x3a91498c, 0x39d097e0, 0x3a352012};

std::vector<float> Floats(const uint32_t (&bits)[kN]) {
  std::vector<float> out(kN);
  for (size_t i = 0; i < kN; ++i) out[i] = std::bit_cast<float>(bits[i]);
  return out;
}

std::vector<uint32_t> Bits(const std::vector<float>& values) {
  std::vector<uint32_t> out;
  for (float v : values) out.push_back(std::bit_cast<uint32_t>(v));
  return out;
}

std::vector<uint32_t> Bits(const uint32_t (&bits)[kN]) { return {bits, bits + kN}; }

TEST(AdamW, ThreeStepsAreTorchsBitForBit) {
  const AdamWParams params{.lr = 3e-4, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8,
                           .weight_decay = 0.1};
  std::vector<float> param = Floats(kParam0), m(kN, 0.0f), v(kN, 0.0f);
  const float scales[] = {1.0f, 0.8315f, 0.25f};
  const uint32_t(*grads[])[kN] = {&kGrad1, &kGrad2, &kGrad3};
  const uint32_t(*params_after[])[kN] = {&kParam1, &kParam2, &kParam3};
  const uint32_t(*m_after[])[kN] = {&kM1, &kM2, &kM3};
  const uint32_t(*v_after[])[kN] = {&kV1, &kV2, &kV3};
  for (int step = 1; step <= 3; ++step) {
    SCOPED_TRACE(step);
    const std::vector<float> grad = Floats(*grads[step - 1]);
    AdamWStep(param, grad, scales[step - 1], m, v, step, params);
    EXPECT_EQ(Bits(m), Bits(*m_after[step - 1]));
    EXPECT_EQ(Bits(v), Bits(*v_after[step - 1]));
    EXPECT_EQ(Bits(param), Bits(*params_after[step - 1]));
  }
}

TEST(AdamW, ClipCoefficientIsTorchs) {
  // torch.clamp(max_norm / (total + 1e-6), max=1) for a total norm sqrt(sq).
  struct Case {
    double squared_norm, max_norm;
    uint32_t coefficient;
  };
  for (const Case& c : {Case{4.0, 1.0, 0x3efffff8}, Case{0.25, 1.0, 0x3f800000},
                        Case{1e6, 0.5, 0x3a03126f}, Case{2.0, 1.0, 0x3f3504eb},
                        Case{3.0, 0.7, 0x3eceec17}}) {
    EXPECT_EQ(std::bit_cast<uint32_t>(ClipCoefficient(c.squared_norm, c.max_norm)), c.coefficient)
        << c.squared_norm << " " << c.max_norm;
  }
  EXPECT_EQ(ClipCoefficient(1e12, 0.0), 1.0f);  // no clipping asked
  EXPECT_TRUE(std::isnan(ClipCoefficient(std::nan(""), 1.0)));  // as torch: NaN stays
}

TEST(AdamW, SquaredNormIsExactInDouble) {
  const std::vector<float> values = {3.0f, -4.0f, 1e-30f, 6e4f};
  EXPECT_EQ(SquaredNorm(values), 9.0 + 16.0 + 1e-30f * double{1e-30f} + 3.6e9);
}

TEST(AdamW, RejectsWhatTorchWouldNotStep) {
  auto message = [](AdamWParams p) { return std::string(CheckAdamW(p, "adamw.").message()); };
  EXPECT_TRUE(CheckAdamW(AdamWParams{}, "adamw.").ok());
  EXPECT_EQ(message({.lr = -1}), "adamw.lr: expected a finite value >= 0, got -1");
  EXPECT_THAT(message({.lr = std::nan("")}), HasSubstr("adamw.lr: expected a finite value"));
  EXPECT_EQ(message({.beta1 = 1}), "adamw.beta1: expected 0 <= beta1 < 1, got 1");
  EXPECT_EQ(message({.beta2 = -0.5}), "adamw.beta2: expected 0 <= beta2 < 1, got -0.5");
  EXPECT_EQ(message({.eps = 0}), "adamw.eps: expected a finite value > 0, got 0");
  EXPECT_EQ(message({.weight_decay = -0.1}),
            "adamw.weight_decay: expected a finite value >= 0, got -0.1");
}

}  // namespace
}  // namespace mxserve
