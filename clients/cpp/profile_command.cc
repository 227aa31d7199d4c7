// `mxctl profile` (a weight-only sensitivity profile of a model, as a layer ×
// format table and optionally the daemon's CSV) and `mxctl policy generate` (a
// policy from the model's newest profile, printed as its phase × layer table
// and its modelled joules per token against FP16).
#include <cstdio>
#include <fstream>
#include <map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "clients/cpp/cli_status.h"
#include "clients/cpp/commands.h"
#include "clients/cpp/table.h"
#include "clients/cpp/wire_names.h"
#include "mx/status_macros.h"

namespace mxctl {
namespace {

namespace v1 = ::mxserve::v1;

// "F1,F2,..." as wire formats; `flag` names the flag in errors.
absl::StatusOr<std::vector<v1::Format>> FormatList(const std::string& text,
                                                   absl::string_view flag) {
  std::vector<v1::Format> formats;
  for (absl::string_view name : absl::StrSplit(text, ',')) {
    absl::StatusOr<v1::Format> f = mxclient::ParseWireFormat(name);
    if (!f.ok() || *f == v1::FORMAT_UNSPECIFIED) {
      return UsageError(absl::StrCat("--", flag, ": unknown format '", name,
                                     "'; expected a comma-separated list such as "
                                     "MXFP4_E2M1,MXFP8_E4M3 (mxctl formats lists them)"));
    }
    formats.push_back(*f);
  }
  return formats;
}

// "auto, rel_error, fisher or mse": the rule's names of E's values (proto/convert/enums.h).
template <typename E>
std::string WireNames() {
  return mxserve::WireNameList(mxserve::DescriptorOf<E>(), /*full=*/false);
}

// --<flag> NAME, one value of the wire enum E by its rule name: `set` is given it.
template <typename E, typename Set>
absl::Status EnumFlag(const Flags& flags, const char* flag, Set set) {
  if (!flags.Has(flag)) return absl::OkStatus();
  const std::optional<E> value = mxserve::ParseWireName<E>(*flags.Get(flag));
  if (!value) return UsageError(absl::StrCat("--", flag, ": expected ", WireNames<E>()));
  set(*value);
  return absl::OkStatus();
}

absl::Status WriteText(const std::string& path, const std::string& text, absl::string_view flag) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  out.close();
  if (!out) return UsageError(absl::StrCat("--", flag, ": cannot write '", path, "'"));
  return absl::OkStatus();
}

// "0.5" (every phase) or "rollout=0.8,reward=0.5,update=0.2".
absl::StatusOr<std::vector<v1::PhaseValue>> PhaseValues(const std::string& text,
                                                        absl::string_view flag) {
  std::vector<v1::PhaseValue> values;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    v1::PhaseValue value;
    absl::string_view number = part;
    if (const size_t eq = part.find('='); eq != absl::string_view::npos) {
      absl::StatusOr<v1::Phase> phase = mxclient::ParsePhase(part.substr(0, eq));
      if (!phase.ok()) {
        return UsageError(absl::StrCat("--", flag, ": ", phase.status().message()));
      }
      value.set_phase(*phase);
      number = part.substr(eq + 1);
    }
    double v = 0;
    if (!absl::SimpleAtod(number, &v)) {
      return UsageError(
          absl::StrCat("--", flag, ": expected a number or PHASE=NUMBER,..., got '", text, "'"));
    }
    value.set_value(v);
    values.push_back(value);
  }
  return values;
}

}  // namespace

