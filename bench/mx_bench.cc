// mx_bench: the fast CPU kernels against the peers a user would pick instead on
// the same CPU, measured in the same run.
//
// Benchmarks (one thread unless the name ends in /threads:N; N is 2 unless
// --threads=N says otherwise, e.g. 16 on a 16-core machine):
//   quantize/<FORMAT>/<elements>            FP32 → packed format (mx::kernels), GBps
//   quantize_reference/<FORMAT>/<elements>  the scalar reference quantizer, for scale
//   quantize_stochastic/<FORMAT>/<elements> seeded stochastic rounding (mx::kernels)
//   gemm/<FORMAT>/<M>x<N>x<K>               Y = X·Wᵀ: X quantized per call, W pre-packed
//   gemm/openblas_sgemm/<M>x<N>x<K>         cblas_sgemm (FP32)
//   gemm/onednn_bf16/<M>x<N>x<K>            oneDNN matmul, BF16 in, FP32 out
//   gemm/onednn_f32/<M>x<N>x<K>             oneDNN matmul, FP32
//   model/<FORMAT|peer>/qwen2.5-0.5b/M8     a rollout decode step: all 168 linear
//                                           layers of Qwen2.5-0.5B, each with its
//                                           own weights, at M = 8 (counter tokens_per_s),
//                                           on one thread and on N
// Shapes: Qwen2.5-0.5B's linear layers, W (N×K) = 896×896 (q, o), 128×896 (k, v),
// 4864×896 (gate, up), 896×4864 (down), at M = 8, 512 and 4096. Counters: GFLOPS
// = 2·M·N·K per second; GBps = FP32 input bytes per second. `ratio` lines close
// the run: each format against each peer, NVFP4 against MXFP4, and N threads
// against one.
//
// A peer that cannot run on this CPU (oneDNN 2.6 has BF16 matmul only with
// AVX-512) reports the reason as the benchmark's error instead of a time.
#include <algorithm>
#include <benchmark/benchmark.h>
#include <cblas.h>
#include <omp.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <dnnl.hpp>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "mx/format.h"
#include "mx/kernels/cpu_features.h"
#include "mx/kernels/linear.h"
#include "mx/kernels/quantize_fast.h"
#include "mx/kernels/thread_pool.h"
#include "mx/packed.h"

namespace {

struct Shape {
  int64_t m, n, k;
  std::string Name() const {
    return std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k);
  }
  double Flops() const { return 2.0 * m * n * k; }
};

std::vector<Shape> GemmShapes() {
  const std::pair<int64_t, int64_t> layers[] = {{896, 896}, {128, 896}, {4864, 896}, {896, 4864}};
  std::vector<Shape> shapes;
  for (int64_t m : {8, 512, 4096}) {
    for (auto [n, k] : layers) shapes.push_back({m, n, k});
  }
  return shapes;
}

constexpr mx::Format kGemmFormats[] = {
    mx::Format::kMxfp8E4m3, mx::Format::kMxfp8E5m2, mx::Format::kMxfp6E3m2,
    mx::Format::kMxfp6E2m3, mx::Format::kMxfp4E2m1, mx::Format::kMxint8,
    mx::Format::kInt8,      mx::Format::kBf16,      mx::Format::kFp16,
    mx::Format::kFp32,      mx::Format::kNvfp4};

// Gaussian-ish values, fast enough for the 358 M weights of the model sweep.
std::vector<float> Random(size_t count, uint64_t seed, float scale = 1.0f) {
  std::vector<float> v(count);
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (float& x : v) {
    // Sum of four uniforms: bell-shaped, cheap.
    float sum = 0;
    for (int i = 0; i < 4; ++i) {
      s ^= s << 13;
      s ^= s >> 7;
      s ^= s << 17;
      sum += static_cast<float>(s >> 40) * 0x1p-24f - 0.5f;
    }
    x = sum * scale * 1.7f;
  }
  return v;
}

// Threads of the many-thread variants (--threads=N, default 2).
int g_many_threads = 2;

std::string ThreadSuffix(int threads) {
  return threads == 1 ? "" : "/threads:" + std::to_string(threads);
}

