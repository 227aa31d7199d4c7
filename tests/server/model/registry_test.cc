// The registry without a daemon: weight versions, quantize-and-prepare once per
// (layer version, format, layout), and every byte it holds counted in the
// budget. The backend is a fake that counts what it was asked to prepare.
#include "server/model/registry.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "mx/kernels/quantize_fast.h"

namespace mxserve {
namespace {

// A backend's prepared weight as a fake: the quantized matrix itself, counted
// as its element and scale bytes.
class FakeWeight final : public PreparedWeight {
 public:
  explicit FakeWeight(mx::QuantizedMatrix w)
      : PreparedWeight(w.format, w.rows, w.cols), w_(std::move(w)) {}
  uint64_t bytes() const override {
    return w_.elements.size() + w_.block_scales.size() + 4 * w_.row_scales.size();
  }
  const mx::QuantizedMatrix& matrix() const { return w_; }

 private:
  mx::QuantizedMatrix w_;
};

class RegistryTest : public ::testing::Test {
 protected:
  static constexpr int64_t kOut = 8, kIn = 64;
  static constexpr uint64_t kMasterBytes = kOut * kIn * sizeof(float);

  explicit RegistryTest(uint64_t budget_bytes = 1 << 20)
      : budget_(budget_bytes),
        registry_(
            &budget_,
            [this](mx::QuantizedMatrix w) -> absl::StatusOr<std::shared_ptr<const PreparedWeight>> {
              ++prepared_;
              return std::make_shared<const FakeWeight>(std::move(w));
            },
            [this](int n) { evicted_ += n; }) {}

  std::vector<float> Values(uint32_t seed) const {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> v(kOut * kIn);
    for (float& x : v) x = normal(rng);
    return v;
  }

  // Stages (and publishes) layer "fc"'s weight from `seed`.
  absl::StatusOr<uint64_t> Upload(uint32_t seed, bool publish = true) {
    StoredTensor t;
    t.values = Values(seed);
    if (absl::Status s = ReserveInto(budget_, kMasterBytes, "master", t.reservation); !s.ok()) {
      return s;
    }
    std::vector<std::pair<StagedTensorKey, StoredTensor>> tensors;
    tensors.emplace_back(StagedTensorKey{"fc", false}, std::move(t));
    return registry_.Stage("m", std::move(tensors), publish);
  }

  // Stages (and publishes) layer "fc" of `model` from `seed`, as an upload does:
  // the master is reserved making room in `first`'s copies first, and staging
  // checks --quota-weight-bytes `quota`.
  absl::StatusOr<uint64_t> UploadTo(const std::string& model, uint32_t seed, uint64_t quota = 0,
                                    const std::string& first = "") {
    StoredTensor t;
    t.values = Values(seed);
    if (absl::Status s = ReserveInto(budget_, kMasterBytes, "master", t.reservation, first);
        !s.ok()) {
      return s;
    }
    std::vector<std::pair<StagedTensorKey, StoredTensor>> tensors;
    tensors.emplace_back(StagedTensorKey{"fc", false}, std::move(t));
    return registry_.Stage(model, std::move(tensors), /*publish=*/true, quota);
  }

  void SetUp() override {
    ASSERT_TRUE(registry_.Register("m", {{"fc", kOut, kIn, false}}, "D-phase-adaptive").ok());
  }

