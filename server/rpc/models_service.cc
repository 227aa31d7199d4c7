#include "server/rpc/models_service.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "mx/element.h"
#include "mx/status_macros.h"
#include "proto/convert/enums.h"
#include "server/base/quote.h"
#include "server/compute/wire.h"
#include "server/model/safetensors.h"
#include "server/rpc/call.h"
#include "server/telemetry/log.h"

namespace mxserve {
namespace {

void FillModelInfo(const ModelSummary& s, v1::ModelInfo* info) {
  info->set_name(s.name);
  info->set_owner(s.owner);
  info->set_policy(s.policy);
  info->set_weight_version(s.version);
  info->set_staged_tensors(s.staged_tensors);
  info->set_weight_bytes(s.bytes);
  info->set_quota_bytes(s.quota_bytes);
  info->set_lease_seconds(s.lease_seconds);
  for (const auto& layer : s.layers) {
    v1::LayerInfo* out = info->add_layers();
    out->mutable_spec()->set_name(layer.spec.name);
    out->mutable_spec()->set_out_features(layer.spec.out_features);
    out->mutable_spec()->set_in_features(layer.spec.in_features);
    out->mutable_spec()->set_bias(layer.spec.bias);
    for (mx::Format f : layer.cached_formats) out->add_cached_formats(ToProto(f));
  }
}

uint64_t TensorElements(const LayerSpec& spec, bool bias) {
  return bias ? static_cast<uint64_t>(spec.out_features)
              : static_cast<uint64_t>(spec.out_features) * static_cast<uint64_t>(spec.in_features);
}

std::string TensorName(const StagedTensorKey& key) {
  return absl::StrCat(key.layer, key.is_bias ? ".bias" : ".weight");
}

// ---------------------------------------------------------------------------
// UploadWeights: a client stream of chunks filling whole tensors. Chunks of one
// tensor may come in any order but must not overlap; nothing reaches the model's
// staging area unless the stream completes with every touched tensor full.

class UploadReactor final : public grpc::ServerReadReactor<grpc::ByteBuffer> {
 public:
  UploadReactor(const Core& core, grpc::CallbackServerContext* context, grpc::ByteBuffer* response)
      : core_(core),
        context_(context),
        record_(core, Rpc::kUploadWeights, context),
        raw_response_(response) {
    if (!record_.admission().ok()) {
      Done(record_.admission());
      return;
    }
    StartRead(&raw_chunk_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) return Complete();
    if (absl::Status s = Accept(); !s.ok()) return Done(s);
    StartRead(&raw_chunk_);
  }

  void OnCancel() override { record_.MarkCancelled(); }

  void OnDone() override {
    record_.Done();
    delete this;
  }

 private:
  struct Pending {
    LayerSpec spec;
    v1::DType dtype = v1::DTYPE_UNSPECIFIED;
    StoredTensor tensor;
    std::vector<std::pair<uint64_t, uint64_t>> ranges;  // [offset, end) in elements
  };