void SetThreads(int threads) {
  openblas_set_num_threads(threads);
  omp_set_num_threads(threads);
}

mx::kernels::ThreadPool& Pool(int threads) {
  static std::map<int, std::unique_ptr<mx::kernels::ThreadPool>> pools;
  std::unique_ptr<mx::kernels::ThreadPool>& pool = pools[threads];
  if (!pool) pool = std::make_unique<mx::kernels::ThreadPool>(threads);
  return *pool;
}

void SetGflops(benchmark::State& state, double flops) {
  state.counters["GFLOPS"] =
      benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

// --- quantize ---

void Quantize(benchmark::State& state, mx::Format format, int64_t elements, bool reference,
              mx::Rounding rounding = mx::Rounding::kNearestEven) {
  const int64_t cols = 4096, rows = elements / cols;
  const std::vector<float> x = Random(elements, 1);
  mx::QuantizeOptions options;
  options.rounding = rounding;
  options.seed = 7;
  for (auto _ : state) {
    auto q = reference ? mx::QuantizeRows(x, rows, cols, format, options)
                       : mx::kernels::QuantizeRows(x, rows, cols, format, options);
    benchmark::DoNotOptimize(q);
  }
  state.counters["GBps"] = benchmark::Counter(static_cast<double>(elements) * 4 * 1e-9,
                                              benchmark::Counter::kIsIterationInvariantRate);
}

// --- mxserve's kernels ---

// One linear layer as the daemon runs it: quantize X, then Y = X·Wᵀ.
struct Layer {
  mx::kernels::PackedWeight w;
  int64_t n, k;
};

Layer MakeLayer(mx::Format format, int64_t n, int64_t k, uint64_t seed) {
  const mx::QuantizedMatrix q =
      mx::kernels::QuantizeRows(Random(n * k, seed, 0.05f), n, k, format).value();
  return {mx::kernels::PackedWeight::Pack(q).value(), n, k};
}

bool RunLayer(benchmark::State& state, const Layer& layer, const std::vector<float>& x,
              int64_t m, std::vector<float>& y, mx::kernels::ThreadPool& pool) {
  absl::StatusOr<mx::QuantizedMatrix> qx =
      mx::kernels::QuantizeRows(std::span<const float>(x.data(), m * layer.k), m, layer.k,
                                layer.w.format(), {}, mx::kernels::DefaultIsa(), &pool);
  absl::StatusOr<mx::kernels::KernelInfo> info =
      mx::kernels::Linear(*qx, layer.w, {}, std::span<float>(y.data(), m * layer.n),
                          {.pool = &pool});
  if (!info.ok()) {
    state.SkipWithError(std::string(info.status().message()).c_str());
    return false;
  }
  state.SetLabel(info->name);
  return true;
}

void Gemm(benchmark::State& state, mx::Format format, Shape s, int threads) {
  const Layer layer = MakeLayer(format, s.n, s.k, 3);
  const std::vector<float> x = Random(s.m * s.k, 2);
  std::vector<float> y(s.m * s.n);
  for (auto _ : state) {
    if (!RunLayer(state, layer, x, s.m, y, Pool(threads))) return;
    benchmark::DoNotOptimize(y.data());
  }
  SetGflops(state, s.Flops());
}

// --- peers ---

void GemmOpenBlas(benchmark::State& state, Shape s, int threads) {
  SetThreads(threads);
  const std::vector<float> x = Random(s.m * s.k, 2), w = Random(s.n * s.k, 3);
  std::vector<float> y(s.m * s.n);
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, s.m, s.n, s.k, 1.0f, x.data(), s.k,
                w.data(), s.k, 0.0f, y.data(), s.n);
    benchmark::DoNotOptimize(y.data());
  }
  SetGflops(state, s.Flops());
  SetThreads(1);
}