  MemoryBudget budget_;
  std::atomic<int> prepared_{0};
  std::atomic<int> evicted_{0};
  Registry registry_;
};

TEST_F(RegistryTest, VersionsCountUpAndOldOnesLiveWhileRead) {
  absl::StatusOr<LayerView> none = registry_.Lookup("m", "fc", 0);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(none.status().message(),
            "model: 'm' has no published weights yet (upload, then PublishVersion)");

  ASSERT_EQ(Upload(1).value(), 1u);
  LayerView v1 = registry_.Lookup("m", "fc", 1).value();
  EXPECT_EQ(v1.weights->version(), 1u);
  EXPECT_EQ(v1.weights->weight(), Values(1));

  ASSERT_EQ(Upload(2, /*publish=*/false).value(), 0u);  // staged, not yet visible
  EXPECT_EQ(registry_.Lookup("m", "fc", 0)->weights->version(), 1u);
  EXPECT_EQ(registry_.Describe("m")->staged_tensors, 1u);
  ASSERT_EQ(registry_.Publish("m").value(), 2u);

  LayerView v2 = registry_.Lookup("m", "fc", 2).value();
  EXPECT_EQ(v2.weights->version(), 2u);
  EXPECT_EQ(v2.weights->weight(), Values(2));
  // The reader of version 1 still sees version 1's values, and its bytes are
  // still counted until it lets go.
  EXPECT_EQ(v1.weights->weight(), Values(1));
  EXPECT_EQ(budget_.used(), 2 * kMasterBytes);
  v1 = {};
  EXPECT_EQ(budget_.used(), kMasterBytes);

  absl::StatusOr<LayerView> ahead = registry_.Lookup("m", "fc", 3);
  EXPECT_EQ(ahead.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ahead.status().message(),
            "min_weight_version: model 'm' is at weight version 2, the request requires at "
            "least 3");
  EXPECT_EQ(registry_.Publish("m").status().message(), "model: 'm' has nothing staged to publish");
}

TEST_F(RegistryTest, EachFormatAndLayoutIsQuantizedAndPreparedOnce) {
  ASSERT_TRUE(Upload(1).ok());
  const LayerView view = registry_.Lookup("m", "fc", 0).value();
  auto first = view.weights->Get(mx::Format::kMxfp4E2m1, WeightLayout::kForward, budget_).value();
  auto again = view.weights->Get(mx::Format::kMxfp4E2m1, WeightLayout::kForward, budget_).value();
  EXPECT_TRUE(first.created);
  EXPECT_FALSE(again.created);
  EXPECT_EQ(first.weight.get(), again.weight.get());
  EXPECT_EQ(prepared_.load(), 1);

  // The copy is the weight quantized along in_features, bit for bit; the
  // transposed layout is a second copy, quantized along out_features.
  const auto& fwd = static_cast<const FakeWeight&>(*first.weight).matrix();
  const mx::QuantizedMatrix rows =
      mx::kernels::QuantizeRows(Values(1), kOut, kIn, mx::Format::kMxfp4E2m1).value();
  EXPECT_EQ(fwd.elements, rows.elements);
  EXPECT_EQ(fwd.block_scales, rows.block_scales);
  auto t = view.weights->Get(mx::Format::kMxfp4E2m1, WeightLayout::kTransposed, budget_).value();
  EXPECT_TRUE(t.created);
  EXPECT_EQ(t.weight->rows(), kIn);
  EXPECT_EQ(t.weight->cols(), kOut);
  EXPECT_EQ(prepared_.load(), 2);
  EXPECT_EQ(registry_.Describe("m")->layers[0].cached_formats,
            std::vector<mx::Format>{mx::Format::kMxfp4E2m1});

  // A new version of the layer is quantized and prepared anew.
  ASSERT_TRUE(Upload(2).ok());
  auto v2 = registry_.Lookup("m", "fc", 0)
                ->weights->Get(mx::Format::kMxfp4E2m1, WeightLayout::kForward, budget_)
                .value();
  EXPECT_TRUE(v2.created);
  EXPECT_EQ(prepared_.load(), 3);
}

TEST_F(RegistryTest, AnUpdateCopyIsSlicedForItsCall) {
  ASSERT_TRUE(Upload(1).ok());
  const uint64_t masters = budget_.used();
  const LayerView view = registry_.Lookup("m", "fc", 0).value();
  const auto fmt = mx::Format::kMxfp6E3m2;
  for (WeightLayout layout : {WeightLayout::kForward, WeightLayout::kTransposed}) {
    SCOPED_TRACE(layout == WeightLayout::kForward ? "forward" : "transposed");
    // First update-phase use: nothing made, nothing cached; the caller slices.
    auto once = view.weights->Get(fmt, layout, budget_, CopyUse::kUpdate);
    ASSERT_TRUE(once.ok());
    EXPECT_EQ(once->weight, nullptr);
    EXPECT_EQ(budget_.used(), masters);
    const int64_t rows = layout == WeightLayout::kForward ? kOut : kIn;
    const int64_t cols = layout == WeightLayout::kForward ? kIn : kOut;
    const mx::QuantizedMatrix whole =
        layout == WeightLayout::kForward
            ? mx::kernels::QuantizeRows(Values(1), kOut, kIn, fmt).value()
            : mx::kernels::QuantizeColumns(Values(1), kOut, kIn, fmt).value();
    const int64_t row_bytes = static_cast<int64_t>(whole.elements.size()) / rows;
    const int64_t row_scales = static_cast<int64_t>(whole.block_scales.size()) / rows;
    {
      // A slice is those rows of the whole copy, bit for bit, charged while held.
      auto slice = view.weights->Slice(fmt, layout, 1, rows - 1, budget_);
      ASSERT_TRUE(slice.ok()) << slice.status();
      EXPECT_EQ((*slice)->rows(), rows - 2);
      EXPECT_EQ((*slice)->cols(), cols);
      const auto& part = static_cast<const FakeWeight&>(**slice).matrix();
      EXPECT_EQ(part.elements, std::vector<uint8_t>(whole.elements.begin() + row_bytes,
                                                    whole.elements.end() - row_bytes));
      EXPECT_EQ(part.block_scales, std::vector<uint8_t>(whole.block_scales.begin() + row_scales,
                                                        whole.block_scales.end() - row_scales));
      EXPECT_EQ(budget_.used(), masters + (*slice)->bytes());
      EXPECT_EQ(view.weights->Bytes(), masters);  // not the layer's: the call's
      EXPECT_TRUE(view.weights->CopiesInUse().empty());
    }
    EXPECT_EQ(budget_.used(), masters);  // freed with its last holder
  }
  // Nor does any later update use: each call slices.
  EXPECT_EQ(view.weights->Get(fmt, WeightLayout::kForward, budget_, CopyUse::kUpdate)->weight,
            nullptr);
  EXPECT_EQ(view.weights->Bytes(), masters);
  // An update use of a copy a request cached shares it, and does not mark it
  // used (the next version warms what rollout and reward requests used).
  auto bf16 = view.weights->Get(mx::Format::kBf16, WeightLayout::kForward, budget_,
                                CopyUse::kWarmUp).value();
  auto shared =
      view.weights->Get(mx::Format::kBf16, WeightLayout::kForward, budget_, CopyUse::kUpdate);
  EXPECT_FALSE(shared->created);
  EXPECT_EQ(shared->weight.get(), bf16.weight.get());
  EXPECT_TRUE(view.weights->CopiesInUse().empty());
}

TEST_F(RegistryTest, EveryByteIsInTheBudgetAndDeleteGivesItBack) {
  ASSERT_TRUE(Upload(1).ok());
  const uint64_t masters = budget_.used();
  EXPECT_EQ(masters, kMasterBytes);
  {
    const LayerView view = registry_.Lookup("m", "fc", 0).value();
    auto copy = view.weights->Get(mx::Format::kBf16, WeightLayout::kForward, budget_).value();
    EXPECT_EQ(budget_.used(), masters + copy.weight->bytes());
    EXPECT_EQ(copy.weight->bytes(), kOut * kIn * 2u);  // BF16: two bytes a value
    EXPECT_EQ(registry_.Describe("m")->bytes, budget_.used());
  }
  EXPECT_EQ(registry_.Delete("m").value(), kMasterBytes + kOut * kIn * 2u);
  EXPECT_EQ(budget_.used(), 0u);
  EXPECT_EQ(registry_.Lookup("m", "fc", 0).status().message(), "model: no model named 'm'");
}

// Leases: a leased model goes once no call has found it by name for its lease;
// every call that names it renews it; List does not; unleased models stay; the
// memory comes back to the budget. Time is passed in, so no test sleeps.
TEST_F(RegistryTest, LeasedModelsExpireUnlessNamed) {
  using std::chrono::milliseconds;
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(registry_.Register("leased", {{"fc", kOut, kIn, false}}, "D-phase-adaptive", 2).ok());
  EXPECT_EQ(registry_.Describe("m")->lease_seconds, 0);
  // Times read just before a renewing call bound its renewal from below (the
  // lease cannot end before them + 2 s), times read after it from above; one
  // read after the call once missed by a few ms under ASan.
  const auto naming = std::chrono::steady_clock::now();
  EXPECT_EQ(registry_.Describe("leased")->lease_seconds, 2);  // renews it
  EXPECT_TRUE(registry_.DeleteExpired(naming + milliseconds(1900)).empty());
  registry_.List("", [](const ModelSummary&) { return true; });  // listing is not naming
  EXPECT_TRUE(registry_.DeleteExpired(naming + milliseconds(1999)).empty());

  // A lookup by name (what every compute call does) renews it; failing ones too.
  const auto looking_up = std::chrono::steady_clock::now();
  EXPECT_EQ(registry_.Lookup("leased", "fc", 0).status().code(),
            absl::StatusCode::kFailedPrecondition);
  const auto looked_up = std::chrono::steady_clock::now();
  EXPECT_TRUE(registry_.DeleteExpired(looking_up + milliseconds(1990)).empty());
  const uint64_t before = budget_.used();
  const auto deleted = registry_.DeleteExpired(looked_up + milliseconds(2001));
  ASSERT_EQ(deleted.size(), 1u);
  EXPECT_EQ(deleted[0].first, "leased");
  EXPECT_EQ(deleted[0].second, before - budget_.used());
  EXPECT_EQ(registry_.Describe("leased").status().code(), absl::StatusCode::kNotFound);
  // The unleased model is there however much time passes.
  EXPECT_TRUE(registry_.DeleteExpired(start + std::chrono::hours(24 * 365)).empty());
  EXPECT_TRUE(registry_.Describe("m").ok());
}

TEST_F(RegistryTest, LeaseSecondsOutOfRangeNameTheField) {
  for (double bad : {-1.0, 0.5, 2592001.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
    const absl::Status s = registry_.Register("x", {{"fc", kOut, kIn, false}}, "D", bad);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_TRUE(
        absl::StartsWith(s.message(), "lease_seconds: expected 0 (no lease) or 1 to 2592000, got "))
        << s.message();
  }
  EXPECT_TRUE(registry_.Register("x", {{"fc", kOut, kIn, false}}, "D", 2592000).ok());
}

// 200,000 layers in one RegisterModel took the daemon from 36 MB to 548 MB (a
// black-box test); a model now declares at most kMaxLayersPerModel.
TEST_F(RegistryTest, AModelDeclaresAtMost65536Layers) {
  std::vector<LayerSpec> layers;
  for (int i = 0; i < 65536; ++i) layers.push_back({absl::StrCat("l", i), 1, 1, false});
  EXPECT_TRUE(registry_.Register("most", layers, "D").ok());
  layers.push_back({"one_more", 1, 1, false});
  const absl::Status s = registry_.Register("too_many", layers, "D");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "layers: at most 65536 a model, got 65537");
  EXPECT_EQ(registry_.Describe("too_many").status().code(), absl::StatusCode::kNotFound);
}

class TightRegistryTest : public RegistryTest {
 protected:
  // Two masters (a version and the next one's upload) and half a master more.
  TightRegistryTest() : RegistryTest(2 * kMasterBytes + kMasterBytes / 2) {}
};

TEST_F(TightRegistryTest, CopiesGiveWayLeastRecentlyUsedFirstAndAreMadeAgain) {
  ASSERT_TRUE(Upload(1).ok());
  const LayerView view = registry_.Lookup("m", "fc", 0).value();
  auto get = [&](mx::Format f) { return view.weights->Get(f, WeightLayout::kForward, budget_); };
  // BF16 and FP16 copies take half a master each, an FP32 copy a whole one.
  EXPECT_EQ(get(mx::Format::kBf16)->weight->bytes(), kMasterBytes / 2);
  EXPECT_EQ(get(mx::Format::kFp16)->weight->bytes(), kMasterBytes / 2);
  EXPECT_EQ(evicted_.load(), 0);
  EXPECT_EQ(budget_.used(), 2 * kMasterBytes);
  // The FP32 copy does not fit: the least recently used copy (BF16) goes.
  EXPECT_TRUE(get(mx::Format::kFp32)->created);
  EXPECT_EQ(evicted_.load(), 1);
  EXPECT_EQ(registry_.Describe("m")->layers[0].cached_formats,
            (std::vector<mx::Format>{mx::Format::kFp16, mx::Format::kFp32}));
  // BF16 is made again on its next use, and FP16 goes in its turn.
  auto bf16 = get(mx::Format::kBf16).value();
  EXPECT_TRUE(bf16.created);
  EXPECT_EQ(evicted_.load(), 2);
  EXPECT_EQ(prepared_.load(), 4);
  EXPECT_EQ(budget_.used(), budget_.limit());

  // Copies a request holds cannot free their bytes: with FP32 and BF16 held,
  // the next version's master does not fit, and the refusal says why.
  auto fp32 = get(mx::Format::kFp32).value();
  EXPECT_FALSE(fp32.created);
  absl::StatusOr<uint64_t> next = Upload(2);
  ASSERT_FALSE(next.ok());
  EXPECT_EQ(next.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(next.status().message(),
            absl::StrCat("master needs ", kMasterBytes, " bytes, but the weight memory limit is ",
                         budget_.limit(), " bytes and ", budget_.limit(),
                         " are in use (--weight-memory-bytes; copies in use by running requests "
                         "cannot be evicted)"));
  // Nothing was evicted for it: evicting could not have made room.
  EXPECT_EQ(evicted_.load(), 2);
  // Let go, the copies can be evicted, and the next version fits.
  bf16 = {};
  fp32 = {};
  EXPECT_EQ(Upload(2).value(), 2u);
  EXPECT_EQ(evicted_.load(), 4);
  EXPECT_EQ(budget_.used(), 2 * kMasterBytes);  // `view` still holds version 1's master
}

// Issue 32, item 7: a reservation that cannot fit even with every unheld copy
// evicted is refused without evicting any (it used to flush every other model's
// copies first, then fail).
TEST_F(TightRegistryTest, AReservationThatCannotFitEvictsNothing) {
  ASSERT_TRUE(Upload(1).ok());
  const LayerView view = registry_.Lookup("m", "fc", 0).value();
  auto get = [&](mx::Format f) { return view.weights->Get(f, WeightLayout::kForward, budget_); };
  ASSERT_TRUE(get(mx::Format::kBf16).ok());
  ASSERT_TRUE(get(mx::Format::kFp16).ok());
  ASSERT_EQ(budget_.used(), 2 * kMasterBytes);  // a master and two half-master copies
  // Two masters: within the limit, but the master in use leaves only 1.5 even with
  // both copies gone.
  const absl::Status refused = budget_.Reserve(2 * kMasterBytes, "an upload");
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(evicted_.load(), 0);
  EXPECT_EQ(registry_.Describe("m")->layers[0].cached_formats,
            (std::vector<mx::Format>{mx::Format::kBf16, mx::Format::kFp16}));
  // One that fits once a copy is gone still evicts (the least recently used).
  Reservation fits;
  ASSERT_TRUE(ReserveInto(budget_, kMasterBytes / 2 + 1, "a smaller upload", fits).ok());
  EXPECT_EQ(evicted_.load(), 1);
}

// Issue 32, item 3: --quota-weight-bytes charges the owner for her staged
// tensors and FP32 masters, never for the cached copies that other principals'
// forwards made. The copies are still held and shown (ModelSummary::bytes),
// but the owner's next upload fits her quota whatever formats were asked for.
TEST_F(RegistryTest, TheWeightQuotaChargesMastersNotCachedCopies) {
  ASSERT_TRUE(registry_.Register("q", {{"fc", kOut, kIn, false}}, "D", 0, "alice").ok());
  const uint64_t quota = 2 * kMasterBytes;  // a version and the next one's upload
  ASSERT_EQ(UploadTo("q", 1, quota).value(), 1u);
  {
    // A reader asks for every format in both layouts.
    const LayerView view = registry_.Lookup("q", "fc", 0).value();
    for (int f = 0; f < mx::kFormatCount; ++f) {
      for (WeightLayout layout : {WeightLayout::kForward, WeightLayout::kTransposed}) {
        ASSERT_TRUE(view.weights->Get(static_cast<mx::Format>(f), layout, budget_).ok());
      }
    }
  }
  const ModelSummary held = registry_.Describe("q").value();
  EXPECT_GT(held.bytes, quota);  // the copies are there, more than the quota
  EXPECT_EQ(held.quota_bytes, kMasterBytes);
  EXPECT_EQ(held.layers[0].cached_formats.size(), static_cast<size_t>(mx::kFormatCount));
  // The owner's next version fits: 1 master published + 1 staged = the quota.
  const absl::StatusOr<uint64_t> next = UploadTo("q", 2, quota);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(*next, 2u);
  EXPECT_EQ(registry_.Describe("q")->quota_bytes, kMasterBytes);
  // Past the quota by one byte, it is refused naming what is charged.
  const absl::StatusOr<uint64_t> over = UploadTo("q", 3, quota - 1);
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(over.status().message(),
            absl::StrCat("--quota-weight-bytes: principal 'alice' holds ", kMasterBytes,
                         " bytes of weights (FP32, staged and published; cached copies are not "
                         "charged); staging ",
                         kMasterBytes, " more would make ", 2 * kMasterBytes, ", the limit is ",
                         quota - 1, "; nothing was staged"));
  EXPECT_EQ(registry_.Describe("q")->staged_tensors, 0u);
}

class TenantRegistryTest : public RegistryTest {
 protected:
  // Alice's and bob's masters and two half-master copies: full.
  TenantRegistryTest() : RegistryTest(3 * kMasterBytes) {}
  void SetUp() override {
    ASSERT_TRUE(registry_.Register("a", {{"fc", kOut, kIn, false}}, "D", 0, "alice").ok());
    ASSERT_TRUE(registry_.Register("b", {{"fc", kOut, kIn, false}}, "D", 0, "bob").ok());
    ASSERT_TRUE(UploadTo("a", 1).ok());
    ASSERT_TRUE(UploadTo("b", 2).ok());
    // Bob's copy is the least recently used, alice's the most.
    ASSERT_TRUE(Copy("b").ok());
    ASSERT_TRUE(Copy("a").ok());
    ASSERT_EQ(budget_.used(), budget_.limit());
  }
  absl::Status Copy(const std::string& model) {
    return registry_.Lookup(model, "fc", 0)
        .value()
        .weights->Get(mx::Format::kBf16, WeightLayout::kForward, budget_)
        .status();
  }
  std::vector<mx::Format> Cached(const std::string& model) {
    return registry_.Describe(model)->layers[0].cached_formats;
  }
  const std::vector<mx::Format> kBf16Only = {mx::Format::kBf16};
};

// Room for an owner's upload is made in her own models' copies first, even
// when another tenant's are less recently used; then in everyone's.
TEST_F(TenantRegistryTest, AnOwnersUploadEvictsHerOwnCopiesFirst) {
  Reservation half;
  ASSERT_TRUE(ReserveInto(budget_, kMasterBytes / 2, "alice's upload", half, "alice").ok());
  EXPECT_EQ(evicted_.load(), 1);
  EXPECT_TRUE(Cached("a").empty());
  EXPECT_EQ(Cached("b"), kBf16Only);
  // Hers are gone: the next room comes from bob's.
  Reservation more;
  ASSERT_TRUE(ReserveInto(budget_, kMasterBytes / 2, "alice's upload", more, "alice").ok());
  EXPECT_EQ(evicted_.load(), 2);
  EXPECT_TRUE(Cached("b").empty());
}

TEST_F(TenantRegistryTest, WithoutAPrincipalTheLeastRecentlyUsedGoes) {
  Reservation half;
  ASSERT_TRUE(ReserveInto(budget_, kMasterBytes / 2, "an upload", half).ok());
  EXPECT_EQ(evicted_.load(), 1);
  EXPECT_TRUE(Cached("b").empty());
  EXPECT_EQ(Cached("a"), kBf16Only);
}

TEST_F(TenantRegistryTest, AnOwnerThatNeedsMoreThanHerCopiesTakesOthersToo) {
  // A whole master: alice's half-master copy, then bob's.
  ASSERT_TRUE(UploadTo("a", 3, 0, "alice").ok());
  EXPECT_EQ(evicted_.load(), 2);
  EXPECT_TRUE(Cached("a").empty());
  EXPECT_TRUE(Cached("b").empty());
}

// Deleting an owned policy: a model of its owner that uses it keeps it (and
// nothing changes); other principals' models that activated it go back to the
// fallback. A policy without an owner stays while any model uses it.
TEST_F(RegistryTest, ReleasingAPolicyResetsOnlyOtherPrincipalsModels) {
  ASSERT_TRUE(registry_.Register("a", {{"fc", kOut, kIn, false}}, "shared", 0, "alice").ok());
  ASSERT_TRUE(registry_.Register("b1", {{"fc", kOut, kIn, false}}, "shared", 0, "bob").ok());
  ASSERT_TRUE(registry_.Register("b2", {{"fc", kOut, kIn, false}}, "other", 0, "bob").ok());
  std::vector<std::string> reset;
  EXPECT_FALSE(registry_.ReleasePolicy("shared", "alice", "D", reset));
  EXPECT_TRUE(reset.empty());
  EXPECT_EQ(registry_.Describe("b1")->policy, "shared");
  EXPECT_FALSE(registry_.ReleasePolicy("shared", "", "D", reset));  // no owner: any model pins
  ASSERT_TRUE(registry_.Delete("a").ok());
  EXPECT_TRUE(registry_.ReleasePolicy("shared", "alice", "D", reset));
  EXPECT_EQ(reset, (std::vector<std::string>{"b1"}));
  EXPECT_EQ(registry_.Describe("b1")->policy, "D");
  EXPECT_EQ(registry_.Describe("b2")->policy, "other");
  EXPECT_FALSE(registry_.PolicyInUse("shared"));
}

// ---------------------------------------------------------------------------
// The optimizer on the daemon (issue 37): gradients accumulated by rows, one
// AdamW step from the published masters into the next version.

TEST_F(RegistryTest, AccumulatedGradientsStepIntoTheNextVersionAsAdamWWould) {
  ASSERT_EQ(Upload(1).value(), 1u);
  LayerView view = registry_.Lookup("m", "fc", 1).value();
  ASSERT_NE(view.optimizer, nullptr);
  EXPECT_FALSE(view.optimizer->HasGradient());
  // Rows 0-3 in two calls (the second adds), rows 4-7 once; as two weight_rows
  // slices of one backward and a second micro-batch would.
  const std::vector<float> g1 = Values(11), g2 = Values(12);
  const std::span<const float> top(g1.data(), 4 * kIn), bottom(g1.data() + 4 * kIn, 4 * kIn);
  ASSERT_TRUE(view.optimizer->Accumulate(0, top, {}).ok());
  ASSERT_TRUE(view.optimizer->Accumulate(4, bottom, {}).ok());
  ASSERT_TRUE(view.optimizer->Accumulate(0, std::span<const float>(g2.data(), 4 * kIn), {}).ok());
  EXPECT_TRUE(view.optimizer->HasGradient());
  std::vector<float> grad = g1;
  for (int i = 0; i < 4 * kIn; ++i) grad[i] = g1[i] + g2[i];
  double exact = 0;
  for (float g : grad) exact += double{g} * g;
  const double squared = view.optimizer->GradSquaredNorm();
  EXPECT_NEAR(squared, exact, 1e-13 * exact);
  // The accumulator: 4 bytes per parameter and one per row.
  EXPECT_EQ(view.optimizer->Bytes(), kMasterBytes + kOut);
  EXPECT_EQ(budget_.used(), 2 * kMasterBytes + kOut);

  const OptimizerStep step{.adamw = {.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.99, .eps = 1e-8,
                                     .weight_decay = 0.1},
                           .max_grad_norm = 1.0,
                           .other_grad_sq_norm = 3.0};
  absl::StatusOr<OptimizerStepResult> result = registry_.StepOptimizer("m", step);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->version, 2u);
  ASSERT_EQ(result->grad_sq_norms.size(), 1u);
  EXPECT_EQ(result->grad_sq_norms[0].first, "fc");
  EXPECT_EQ(result->grad_sq_norms[0].second, squared);
  EXPECT_EQ(result->total_grad_norm, std::sqrt(squared + 3.0));
  EXPECT_EQ(result->clip_coefficient, ClipCoefficient(squared + 3.0, 1.0));
  EXPECT_LT(result->clip_coefficient, 1.0f);
  // The new master is AdamW's step of the old one; the old version is intact.
  std::vector<float> expected = Values(1), m(kOut * kIn, 0.0f), v(kOut * kIn, 0.0f);
  AdamWStep(expected, grad, result->clip_coefficient, m, v, 1, step.adamw);
  LayerView stepped = registry_.Lookup("m", "fc", 2).value();
  EXPECT_EQ(stepped.weights->version(), 2u);
  EXPECT_EQ(stepped.weights->weight(), expected);
  EXPECT_EQ(view.weights->weight(), Values(1));
  EXPECT_FALSE(stepped.optimizer->HasGradient());  // emptied
  // Moments: 8 bytes per parameter more, for as long as the model lives.
  EXPECT_EQ(stepped.optimizer->Bytes(), 3 * kMasterBytes + kOut);
  EXPECT_EQ(registry_.Describe("m")->quota_bytes, kMasterBytes + 3 * kMasterBytes + kOut);

  // Nothing accumulated since: nothing to step, no new version (torch skips a
  // parameter without a gradient); the coefficient is the trainer's side's.
  absl::StatusOr<OptimizerStepResult> again = registry_.StepOptimizer("m", step);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->version, 2u);
  EXPECT_TRUE(again->grad_sq_norms.empty());
  EXPECT_EQ(again->clip_coefficient, ClipCoefficient(3.0, 1.0));
  EXPECT_EQ(registry_.Describe("m")->version, 2u);
  // A second step advances the moments from where the first left them.
  ASSERT_TRUE(stepped.optimizer->Accumulate(0, g2, {}).ok());
  const double squared2 = stepped.optimizer->GradSquaredNorm();
  EXPECT_NEAR(squared2, SquaredNorm(g2), 1e-13 * squared2);
  ASSERT_EQ(registry_.StepOptimizer("m", step)->version, 3u);
  AdamWStep(expected, g2, ClipCoefficient(squared2 + 3.0, 1.0), m, v, 2, step.adamw);
  EXPECT_EQ(registry_.Lookup("m", "fc", 3)->weights->weight(), expected);

