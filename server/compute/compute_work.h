// The compute requests as scheduler work: validation and format resolution happen
// here, on the calling (gRPC) thread, and are cheap; quantizing activations and
// the GEMM itself happen in WorkItem::Run on a worker thread.
//
// Each Prepare* either returns an item to submit or an error naming the request
// field. The item fills `response` and calls `done` exactly once.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "mxserve/v1/compute.pb.h"
#include "server/compute/context.h"

namespace mxserve {

absl::StatusOr<std::unique_ptr<WorkItem>> PrepareGemm(const ComputeContext& core,
                                                      const v1::GemmRequest& request,
                                                      v1::GemmResponse* response, CallInfo call,
                                                      Done done);

absl::StatusOr<std::unique_ptr<WorkItem>> PrepareForward(const ComputeContext& core,
                                                         const v1::LayerForwardRequest& request,
                                                         v1::LayerForwardResponse* response,
                                                         CallInfo call, Done done);

absl::StatusOr<std::unique_ptr<WorkItem>> PrepareBackward(const ComputeContext& core,
                                                          const v1::LayerBackwardRequest& request,
                                                          v1::LayerBackwardResponse* response,
                                                          CallInfo call, Done done);

// What one layer call costs in the FPGA model, and its FLOPs. LayerForward and
// LayerBackward price what they ran with these, and Telemetry.ReportWork prices
// the calls a client ran itself with the same functions, so both book the same
// doubles.
struct LayerCallCost {
  fpga_model::GemmEstimate model;
  double flops = 0;
};
// Y (M×N) = X (M×K, format x) · Wᵀ (format w).
LayerCallCost PriceForward(const ComputeContext& core, mx::Format x, mx::Format w, int64_t m,
                           int64_t n, int64_t k);
// grad_input (M×K) = dY (M×N) · W and grad_weight (N×K) = dYᵀ · X, each when
// asked for, their estimates summed in that order.
LayerCallCost PriceBackward(const ComputeContext& core, mx::Format format, int64_t m, int64_t n,
                            int64_t k, bool grad_input, bool grad_weight);

// Books `times` identical layer calls a client computed itself (ReportWork; `rpc`
// kLayerForward or kLayerBackward, the call they stand for) as Account books a
// served one's FPGA-model energy, one call after another: the fpga_model ledger
// entry (marked emulated) at Unix time `when`, the FLOPs, bytes and energy
// counters. Whatever the backend (the client did compute); nothing for source
// "fpga" (no board ran them) and no latency (nothing was timed here).
// `who` books them (the run's owner, or an admin: EnergyLedger::CheckRun),
// to `model`'s energy too (EnergyLedger::AddModel).
void BookEmulatedCalls(const ComputeContext& core, Rpc rpc, Phase phase, const std::string& run,
                       const Principal& who, mx::Format format, const LayerCallCost& cost,
                       uint64_t times, double when, const std::string& model);

// What a layer call computes in: its format, and the scale rule and rounding of
// the operands it brings, each the request's or, where it leaves one
// unspecified, the model's active policy's for (phase, layer). The policy is
// read once, and only then. A policy that cannot be read refuses an unspecified
// format (FAILED_PRECONDITION) and leaves an unspecified rule at floor and an
// unspecified rounding at nearest even.
struct LayerChoice {
  mx::Format format;
  mx::ScaleRule scale_rule;
  mx::Rounding rounding = mx::Rounding::kNearestEven;
};
absl::StatusOr<LayerChoice> ResolveLayerChoice(const ComputeContext& core, const LayerView& view,
                                               Phase phase, v1::Format format,
                                               v1::ScaleRule scale_rule,
                                               std::optional<v1::Rounding> rounding = {});

}  // namespace mxserve
