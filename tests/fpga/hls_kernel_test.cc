// The FPGA kernel's C++ (fpga/hls/mx_gemm.cc) against mx::ReferenceLinear, bit for
// bit, through the same device buffers the XRT backend hands the card.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "fpga/hls/mx_gemm.h"
#include "fpga/host/device_buffers.h"
#include "mx/codebook.h"
#include "mx/packed.h"
#include "mx/reference_gemm.h"
#include "nlohmann/json.hpp"
#include "tests/golden_json.h"
#include "tests/same_bits.h"

namespace {

using mx::Format;
using mx::QuantizedMatrix;

// Every format the kernel has a datapath for: all but LO_BCQ (refused by the
// hls-sim and fpga backends, tests/daemon/hls_sim_test.cc).
std::vector<Format> AllFormats() {
  std::vector<Format> all;
  for (const mx::FormatTraits& t : mx::AllFormats()) {
    if (t.format != Format::kLoBcq) all.push_back(t.format);
  }
  EXPECT_EQ(all.size(), static_cast<size_t>(mxhls::kHwFormatCount));
  return all;
}

std::vector<float> Gaussian(size_t count, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(count);
  for (float& x : v) x = normal(rng);
  return v;
}

QuantizedMatrix Quantize(const std::vector<float>& v, int64_t rows, int64_t cols, Format f) {
  return mx::QuantizeRows(v, rows, cols, f).value();
}

using mx_test::SameBits;  // the contract's rule: any two NaNs are equal

void ExpectKernelMatchesReference(const QuantizedMatrix& x, const QuantizedMatrix& w,
                                  std::span<const float> bias, const std::string& what) {
  const std::vector<float> expected = mx::ReferenceLinear(x, w, bias).value();
  std::vector<float> y(x.rows * w.rows, -1.0f);
  const absl::Status s = fpga::RunKernelOnHost(fpga::ToDevice(x), fpga::ToDevice(w), bias, y);
  ASSERT_TRUE(s.ok()) << what << ": " << s;
  int mismatches = 0;
  for (size_t i = 0; i < y.size() && mismatches < 5; ++i) {
    if (!SameBits(y[i], expected[i])) {
      ++mismatches;
      ADD_FAILURE() << what << ": y[" << i / w.rows << "][" << i % w.rows << "] = " << y[i]
                    << " (0x" << std::hex << std::bit_cast<uint32_t>(y[i]) << "), reference "
                    << expected[i] << " (0x" << std::bit_cast<uint32_t>(expected[i]) << std::dec
                    << ")";
    }
  }
}

// Every pair of the thirteen formats, shapes drawn at random around the awkward cases:
// M = 1 and M past one group of PE rows, N not a multiple of the PE columns, K
// ragged against the 32-element block; bias on and off.
TEST(HlsKernel, EveryFormatPairMatchesReference) {
  std::mt19937 rng(2026);
  const int64_t ms[] = {1, 3, 37};
  const int64_t ns[] = {1, 5, 133};  // 133: two tiles of 128 PE columns
  const int64_t ks[] = {1, 31, 32, 70, 129};
  int shape = 0;
  for (Format fx : AllFormats()) {
    for (Format fw : AllFormats()) {
      const int64_t m = ms[shape % 3], n = ns[(shape / 3) % 3], k = ks[shape % 5];
      ++shape;
      const QuantizedMatrix x = Quantize(Gaussian(m * k, rng), m, k, fx);
      const QuantizedMatrix w = Quantize(Gaussian(n * k, rng, 0.25f), n, k, fw);
      const std::vector<float> bias = Gaussian(n, rng);
      const std::string pair =
          absl::StrCat(mx::FormatName(fx), " x ", mx::FormatName(fw), " ", m, "x", n, "x", k);
      ExpectKernelMatchesReference(x, w, {}, pair);
      ExpectKernelMatchesReference(x, w, bias, absl::StrCat(pair, " +bias"));
    }
  }
}

// Raw element codes and scale bytes drawn uniformly (padding included): every
// element value of every MX format meets every other, with scales from underflow to overflow of FP32
// and NaN scales, and (E4M3, E5M2) Inf and NaN codes a client may pack itself.
TEST(HlsKernel, RandomCodesAndScalesMatchReference) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_int_distribution<int> scale(40, 214);
  const auto random_operand = [&](Format f, int64_t rows, int64_t cols, bool with_specials) {
    QuantizedMatrix m = mx::AllocateQuantized(f, rows, cols);
    const int bits = mx::Traits(f).element_bits;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t b = 0; b < mx::BlocksPerRow(cols); ++b) {
        std::array<uint8_t, mx::kBlockSize> codes{};
        for (auto& c : codes) {
          c = static_cast<uint8_t>(byte(rng) & ((1 << bits) - 1));
          if (!with_specials && mx::IsSpecialCode(f, c)) c = 0;
        }
        mx::PackBlock(f, codes,
                      m.elements.data() + r * mx::RowBytes(f, cols) + b * mx::BlockBytes(f));
        m.block_scales[r * mx::BlocksPerRow(cols) + b] =
            byte(rng) < 4 ? mx::kScaleNan : static_cast<uint8_t>(scale(rng));
      }
    }
    return m;
  };
  for (Format fx : AllFormats()) {
    if (!mx::IsMx(fx)) continue;
    for (Format fw : AllFormats()) {
      if (!mx::IsMx(fw)) continue;
      for (bool specials : {false, true}) {
        // K = 70: the short last block's padding holds random codes too.
        for (const int64_t k : {96, 70}) {
          const QuantizedMatrix x = random_operand(fx, 9, k, specials);
          const QuantizedMatrix w = random_operand(fw, 40, k, specials);
          ExpectKernelMatchesReference(
              x, w, {},
              absl::StrCat(mx::FormatName(fx), " x ", mx::FormatName(fw), " random codes K=", k,
                           specials ? " with Inf/NaN codes" : ""));
        }
      }
    }
  }
}

