// Models and Policies through the real daemon: safetensors loading, weight
// versions, quantize-once caching, the memory limit, policy resolution and
// activation.
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "mx/kernels/linear.h"
#include "mx/packed.h"
#include "tests/daemon/api_util.h"
#include "tests/daemon/daemon_process.h"

namespace mx_test {
namespace {

// A safetensors file of FP32 tensors: 8-byte little-endian header length, the
// JSON header, then the data.
std::string WriteSafetensors(const std::vector<std::pair<std::string, TestLayer>>& tensors) {
  std::string header = R"({"__metadata__": {"format": "pt"})";
  std::string data;
  auto add = [&](const std::string& name, const std::vector<float>& values,
                 const std::string& shape) {
    const size_t begin = data.size();
    data.append(reinterpret_cast<const char*>(values.data()), values.size() * 4);
    absl::StrAppend(&header, R"(, ")", name, R"(": {"dtype": "F32", "shape": )", shape,
                    R"(, "data_offsets": [)", begin, ", ", data.size(), "]}");
  };
  for (const auto& [prefix, l] : tensors) {
    add(absl::StrCat(prefix, l.name, ".weight"), l.weight,
        absl::StrCat("[", l.out, ", ", l.in, "]"));
    if (l.bias)
      add(absl::StrCat(prefix, l.name, ".bias"), l.bias_values, absl::StrCat("[", l.out, "]"));
  }
  header += "}";
  const std::string path =
      absl::StrCat(::testing::TempDir(), "/mxserve_models_test_", getpid(), ".safetensors");
  std::ofstream out(path, std::ios::binary);
  const uint64_t length = header.size();
  out.write(reinterpret_cast<const char*>(&length), 8);
  out << header << data;
  return path;
}

grpc::Status Forward(grpc::Channel* channel, const std::string& model, const std::string& layer,
                     v1::Phase phase, v1::Format format, const std::vector<float>& x, int64_t m,
                     int64_t k, v1::LayerForwardResponse* response, uint64_t min_version = 0) {
  v1::LayerForwardRequest request;
  request.set_model(model);
  request.set_layer(layer);
  request.set_phase(phase);
  request.set_format(format);
  request.set_min_weight_version(min_version);
  *request.mutable_input()->mutable_tensor() = Matrix(x, m, k);
  grpc::ClientContext context;
  auto stub = v1::Compute::NewStub(std::shared_ptr<grpc::Channel>(channel, [](grpc::Channel*) {}));
  return stub->LayerForward(&context, request, response);
}

v1::ModelInfo Describe(grpc::Channel* channel, const std::string& name) {
  auto stub = v1::Models::NewStub(std::shared_ptr<grpc::Channel>(channel, [](grpc::Channel*) {}));
  grpc::ClientContext context;
  v1::DescribeModelRequest request;
  request.set_name(name);
  v1::ModelInfo info;
  EXPECT_TRUE(stub->DescribeModel(&context, request, &info).ok());
  return info;
}

class ModelsTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(daemon_.ok()); }
  grpc::Channel* channel() { return daemon_.channel().get(); }
  DaemonProcess daemon_{
      {"--workers", "2", "--weight-memory-bytes", "1M", "--model-dir", ::testing::TempDir()}};
};