// A oneDNN matmul Y (M×N, f32) = X (M×K) · Wᵀ with W stored N×K, in `type`.
class OneDnnMatmul {
 public:
  OneDnnMatmul(int64_t m, int64_t n, int64_t k, dnnl::memory::data_type type)
      : engine_(dnnl::engine::kind::cpu, 0), stream_(engine_) {
    using dnnl::memory;
    const memory::desc x({m, k}, type, memory::format_tag::ab);
    const memory::desc w({k, n}, type, memory::format_tag::ba);  // N×K row-major = Wᵀ
    const memory::desc y({m, n}, memory::data_type::f32, memory::format_tag::ab);
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(x, w, y), engine_);
    matmul_ = dnnl::matmul(pd);
    x_ = memory(x, engine_);
    w_ = memory(w, engine_);
    y_ = memory(y, engine_);
    std::memset(x_.get_data_handle(), 0, x.get_size());
    std::memset(w_.get_data_handle(), 0, w.get_size());
  }
  void Run() {
    matmul_.execute(stream_, {{DNNL_ARG_SRC, x_}, {DNNL_ARG_WEIGHTS, w_}, {DNNL_ARG_DST, y_}});
    stream_.wait();
  }

 private:
  dnnl::engine engine_;
  dnnl::stream stream_;
  dnnl::matmul matmul_;
  dnnl::memory x_, w_, y_;
};

// nullptr and an error on `state` when oneDNN has no implementation here.
std::unique_ptr<OneDnnMatmul> MakeOneDnn(benchmark::State& state, int64_t m, int64_t n,
                                         int64_t k, dnnl::memory::data_type type) {
  try {
    return std::make_unique<OneDnnMatmul>(m, n, k, type);
  } catch (const dnnl::error& e) {
    state.SkipWithError(
        "oneDNN has no matmul for this data type on this CPU (its BF16 needs AVX-512)");
    return nullptr;
  }
}

void GemmOneDnn(benchmark::State& state, Shape s, dnnl::memory::data_type type, int threads) {
  SetThreads(threads);
  std::unique_ptr<OneDnnMatmul> mm = MakeOneDnn(state, s.m, s.n, s.k, type);
  if (mm) {
    for (auto _ : state) mm->Run();
    SetGflops(state, s.Flops());
  }
  SetThreads(1);
}

// --- the whole-model sweep ---

// Qwen2.5-0.5B: 24 blocks of q, k, v, o, gate, up, down.
std::vector<std::pair<int64_t, int64_t>> ModelLayers() {
  std::vector<std::pair<int64_t, int64_t>> layers;
  for (int block = 0; block < 24; ++block) {
    for (auto nk : {std::pair<int64_t, int64_t>{896, 896}, {128, 896}, {128, 896}, {896, 896},
                    {4864, 896}, {4864, 896}, {896, 4864}}) {
      layers.push_back(nk);
    }
  }
  return layers;
}

double ModelFlops(int64_t m) {
  double flops = 0;
  for (auto [n, k] : ModelLayers()) flops += 2.0 * m * n * k;
  return flops;
}

void SetModelCounters(benchmark::State& state, int64_t m) {
  SetGflops(state, ModelFlops(m));
  state.counters["tokens_per_s"] =
      benchmark::Counter(static_cast<double>(m), benchmark::Counter::kIsIterationInvariantRate);
}

// The model's layers in `format`, kept for the next benchmark of the same
// format (its one- and many-thread runs are registered together): quantizing
// 358 M weights takes longer than the benchmark. One format's at a time.
const std::vector<Layer>& ModelLayersIn(mx::Format format) {
  static std::optional<mx::Format> cached;
  static std::vector<Layer> layers;
  if (cached != format) {
    layers = {};  // freed before the next format's are made
    uint64_t seed = 100;
    for (auto [n, k] : ModelLayers()) layers.push_back(MakeLayer(format, n, k, ++seed));
    cached = format;
  }
  return layers;
}

void Model(benchmark::State& state, mx::Format format, int64_t m, int threads) {
  const std::vector<Layer>& layers = ModelLayersIn(format);
  const std::vector<float> x = Random(m * 4864, 7);
  std::vector<float> y(m * 4864);
  for (auto _ : state) {
    for (const Layer& layer : layers) {
      if (!RunLayer(state, layer, x, m, y, Pool(threads))) return;
    }
    benchmark::DoNotOptimize(y.data());
  }
  SetModelCounters(state, m);
}

