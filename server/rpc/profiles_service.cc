#include "server/rpc/profiles_service.h"

#include <algorithm>
#include <memory>
#include <set>

#include "absl/strings/str_cat.h"
#include "mx/status_macros.h"
#include "server/base/mutex.h"
#include "server/base/quote.h"
#include "server/compute/wire.h"
#include "server/profile/generate.h"
#include "server/profile/profiler.h"
#include "server/rpc/call.h"
#include "server/rpc/profile_wire.h"
#include "server/telemetry/log.h"

namespace mxserve {
namespace {

// Policies' "@tolerant:F" / "@sensitive:F" rank a model's layers by its newest
// kept profile (highest weight version: a ranking describes the layers, which
// every version shares), else by the built-in ranking. Called after every
// change to the model's profiles; a model deleted meanwhile has nothing to rank.
void RankByNewestProfile(const Core& core, const std::string& model) {
  // Reading the newest and setting its order is one step: otherwise a re-rank
  // that read before a concurrent Put or Delete could land after that one's
  // own re-rank and leave a stale order. Static: shared by any daemons in one
  // process, which serializes re-ranks more than needed and nothing else.
  static Mutex mu;
  MutexLock lock(&mu);
  absl::StatusOr<std::shared_ptr<const Profile>> newest = core.profiles->Get(model, 0);
  (void)core.registry->SetToleranceOrder(
      model, newest.ok() ? ProfileToleranceOrder(**newest) : std::vector<std::string>{});
}

void FillProfile(const Profile& p, bool with_layers, v1::Profile* out) {
  out->set_model(p.model);
  out->set_weight_version(p.weight_version);
  out->set_source(ToProto(p.source));
  out->set_reference(ToProto(p.reference));
  out->set_batch_tokens(p.batch_tokens);
  for (mx::Format f : p.formats) out->add_formats(ToProto(f));
  out->set_tokens(p.tokens);
  out->set_created_unix_seconds(p.created_unix_seconds);
  out->set_compute_seconds(p.compute_seconds);
  if (!with_layers) return;
  for (const LayerProfile& l : p.layers) {
    v1::LayerProfile* layer = out->add_layers();
    layer->set_layer(l.layer);
    layer->set_out_features(l.out_features);
    layer->set_in_features(l.in_features);
    layer->set_tokens(l.tokens);
    for (const FormatScore& s : l.scores) {
      v1::FormatScore* score = layer->add_scores();
      score->set_format(ToProto(s.format));
      score->set_rel_error(s.rel_error);
      score->set_sqnr_db(s.sqnr_db);
      score->set_fisher(s.fisher);
      score->set_has_fisher(s.has_fisher);
      score->set_seconds_per_token(s.cost.seconds_per_token);
      score->set_joules_per_token(s.cost.joules_per_token);
      score->set_train_seconds_per_token(s.cost.train_seconds_per_token);
      score->set_train_joules_per_token(s.cost.train_joules_per_token);
      score->set_weight_bits(s.cost.weight_bits);
    }
  }
}

// A format a request field must name: INVALID_ARGUMENT for FORMAT_UNSPECIFIED.
absl::StatusOr<mx::Format> RequiredFormat(v1::Format format, absl::string_view field) {
  MX_ASSIGN_OR_RETURN(std::optional<mx::Format> f, FromProto(format, field));
  if (!f) return absl::InvalidArgumentError(absl::StrCat(field, ": expected a format, got none"));
  return *f;
}

// A call that starts once shutdown has begun (the scheduler's own refusal).
absl::Status ShuttingDown() { return absl::UnavailableError("the daemon is shutting down"); }

// The formats a config names, checked: none repeated, none unspecified.
absl::StatusOr<std::vector<mx::Format>> ConfigFormats(const v1::ProfileConfig& config,
                                                      const Backend* backend) {
  if (config.formats().empty()) {
    // Every format but FP32 that this daemon's backend computes: a policy
    // generated from the profile must be one the daemon can serve.
    std::vector<mx::Format> formats;
    for (mx::Format f : DefaultProfileFormats()) {
      if (backend == nullptr || backend->Serves(f).ok()) formats.push_back(f);
    }
    return formats;
  }
  std::vector<mx::Format> formats;
  for (int i = 0; i < config.formats_size(); ++i) {
    const std::string field = absl::StrCat("config.formats[", i, "]");
    MX_ASSIGN_OR_RETURN(mx::Format f, RequiredFormat(config.formats(i), field));
    if (std::find(formats.begin(), formats.end(), f) != formats.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": ", mx::FormatName(f), " named twice"));
    }
    formats.push_back(f);
  }
  return formats;
}