// Every model's layers are in its ModelInfo, so one answer could not hold them
// all: two models of 200,000 layers made every client's ListModels fail with
// "Sent message larger than max" (a black-box test). It answers in pages now.
TEST(ListModelsTest, PagesStayUnderTheMessageLimitAndJoinToEveryModel) {
  DaemonProcess daemon({"--max-message-bytes", "64K"});
  ASSERT_TRUE(daemon.ok());
  // Seven models of about 17 KB of ModelInfo each: three fit in a 60 KB page.
  std::vector<std::string> names;
  for (int m = 0; m < 7; ++m) {
    std::vector<TestLayer> layers;
    for (int l = 0; l < 80; ++l) {
      layers.push_back(MakeLayer(absl::StrCat(std::string(200, 'a' + m), l), 1, 1, false, l));
    }
    names.push_back(absl::StrCat("m", 6 - m));  // registered out of name order
    ASSERT_TRUE(Register(daemon.channel().get(), names.back(), layers).ok());
  }
  std::sort(names.begin(), names.end());
  auto stub = v1::Models::NewStub(daemon.channel());
  auto list = [&](uint32_t page_size, const std::string& token, v1::ListModelsResponse* page) {
    grpc::ClientContext context;
    v1::ListModelsRequest request;
    request.set_page_size(page_size);
    request.set_page_token(token);
    return stub->ListModels(&context, request, page);
  };
  for (const uint32_t page_size : {0u, 2u}) {
    std::vector<std::string> listed;
    std::vector<int> pages;
    std::string token;
    do {
      v1::ListModelsResponse page;
      const grpc::Status s = list(page_size, token, &page);
      ASSERT_TRUE(s.ok()) << s.error_message();
      EXPECT_LE(page.ByteSizeLong(), 60u << 10);
      for (const v1::ModelInfo& model : page.models()) {
        listed.push_back(model.name());
        EXPECT_EQ(model.layers_size(), 80);
      }
      pages.push_back(page.models_size());
      token = page.next_page_token();
      ASSERT_LT(pages.size(), 8u) << "the pages do not end";
    } while (!token.empty());
    EXPECT_EQ(listed, names) << page_size;
    const std::vector<int> expected =
        page_size == 0 ? std::vector<int>{3, 3, 1} : std::vector<int>{2, 2, 2, 1};
    EXPECT_EQ(pages, expected);
  }
  // A page_size past 2^31 was read as negative: no model, then models(-1) (a
  // review found it). It is as good as none: the byte budget decides.
  v1::ListModelsResponse huge;
  ASSERT_TRUE(list(4294967295u, "", &huge).ok());
  EXPECT_EQ(huge.models_size(), 3);
  EXPECT_EQ(huge.next_page_token(), names[2]);
  // A token past the last model: an empty last page.
  v1::ListModelsResponse empty;
  ASSERT_TRUE(list(0, "z", &empty).ok());
  EXPECT_EQ(empty.models_size(), 0);
  EXPECT_EQ(empty.next_page_token(), "");
  v1::ListModelsResponse bad;
  const grpc::Status refused = list(0, "not a name", &bad);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(refused.error_message(),
            "page_token: expected empty or the next_page_token of an earlier ListModels answer (a "
            "model name), got 'not a name'");
}

