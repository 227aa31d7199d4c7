#include "server/compute/compute_work.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "mx/checked_math.h"
#include "mx/status_macros.h"
#include "server/base/label.h"
#include "server/base/quote.h"
#include "server/compute/operands.h"
#include "server/compute/wire.h"
#include "server/telemetry/clock.h"

namespace mxserve {
namespace {

absl::StatusOr<Activation> DecodeActivation(const ComputeContext& core, const v1::Operand& operand,
                                            absl::string_view field, const ExpectedShape& expected,
                                            std::optional<mx::Format> format) {
  Activation a;
  if (operand.has_packed()) {
    MX_ASSIGN_OR_RETURN(a.packed, DecodePacked(operand.packed(), absl::StrCat(field, ".packed"),
                                               expected, core.max_message_bytes));
    a.rows = a.packed->rows;
    a.cols = a.packed->cols;
    a.format = a.packed->format;
    if (format && *format != a.format) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".packed.format: the operand is packed in ", mx::FormatName(a.format),
                       " but the request asks for ", mx::FormatName(*format)));
    }
    return a;
  }
  if (!operand.has_tensor()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": required; expected a tensor or a packed operand"));
  }
  MX_ASSIGN_OR_RETURN(a.dense, DecodeMatrix(operand.tensor(), absl::StrCat(field, ".tensor"),
                                            expected, core.max_message_bytes));
  a.rows = a.dense->rows;
  a.cols = a.dense->cols;
  if (format) a.format = *format;
  return a;
}

// A result must fit in one response message; RESOURCE_EXHAUSTED otherwise (the
// request is valid, the daemon's --max-message-bytes is what it exceeds).
// `how` tells the client how to split it.
absl::Status CheckOutputSize(const ComputeContext& core, int64_t rows, int64_t cols,
                             absl::string_view field, absl::string_view what,
                             absl::string_view how) {
  const std::optional<uint64_t> bytes =
      mx::CheckedProduct({static_cast<uint64_t>(rows), static_cast<uint64_t>(cols), 4});
  if (!bytes || *bytes > static_cast<uint64_t>(core.max_message_bytes) - kEnvelopeBytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat(field, ": the ", what, " (", rows, " x ", cols,
                     " FP32 = ", bytes ? absl::StrCat(*bytes) : std::string("more than 2^64"),
                     " bytes) would exceed the maximum message size of ", core.max_message_bytes,
                     " bytes (--max-message-bytes); ", how));
  }
  return absl::OkStatus();
}

void FillInfo(const ComputeContext& core, mx::Format x, mx::Format w, uint64_t version,
              size_t batch, double queue_seconds, double compute_seconds,
              const fpga_model::GemmEstimate& model, const std::string& kernel,
              v1::ExecutionInfo* info) {
  info->set_format(ToProto(x));
  info->set_weight_format(ToProto(w));
  info->set_backend(std::string(core.backend->name()));
  info->set_weight_version(version);
  info->set_batch_size(static_cast<uint32_t>(batch));
  info->set_queue_seconds(queue_seconds);
  info->set_compute_seconds(compute_seconds);
  info->set_model_seconds(model.seconds);
  info->set_model_joules(model.joules);
  info->set_kernel(kernel);
}

// Counts a finished compute request, its modelled energy and, where the backend
// measures board power, that power over the request's share of device time. Called
// once per request, batched or not, so each is booked under its own run. The run
// goes to the ledger only: as a metric label it would be a series per client tag.
void Account(const ComputeContext& core, Rpc rpc, Phase phase, const std::string& run,
             const Principal& who, mx::Format format, Clock::time_point arrival, double queue_seconds, double flops,
             const fpga_model::GemmEstimate& model, double device_seconds,
             const std::string& model_name = "") {
  const bool book_model = core.backend->BooksModelEnergy();  // not where nothing ran (null)
  core.metrics->RecordCompute({.rpc = rpc,
                               .phase = phase,
                               .format = format,
                               .latency_seconds = Seconds(Clock::now() - arrival),
                               .queue_seconds = queue_seconds,
                               .flops = flops,
                               .bytes = model.bytes,
                               .model_seconds = book_model ? model.seconds : 0,
                               .model_joules = book_model ? model.joules : 0});
  const double now = UnixSeconds();
  if (book_model) {
    const EnergyAmount amount{.joules = model.joules, .busy_seconds = model.seconds, .requests = 1};
    core.ledger->Add("fpga_model", phase, run, now, amount, 1, who);
    if (!model_name.empty()) {
      core.ledger->AddModel(model_name, "fpga_model", phase, amount);
      core.metrics->RecordModelEnergy(model_name, phase, model.joules);
    }
  }
  if (std::optional<double> watts = core.backend->BoardPowerWatts()) {
    const EnergyAmount amount{
        .joules = *watts * device_seconds, .busy_seconds = device_seconds, .requests = 1};
    core.ledger->Add("fpga", phase, run, now, amount, 1, who);
    if (!model_name.empty()) core.ledger->AddModel(model_name, "fpga", phase, amount);
    core.metrics->RecordBoardEnergy(phase, format, *watts * device_seconds, device_seconds);
    core.metrics->SetPower("fpga", "board", *watts);
  }
}

