// The compute path in process, without gRPC: requests prepared by
// PrepareForward/PrepareBackward/PrepareGemm and run by a real Scheduler on a
// recording backend (the CPU emulation underneath, so every answer is checked
// bit for bit against mx/'s reference). What a spawned daemon cannot show: how
// many GEMMs a batch became, which rows of which weight copy each one read.
#include <gtest/gtest.h>

#include <cstring>
#include <future>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "mx/kernels/quantize_fast.h"
#include "mx/reference_gemm.h"
#include "mx/status_macros.h"
#include "server/compute/compute_work.h"
#include "server/compute/context.h"
#include "server/compute/wire.h"
#include "server/model/memory_budget.h"
#include "tests/same_bits.h"

namespace mxserve {
namespace {

// One GEMM as the backend saw it: X's rows, W's rows and columns, and whether
// W was a prepared (layer) weight.
struct Call {
  int64_t x_rows, w_rows, w_cols;
  bool prepared;
  bool operator==(const Call&) const = default;
};

// The CPU backend with every Linear written down; `fail` makes the next GEMMs
// fail with it instead.
class RecordingBackend final : public Backend {
 public:
  explicit RecordingBackend(std::unique_ptr<Backend> inner) : inner_(std::move(inner)) {}
  absl::string_view name() const override { return inner_->name(); }
  bool computes() const override { return inner_->computes(); }
  bool BooksModelEnergy() const override { return inner_->BooksModelEnergy(); }
  absl::StatusOr<std::shared_ptr<const PreparedWeight>> PrepareWeight(
      mx::QuantizedMatrix w) override {
    return inner_->PrepareWeight(std::move(w));
  }
  absl::StatusOr<std::string> Linear(const mx::QuantizedMatrix& x, const PreparedWeight& w,
                                     std::span<const float> bias, std::span<float> y) override {
    if (absl::Status s = Record({x.rows, w.rows(), w.cols(), true}); !s.ok()) return s;
    return inner_->Linear(x, w, bias, y);
  }
  absl::StatusOr<std::string> Linear(const mx::QuantizedMatrix& x, const mx::QuantizedMatrix& w,
                                     std::span<const float> bias, std::span<float> y) override {
    if (absl::Status s = Record({x.rows, w.rows, w.cols, false}); !s.ok()) return s;
    return inner_->Linear(x, w, bias, y);
  }

  std::vector<Call> calls() {
    std::lock_guard lock(mu_);
    return calls_;
  }
  void Fail(absl::Status status) {
    std::lock_guard lock(mu_);
    fail_ = std::move(status);
  }

 private:
  absl::Status Record(Call call) {
    std::lock_guard lock(mu_);
    calls_.push_back(call);
    return fail_;
  }
  std::unique_ptr<Backend> inner_;
  std::mutex mu_;
  std::vector<Call> calls_;
  absl::Status fail_;
};

std::vector<float> Random(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = normal(rng);
  return v;
}

v1::Tensor Tensor(const std::vector<float>& values, int64_t rows, int64_t cols) {
  v1::Tensor t;
  t.add_shape(rows);
  t.add_shape(cols);
  t.set_dtype(v1::DTYPE_FP32);
  t.set_data(values.data(), values.size() * sizeof(float));
  return t;
}

std::vector<float> Floats(const v1::Tensor& t) {
  std::vector<float> v(t.data().size() / sizeof(float));
  std::memcpy(v.data(), t.data().data(), t.data().size());
  return v;
}

// Every bit the same (tests/same_bits.h), with the first difference.
::testing::AssertionResult SameBits(const std::vector<float>& got,
                                    const std::vector<float>& want) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure() << got.size() << " values, expected " << want.size();
  }
  if (const std::optional<size_t> i = mx_test::FirstDifference(got, want)) {
    return ::testing::AssertionFailure() << "value " << *i << ": " << got[*i] << " vs " << want[*i];
  }
  return ::testing::AssertionSuccess();
}

constexpr mx::Format kFormat = mx::Format::kMxfp8E4m3;

// The daemon's parts a work item reads, made as Daemon makes them, around one
// layer "fc" (N × K, with bias) of model "m".
class ComputeWorkTest : public ::testing::Test {
 protected:
  static constexpr int64_t kN = 200, kK = 96;