  absl::Status Accept() {
    const std::string field = absl::StrCat("chunks[", chunks_, "]");
    ++chunks_;
    chunk_.Clear();
    if (absl::Status s = ParseMessage(raw_chunk_, &chunk_, field); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(s.message(), "; nothing was staged"));
    }
    raw_chunk_.Clear();
    if (chunks_ == 1) {
      model_ = chunk_.model();  // FindLayer below reports an unknown model
      if (absl::Status s = record_.CheckModelOwner(model_); !s.ok()) {
        return absl::PermissionDeniedError(absl::StrCat(s.message(), "; nothing was staged"));
      }
      // Room for the tensors is made in the owner's own cached copies first.
      model_owner_ = core_.registry->Owner(model_).value_or("");
      MX_ASSIGN_OR_RETURN(warm_up_, ParseWarmUp(chunk_.warm_up(), absl::StrCat(field, ".warm_up")));
    } else if (chunk_.model() != model_) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".model: every chunk of a stream must name the same model; expected ",
                       Quote(model_), ", got ", Quote(chunk_.model())));
    }
    publish_ = publish_ || chunk_.publish();
    if (chunk_.role() != v1::TENSOR_ROLE_WEIGHT && chunk_.role() != v1::TENSOR_ROLE_BIAS) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".role: expected ",
                       WireNameList(DescriptorOf<v1::TensorRole>(), /*full=*/true),
                       ", got ",
                       static_cast<int>(chunk_.role())));
    }
    const StagedTensorKey key{chunk_.layer(), chunk_.role() == v1::TENSOR_ROLE_BIAS};
    auto it = pending_.find(key);
    if (it == pending_.end()) {
      MX_ASSIGN_OR_RETURN(LayerSpec spec, core_.registry->FindLayer(model_, chunk_.layer(),
                                                                    absl::StrCat(field, ".layer")));
      if (key.is_bias && !spec.bias) {
        return absl::InvalidArgumentError(absl::StrCat(field, ".role: layer ", Quote(spec.name),
                                                       " was registered without a bias"));
      }
      Pending pending;
      pending.spec = spec;
      const uint64_t elements = TensorElements(spec, key.is_bias);
      MX_RETURN_IF_ERROR(ReserveInto(core_.registry->budget(), elements * sizeof(float),
                                     absl::StrCat("tensor '", TensorName(key), "'"),
                                     pending.tensor.reservation, model_owner_));
      pending.tensor.values.resize(elements);
      it = pending_.emplace(key, std::move(pending)).first;
    }
    Pending& pending = it->second;
    const auto layer_shape = [&] {
      return key.is_bias ? absl::StrCat("[", pending.spec.out_features, "]")
                         : absl::StrCat("[", pending.spec.out_features, ", ",
                                        pending.spec.in_features, "]");
    };
    if (chunk_.shape_size() > 0) {
      const bool same = key.is_bias ? chunk_.shape_size() == 1 &&
                                          chunk_.shape(0) == pending.spec.out_features
                                    : chunk_.shape_size() == 2 &&
                                          chunk_.shape(0) == pending.spec.out_features &&
                                          chunk_.shape(1) == pending.spec.in_features;
      if (!same) {
        return absl::InvalidArgumentError(absl::StrCat(
            field, ".shape: tensor '", TensorName(key), "' is ", layer_shape(),
            key.is_bias ? " (out_features)" : " (out_features, in_features)", ", got [",
            absl::StrJoin(chunk_.shape(), ", "), "]; nothing was staged"));
      }
    }
    MX_ASSIGN_OR_RETURN(const mx::Format dtype,
                        FromProto(chunk_.dtype(), absl::StrCat(field, ".dtype")));
    const size_t element_bytes = mx::Traits(dtype).element_bits / 8;
    if (pending.dtype == v1::DTYPE_UNSPECIFIED) pending.dtype = chunk_.dtype();
    if (chunk_.dtype() != pending.dtype) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".dtype: tensor '", TensorName(key), "' started as ",
          v1::DType_Name(pending.dtype), ", this chunk is ", v1::DType_Name(chunk_.dtype())));
    }
    const std::string& data = chunk_.data();
    if (data.empty() || data.size() % element_bytes != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".data: expected a non-empty whole number of ", element_bytes,
                       "-byte elements, got ", data.size(), " bytes"));
    }
    const uint64_t count = data.size() / element_bytes;
    const uint64_t total = pending.tensor.values.size();
    const uint64_t offset = chunk_.offset_elements();
    if (offset > total || count > total - offset) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".offset_elements: elements [", offset, ", ", offset + count,
          ") fall outside tensor '", TensorName(key), "' of ", total, " elements (",
          layer_shape(), ")"));
    }
    mx::WidenToFloat(dtype, data.data(), count, pending.tensor.values.data() + offset);
    pending.ranges.emplace_back(offset, offset + count);
    bytes_ += data.size();
    return absl::OkStatus();
  }

  // The client half-closed (or went away): check, stage, maybe publish.
  void Complete() {
    if (context_->IsCancelled()) {
      return Done(absl::CancelledError("the upload was cancelled; nothing was staged"));
    }
    if (chunks_ == 0) {
      return Done(absl::InvalidArgumentError("chunks: the stream held no chunk; nothing staged"));
    }
    std::vector<std::pair<StagedTensorKey, StoredTensor>> tensors;
    for (auto& [key, pending] : pending_) {
      std::sort(pending.ranges.begin(), pending.ranges.end());
      uint64_t filled = 0;
      for (const auto& [begin, end] : pending.ranges) {
        if (begin < filled) {
          return Done(absl::InvalidArgumentError(
              absl::StrCat("offset_elements: chunks of tensor '", TensorName(key),
                           "' overlap at element ", begin, "; nothing was staged")));
        }
        if (begin > filled) break;
        filled = end;
      }
      if (filled != pending.tensor.values.size()) {
        return Done(absl::InvalidArgumentError(
            absl::StrCat("data: tensor '", TensorName(key), "' is incomplete: elements from ",
                         filled, " of ", pending.tensor.values.size(),
                         " were not received (truncated stream?); nothing was staged")));
      }
      tensors.emplace_back(key, std::move(pending.tensor));
    }
    const uint64_t staged = tensors.size();
    pending_.clear();
    absl::StatusOr<uint64_t> version =
        core_.registry->Stage(model_, std::move(tensors), publish_, core_.quotas().weight_bytes);
    if (!version.ok()) return Done(version.status());
    core_.UpdateMemoryGauges();
    response_.set_model(model_);
    response_.set_tensors_staged(staged);
    response_.set_bytes_received(bytes_);
    Log(LogLevel::kInfo, "weights_staged",
        {{"model", model_},
         {"tensors", absl::StrCat(staged)},
         {"bytes", absl::StrCat(bytes_)},
         {"principal", record_.principal().name}});
    if (!publish_) return Done(absl::OkStatus());
    response_.set_weight_version(*version);
    Warm(core_, model_, *version, warm_up_, [this](uint64_t) { Done(absl::OkStatus()); });
  }

  void Done(absl::Status status) {
    pending_.clear();  // releases the reservations of anything not staged
    status = record_.Settle(std::move(status), response_, raw_response_);
    if (!status.ok()) {
      Log(LogLevel::kWarning, "upload_failed",
          {{"model", Quote(model_)},
           {"status", absl::StatusCodeToString(status.code())},
           {"message", CapMessage(status.message())}});
    }
    Finish(ToGrpc(status));
  }

  const Core& core_;
  grpc::CallbackServerContext* context_;
  CallRecord record_;
  grpc::ByteBuffer* raw_response_;
  v1::UploadWeightsResponse response_;
  grpc::ByteBuffer raw_chunk_;
  v1::WeightChunk chunk_;
  std::string model_;
  std::string model_owner_;  // whose cached copies make room first
  bool publish_ = false;
  WarmUpSpec warm_up_;  // the first chunk's
  uint64_t chunks_ = 0;
  uint64_t bytes_ = 0;
  std::map<StagedTensorKey, Pending> pending_;
};

}  // namespace

