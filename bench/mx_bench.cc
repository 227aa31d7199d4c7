// mx_bench: speed of the mx library's reference paths, with OpenBLAS SGEMM on the
// same shapes in the same run as the well-known peer. The reference GEMM is the
// numerics oracle, not a fast kernel: the ratio says how far the fast kernels
// (issue "Fast CPU kernels") have to go.
//
// Benchmarks:
//   quantize/<FORMAT>/<elements>          FP32 → packed format, counter GBps (input bytes/s)
//   gemm_reference/<FORMAT>/<M>x<N>x<K>   Y = X·Wᵀ, W pre-packed, X quantized per call
//   gemm/openblas_sgemm/<M>x<N>x<K>       cblas_sgemm, one thread
// GEMM counters: GFLOPS = 2·M·N·K per second. A ratio line per format and shape
// closes the run.
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "mx/format.h"
#include "mx/packed.h"
#include "mx/reference_gemm.h"

namespace {

struct Shape {
  int64_t m, n, k;
  std::string Name() const {
    return std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k);
  }
};

// A decode step of 8 sequences through Qwen2.5-0.5B's q projection, and a
// smaller prefill-like shape; the reference path is too slow for the large ones.
const Shape kShapes[] = {{8, 896, 896}, {64, 128, 896}};

std::vector<float> Gaussian(size_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> v(count);
  for (float& x : v) x = normal(rng);
  return v;
}

void Quantize(benchmark::State& state, mx::Format format, int64_t elements) {
  const int64_t cols = 4096, rows = elements / cols;
  const std::vector<float> x = Gaussian(elements, 1);
  for (auto _ : state) {
    auto q = mx::QuantizeRows(x, rows, cols, format);
    benchmark::DoNotOptimize(q);
  }
  state.counters["GBps"] = benchmark::Counter(static_cast<double>(elements) * 4 * 1e-9,
                                              benchmark::Counter::kIsIterationInvariantRate);
}

void SetGflops(benchmark::State& state, const Shape& s) {
  state.counters["GFLOPS"] = benchmark::Counter(2.0 * s.m * s.n * s.k * 1e-9,
                                                benchmark::Counter::kIsIterationInvariantRate);
}

void GemmReference(benchmark::State& state, mx::Format format, Shape s) {
  const std::vector<float> x = Gaussian(s.m * s.k, 2);
  const mx::QuantizedMatrix w = mx::QuantizeRows(Gaussian(s.n * s.k, 3), s.n, s.k, format).value();
  for (auto _ : state) {
    auto qx = mx::QuantizeRows(x, s.m, s.k, format);
    auto y = mx::ReferenceLinear(*qx, w);
    benchmark::DoNotOptimize(y);
  }
  SetGflops(state, s);
}

void GemmOpenBlas(benchmark::State& state, Shape s) {
  const std::vector<float> x = Gaussian(s.m * s.k, 2), w = Gaussian(s.n * s.k, 3);
  std::vector<float> y(s.m * s.n);
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, s.m, s.n, s.k, 1.0f, x.data(), s.k,
                w.data(), s.k, 0.0f, y.data(), s.n);
    benchmark::DoNotOptimize(y.data());
  }
  SetGflops(state, s);
}

// Keeps each run's seconds per iteration so ratios can be printed at the end.
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& run : runs) {
      if (run.run_type == Run::RT_Iteration && !run.error_occurred) {
        seconds_[run.benchmark_name()] = run.GetAdjustedRealTime();
      }
    }
    ConsoleReporter::ReportRuns(runs);
  }
  void PrintRatios() const {
    std::printf(
        "\nratio (OpenBLAS sgemm time / reference time; > 1 means faster than OpenBLAS):\n");
    for (const Shape& s : kShapes) {
      const auto peer = seconds_.find("gemm/openblas_sgemm/" + s.Name());
      if (peer == seconds_.end()) continue;
      for (const mx::FormatTraits& t : mx::AllFormats()) {
        const auto ours = seconds_.find("gemm_reference/" + std::string(t.name) + "/" + s.Name());
        if (ours == seconds_.end()) continue;
        std::printf("ratio gemm_reference/%s/%s vs openblas_sgemm: %.4f\n",
                    std::string(t.name).c_str(), s.Name().c_str(), peer->second / ours->second);
      }
    }
  }

 private:
  std::map<std::string, double> seconds_;
};

}  // namespace

int main(int argc, char** argv) {
  openblas_set_num_threads(1);  // single-thread figures on both sides
  for (const mx::FormatTraits& t : mx::AllFormats()) {
    constexpr int64_t kElements = 1 << 20;
    benchmark::RegisterBenchmark(
        ("quantize/" + std::string(t.name) + "/" + std::to_string(kElements)).c_str(),
        [format = t.format](benchmark::State& s) { Quantize(s, format, kElements); })
        ->Unit(benchmark::kMillisecond);
  }
  for (const Shape& shape : kShapes) {
    for (const mx::FormatTraits& t : mx::AllFormats()) {
      benchmark::RegisterBenchmark(
          ("gemm_reference/" + std::string(t.name) + "/" + shape.Name()).c_str(),
          [format = t.format, shape](benchmark::State& s) { GemmReference(s, format, shape); })
          ->Unit(benchmark::kMillisecond);
    }
    benchmark::RegisterBenchmark(("gemm/openblas_sgemm/" + shape.Name()).c_str(),
                                 [shape](benchmark::State& s) { GemmOpenBlas(s, shape); })
        ->Unit(benchmark::kMillisecond);
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  RatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  reporter.PrintRatios();
  benchmark::Shutdown();
  return 0;
}
