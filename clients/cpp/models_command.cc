// `mxctl models list|register|upload|load|publish|describe|delete`: the daemon's
// model registry (Models service) from the command line.
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "clients/cpp/cli_status.h"
#include "clients/cpp/commands.h"
#include "clients/cpp/raw_io.h"
#include "clients/cpp/table.h"
#include "clients/cpp/wire_names.h"
#include "mx/read_file.h"
#include "mx/status_macros.h"

namespace mxctl {
namespace {

namespace v1 = ::mxserve::v1;

std::string FormatModelInfo(const v1::ModelInfo& info) {
  std::string text = FormatKeyValues({
      {"model", info.name()},
      {"owner", info.owner()},
      {"policy", info.policy()},
      {"weight_version", absl::StrCat(info.weight_version())},
      {"staged_tensors", absl::StrCat(info.staged_tensors())},
      {"weight_memory", FormatBytes(info.weight_bytes())},
  });
  std::vector<std::vector<std::string>> rows = {{"layer", "out", "in", "bias", "cached"}};
  for (const v1::LayerInfo& layer : info.layers()) {
    std::vector<std::string> cached;
    for (const int format : layer.cached_formats()) {
      cached.push_back(mxclient::WireFormatName(static_cast<v1::Format>(format)));
    }
    rows.push_back({layer.spec().name(), absl::StrCat(layer.spec().out_features()),
                    absl::StrCat(layer.spec().in_features()), layer.spec().bias() ? "yes" : "no",
                    cached.empty() ? "-" : absl::StrJoin(cached, ",")});
  }
  absl::StrAppend(&text, "\n", FormatTable(rows));
  return text;
}

// "name:OUTxIN" or "name:OUTxIN:bias".
absl::StatusOr<v1::LayerSpec> ParseLayerFlag(const std::string& text) {
  std::vector<std::string> parts = absl::StrSplit(text, ':');
  v1::LayerSpec spec;
  if (parts.size() == 3 && parts[2] == "bias") {
    spec.set_bias(true);
    parts.pop_back();
  }
  const auto bad = [&text] {
    return UsageError(
        absl::StrCat("--layer: expected name:OUTxIN or name:OUTxIN:bias, got '", text, "'"));
  };
  if (parts.size() != 2 || parts[0].empty()) return bad();
  const std::vector<std::string> dims = absl::StrSplit(parts[1], 'x');
  int64_t out = 0, in = 0;
  if (dims.size() != 2 || !absl::SimpleAtoi(dims[0], &out) || !absl::SimpleAtoi(dims[1], &in) ||
      out < 1 || in < 1) {
    return bad();
  }
  spec.set_name(parts[0]);
  spec.set_out_features(out);
  spec.set_in_features(in);
  return spec;
}

// [{"name": ..., "out_features": N, "in_features": K, "bias": false}, ...], bare or
// as {"layers": [...]}.
absl::StatusOr<std::vector<v1::LayerSpec>> ReadLayersJson(const std::string& path) {
  absl::StatusOr<std::string> text = mx::ReadWholeFile(path);
  if (!text.ok()) return UsageError(absl::StrCat("--layers-json: ", text.status().message()));
  nlohmann::json json = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) {
    return UsageError(absl::StrCat("--layers-json: '", path, "' is not valid JSON"));
  }
  if (json.is_object() && json.contains("layers")) json = json["layers"];
  if (!json.is_array()) {
    return UsageError(absl::StrCat("--layers-json: '", path,
                                   "' must hold an array of layers or {\"layers\": [...]}"));
  }
  std::vector<v1::LayerSpec> specs;
  for (size_t i = 0; i < json.size(); ++i) {
    const nlohmann::json& layer = json[i];
    const std::string where = absl::StrCat("--layers-json: layers[", i, "]");
    if (!layer.is_object()) return UsageError(absl::StrCat(where, " is not an object"));
    for (const auto& [key, value] : layer.items()) {
      if (key != "name" && key != "out_features" && key != "in_features" && key != "bias") {
        return UsageError(absl::StrCat(where, ".", key,
                                       ": unknown field; expected name, out_features, "
                                       "in_features, bias"));
      }
    }
    v1::LayerSpec spec;
    if (!layer.contains("name") || !layer["name"].is_string()) {
      return UsageError(absl::StrCat(where, ".name: expected a string"));
    }
    spec.set_name(layer["name"].get<std::string>());
    for (const char* key : {"out_features", "in_features"}) {
      if (!layer.contains(key) || !layer[key].is_number_integer() ||
          layer[key].get<int64_t>() < 1) {
        return UsageError(absl::StrCat(where, ".", key, ": expected an integer >= 1"));
      }
    }
    spec.set_out_features(layer["out_features"].get<int64_t>());
    spec.set_in_features(layer["in_features"].get<int64_t>());
    if (layer.contains("bias")) {
      if (!layer["bias"].is_boolean()) {
        return UsageError(absl::StrCat(where, ".bias: expected true or false"));
      }
      spec.set_bias(layer["bias"].get<bool>());
    }
    specs.push_back(std::move(spec));
  }
  return specs;
}

absl::Status List(mxclient::Client& client, const Args& args) {
  MX_RETURN_IF_ERROR(Flags::Parse(args, std::vector<std::string>{}).status());
  absl::StatusOr<v1::ListModelsResponse> response = client.ListModels();
  if (!response.ok()) return ServerError("Models.ListModels", response.status());
  std::vector<std::vector<std::string>> rows = {
      {"model", "policy", "version", "layers", "staged", "weight_memory", "owner"}};
  for (const v1::ModelInfo& model : response->models()) {
    rows.push_back({model.name(), model.policy(), absl::StrCat(model.weight_version()),
                    absl::StrCat(model.layers_size()), absl::StrCat(model.staged_tensors()),
                    FormatBytes(model.weight_bytes()), model.owner()});
  }
  std::fputs(FormatTable(rows).c_str(), stdout);
  return absl::OkStatus();
}

absl::Status Register(mxclient::Client& client, const Args& args) {
  MX_ASSIGN_OR_RETURN(auto flags,
                      Flags::Parse(args, FlagSpec{.values = {"name", "layers-json", "policy"},
                                                  .repeatable = {"layer"}}));
  v1::RegisterModelRequest request;
  MX_ASSIGN_OR_RETURN(*request.mutable_name(), flags.Require("name"));
  request.set_policy(flags.Get("policy").value_or(""));
  if (flags.Has("layer") == flags.Has("layers-json")) {
    return UsageError(absl::StrCat(
        "give the layers with --layer name:OUTxIN[:bias] (repeatable) or --layers-json FILE",
        flags.Has("layer") ? ", not both" : ""));
  }
  for (const std::string& text : flags.GetAll("layer")) {
    MX_ASSIGN_OR_RETURN(*request.add_layers(), ParseLayerFlag(text));
  }
  if (auto path = flags.Get("layers-json")) {
    MX_ASSIGN_OR_RETURN(auto specs, ReadLayersJson(*path));
    for (auto& spec : specs) *request.add_layers() = std::move(spec);
  }
  absl::StatusOr<v1::ModelInfo> info = client.RegisterModel(request);
  if (!info.ok()) return ServerError("Models.RegisterModel", info.status());
  std::fputs(FormatModelInfo(*info).c_str(), stdout);
  return absl::OkStatus();
}

absl::Status Upload(mxclient::Client& client, const Args& args) {
  MX_ASSIGN_OR_RETURN(auto flags,
                      Flags::Parse(args, FlagSpec{.values = {"model", "layer", "weight", "bias"},
                                                  .switches = {"publish"}}));
  MX_ASSIGN_OR_RETURN(auto model, flags.Require("model"));
  MX_ASSIGN_OR_RETURN(auto layer, flags.Require("layer"));
  MX_ASSIGN_OR_RETURN(auto weight_path, flags.Require("weight"));
  MX_ASSIGN_OR_RETURN(auto weight, ReadFloat32File(weight_path, "--weight"));
  std::vector<float> bias;
  if (auto path = flags.Get("bias")) {
    MX_ASSIGN_OR_RETURN(bias, ReadFloat32File(*path, "--bias"));
  }
  // Check the files against the layer here, where the message can name them.
  absl::StatusOr<v1::ModelInfo> info = client.DescribeModel(model);
  if (!info.ok()) return ServerError("Models.DescribeModel", info.status());
  const v1::LayerSpec* spec = nullptr;
  for (const v1::LayerInfo& l : info->layers()) {
    if (l.spec().name() == layer) spec = &l.spec();
  }
  if (spec == nullptr) {
    return UsageError(absl::StrCat("--layer: model '", model, "' has no layer '", layer, "'"));
  }
  const int64_t weight_count = spec->out_features() * spec->in_features();
  if (static_cast<int64_t>(weight.size()) != weight_count) {
    return UsageError(absl::StrCat(
        "--weight: '", weight_path, "' holds ", weight.size(), " floats, layer '", layer,
        "' needs OUT*IN = ", spec->out_features(), "*", spec->in_features(), " = ", weight_count));
  }
  if (flags.Has("bias") && !spec->bias()) {
    return UsageError(absl::StrCat("--bias: layer '", layer, "' was registered without a bias"));
  }
  if (flags.Has("bias") && static_cast<int64_t>(bias.size()) != spec->out_features()) {
    return UsageError(absl::StrCat("--bias: '", *flags.Get("bias"), "' holds ", bias.size(),
                                   " floats, layer '", layer,
                                   "' needs OUT = ", spec->out_features()));
  }
  std::vector<mxclient::WeightTensor> tensors = {
      {.layer = layer, .role = v1::TENSOR_ROLE_WEIGHT, .values = weight}};
  if (flags.Has("bias")) {
    tensors.push_back({.layer = layer, .role = v1::TENSOR_ROLE_BIAS, .values = bias});
  }
  absl::StatusOr<v1::UploadWeightsResponse> response =
      client.UploadWeights(model, tensors, flags.Switch("publish"));
  if (!response.ok()) return ServerError("Models.UploadWeights", response.status());
  std::printf("model %s: staged %llu tensors (%s)", response->model().c_str(),
              static_cast<unsigned long long>(response->tensors_staged()),
              FormatBytes(response->bytes_received()).c_str());
  if (flags.Switch("publish")) {
    std::printf(", published weight version %llu",
                static_cast<unsigned long long>(response->weight_version()));
  }
  std::printf("\n");
  return absl::OkStatus();
}

absl::Status Load(mxclient::Client& client, const Args& args) {
  MX_ASSIGN_OR_RETURN(auto flags, Flags::Parse(args, FlagSpec{.values = {"model", "path", "prefix"},
                                                              .switches = {"publish"}}));
  v1::LoadSafetensorsRequest request;
  MX_ASSIGN_OR_RETURN(*request.mutable_model(), flags.Require("model"));
  MX_ASSIGN_OR_RETURN(auto path, flags.Require("path"));
  // The daemon opens the file on its own host; a relative path means mxctl's
  // working directory, which the daemon does not share.
  std::error_code error;
  const std::filesystem::path absolute = std::filesystem::absolute(path, error);
  request.set_path(error ? path : absolute.string());
  request.set_prefix(flags.Get("prefix").value_or(""));
  request.set_publish(flags.Switch("publish"));
  absl::StatusOr<v1::UploadWeightsResponse> response = client.LoadSafetensors(request);
  if (!response.ok()) return ServerError("Models.LoadSafetensors", response.status());
  std::printf("model %s: staged %llu tensors (%s) from %s", response->model().c_str(),
              static_cast<unsigned long long>(response->tensors_staged()),
              FormatBytes(response->bytes_received()).c_str(), request.path().c_str());
  if (request.publish()) {
    std::printf(", published weight version %llu",
                static_cast<unsigned long long>(response->weight_version()));
  }
  std::printf("\n");
  return absl::OkStatus();
}

// The model named by `models <verb> M` or `--model M`.
absl::StatusOr<std::string> ModelOperand(Args args, const char* verb) {
  std::optional<std::string> word = TakeWord(args);
  MX_ASSIGN_OR_RETURN(auto flags, Flags::Parse(args, {"model"}));
  if (word && flags.Has("model")) {
    return UsageError(absl::StrCat("models ", verb, ": give the model once (M or --model M)"));
  }
  if (word) return *word;
  absl::StatusOr<std::string> model = flags.Require("model");
  if (!model.ok()) {
    return UsageError(absl::StrCat("models ", verb, ": missing the model (M or --model M)"));
  }
  return model;
}

}  // namespace