absl::StatusOr<WarmUpSpec> ParseWarmUp(const v1::WarmUp& warm_up, absl::string_view field) {
  WarmUpSpec spec;
  spec.background = warm_up.background();
  switch (warm_up.copies()) {
    case v1::WarmUp::COPIES_PREVIOUS:
      spec.copies = WarmUpSpec::Copies::kPrevious;
      break;
    case v1::WarmUp::COPIES_NONE:
      spec.copies = WarmUpSpec::Copies::kNone;
      break;
    case v1::WarmUp::COPIES_FORMATS:
      spec.copies = WarmUpSpec::Copies::kFormats;
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".copies: expected COPIES_PREVIOUS, COPIES_NONE or COPIES_FORMATS, got ",
                       static_cast<int>(warm_up.copies())));
  }
  constexpr int kMaxWarmFormats = 16;
  if (spec.copies != WarmUpSpec::Copies::kFormats) {
    if (warm_up.formats_size() > 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".formats: only with COPIES_FORMATS, got ", warm_up.formats_size(),
                       " formats with ", v1::WarmUp::Copies_Name(warm_up.copies())));
    }
    return spec;
  }
  if (warm_up.formats_size() < 1 || warm_up.formats_size() > kMaxWarmFormats) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".formats: expected 1 to ",
                                                   kMaxWarmFormats, " formats with COPIES_FORMATS, got ",
                                                   warm_up.formats_size()));
  }
  for (int i = 0; i < warm_up.formats_size(); ++i) {
    const std::string at = absl::StrCat(field, ".formats[", i, "]");
    MX_ASSIGN_OR_RETURN(std::optional<mx::Format> format,
                        FromProto(warm_up.formats(i), at));
    if (!format) {
      return absl::InvalidArgumentError(absl::StrCat(at, ": expected a format, got FORMAT_UNSPECIFIED"));
    }
    spec.formats.push_back(*format);
  }
  return spec;
}