// An FP32 [rows, cols] tensor of zeros, for a GEMM to write into.
void ZeroMatrix(int64_t rows, int64_t cols, v1::Tensor* tensor) {
  tensor->clear_shape();
  tensor->add_shape(rows);
  tensor->add_shape(cols);
  tensor->set_dtype(v1::DTYPE_FP32);
  tensor->mutable_data()->assign(static_cast<size_t>(rows * cols) * sizeof(float), '\0');
}

fpga_model::GemmEstimate Sum(const fpga_model::GemmEstimate& a, const fpga_model::GemmEstimate& b) {
  return {.macs = a.macs + b.macs,
          .cycles = a.cycles + b.cycles,
          .bytes = a.bytes + b.bytes,
          .seconds = a.seconds + b.seconds,
          .joules = a.joules + b.joules};
}

}  // namespace

LayerCallCost PriceForward(const ComputeContext& core, mx::Format x, mx::Format w, int64_t m,
                           int64_t n, int64_t k) {
  return {.model = fpga_model::EstimateGemm(core.energy_model, x, w, m, n, k),
          .flops = 2.0 * m * n * k};
}

LayerCallCost PriceBackward(const ComputeContext& core, mx::Format format, int64_t m, int64_t n,
                            int64_t k, bool grad_input, bool grad_weight) {
  fpga_model::GemmEstimate model{};
  if (grad_input) model = fpga_model::EstimateGemm(core.energy_model, format, format, m, k, n);
  if (grad_weight) {
    model = Sum(model, fpga_model::EstimateGemm(core.energy_model, format, format, n, k, m));
  }
  return {.model = model, .flops = ((grad_input ? 2.0 : 0.0) + (grad_weight ? 2.0 : 0.0)) * m * n * k};
}

void BookEmulatedCalls(const ComputeContext& core, Rpc rpc, Phase phase, const std::string& run,
                       const Principal& who, mx::Format format, const LayerCallCost& cost,
                       uint64_t times, double when, const std::string& model) {
  const EnergyAmount amount{.joules = cost.model.joules,
                            .busy_seconds = cost.model.seconds,
                            .requests = 1,
                            .emulated_requests = 1};
  core.ledger->Add("fpga_model", phase, run, when, amount, times, who);
  core.ledger->AddModel(model, "fpga_model", phase, amount, times);
  core.metrics->RecordModelEnergy(model, phase, cost.model.joules, times);
  core.metrics->RecordEmulatedCompute({.rpc = rpc,
                                       .phase = phase,
                                       .format = format,
                                       .flops = cost.flops,
                                       .bytes = cost.model.bytes,
                                       .model_seconds = cost.model.seconds,
                                       .model_joules = cost.model.joules},
                                      times);
}

namespace {

// How a request asks for its weight copy: an update-phase one slices
// (CopyUse::kUpdate) unless mxserved --update-copies cache.
CopyUse CopyUseOf(const ComputeContext& core, bool update_phase) {
  return update_phase && !core.cache_update_copies ? CopyUse::kUpdate : CopyUse::kRequest;
}

class ComputeItem : public WorkItem {
 public:
  ComputeItem(const ComputeContext& core, CallInfo call, Done done, std::string run)
      : core_(core), call_(call), done_(std::move(done)), run_(std::move(run)) {
    arrival = call.arrival;
    deadline = call.deadline;
  }
  bool Cancelled() const override { return call_.Cancelled(); }
  void Fail(absl::Status status) override { done_(std::move(status)); }

 protected:
  const ComputeContext& core_;
  CallInfo call_;
  Done done_;
  std::string run_;  // the request's run tag, validated; "" untagged
};

// ---------------------------------------------------------------------------
// Gemm: C = A·B, B quantized per column (held transposed) or sent packed so.

class GemmItem final : public ComputeItem {
 public:
  GemmItem(const ComputeContext& core, CallInfo call, Done done, std::string run, Phase phase,
           Activation a, Activation b, mx::QuantizeOptions options, v1::GemmResponse* response)
      : ComputeItem(core, call, std::move(done), std::move(run)),
        phase_(phase),
        a_(std::move(a)),
        b_(std::move(b)),
        options_(options),
        response_(response) {}