void ModelOpenBlas(benchmark::State& state, int64_t m, int threads) {
  SetThreads(threads);
  std::vector<std::vector<float>> weights;
  uint64_t seed = 100;
  for (auto [n, k] : ModelLayers()) weights.push_back(Random(n * k, ++seed, 0.05f));
  const std::vector<float> x = Random(m * 4864, 7);
  std::vector<float> y(m * 4864);
  const auto layers = ModelLayers();
  for (auto _ : state) {
    for (size_t i = 0; i < layers.size(); ++i) {
      const auto [n, k] = layers[i];
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, x.data(), k,
                  weights[i].data(), k, 0.0f, y.data(), n);
    }
    benchmark::DoNotOptimize(y.data());
  }
  SetModelCounters(state, m);
  SetThreads(1);
}

void ModelOneDnn(benchmark::State& state, int64_t m, dnnl::memory::data_type type, int threads) {
  SetThreads(threads);
  std::vector<std::unique_ptr<OneDnnMatmul>> layers;
  for (auto [n, k] : ModelLayers()) {
    layers.push_back(MakeOneDnn(state, m, n, k, type));
    if (!layers.back()) return SetThreads(1);
  }
  for (auto _ : state) {
    for (auto& layer : layers) layer->Run();
  }
  SetModelCounters(state, m);
  SetThreads(1);
}

// --- ratios ---

// Keeps each benchmark's seconds per iteration so ratios can be printed at the
// end: the best of its repetitions (this machine's noise only ever adds time),
// or its median when only aggregates are reported. Everything else goes to the
// reporter --benchmark_format asks for (console, json, csv), so json stays valid
// JSON on stdout; the ratios then go to stderr.
class RatioReporter : public benchmark::BenchmarkReporter {
 public:
  RatioReporter(std::unique_ptr<benchmark::BenchmarkReporter> inner, FILE* ratios)
      : inner_(std::move(inner)), out_(ratios) {}

  bool ReportContext(const Context& context) override { return inner_->ReportContext(context); }
  void Finalize() override { inner_->Finalize(); }
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& run : runs) {
      const bool sample = run.run_type == Run::RT_Iteration ||
                          (run.run_type == Run::RT_Aggregate && run.aggregate_name == "median");
      if (!sample || run.error_occurred) continue;
      const auto [it, added] =
          seconds_.try_emplace(run.run_name.function_name, run.GetAdjustedRealTime());
      if (!added) it->second = std::min(it->second, run.GetAdjustedRealTime());
    }
    inner_->ReportRuns(runs);
  }

  void PrintRatios() const {
    std::fprintf(out_, "\nratio = peer time / mxserve time (> 1: mxserve is faster)\n");
    const char* peers[] = {"openblas_sgemm", "onednn_bf16", "onednn_f32"};
    for (const Shape& s : GemmShapes()) {
      for (int threads : {1, g_many_threads}) {
        for (mx::Format f : kGemmFormats) {
          const std::string ours = Name("gemm", f, s, threads);
          for (const char* peer : peers) {
            Print(ours, "gemm/" + std::string(peer) + "/" + s.Name() + ThreadSuffix(threads));
          }
        }
      }
    }
    for (const auto& [name, seconds] : seconds_) {
      if (name.rfind("model/", 0) != 0 || name.find("openblas") != std::string::npos ||
          name.find("onednn") != std::string::npos) {
        continue;
      }
      const std::string tail = name.substr(name.find("/qwen"));
      for (const char* peer : peers) Print(name, "model/" + std::string(peer) + tail);
    }
    std::fprintf(out_, "\nratio = MXFP4 time / NVFP4 time (> 1: NVFP4 is faster)\n");
    for (const Shape& s : GemmShapes()) {
      for (int threads : {1, g_many_threads}) {
        Print(Name("gemm", mx::Format::kNvfp4, s, threads),
              Name("gemm", mx::Format::kMxfp4E2m1, s, threads), "vs MXFP4_E2M1");
      }
    }
    for (const auto& [name, seconds] : seconds_) {
      const std::string nv = "/NVFP4/";
      const size_t at = name.find(nv);
      if (at == std::string::npos || name.rfind("gemm/", 0) == 0) continue;
      Print(name, name.substr(0, at) + "/MXFP4_E2M1/" + name.substr(at + nv.size()),
            "vs MXFP4_E2M1");
    }
    std::fprintf(out_, "\nratio = one-thread time / %d-thread time\n", g_many_threads);
    for (const auto& [name, seconds] : seconds_) {
      const size_t at = name.find("/threads:");
      if (at != std::string::npos) Print(name, name.substr(0, at), /*label=*/"vs one thread");
    }
  }

  static std::string Name(const std::string& kind, mx::Format f, const Shape& s, int threads) {
    return kind + "/" + std::string(mx::FormatName(f)) + "/" + s.Name() + ThreadSuffix(threads);
  }

 private:
  void Print(const std::string& ours, const std::string& peer, const char* label = nullptr) const {
    const auto a = seconds_.find(ours), b = seconds_.find(peer);
    if (a == seconds_.end() || b == seconds_.end()) return;
    std::fprintf(out_, "ratio %s %s: %.2f\n", ours.c_str(),
                 label
                     ? label
                     : ("vs " + peer.substr(peer.find('/') + 1, peer.find('/', peer.find('/') + 1) -
                                                                    peer.find('/') - 1))
                           .c_str(),
                 b->second / a->second);
  }

  std::unique_ptr<benchmark::BenchmarkReporter> inner_;
  FILE* out_;
  std::map<std::string, double> seconds_;
};