void PublishAndWarm(const Core& core, const std::string& model, const WarmUpSpec& warm_up,
                    std::function<void(absl::StatusOr<uint64_t>)> done) {
  absl::StatusOr<uint64_t> version = core.registry->Publish(model);
  if (!version.ok()) return done(version.status());
  Warm(core, model, *version, warm_up, [done](uint64_t published) { done(published); });
}

void Warm(const Core& core, std::string model, uint64_t published, WarmUpSpec warm_up,
          std::function<void(uint64_t)> done) {
  // By value: with `background`, done() answers the call first, and the call
  // (whose request `model` may point into) can be gone before the warm-up runs.
  absl::StatusOr<std::string> owner = core.registry->Owner(model);
  Log(LogLevel::kInfo, "weights_published",
      {{"model", model},
       {"version", absl::StrCat(published)},
       {"owner", owner.ok() ? *owner : std::string()}});
  if (warm_up.copies == WarmUpSpec::Copies::kNone) return done(published);
  if (warm_up.background) {
    done(published);
    done = [](uint64_t) {};
  }
  // Quantize, on the loader pool, what requests will ask for: the formats
  // named, or the copies requests used of the layer's previous version (a
  // policy model never asks for its reward-phase format; a trainer that reuses
  // a version's update copies needs them again), or for a first version, the
  // active policy's rollout and reward formats. Update-phase copies read once
  // per version are made per call and never cached (CopyUse::kUpdate), so they
  // are not warmed. A failure here is not the publish's: the request that needs
  // the copy reports it. The warm-up runs even if the client stops waiting.
  CallInfo call;
  RunOn(
      *core.loader, call,
      [&core, model, published, warm_up, done] {
        absl::StatusOr<std::vector<LayerView>> layers = core.registry->PublishedLayers(model);
        if (layers.ok()) {
          for (const LayerView& view : *layers) {
            if (view.weights->version() != published) continue;  // unchanged layers are warm
            std::set<CopyKey> copies;
            if (warm_up.copies == WarmUpSpec::Copies::kFormats) {
              for (mx::Format format : warm_up.formats) copies.insert({format, WeightLayout::kForward});
            } else {
              copies.insert(view.weights->used_before().begin(), view.weights->used_before().end());
            }
            if (copies.empty()) {
              absl::StatusOr<StoredPolicy> policy = core.policies->Get(view.policy);
              if (!policy.ok()) break;
              for (Phase phase : {Phase::kRollout, Phase::kReward}) {
                copies.insert(
                    {Resolve(*policy->policy, phase, view.weights->spec().name, view.tolerance)
                         .format,
                     WeightLayout::kForward});
              }
            }
            for (const auto& [format, layout] : copies) {
              auto copy =
                  view.weights->Get(format, layout, core.registry->budget(), CopyUse::kWarmUp);
              if (copy.ok() && copy->created) core.metrics->RecordQuantization(format);
              if (!copy.ok()) {
                Log(LogLevel::kWarning, "warm_failed",
                    {{"model", model},
                     {"layer", view.weights->spec().name},
                     {"message", std::string(copy.status().message())}});
              }
            }
          }
        }
        core.UpdateMemoryGauges();
        done(published);
      },
      [model, done, published](absl::Status why) {
        Log(LogLevel::kWarning, "warm_skipped",
            {{"model", model}, {"message", std::string(why.message())}});
        done(published);
      });
}