  explicit ComputeWorkTest(std::unique_ptr<Backend> backend = MakeCpuBackend({}))
      : backend_(std::move(backend)),
        budget_(int64_t{1} << 30),
        metrics_("test"),
        registry_(
            &budget_, [this](mx::QuantizedMatrix w) { return backend_.PrepareWeight(std::move(w)); },
            [](int) {}),
        scheduler_({.workers = 1, .batch_window = std::chrono::seconds(60), .max_batch = 3}) {
    policies_ = PolicyStore::Create("").value();
    core_.registry = &registry_;
    core_.policies = policies_.get();
    core_.scheduler = &scheduler_;
    core_.backend = &backend_;
    core_.metrics = &metrics_;
    core_.ledger = &ledger_;
    core_.max_message_bytes = 64 << 20;
    core_.energy_model =
        fpga_model::LoadEnergyModel(MXSERVE_SOURCE_DIR "/fpga/model/energy_model.json").value();
  }

  void SetUp() override {
    ASSERT_TRUE(registry_.Register("m", {{"fc", kN, kK, true}}, "fp16-baseline").ok());
    std::vector<std::pair<StagedTensorKey, StoredTensor>> tensors;
    for (const bool bias : {false, true}) {
      StoredTensor t;
      t.values = bias ? bias_ : weight_;
      ASSERT_TRUE(ReserveInto(budget_, t.values.size() * 4, "test", t.reservation).ok());
      tensors.emplace_back(StagedTensorKey{"fc", bias}, std::move(t));
    }
    ASSERT_TRUE(registry_.Stage("m", std::move(tensors), /*publish=*/true).ok());
  }

  // A request on its way: prepared, submitted, answered through `status`. The
  // request lives as long as its work item reads it (operands point into it).
  template <typename Request, typename Response>
  struct Pending {
    Request request;
    Response response;
    std::promise<absl::Status> done;
    std::future<absl::Status> status = done.get_future();
    CallInfo call{.cancelled = std::make_shared<std::atomic<bool>>(false)};
  };

  void Submit(absl::StatusOr<std::unique_ptr<WorkItem>> item) {
    ASSERT_TRUE(item.ok()) << item.status();
    ASSERT_TRUE(scheduler_.Submit(*std::move(item)).ok());
  }

  // A request for layer "fc" of "m" in `phase` and kFormat.
  template <typename Request>
  static Request OnTheLayer(v1::Phase phase) {
    Request r;
    r.set_model("m");
    r.set_layer("fc");
    r.set_phase(phase);
    r.set_format(ToProto(kFormat));
    return r;
  }

  v1::LayerForwardRequest Forward(const std::vector<float>& x, int64_t m, v1::Phase phase) {
    auto r = OnTheLayer<v1::LayerForwardRequest>(phase);
    *r.mutable_input()->mutable_tensor() = Tensor(x, m, kK);
    return r;
  }
  using PendingForward = Pending<v1::LayerForwardRequest, v1::LayerForwardResponse>;
  void SubmitForward(v1::LayerForwardRequest r, PendingForward& p) {
    p.request = std::move(r);
    Submit(PrepareForward(core_, p.request, &p.response, p.call,
                          [&p](absl::Status s) { p.done.set_value(std::move(s)); }));
  }

  v1::LayerBackwardRequest Backward(const std::vector<float>& dy, const std::vector<float>& x,
                                    int64_t m, v1::Phase phase) {
    auto r = OnTheLayer<v1::LayerBackwardRequest>(phase);
    *r.mutable_grad_output() = Tensor(dy, m, static_cast<int64_t>(dy.size()) / m);
    *r.mutable_input() = Tensor(x, m, kK);
    return r;
  }
  absl::StatusOr<v1::LayerBackwardResponse> RunBackward(const v1::LayerBackwardRequest& r) {
    Pending<v1::LayerBackwardRequest, v1::LayerBackwardResponse> p;
    p.request = r;
    Submit(PrepareBackward(core_, p.request, &p.response, p.call,
                           [&p](absl::Status s) { p.done.set_value(std::move(s)); }));
    // Alone in its batch: backward items are never batched, so no window.
    MX_RETURN_IF_ERROR(p.status.get());
    return p.response;
  }

