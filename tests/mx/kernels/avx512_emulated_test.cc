// The avx512 level's GEMM kernels, compiled against SIMDe (gemm_avx512_simde.cc),
// against mx::ReferenceLinear bit for bit. This machine may have no AVX-512: the
// real instructions run in linear_test only where the CPU has them (MX_ISA
// levels); here the kernels' own logic — layouts, nibble widening, the order of
// the sums, the epilogue — is checked everywhere AVX2 is.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/mx/kernels/linear_test_util.h"

namespace mx::kernels::internal {
TileFn Avx512TileEmulated(Kind kind, const Problem& p);
}

namespace mx::kernels {
namespace {

constexpr internal::TileOverride kEmulated{internal::Avx512TileEmulated, "avx512-simde"};

// The emulated kernels tried first; returns the name of the kernel that ran.
std::string RunEmulated(const QuantizedMatrix& x, const QuantizedMatrix& w,
                        std::span<const float> bias, const std::string& what,
                        ThreadPool* pool = nullptr) {
  KernelInfo info;
  ExpectSameAsReference(x, w, bias, DefaultIsa(), what, pool, &info, &kEmulated);
  return info.name;
}

class Avx512Emulated : public ::testing::Test {
 protected:
  void SetUp() override {
    // The emulation itself is compiled for AVX2 (see gemm_avx512_simde.cc).
    if (CpuSupports() < Isa::kAvx2) GTEST_SKIP() << "the SIMDe build of the kernels needs AVX2";
  }
};

// Every MX pair on ragged shapes, bias on and off. The integer kinds must run
// the emulated avx512 kernels; FP8 pairs (mx_f64) have none and take avx2.
TEST_F(Avx512Emulated, EveryMxPairMatchesReference) {
  const struct {
    int64_t m, n, k;
  } shapes[] = {{1, 1, 1}, {3, 17, 31}, {5, 45, 70}, {9, 16, 200}};
  for (Format fx : kMxFormats) {
    for (Format fw : kMxFormats) {
      for (const auto& s : shapes) {
        for (bool with_bias : {false, true}) {
          const std::vector<float> bias = with_bias ? Gaussian(s.n, 3) : std::vector<float>{};
          const std::string what = absl::StrCat(FormatName(fx), " x ", FormatName(fw), " ", s.m,
                                                "x", s.n, "x", s.k, with_bias ? " bias" : "");
          const std::string name =
              RunEmulated(Quantize(Gaussian(s.m * s.k, 1), s.m, s.k, fx),
                                    Quantize(Gaussian(s.n * s.k, 2), s.n, s.k, fw), bias, what);
          const internal::Kind kind = internal::KindFor(fx, fw);
          if (kind == internal::Kind::kMxI8 || kind == internal::Kind::kMxI16) {
            EXPECT_EQ(name, absl::StrCat("avx512-simde/", internal::KindName(kind))) << what;
          }
        }
      }
    }
  }
}

// The float kind: FMA over k ascending from the bias, the reference's own
// order, so even these bits match; FP32, FP16 and BF16 weights.
TEST_F(Avx512Emulated, FloatFormatsMatchReference) {
  const int64_t m = 7, n = 33, k = 45;
  for (Format f : {Format::kFp32, Format::kFp16, Format::kBf16}) {
    const std::string name =
        RunEmulated(Quantize(Gaussian(m * k, 4), m, k, f),
                              Quantize(Gaussian(n * k, 5), n, k, f), Gaussian(n, 6),
                              std::string(FormatName(f)));
    EXPECT_EQ(name, "avx512-simde/f32") << FormatName(f);
  }
}

// Large blocks of MXINT8 W against MXFP4 X: the widest kMxI8 bytes (w + 127 up
// to 254), where the avx2 kernel needs int16 groups and this one does not.
// NaN and all-zero blocks, and two threads.
TEST_F(Avx512Emulated, WideBytesNanAndZeroBlocksAndThreads) {
  ThreadPool pool(2);
  const int64_t m = 37, n = 70, k = 96;
  std::vector<float> xv = Gaussian(m * k, 7), wv = Gaussian(n * k, 8, 100.0f);
  xv[5 * k + 40] = std::nanf("");       // row 5, block 1: NaN
  std::fill_n(wv.begin() + 3 * k, 32, 0.0f);  // row 3, block 0: zero
  for (auto [fx, fw] : {std::pair{Format::kMxfp4E2m1, Format::kMxint8},
                        std::pair{Format::kMxint8, Format::kMxfp4E2m1},
                        std::pair{Format::kMxint8, Format::kMxint8}}) {
    const std::string what = absl::StrCat(FormatName(fx), " x ", FormatName(fw));
    const std::string name = RunEmulated(Quantize(xv, m, k, fx), Quantize(wv, n, k, fw),
                                                   Gaussian(n, 9), what, &pool);
    EXPECT_EQ(name.rfind("avx512-simde/", 0), 0u) << what << ": " << name;
  }
}

// Scales the fast epilogue cannot take exactly: the emulated level declines and
// the driver's exact scalar kernel runs.
TEST_F(Avx512Emulated, ExtremeScalesFallToTheExactKernel) {
  const int64_t m = 2, n = 16, k = 64;
  const std::string name = RunEmulated(
      Quantize(Gaussian(m * k, 10, 0x1p-100f), m, k, Format::kMxfp4E2m1),
      Quantize(Gaussian(n * k, 11, 0x1p-40f), n, k, Format::kMxfp4E2m1), {}, "tiny scales");
  EXPECT_EQ(name, "scalar/mx_i8");
}

}  // namespace
}  // namespace mx::kernels