grpc::ServerUnaryReactor* ModelsService::RegisterModel(grpc::CallbackServerContext* context,
                                                       const grpc::ByteBuffer* request,
                                                       grpc::ByteBuffer* response) {
  return ServeNow<v1::RegisterModelRequest, v1::ModelInfo>(
      core_, Rpc::kRegisterModel, context, request, response,
      [this](const v1::RegisterModelRequest& r, v1::ModelInfo* out,
             const CallRecord& record) -> absl::Status {
        MX_ASSIGN_OR_RETURN(
            StoredPolicy stored,
            core_.policies->Get(r.policy().empty() ? core_.default_policy : r.policy(), "policy"));
        const std::string policy = stored.policy->name;  // the full name of a short one
        std::vector<LayerSpec> layers;
        for (const auto& layer : r.layers()) {
          layers.push_back({layer.name(), layer.out_features(), layer.in_features(), layer.bias()});
        }
        const std::string& owner = record.principal().name;
        MX_RETURN_IF_ERROR(core_.registry->Register(
            r.name(), std::move(layers), policy, r.lease_seconds(), owner, core_.quotas().models));
        FillModelInfo(*core_.registry->Describe(r.name()), out);
        core_.UpdateMemoryGauges();
        Log(LogLevel::kInfo, "model_registered",
            {{"model", r.name()},
             {"owner", owner},
             {"layers", absl::StrCat(r.layers_size())},
             {"policy", policy},
             {"lease_seconds", absl::StrCat(r.lease_seconds())}});
        return absl::OkStatus();
      });
}

grpc::ServerReadReactor<grpc::ByteBuffer>* ModelsService::UploadWeights(
    grpc::CallbackServerContext* context, grpc::ByteBuffer* response) {
  return new UploadReactor(core_, context, response);
}

grpc::ServerUnaryReactor* ModelsService::LoadSafetensors(grpc::CallbackServerContext* context,
                                                         const grpc::ByteBuffer* request,
                                                         grpc::ByteBuffer* response) {
  using Call = UnaryCall<v1::LoadSafetensorsRequest, v1::UploadWeightsResponse>;
  return Call::Start(core_, Rpc::kLoadSafetensors, context, request, response, [this](Call& call) {
    if (absl::Status s = call.record().CheckModelOwner(call.request().model()); !s.ok()) {
      return call.Answer(s);
    }
    absl::StatusOr<WarmUpSpec> warm_up = ParseWarmUp(call.request().warm_up(), "warm_up");
    if (!warm_up.ok()) return call.Answer(warm_up.status());
    // Reading and widening a file is real work: it runs on the loader pool.
    RunOn(
        *core_.loader, call.info(),
        [this, &call, warm_up = *std::move(warm_up)] {
          absl::Status status = Load(call.request(), call.response());
          if (!status.ok() || !call.request().publish()) return call.Answer(status);
          Warm(core_, call.request().model(), call.response()->weight_version(), warm_up,
               [&call](uint64_t) { call.Answer(absl::OkStatus()); });
        },
        call.Answerer());
  });
}