  void Run() override {
    const double queue_seconds = Seconds(Clock::now() - arrival);
    const Operands operands(core_);
    absl::StatusOr<mx::QuantizedMatrix> qa =
        operands.Rows(a_, mx::ForStream(options_, mx::OperandStream::kGemmA));
    if (!qa.ok())
      return Fail(absl::InvalidArgumentError(absl::StrCat("a: ", qa.status().message())));
    absl::StatusOr<mx::QuantizedMatrix> qb;
    if (b_.packed) {
      qb = *std::move(b_.packed);
    } else {
      // B arrives K×N; the backend wants its N columns as rows of K.
      qb = operands.Columns(operands.Floats(*b_.dense), b_.rows, b_.cols, b_.format,
                            mx::ForStream(options_, mx::OperandStream::kGemmB));
    }
    if (!qb.ok())
      return Fail(absl::InvalidArgumentError(absl::StrCat("b: ", qb.status().message())));
    const int64_t m = qa->rows, k = qa->cols, n = qb->rows;
    std::vector<float> c(static_cast<size_t>(m * n));
    double compute_seconds = 0;
    absl::StatusOr<std::string> kernel = operands.Linear(*qa, *qb, {}, c, compute_seconds);
    if (!kernel.ok()) return Fail(kernel.status());
    EncodeMatrix(c, m, n, response_->mutable_c());
    const auto model =
        fpga_model::EstimateGemm(core_.energy_model, qa->format, qb->format, m, n, k);
    FillInfo(core_, qa->format, qb->format, 0, 1, queue_seconds, compute_seconds, model, *kernel,
             response_->mutable_info());
    Account(core_, Rpc::kGemm, phase_, run_, call_.principal, qa->format, arrival, queue_seconds,
            2.0 * m * n * k, model, compute_seconds);
    done_(absl::OkStatus());
  }

 private:
  Phase phase_;
  Activation a_, b_;
  mx::QuantizeOptions options_;
  v1::GemmResponse* response_;
};

// ---------------------------------------------------------------------------
// LayerForward: Y = X·Wᵀ + bias, batched across requests of one key.

class ForwardItem final : public ComputeItem {
 public:
  ForwardItem(const ComputeContext& core, CallInfo call, Done done, std::string run, Phase phase,
              LayerView view, mx::Format weight_format, Activation x,
              mx::QuantizeOptions options, v1::LayerForwardResponse* response)
      : ComputeItem(core, call, std::move(done), std::move(run)),
        phase_(phase),
        view_(std::move(view)),
        weight_format_(weight_format),
        x_(std::move(x)),
        options_(options),
        response_(response) {
    // One GEMM serves a batch only when everything but the rows of X agrees. The
    // LayerWeights address pins model, layer and weight version (it is alive while
    // this item holds it).
    runner = &kRunner;
    batch_key = absl::StrCat(reinterpret_cast<uintptr_t>(view_.weights.get()), "/",
                             static_cast<int>(x_.format), "/", static_cast<int>(weight_format_));
  }

  // LayerForwardRequest.output_dtype BF16: the answer carries the output so.
  void set_output_bf16(bool bf16) { output_bf16_ = bf16; }

 private:
  // One GEMM for every member of a batch: the inputs' rows stacked, the
  // outputs split.
  class Runner final : public BatchRunner {
   public:
    void Run(std::span<WorkItem* const> batch) const override {
      std::vector<ForwardItem*> members;
      members.reserve(batch.size());
      // Only ForwardItems carry this runner, and the scheduler hands it only
      // items that do.
      for (WorkItem* item : batch) members.push_back(static_cast<ForwardItem*>(item));
      RunBatch(members);
    }
  };
  static const Runner kRunner;