TEST_F(ModelsTest, SafetensorsLoadThenVersionBumpChangesResults) {
  const TestLayer q = MakeLayer("model.layers.0.self_attn.q_proj", 32, 64, true, 41);
  const TestLayer up = MakeLayer("model.layers.0.mlp.up_proj", 48, 64, false, 42);
  ASSERT_TRUE(Register(channel(), "qwen", {q, up}).ok());
  const std::string path = WriteSafetensors({{"model.", q}, {"model.", up}});
  auto models = v1::Models::NewStub(daemon_.channel());
  {
    v1::LoadSafetensorsRequest request;
    request.set_model("qwen");
    request.set_path(path);
    request.set_prefix("model.");
    request.set_publish(true);
    grpc::ClientContext context;
    v1::UploadWeightsResponse response;
    grpc::Status s = models->LoadSafetensors(&context, request, &response);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(response.tensors_staged(), 3u);
    EXPECT_EQ(response.weight_version(), 1u);
  }
  // Publishing warmed the copies the active policy (D) uses for each layer.
  const v1::ModelInfo info = Describe(channel(), "qwen");
  EXPECT_EQ(info.weight_version(), 1u);
  EXPECT_EQ(info.policy(), "D-phase-adaptive");
  ASSERT_EQ(info.layers_size(), 2);
  EXPECT_GT(info.layers(0).cached_formats_size(), 0);
  EXPECT_GT(info.weight_bytes(), 0u);

  const auto x = TestValues(3 * 64, 43);
  v1::LayerForwardResponse r1;
  ASSERT_TRUE(
      Forward(channel(), "qwen", up.name, v1::PHASE_ROLLOUT, v1::FORMAT_MXFP4_E2M1, x, 3, 64, &r1)
          .ok());
  EXPECT_TRUE(SameBits(Floats(r1.output()), ReferenceForward(up, x, 3, mx::Format::kMxfp4E2m1)));

  // Version 2 through a chunked upload: results change, old requirement fails.
  const TestLayer up2 = MakeLayer(up.name, 48, 64, false, 44);
  v1::UploadWeightsResponse uploaded;
  ASSERT_TRUE(Upload(channel(), "qwen", {up2}, /*publish=*/true, &uploaded, 500).ok());
  EXPECT_EQ(uploaded.weight_version(), 2u);
  v1::LayerForwardResponse r2;
  ASSERT_TRUE(Forward(channel(), "qwen", up.name, v1::PHASE_ROLLOUT, v1::FORMAT_MXFP4_E2M1, x, 3,
                      64, &r2, /*min_version=*/2)
                  .ok());
  EXPECT_EQ(r2.info().weight_version(), 2u);
  EXPECT_TRUE(SameBits(Floats(r2.output()), ReferenceForward(up2, x, 3, mx::Format::kMxfp4E2m1)));
  EXPECT_FALSE(SameBits(Floats(r2.output()), Floats(r1.output())));
  // The unchanged layer kept its weights (and its version's copies).
  v1::LayerForwardResponse rq;
  ASSERT_TRUE(
      Forward(channel(), "qwen", q.name, v1::PHASE_REWARD, v1::FORMAT_MXFP8_E4M3, x, 3, 64, &rq)
          .ok());
  EXPECT_TRUE(SameBits(Floats(rq.output()), ReferenceForward(q, x, 3, mx::Format::kMxfp8E4m3)));

  v1::LayerForwardResponse r3;
  grpc::Status too_new = Forward(channel(), "qwen", up.name, v1::PHASE_ROLLOUT,
                                 v1::FORMAT_MXFP4_E2M1, x, 3, 64, &r3, /*min_version=*/3);
  EXPECT_EQ(too_new.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(too_new.error_message().find("min_weight_version"), std::string::npos);
  std::filesystem::remove(path);
}

TEST_F(ModelsTest, MemoryLimitRejectsAndNothingIsHalfRegistered) {
  // 1 MiB limit: a 1024×1024 FP32 model (4 MiB) cannot be registered at all.
  const TestLayer big{"big", 1024, 1024, false, {}, {}};
  grpc::Status s = Register(channel(), "big", {big});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(s.error_message().find("--weight-memory-bytes"), std::string::npos);
  // "two" (2 × 320 KB) registers while memory is free ...
  const TestLayer a = MakeLayer("a", 200, 400, false, 1), b = MakeLayer("b", 200, 400, false, 2);
  ASSERT_TRUE(Register(channel(), "two", {a, b}, "fp16-baseline").ok());
  // ... then "one" takes 480 KB + its FP16 copy (about 240 KB as packed panels) ...
  const TestLayer one = MakeLayer("a", 300, 400, false, 3);
  ASSERT_TRUE(RegisterAndPublish(channel(), "one", {one}, "fp16-baseline").ok());
  // ... so the upload of "two" fails at its second tensor, even with the copy
  // evicted (masters are not a cache), and stages nothing.
  v1::UploadWeightsResponse response;
  s = Upload(channel(), "two", {a, b}, true, &response, 40000);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_NE(s.error_message().find("tensor 'b.weight'"), std::string::npos) << s.error_message();
  v1::ModelInfo info = Describe(channel(), "two");
  EXPECT_EQ(info.staged_tensors(), 0u);
  EXPECT_EQ(info.weight_version(), 0u);
  EXPECT_EQ(info.weight_bytes(), 0u);
  // "one" is untouched and still answers.
  const auto x = TestValues(400, 4);
  v1::LayerForwardResponse r;
  ASSERT_TRUE(
      Forward(channel(), "one", "a", v1::PHASE_ROLLOUT, v1::FORMAT_FP16, x, 1, 400, &r).ok());
  EXPECT_EQ(r.info().weight_version(), 1u);
  EXPECT_TRUE(SameBits(Floats(r.output()), ReferenceForward(one, x, 1, mx::Format::kFp16)));
  // Deleting "one" frees its bytes, and the upload of "two" now fits.
  auto models = v1::Models::NewStub(daemon_.channel());
  grpc::ClientContext context;
  v1::DeleteModelRequest del;
  del.set_name("one");
  v1::DeleteModelResponse deleted;
  ASSERT_TRUE(models->DeleteModel(&context, del, &deleted).ok());
  // The FP32 master and the FP16 copy as the kernels hold it (padded panels).
  const uint64_t copy_bytes =
      mx::kernels::PackedWeight::Pack(*mx::QuantizeRows(one.weight, 300, 400, mx::Format::kFp16))
          ->bytes();
  EXPECT_EQ(deleted.freed_bytes(), 300u * 400 * 4 + copy_bytes);
  s = Upload(channel(), "two", {a, b}, true, &response, 40000);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(response.weight_version(), 1u);
}

// Quantized copies are a cache: with a tight budget, a forward in one more format
// must not block the next weight version (it did until DeleteModel before the
// copies could be evicted).
TEST_F(ModelsTest, CachedCopiesGiveWayToTheNextVersion) {
  // 480 KB of FP32 master in a 1 MiB budget, its FP16 copy warmed at publish.
  const TestLayer v1_layer = MakeLayer("a", 300, 400, false, 7);
  ASSERT_TRUE(RegisterAndPublish(channel(), "tight", {v1_layer}, "fp16-baseline").ok());
  const auto x = TestValues(2 * 400, 8);
  v1::LayerForwardResponse r;
  for (v1::Format f : {v1::FORMAT_MXFP4_E2M1, v1::FORMAT_FP16}) {
    ASSERT_TRUE(Forward(channel(), "tight", "a", v1::PHASE_ROLLOUT, f, x, 2, 400, &r).ok());
  }
  EXPECT_EQ(Describe(channel(), "tight").layers(0).cached_formats_size(), 2);
  // Version 2's master needs 480 KB more: only evicting copies makes it fit.
  const TestLayer v2_layer = MakeLayer("a", 300, 400, false, 9);
  v1::UploadWeightsResponse uploaded;
  grpc::Status s = Upload(channel(), "tight", {v2_layer}, /*publish=*/true, &uploaded, 30000);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(uploaded.weight_version(), 2u);
  const std::string metrics = ScrapeMetrics(daemon_.metrics_address());
  EXPECT_GE(MetricValue(metrics, "mxserve_weight_evictions_total"), 1) << metrics;
  // The new version answers with its own bits, in an evicted format too.
  ASSERT_TRUE(
      Forward(channel(), "tight", "a", v1::PHASE_ROLLOUT, v1::FORMAT_MXFP4_E2M1, x, 2, 400, &r, 2)
          .ok());
  EXPECT_TRUE(
      SameBits(Floats(r.output()), ReferenceForward(v2_layer, x, 2, mx::Format::kMxfp4E2m1)));
}

TEST_F(ModelsTest, AnUploadWhosePublishFailsStagesNothing) {
  const TestLayer a = MakeLayer("a", 8, 32, false, 5), b = MakeLayer("b", 8, 32, true, 6);
  ASSERT_TRUE(Register(channel(), "half", {a, b}).ok());
  v1::UploadWeightsResponse response;
  grpc::Status s = Upload(channel(), "half", {a}, /*publish=*/true, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(s.error_message().find("layer: 'b' has no weight staged or published"),
            std::string::npos)
      << s.error_message();
  EXPECT_EQ(Describe(channel(), "half").staged_tensors(), 0u);
  // Without publish it stages; publishing then names the missing bias.
  ASSERT_TRUE(Upload(channel(), "half", {a}, /*publish=*/false, &response).ok());
  TestLayer b_weight_only = b;
  b_weight_only.bias = false;
  ASSERT_TRUE(Upload(channel(), "half", {b_weight_only}, false, &response).ok());
  EXPECT_EQ(Describe(channel(), "half").staged_tensors(), 2u);
  auto models = v1::Models::NewStub(daemon_.channel());
  grpc::ClientContext context;
  v1::PublishVersionRequest publish;
  publish.set_model("half");
  v1::ModelInfo info;
  s = models->PublishVersion(&context, publish, &info);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(s.error_message().find("'b' is declared with a bias, but none is staged"),
            std::string::npos);
  ASSERT_TRUE(Upload(channel(), "half", {b}, true, &response).ok());
  EXPECT_EQ(response.weight_version(), 1u);
  EXPECT_EQ(Describe(channel(), "half").staged_tensors(), 0u);
}

TEST_F(ModelsTest, QuantizedCopiesAreMadeOncePerFormat) {
  const TestLayer l = MakeLayer("fc", 16, 64, false, 51);
  ASSERT_TRUE(RegisterAndPublish(channel(), "m", {l}, "fp16-baseline").ok());
  const auto x = TestValues(64, 52);
  v1::LayerForwardResponse r;
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(
        Forward(channel(), "m", "fc", v1::PHASE_ROLLOUT, v1::FORMAT_MXFP6_E2M3, x, 1, 64, &r).ok());
  }
  const std::string metrics = ScrapeMetrics(daemon_.metrics_address());
  EXPECT_EQ(MetricValue(metrics, "mxserve_weight_quantizations_total{format=\"MXFP6_E2M3\"}"), 1)
      << metrics;
  const v1::ModelInfo info = Describe(channel(), "m");
  std::set<int> cached(info.layers(0).cached_formats().begin(),
                       info.layers(0).cached_formats().end());
  EXPECT_EQ(cached, (std::set<int>{v1::FORMAT_MXFP6_E2M3, v1::FORMAT_FP16}));
}

// A republished layer is warmed with what requests used of its previous version:
// both layouts of the formats its forwards and backwards ran in, and not the
// policy's formats of phases it was never called in (D's reward MXFP8 here). A
// version nobody used passes its predecessor's list on.
TEST_F(ModelsTest, ARepublishWarmsWhatRequestsUsed) {
  std::vector<TestLayer> layers;
  for (int block = 0; block < 3; ++block) {
    layers.push_back(
        MakeLayer(absl::StrCat("model.layers.", block, ".mlp.up_proj"), 16, 32, false, 70 + block));
  }
  // D on the built-in ranking: block 1 (middle) is the most tolerant, so the
  // update's 20 % (round(0.6) = 1 layer) runs it in MXFP8; block 0 is next, in
  // the rollout's 80 %: MXFP4 rollout, MXFP8 reward, FP16 update.
  const TestLayer& probe = layers[0];
  ASSERT_TRUE(RegisterAndPublish(channel(), "m", layers, "D").ok());
  auto cached = [&] {
    const v1::ModelInfo info = Describe(channel(), "m");
    return std::set<int>(info.layers(0).cached_formats().begin(),
                         info.layers(0).cached_formats().end());
  };
  auto bytes = [&] { return Describe(channel(), "m").weight_bytes(); };
  auto quantized = [&](const char* format) {
    return std::max(0.0, MetricValue(ScrapeMetrics(daemon_.metrics_address()),
                                     absl::StrCat("mxserve_weight_quantizations_total{format=\"",
                                                  format, "\"}")));
  };
  // Version 1, never used: the policy's rollout and reward formats, not its
  // update format (FP16), whose copies are made per call.
  EXPECT_EQ(cached(), (std::set<int>{v1::FORMAT_MXFP4_E2M1, v1::FORMAT_MXFP8_E4M3}));
  const auto x = TestValues(2 * 32, 74);
  auto rollout = [&] {
    v1::LayerForwardResponse y;
    return Forward(channel(), "m", probe.name, v1::PHASE_ROLLOUT, v1::FORMAT_UNSPECIFIED, x, 2, 32,
                   &y);
  };
  auto update = [&] {
    v1::LayerForwardResponse y;
    return Forward(channel(), "m", probe.name, v1::PHASE_UPDATE, v1::FORMAT_UNSPECIFIED, x, 2, 32,
                   &y);
  };
  auto backward = [&] {
    grpc::ClientContext context;
    v1::LayerBackwardResponse response;
    v1::LayerBackwardRequest request =
        BackwardRequest("m", probe, v1::PHASE_UPDATE, 0, TestValues(2 * 16, 75), x, 2);
    request.clear_format();  // the policy's: FP16
    return v1::Compute::NewStub(daemon_.channel())->LayerBackward(&context, request, &response);
  };
  auto republish = [&](uint64_t version) {
    v1::UploadWeightsResponse uploaded;
    const TestLayer next = MakeLayer(probe.name, 16, 32, false, 75 + static_cast<int>(version));
    ASSERT_TRUE(Upload(channel(), "m", {next}, /*publish=*/true, &uploaded, 1 << 20).ok());
    ASSERT_EQ(uploaded.weight_version(), version);
  };
  // A PPO step: a rollout forward (MXFP4), then one update forward and one
  // backward (FP16, forward and transposed layouts): each update copy is read
  // once, so it is made for its call and freed, and nothing stays held.
  const double fp16 = quantized("FP16"), mxfp4 = quantized("MXFP4_E2M1"),
               mxfp8 = quantized("MXFP8_E4M3");
  for (uint64_t version = 1; version <= 3; ++version) {
    SCOPED_TRACE(absl::StrCat("version ", version));
    if (version > 1) republish(version);
    ASSERT_TRUE(rollout().ok());
    const uint64_t held = bytes();
    ASSERT_TRUE(update().ok());
    ASSERT_TRUE(backward().ok());
    EXPECT_EQ(bytes(), held);
    EXPECT_EQ(quantized("FP16"), fp16 + 2 * version);
    // Versions 2 and 3 warm what version 1 and 2 used: MXFP4 only.
    EXPECT_EQ(cached(), version == 1 ? (std::set<int>{v1::FORMAT_MXFP4_E2M1, v1::FORMAT_MXFP8_E4M3})
                                     : (std::set<int>{v1::FORMAT_MXFP4_E2M1}));
    EXPECT_EQ(quantized("MXFP4_E2M1"), mxfp4 + (version - 1));
    EXPECT_EQ(quantized("MXFP8_E4M3"), mxfp8);
  }
  // A second micro-batch on the same version slices again: nothing is kept.
  const uint64_t held = bytes();
  ASSERT_TRUE(update().ok());
  ASSERT_TRUE(backward().ok());
  EXPECT_EQ(quantized("FP16"), fp16 + 8);
  EXPECT_EQ(cached(), (std::set<int>{v1::FORMAT_MXFP4_E2M1}));
  EXPECT_EQ(bytes(), held);
}

// With --update-copies cache, update copies are cached as rollout copies are:
// made once per version, and warmed by the next one.
TEST(UpdateCopiesTest, CacheKeepsThemAndTheNextVersionWarmsThem) {
  DaemonProcess daemon({"--update-copies", "cache"});
  ASSERT_TRUE(daemon.ok());
  const TestLayer layer = MakeLayer("model.layers.1.mlp.up_proj", 16, 32, false, 80);
  ASSERT_TRUE(RegisterAndPublish(daemon.channel().get(), "m", {layer}, "fp16").ok());
  auto quantized = [&] {
    return std::max(0.0, MetricValue(ScrapeMetrics(daemon.metrics_address()),
                                     "mxserve_weight_quantizations_total{format=\"BF16\"}"));
  };
  auto backward = [&] {
    grpc::ClientContext context;
    v1::LayerBackwardResponse response;
    const auto x = TestValues(2 * 32, 81);
    return v1::Compute::NewStub(daemon.channel())
        ->LayerBackward(&context,
                        BackwardRequest("m", layer, v1::PHASE_UPDATE,
                                        static_cast<int>(mx::Format::kBf16),
                                        TestValues(2 * 16, 82), x, 2),
                        &response);
  };
  ASSERT_TRUE(backward().ok());
  ASSERT_TRUE(backward().ok());
  EXPECT_EQ(quantized(), 1);  // the transposed copy, made once
  v1::UploadWeightsResponse uploaded;
  ASSERT_TRUE(Upload(daemon.channel().get(), "m", {MakeLayer(layer.name, 16, 32, false, 83)},
                     /*publish=*/true, &uploaded, 1 << 20)
                  .ok());
  EXPECT_EQ(quantized(), 2);  // warmed
  ASSERT_TRUE(backward().ok());
  EXPECT_EQ(quantized(), 2);
}

class PoliciesTest : public ModelsTest {};

std::map<std::pair<int, std::string>, int> Table(const v1::ResolvePolicyResponse& r) {
  std::map<std::pair<int, std::string>, int> t;
  for (const auto& e : r.entries()) t[{e.phase(), e.layer()}] = e.format();
  return t;
}

TEST_F(PoliciesTest, PresetsGlobsOverridesAndActivation) {
  const TestLayer q = MakeLayer("model.layers.0.self_attn.q_proj", 8, 32, false, 61);
  const TestLayer mid = MakeLayer("model.layers.5.mlp.up_proj", 8, 32, false, 62);
  const TestLayer last = MakeLayer("model.layers.9.mlp.up_proj", 8, 32, false, 63);
  ASSERT_TRUE(RegisterAndPublish(channel(), "m", {q, mid, last}).ok());
  auto policies = v1::Policies::NewStub(daemon_.channel());

  // D, the default, on the built-in ranking (mid, then last, then q most
  // tolerant): rollout MXFP4 on round(0.8 · 3) = 2 layers, MXFP8 on q; update
  // MXFP8 on round(0.2 · 3) = 1 layer, mid, FP16 on the rest.
  grpc::ClientContext c1;
  v1::ResolvePolicyRequest resolve;
  resolve.set_model("m");
  v1::ResolvePolicyResponse table;
  ASSERT_TRUE(policies->ResolvePolicy(&c1, resolve, &table).ok());
  EXPECT_EQ(table.policy(), "D-phase-adaptive");
  auto t = Table(table);
  EXPECT_EQ(table.entries_size(), 9);
  EXPECT_EQ((t[{v1::PHASE_ROLLOUT, mid.name}]), v1::FORMAT_MXFP4_E2M1);
  EXPECT_EQ((t[{v1::PHASE_ROLLOUT, q.name}]), v1::FORMAT_MXFP8_E4M3);
  EXPECT_EQ((t[{v1::PHASE_ROLLOUT, last.name}]), v1::FORMAT_MXFP4_E2M1);
  EXPECT_EQ((t[{v1::PHASE_REWARD, mid.name}]), v1::FORMAT_MXFP8_E4M3);
  EXPECT_EQ((t[{v1::PHASE_REWARD, q.name}]), v1::FORMAT_FP16);
  EXPECT_EQ((t[{v1::PHASE_UPDATE, mid.name}]), v1::FORMAT_MXFP8_E4M3);
  EXPECT_EQ((t[{v1::PHASE_UPDATE, last.name}]), v1::FORMAT_FP16);
  EXPECT_EQ((t[{v1::PHASE_UPDATE, q.name}]), v1::FORMAT_FP16);

  // A forward without a format runs in the resolved one.
  const auto x = TestValues(32, 64);
  v1::LayerForwardResponse r;
  ASSERT_TRUE(
      Forward(channel(), "m", mid.name, v1::PHASE_ROLLOUT, v1::FORMAT_UNSPECIFIED, x, 1, 32, &r)
          .ok());
  EXPECT_EQ(r.info().format(), v1::FORMAT_MXFP4_E2M1);
  EXPECT_TRUE(SameBits(Floats(r.output()), ReferenceForward(mid, x, 1, mx::Format::kMxfp4E2m1)));
  // An explicit format overrides the policy.
  ASSERT_TRUE(
      Forward(channel(), "m", mid.name, v1::PHASE_ROLLOUT, v1::FORMAT_BF16, x, 1, 32, &r).ok());
  EXPECT_EQ(r.info().format(), v1::FORMAT_BF16);

  // A user policy with a glob rule, first match wins, then activated for the model.
  grpc::ClientContext c2;
  v1::PutPolicyRequest put;
  put.set_json(R"({"name": "mlp-int", "description": "test",
    "defaults": {"rollout": "MXFP8", "reward": "MXFP8", "update": "BF16"},
    "rules": [{"phase": "rollout", "layers": "*.mlp.*", "format": "MXINT8"},
              {"phase": "*", "layers": "*.mlp.*", "format": "MXFP6_E3M2"}]})");
  v1::PolicyInfo stored;
  ASSERT_TRUE(policies->PutPolicy(&c2, put, &stored).ok());
  EXPECT_FALSE(stored.builtin());
  grpc::ClientContext c3;
  v1::SetActivePolicyRequest activate;
  activate.set_model("m");
  activate.set_policy("mlp-int");
  v1::SetActivePolicyResponse activated;
  ASSERT_TRUE(policies->SetActivePolicy(&c3, activate, &activated).ok());
  EXPECT_EQ(activated.previous_policy(), "D-phase-adaptive");
  ASSERT_TRUE(
      Forward(channel(), "m", last.name, v1::PHASE_ROLLOUT, v1::FORMAT_UNSPECIFIED, x, 1, 32, &r)
          .ok());
  EXPECT_EQ(r.info().format(), v1::FORMAT_MXINT8);
  EXPECT_TRUE(SameBits(Floats(r.output()), ReferenceForward(last, x, 1, mx::Format::kMxint8)));
  ASSERT_TRUE(
      Forward(channel(), "m", last.name, v1::PHASE_REWARD, v1::FORMAT_UNSPECIFIED, x, 1, 32, &r)
          .ok());
  EXPECT_EQ(r.info().format(), v1::FORMAT_MXFP6_E3M2);
  ASSERT_TRUE(
      Forward(channel(), "m", q.name, v1::PHASE_UPDATE, v1::FORMAT_UNSPECIFIED, x, 1, 32, &r).ok());
  EXPECT_EQ(r.info().format(), v1::FORMAT_BF16);
  grpc::ClientContext c4;
  v1::ResolvePolicyResponse resolved;
  ASSERT_TRUE(policies->ResolvePolicy(&c4, resolve, &resolved).ok());
  for (const auto& e : resolved.entries()) {
    if (e.layer() == q.name) {
      EXPECT_EQ(e.rule(), -1);
    } else {
      EXPECT_EQ(e.rule(), e.phase() == v1::PHASE_ROLLOUT ? 0 : 1);
    }
  }

  // In use: cannot be deleted; built-ins can never be.
  grpc::ClientContext c5;
  v1::DeletePolicyRequest del;
  del.set_name("mlp-int");
  v1::DeletePolicyResponse deleted;
  grpc::Status s = policies->DeletePolicy(&c5, del, &deleted);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  grpc::ClientContext c6;
  del.set_name("C-aggressive");
  s = policies->DeletePolicy(&c6, del, &deleted);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(s.error_message().find("built-in"), std::string::npos);

  grpc::ClientContext c7;
  v1::ListPoliciesResponse list;
  ASSERT_TRUE(policies->ListPolicies(&c7, {}, &list).ok());
  EXPECT_EQ(list.policies_size(), 7);  // the six built-ins and the user's
}