absl::Status ModelsService::Load(const v1::LoadSafetensorsRequest& request,
                                 v1::UploadWeightsResponse* response) {
  MX_ASSIGN_OR_RETURN(ModelSummary model, core_.registry->Describe(request.model()));
  MX_ASSIGN_OR_RETURN(UniqueFd fd, core_.model_dirs->Open(request.path(), "path"));
  absl::StatusOr<SafetensorsFile> file =
      SafetensorsFile::Read(std::move(fd), absl::StrCat("path: ", Quote(request.path())));
  if (!file.ok()) return file.status();
  std::vector<std::pair<StagedTensorKey, StoredTensor>> tensors;
  uint64_t bytes = 0;
  for (const auto& layer : model.layers) {
    for (bool bias : {false, true}) {
      if (bias && !layer.spec.bias) continue;
      const std::string name =
          absl::StrCat(request.prefix(), layer.spec.name, bias ? ".bias" : ".weight");
      const SafetensorsTensor* t = file->Find(name);
      if (t == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat(
            "path: ", Quote(request.path()), " has no tensor ", Quote(name), " for layer ",
            Quote(layer.spec.name), " (prefix ", Quote(request.prefix()), ")"));
      }
      const std::vector<int64_t> want =
          bias ? std::vector<int64_t>{layer.spec.out_features}
               : std::vector<int64_t>{layer.spec.out_features, layer.spec.in_features};
      if (t->shape != want) {
        return absl::InvalidArgumentError(absl::StrCat(
            "path: tensor ", Quote(name), " has shape [", absl::StrJoin(t->shape, ", "),
            "], layer ", Quote(layer.spec.name), " expects [", absl::StrJoin(want, ", "), "]"));
      }
      StoredTensor stored;
      const uint64_t size = TensorElements(layer.spec, bias) * sizeof(float);
      MX_RETURN_IF_ERROR(ReserveInto(core_.registry->budget(), size,
                                     absl::StrCat("tensor ", Quote(name)), stored.reservation,
                                     model.owner));
      MX_ASSIGN_OR_RETURN(stored.values, file->ReadFloat32(name));
      bytes += t->end - t->begin;
      tensors.emplace_back(StagedTensorKey{layer.spec.name, bias}, std::move(stored));
    }
  }
  const uint64_t staged = tensors.size();
  MX_ASSIGN_OR_RETURN(const uint64_t version,
                      core_.registry->Stage(request.model(), std::move(tensors), request.publish(),
                                            core_.quotas().weight_bytes));
  core_.UpdateMemoryGauges();
  response->set_model(request.model());
  response->set_tensors_staged(staged);
  response->set_bytes_received(bytes);
  response->set_weight_version(version);
  Log(LogLevel::kInfo, "weights_staged",
      {{"model", request.model()},
       {"tensors", absl::StrCat(staged)},
       {"source", Quote(request.path())}});
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* ModelsService::PublishVersion(grpc::CallbackServerContext* context,
                                                        const grpc::ByteBuffer* request,
                                                        grpc::ByteBuffer* response) {
  using Call = UnaryCall<v1::PublishVersionRequest, v1::ModelInfo>;
  return Call::Start(core_, Rpc::kPublishVersion, context, request, response, [this](Call& call) {
    if (absl::Status s = call.record().CheckModelOwner(call.request().model()); !s.ok()) {
      return call.Answer(s);
    }
    absl::StatusOr<WarmUpSpec> warm_up = ParseWarmUp(call.request().warm_up(), "warm_up");
    if (!warm_up.ok()) return call.Answer(warm_up.status());
    PublishAndWarm(core_, call.request().model(), *warm_up,
                   [this, &call](absl::StatusOr<uint64_t> version) {
      absl::Status status = version.status();
      if (status.ok()) {
        absl::StatusOr<ModelSummary> summary = core_.registry->Describe(call.request().model());
        if (summary.ok()) FillModelInfo(*summary, call.response());
        status = summary.status();
      }
      call.Answer(status);
    });
  });
}