  static void RunBatch(std::span<ForwardItem* const> batch) {
    const auto started = Clock::now();
    const ForwardItem& first = *batch.front();
    const ComputeContext& core = first.core_;
    const Operands operands(core);
    const LayerWeights& weights = *first.view_.weights;
    const int64_t n = weights.spec().out_features, k = weights.spec().in_features;
    std::vector<ForwardItem*> members;
    std::vector<mx::QuantizedMatrix> xs;
    for (ForwardItem* member : batch) {
      absl::StatusOr<mx::QuantizedMatrix> x = operands.Rows(
          member->x_, mx::ForStream(member->options_, mx::OperandStream::kForwardInput));
      if (!x.ok()) {
        member->Fail(absl::InvalidArgumentError(absl::StrCat("input: ", x.status().message())));
        continue;
      }
      members.push_back(member);
      xs.push_back(*std::move(x));
    }
    if (members.empty()) return;
    mx::QuantizedMatrix stacked;
    if (xs.size() > 1) {
      // One key means one format and K, so stacking cannot fail.
      absl::StatusOr<mx::QuantizedMatrix> rows = mx::StackRows(xs);
      if (!rows.ok()) {
        for (ForwardItem* member : members) member->Fail(rows.status());
        return;
      }
      stacked = *std::move(rows);
    }
    const mx::QuantizedMatrix& x = xs.size() > 1 ? stacked : xs.front();
    // Alone, a request's GEMM writes straight into its response; a batch shares
    // one buffer that is then split.
    const bool alone = members.size() == 1;
    std::vector<float> shared;
    std::span<float> y;
    if (alone) {
      v1::Tensor* output = members.front()->response_->mutable_output();
      ZeroMatrix(x.rows, n, output);
      y = {reinterpret_cast<float*>(output->mutable_data()->data()),
           static_cast<size_t>(x.rows * n)};
    } else {
      shared.resize(static_cast<size_t>(x.rows * n));
      y = shared;
    }
    // Update-phase copies are made per call (registry.h, CopyUse::kUpdate).
    const bool update = std::all_of(members.begin(), members.end(), [](const ForwardItem* member) {
      return member->phase_ == Phase::kUpdate;
    });
    double compute_seconds = 0;
    absl::StatusOr<std::string> kernel =
        operands.LinearOnCopy(weights, first.weight_format_, WeightLayout::kForward,
                              CopyUseOf(core, update), x, weights.bias(), y, compute_seconds);
    core.metrics->RecordBatch(static_cast<int>(members.size()));
    int64_t row = 0;
    for (ForwardItem* member : members) {
      if (!kernel.ok()) {
        member->Fail(kernel.status());
        continue;
      }
      const int64_t m = member->x_.rows;
      member->Answer(
          alone ? std::span<const float>() : std::span<const float>(y).subspan(row * n, m * n), m,
          n, k, members.size(), Seconds(started - member->arrival), compute_seconds, *kernel);
      row += m;
    }
  }

  // `y` empty: the output is already in the response.
  void Answer(std::span<const float> y, int64_t m, int64_t n, int64_t k, size_t batch,
              double queue_seconds, double compute_seconds, const std::string& kernel) {
    if (!y.empty()) EncodeMatrix(y, m, n, response_->mutable_output());
    if (output_bf16_) NarrowToBf16(response_->mutable_output());
    const LayerCallCost cost = PriceForward(core_, x_.format, weight_format_, m, n, k);
    FillInfo(core_, x_.format, weight_format_, view_.weights->version(), batch, queue_seconds,
             compute_seconds, cost.model, kernel, response_->mutable_info());
    Account(core_, Rpc::kLayerForward, phase_, run_, call_.principal, weight_format_, arrival, queue_seconds,
            cost.flops, cost.model, compute_seconds / static_cast<double>(batch), view_.model);
    done_(absl::OkStatus());
  }

  Phase phase_;
  LayerView view_;
  mx::Format weight_format_;
  bool output_bf16_ = false;
  Activation x_;
  mx::QuantizeOptions options_;  // for X (its scale rule; each member's own)
  v1::LayerForwardResponse* response_;
};

const ForwardItem::Runner ForwardItem::kRunner;

// ---------------------------------------------------------------------------
// LayerBackward: grad_input = dY·W, grad_weight = dYᵀ·X, grad_bias = Σ_rows dY;
// with a weight_rows range, only the last two, for those rows of W.

class BackwardItem final : public ComputeItem {
 public:
  BackwardItem(const ComputeContext& core, CallInfo call, Done done, std::string run, Phase phase,
               LayerView view, mx::Format format, DenseMatrix grad_output,
               std::optional<DenseMatrix> input, std::optional<int64_t> first_weight_row,
               bool accumulate_grad, mx::QuantizeOptions options,
               v1::LayerBackwardResponse* response)
      : ComputeItem(core, call, std::move(done), std::move(run)),
        phase_(phase),
        view_(std::move(view)),
        format_(format),
        grad_output_(grad_output),
        input_(input),
        first_weight_row_(first_weight_row),
        accumulate_grad_(accumulate_grad),
        options_(options),
        response_(response) {}