// ---------------------------------------------------------------------------
// ProfileModel: a config, then calibration batches, each computed on the
// profiler's queue before the next is read, so a stream holds one batch.
//
// A profile is stored only when its stream completed: the client half-closed
// and the call is still live when the profile is put. gRPC ends the reads of a
// stream the same way (OnReadDone(false)) whether the client half-closed or the
// call was abandoned (client cancel, deadline, broken connection), and OnCancel
// may run a moment after that read on another thread, so neither the failed read
// nor IsCancelled() then says which it was. The headers do: they are sent when
// the reads end, and on an abandoned call the transport has already closed the
// stream, so that send fails (OnSendInitialMetadataDone(false)) and nothing is
// computed or stored. A call abandoned later, while its profile is computed, is
// caught at the put: Commit checks and puts under the lock that OnCancel takes.
// A client that gives up after that put, before the response reaches it, sent
// every batch and half-closed: its profile is complete, and kept.

class ProfileReactor final : public grpc::ServerReadReactor<grpc::ByteBuffer> {
 public:
  // `stopping`: ProfilesService::StopAccepting was called; the stream is refused.
  ProfileReactor(const Core& core, grpc::CallbackServerContext* context, grpc::ByteBuffer* response,
                 bool stopping)
      : core_(core),
        context_(context),
        record_(core, Rpc::kProfileModel, context),
        raw_response_(response) {
    if (!record_.admission().ok()) {
      Done(record_.admission());
      return;
    }
    if (stopping) {
      Done(ShuttingDown());
      return;
    }
    StartRead(&raw_request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) return EndOfRequests();
    const std::string field = absl::StrCat("requests[", requests_++, "]");
    request_.Clear();
    absl::Status parsed = ParseMessage(raw_request_, &request_, field);
    raw_request_.Clear();
    if (!parsed.ok()) return Done(parsed);
    if (!builder_) {
      if (absl::Status s = Configure(field); !s.ok()) return Done(s);
      return StartRead(&raw_request_);
    }
    if (!request_.has_batch()) {
      return Done(absl::InvalidArgumentError(
          absl::StrCat(field, ": expected a batch; only the first message is the config")));
    }
    RunOn(
        *core_.profiler, record_.info(),
        [this, field] {
          if (absl::Status s = AddBatch(field); !s.ok()) return Done(s);
          StartRead(&raw_request_);
        },
        [this](absl::Status s) { Done(s); });
  }

  // The reads ended and the headers were sent (ok): the client half-closed. Not
  // sent: the call was abandoned.
  void OnSendInitialMetadataDone(bool ok) override {
    if (!ok) return Done(Abandoned());
    Complete();
  }

  void OnCancel() override {
    MutexLock lock(&mu_);
    abandoned_ = true;
    record_.MarkCancelled();
  }

  void OnDone() override {
    record_.Done();
    delete this;
  }

 private:
  // No more requests: half-closed or abandoned; the headers tell (see above).
  void EndOfRequests() {
    if (!builder_) {
      return Done(absl::InvalidArgumentError(
          "requests: the stream ended before its config message (ProfileRequest.config)"));
    }
    StartSendInitialMetadata();
  }

  // What an abandoned call is answered (the client has its own status by then).
  absl::Status Abandoned() const {
    const Clock::time_point now = Clock::now();
    if (now >= record_.info().deadline) {
      return absl::DeadlineExceededError(
          "the stream's deadline passed before its profile was stored; nothing was stored");
    }
    return absl::CancelledError(
        "the stream was cancelled or its connection lost before it completed; nothing was stored");
  }

  // Puts `profile` unless the call was abandoned: the check and the put are one
  // step against OnCancel. OK, or the status to answer (nothing stored).
  absl::Status Commit(std::shared_ptr<const Profile> profile) {
    MutexLock lock(&mu_);
    if (abandoned_ || context_->IsCancelled() || Clock::now() >= record_.info().deadline) {
      return Abandoned();
    }
    core_.profiles->Put(std::move(profile));
    return absl::OkStatus();
  }

