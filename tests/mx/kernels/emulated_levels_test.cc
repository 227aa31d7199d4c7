// The avx512 and amx levels' GEMM kernels compiled against SIMDe and an AMX
// emulation (simd_emulation.h, gemm_*_emulated.cc), against mx::ReferenceLinear
// bit for bit. The machines here have neither instruction set: the real
// instructions run in linear_test only where a CPU has them (it tests every
// level AvailableIsas() lists). Here the kernels' own logic — layouts, nibble
// widening, AMX tile shapes, the order of the sums, the epilogue — is checked
// on every CPU with AVX2.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/mx/kernels/linear_test_util.h"

namespace mx::kernels::internal {
TileKernel Avx512TileEmulated(Kind kind, const Problem& p);
TileKernel AmxTileEmulated(Kind kind, const Problem& p);
}  // namespace mx::kernels::internal

namespace mx::kernels {
namespace {

struct Level {
  internal::TileOverride tiles;
  // The real level these kernels are: the kinds it has are the table's
  // (internal::kHasKernel); the others fall through to avx2 here.
  Isa isa;
};

const Level& Avx512Level() {
  static const Level level{{internal::Avx512TileEmulated, "avx512-simde", internal::kAvx512TileRows},
                           Isa::kAvx512};
  return level;
}
const Level& AmxLevel() {
  static const Level level{{internal::AmxTileEmulated, "amx-emulated", internal::kAmxTileRows},
                           Isa::kAmx};
  return level;
}

class EmulatedLevel : public ::testing::TestWithParam<const Level*> {
 protected:
  void SetUp() override {
    // The emulation itself is compiled for AVX2 (see simd_emulation.h).
    if (CpuSupports() < Isa::kAvx2) GTEST_SKIP() << "the emulated kernels are built for AVX2";
  }
  // Runs the level's kernels first, checks every output, returns the kernel name.
  // The real levels below are capped at avx2, so a kind the emulated level has
  // no kernel for lands on the same level on every machine, AVX-512 ones included.
  std::string Run(const QuantizedMatrix& x, const QuantizedMatrix& w, std::span<const float> bias,
                  const std::string& what, ThreadPool* pool = nullptr) {
    KernelInfo info;
    ExpectSameAsReference(x, w, bias, Isa::kAvx2, what, pool, &info, &GetParam()->tiles);
    return info.name;
  }
  // The name a call of `kind` must report: this level's kernel where the table
  // says it has one, else the kernel of the best real level up to avx2.
  std::string Expected(internal::Kind kind) const {
    if (internal::HasKernel(GetParam()->isa, kind)) {
      return absl::StrCat(GetParam()->tiles.name, "/", internal::KindName(kind));
    }
    return internal::KernelName(internal::LevelFor(kind, Isa::kAvx2), kind);
  }
};

INSTANTIATE_TEST_SUITE_P(Levels, EmulatedLevel, ::testing::Values(&Avx512Level(), &AmxLevel()),
                         [](const auto& info) {
                           return info.param == &AmxLevel() ? std::string("amx")
                                                            : std::string("avx512");
                         });

// The table of which kinds each level has (internal::kHasKernel) against the
// level's own tile function: on every AVX2 machine, whatever the CPU runs.
TEST_P(EmulatedLevel, KernelTableMatchesTheTileFunction) {
  ExpectTileFunctionMatchesTheTable(GetParam()->isa, GetParam()->tiles.select,
                                    GetParam()->tiles.name);
}

// Every MX pair on ragged shapes, bias on and off.
TEST_P(EmulatedLevel, EveryMxPairMatchesReference) {
  const struct {
    int64_t m, n, k;
  } shapes[] = {{1, 1, 1}, {3, 17, 31}, {37, 45, 70}, {16, 16, 200}};
  for (Format fx : kMxFormats) {
    for (Format fw : kMxFormats) {
      for (const auto& s : shapes) {
        for (bool with_bias : {false, true}) {
          const std::vector<float> bias = with_bias ? Gaussian(s.n, 3) : std::vector<float>{};
          const std::string what = absl::StrCat(FormatName(fx), " x ", FormatName(fw), " ", s.m,
                                                "x", s.n, "x", s.k, with_bias ? " bias" : "");
          const std::string name = Run(Quantize(Gaussian(s.m * s.k, 1), s.m, s.k, fx),
                                       Quantize(Gaussian(s.n * s.k, 2), s.n, s.k, fw), bias, what);
          EXPECT_EQ(name, Expected(internal::KindFor(fx, fw))) << what;
        }
      }
    }
  }
}

// The float kind: FMA over k ascending from the bias, the reference's own order,
// so even these bits match; FP32, FP16 and BF16 weights. BF16 × BF16 runs the
// level's pair instructions (vdpbf16ps, TDPBF16PS), held to the float bound.
TEST_P(EmulatedLevel, FloatFormatsMatchReference) {
  const int64_t m = 7, n = 33, k = 45;
  for (Format f : {Format::kFp32, Format::kFp16, Format::kBf16}) {
    const std::string name =
        Run(Quantize(Gaussian(m * k, 4), m, k, f), Quantize(Gaussian(n * k, 5), n, k, f),
            Gaussian(n, 6), std::string(FormatName(f)));
    EXPECT_EQ(name, Expected(internal::KindFor(f, f))) << FormatName(f);
  }
  // FP32 X with BF16 W: the float kind on W's pair layout, the reference's bits.
  const std::string name = Run(Quantize(Gaussian(m * k, 7), m, k, Format::kFp32),
                               Quantize(Gaussian(n * k, 8), n, k, Format::kBf16), Gaussian(n, 9),
                               "FP32 x BF16");
  EXPECT_EQ(name, Expected(internal::Kind::kF32));
}

// BF16 × BF16 on the pair instructions, modelled with their flushes
// (simd_emulation.h): ragged shapes and odd K within the float bound, the guard
// (outputs it refuses come out of the exact order: the reference's bits), and
// a row's bits against its batch-mates and W's slices. For the amx level's 2×2
// tiles: M = 37 is a whole 32-row call and a short one, M = 20 a call whose
// second row tile has 4 rows, N = 45 and 33 odd counts of panels (a last call
// with one).
TEST_P(EmulatedLevel, Bf16PairsAndTheirGuard) {
  ThreadPool pool(2);
  const struct { int64_t m, n, k; } shapes[] = {
      {1, 1, 1}, {3, 17, 31}, {37, 45, 301}, {20, 33, 96}};
  uint32_t seed = 620;
  for (const auto& s : shapes) {
    for (bool with_bias : {false, true}) {
      seed += 3;
      const std::vector<float> bias = with_bias ? Gaussian(s.n, seed) : std::vector<float>{};
      const std::string what =
          absl::StrCat("BF16 ", s.m, "x", s.n, "x", s.k, with_bias ? " bias" : "");
      const std::string name =
          Run(Quantize(Gaussian(s.m * s.k, seed + 1), s.m, s.k, Format::kBf16),
              Quantize(Gaussian(s.n * s.k, seed + 2), s.n, s.k, Format::kBf16), bias, what, &pool);
      EXPECT_EQ(name, Expected(internal::Kind::kBf16)) << what;
    }
  }
  for (const Bf16GuardCase& c : Bf16GuardCases()) {
    EXPECT_EQ(Run(c.x, c.w, c.bias, c.what), Expected(internal::Kind::kBf16)) << c.what;
  }
  ExpectBf16BitsIndependentOfBatchAndSlice(
      [](const QuantizedMatrix& x, const QuantizedMatrix& w) {
        std::vector<float> y(x.rows * w.rows);
        const PackedWeight packed = PackedWeight::Pack(w).value();
        EXPECT_TRUE(
            internal::LinearWith(x, packed, {}, y, {.isa = Isa::kAvx2}, &GetParam()->tiles).ok());
        return y;
      },
      GetParam()->tiles.name);
}

// NVFP4 × NVFP4 (blocks of 16, tensor scales after the blocks, the bias last):
// ragged shapes, K not a multiple of 16, bias on and off, NaN and zero blocks.
TEST_P(EmulatedLevel, Nvfp4MatchesReference) {
  const struct { int64_t m, n, k; } shapes[] = {{1, 1, 1}, {3, 17, 31}, {37, 45, 301}};
  uint32_t seed = 660;
  for (const auto& s : shapes) {
    for (bool with_bias : {false, true}) {
      seed += 4;
      std::vector<float> xv = Gaussian(s.m * s.k, seed + 1), wv = Gaussian(s.n * s.k, seed + 2);
      if (s.k > 40) {
        xv[2 * s.k + 20] = std::numeric_limits<float>::quiet_NaN();  // row 2, block 1
        std::fill(wv.begin() + 3 * s.k, wv.begin() + 3 * s.k + 16, 0.0f);  // col 3, block 0
      }
      const std::vector<float> bias = with_bias ? Gaussian(s.n, seed) : std::vector<float>{};
      const std::string what =
          absl::StrCat("NVFP4 ", s.m, "x", s.n, "x", s.k, with_bias ? " bias" : "");
      const std::string name = Run(Quantize(xv, s.m, s.k, Format::kNvfp4),
                                   Quantize(wv, s.n, s.k, Format::kNvfp4), bias, what);
      EXPECT_EQ(name, Expected(internal::Kind::kNvI8)) << what;
    }
  }
}

// INT8 × INT8 (per-row scales, the whole K in int32, the bias after), ragged
// shapes with bias on and off, K past several blocks, two threads; and INT8 with
// the float formats.
TEST_P(EmulatedLevel, Int8MatchesReference) {
  ThreadPool pool(2);
  // K of one block, of whole pairs of blocks, and of pairs and one more.
  const struct { int64_t m, n, k; } shapes[] = {
      {1, 1, 1}, {3, 17, 31}, {37, 45, 301}, {20, 19, 130}};
  uint32_t seed = 200;
  for (const auto& s : shapes) {
    for (bool with_bias : {false, true}) {
      seed += 3;
      const std::vector<float> bias = with_bias ? Gaussian(s.n, seed) : std::vector<float>{};
      const std::string what =
          absl::StrCat("INT8 ", s.m, "x", s.n, "x", s.k, with_bias ? " bias" : "");
      const QuantizedMatrix x = Quantize(Gaussian(s.m * s.k, seed + 1), s.m, s.k, Format::kInt8);
      const QuantizedMatrix w =
          Quantize(Gaussian(s.n * s.k, seed + 2, 30.0f), s.n, s.k, Format::kInt8);
      const std::string name = Run(x, w, bias, what, &pool);
      EXPECT_EQ(name, Expected(internal::Kind::kInt8)) << what;
    }
  }
  for (Format f : {Format::kBf16, Format::kFp32}) {
    const std::string name = Run(Quantize(Gaussian(5 * 70, 210), 5, 70, Format::kInt8),
                                 Quantize(Gaussian(19 * 70, 211), 19, 70, f), Gaussian(19, 212),
                                 absl::StrCat("INT8 x ", FormatName(f)));
    EXPECT_EQ(name, Expected(internal::KindFor(Format::kInt8, f))) << FormatName(f);
  }
}

// MXFP8 E5M2 blocks whose pair spans more than FP64's 53 bits, planted among
// ordinary ones: the level's FP64 tiles run first, then the driver computes those
// outputs again exactly; every output must equal the reference.
TEST_P(EmulatedLevel, WideE5m2BlocksAreRedoneExactly) {
  ThreadPool pool(2);
  const int64_t m = 21, n = 35, k = 130;
  std::vector<float> xv = Gaussian(m * k, 220), wv = Gaussian(n * k, 221);
  for (int64_t i : {2, 9, 20}) {  // a 31-bit span in X's block 1 of these rows
    xv[i * k + 32] = 0x1p15f;
    xv[i * k + 33] = 0x1p-16f;
  }
  for (int64_t j : {0, 17, 34}) {
    wv[j * k + 32] = -0x1p15f;
    wv[j * k + 35] = 0x1.8p-16f;
  }
  PlantUnlimbedWAgainstOneElementX(xv, wv, k);
  for (Format wf : {Format::kMxfp8E5m2, Format::kMxfp8E4m3}) {
    const std::string what = absl::StrCat("wide E5M2 x ", FormatName(wf));
    const std::string name = Run(Quantize(xv, m, k, Format::kMxfp8E5m2), Quantize(wv, n, k, wf),
                                 Gaussian(n, 222), what, &pool);
    // 31 bits of X's block with E5M2's or E4M3's widest (31, 17): both pairs
    // pass 53 bits.
    EXPECT_EQ(name, Expected(internal::Kind::kMxF64) + "+exact_wide") << what;
  }
}

// kMxF64's int16 path at and past its bounds (Int16Bounds): rows of a tile split
// between int16 and FP64, whole tiles in FP64, E4M3 and E5M2.
TEST_P(EmulatedLevel, MxFp8Int16PathBounds) {
  ThreadPool pool(2);
  for (Format xf : {Format::kMxfp8E4m3, Format::kMxfp8E5m2}) {
    for (Format wf : {Format::kMxfp8E4m3, Format::kMxfp8E5m2}) {
      const Int16BoundsCase c = Int16Bounds(xf, wf);
      const std::string what = absl::StrCat(FormatName(xf), " x ", FormatName(wf));
      const std::string name = Run(c.x, c.w, c.bias, what, &pool);
      EXPECT_EQ(name.substr(0, name.find('+')), Expected(internal::Kind::kMxF64)) << what;
    }
  }
}

// A shifted row's residue against W's low limbs in two k-pairs
// (ResidueMeetsLowLimbs), all rows at once and a decode step at a time.
TEST_P(EmulatedLevel, MxFp8ResidueMeetsLowLimbs) {
  const auto [x, w] = ResidueMeetsLowLimbs();
  const std::vector<float> bias(w.rows, 0.0f);
  EXPECT_EQ(Run(x, w, bias, "16 rows"), Expected(internal::Kind::kMxF64));
  EXPECT_EQ(Run(MxRows(x, 8, 8), w, bias, "rows 8 to 15"), Expected(internal::Kind::kMxF64));
}

// INT8 and MXINT8 × MXINT8 through W's u8 copy (vpdpbusd at avx512) at their
// extreme, every element −128, beside Gaussian operands.
TEST_P(EmulatedLevel, Int8AndMxint8BytePaths) {
  const std::vector<float> bias = Gaussian(21, 9);
  const std::string int8 = Run(AllMinus128Int8(9, 1000, 0x1p-12f),
                               AllMinus128Int8(21, 1000, 0x1p-3f), bias, "INT8 -128");
  EXPECT_EQ(int8, Expected(internal::Kind::kInt8));
  const std::string mxint8 = Run(AllMinus128Mxint8(9, 100, 170), AllMinus128Mxint8(21, 100, 140),
                                 bias, "MXINT8 -128");
  EXPECT_EQ(mxint8, Expected(internal::Kind::kMxI16));
  Run(Quantize(Gaussian(11 * 90, 10), 11, 90, Format::kMxint8),
      Quantize(Gaussian(21 * 90, 11), 21, 90, Format::kMxint8), bias, "MXINT8 Gaussian");
}

// Shifted scales past the int16 path's fast-epilogue limit: the FP64-only tiles.
TEST_P(EmulatedLevel, MxFp8HugeShiftedScales) {
  const auto [x, w] = HugeShiftedScales(Format::kMxfp8E4m3, Format::kMxfp8E4m3);
  const std::string name = Run(x, w, {}, "huge shifted scales");
  EXPECT_EQ(name, Expected(internal::Kind::kMxF64));
}

// Two-limb X blocks count in the fast-epilogue range.
TEST_P(EmulatedLevel, MxFp8TwoLimbXWithTinyScale) {
  const auto [x, w] = TinyScaleWideX(Format::kMxfp8E4m3);
  EXPECT_EQ(Run(x, w, {}, "tiny-scale two-limb X"), Expected(internal::Kind::kMxF64));
}

// MXINT8 W against MXFP4 X: the widest kMxI8 bytes (w + 127 up to 254), where the
// avx2 kernel needs int16 groups and these do not. NaN and all-zero blocks, and
// two threads.
TEST_P(EmulatedLevel, WideBytesNanAndZeroBlocksAndThreads) {
  ThreadPool pool(2);
  const int64_t m = 37, n = 70, k = 96;
  std::vector<float> xv = Gaussian(m * k, 7), wv = Gaussian(n * k, 8, 100.0f);
  xv[5 * k + 40] = std::nanf("");             // row 5, block 1: NaN
  std::fill_n(wv.begin() + 3 * k, 32, 0.0f);  // row 3, block 0: zero
  for (auto [fx, fw] : {std::pair{Format::kMxfp4E2m1, Format::kMxint8},
                        std::pair{Format::kMxint8, Format::kMxfp4E2m1},
                        std::pair{Format::kMxint8, Format::kMxint8}}) {
    const std::string what = absl::StrCat(FormatName(fx), " x ", FormatName(fw));
    const std::string name =
        Run(Quantize(xv, m, k, fx), Quantize(wv, n, k, fw), Gaussian(n, 9), what, &pool);
    EXPECT_EQ(name, Expected(internal::KindFor(fx, fw))) << what;
  }
}

// Scales the fast epilogue cannot take exactly: the level declines and the
// driver's exact scalar kernel runs.
TEST_P(EmulatedLevel, ExtremeScalesFallToTheExactKernel) {
  const int64_t m = 2, n = 16, k = 64;
  const std::string name =
      Run(Quantize(Gaussian(m * k, 10, 0x1p-100f), m, k, Format::kMxfp4E2m1),
          Quantize(Gaussian(n * k, 11, 0x1p-40f), n, k, Format::kMxfp4E2m1), {}, "tiny scales");
  EXPECT_EQ(name, "scalar/mx_i8");
}

}  // namespace
}  // namespace mx::kernels
