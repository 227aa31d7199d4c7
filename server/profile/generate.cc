#include "server/profile/generate.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "mx/status_macros.h"
#include "server/base/quote.h"
#include "server/policy/glob.h"
#include "server/policy/layer_sensitivity.h"
#include "server/profile/knapsack.h"

namespace mxserve {

const char* MetricName(CostMetric metric) {
  switch (metric) {
    case CostMetric::kEnergy:
      return "energy";
    case CostMetric::kTime:
      return "time";
    case CostMetric::kBits:
      return "bits";
  }
  return "?";
}

const char* KindName(GenerationKind kind) {
  switch (kind) {
    case GenerationKind::kFraction:
      return "fraction";
    case GenerationKind::kBudget:
      return "budget";
    case GenerationKind::kTolerance:
      return "tolerance";
  }
  return "?";
}

const char* ScoreName(ScoreKind score) {
  switch (score) {
    case ScoreKind::kAuto:
      return "auto";
    case ScoreKind::kRelError:
      return "rel_error";
    case ScoreKind::kFisher:
      return "fisher";
    case ScoreKind::kMse:
      return "mse";
  }
  return "?";
}

namespace {

// A bound to print in an error that suggests it: six significant digits, rounded
// up (with 1e-9 of room for a different summation order), so that pasting the
// number back is feasible. StrCat's six digits round to nearest, often below.
std::string PasteableBound(double v) {
  if (!std::isfinite(v) || v == 0) return absl::StrCat(v);
  const double target = v + std::abs(v) * 1e-9;
  const std::string nearest = absl::StrFormat("%.6g", target);
  if (std::strtod(nearest.c_str(), nullptr) >= target) return nearest;
  const double unit = std::pow(10.0, std::floor(std::log10(std::abs(target))) - 5);
  return absl::StrFormat("%.6g", target + unit);
}

std::string FormatList(const std::vector<mx::Format>& formats) {
  return absl::StrJoin(formats, ", ", [](std::string* out, mx::Format f) {
    absl::StrAppend(out, mx::FormatName(f));
  });
}

const char* MetricUnit(CostMetric metric) {
  switch (metric) {
    case CostMetric::kEnergy:
      return "J/token";
    case CostMetric::kTime:
      return "s/token";
    case CostMetric::kBits:
      return "bits";
  }
  return "";
}

// The phase's cost of one layer in one format under `metric`.
double PhaseCost(Phase phase, CostMetric metric, const LayerCost& c) {
  const bool train = phase == Phase::kUpdate;
  switch (metric) {
    case CostMetric::kEnergy:
      return train ? c.train_joules_per_token : c.joules_per_token;
    case CostMetric::kTime:
      return train ? c.train_seconds_per_token : c.seconds_per_token;
    case CostMetric::kBits:
      return c.weight_bits;
  }
  return 0;
}

// What kAuto ranks by: Fisher scores when every layer has them.
ScoreKind AutoScore(const Profile& profile) {
  return profile.source == ProfileSource::kGradients ? ScoreKind::kFisher : ScoreKind::kRelError;
}

// Everything the generator reads from the spec, checked.
struct Plan {
  std::vector<Phase> phases;
  std::array<double, 3> value{};  // per generated phase
  std::array<std::string, 3> field;
  ScoreKind score = ScoreKind::kRelError;  // resolved: never kAuto
  std::vector<int> candidates;             // profile format indices
  int low = -1;                            // fraction: profile format index
};

// INVALID_ARGUMENT when `field` is set for a kind that does not take it.
absl::Status CheckOnly(bool present, GenerationKind kind, absl::string_view field,
                       absl::string_view takers) {
  if (!present) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": only ", takers, " it; this is kind ", KindName(kind)));
}

absl::StatusOr<int> ProfiledFormat(const Profile& profile, mx::Format format,
                                   absl::string_view field) {
  const int index = profile.FormatIndex(format);
  if (index >= 0) return index;
  return absl::InvalidArgumentError(absl::StrCat(
      field, ": ", mx::FormatName(format), " is not in the profile of model ", Quote(profile.model),
      " version ", profile.weight_version, " (profiled: ", FormatList(profile.formats), ")"));
}