  absl::Status Configure(absl::string_view field) {
    if (!request_.has_config()) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": expected the config first (ProfileRequest.config)"));
    }
    const v1::ProfileConfig& config = request_.config();
    MX_RETURN_IF_ERROR(record_.CheckModelOwner(config.model()));
    ProfileBuilder::Options options;
    MX_ASSIGN_OR_RETURN(options.formats, ConfigFormats(config, core_.backend));
    MX_ASSIGN_OR_RETURN(options.reference, FromProto(config.reference(), "config.reference"));
    options.batch_tokens = config.batch_tokens() == 0 ? 128 : config.batch_tokens();
    if (options.batch_tokens < 1 || options.batch_tokens > kMaxProfileBatchTokens) {
      return absl::InvalidArgumentError(absl::StrCat("config.batch_tokens: expected 1 to ",
                                                     kMaxProfileBatchTokens, " (0: 128), got ",
                                                     config.batch_tokens()));
    }
    MX_ASSIGN_OR_RETURN(std::vector<LayerView> views,
                        core_.registry->PublishedLayers(config.model()));
    if (views.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("config.model: model ", Quote(config.model()),
                       " has no published weights yet; PublishVersion first"));
    }
    std::set<std::string, std::less<>> wanted;
    for (int i = 0; i < config.layers_size(); ++i) {
      const std::string field_i = absl::StrCat("config.layers[", i, "]");
      MX_RETURN_IF_ERROR(
          core_.registry->FindLayer(config.model(), config.layers(i), field_i).status());
      if (!wanted.insert(config.layers(i)).second) {
        return absl::InvalidArgumentError(
            absl::StrCat(field_i, ": layer ", Quote(config.layers(i)), " named twice"));
      }
    }
    std::vector<std::shared_ptr<const LayerWeights>> layers;
    uint64_t version = 0;
    for (const LayerView& view : views) {
      version = std::max(version, view.weights->version());
      if (wanted.empty() || wanted.count(view.weights->spec().name)) {
        layers.push_back(view.weights);
      }
    }
    model_ = config.model();
    builder_ = std::make_unique<ProfileBuilder>(model_, version, std::move(layers),
                                                std::move(options), core_.energy_model,
                                                core_.profile_pool, &core_.registry->budget());
    return absl::OkStatus();
  }

  // On the profiler's thread.
  absl::Status AddBatch(const std::string& field) {
    const v1::CalibrationBatch& batch = request_.batch();
    const int layer = builder_->LayerIndex(batch.layer());
    if (layer < 0) {
      MX_RETURN_IF_ERROR(
          core_.registry->FindLayer(model_, batch.layer(), absl::StrCat(field, ".batch.layer"))
              .status());
      return absl::InvalidArgumentError(absl::StrCat(field, ".batch.layer: layer ",
                                                     Quote(batch.layer()),
                                                     " is not among the profiled config.layers"));
    }
    const LayerSpec& spec = builder_->spec(layer);
    MX_ASSIGN_OR_RETURN(
        DenseMatrix x,
        DecodeMatrix(batch.inputs(), absl::StrCat(field, ".batch.inputs"),
                     LayerColumns(spec, /*in_features=*/true), core_.max_message_bytes));
    if (x.rows == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".batch.inputs: expected at least one row"));
    }
    std::vector<float> xs = ToFloat(x);
    MX_RETURN_IF_ERROR(CheckFinite(xs, absl::StrCat(field, ".batch.inputs")));
    std::vector<float> dys;
    if (batch.has_output_grads()) {
      ExpectedShape shape = LayerColumns(spec, /*in_features=*/false);
      shape.rows = x.rows;
      shape.rows_what = "the rows of inputs";
      MX_ASSIGN_OR_RETURN(DenseMatrix dy, DecodeMatrix(batch.output_grads(),
                                                       absl::StrCat(field, ".batch.output_grads"),
                                                       shape, core_.max_message_bytes));
      dys = ToFloat(dy);
      MX_RETURN_IF_ERROR(CheckFinite(dys, absl::StrCat(field, ".batch.output_grads")));
    }
    absl::Status added = builder_->AddBatch(layer, xs, x.rows, dys);
    if (absl::IsInvalidArgument(added)) {  // about the batch: name its field
      return absl::InvalidArgumentError(absl::StrCat(field, ".batch.", added.message()));
    }
    return added;
  }

  // The client half-closed: the profile, on the profiler's thread.
  void Complete() {
    RunOn(
        *core_.profiler, record_.info(),
        [this] {
          absl::StatusOr<Profile> profile = builder_->Finish();
          builder_.reset();
          if (!profile.ok()) return Done(profile.status());
          if (!core_.registry->Describe(model_).ok()) {
            return Done(absl::AbortedError(absl::StrCat("config.model: model ", Quote(model_),
                                                        " was deleted while it was profiled")));
          }
          auto kept = std::make_shared<const Profile>(*std::move(profile));
          if (absl::Status s = Commit(kept); !s.ok()) return Done(s);
          FillProfile(*kept, true, &response_);
          RankByNewestProfile(core_, model_);
          Log(LogLevel::kInfo, "profiled",
              {{"model", model_},
               {"version", absl::StrCat(kept->weight_version)},
               {"source", SourceName(kept->source)},
               {"layers", absl::StrCat(kept->layers.size())},
               {"formats", absl::StrCat(kept->formats.size())},
               {"tokens", absl::StrCat(kept->tokens)},
               {"seconds", absl::StrCat(kept->compute_seconds)}});
          Done(absl::OkStatus());
        },
        [this](absl::Status s) { Done(s); });
  }

  void Done(absl::Status status) {
    Finish(ToGrpc(record_.Settle(status, response_, raw_response_)));
  }

  const Core& core_;
  grpc::CallbackServerContext* const context_;
  CallRecord record_;
  grpc::ByteBuffer* raw_response_;
  Mutex mu_;                                     // OnCancel against Commit
  bool abandoned_ ABSL_GUARDED_BY(mu_) = false;  // OnCancel ran
  grpc::ByteBuffer raw_request_;
  v1::ProfileRequest request_;
  int requests_ = 0;
  std::string model_;
  std::unique_ptr<ProfileBuilder> builder_;
  v1::Profile response_;
};