  // Y = X·Wᵀ + b in kFormat, as mx/'s reference computes it: X's scales by
  // `rule`, W's by the floor rule.
  std::vector<float> Reference(const std::vector<float>& x, int64_t m,
                               mx::ScaleRule rule = mx::ScaleRule::kFloor) const {
    const auto qx = mx::kernels::QuantizeRows(x, m, kK, kFormat, {.scale_rule = rule}).value();
    const auto qw = mx::kernels::QuantizeRows(weight_, kN, kK, kFormat).value();
    return mx::ReferenceLinear(qx, qw, bias_).value();
  }

  std::vector<float> weight_ = Random(kN * kK, 1);
  std::vector<float> bias_ = Random(kN, 2);
  RecordingBackend backend_;
  MemoryBudget budget_;
  Metrics metrics_;
  Registry registry_;
  EnergyLedger ledger_;
  std::unique_ptr<PolicyStore> policies_;
  Scheduler scheduler_;
  ComputeContext core_;
};

TEST_F(ComputeWorkTest, ABatchOfThreeIsOneGemmAndEachMemberGetsItsOwnRows) {
  const int64_t rows[] = {2, 5, 1};
  PendingForward pending[3];
  std::vector<float> inputs[3];
  for (int i = 0; i < 3; ++i) {
    inputs[i] = Random(rows[i] * kK, 10 + i);
    SubmitForward(Forward(inputs[i], rows[i], v1::PHASE_ROLLOUT), pending[i]);
  }
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(pending[i].status.get().ok());
    const v1::LayerForwardResponse& r = pending[i].response;
    EXPECT_EQ(r.output().shape(0), rows[i]);
    EXPECT_EQ(r.output().shape(1), kN);
    EXPECT_TRUE(SameBits(Floats(r.output()), Reference(inputs[i], rows[i]))) << "member " << i;
    EXPECT_EQ(r.info().batch_size(), 3u);
    EXPECT_EQ(r.info().backend(), "cpu");
  }
  // One GEMM of the stacked rows on the cached forward copy.
  EXPECT_EQ(backend_.calls(), (std::vector<Call>{{8, kN, kK, true}}));
}