absl::StatusOr<Plan> Check(const Profile& profile, const GenerationSpec& spec) {
  Plan plan;
  const bool fraction = spec.kind == GenerationKind::kFraction;
  MX_RETURN_IF_ERROR(
      CheckOnly(!fraction && spec.low.has_value(), spec.kind, "low", "the fraction kind takes"));
  MX_RETURN_IF_ERROR(CheckOnly(fraction && !spec.candidates.empty(), spec.kind, "candidates",
                               "the budget and tolerance kinds take"));
  MX_RETURN_IF_ERROR(CheckOnly(fraction && !spec.groups.empty(), spec.kind, "groups",
                               "the budget and tolerance kinds take"));
  MX_RETURN_IF_ERROR(CheckOnly(spec.relative && spec.kind != GenerationKind::kBudget, spec.kind,
                               "relative_budgets", "the budget kind takes"));

  // Phases: as listed, else those the values name, else all three.
  std::set<Phase> seen;
  for (size_t i = 0; i < spec.phases.size(); ++i) {
    if (!seen.insert(spec.phases[i]).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("phases[", i, "]: ", PhaseName(spec.phases[i]), " named twice"));
    }
    plan.phases.push_back(spec.phases[i]);
  }
  if (plan.phases.empty()) {
    for (const auto& v : spec.values) {
      if (v.phase && seen.insert(*v.phase).second) plan.phases.push_back(*v.phase);
    }
    if (plan.phases.empty()) plan.phases.assign(kAllPhases.begin(), kAllPhases.end());
    std::sort(plan.phases.begin(), plan.phases.end());
  }

  // One value per generated phase: its own, else the one without a phase.
  std::array<const GenerationSpec::Value*, 3> own{};
  const GenerationSpec::Value* shared = nullptr;
  for (const auto& v : spec.values) {
    if (!std::isfinite(v.value) || v.value < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(v.field, ".value: expected a finite value >= 0, got ", v.value));
    }
    if (fraction && v.value > 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(v.field, ".value: expected a fraction in [0, 1], got ", v.value));
    }
    const GenerationSpec::Value*& slot = v.phase ? own[static_cast<int>(*v.phase)] : shared;
    if (slot != nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(v.field, ".phase: ", v.phase ? PhaseName(*v.phase) : "every phase",
                       " already has a value (", slot->field, ")"));
    }
    if (v.phase &&
        std::find(plan.phases.begin(), plan.phases.end(), *v.phase) == plan.phases.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          v.field, ".phase: ", PhaseName(*v.phase), " is not generated (phases: ",
          absl::StrJoin(plan.phases, ", ",
                        [](std::string* out, Phase p) { absl::StrAppend(out, PhaseName(p)); }),
          ")"));
    }
    slot = &v;
  }
  for (Phase phase : plan.phases) {
    const GenerationSpec::Value* v = own[static_cast<int>(phase)];
    if (v == nullptr) v = shared;
    if (v == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(spec.values_field, ": no value for phase ", PhaseName(phase),
                       "; give one per generated phase, or one without a phase for all of them"));
    }
    plan.value[static_cast<int>(phase)] = v->value;
    plan.field[static_cast<int>(phase)] = v->field;
  }

  // The score.
  // A gradients profile is exactly one whose every layer has Fisher scores.
  const bool all_fisher = profile.source == ProfileSource::kGradients;
  plan.score = spec.score;
  if (spec.score == ScoreKind::kAuto) {
    plan.score = AutoScore(profile);
  } else if (spec.score == ScoreKind::kFisher && !all_fisher) {
    return absl::FailedPreconditionError(absl::StrCat(
        "score: the profile of model ", Quote(profile.model), " version ", profile.weight_version,
        " has no Fisher scores (source ", SourceName(profile.source),
        "); profile with output gradients, or rank by rel_error"));
  }

  // Formats.
  if (fraction) {
    if (!spec.low) return absl::InvalidArgumentError("low: the fraction kind needs a low format");
    MX_ASSIGN_OR_RETURN(plan.low, ProfiledFormat(profile, *spec.low, "low"));
  } else if (spec.candidates.empty()) {
    plan.candidates.resize(profile.formats.size());
    std::iota(plan.candidates.begin(), plan.candidates.end(), 0);
  } else {
    for (size_t i = 0; i < spec.candidates.size(); ++i) {
      MX_ASSIGN_OR_RETURN(int index, ProfiledFormat(profile, spec.candidates[i],
                                                    absl::StrCat("candidates[", i, "]")));
      if (std::find(plan.candidates.begin(), plan.candidates.end(), index) !=
          plan.candidates.end()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "candidates[", i, "]: ", mx::FormatName(spec.candidates[i]), " named twice"));
      }
      plan.candidates.push_back(index);
    }
  }
  if (spec.groups.size() > kMaxGenerationGroups) {
    return absl::InvalidArgumentError(absl::StrCat("groups: at most ", kMaxGenerationGroups,
                                                   " groups, got ", spec.groups.size()));
  }
  for (size_t i = 0; i < spec.groups.size(); ++i) {
    for (absl::string_view glob : absl::StrSplit(spec.groups[i], '|')) {
      if (glob.empty() || glob.size() > kMaxPolicyGlobChars) {
        return absl::InvalidArgumentError(
            absl::StrCat("groups[", i, "]: expected globs of 1 to ", kMaxPolicyGlobChars,
                         " characters separated by '|', got ", Quote(spec.groups[i])));
      }
    }
  }
  return plan;
}