// The built-ins answer to their short names (fp16, A, B, C, D) wherever a policy
// is named; models hold, and answers give, the full name; no user policy may take
// a short name.
TEST_F(PoliciesTest, BuiltinsAnswerToTheirShortNames) {
  const TestLayer mid = MakeLayer("model.layers.5.mlp.up_proj", 8, 32, false, 65);
  auto policies = v1::Policies::NewStub(daemon_.channel());
  auto models = v1::Models::NewStub(daemon_.channel());
  grpc::ClientContext c1;
  v1::RegisterModelRequest reg;
  reg.set_name("short");
  reg.set_policy("B");
  auto* layer = reg.add_layers();
  layer->set_name(mid.name);
  layer->set_out_features(mid.out);
  layer->set_in_features(mid.in);
  v1::ModelInfo info;
  ASSERT_TRUE(models->RegisterModel(&c1, reg, &info).ok());
  EXPECT_EQ(info.policy(), "B-balanced");

  grpc::ClientContext c2;
  v1::SetActivePolicyRequest activate;
  activate.set_model("short");
  activate.set_policy("fp16");
  v1::SetActivePolicyResponse activated;
  ASSERT_TRUE(policies->SetActivePolicy(&c2, activate, &activated).ok());
  EXPECT_EQ(activated.previous_policy(), "B-balanced");
  EXPECT_EQ(Describe(channel(), "short").policy(), "fp16-baseline");

  grpc::ClientContext c3;
  v1::ResolvePolicyRequest resolve;
  resolve.set_model("short");
  resolve.set_policy("C");
  v1::ResolvePolicyResponse table;
  ASSERT_TRUE(policies->ResolvePolicy(&c3, resolve, &table).ok());
  EXPECT_EQ(table.policy(), "C-aggressive");

  grpc::ClientContext c4;
  v1::GetPolicyRequest get;
  get.set_name("D");
  v1::PolicyInfo got;
  ASSERT_TRUE(policies->GetPolicy(&c4, get, &got).ok());
  EXPECT_EQ(got.name(), "D-phase-adaptive");
  EXPECT_TRUE(got.builtin());

  // Case matters, and a short name is not a user's to take or to delete.
  grpc::ClientContext c5;
  get.set_name("d");
  grpc::Status s = policies->GetPolicy(&c5, get, &got);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
  grpc::ClientContext c6;
  v1::PutPolicyRequest put;
  put.set_json(R"({"name": "A", "defaults": {"rollout": "FP16", "reward": "FP16",
    "update": "FP16"}})");
  v1::PolicyInfo stored;
  s = policies->PutPolicy(&c6, put, &stored);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(s.error_message(),
            "json: policy.name: 'A' is the short name of the built-in 'A-conservative' and "
            "cannot be replaced");
  grpc::ClientContext c7;
  v1::DeletePolicyRequest del;
  del.set_name("A");
  v1::DeletePolicyResponse deleted;
  s = policies->DeletePolicy(&c7, del, &deleted);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(s.error_message().find("built-in"), std::string::npos) << s.error_message();
}