  void Run() override {
    const double queue_seconds = Seconds(Clock::now() - arrival);
    const Operands operands(core_);
    const LayerWeights& weights = *view_.weights;
    // n: the rows of W this request is about (all, or its weight_rows range).
    const int64_t m = grad_output_.rows, n = grad_output_.cols, k = weights.spec().in_features;
    // grad_input unless a row range, grad_weight with the input, grad_bias with a bias.
    const bool want_input_grad = !first_weight_row_.has_value();
    const auto [model, flops] =
        PriceBackward(core_, format_, m, n, k, want_input_grad, input_.has_value());
    double compute_seconds = 0;
    std::string kernel;
    if (want_input_grad) {
      absl::StatusOr<std::string> ran = GradInput(operands, compute_seconds);
      if (!ran.ok()) return Fail(ran.status());
      kernel = *std::move(ran);
    }
    const std::vector<float> dy = operands.Floats(grad_output_);
    std::vector<float> grad_weight, grad_bias;
    if (input_) {
      absl::StatusOr<std::string> ran = GradWeight(operands, dy, compute_seconds, grad_weight);
      if (!ran.ok()) return Fail(ran.status());
      if (kernel.empty()) kernel = *std::move(ran);
    }
    if (weights.spec().bias) grad_bias = operands.ColumnSums(dy, m, n);
    if (accumulate_grad_) {
      // A shape-only backend (null) computes no values: it accumulates zeros.
      if (weights.spec().bias) grad_bias.resize(static_cast<size_t>(n), 0.0f);
      if (absl::Status s = view_.optimizer->Accumulate(first_weight_row_.value_or(0), grad_weight,
                                                       grad_bias);
          !s.ok()) {
        return Fail(s);
      }
    } else {
      if (input_) EncodeMatrix(grad_weight, n, k, response_->mutable_grad_weight());
      if (weights.spec().bias) EncodeVector(grad_bias, response_->mutable_grad_bias());
    }
    FillInfo(core_, format_, format_, weights.version(), 1, queue_seconds, compute_seconds, model,
             kernel, response_->mutable_info());
    Account(core_, Rpc::kLayerBackward, phase_, run_, call_.principal, format_, arrival,
            queue_seconds, flops, model, compute_seconds, view_.model);
    done_(absl::OkStatus());
  }

 private:
  // grad_input [M, K] = dY (M×N, blocked along N) · W (N×K), W held as K rows
  // of N (the transposed layout). Returns the kernel that ran.
  absl::StatusOr<std::string> GradInput(const Operands& operands, double& compute_seconds) {
    const LayerWeights& weights = *view_.weights;
    const int64_t m = grad_output_.rows, k = weights.spec().in_features;
    absl::StatusOr<mx::QuantizedMatrix> dy = operands.Rows(
        grad_output_, format_, mx::ForStream(options_, mx::OperandStream::kGradOutputRows));
    if (!dy.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("grad_output: ", dy.status().message()));
    }
    std::vector<float> grad_input(static_cast<size_t>(m * k));
    MX_ASSIGN_OR_RETURN(std::string kernel,
                        operands.LinearOnCopy(weights, format_, WeightLayout::kTransposed,
                                              CopyUseOf(core_, phase_ == Phase::kUpdate), *dy, {},
                                              grad_input, compute_seconds));
    EncodeMatrix(grad_input, m, k, response_->mutable_grad_input());
    return kernel;
  }

  // grad_weight [N, K] = dYᵀ (N×M) · X (M×K): dY and X quantized per column,
  // i.e. along M, held as N and K rows. Each row of it depends on its column of dY
  // alone, which is why a weight_rows slice is exact. Returns the kernel that ran.
  absl::StatusOr<std::string> GradWeight(const Operands& operands, std::span<const float> dy,
                                         double& compute_seconds, std::vector<float>& grad_weight) {
    const int64_t m = grad_output_.rows, n = grad_output_.cols;
    const int64_t k = view_.weights->spec().in_features;
    // A weight_rows slice holds columns [first_row, first_row + n) of the whole
    // dY: its draws are the whole's there.
    mx::QuantizeOptions dy_options = mx::ForStream(options_, mx::OperandStream::kGradOutputColumns);
    dy_options.index_offset = first_weight_row_.value_or(0);
    dy_options.index_row_stride = view_.weights->spec().out_features;
    absl::StatusOr<mx::QuantizedMatrix> dyt = operands.Columns(dy, m, n, format_, dy_options);
    absl::StatusOr<mx::QuantizedMatrix> xt =
        operands.Columns(operands.Floats(*input_), m, k, format_,
                         mx::ForStream(options_, mx::OperandStream::kInputColumns));
    if (!dyt.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("grad_output: ", dyt.status().message()));
    }
    if (!xt.ok()) return absl::InvalidArgumentError(absl::StrCat("input: ", xt.status().message()));
    grad_weight.assign(static_cast<size_t>(n * k), 0.0f);
    return operands.Linear(*dyt, *xt, {}, grad_weight, compute_seconds);
  }

  Phase phase_;
  LayerView view_;
  mx::Format format_;
  DenseMatrix grad_output_;
  std::optional<DenseMatrix> input_;
  // A weight_rows request's first row (it gets no grad_input); none without a range.
  std::optional<int64_t> first_weight_row_;
  bool accumulate_grad_;  // grad_weight and grad_bias go to the layer's optimizer
  mx::QuantizeOptions options_;  // for dY and X (their scale rule, rounding and seed)
  v1::LayerBackwardResponse* response_;
};

}  // namespace