  view = {};
  stepped = {};
  const uint64_t held = budget_.used();
  EXPECT_EQ(registry_.Delete("m").value(), held);
  EXPECT_EQ(budget_.used(), 0u);
}

TEST_F(RegistryTest, StepOptimizerRefusesBadRequestsAndChangesNothing) {
  OptimizerStep step;
  EXPECT_EQ(registry_.StepOptimizer("m", step).status().message(),
            "model: 'm' has no published weights yet (upload, then publish)");
  EXPECT_EQ(registry_.StepOptimizer("nope", step).status().code(), absl::StatusCode::kNotFound);
  step.adamw.beta2 = 1.0;
  EXPECT_EQ(registry_.StepOptimizer("m", step).status().message(),
            "adamw.beta2: expected 0 <= beta2 < 1, got 1");
  step = {};
  step.max_grad_norm = std::numeric_limits<double>::infinity();
  EXPECT_EQ(registry_.StepOptimizer("m", step).status().message(),
            "max_grad_norm: expected a finite number (<= 0: no clipping), got inf");
  step = {};
  step.other_grad_sq_norm = std::nan("");
  EXPECT_EQ(registry_.StepOptimizer("m", step).status().message(),
            "other_grad_sq_norm: expected a finite number >= 0, got nan");
}

TEST_F(RegistryTest, DiscardedGradientsAreForgottenAndQuotaCountsTheOptimizerState) {
  ASSERT_EQ(Upload(1).value(), 1u);
  LayerView view = registry_.Lookup("m", "fc", 1).value();
  ASSERT_TRUE(view.optimizer->Accumulate(0, Values(11), {}).ok());
  OptimizerStep discard{.adamw = {.lr = 1e-2}, .discard = true};
  absl::StatusOr<OptimizerStepResult> dropped = registry_.StepOptimizer("m", discard);
  ASSERT_TRUE(dropped.ok()) << dropped.status();
  EXPECT_FALSE(dropped->published);
  EXPECT_EQ(dropped->grad_sq_norms.size(), 1u);  // what was dropped
  EXPECT_EQ(dropped->version, 1u);
  EXPECT_FALSE(view.optimizer->HasGradient());
  EXPECT_EQ(registry_.Describe("m")->version, 1u);
  // The next gradient is the only one the step sees.
  ASSERT_TRUE(view.optimizer->Accumulate(0, Values(12), {}).ok());
  // --quota-weight-bytes: master + accumulator held; the moments (8 B per
  // parameter) would pass a quota just short of them, and nothing changes.
  const uint64_t held = registry_.Describe("m")->quota_bytes;
  EXPECT_EQ(held, 2 * kMasterBytes + kOut);
  const OptimizerStep tight{.adamw = {.lr = 1e-2}, .quota_bytes = held + 2 * kMasterBytes - 1};
  absl::StatusOr<OptimizerStepResult> refused = registry_.StepOptimizer("m", tight);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "adamw: --quota-weight-bytes"))
      << refused.status();
  EXPECT_TRUE(view.optimizer->HasGradient());
  EXPECT_FALSE(view.optimizer->HasMoments());
  const OptimizerStep fits{.adamw = {.lr = 1e-2}, .quota_bytes = held + 2 * kMasterBytes};
  ASSERT_EQ(registry_.StepOptimizer("m", fits)->version, 2u);
  EXPECT_EQ(registry_.CheckOwnerQuota("m", 1, held + 2 * kMasterBytes, "x").code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(registry_.CheckOwnerQuota("m", 0, held + 2 * kMasterBytes, "x").ok());
  EXPECT_TRUE(registry_.CheckOwnerQuota("m", 1 << 30, 0, "x").ok());  // no quota
}