absl::Status RunProfile(const RemoteContext& remote, const Args& args) {
  MX_ASSIGN_OR_RETURN(
      auto flags, Flags::Parse(args, FlagSpec{.values = {"model", "formats", "csv", "batch-tokens"},
                                              .switches = {"fp64"},
                                              .repeatable = {"layer"}}));
  MX_ASSIGN_OR_RETURN(auto model, flags.Require("model"));
  v1::ProfileConfig config;
  config.set_model(model);
  if (flags.Has("formats")) {
    MX_ASSIGN_OR_RETURN(auto formats, FormatList(*flags.Get("formats"), "formats"));
    for (v1::Format f : formats) config.add_formats(f);
  }
  for (const std::string& layer : flags.GetAll("layer")) config.add_layers(layer);
  MX_ASSIGN_OR_RETURN(const int64_t batch_tokens, flags.IntOr("batch-tokens", 0, 0, 1 << 20));
  config.set_batch_tokens(batch_tokens);
  if (flags.Switch("fp64")) config.set_reference(v1::REFERENCE_FP64);

  const auto client = MakeClient(remote);
  absl::StatusOr<v1::Profile> profile = client->ProfileModel(config);
  if (!profile.ok()) return ServerError("Profiles.ProfileModel", profile.status());
  if (flags.Has("csv")) {
    absl::StatusOr<std::string> csv = client->ExportProfile(model, profile->weight_version());
    if (!csv.ok()) return ServerError("Profiles.ExportProfile", csv.status());
    MX_RETURN_IF_ERROR(WriteText(*flags.Get("csv"), *csv, "csv"));
  }
  // One row per layer, one column per format: the relative error.
  std::vector<std::vector<std::string>> rows = {{"layer"}};
  for (int f : profile->formats()) {
    rows[0].push_back(mxclient::WireFormatName(static_cast<v1::Format>(f)));
  }
  for (const v1::LayerProfile& layer : profile->layers()) {
    std::vector<std::string> row = {layer.layer()};
    for (const v1::FormatScore& s : layer.scores()) {
      row.push_back(absl::StrFormat("%.3g", s.rel_error()));
    }
    rows.push_back(std::move(row));
  }
  std::printf(
      "model %s version %llu: %d layers x %d formats, weight-only, relative error "
      "||W_F - W|| / ||W|| (%.2f s)\n",
      model.c_str(), static_cast<unsigned long long>(profile->weight_version()),
      profile->layers_size(), profile->formats_size(), profile->compute_seconds());
  std::fputs(FormatTable(rows).c_str(), stdout);
  if (flags.Has("csv")) std::printf("wrote %s\n", flags.Get("csv")->c_str());
  return absl::OkStatus();
}