absl::StatusOr<LayerChoice> ResolveLayerChoice(const ComputeContext& core, const LayerView& view,
                                               Phase phase, v1::Format format,
                                               v1::ScaleRule scale_rule,
                                               std::optional<v1::Rounding> rounding) {
  MX_ASSIGN_OR_RETURN(std::optional<mx::Format> explicit_format, FromProto(format, "format"));
  MX_ASSIGN_OR_RETURN(std::optional<mx::ScaleRule> explicit_rule,
                      FromProto(scale_rule, "scale_rule"));
  std::optional<mx::Rounding> explicit_rounding;
  if (rounding) {
    MX_ASSIGN_OR_RETURN(explicit_rounding, FromProto(*rounding, "rounding"));
  }
  if (explicit_format && explicit_rule && explicit_rounding) {
    return LayerChoice{*explicit_format, *explicit_rule, *explicit_rounding};
  }
  absl::StatusOr<StoredPolicy> policy = core.policies->Get(view.policy, "policy");
  if (!explicit_format && !policy.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("format: unspecified, and the model's active policy cannot be used: ",
                     policy.status().message()));
  }
  LayerChoice choice{.format = explicit_format.value_or(mx::Format::kFp32),
                     .scale_rule = explicit_rule.value_or(mx::ScaleRule::kFloor),
                     .rounding = explicit_rounding.value_or(mx::Rounding::kNearestEven)};
  if (!explicit_format) {
    choice.format =
        Resolve(*policy->policy, phase, view.weights->spec().name, view.tolerance).format;
  }
  if (policy.ok()) {
    const size_t index = static_cast<size_t>(phase);
    if (!explicit_rule) choice.scale_rule = policy->policy->scale_rules[index];
    if (!explicit_rounding) choice.rounding = policy->policy->roundings[index];
  }
  return choice;
}

namespace {

// Whether quantizing to `format` rounds elements (the roundings apply): the MX
// formats, NVFP4 and INT8; BF16/FP16/FP32 operands are converted to nearest even.
bool RoundsElements(mx::Format format) {
  // The lookup formats quantize by their tables whatever the rounding.
  return (mx::IsBlockScaled(format) && !mx::Traits(format).is_lookup()) ||
         format == mx::Format::kInt8;
}

// Stochastic rounding needs the request's seed (the bits must be the same every
// time the request is made) where an operand the request brings will round
// (`rounds`); where none will, the rounding is moot and nearest even is kept.
// `whose` says where the rounding came from.
absl::Status TakeSeed(mx::QuantizeOptions& options, bool rounds, bool has_seed, uint64_t seed,
                      absl::string_view whose) {
  if (options.rounding != mx::Rounding::kStochastic) return absl::OkStatus();
  if (!rounds) {
    options.rounding = mx::Rounding::kNearestEven;
    return absl::OkStatus();
  }
  if (!has_seed) {
    return absl::InvalidArgumentError(absl::StrCat(
        "seed: required where the rounding is stochastic (", whose,
        "); send one per call, e.g. from the step and the layer, so that the same request "
        "gives the same bits"));
  }
  options.seed = seed;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<WorkItem>> PrepareGemm(const ComputeContext& core,
                                                      const v1::GemmRequest& request,
                                                      v1::GemmResponse* response, CallInfo call,
                                                      Done done) {
  MX_ASSIGN_OR_RETURN(Phase phase, FromProto(request.phase(), "phase"));
  MX_RETURN_IF_ERROR(CheckRunTag(request.run(), "run"));
  MX_RETURN_IF_ERROR(core.ledger->CheckRun(request.run(), call.principal, "run"));
  MX_ASSIGN_OR_RETURN(std::optional<mx::Format> format_a, FromProto(request.format(), "format"));
  MX_ASSIGN_OR_RETURN(std::optional<mx::Format> format_b,
                      FromProto(request.format_b(), "format_b"));
  if (!format_a && !request.a().has_packed()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "format: required for Gemm (it has no model, hence no policy); expected one of ",
        mx::FormatNameList()));
  }
  mx::QuantizeOptions options;
  MX_ASSIGN_OR_RETURN(options.rounding, FromProto(request.rounding(), "rounding"));
  MX_ASSIGN_OR_RETURN(std::optional<mx::ScaleRule> rule,
                      FromProto(request.scale_rule(), "scale_rule"));
  options.scale_rule = rule.value_or(mx::ScaleRule::kFloor);  // a Gemm has no policy
  MX_ASSIGN_OR_RETURN(Activation a, DecodeActivation(core, request.a(), "a", {}, format_a));
  if (!format_b) format_b = a.format;
  // B is K × N dense, or packed transposed as N rows of K.
  ExpectedShape b_shape;
  const std::string k_what = "K, the columns of a";
  if (request.b().has_packed()) {
    b_shape.cols = a.cols;
    b_shape.cols_what = k_what;
    b_shape.rows_name = "N";
  } else {
    b_shape.rows = a.cols;
    b_shape.rows_what = k_what;
    b_shape.cols_name = "N";
  }
  MX_ASSIGN_OR_RETURN(Activation b, DecodeActivation(core, request.b(), "b", b_shape, format_b));
  MX_RETURN_IF_ERROR(core.backend->Serves(a.format));
  MX_RETURN_IF_ERROR(core.backend->Serves(b.format));
  MX_RETURN_IF_ERROR(TakeSeed(options,
                              (a.dense && RoundsElements(a.format)) ||
                                  (b.dense && RoundsElements(b.format)),
                              request.has_seed(), request.seed(), "the request's rounding"));
  const int64_t n = b.packed ? b.rows : b.cols;
  MX_RETURN_IF_ERROR(CheckOutputSize(core, a.rows, n, "b", "result C = A·B",
                                     "split the request along M or N"));
  return std::make_unique<GemmItem>(core, call, std::move(done), request.run(), phase, std::move(a),
                                    std::move(b), options, response);
}

