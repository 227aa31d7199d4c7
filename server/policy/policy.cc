#include "server/policy/policy.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "mx/status_macros.h"
#include "server/base/quote.h"
#include "server/base/strict_json.h"
#include "server/policy/glob.h"

namespace mxserve {
namespace {

using Json = nlohmann::json;

constexpr absl::string_view kLayerClassForms =
    "@sensitive, @tolerant, @sensitive:F or @tolerant:F with F a fraction in (0, 1]";

absl::Status FieldError(absl::string_view field, absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat("policy.", field, ": ", problem));
}

// Names used as policy identifiers: non-empty, [A-Za-z0-9._-], at most 128.
bool IsValidName(absl::string_view name) {
  if (name.empty() || name.size() > 128) return false;
  for (char c : name) {
    if (!(absl::ascii_isalnum(c) || c == '.' || c == '_' || c == '-')) return false;
  }
  return true;
}

absl::StatusOr<std::string> StringField(const Json& object, const std::string& key,
                                        const std::string& field, bool required) {
  const auto it = object.find(key);
  if (it == object.end()) {
    if (required) return FieldError(field, "missing");
    return std::string();
  }
  if (!it->is_string()) return FieldError(field, "expected a string");
  return it->get<std::string>();
}

absl::StatusOr<mx::Format> FormatField(const Json& value, const std::string& field) {
  if (!value.is_string()) return FieldError(field, "expected a format name (a string)");
  const std::string name = value.get<std::string>();
  // Format names are short: a long one is answered without repeating it whole.
  constexpr size_t kLongestFormatName = 32;
  if (name.size() > kLongestFormatName) {
    return FieldError(field, absl::StrCat("unknown format ", Quote(name), "; expected one of ",
                                          mx::FormatNameList()));
  }
  absl::StatusOr<mx::Format> format = mx::ParseFormat(name);
  if (!format.ok()) return FieldError(field, format.status().message());
  return format;
}

absl::Status CheckKeys(const Json& object, std::initializer_list<absl::string_view> allowed,
                       const std::string& field) {
  for (const auto& [key, value] : object.items()) {
    if (std::find(allowed.begin(), allowed.end(), key) == allowed.end()) {
      return FieldError(field.empty() ? Shorten(key) : absl::StrCat(field, ".", Shorten(key)),
                        "unknown field");
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<PolicyRule> ParseRule(const Json& value, const std::string& field) {
  if (!value.is_object()) return FieldError(field, "expected an object");
  MX_RETURN_IF_ERROR(CheckKeys(value, {"phase", "layers", "format"}, field));
  PolicyRule rule;
  MX_ASSIGN_OR_RETURN(const std::string phase, StringField(value, "phase", field + ".phase", true));
  if (phase != "*") {
    absl::StatusOr<Phase> parsed = ParsePhase(phase);
    if (!parsed.ok())
      return FieldError(field + ".phase", absl::StrCat(parsed.status().message(), " or *"));
    rule.phase = *parsed;
  }
  MX_ASSIGN_OR_RETURN(rule.layers, StringField(value, "layers", field + ".layers", true));
  if (rule.layers.empty() || rule.layers.size() > kMaxPolicyGlobChars) {
    return FieldError(field + ".layers",
                      absl::StrCat("expected a glob of 1-", kMaxPolicyGlobChars,
                                   " characters or a layer class (", kLayerClassForms, ")"));
  }
  if (rule.layers[0] == '@') {
    if (absl::Status s = ParseLayerClass(rule.layers).status(); !s.ok()) {
      return FieldError(field + ".layers", s.message());
    }
  }
  if (!value.contains("format")) return FieldError(field + ".format", "missing");
  MX_ASSIGN_OR_RETURN(rule.format, FormatField(value["format"], field + ".format"));
  return rule;
}

}  // namespace

absl::StatusOr<LayerClass> ParseLayerClass(absl::string_view text) {
  LayerClass out;
  absl::string_view rest = text;
  out.tolerant = absl::ConsumePrefix(&rest, kTolerantLayers);
  if (!out.tolerant && !absl::ConsumePrefix(&rest, kSensitiveLayers)) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown layer class ", Quote(text), "; expected ", kLayerClassForms));
  }
  if (rest.empty()) {
    out.complement = out.tolerant;  // bare "@tolerant": the complement of bare "@sensitive"
    return out;
  }
  if (rest[0] != ':') {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown layer class ", Quote(text), "; expected ", kLayerClassForms));
  }
  rest.remove_prefix(1);
  // Plain decimals only ("0.8", ".25", "1"): no signs, exponents, "nan" or
  // spaces, so a rule reads the same to every client that writes it.
  const bool digits_and_one_dot =
      !rest.empty() && rest.size() <= 20 && std::count(rest.begin(), rest.end(), '.') <= 1 &&
      std::all_of(rest.begin(), rest.end(),
                  [](char c) { return absl::ascii_isdigit(c) || c == '.'; }) &&
      std::any_of(rest.begin(), rest.end(), [](char c) { return absl::ascii_isdigit(c); });
  double fraction = 0;
  if (!digits_and_one_dot || !absl::SimpleAtod(rest, &fraction)) {
    return absl::InvalidArgumentError(
        absl::StrCat("layer class ", Quote(text), ": expected a decimal fraction in (0, 1] after ",
                     out.tolerant ? kTolerantLayers : kSensitiveLayers, ":, e.g. ",
                     out.tolerant ? kTolerantLayers : kSensitiveLayers, ":0.8"));
  }
  if (!(fraction > 0 && fraction <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "layer class ", Quote(text), ": the fraction must be in (0, 1], got ", fraction));
  }
  out.fraction = fraction;
  return out;
}

uint32_t SelectedLayers(double fraction, uint32_t layers) {
  const long selected = std::lround(fraction * static_cast<double>(layers));
  return static_cast<uint32_t>(std::clamp<long>(selected, 0, static_cast<long>(layers)));
}

bool InLayerClass(const LayerClass& layer_class, LayerTolerance tolerance) {
  const uint32_t n = tolerance.layers;
  const uint32_t selected = SelectedLayers(layer_class.fraction, n);
  // Sensitive: the last `selected` ranks; tolerant: the first `selected`.
  const bool in_sensitive_tail = uint64_t{tolerance.rank} + selected >= n;
  if (layer_class.complement) return !in_sensitive_tail;
  return layer_class.tolerant ? tolerance.rank < selected : in_sensitive_tail;
}

// An optional object of phase: value (the document's "scale_rules" and
// "roundings"), each value a name `parse` reads, into `out` by phase.
template <typename T, typename Parse>
absl::Status PerPhaseField(const Json& json, const std::string& name, absl::string_view what,
                           Parse parse, std::array<T, 3>& out) {
  const auto object = json.find(name);
  if (object == json.end()) return absl::OkStatus();
  if (!object->is_object()) {
    return FieldError(name, absl::StrCat("expected an object of phase: ", what));
  }
  for (const auto& [key, value] : object->items()) {
    const std::string field = name + "." + Shorten(key);
    absl::StatusOr<Phase> phase = ParsePhase(key);
    if (!phase.ok()) return FieldError(field, phase.status().message());
    if (!value.is_string()) {
      return FieldError(field, absl::StrCat("expected a ", what, " name (a string)"));
    }
    absl::StatusOr<T> parsed = parse(value.template get<std::string>());
    if (!parsed.ok()) return FieldError(field, parsed.status().message());
    out[static_cast<size_t>(*phase)] = *parsed;
  }
  return absl::OkStatus();
}

absl::StatusOr<Policy> ParsePolicyJson(absl::string_view text) {
  if (text.size() > kMaxPolicyBytes) {
    return absl::InvalidArgumentError(absl::StrCat("policy: the document has ", text.size(),
                                                   " bytes; at most ", kMaxPolicyBytes,
                                                   " are accepted"));
  }
  std::string repeated, syntax;
  const Json json = ParseJsonRefusingRepeats(text, &repeated, &syntax);
  if (json.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrCat("policy: not valid JSON: ", syntax));
  }
  if (!repeated.empty()) {
    return FieldError(repeated, "given twice; each key may appear once in its object");
  }
  if (!json.is_object()) return absl::InvalidArgumentError("policy: expected a JSON object");
  MX_RETURN_IF_ERROR(
      CheckKeys(json, {"name", "description", "defaults", "rules", "scale_rules", "roundings"},
                ""));