double ScoreOf(const FormatScore& s, ScoreKind kind) {
  switch (kind) {
    case ScoreKind::kFisher:
      return s.fisher;
    case ScoreKind::kMse:
      return s.rel_error * s.rel_error;
    case ScoreKind::kAuto:
    case ScoreKind::kRelError:
      break;
  }
  return s.rel_error;
}

// The layers (indices into the profile) that share a format: one item each.
std::vector<std::vector<int>> Items(const Profile& profile,
                                    const std::vector<std::string>& groups) {
  std::vector<std::vector<int>> items;
  std::map<std::pair<size_t, int>, size_t> grouped;  // (group, block) → item
  for (size_t i = 0; i < profile.layers.size(); ++i) {
    const std::string& name = profile.layers[i].layer;
    size_t group = groups.size();
    for (size_t g = 0; g < groups.size() && group == groups.size(); ++g) {
      for (absl::string_view glob : absl::StrSplit(groups[g], '|')) {
        if (GlobMatch(glob, name)) {
          group = g;
          break;
        }
      }
    }
    if (group == groups.size()) {
      items.push_back({static_cast<int>(i)});
      continue;
    }
    auto [it, fresh] = grouped.try_emplace({group, BlockIndex(name)}, items.size());
    if (fresh) items.emplace_back();
    items[it->second].push_back(static_cast<int>(i));
  }
  return items;
}

// Budget and tolerance: the knapsack over `items`, in candidate indices.
absl::StatusOr<std::vector<int>> Solve(const Profile& profile, const GenerationSpec& spec,
                                       const Plan& plan, Phase phase, double bound,
                                       const std::vector<std::vector<int>>& items) {
  std::vector<KnapsackItem> knapsack(items.size());
  std::vector<std::vector<int>> choice_format(items.size());  // choice → profile format
  double cheapest = 0, best = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    for (int f : plan.candidates) {
      double cost = 0, score = 0;
      for (int layer : items[i]) {
        const FormatScore& s = profile.layers[layer].scores[f];
        cost += PhaseCost(phase, spec.metric, s.cost);
        score += ScoreOf(s, plan.score);
      }
      if (!std::isfinite(cost) || !std::isfinite(score)) continue;  // not a usable choice
      knapsack[i].cost.push_back(cost);
      knapsack[i].score.push_back(score);
      choice_format[i].push_back(f);
    }
    if (knapsack[i].cost.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("candidates: no candidate format has a finite cost and score for layer ",
                       Quote(profile.layers[items[i].front()].layer)));
    }
    cheapest += *std::min_element(knapsack[i].cost.begin(), knapsack[i].cost.end());
    best += *std::min_element(knapsack[i].score.begin(), knapsack[i].score.end());
  }
  const std::string& field = plan.field[static_cast<int>(phase)];
  absl::StatusOr<std::optional<KnapsackSolution>> solution =
      spec.kind == GenerationKind::kBudget ? MinScoreWithinBudget(knapsack, bound)
                                           : MinCostWithinScore(knapsack, bound);
  if (!solution.ok()) return solution.status();
  if (!solution->has_value()) {
    if (spec.kind == GenerationKind::kBudget) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".value: the ", PhaseName(phase), " budget of ", bound, " ",
          MetricUnit(spec.metric), " is below the cheapest feasible budget, ",
          PasteableBound(cheapest), " ",
          MetricUnit(spec.metric), " (every layer in its cheapest candidate)"));
    }
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".value: no assignment keeps the ", PhaseName(phase), " summed ",
                     ScoreName(plan.score), " at or under ", bound, "; the least achievable is ",
                     PasteableBound(best), " (every layer in its best candidate)"));
  }
  std::vector<int> formats(profile.layers.size());
  for (size_t i = 0; i < items.size(); ++i) {
    const int f = choice_format[i][(**solution).choice[i]];
    for (int layer : items[i]) formats[layer] = f;
  }
  return formats;
}