TEST(PolicyDirTest, UserPoliciesSurviveARestart) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/mxserve_policies_", getpid());
  std::filesystem::remove_all(dir);
  const std::string json = R"({"name": "kept", "defaults": {"rollout": "MXFP6_E2M3",
      "reward": "MXFP8", "update": "BF16"}})";
  {
    DaemonProcess daemon({"--policy-dir", dir});
    ASSERT_TRUE(daemon.ok());
    grpc::ClientContext context;
    v1::PutPolicyRequest put;
    put.set_json(json);
    v1::PolicyInfo info;
    ASSERT_TRUE(v1::Policies::NewStub(daemon.channel())->PutPolicy(&context, put, &info).ok());
    EXPECT_EQ(daemon.Stop(), 0);
  }
  EXPECT_TRUE(std::filesystem::exists(dir + "/kept.json"));
  DaemonProcess daemon({"--policy-dir", dir, "--default-policy", "kept"});
  ASSERT_TRUE(daemon.ok()) << daemon.Log();
  auto policies = v1::Policies::NewStub(daemon.channel());
  grpc::ClientContext c1;
  v1::GetPolicyRequest get;
  get.set_name("kept");
  v1::PolicyInfo info;
  ASSERT_TRUE(policies->GetPolicy(&c1, get, &info).ok());
  EXPECT_FALSE(info.builtin());
  EXPECT_NE(info.json().find("MXFP6_E2M3"), std::string::npos) << info.json();
  // The daemon's default policy cannot be deleted under it.
  grpc::ClientContext c2;
  v1::DeletePolicyRequest del;
  del.set_name("kept");
  v1::DeletePolicyResponse deleted;
  grpc::Status s = policies->DeletePolicy(&c2, del, &deleted);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(s.error_message().find("--default-policy"), std::string::npos) << s.error_message();
  EXPECT_TRUE(std::filesystem::exists(dir + "/kept.json"));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace mx_test