TEST_F(ComputeWorkTest, ACancelledMemberIsDroppedAndTheOthersShareTheGemm) {
  PendingForward pending[3];
  std::vector<float> inputs[3];
  for (int i = 0; i < 3; ++i) {
    inputs[i] = Random(3 * kK, 20 + i);
    if (i == 2) pending[1].call.cancelled->store(true);  // before the batch is full
    SubmitForward(Forward(inputs[i], 3, v1::PHASE_ROLLOUT), pending[i]);
  }
  const absl::Status cancelled = pending[1].status.get();
  EXPECT_EQ(cancelled.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(cancelled.message(), "the client cancelled the request before it ran");
  EXPECT_FALSE(pending[1].response.has_output());
  for (const int i : {0, 2}) {
    ASSERT_TRUE(pending[i].status.get().ok());
    EXPECT_TRUE(SameBits(Floats(pending[i].response.output()), Reference(inputs[i], 3)));
    EXPECT_EQ(pending[i].response.info().batch_size(), 2u);
  }
  EXPECT_EQ(backend_.calls(), (std::vector<Call>{{6, kN, kK, true}}));
}

TEST_F(ComputeWorkTest, ABackendErrorAnswersEveryMemberWithIt) {
  backend_.Fail(absl::InternalError("backend: the card went away"));
  PendingForward pending[3];
  for (auto& p : pending) SubmitForward(Forward(Random(kK, 30), 1, v1::PHASE_ROLLOUT), p);
  for (auto& p : pending) {
    const absl::Status s = p.status.get();
    EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
    EXPECT_EQ(s.message(), "backend: the card went away");
  }
  EXPECT_EQ(backend_.calls().size(), 1u);
}

// An update-phase call makes its copy in slices of whole 64-row panels: with a
// slice of one panel, N = 200 rows are 64 + 64 + 64 + 8, and K = 96 transposed
// rows are 64 + 32. The bits are those of the cached copy's one GEMM.
TEST_F(ComputeWorkTest, AnUpdateCallIsSlicedIntoPanelsBitForBit) {
  core_.update_slice_elements = 64 * kK;  // one panel per slice, in either layout
  const int64_t m = 3;
  const std::vector<float> x = Random(m * kK, 40), dy = Random(m * kN, 41);
  // Alone (a full batch is not needed: three requests in a row close theirs).
  auto forward = [&](v1::Phase phase) {
    PendingForward p[3];
    for (auto& each : p) SubmitForward(Forward(x, m, phase), each);
    for (auto& each : p) EXPECT_TRUE(each.status.get().ok());
    return Floats(p[0].response.output());
  };
  const std::vector<float> sliced = forward(v1::PHASE_UPDATE);
  EXPECT_EQ(backend_.calls(), (std::vector<Call>{{9, 64, kK, true},
                                                 {9, 64, kK, true},
                                                 {9, 64, kK, true},
                                                 {9, 8, kK, true}}));
  EXPECT_TRUE(SameBits(sliced, Reference(x, m)));
  EXPECT_TRUE(SameBits(forward(v1::PHASE_ROLLOUT), sliced));  // the cached copy, whole
  EXPECT_EQ(backend_.calls().size(), 5u);

  const size_t before = backend_.calls().size();
  const auto update = RunBackward(Backward(dy, x, m, v1::PHASE_UPDATE));
  ASSERT_TRUE(update.ok()) << update.status();
  const std::vector<Call> calls = backend_.calls();
  // grad_input on the transposed copy in two slices, then grad_weight (dYᵀ · X).
  EXPECT_EQ(std::vector<Call>(calls.begin() + before, calls.end()),
            (std::vector<Call>{{m, 64, kN, true}, {m, 32, kN, true}, {kN, kK, m, false}}));
  const auto rollout = RunBackward(Backward(dy, x, m, v1::PHASE_ROLLOUT));
  ASSERT_TRUE(rollout.ok()) << rollout.status();
  EXPECT_TRUE(SameBits(Floats(update->grad_input()), Floats(rollout->grad_input())));
  EXPECT_TRUE(SameBits(Floats(update->grad_weight()), Floats(rollout->grad_weight())));
  EXPECT_EQ(backend_.calls().back(), (Call{kN, kK, m, false}));
  EXPECT_EQ(backend_.calls().end()[-2], (Call{m, kK, kN, true}));  // whole, cached
}

// A weight_rows request is grad_weight and grad_bias for those rows of W alone,
// each row the same as in the whole layer's answer, and no grad_input.
TEST_F(ComputeWorkTest, WeightRowsAnswerThoseRowsOfTheWholeLayersGradients) {
  const int64_t m = 4, begin = 64, end = 130, width = end - begin;
  const std::vector<float> x = Random(m * kK, 50), dy = Random(m * kN, 51);
  const auto whole = RunBackward(Backward(dy, x, m, v1::PHASE_UPDATE));
  ASSERT_TRUE(whole.ok()) << whole.status();
  std::vector<float> dy_rows(static_cast<size_t>(m * width));
  for (int64_t r = 0; r < m; ++r) {
    std::copy_n(dy.data() + r * kN + begin, width, dy_rows.data() + r * width);
  }
  v1::LayerBackwardRequest ranged = Backward(dy_rows, x, m, v1::PHASE_UPDATE);
  ranged.mutable_weight_rows()->set_begin(begin);
  ranged.mutable_weight_rows()->set_end(end);
  const size_t before = backend_.calls().size();
  const auto part = RunBackward(ranged);
  ASSERT_TRUE(part.ok()) << part.status();
  EXPECT_FALSE(part->has_grad_input());
  const std::vector<Call> calls = backend_.calls();
  EXPECT_EQ(std::vector<Call>(calls.begin() + before, calls.end()),
            (std::vector<Call>{{width, kK, m, false}}));
  const std::vector<float> all_weight = Floats(whole->grad_weight());
  const std::vector<float> all_bias = Floats(whole->grad_bias());
  EXPECT_TRUE(SameBits(Floats(part->grad_weight()),
                       std::vector<float>(all_weight.begin() + begin * kK,
                                          all_weight.begin() + end * kK)));
  EXPECT_TRUE(SameBits(Floats(part->grad_bias()),
                       std::vector<float>(all_bias.begin() + begin, all_bias.begin() + end)));
}

// A request's scale rule is for the operands it brings; members of one batch
// with different rules still share the GEMM (each one's rows are quantized on
// their own), and the weight copy keeps the floor rule.
TEST_F(ComputeWorkTest, EachMemberIsQuantizedWithItsOwnScaleRule) {
  const mx::ScaleRule rules[] = {mx::ScaleRule::kCeil, mx::ScaleRule::kFloor,
                                 mx::ScaleRule::kRceil};
  PendingForward pending[3];
  std::vector<float> inputs[3];
  for (int i = 0; i < 3; ++i) {
    inputs[i] = Random(4 * kK, 90 + i);
    // A block maximum the floor rule saturates (15.92 · 2^-(3-8) = 509 > 448):
    // an FP element's rounding does not change with a power-of-two scale
    // otherwise, so this is where the rules part.
    inputs[i][0] = 15.92f;
    v1::LayerForwardRequest r = Forward(inputs[i], 4, v1::PHASE_ROLLOUT);
    r.set_scale_rule(ToProto(rules[i]));
    SubmitForward(std::move(r), pending[i]);
  }
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(pending[i].status.get().ok());
    EXPECT_TRUE(SameBits(Floats(pending[i].response.output()), Reference(inputs[i], 4, rules[i])))
        << mx::ScaleRuleName(rules[i]);
  }
  EXPECT_EQ(backend_.calls(), (std::vector<Call>{{12, kN, kK, true}}));
  // Not the floor answer: the rule made a difference for these inputs.
  EXPECT_FALSE(SameBits(Reference(inputs[0], 4, rules[0]), Reference(inputs[0], 4)));
  EXPECT_FALSE(SameBits(Reference(inputs[2], 4, rules[2]), Reference(inputs[2], 4)));

  // Backward: dY and X by the rule, the transposed weight copy by floor.
  const int64_t m = 3;
  std::vector<float> x = Random(m * kK, 95), dy = Random(m * kN, 96);
  x[0] = dy[0] = 15.92f;  // saturated by the floor rule, as above
  v1::LayerBackwardRequest r = Backward(dy, x, m, v1::PHASE_UPDATE);
  r.set_scale_rule(v1::SCALE_RULE_RCEIL);
  const auto floor = RunBackward(Backward(dy, x, m, v1::PHASE_UPDATE));
  ASSERT_TRUE(floor.ok()) << floor.status();
  const auto g = RunBackward(r);
  ASSERT_TRUE(g.ok()) << g.status();
  const mx::QuantizeOptions rceil{.scale_rule = mx::ScaleRule::kRceil};
  const auto qdy = mx::kernels::QuantizeRows(dy, m, kN, kFormat, rceil).value();
  const auto qwt = mx::kernels::QuantizeColumns(weight_, kN, kK, kFormat).value();
  EXPECT_TRUE(SameBits(Floats(g->grad_input()), mx::ReferenceLinear(qdy, qwt, {}).value()));
  const auto qdyt = mx::kernels::QuantizeColumns(dy, m, kN, kFormat, rceil).value();
  const auto qxt = mx::kernels::QuantizeColumns(x, m, kK, kFormat, rceil).value();
  EXPECT_TRUE(SameBits(Floats(g->grad_weight()), mx::ReferenceLinear(qdyt, qxt, {}).value()));
  EXPECT_FALSE(SameBits(Floats(g->grad_input()), Floats(floor->grad_input())));
  EXPECT_FALSE(SameBits(Floats(g->grad_weight()), Floats(floor->grad_weight())));
}