// The phase's default: `high` unless every layer of the model is profiled, then
// its most common format (fewest rules).
mx::Format DefaultFormat(const std::vector<mx::Format>& formats, bool covers_model,
                         mx::Format high) {
  if (!covers_model || formats.empty()) return high;
  std::map<mx::Format, size_t> count;
  for (mx::Format f : formats) ++count[f];
  mx::Format best = high;
  size_t best_count = count.count(high) ? count[high] : 0;
  for (const auto& [f, n] : count) {
    if (n > best_count) {
      best = f;
      best_count = n;
    }
  }
  return best;
}

}  // namespace

std::vector<int> ToleranceOrder(const Profile& profile, int format, ScoreKind score) {
  if (score == ScoreKind::kAuto) score = AutoScore(profile);
  std::vector<double> key(profile.layers.size());
  for (size_t i = 0; i < key.size(); ++i) {
    const double s = ScoreOf(profile.layers[i].scores[format], score);
    // NaN would break the sort's ordering; an unmeasurable layer is not tolerant.
    key[i] = std::isnan(s) ? HUGE_VAL : s;
  }
  std::vector<int> order(profile.layers.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return key[a] < key[b]; });
  return order;
}

std::vector<std::string> ProfileToleranceOrder(const Profile& profile) {
  if (profile.formats.empty() || profile.layers.empty()) return {};
  int format = profile.FormatIndex(mx::Format::kMxfp4E2m1);
  if (format < 0) {
    format = 0;
    for (size_t i = 1; i < profile.formats.size(); ++i) {
      if (mx::Traits(profile.formats[i]).element_bits <
          mx::Traits(profile.formats[format]).element_bits) {
        format = static_cast<int>(i);
      }
    }
  }
  std::vector<std::string> names;
  names.reserve(profile.layers.size());
  for (int i : ToleranceOrder(profile, format, ScoreKind::kAuto)) {
    names.push_back(profile.layers[i].layer);
  }
  return names;
}