// The value of --benchmark_format (console, json or csv), read before
// benchmark::Initialize consumes the flag.
std::string FormatFlag(int argc, char** argv) {
  std::string format = "console";
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const std::string flag = "--benchmark_format=";
    if (arg.rfind(flag, 0) == 0) format = arg.substr(flag.size());
  }
  return format;
}

template <typename F>
void Register(const std::string& name, F f, double min_time = 0.3) {
  benchmark::RegisterBenchmark(name.c_str(), f)->Unit(benchmark::kMillisecond)->MinTime(min_time);
}

}  // namespace

// Takes mx_bench's own --threads=N out of argv (benchmark::Initialize would
// refuse it); false, with a message, when N is not 2..1024.
bool TakeThreadsFlag(int& argc, char** argv) {
  const std::string flag = "--threads=";
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind(flag, 0) != 0) {
      argv[kept++] = argv[i];
      continue;
    }
    char* end = nullptr;
    const long n = std::strtol(arg.c_str() + flag.size(), &end, 10);
    if (end == arg.c_str() + flag.size() || *end != '\0' || n < 2 || n > 1024) {
      std::fprintf(stderr, "mx_bench: --threads wants a whole number 2..1024, got '%s'\n",
                   arg.c_str() + flag.size());
      return false;
    }
    g_many_threads = static_cast<int>(n);
  }
  argc = kept;
  return true;
}