// A request that leaves its scale rule unspecified gets the model's policy's
// rule for the phase; one that names a rule keeps it; a Gemm's is floor.
TEST_F(ComputeWorkTest, AnUnspecifiedScaleRuleIsThePolicysForThePhase) {
  ASSERT_TRUE(policies_
                  ->Put(R"({"name": "ceil-rollout", "defaults": {"rollout": "MXFP8",
                            "reward": "MXFP8", "update": "MXFP8"},
                            "scale_rules": {"rollout": "ceil"}})")
                  .ok());
  ASSERT_TRUE(registry_.SetPolicy("m", "ceil-rollout").ok());
  std::vector<float> x = Random(2 * kK, 97);
  x[0] = 15.92f;  // saturated by floor, as above
  auto run = [&](v1::Phase phase, v1::ScaleRule rule) {
    PendingForward p[3];
    for (auto& each : p) {
      v1::LayerForwardRequest r = Forward(x, 2, phase);
      r.clear_format();  // the policy's too
      r.set_scale_rule(rule);
      SubmitForward(std::move(r), each);
    }
    for (auto& each : p) EXPECT_TRUE(each.status.get().ok());
    return Floats(p[0].response.output());
  };
  EXPECT_TRUE(SameBits(run(v1::PHASE_ROLLOUT, v1::SCALE_RULE_UNSPECIFIED),
                       Reference(x, 2, mx::ScaleRule::kCeil)));
  EXPECT_TRUE(SameBits(run(v1::PHASE_REWARD, v1::SCALE_RULE_UNSPECIFIED), Reference(x, 2)));
  EXPECT_TRUE(SameBits(run(v1::PHASE_ROLLOUT, v1::SCALE_RULE_FLOOR), Reference(x, 2)));
}

