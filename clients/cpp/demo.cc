#include "clients/cpp/demo.h"

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "mx/format.h"
#include "mx/packed.h"
#include "mx/reference_gemm.h"

namespace mxctl {
namespace {

// Activations of a transformer layer: Gaussian rows whose magnitudes vary over
// three decades, with rare outliers 20× the rest (what makes per-tensor INT8 hurt).
std::vector<float> ActivationLike(int64_t rows, int64_t cols, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> log_scale(-1.5f, 1.5f);
  std::bernoulli_distribution outlier(0.005);
  std::vector<float> values(rows * cols);
  for (int64_t r = 0; r < rows; ++r) {
    const float row_scale = std::pow(10.0f, log_scale(rng));
    for (int64_t c = 0; c < cols; ++c) {
      values[r * cols + c] = normal(rng) * row_scale * (outlier(rng) ? 20.0f : 1.0f);
    }
  }
  return values;
}

double BitsPerValue(mx::Format format, int64_t cols) {
  const mx::FormatTraits& t = mx::Traits(format);
  // INT8's FP32 row scale over the row; the block formats' scales over their
  // blocks (NVFP4's one tensor scale over the demo's tensor is left out).
  if (format == mx::Format::kInt8) return 8.0 + 32.0 / static_cast<double>(cols);
  return t.bits_with_block_scale();
}

// Signal-to-quantization-noise ratio in dB.
double SqnrDb(const std::vector<double>& exact, const std::vector<float>& approx) {
  double signal = 0.0, noise = 0.0;
  for (size_t i = 0; i < exact.size(); ++i) {
    signal += exact[i] * exact[i];
    noise += (exact[i] - approx[i]) * (exact[i] - approx[i]);
  }
  return noise == 0.0 ? INFINITY : 10.0 * std::log10(signal / noise);
}

}  // namespace

int RunDemo() {
  constexpr int64_t kRows = 32, kCols = 1024, kOut = 64;
  std::mt19937 rng(2025);
  const std::vector<float> x = ActivationLike(kRows, kCols, rng);
  std::vector<float> w(kCols * kOut);
  std::normal_distribution<float> normal(0.0f, 0.03f);
  for (float& v : w) v = normal(rng);

  // FP64 references: the tensor itself and its product with W.
  const std::vector<double> x64(x.begin(), x.end());
  std::vector<double> y64(kRows * kOut, 0.0);
  for (int64_t i = 0; i < kRows; ++i)
    for (int64_t k = 0; k < kCols; ++k)
      for (int64_t j = 0; j < kOut; ++j)
        y64[i * kOut + j] += double{x[i * kCols + k]} * w[k * kOut + j];

  std::printf(
      "mxserve demo: a %lldx%lld activation-like tensor (rows over 3 decades, 0.5%% "
      "outliers at 20x)\nquantized in every format, and a %lldx%lldx%lld GEMM with a "
      "Gaussian weight, against FP64.\n\n",
      static_cast<long long>(kRows), static_cast<long long>(kCols), static_cast<long long>(kRows),
      static_cast<long long>(kOut), static_cast<long long>(kCols));
  std::printf("%-11s %9s %15s %13s %13s\n", "format", "bits/val", "quantize SQNR", "max |err|",
              "GEMM SQNR");
  for (const mx::FormatTraits& t : mx::AllFormats()) {
    const auto quantized = mx::QuantizeRows(x, kRows, kCols, t.format);
    const auto y = mx::ReferenceGemm(x, t.format, w, t.format, kRows, kCols, kOut);
    if (!quantized.ok() || !y.ok()) {
      std::fprintf(stderr, "mxctl: error: demo failed for %s\n", std::string(t.name).c_str());
      return 1;
    }
    const std::vector<float> xq = mx::Dequantize(*quantized);
    double max_error = 0.0;
    for (size_t i = 0; i < x.size(); ++i)
      max_error = std::max(max_error, std::fabs(x64[i] - xq[i]));
    std::printf("%-11s %9.3f %12.1f dB %13.3g %10.1f dB\n", std::string(t.name).c_str(),
                BitsPerValue(t.format, kCols), SqnrDb(x64, xq), max_error, SqnrDb(y64, *y));
  }
  std::printf(
      "\nSQNR = 10·log10(signal power / error power); higher is better, ~6 dB per bit.\n"
      "MX formats share one E8M0 scale per 32 values; NVFP4 one UE4M3 scale per 16 (plus one\n"
      "FP32 scale per tensor, not counted); INT8 uses one FP32 scale per row.\n");
  return 0;
}

}  // namespace mxctl