// The request's per-phase values as the generator takes them.
absl::StatusOr<std::vector<GenerationSpec::Value>> Values(
    const google::protobuf::RepeatedPtrField<v1::PhaseValue>& values, absl::string_view name) {
  std::vector<GenerationSpec::Value> out;
  for (int i = 0; i < values.size(); ++i) {
    GenerationSpec::Value v;
    v.field = absl::StrCat(name, "[", i, "]");
    v.value = values[i].value();
    if (values[i].phase() != v1::PHASE_UNSPECIFIED) {
      MX_ASSIGN_OR_RETURN(v.phase, FromProto(values[i].phase(), absl::StrCat(v.field, ".phase")));
    }
    out.push_back(std::move(v));
  }
  return out;
}

absl::StatusOr<GenerationSpec> SpecOf(const v1::GeneratePolicyRequest& r) {
  GenerationSpec spec;
  spec.name = r.name();
  spec.description = r.description();
  MX_ASSIGN_OR_RETURN(spec.kind, FromProto(r.kind(), "kind"));
  for (int i = 0; i < r.phases_size(); ++i) {
    MX_ASSIGN_OR_RETURN(Phase phase, FromProto(r.phases(i), absl::StrCat("phases[", i, "]")));
    spec.phases.push_back(phase);
  }
  MX_ASSIGN_OR_RETURN(spec.score, FromProto(r.score(), "score"));
  MX_ASSIGN_OR_RETURN(spec.metric, FromProto(r.metric(), "metric"));
  // Which list carries the values depends on the kind; the others must be empty.
  const bool fraction = spec.kind == GenerationKind::kFraction;
  if (!fraction && !r.fractions().empty()) {
    return absl::InvalidArgumentError("fractions: only the fraction kind takes them");
  }
  if (fraction && !r.budgets().empty()) {
    return absl::InvalidArgumentError("budgets: only the budget and tolerance kinds take them");
  }
  if (spec.kind != GenerationKind::kBudget && !r.relative_budgets().empty()) {
    return absl::InvalidArgumentError("relative_budgets: only the budget kind takes them");
  }
  if (!r.budgets().empty() && !r.relative_budgets().empty()) {
    return absl::InvalidArgumentError("budgets: give budgets or relative_budgets, not both");
  }
  if (fraction) {
    MX_ASSIGN_OR_RETURN(spec.values, Values(r.fractions(), "fractions"));
    spec.values_field = "fractions";
  } else if (!r.relative_budgets().empty()) {
    MX_ASSIGN_OR_RETURN(spec.values, Values(r.relative_budgets(), "relative_budgets"));
    spec.values_field = "relative_budgets";
    spec.relative = true;
  } else {
    MX_ASSIGN_OR_RETURN(spec.values, Values(r.budgets(), "budgets"));
    spec.values_field = "budgets";
  }
  if (r.low() != v1::FORMAT_UNSPECIFIED) {
    MX_ASSIGN_OR_RETURN(spec.low, RequiredFormat(r.low(), "low"));
  }
  if (r.high() != v1::FORMAT_UNSPECIFIED) {
    MX_ASSIGN_OR_RETURN(spec.high, RequiredFormat(r.high(), "high"));
  }
  for (int i = 0; i < r.candidates_size(); ++i) {
    MX_ASSIGN_OR_RETURN(mx::Format f,
                        RequiredFormat(r.candidates(i), absl::StrCat("candidates[", i, "]")));
    spec.candidates.push_back(f);
  }
  spec.groups.assign(r.groups().begin(), r.groups().end());
  return spec;
}

}  // namespace