absl::Status RunPolicyGenerate(mxclient::Client& client, const Args& args) {
  MX_ASSIGN_OR_RETURN(
      auto flags, Flags::Parse(args, FlagSpec{.values = {"model", "name", "kind", "fraction", "low",
                                                         "high", "score", "candidates", "metric",
                                                         "budget", "relative-budget", "tolerance",
                                                         "description", "version"},
                                              .switches = {"dry-run"},
                                              .repeatable = {"phase", "group"}}));
  v1::GeneratePolicyRequest request;
  MX_ASSIGN_OR_RETURN(auto model, flags.Require("model"));
  MX_ASSIGN_OR_RETURN(auto name, flags.Require("name"));
  MX_ASSIGN_OR_RETURN(auto kind, flags.Require("kind"));
  request.set_model(model);
  request.set_name(name);
  MX_ASSIGN_OR_RETURN(const int64_t version, flags.IntOr("version", 0, 0, INT64_MAX));
  request.set_weight_version(static_cast<uint64_t>(version));
  request.set_dry_run(flags.Switch("dry-run"));
  request.set_description(flags.Get("description").value_or(""));
  for (const std::string& phase : flags.GetAll("phase")) {
    absl::StatusOr<v1::Phase> p = mxclient::ParsePhase(phase);
    if (!p.ok()) return UsageError(absl::StrCat("--phase: ", p.status().message()));
    request.add_phases(*p);
  }
  for (const std::string& group : flags.GetAll("group")) request.add_groups(group);
  auto format_flag = [&](const char* flag, auto set) -> absl::Status {
    if (!flags.Has(flag)) return absl::OkStatus();
    MX_ASSIGN_OR_RETURN(auto formats, FormatList(*flags.Get(flag), flag));
    if (formats.size() != 1) return UsageError(absl::StrCat("--", flag, ": expected one format"));
    set(formats[0]);
    return absl::OkStatus();
  };
  MX_RETURN_IF_ERROR(format_flag("low", [&](v1::Format f) { request.set_low(f); }));
  MX_RETURN_IF_ERROR(format_flag("high", [&](v1::Format f) { request.set_high(f); }));
  if (flags.Has("candidates")) {
    MX_ASSIGN_OR_RETURN(auto formats, FormatList(*flags.Get("candidates"), "candidates"));
    for (v1::Format f : formats) request.add_candidates(f);
  }
  MX_RETURN_IF_ERROR(EnumFlag<v1::Score>(flags, "score", [&](v1::Score s) { request.set_score(s); }));
  MX_RETURN_IF_ERROR(
      EnumFlag<v1::CostMetric>(flags, "metric", [&](v1::CostMetric m) { request.set_metric(m); }));
  // The kind and the flag that carries its per-phase values.
  const char* value_flag = nullptr;
  google::protobuf::RepeatedPtrField<v1::PhaseValue>* values = nullptr;
  if (kind == "rl") {
    // DynaQuant's search runs the whole model per step (logits, attention
    // entropy, gradients); the daemon holds linear layers, not the model graph.
    return UsageError(
        "--kind rl: the RL search runs the whole model on calibration batches (logits, "
        "attention, gradients), which the daemon does not hold; run mxserve.torch.search "
        "(clients/python/README.md, \"Learned policies\") or the experiment's generate kind "
        "\"rl\", then mxctl policy put --file P.json");
  }
  const std::optional<v1::GenerationKind> wire_kind = mxserve::ParseWireName<v1::GenerationKind>(kind);
  if (!wire_kind || *wire_kind == v1::GENERATION_KIND_UNSPECIFIED) {
    return UsageError(absl::StrCat("--kind: expected ", WireNames<v1::GenerationKind>(), ", got '",
                                   kind, "'"));
  }
  request.set_kind(*wire_kind);
  switch (*wire_kind) {
    case v1::GENERATION_KIND_BUDGET:
      if (flags.Has("relative-budget") == flags.Has("budget")) {
        return UsageError("policy generate --kind budget: give --budget or --relative-budget");
      }
      value_flag = flags.Has("budget") ? "budget" : "relative-budget";
      values = flags.Has("budget") ? request.mutable_budgets() : request.mutable_relative_budgets();
      break;
    case v1::GENERATION_KIND_TOLERANCE:
      value_flag = "tolerance";
      values = request.mutable_budgets();
      break;
    default:
      value_flag = "fraction";
      values = request.mutable_fractions();
      break;
  }
  for (const char* flag : {"fraction", "budget", "relative-budget", "tolerance"}) {
    if (flags.Has(flag) && std::string(flag) != value_flag) {
      return UsageError(absl::StrCat("--", flag, ": not a flag of --kind ", kind));
    }
  }
  MX_ASSIGN_OR_RETURN(auto text, flags.Require(value_flag));
  MX_ASSIGN_OR_RETURN(auto parsed, PhaseValues(text, value_flag));
  for (auto& v : parsed) *values->Add() = std::move(v);

  absl::StatusOr<v1::GeneratePolicyResponse> response = client.GeneratePolicy(request);
  if (!response.ok()) return ServerError("Profiles.GeneratePolicy", response.status());

  // The phase × layer table, then the modelled cost of each phase against FP16.
  std::printf("%s policy %s for model %s\n", request.dry_run() ? "generated (dry run)" : "put",
              response->policy().name().c_str(), model.c_str());
  std::fputs(PhaseLayerTable(response->entries(), /*show_rules=*/false).c_str(), stdout);
  std::vector<std::vector<std::string>> costs = {
      {"phase", "J/token", "FP16 J/token", "vs FP16", "s/token", "score", "low layers"}};
  for (const v1::PhaseSummary& p : response->phases()) {
    costs.push_back(
        {std::string(mxserve::WireName(p.phase())), absl::StrFormat("%.4g", p.joules_per_token()),
         absl::StrFormat("%.4g", p.fp16_joules_per_token()),
         p.fp16_joules_per_token() > 0
             ? absl::StrFormat("%.1f%%", 100 * p.joules_per_token() / p.fp16_joules_per_token())
             : "-",
         absl::StrFormat("%.4g", p.seconds_per_token()), absl::StrFormat("%.4g", p.score()),
         request.kind() == v1::GENERATION_KIND_FRACTION
             ? absl::StrCat(p.low_layers(), "/", p.layers())
             : "-"});
  }
  std::printf("modelled cost per token (FPGA model, forward; update: forward + backward)\n");
  std::fputs(FormatTable(costs).c_str(), stdout);
  return absl::OkStatus();
}

}  // namespace mxctl