const Subcommands kModelsSubcommands{
    "models", {"list", "register", "upload", "load", "publish", "describe", "delete"}};

absl::Status RunModels(const RemoteContext& remote, const Args& all_args) {
  Args args = all_args;
  const std::optional<std::string> verb = TakeWord(args);
  if (!verb) return kModelsSubcommands.Missing();
  // Usage errors before any connection: parse-only checks happen in each verb
  // before its first RPC, and the channel connects lazily.
  const auto client = MakeClient(remote);
  if (*verb == "list") return List(*client, args);
  if (*verb == "register") return Register(*client, args);
  if (*verb == "upload") return Upload(*client, args);
  if (*verb == "load") return Load(*client, args);
  if (*verb == "publish" || *verb == "describe" || *verb == "delete") {
    MX_ASSIGN_OR_RETURN(auto model, ModelOperand(args, verb->c_str()));
    if (*verb == "delete") {
      absl::StatusOr<v1::DeleteModelResponse> response = client->DeleteModel(model);
      if (!response.ok()) return ServerError("Models.DeleteModel", response.status());
      std::printf("deleted model %s, freed %s\n", model.c_str(),
                  FormatBytes(response->freed_bytes()).c_str());
      return absl::OkStatus();
    }
    absl::StatusOr<v1::ModelInfo> info =
        *verb == "publish" ? client->PublishVersion(model) : client->DescribeModel(model);
    if (!info.ok()) {
      return ServerError(*verb == "publish" ? "Models.PublishVersion" : "Models.DescribeModel",
                         info.status());
    }
    std::fputs(FormatModelInfo(*info).c_str(), stdout);
    return absl::OkStatus();
  }
  return kModelsSubcommands.Unknown(*verb);
}

}  // namespace mxctl