// NVFP4 operands a client packs itself: every code (−0 and the padding of a
// short last half block included), UE4M3 scale bytes from 0 (a zero block)
// to 0x7E and NaN blocks (0x7F), tensor scales whose product overflows FP32
// or falls into its subnormals; against NVFP4 and against MXFP8 (the float
// path, where each half block's byte scales its own 16 elements).
TEST(HlsKernel, RandomNvfp4CodesAndScalesMatchReference) {
  std::mt19937 rng(17);
  std::uniform_int_distribution<int> byte(0, 255);
  const float tensor_scales[] = {1.0f, 0x1p-70f, 0x1p+70f, 3.1e-3f, 1.7e+4f, 0x1p-126f};
  const auto random_nvfp4 = [&](int64_t rows, int64_t cols) {
    QuantizedMatrix m = mx::AllocateQuantized(Format::kNvfp4, rows, cols);
    for (uint8_t& b : m.elements) b = static_cast<uint8_t>(byte(rng));
    for (uint8_t& s : m.block_scales) {
      const int draw = byte(rng);
      s = draw < 6 ? mx::kNvScaleNan : draw < 12 ? 0 : static_cast<uint8_t>(draw % 0x7F);
    }
    for (float& t : m.row_scales) t = tensor_scales[byte(rng) % 6];
    return m;
  };
  for (const int64_t k : {16, 40, 96, 150}) {  // even and odd half-block counts
    const QuantizedMatrix x = random_nvfp4(9, k), w = random_nvfp4(21, k);
    ASSERT_TRUE(mx::ValidateLayout(x).ok() && mx::ValidateLayout(w).ok());
    std::vector<float> bias = Gaussian(21, rng);
    bias[3] = -0.0f;
    ExpectKernelMatchesReference(x, w, {}, absl::StrCat("NVFP4 random codes K=", k));
    ExpectKernelMatchesReference(x, w, bias, absl::StrCat("NVFP4 random codes K=", k, " +bias"));
    const QuantizedMatrix w8 = Quantize(Gaussian(21 * k, rng), 21, k, Format::kMxfp8E4m3);
    ExpectKernelMatchesReference(x, w8, bias, absl::StrCat("NVFP4 random codes x MXFP8 K=", k));
    ExpectKernelMatchesReference(w8, x, {}, absl::StrCat("MXFP8 x NVFP4 random codes K=", k));
  }
}