// What LayerForward and LayerBackward resolve first: phase (and a valid run tag
// the caller may book into),
// the layer's published weights (at least `min_version`), and the format.
struct LayerRequest {
  Phase phase;
  LayerView view;
  mx::Format format;
  mx::QuantizeOptions options;  // the scale rule, rounding and seed of the operands it brings
};

template <typename Request>
absl::StatusOr<LayerRequest> ResolveLayerRequest(const ComputeContext& core, const Request& request,
                                                 const CallInfo& call) {
  MX_ASSIGN_OR_RETURN(Phase phase, FromProto(request.phase(), "phase"));
  MX_RETURN_IF_ERROR(CheckRunTag(request.run(), "run"));
  MX_RETURN_IF_ERROR(core.ledger->CheckRun(request.run(), call.principal, "run"));
  MX_ASSIGN_OR_RETURN(LayerView view, core.registry->Lookup(request.model(), request.layer(),
                                                            request.min_weight_version()));
  MX_ASSIGN_OR_RETURN(
      LayerChoice choice,
      ResolveLayerChoice(
          core, view, phase, request.format(), request.scale_rule(),
          request.has_rounding() ? std::optional(request.rounding()) : std::nullopt));
  MX_RETURN_IF_ERROR(core.backend->Serves(choice.format));
  mx::QuantizeOptions options;
  options.scale_rule = choice.scale_rule;
  options.rounding = choice.rounding;
  MX_RETURN_IF_ERROR(TakeSeed(options, RoundsElements(choice.format), request.has_seed(),
                              request.seed(),
                              request.has_rounding()
                                  ? std::string("the request's rounding")
                                  : absl::StrCat("the active policy's for phase ", PhaseName(phase))));
  return LayerRequest{phase, std::move(view), choice.format, options};
}

absl::StatusOr<std::unique_ptr<WorkItem>> PrepareForward(const ComputeContext& core,
                                                         const v1::LayerForwardRequest& request,
                                                         v1::LayerForwardResponse* response,
                                                         CallInfo call, Done done) {
  MX_ASSIGN_OR_RETURN(LayerRequest layer, ResolveLayerRequest(core, request, call));
  const LayerSpec& spec = layer.view.weights->spec();
  const ExpectedShape shape = LayerColumns(spec, /*in_features=*/true);
  // A packed input brings its own format; the weight keeps the resolved one.
  MX_ASSIGN_OR_RETURN(
      Activation x,
      DecodeActivation(core, request.input(), "input", shape,
                       request.input().has_packed() ? std::nullopt : std::optional(layer.format)));
  MX_RETURN_IF_ERROR(core.backend->Serves(x.format));  // a packed input's own
  MX_RETURN_IF_ERROR(CheckOutputSize(core, x.rows, spec.out_features, "input", "output",
                                     "split the input's rows (M) over several requests"));
  if (request.output_dtype() != v1::DTYPE_UNSPECIFIED &&
      request.output_dtype() != v1::DTYPE_FP32 && request.output_dtype() != v1::DTYPE_BF16) {
    return absl::InvalidArgumentError(
        absl::StrCat("output_dtype: expected DTYPE_FP32 or DTYPE_BF16, got ",
                     v1::DType_Name(request.output_dtype()).empty()
                         ? absl::StrCat(static_cast<int>(request.output_dtype()))
                         : v1::DType_Name(request.output_dtype())));
  }
  auto item = std::make_unique<ForwardItem>(core, call, std::move(done), request.run(),
                                            layer.phase, std::move(layer.view), layer.format,
                                            std::move(x), layer.options, response);
  item->set_output_bf16(request.output_dtype() == v1::DTYPE_BF16);
  return item;
}