  Policy policy;
  MX_ASSIGN_OR_RETURN(policy.name, StringField(json, "name", "name", true));
  if (!IsValidName(policy.name)) {
    return FieldError("name", absl::StrCat("expected 1-128 characters of [A-Za-z0-9._-], got ",
                                           Quote(policy.name)));
  }
  MX_ASSIGN_OR_RETURN(policy.description, StringField(json, "description", "description", false));

  const auto defaults = json.find("defaults");
  if (defaults == json.end()) return FieldError("defaults", "missing (a format per phase)");
  if (!defaults->is_object()) return FieldError("defaults", "expected an object of phase: format");
  std::array<bool, 3> seen{};
  for (const auto& [key, value] : defaults->items()) {
    absl::StatusOr<Phase> phase = ParsePhase(key);
    if (!phase.ok()) return FieldError("defaults." + Shorten(key), phase.status().message());
    const size_t index = static_cast<size_t>(*phase);
    MX_ASSIGN_OR_RETURN(policy.defaults[index], FormatField(value, "defaults." + key));
    seen[index] = true;
  }
  for (Phase phase : kAllPhases) {
    if (!seen[static_cast<size_t>(phase)]) {
      return FieldError(absl::StrCat("defaults.", PhaseName(phase)), "missing");
    }
  }