// Gradients arriving while steps run (the writer lock, shared by Accumulate):
// each lands in exactly one step, and a step never sees one arrive between its
// norms and its update. Run under TSAN too (make test-tsan).
TEST_F(RegistryTest, GradientsArrivingDuringStepsCountOnceEach) {
  ASSERT_EQ(Upload(1).value(), 1u);
  std::shared_ptr<LayerOptimizer> optimizer = registry_.Lookup("m", "fc", 1)->optimizer;
  // Each gradient is all ones: a step's ‖g‖² says how many it summed (exactly).
  const std::vector<float> ones(kOut * kIn, 1.0f);
  constexpr int kGradients = 5000;
  std::atomic<bool> done{false};
  std::thread adder([&] {
    for (int i = 0; i < kGradients; ++i) ASSERT_TRUE(optimizer->Accumulate(0, ones, {}).ok());
    done = true;
  });
  double summed = 0;
  const OptimizerStep step{.adamw = {.lr = 1e-3}};
  auto take = [&] {
    absl::StatusOr<OptimizerStepResult> result = registry_.StepOptimizer("m", step);
    ASSERT_TRUE(result.ok()) << result.status();
    for (const auto& [layer, sq_norm] : result->grad_sq_norms) {
      // ‖n·1‖² = n²·N·K: a whole number of gradients, never a part of one.
      const double n = std::sqrt(sq_norm / (kOut * kIn));
      EXPECT_EQ(n, std::round(n));
      summed += n;
    }
  };
  while (!done) take();
  adder.join();
  take();
  EXPECT_EQ(summed, kGradients);
}

// A budget with room for the master, its accumulator and a stepped copy of the
// master, but not for the moments: the step fails whole, and a later one with
// room steps from the same gradient.
class TightOptimizerTest : public RegistryTest {
 protected:
  TightOptimizerTest() : RegistryTest(3 * kMasterBytes + kOut) {}
};

TEST_F(TightOptimizerTest, AStepThatDoesNotFitChangesNothing) {
  ASSERT_EQ(Upload(1).value(), 1u);
  LayerView view = registry_.Lookup("m", "fc", 1).value();
  ASSERT_TRUE(view.optimizer->Accumulate(0, Values(11), {}).ok());
  const OptimizerStep step{.adamw = {.lr = 1e-2}};
  absl::StatusOr<OptimizerStepResult> result = registry_.StepOptimizer("m", step);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(result.status().message(), "AdamW's moments of layer 'fc'"))
      << result.status();
  EXPECT_EQ(registry_.Describe("m")->version, 1u);
  EXPECT_TRUE(view.optimizer->HasGradient());
  EXPECT_EQ(view.optimizer->steps(), 0);
  EXPECT_EQ(budget_.used(), 2 * kMasterBytes + kOut);
}

}  // namespace
}  // namespace mxserve