grpc::ServerUnaryReactor* ModelsService::ListModels(grpc::CallbackServerContext* context,
                                                    const grpc::ByteBuffer* request,
                                                    grpc::ByteBuffer* response) {
  return ServeNow<v1::ListModelsRequest, v1::ListModelsResponse>(
      core_, Rpc::kListModels, context, request, response,
      [this](const v1::ListModelsRequest& r, v1::ListModelsResponse* out) -> absl::Status {
        if (!r.page_token().empty() && !ValidModelName(r.page_token())) {
          return absl::InvalidArgumentError(absl::StrCat(
              "page_token: expected empty or the next_page_token of an earlier ListModels "
              "answer (a model name), got ",
              Quote(r.page_token())));
        }
        // Every model's layers are in its ModelInfo: a page stops before the
        // answer would pass --max-message-bytes, each holding at least one model.
        // One model's description fits the default 64 MiB (kMaxLayersPerModel
        // layers of 256-byte names are about 19 MB); under a smaller limit such a
        // model's page fails as its DescribeModel does.
        const uint64_t budget = static_cast<uint64_t>(
            std::max<int64_t>(core_.max_message_bytes - static_cast<int64_t>(kEnvelopeBytes), 0));
        uint64_t bytes = 0;
        // A model left for the next page: the token is the last one on this page
        // (every page has one, so the stop never comes on an empty page).
        const auto next_page = [&] {
          out->set_next_page_token(out->models(out->models_size() - 1).name());
          return false;
        };
        core_.registry->List(r.page_token(), [&](const ModelSummary& s) {
          // Unsigned: a page_size past 2^31 read as negative stopped before any
          // model and then named models(-1) the next token.
          if (r.page_size() > 0 && static_cast<uint32_t>(out->models_size()) >= r.page_size()) {
            return next_page();
          }
          v1::ModelInfo info;
          FillModelInfo(s, &info);
          const uint64_t size = info.ByteSizeLong() + 16;  // its tag and length
          if (out->models_size() > 0 && bytes + size > budget) return next_page();
          bytes += size;
          out->add_models()->Swap(&info);
          return true;
        });
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* ModelsService::DescribeModel(grpc::CallbackServerContext* context,
                                                       const grpc::ByteBuffer* request,
                                                       grpc::ByteBuffer* response) {
  return ServeNow<v1::DescribeModelRequest, v1::ModelInfo>(
      core_, Rpc::kDescribeModel, context, request, response,
      [this](const v1::DescribeModelRequest& r, v1::ModelInfo* out) -> absl::Status {
        MX_ASSIGN_OR_RETURN(ModelSummary summary, core_.registry->Describe(r.name()));
        FillModelInfo(summary, out);
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* ModelsService::DeleteModel(grpc::CallbackServerContext* context,
                                                     const grpc::ByteBuffer* request,
                                                     grpc::ByteBuffer* response) {
  return ServeNow<v1::DeleteModelRequest, v1::DeleteModelResponse>(
      core_, Rpc::kDeleteModel, context, request, response,
      [this](const v1::DeleteModelRequest& r, v1::DeleteModelResponse* out,
             const CallRecord& record) -> absl::Status {
        MX_RETURN_IF_ERROR(record.CheckModelOwner(r.name()));
        absl::StatusOr<std::string> owner = core_.registry->Owner(r.name());
        MX_ASSIGN_OR_RETURN(const uint64_t freed, core_.registry->Delete(r.name()));
        out->set_freed_bytes(freed);
        // Its profiles describe weights that are gone; a model registered
        // under the name again starts without any.
        (void)core_.profiles->Delete(r.name(), 0);
        core_.UpdateMemoryGauges();
        Log(LogLevel::kInfo, "model_deleted",
            {{"model", r.name()},
             {"owner", owner.ok() ? *owner : std::string()},
             {"by", record.principal().name},
             {"freed_bytes", absl::StrCat(freed)}});
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* ModelsService::StepOptimizer(grpc::CallbackServerContext* context,
                                                       const grpc::ByteBuffer* request,
                                                       grpc::ByteBuffer* response) {
  using Call = UnaryCall<v1::StepOptimizerRequest, v1::StepOptimizerResponse>;
  return Call::Start(core_, Rpc::kStepOptimizer, context, request, response, [this](Call& call) {
    const v1::StepOptimizerRequest& r = call.request();
    if (absl::Status s = call.record().CheckModelOwner(r.model()); !s.ok()) return call.Answer(s);
    if (!r.has_adamw() && !r.discard_gradients()) {
      return call.Answer(absl::InvalidArgumentError(
          "adamw: required (torch.optim.AdamW's lr, beta1, beta2, eps, weight_decay)"));
    }
    absl::StatusOr<WarmUpSpec> warm_up = ParseWarmUp(r.warm_up(), "warm_up");
    if (!warm_up.ok()) return call.Answer(warm_up.status());
    // A step reads and writes every stepped parameter: it runs on the loader pool.
    RunOn(
        *core_.loader, call.info(),
        [this, &call, warm_up = *std::move(warm_up)] {
          const v1::StepOptimizerRequest& r = call.request();
          OptimizerStep step;
          step.adamw = {.lr = r.adamw().lr(),
                        .beta1 = r.adamw().beta1(),
                        .beta2 = r.adamw().beta2(),
                        .eps = r.adamw().eps(),
                        .weight_decay = r.adamw().weight_decay()};
          step.max_grad_norm = r.max_grad_norm();
          step.other_grad_sq_norm = r.other_grad_sq_norm();
          step.discard = r.discard_gradients();
          step.quota_bytes = core_.quotas().weight_bytes;
          absl::StatusOr<OptimizerStepResult> result =
              core_.registry->StepOptimizer(r.model(), step, core_.profile_pool);
          core_.UpdateMemoryGauges();
          if (!result.ok()) return call.Answer(result.status());
          v1::StepOptimizerResponse* out = call.response();
          out->set_weight_version(result->version);
          for (const auto& [layer, sq_norm] : result->grad_sq_norms) {
            v1::LayerGradNorm* norm = out->add_layers();
            norm->set_layer(layer);
            norm->set_sq_norm(sq_norm);
          }
          out->set_total_grad_norm(result->total_grad_norm);
          out->set_clip_coefficient(result->clip_coefficient);
          Log(LogLevel::kInfo, "optimizer_stepped",
              {{"model", r.model()},
               {"version", absl::StrCat(result->version)},
               {"layers", absl::StrCat(result->grad_sq_norms.size())},
               {"total_grad_norm", absl::StrCat(result->total_grad_norm)},
               {"clip_coefficient", absl::StrCat(result->clip_coefficient)}});
          if (!result->published) return call.Answer(absl::OkStatus());  // nothing stepped
          Warm(core_, r.model(), result->version, warm_up,
               [&call](uint64_t) { call.Answer(absl::OkStatus()); });
        },
        call.Answerer());
  });
}

grpc::ServerUnaryReactor* ModelsService::DownloadWeights(grpc::CallbackServerContext* context,
                                                         const grpc::ByteBuffer* request,
                                                         grpc::ByteBuffer* response) {
  return ServeNow<v1::DownloadWeightsRequest, v1::WeightChunk>(
      core_, Rpc::kDownloadWeights, context, request, response,
      [this](const v1::DownloadWeightsRequest& r, v1::WeightChunk* out) -> absl::Status {
        MX_ASSIGN_OR_RETURN(LayerView view, core_.registry->Lookup(r.model(), r.layer(), 0));
        const LayerSpec& spec = view.weights->spec();
        if (r.role() != v1::TENSOR_ROLE_WEIGHT && r.role() != v1::TENSOR_ROLE_BIAS) {
          return absl::InvalidArgumentError(
              absl::StrCat("role: expected ", WireNameList(DescriptorOf<v1::TensorRole>(), true),
                           ", got ", static_cast<int>(r.role())));
        }
        const bool bias = r.role() == v1::TENSOR_ROLE_BIAS;
        if (bias && !spec.bias) {
          return absl::InvalidArgumentError(
              absl::StrCat("role: layer ", Quote(spec.name), " was registered without a bias"));
        }
        const v1::DType dtype = r.dtype() == v1::DTYPE_UNSPECIFIED ? v1::DTYPE_FP32 : r.dtype();
        if (dtype != v1::DTYPE_FP32 && dtype != v1::DTYPE_BF16) {
          return absl::InvalidArgumentError(absl::StrCat(
              "dtype: expected DTYPE_FP32 or DTYPE_BF16, got ", static_cast<int>(r.dtype())));
        }
        const size_t element_bytes = dtype == v1::DTYPE_FP32 ? 4 : 2;
        const std::span<const float> values =
            bias ? view.weights->bias() : std::span<const float>(view.weights->weight());
        if (r.offset_elements() >= values.size()) {
          return absl::InvalidArgumentError(
              absl::StrCat("offset_elements: expected below ", values.size(), " (the elements of ",
                           Quote(spec.name), bias ? ".bias" : ".weight", "), got ",
                           r.offset_elements()));
        }
        constexpr uint64_t kDefaultBytes = uint64_t{1} << 20;
        // What one answer may hold: the message limit, less room for the envelope.
        const uint64_t most =
            static_cast<uint64_t>(std::max<int64_t>(
                core_.max_message_bytes - static_cast<int64_t>(kEnvelopeBytes), 0)) /
            element_bytes;
        const uint64_t asked = r.max_elements() == 0
                                   ? std::min<uint64_t>(kDefaultBytes / element_bytes, most)
                                   : r.max_elements();
        if (asked > most || asked == 0) {
          return absl::InvalidArgumentError(absl::StrCat(
              "max_elements: at most ", most, " elements of ", element_bytes,
              " bytes fit one answer (--max-message-bytes), got ", asked));
        }
        const uint64_t count = std::min<uint64_t>(asked, values.size() - r.offset_elements());
        const float* from = values.data() + r.offset_elements();
        std::string* data = out->mutable_data();
        data->resize(count * element_bytes);
        if (dtype == v1::DTYPE_FP32) {
          std::memcpy(data->data(), from, count * sizeof(float));
        } else {
          FloatBytesToBf16(reinterpret_cast<const char*>(from), count, data->data());
        }
        out->set_model(r.model());
        out->set_layer(spec.name);
        out->set_role(r.role());
        out->set_dtype(dtype);
        out->set_offset_elements(r.offset_elements());
        out->set_weight_version(view.weights->version());
        return absl::OkStatus();
      });
}

}  // namespace mxserve