// The golden GEMMs of tests/golden/nvfp4.json (NVFP4 × NVFP4: the nv_blocks
// datapath) and codebook.json (NF4, bnb FP4: the float path with the kernel's
// own ROMs), each written by an independent rational model: every case's bits.
TEST(HlsKernel, GoldenGemmsOfNvfp4AndTheCodebooks) {
  for (const char* file : {"nvfp4.json", "codebook.json"}) {
    const nlohmann::json golden =
        mx_test::LoadGolden(absl::StrCat(MXSERVE_SOURCE_DIR "/tests/golden/", file));
    ASSERT_GE(golden.value("gemm", nlohmann::json::array()).size(), 3u) << file;
    for (const nlohmann::json& c : golden.at("gemm")) {
      const int64_t m = c.at("m"), k = c.at("k"), n = c.at("n");
      const Format fa = mx::ParseFormat(c.value("format_a", std::string("NVFP4"))).value();
      const Format fb = mx::ParseFormat(c.value("format_b", std::string("NVFP4"))).value();
      const std::vector<float> bias = mx_test::HexFloatsOrEmpty(c.at("bias"));
      const QuantizedMatrix qa = *mx::QuantizeRows(mx_test::HexFloats(c.at("a")), m, k, fa);
      const QuantizedMatrix qb = *mx::QuantizeColumns(mx_test::HexFloats(c.at("b")), k, n, fb);
      std::vector<float> y(m * n);
      ASSERT_TRUE(fpga::RunKernelOnHost(fpga::ToDevice(qa), fpga::ToDevice(qb), bias, y).ok());
      EXPECT_TRUE(mx_test::SameBitsAll(y, mx_test::HexFloats(c.at("c")))) << file << " " << c.at("id");
      EXPECT_EQ(fpga::KernelName(fa, fb), fa == Format::kNvfp4 ? "hls/nv_blocks" : "hls/float");
    }
  }
}

// NaN and Inf inputs make NaN blocks (scale 0xFF), zeros make all-zero blocks; a
// huge and a tiny scale side by side in one row push block results to Inf and
// into FP32 subnormals.
TEST(HlsKernel, NanBlocksZeroBlocksAndExtremeScales) {
  std::mt19937 rng(11);
  const int64_t m = 3, n = 4, k = 128;
  for (Format f : AllFormats()) {
    std::vector<float> xv = Gaussian(m * k, rng), wv = Gaussian(n * k, rng);
    xv[1 * k + 40] = std::numeric_limits<float>::quiet_NaN();
    wv[2 * k + 100] = std::numeric_limits<float>::infinity();
    for (int64_t c = 64; c < 96; ++c) xv[0 * k + c] = 0.0f;
    for (int64_t c = 0; c < 32; ++c) {
      xv[2 * k + c] *= 0x1p-120f;
      wv[3 * k + c] *= 0x1p-30f;
      xv[2 * k + 32 + c] *= 0x1p+100f;
      wv[1 * k + 32 + c] *= 0x1p+60f;
    }
    ExpectKernelMatchesReference(Quantize(xv, m, k, f), Quantize(wv, n, k, f), {},
                                 absl::StrCat(mx::FormatName(f), " NaN/zero/extreme blocks"));
  }
}

// E5M2 blocks whose elements span the whole exponent range: the wide path's
// 72-bit accumulator, where the CPU kernels fall back to the reference.
TEST(HlsKernel, WideE5m2BlocksMatchReference) {
  std::mt19937 rng(5);
  const int64_t m = 2, n = 3, k = 64;
  std::vector<float> xv = Gaussian(m * k, rng), wv = Gaussian(n * k, rng);
  for (int64_t c = 0; c < k; c += 2) {
    xv[c] *= 0x1p-14f;
    wv[c] *= 0x1p+14f;
  }
  ExpectKernelMatchesReference(Quantize(xv, m, k, Format::kMxfp8E5m2),
                               Quantize(wv, n, k, Format::kMxfp8E5m2), {}, "wide E5M2");
}