absl::StatusOr<std::unique_ptr<WorkItem>> PrepareBackward(const ComputeContext& core,
                                                          const v1::LayerBackwardRequest& request,
                                                          v1::LayerBackwardResponse* response,
                                                          CallInfo call, Done done) {
  MX_ASSIGN_OR_RETURN(LayerRequest layer, ResolveLayerRequest(core, request, call));
  const LayerSpec& spec = layer.view.weights->spec();
  const bool ranged = request.has_weight_rows();
  ExpectedShape dy_shape = LayerColumns(spec, /*in_features=*/false);
  if (ranged) {
    const v1::RowRange& rows = request.weight_rows();
    if (rows.begin() < 0 || rows.begin() >= rows.end() || rows.end() > spec.out_features) {
      return absl::InvalidArgumentError(absl::StrCat(
          "weight_rows: expected 0 <= begin < end <= ", spec.out_features, " (out_features of layer '",
          spec.name, "'), got [", rows.begin(), ", ", rows.end(), ")"));
    }
    if (!request.has_input()) {
      return absl::InvalidArgumentError(
          "input: required with weight_rows (a row range asks for grad_weight, which needs the "
          "forward input; grad_input is not computed per row range)");
    }
    dy_shape.cols = rows.end() - rows.begin();
    dy_shape.cols_what = "end - begin of weight_rows";
  }
  MX_ASSIGN_OR_RETURN(DenseMatrix grad_output, DecodeMatrix(request.grad_output(), "grad_output",
                                                            dy_shape, core.max_message_bytes));
  std::optional<DenseMatrix> input;
  if (request.has_input()) {
    ExpectedShape x_shape = LayerColumns(spec, /*in_features=*/true);
    x_shape.rows = grad_output.rows;
    x_shape.rows_what = "M, the rows of grad_output";
    MX_ASSIGN_OR_RETURN(input,
                        DecodeMatrix(request.input(), "input", x_shape, core.max_message_bytes));
    // grad_weight = dYᵀ·X sums over the M rows: the GEMM's K, which an FPGA
    // backend bounds. Refused here, in the request's terms and before anything
    // is quantized or computed.
    if (const std::optional<int64_t> max_k = core.backend->MaxK();
        max_k.has_value() && grad_output.rows > *max_k) {
      return absl::InvalidArgumentError(absl::StrCat(
          "grad_output.shape[0], input.shape[0]: grad_weight = grad_outputᵀ·input sums over these ",
          grad_output.rows, " rows, which this backend takes as its GEMM's K (the FPGA kernel "
          "holds 1 to ", *max_k, " columns in its on-chip W tile, got ", grad_output.rows,
          "); split the rows across LayerBackward calls (accumulate_grad sums their "
          "grad_weight)"));
    }
    // Accumulated or answered, grad_weight is made whole first: bounded as an
    // answer is.
    MX_RETURN_IF_ERROR(CheckOutputSize(core, grad_output.cols, spec.in_features,
                                       ranged ? "weight_rows" : "input", "grad_weight",
                                       "ask for it in slices of rows with weight_rows"));
  } else if (request.accumulate_grad()) {
    return absl::InvalidArgumentError(
        "input: required with accumulate_grad (grad_weight = grad_outputᵀ·input needs it)");
  }
  if (request.accumulate_grad() && call.principal.role != Role::kAdmin) {
    // Anyone may compute with a model; only its owner changes what it will become.
    absl::StatusOr<std::string> owner = core.registry->Owner(request.model());
    if (owner.ok() && *owner != call.principal.name) {
      return absl::PermissionDeniedError(absl::StrCat(
          "accumulate_grad: model ", Quote(request.model()), " belongs to ", Quote(*owner),
          "; only its owner (or an admin) adds to its gradients"));
    }
  }
  if (request.accumulate_grad() && !layer.view.optimizer->HasAccumulator()) {
    // The accumulator is the owner's, as masters are (--quota-weight-bytes).
    MX_RETURN_IF_ERROR(core.registry->CheckOwnerQuota(
        request.model(), layer.view.optimizer->AccumulatorBytes(), core.quota_weight_bytes,
        "accumulate_grad"));
  }
  if (!ranged) {
    MX_RETURN_IF_ERROR(
        CheckOutputSize(core, grad_output.rows, spec.in_features, "grad_output", "grad_input",
                        "split grad_output's rows (M) over several requests"));
  }
  return std::make_unique<BackwardItem>(core, call, std::move(done), request.run(), layer.phase,
                                        std::move(layer.view), layer.format, grad_output, input,
                                        ranged ? std::optional(request.weight_rows().begin())
                                               : std::nullopt,
                                        request.accumulate_grad(), layer.options, response);
}

}  // namespace mxserve
