// `mxctl policy put|get|list|delete|activate|resolve|generate`: format policies
// on the daemon (Policies service); `resolve` prints the phase × layer table a
// policy gives a model; `generate` (profile_command.cc) makes one from a profile.
#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <nlohmann/json.hpp>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "clients/cpp/cli_status.h"
#include "clients/cpp/commands.h"
#include "clients/cpp/table.h"
#include "clients/cpp/wire_names.h"
#include "mx/status_macros.h"

namespace mxctl {
namespace {

namespace v1 = ::mxserve::v1;

// A policy's description, from its JSON document ("" when absent or unreadable).
std::string Description(const std::string& json) {
  const nlohmann::json doc = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (doc.is_object() && doc.contains("description") && doc["description"].is_string()) {
    return doc["description"].get<std::string>();
  }
  return "";
}

// `policy <verb> NAME` or `--name NAME`.
absl::StatusOr<std::string> NameOperand(Args args, const char* verb) {
  std::optional<std::string> word = TakeWord(args);
  MX_ASSIGN_OR_RETURN(auto flags, Flags::Parse(args, {"name"}));
  if (word && flags.Has("name")) {
    return UsageError(absl::StrCat("policy ", verb, ": give the name once (NAME or --name NAME)"));
  }
  if (word) return *word;
  if (!flags.Has("name")) {
    return UsageError(absl::StrCat("policy ", verb, ": missing the policy name"));
  }
  return *flags.Get("name");
}

absl::Status Put(mxclient::Client& client, const Args& args) {
  MX_ASSIGN_OR_RETURN(auto flags, Flags::Parse(args, {"file"}));
  MX_ASSIGN_OR_RETURN(auto path, flags.Require("file"));
  std::ifstream in(path);
  if (!in) return UsageError(absl::StrCat("--file: cannot read '", path, "'"));
  std::stringstream json;
  json << in.rdbuf();
  absl::StatusOr<v1::PolicyInfo> info = client.PutPolicy(json.str());
  if (!info.ok()) return ServerError("Policies.PutPolicy", info.status());
  std::printf("stored policy %s\n", info->name().c_str());
  return absl::OkStatus();
}

absl::Status List(mxclient::Client& client, const Args& args) {
  MX_RETURN_IF_ERROR(Flags::Parse(args, std::vector<std::string>{}).status());
  absl::StatusOr<v1::ListPoliciesResponse> response = client.ListPolicies();
  if (!response.ok()) return ServerError("Policies.ListPolicies", response.status());
  std::vector<std::vector<std::string>> rows = {{"policy", "kind", "description"}};
  for (const v1::PolicyInfo& policy : response->policies()) {
    rows.push_back(
        {policy.name(), policy.builtin() ? "builtin" : "user", Description(policy.json())});
  }
  std::fputs(FormatTable(rows).c_str(), stdout);
  return absl::OkStatus();
}

absl::Status Activate(mxclient::Client& client, const Args& args) {
  MX_ASSIGN_OR_RETURN(auto flags, Flags::Parse(args, {"model", "policy"}));
  MX_ASSIGN_OR_RETURN(auto model, flags.Require("model"));
  MX_ASSIGN_OR_RETURN(auto policy, flags.Require("policy"));
  absl::StatusOr<std::string> previous = client.SetActivePolicy(model, policy);
  if (!previous.ok()) return ServerError("Policies.SetActivePolicy", previous.status());
  std::printf("model %s: active policy %s (was %s)\n", model.c_str(), policy.c_str(),
              previous->empty() ? "the default" : previous->c_str());
  return absl::OkStatus();
}

absl::Status Resolve(mxclient::Client& client, const Args& args) {
  MX_ASSIGN_OR_RETURN(auto flags, Flags::Parse(args, {"model", "policy"}));
  MX_ASSIGN_OR_RETURN(auto model, flags.Require("model"));
  absl::StatusOr<v1::ResolvePolicyResponse> response =
      client.ResolvePolicy(model, flags.Get("policy").value_or(""));
  if (!response.ok()) return ServerError("Policies.ResolvePolicy", response.status());
  std::printf("model %s, policy %s\n", model.c_str(), response->policy().c_str());
  std::fputs(PhaseLayerTable(response->entries(), /*show_rules=*/true).c_str(), stdout);
  // The phases whose operands a layer call brings are not floor and nearest
  // even: the policy's "scale_rules" and "roundings" (the same for every layer).
  std::set<v1::Phase> said;
  for (const v1::ResolvedFormat& entry : response->entries()) {
    const bool floor = entry.scale_rule() == v1::SCALE_RULE_FLOOR ||
                       entry.scale_rule() == v1::SCALE_RULE_UNSPECIFIED;
    if ((floor && entry.rounding() == v1::ROUNDING_NEAREST_EVEN) ||
        !said.insert(entry.phase()).second) {
      continue;
    }
    std::printf("%s: scale rule %s, rounding %s\n", mxserve::WireName(entry.phase()).c_str(),
                floor ? "floor" : mxserve::WireName(entry.scale_rule()).c_str(),
                mxserve::WireName(entry.rounding()).c_str());
  }
  return absl::OkStatus();
}

}  // namespace

std::string PhaseLayerTable(const google::protobuf::RepeatedPtrField<v1::ResolvedFormat>& entries,
                            bool show_rules) {
  // One row per layer (in the entries' order), one column per phase; a cell
  // names the format and, with `show_rules`, the rule that chose it when a rule
  // rather than the phase default did.
  const v1::Phase phases[] = {v1::PHASE_ROLLOUT, v1::PHASE_REWARD, v1::PHASE_UPDATE};
  std::vector<std::string> layers;
  std::map<std::pair<std::string, int>, std::string> cells;
  for (const v1::ResolvedFormat& entry : entries) {
    std::string cell = mxclient::WireFormatName(entry.format());
    if (show_rules && entry.rule() >= 0) absl::StrAppend(&cell, " (rule ", entry.rule(), ")");
    const bool first_of_layer = std::none_of(phases, std::end(phases), [&](v1::Phase p) {
      return cells.contains({entry.layer(), p});
    });
    if (first_of_layer) layers.push_back(entry.layer());
    cells[{entry.layer(), entry.phase()}] = std::move(cell);
  }
  std::vector<std::vector<std::string>> rows = {{"layer"}};
  for (const v1::Phase phase : phases) rows[0].push_back(mxserve::WireName(phase));
  for (const std::string& layer : layers) {
    std::vector<std::string> row = {layer};
    for (const v1::Phase phase : phases) {
      const auto it = cells.find({layer, phase});
      row.push_back(it == cells.end() ? "-" : it->second);
    }
    rows.push_back(std::move(row));
  }
  return FormatTable(rows);
}

const Subcommands kPolicySubcommands{
    "policy", {"put", "get", "list", "delete", "activate", "resolve", "generate"}};

absl::Status RunPolicy(const RemoteContext& remote, const Args& all_args) {
  Args args = all_args;
  const std::optional<std::string> verb = TakeWord(args);
  if (!verb) return kPolicySubcommands.Missing();
  const auto client = MakeClient(remote);
  if (*verb == "put") return Put(*client, args);
  if (*verb == "list") return List(*client, args);
  if (*verb == "activate") return Activate(*client, args);
  if (*verb == "resolve") return Resolve(*client, args);
  if (*verb == "generate") return RunPolicyGenerate(*client, args);
  if (*verb == "get") {
    MX_ASSIGN_OR_RETURN(auto name, NameOperand(args, "get"));
    absl::StatusOr<v1::PolicyInfo> info = client->GetPolicy(name);
    if (!info.ok()) return ServerError("Policies.GetPolicy", info.status());
    // Pretty-printed when it parses; the daemon's text otherwise.
    const nlohmann::json doc =
        nlohmann::json::parse(info->json(), nullptr, /*allow_exceptions=*/false);
    std::printf("%s\n", doc.is_discarded() ? info->json().c_str() : doc.dump(2).c_str());
    return absl::OkStatus();
  }
  if (*verb == "delete") {
    MX_ASSIGN_OR_RETURN(auto name, NameOperand(args, "delete"));
    const absl::Status status = client->DeletePolicy(name);
    if (!status.ok()) return ServerError("Policies.DeletePolicy", status);
    std::printf("deleted policy %s\n", name.c_str());
    return absl::OkStatus();
  }
  return kPolicySubcommands.Unknown(*verb);
}

}  // namespace mxctl