// Signed zeros are bits too. A row of -0.0 times positive weights from a -0.0
// bias stays -0.0 only if the zero padding of a ragged K is left out of the FMA
// chain; an INT8 dot of 0 under a negative scale stays -0.0 only if no bias is
// added when there is none.
TEST(HlsKernel, NegativeZerosSurvive) {
  const int64_t k = 40;
  const std::vector<float> x_values(k, -0.0f), w_values(2 * k, 1.0f);
  const std::vector<float> bias = {-0.0f, -0.0f};
  for (Format f : {Format::kFp32, Format::kBf16, Format::kFp16}) {
    ExpectKernelMatchesReference(Quantize(x_values, 1, k, f), Quantize(w_values, 2, k, f), bias,
                                 absl::StrCat(mx::FormatName(f), " -0.0 row"));
  }
  // A -0 code of a block format meets FP16 weights on the float path.
  for (Format f : {Format::kMxfp8E4m3, Format::kMxfp4E2m1, Format::kMxint8, Format::kNvfp4}) {
    ExpectKernelMatchesReference(Quantize(x_values, 1, k, f), Quantize(w_values, 2, k, Format::kFp16),
                                 bias, absl::StrCat(mx::FormatName(f), " -0 codes x FP16"));
  }
  QuantizedMatrix x = Quantize(std::vector<float>(k, 0.0f), 1, k, Format::kInt8);
  x.row_scales[0] = -1.0f;  // packed by a client: nothing forbids the sign
  const QuantizedMatrix w = Quantize(w_values, 2, k, Format::kInt8);
  std::vector<float> y(2);
  ASSERT_TRUE(fpga::RunKernelOnHost(fpga::ToDevice(x), fpga::ToDevice(w), {}, y).ok());
  EXPECT_EQ(std::bit_cast<uint32_t>(y[0]), 0x80000000u);
  ExpectKernelMatchesReference(x, w, {}, "INT8 zero dot, negative scale");
}

TEST(HlsKernel, ControlWordEncodesEveryFormatAndItsDatapath) {
  for (Format fx : AllFormats()) {
    const mxhls::HwFormat hx = fpga::HwFormatOf(fx);
    EXPECT_EQ(static_cast<int>(hx), static_cast<int>(fx)) << mx::FormatName(fx);
    EXPECT_EQ(mxhls::ElementBits(hx), mx::Traits(fx).element_bits) << mx::FormatName(fx);
    EXPECT_EQ(mxhls::IsMxFormat(hx), mx::IsMx(fx)) << mx::FormatName(fx);
    for (Format fw : AllFormats()) {
      for (bool bias : {false, true}) {
        const uint32_t c = fpga::ControlWord(fx, fw, bias);
        EXPECT_EQ(mxhls::ControlX(c), hx);
        EXPECT_EQ(mxhls::ControlW(c), fpga::HwFormatOf(fw));
        EXPECT_EQ(mxhls::ControlHasBias(c), bias);
        EXPECT_EQ(c >> 12, 0u) << "bits above the datapath field are reserved";
        const mxhls::Datapath path = mxhls::ControlPath(c);
        const std::string pair = absl::StrCat(mx::FormatName(fx), " x ", mx::FormatName(fw));
        switch (mx::GemmPathFor(fx, fw)) {
          case mx::GemmPath::kMxBlocks: {
            const bool fp8 = fx == Format::kMxfp8E4m3 || fx == Format::kMxfp8E5m2 ||
                             fw == Format::kMxfp8E4m3 || fw == Format::kMxfp8E5m2;
            EXPECT_EQ(path, fp8 ? mxhls::kPathMxWide : mxhls::kPathMxInteger) << pair;
            break;
          }
          case mx::GemmPath::kInt8:
            EXPECT_EQ(path, mxhls::kPathInt8) << pair;
            break;
          case mx::GemmPath::kFloat:
            EXPECT_EQ(path, mxhls::kPathFloat) << pair;
            break;
          case mx::GemmPath::kNvBlocks:
            EXPECT_EQ(path, mxhls::kPathNv) << pair;
            break;
        }
      }
    }
  }
  // Two fixed words, so the encoding cannot drift silently.
  EXPECT_EQ(fpga::ControlWord(Format::kMxfp4E2m1, Format::kMxfp8E4m3, true), 0x304u);
  EXPECT_EQ(fpga::ControlWord(Format::kBf16, Format::kBf16, false), 0x677u);
  EXPECT_EQ(fpga::ControlWord(Format::kNvfp4, Format::kNvfp4, true), 0x9AAu);
}