grpc::ServerReadReactor<grpc::ByteBuffer>* ProfilesService::ProfileModel(
    grpc::CallbackServerContext* context, grpc::ByteBuffer* response) {
  return new ProfileReactor(core_, context, response, stopping_.load(std::memory_order_relaxed));
}

grpc::ServerUnaryReactor* ProfilesService::GetProfile(grpc::CallbackServerContext* context,
                                                      const grpc::ByteBuffer* request,
                                                      grpc::ByteBuffer* response) {
  return ServeNow<v1::GetProfileRequest, v1::Profile>(
      core_, Rpc::kGetProfile, context, request, response,
      [this](const v1::GetProfileRequest& r, v1::Profile* out) -> absl::Status {
        MX_ASSIGN_OR_RETURN(auto profile, core_.profiles->Get(r.model(), r.weight_version()));
        FillProfile(*profile, true, out);
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* ProfilesService::ListProfiles(grpc::CallbackServerContext* context,
                                                        const grpc::ByteBuffer* request,
                                                        grpc::ByteBuffer* response) {
  return ServeNow<v1::ListProfilesRequest, v1::ListProfilesResponse>(
      core_, Rpc::kListProfiles, context, request, response,
      [this](const v1::ListProfilesRequest& r, v1::ListProfilesResponse* out) {
        for (const auto& p : core_.profiles->List(r.model())) {
          FillProfile(*p, false, out->add_profiles());
        }
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* ProfilesService::ExportProfile(grpc::CallbackServerContext* context,
                                                         const grpc::ByteBuffer* request,
                                                         grpc::ByteBuffer* response) {
  return ServeNow<v1::ExportProfileRequest, v1::ExportProfileResponse>(
      core_, Rpc::kExportProfile, context, request, response,
      [this](const v1::ExportProfileRequest& r, v1::ExportProfileResponse* out) -> absl::Status {
        MX_ASSIGN_OR_RETURN(auto profile, core_.profiles->Get(r.model(), r.weight_version()));
        out->set_csv(ProfileToCsv(*profile));
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* ProfilesService::DeleteProfile(grpc::CallbackServerContext* context,
                                                         const grpc::ByteBuffer* request,
                                                         grpc::ByteBuffer* response) {
  return ServeNow<v1::DeleteProfileRequest, v1::DeleteProfileResponse>(
      core_, Rpc::kDeleteProfile, context, request, response,
      [this](const v1::DeleteProfileRequest& r, v1::DeleteProfileResponse* out,
             const CallRecord& record) -> absl::Status {
        MX_RETURN_IF_ERROR(record.CheckModelOwner(r.model()));
        // As DeleteModel and GetProfile: a model that is not registered (its
        // profiles went with it) is NOT_FOUND, not OK with nothing deleted.
        MX_RETURN_IF_ERROR(core_.registry->Owner(r.model()).status());
        MX_ASSIGN_OR_RETURN(const uint32_t deleted,
                            core_.profiles->Delete(r.model(), r.weight_version()));
        RankByNewestProfile(core_, r.model());
        out->set_deleted(deleted);
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* ProfilesService::GeneratePolicy(grpc::CallbackServerContext* context,
                                                          const grpc::ByteBuffer* request,
                                                          grpc::ByteBuffer* response) {
  using Call = UnaryCall<v1::GeneratePolicyRequest, v1::GeneratePolicyResponse>;
  return Call::Start(core_, Rpc::kGeneratePolicy, context, request, response, [this](Call& call) {
    if (stopping_.load(std::memory_order_relaxed)) return call.Answer(ShuttingDown());
    if (absl::Status s = call.record().CheckModelOwner(call.request().model()); !s.ok()) {
      return call.Answer(s);
    }
    // The exact solvers can take a while on a large model: the profiler's thread.
    RunOn(
        *core_.profiler, call.info(),
        [this, &call] { call.Answer(Generate(call.request(), call.response(), call.record())); },
        call.Answerer());
  });
}

absl::Status ProfilesService::Generate(const v1::GeneratePolicyRequest& request,
                                       v1::GeneratePolicyResponse* response,
                                       const CallRecord& record) {
  MX_ASSIGN_OR_RETURN(GenerationSpec spec, SpecOf(request));
  MX_ASSIGN_OR_RETURN(auto profile, core_.profiles->Get(request.model(), request.weight_version()));
  MX_ASSIGN_OR_RETURN(ModelSummary model, core_.registry->Describe(request.model()));
  std::vector<std::string> layer_names;
  for (const auto& layer : model.layers) layer_names.push_back(layer.spec.name);
  MX_ASSIGN_OR_RETURN(GeneratedPolicy generated,
                      mxserve::GeneratePolicy(*profile, layer_names, core_.energy_model, spec));
  const std::string json = PolicyToJson(generated.policy);
  if (request.dry_run()) {
    MX_RETURN_IF_ERROR(ParsePolicyJson(json).status());
    response->mutable_policy()->set_name(generated.policy.name);
    response->mutable_policy()->set_json(json);
  } else {
    MX_ASSIGN_OR_RETURN(
        StoredPolicy stored,
        core_.policies->Put(json, record.principal().name, [&](const StoredPolicy& existing) {
          return record.MayChangePolicy(existing);
        }));
    response->mutable_policy()->set_name(stored.policy->name);
    response->mutable_policy()->set_json(PolicyToJson(*stored.policy));
    response->mutable_policy()->set_builtin(stored.builtin);
    response->mutable_policy()->set_owner(stored.owner);
    Log(LogLevel::kInfo, "policy_generated",
        {{"policy", Quote(stored.policy->name)},
         {"model", request.model()},
         {"version", absl::StrCat(profile->weight_version)},
         {"rules", absl::StrCat(stored.policy->rules.size())}});
  }
  for (const PhasePlan& p : generated.phases) {
    v1::PhaseSummary* summary = response->add_phases();
    summary->set_phase(ToProto(p.phase));
    summary->set_layers(static_cast<uint32_t>(p.formats.size()));
    summary->set_low_layers(p.low_layers);
    summary->set_score(p.score);
    summary->set_joules_per_token(p.joules_per_token);
    summary->set_seconds_per_token(p.seconds_per_token);
    summary->set_weight_bits(p.weight_bits);
    summary->set_fp16_joules_per_token(p.fp16_joules_per_token);
    summary->set_fp16_seconds_per_token(p.fp16_seconds_per_token);
    summary->set_budget(p.budget);
    for (size_t i = 0; i < profile->layers.size(); ++i) {
      const std::string& layer = profile->layers[i].layer;
      // Generated rules are per-layer globs: no layer class, so no ranking needed.
      const ResolvedFormat resolved = Resolve(generated.policy, p.phase, layer, LayerTolerance{});
      v1::ResolvedFormat* entry = response->add_entries();
      entry->set_phase(ToProto(p.phase));
      entry->set_layer(layer);
      entry->set_format(ToProto(resolved.format));
      entry->set_rule(resolved.rule);
      entry->set_scale_rule(ToProto(generated.policy.scale_rules[static_cast<size_t>(p.phase)]));
      entry->set_rounding(ToProto(generated.policy.roundings[static_cast<size_t>(p.phase)]));
    }
  }
  return absl::OkStatus();
}

}  // namespace mxserve