  MX_RETURN_IF_ERROR(PerPhaseField(json, "scale_rules", "scale rule", mx::ParseScaleRule,
                                   policy.scale_rules));
  MX_RETURN_IF_ERROR(
      PerPhaseField(json, "roundings", "rounding", mx::ParseRounding, policy.roundings));

  if (const auto rules = json.find("rules"); rules != json.end()) {
    if (!rules->is_array()) return FieldError("rules", "expected an array");
    if (rules->size() > kMaxPolicyRules) {
      return FieldError("rules", absl::StrCat("expected at most ", kMaxPolicyRules, " rules, got ",
                                              rules->size()));
    }
    for (size_t i = 0; i < rules->size(); ++i) {
      MX_ASSIGN_OR_RETURN(PolicyRule rule, ParseRule((*rules)[i], absl::StrCat("rules[", i, "]")));
      policy.rules.push_back(std::move(rule));
    }
  }
  return policy;
}

std::string PolicyToJson(const Policy& policy) {
  Json json;
  json["name"] = policy.name;
  json["description"] = policy.description;
  for (Phase phase : kAllPhases) {
    json["defaults"][std::string(PhaseName(phase))] =
        std::string(mx::FormatName(policy.defaults[static_cast<size_t>(phase)]));
  }
  json["rules"] = Json::array();
  for (const PolicyRule& rule : policy.rules) {
    json["rules"].push_back({{"phase", rule.phase ? std::string(PhaseName(*rule.phase)) : "*"},
                             {"layers", rule.layers},
                             {"format", std::string(mx::FormatName(rule.format))}});
  }
  for (Phase phase : kAllPhases) {
    const size_t index = static_cast<size_t>(phase);
    if (policy.scale_rules[index] != mx::ScaleRule::kFloor) {
      json["scale_rules"][std::string(PhaseName(phase))] =
          std::string(mx::ScaleRuleName(policy.scale_rules[index]));
    }
    if (policy.roundings[index] != mx::Rounding::kNearestEven) {
      json["roundings"][std::string(PhaseName(phase))] =
          std::string(mx::RoundingName(policy.roundings[index]));
    }
  }
  return json.dump(2);
}

ResolvedFormat Resolve(const Policy& policy, Phase phase, absl::string_view layer,
                       LayerTolerance tolerance) {
  for (size_t i = 0; i < policy.rules.size(); ++i) {
    const PolicyRule& rule = policy.rules[i];
    if (rule.phase && *rule.phase != phase) continue;
    bool matches = false;
    if (!rule.layers.empty() && rule.layers[0] == '@') {
      // Parsed again on every resolve (a few characters) so that a Policy built
      // in code, like the presets, needs nothing but its strings. A class that
      // does not parse (only possible for a policy that skipped
      // ParsePolicyJson) matches nothing.
      const absl::StatusOr<LayerClass> layer_class = ParseLayerClass(rule.layers);
      matches = layer_class.ok() && InLayerClass(*layer_class, tolerance);
    } else {
      matches = GlobMatch(rule.layers, layer);
    }
    if (matches) return {rule.format, static_cast<int>(i)};
  }
  return {policy.defaults[static_cast<size_t>(phase)], -1};
}

}  // namespace mxserve