// Device buffers: MX operands byte for byte as mx/ packs them, dense formats
// padded to whole blocks of zero codes, and back again unchanged.
TEST(HlsKernel, DeviceBuffersRoundTrip) {
  std::mt19937 rng(3);
  const int64_t rows = 3, cols = 45;  // two blocks, the second short
  for (Format f : AllFormats()) {
    const QuantizedMatrix m = Quantize(Gaussian(rows * cols, rng), rows, cols, f);
    const fpga::DeviceOperand d = fpga::ToDevice(m);
    const int64_t row_words = 2 * mxhls::WordsPerBlock(fpga::HwFormatOf(f));
    ASSERT_EQ(static_cast<int64_t>(d.elements.size()), rows * row_words) << mx::FormatName(f);
    if (mx::Traits(f).kind == mx::FormatKind::kCodebook) {
      // One 64-element block a row in mx/ (32 bytes), two device blocks (16 bytes
      // each, the same nibbles) whose scale words both hold its absmax.
      for (int64_t r = 0; r < rows; ++r) {
        EXPECT_EQ(0, std::memcmp(&d.elements[r * 4], m.elements.data() + r * 32, 32)) << r;
        for (int b = 0; b < 2; ++b) {
          float absmax;
          std::memcpy(&absmax, reinterpret_cast<const uint8_t*>(d.scales.data()) + 4 * (r * 2 + b), 4);
          EXPECT_EQ(absmax, mx::LookupScale(m, r, 0)) << r;
        }
      }
    } else if (f == Format::kNvfp4) {
      // Three half blocks a row: mx/'s three words, then a zero fourth.
      for (int64_t r = 0; r < rows; ++r) {
        EXPECT_EQ(0, std::memcmp(&d.elements[r * 4], m.elements.data() + r * 24, 24)) << r;
        EXPECT_EQ(d.elements[r * 4 + 3], 0u) << r;
      }
      // Scale bytes: two per device block, rows × 2 × 2, a zero fourth byte per
      // row; the tensor scales from word ceil(12 / 8) = 2.
      const auto* bytes = reinterpret_cast<const uint8_t*>(d.scales.data());
      for (int64_t r = 0; r < rows; ++r) {
        for (int h = 0; h < 3; ++h) EXPECT_EQ(bytes[r * 4 + h], m.block_scales[r * 3 + h]);
        EXPECT_EQ(bytes[r * 4 + 3], 0);
      }
      ASSERT_EQ(mxhls::NvRowScaleWord(rows, 2), 2);
      ASSERT_EQ(d.scales.size(), 2u + 2u + 1u);
      EXPECT_EQ(0, std::memcmp(&d.scales[2], m.row_scales.data(), rows * sizeof(float)));
    } else if (mx::IsMx(f)) {
      EXPECT_EQ(0, std::memcmp(d.elements.data(), m.elements.data(), m.elements.size()))
          << mx::FormatName(f) << ": the device gets mx/'s packed bytes";
    } else {
      // Row 1 starts on its own block boundary, its padding codes are zero.
      const auto* bytes = reinterpret_cast<const uint8_t*>(d.elements.data());
      const int64_t eb = mx::Traits(f).element_bits / 8;
      EXPECT_EQ(0, std::memcmp(bytes + row_words * 8, m.elements.data() + cols * eb, cols * eb))
          << mx::FormatName(f);
      for (int64_t i = cols * eb; i < 64 * eb; ++i) ASSERT_EQ(bytes[row_words * 8 + i], 0);
    }
    const QuantizedMatrix back = fpga::FromDevice(d);
    EXPECT_EQ(back.elements, m.elements) << mx::FormatName(f);
    EXPECT_EQ(back.block_scales, m.block_scales) << mx::FormatName(f);
    EXPECT_EQ(back.row_scales, m.row_scales) << mx::FormatName(f);
  }
}

TEST(HlsKernel, ShapesOutsideTheKernelAreRefusedByName) {
  EXPECT_EQ(fpga::CheckKernelShapes(2, 3, 64, 32, 0, 6).message(),
            "w: expected K = 64 columns to match x, got 32");
  EXPECT_EQ(fpga::CheckKernelShapes(2, 3, 16400, 16400, 0, 6).message(),
            "K: the FPGA kernel holds 1 to 16384 columns in its on-chip W tile, got 16400");
  EXPECT_EQ(fpga::CheckKernelShapes(2, 3, 64, 64, 2, 6).message(),
            "bias: expected 3 values (one per row of w), got 2");
  EXPECT_EQ(fpga::CheckKernelShapes(0, 3, 64, 64, 0, 0).message(),
            "shape: the FPGA kernel takes M and N in [1, 2^31), got 0x3");
  const QuantizedMatrix x = Quantize(std::vector<float>(64, 1.0f), 2, 32, Format::kMxfp4E2m1);
  std::vector<float> y(3);
  EXPECT_EQ(fpga::RunKernelOnHost(fpga::ToDevice(x), fpga::ToDevice(x), {}, y).message(),
            "y: expected 4 values (M x N), got 3");
}

}  // namespace
