#include "server/rpc/access.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "grpcpp/security/auth_context.h"
#include "server/base/quote.h"

namespace mxserve {

AccessRule RuleOf(Rpc rpc) {
  switch (rpc) {
    case Rpc::kGemm:
    case Rpc::kLayerForward:
    case Rpc::kLayersForward:
    case Rpc::kLayerBackward:
    case Rpc::kStream:
    case Rpc::kListModels:
    case Rpc::kDescribeModel:
    case Rpc::kDownloadWeights:  // reads, as a forward with an identity input would
    case Rpc::kGetPolicy:
    case Rpc::kListPolicies:
    case Rpc::kResolvePolicy:
    case Rpc::kGetEnergyReport:
    case Rpc::kGetProfile:
    case Rpc::kListProfiles:
    case Rpc::kExportProfile:
    case Rpc::kReportWork:  // books compute, as LayerForward does
      return {Role::kCompute, Owned::kNothing};
    case Rpc::kRegisterModel:  // creates a model its caller owns
    case Rpc::kReportPower:    // attributed to its caller
    case Rpc::kReportEnergy:   // as ReportPower: measured energy, attributed to its caller
      return {Role::kTrain, Owned::kNothing};
    case Rpc::kUploadWeights:
    case Rpc::kLoadSafetensors:
    case Rpc::kPublishVersion:
    case Rpc::kStepOptimizer:
    case Rpc::kDeleteModel:
    case Rpc::kSetActivePolicy:
    case Rpc::kProfileModel:
    case Rpc::kDeleteProfile:
    case Rpc::kGeneratePolicy:
      return {Role::kTrain, Owned::kModel};
    case Rpc::kPutPolicy:
    case Rpc::kDeletePolicy:
      return {Role::kTrain, Owned::kPolicy};
    case Rpc::kCount:
      break;
  }
  return {Role::kAdmin, Owned::kNothing};
}

std::string OwnedText(Owned owned) {
  switch (owned) {
    case Owned::kNothing:
      return "";
    case Owned::kModel:
      return "the model's owner";
    case Owned::kPolicy:
      return "the policy's owner";
  }
  return "";
}

namespace {

constexpr absl::string_view kNoCredentials =
    "no credentials: send `authorization: Bearer <token>` metadata (mxctl --token-file, "
    "Client(token=...), MXSERVE_TOKEN)";

absl::string_view OwnedNoun(Owned owned) { return owned == Owned::kPolicy ? "policy" : "model"; }

}  // namespace

absl::StatusOr<Principal> Access::Admit(Rpc rpc, const grpc::ServerContextBase& context) const {
  if (!tokens_) return AnonymousPrincipal();
  const Principal* who = nullptr;
  const auto& metadata = context.client_metadata();
  if (auto it = metadata.find("authorization"); it != metadata.end()) {
    absl::string_view value(it->second.data(), it->second.size());
    if (!absl::ConsumePrefix(&value, "Bearer ") && !absl::ConsumePrefix(&value, "bearer ")) {
      return absl::UnauthenticatedError(
          "authorization: expected `Bearer <token>` (the token of an --auth-tokens line)");
    }
    who = tokens_->FindToken(absl::StripAsciiWhitespace(value));
    if (who == nullptr) {
      return absl::UnauthenticatedError("the bearer token is not one of --auth-tokens");
    }
  } else if (tokens_->cert_count() > 0) {
    // Mutual TLS: gRPC has verified the certificate against --tls-client-ca.
    std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
    if (auth != nullptr && auth->IsPeerAuthenticated()) {
      std::string names;
      for (const grpc::string_ref& name : auth->FindPropertyValues("x509_common_name")) {
        const absl::string_view common_name(name.data(), name.size());
        if ((who = tokens_->FindCert(common_name)) != nullptr) break;
        absl::StrAppend(&names, names.empty() ? "" : ", ", Quote(common_name));
      }
      if (who == nullptr && !names.empty()) {
        return absl::UnauthenticatedError(absl::StrCat(
            "the client certificate's common name ", names,
            " is not one of --auth-tokens' cert: lines, and no bearer token was sent"));
      }
    }
  }
  if (who == nullptr) return absl::UnauthenticatedError(kNoCredentials);
  const AccessRule rule = RuleOf(rpc);
  if (who->role < rule.role) {
    const std::string needed = rule.owned == Owned::kNothing
                                   ? absl::StrCat("role ", RoleName(rule.role))
                                   : absl::StrCat("role admin or the ", OwnedNoun(rule.owned),
                                                  "'s owner with role ", RoleName(rule.role));
    return absl::PermissionDeniedError(absl::StrCat(RpcName(rpc), " needs ", needed, "; principal ",
                                                    Quote(who->name), " has role ",
                                                    RoleName(who->role)));
  }
  return *who;
}

absl::Status Access::CheckOwner(Rpc rpc, const Principal& who, absl::string_view owner,
                                absl::string_view what) const {
  if (who.role == Role::kAdmin || RuleOf(rpc).owned == Owned::kNothing || who.name == owner) {
    return absl::OkStatus();
  }
  return absl::PermissionDeniedError(absl::StrCat(
      RpcName(rpc), ": ", what, " belongs to ",
      owner.empty() ? std::string("no principal (built in, or loaded from --policy-dir)")
                    : Quote(owner),
      "; only its owner or a principal with role admin may change it, and principal ",
      Quote(who.name), " has role ", RoleName(who.role)));
}

absl::Status Access::BeginCall(const Principal& who) const {
  if (quotas_.inflight <= 0) return absl::OkStatus();
  MutexLock lock(&mu_);
  int64_t& count = inflight_[who.name];
  if (count >= quotas_.inflight) {
    return absl::ResourceExhaustedError(
        absl::StrCat("--quota-inflight: principal ", Quote(who.name), " has ", count,
                     " requests in flight, the limit is ", quotas_.inflight));
  }
  ++count;
  return absl::OkStatus();
}

void Access::EndCall(const Principal& who) const {
  if (quotas_.inflight <= 0) return;
  MutexLock lock(&mu_);
  auto it = inflight_.find(who.name);
  if (it != inflight_.end() && --it->second <= 0) inflight_.erase(it);
}

}  // namespace mxserve