int main(int argc, char** argv) {
  if (!TakeThreadsFlag(argc, argv)) return 2;
  SetThreads(1);
  // On stderr and in the benchmark context, so that json output stays JSON.
  const std::string isa(mx::kernels::IsaName(mx::kernels::DefaultIsa()));
  const std::string cpu_isa(mx::kernels::IsaName(mx::kernels::CpuSupports()));
  std::fprintf(stderr, "mx_bench: kernels at %s (CPU supports %s; MX_ISA caps it)\n", isa.c_str(),
               cpu_isa.c_str());
  benchmark::AddCustomContext("mx_kernels_isa", isa);
  benchmark::AddCustomContext("mx_cpu_isa", cpu_isa);
  constexpr int64_t kElements = 1 << 20;
  for (const mx::FormatTraits& t : mx::AllFormats()) {
    const std::string suffix = std::string(t.name) + "/" + std::to_string(kElements);
    Register("quantize/" + suffix,
             [f = t.format](benchmark::State& s) { Quantize(s, f, kElements, false); });
  }
  for (mx::Format f : {mx::Format::kMxfp4E2m1, mx::Format::kMxfp8E4m3}) {
    Register("quantize_reference/" + std::string(mx::FormatName(f)) + "/" +
                 std::to_string(kElements),
             [f](benchmark::State& s) { Quantize(s, f, kElements, true); });
  }
  for (mx::Format f : {mx::Format::kMxfp4E2m1, mx::Format::kMxfp8E4m3, mx::Format::kNvfp4}) {
    Register("quantize_stochastic/" + std::string(mx::FormatName(f)) + "/" +
                 std::to_string(kElements),
             [f](benchmark::State& s) {
               Quantize(s, f, kElements, false, mx::Rounding::kStochastic);
             });
  }
  using dt = dnnl::memory::data_type;
  for (const Shape& shape : GemmShapes()) {
    // Many threads where the work is large enough to split (M >= 512).
    for (int threads :
         shape.m >= 512 ? std::vector<int>{1, g_many_threads} : std::vector<int>{1}) {
      const std::string tail = shape.Name() + ThreadSuffix(threads);
      for (mx::Format f : kGemmFormats) {
        Register(RatioReporter::Name("gemm", f, shape, threads),
                 [=](benchmark::State& s) { Gemm(s, f, shape, threads); });
      }
      Register("gemm/openblas_sgemm/" + tail,
               [=](benchmark::State& s) { GemmOpenBlas(s, shape, threads); });
      Register("gemm/onednn_bf16/" + tail,
               [=](benchmark::State& s) { GemmOneDnn(s, shape, dt::bf16, threads); });
      Register("gemm/onednn_f32/" + tail,
               [=](benchmark::State& s) { GemmOneDnn(s, shape, dt::f32, threads); });
    }
  }
  constexpr int64_t kDecodeRows = 8;
  const std::string model = "/qwen2.5-0.5b/M" + std::to_string(kDecodeRows);
  // The decode step on one thread and on many: 168 small GEMMs back to back,
  // where the pool's hand-off per GEMM counts. A format's two runs side by
  // side, so the second reuses its layers (ModelLayersIn).
  for (mx::Format f : {mx::Format::kMxfp4E2m1, mx::Format::kNvfp4, mx::Format::kMxfp6E2m3,
                       mx::Format::kMxfp8E4m3, mx::Format::kMxint8, mx::Format::kBf16}) {
    for (int threads : {1, g_many_threads}) {
      Register("model/" + std::string(mx::FormatName(f)) + model + ThreadSuffix(threads),
               [f, threads](benchmark::State& s) { Model(s, f, kDecodeRows, threads); }, 2.0);
    }
  }
  for (int threads : {1, g_many_threads}) {
    const std::string tail = model + ThreadSuffix(threads);
    Register("model/openblas_sgemm" + tail,
             [threads](benchmark::State& s) { ModelOpenBlas(s, kDecodeRows, threads); }, 2.0);
    Register("model/onednn_bf16" + tail,
             [threads](benchmark::State& s) {
               ModelOneDnn(s, kDecodeRows, dt::bf16, threads);
             },
             2.0);
    Register("model/onednn_f32" + tail,
             [threads](benchmark::State& s) { ModelOneDnn(s, kDecodeRows, dt::f32, threads); },
             2.0);
  }

  const std::string format = FormatFlag(argc, argv);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  std::unique_ptr<benchmark::BenchmarkReporter> display;
  if (format == "json") {
    display = std::make_unique<benchmark::JSONReporter>();
  } else if (format == "csv") {
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"  // still the library's csv
    display = std::make_unique<benchmark::CSVReporter>();
#pragma GCC diagnostic pop
  } else {
    // Colour only on a terminal: piped output stays plain text for grep.
    display = std::make_unique<benchmark::ConsoleReporter>(
        isatty(STDOUT_FILENO) ? benchmark::ConsoleReporter::OO_Defaults
                              : benchmark::ConsoleReporter::OO_Tabular);
  }
  RatioReporter reporter(std::move(display), format == "console" ? stdout : stderr);
  benchmark::RunSpecifiedBenchmarks(&reporter);
  reporter.PrintRatios();
  benchmark::Shutdown();
  return 0;
}