TEST_F(ComputeWorkTest, AnUnknownScaleRuleIsRefusedNamingTheField) {
  v1::LayerForwardRequest r = Forward(Random(kK, 1), 1, v1::PHASE_ROLLOUT);
  r.set_scale_rule(static_cast<v1::ScaleRule>(9));
  v1::LayerForwardResponse response;
  const auto item = PrepareForward(core_, r, &response, {}, [](absl::Status) {});
  EXPECT_EQ(item.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(item.status().message(),
            "scale_rule: unknown scale rule value 9; expected SCALE_RULE_FLOOR, "
            "SCALE_RULE_NO_SATURATION, SCALE_RULE_CEIL or SCALE_RULE_RCEIL");
}

// The null backend takes the same path with shape-only operands: zeros of every
// shape, no kernel, no time, nothing quantized or cached.
class NullComputeWorkTest : public ComputeWorkTest {
 protected:
  NullComputeWorkTest() : ComputeWorkTest(MakeNullBackend()) {}
};

TEST_F(NullComputeWorkTest, EveryRequestIsZerosOfItsShapeWithoutAWeightCopy) {
  PendingForward pending[3];
  const int64_t rows[] = {2, 1, 4};
  for (int i = 0; i < 3; ++i) {
    SubmitForward(Forward(Random(rows[i] * kK, 60 + i), rows[i], v1::PHASE_UPDATE), pending[i]);
  }
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(pending[i].status.get().ok());
    const v1::LayerForwardResponse& r = pending[i].response;
    EXPECT_EQ(Floats(r.output()), std::vector<float>(static_cast<size_t>(rows[i] * kN), 0.0f));
    EXPECT_EQ(r.info().backend(), "null");
    EXPECT_EQ(r.info().kernel(), "");
    EXPECT_EQ(r.info().compute_seconds(), 0);
    EXPECT_EQ(r.info().batch_size(), 3u);
    EXPECT_GT(r.info().model_joules(), 0);
  }
  // One GEMM of shape-only operands on a shape-only weight.
  EXPECT_EQ(backend_.calls(), (std::vector<Call>{{7, kN, kK, true}}));

  const int64_t m = 3;
  const auto g = RunBackward(Backward(Random(m * kN, 70), Random(m * kK, 71), m, v1::PHASE_UPDATE));
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(Floats(g->grad_input()), std::vector<float>(m * kK, 0.0f));
  EXPECT_EQ(Floats(g->grad_weight()), std::vector<float>(kN * kK, 0.0f));
  EXPECT_EQ(Floats(g->grad_bias()), std::vector<float>(kN, 0.0f));
  EXPECT_EQ(g->info().compute_seconds(), 0);

  v1::GemmRequest gemm;
  gemm.set_phase(v1::PHASE_ROLLOUT);
  gemm.set_format(ToProto(kFormat));
  *gemm.mutable_a()->mutable_tensor() = Tensor(Random(5 * 32, 80), 5, 32);
  *gemm.mutable_b()->mutable_tensor() = Tensor(Random(32 * 7, 81), 32, 7);
  Pending<v1::GemmRequest, v1::GemmResponse> c;
  c.request = gemm;
  Submit(PrepareGemm(core_, c.request, &c.response, c.call,
                     [&c](absl::Status s) { c.done.set_value(std::move(s)); }));
  ASSERT_TRUE(c.status.get().ok());
  EXPECT_EQ(c.response.c().shape(0), 5);
  EXPECT_EQ(c.response.c().shape(1), 7);
  EXPECT_EQ(Floats(c.response.c()), std::vector<float>(5 * 7, 0.0f));
  EXPECT_EQ(backend_.calls().back(), (Call{5, 7, 32, false}));
  // No copy of the weight was made or charged: only the FP32 masters are held.
  EXPECT_EQ(budget_.used(), static_cast<uint64_t>((kN * kK + kN) * 4));
  EXPECT_TRUE(registry_.Lookup("m", "fc", 0)->weights->CachedFormats().empty());
}

}  // namespace
}  // namespace mxserve