absl::StatusOr<GeneratedPolicy> GeneratePolicy(const Profile& profile,
                                               const std::vector<std::string>& model_layers,
                                               const fpga_model::EnergyModelParams& energy,
                                               const GenerationSpec& spec) {
  // A NaN score has no place in any ranking; such a profile (made before
  // ProfileModel refused overflowing batches) is refused whole (issue 32, item 8).
  for (const LayerProfile& layer : profile.layers) {
    for (const FormatScore& score : layer.scores) {
      if (std::isnan(score.rel_error) || std::isnan(score.sqnr_db) || std::isnan(score.fisher)) {
        return absl::FailedPreconditionError(absl::StrCat(
            "the profile of model ", Quote(profile.model), " (weight version ",
            profile.weight_version, ") holds a NaN score (layer ", Quote(layer.layer), ", ",
            mx::FormatName(score.format), "); profile the model again"));
      }
    }
  }
  MX_ASSIGN_OR_RETURN(const Plan plan, Check(profile, spec));
  const size_t layers = profile.layers.size();
  std::set<std::string, std::less<>> profiled;
  for (const LayerProfile& l : profile.layers) profiled.insert(l.layer);
  const bool covers_model = std::all_of(model_layers.begin(), model_layers.end(),
                                        [&](const std::string& n) { return profiled.count(n); });
  // A group glob that matches nothing is a mistake, not a no-op (issue 32, item 6:
  // "[qkv]" reads as a character class, which globs do not have, and matched
  // nothing, so q, k and v silently got formats of their own).
  for (size_t g = 0; g < spec.groups.size(); ++g) {
    for (absl::string_view glob : absl::StrSplit(spec.groups[g], '|')) {
      const bool matches =
          std::any_of(profile.layers.begin(), profile.layers.end(),
                      [&](const LayerProfile& l) { return GlobMatch(glob, l.layer); });
      if (!matches) {
        return absl::InvalidArgumentError(absl::StrCat(
            "groups[", g, "]: ", Quote(glob), " matches no profiled layer (globs have '*' and "
            "'?' only, no character classes: write \"*.q_proj|*.k_proj\", not \"*.[qk]_proj\")"));
      }
    }
  }
  const std::vector<std::vector<int>> items = Items(profile, spec.groups);

  GeneratedPolicy out;
  out.policy.name = spec.name;
  std::vector<std::string> how;
  for (Phase phase : kAllPhases) {
    PhasePlan& p = out.phases[static_cast<int>(phase)];
    p.phase = phase;
    p.generated = std::find(plan.phases.begin(), plan.phases.end(), phase) != plan.phases.end();
    p.formats.assign(layers, spec.high);
    const double value = plan.value[static_cast<int>(phase)];
    if (p.generated && spec.kind == GenerationKind::kFraction) {
      const std::vector<int> order = ToleranceOrder(profile, plan.low, plan.score);
      p.low_layers = static_cast<uint32_t>(std::lround(value * static_cast<double>(layers)));
      for (uint32_t i = 0; i < p.low_layers; ++i) p.formats[order[i]] = *spec.low;
      how.push_back(absl::StrCat(
          PhaseName(phase), ": ", p.low_layers, " of ", layers, " layers (", value * 100,
          "%, least sensitive by ", ScoreName(plan.score), " in ", mx::FormatName(*spec.low),
          ") in ", mx::FormatName(*spec.low), ", the rest ", mx::FormatName(spec.high)));
    } else if (p.generated) {
      double bound = value;
      if (spec.relative) {
        double high_cost = 0;
        for (const LayerProfile& l : profile.layers) {
          high_cost += PhaseCost(
              phase, spec.metric,
              CostOf(energy, spec.high, l.out_features, l.in_features, profile.batch_tokens));
        }
        bound = value * high_cost;
      }
      p.budget = bound;
      MX_ASSIGN_OR_RETURN(std::vector<int> chosen, Solve(profile, spec, plan, phase, bound, items));
      for (size_t i = 0; i < layers; ++i) p.formats[i] = profile.formats[chosen[i]];
      how.push_back(absl::StrCat(
          PhaseName(phase), ": ",
          spec.kind == GenerationKind::kBudget
              ? absl::StrCat(
                    "least summed ", ScoreName(plan.score), " with ",
                    spec.metric == CostMetric::kBits ? "weight bits" : MetricUnit(spec.metric),
                    " <= ", bound,
                    spec.relative
                        ? absl::StrCat(" (", value, " of all-", mx::FormatName(spec.high), ")")
                        : "")
              : absl::StrCat("least ", MetricUnit(spec.metric), " with summed ",
                             ScoreName(plan.score), " <= ", bound)));
    } else {
      how.push_back(absl::StrCat(PhaseName(phase), ": every layer ", mx::FormatName(spec.high)));
    }

    // The plan's figures, from the profile's columns.
    for (size_t i = 0; i < layers; ++i) {
      const LayerProfile& l = profile.layers[i];
      const LayerCost fp16 =
          CostOf(energy, mx::Format::kFp16, l.out_features, l.in_features, profile.batch_tokens);
      p.fp16_joules_per_token += PhaseCost(phase, CostMetric::kEnergy, fp16);
      p.fp16_seconds_per_token += PhaseCost(phase, CostMetric::kTime, fp16);
      const int f = profile.FormatIndex(p.formats[i]);
      const LayerCost cost = f >= 0 ? l.scores[f].cost
                                    : CostOf(energy, p.formats[i], l.out_features, l.in_features,
                                             profile.batch_tokens);
      p.joules_per_token += PhaseCost(phase, CostMetric::kEnergy, cost);
      p.seconds_per_token += PhaseCost(phase, CostMetric::kTime, cost);
      p.weight_bits += cost.weight_bits;
      if (f >= 0) p.score += ScoreOf(l.scores[f], plan.score);
    }

    // The policy: a default per phase and a rule per layer that leaves it.
    const mx::Format fallback = DefaultFormat(p.formats, covers_model, spec.high);
    out.policy.defaults[static_cast<int>(phase)] = p.generated ? fallback : spec.high;
    for (size_t i = 0; i < layers && p.generated; ++i) {
      if (p.formats[i] == fallback) continue;
      out.policy.rules.push_back(PolicyRule{
          .phase = phase, .layers = GlobEscape(profile.layers[i].layer), .format = p.formats[i]});
    }
  }
  if (out.policy.rules.size() > kMaxPolicyRules) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the generated policy needs ", out.policy.rules.size(), " rules, more than the ",
        kMaxPolicyRules, " a policy may have; generate fewer phases or profile fewer layers"));
  }
  out.policy.description = absl::StrCat(
      spec.description, spec.description.empty() ? "" : " ", "Generated by mxserved (kind ",
      KindName(spec.kind), ", score ", ScoreName(plan.score), ") from the ",
      SourceName(profile.source), " profile of model ", profile.model, " version ",
      profile.weight_version, " (", layers, " layers, ", profile.tokens, " calibration tokens). ",
      absl::StrJoin(how, "; "), ".");
  return out;
}

}  // namespace mxserve
