#include "server/daemon.h"

#include <algorithm>
#include <limits>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <thread>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "google/protobuf/stubs/logging.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/impl/server_builder_option.h"
#include "grpcpp/impl/server_builder_plugin.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "mx/status_macros.h"
#include "prometheus/exposer.h"
#include "server/base/quote.h"
#include "server/energy_model_default.h"
#include "server/listener.h"
#include "server/rpc/call.h"
#include "server/rpc/compute_service.h"
#include "server/rpc/models_service.h"
#include "server/rpc/policies_service.h"
#include "server/rpc/profiles_service.h"
#include "server/rpc/telemetry_service.h"
#include "server/telemetry/log.h"
#include "server/tls.h"

namespace mxserve {
namespace {

// Four times a second: deletes the models whose lease ran out
// (RegisterModelRequest.lease_seconds), as DeleteModel would (their profiles go
// too), and gives freed weight memory back to the OS. Stops when destroyed.
class Housekeeper {
 public:
  explicit Housekeeper(const Core& core) : core_(core), thread_([this] { Loop(); }) {}
  ~Housekeeper() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }

 private:
  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!wake_.wait_for(lock, std::chrono::milliseconds(250), [this] { return stop_; })) {
      lock.unlock();
      const auto expired = core_.registry->DeleteExpired(std::chrono::steady_clock::now());
      for (const auto& [model, freed] : expired) {
        (void)core_.profiles->Delete(model, 0);
        Log(LogLevel::kInfo, "model_lease_expired",
            {{"model", model}, {"freed_bytes", absl::StrCat(freed)}});
      }
      if (!expired.empty()) core_.UpdateMemoryGauges();
      ReturnFreedMemory();
      lock.lock();
    }
  }

  // glibc keeps the pages of freed blocks below its mmap threshold (which rises
  // to 32 MiB after the first large free) in its arenas: a deleted 0.9 GB model
  // left the daemon 1.0-1.3 GB resident. Once the weights held drop by
  // kTrimBytes below their peak since the last trim (a delete, an expired lease,
  // a publish that released the old version), malloc_trim hands the free pages
  // of every arena back. Rare and bounded by the heap's size, so done here.
  void ReturnFreedMemory() {
    constexpr uint64_t kTrimBytes = 64 << 20;
    const uint64_t used = core_.registry->budget().used();
    peak_ = std::max(peak_, used);
    if (peak_ - used < kTrimBytes) return;
#if defined(__GLIBC__)
    malloc_trim(0);
#endif
    peak_ = used;
  }

  const Core& core_;
  uint64_t peak_ = 0;  // weight bytes held at most since the last trim
  std::mutex mu_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;  // last: starts once the members above exist
};

}  // namespace

// Members are destroyed in reverse order: the schedulers (and the requests they
// hold, with their LayerViews) go before the registry, and the registry (whose
// LayerWeights use its copy cache and preparer) before the budget and backend.
struct Daemon::State {
  DaemonOptions options;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<MemoryBudget> budget;
  std::unique_ptr<Registry> registry;
  std::unique_ptr<PolicyStore> policies;
  std::unique_ptr<Metrics> metrics;
  std::unique_ptr<EnergyLedger> ledger;
  ModelDirs model_dirs;
  std::unique_ptr<Scheduler> scheduler;
  std::unique_ptr<Scheduler> loader;
  std::unique_ptr<ProfileStore> profiles;
  std::unique_ptr<mx::kernels::ThreadPool> profile_pool;
  std::unique_ptr<Scheduler> profiler;
  CallTracker calls;
  std::unique_ptr<Access> access;
  Core core;
  std::unique_ptr<ComputeService> compute;
  std::unique_ptr<ModelsService> models;
  std::unique_ptr<PoliciesService> policies_service;
  std::unique_ptr<TelemetryService> telemetry;
  std::unique_ptr<ProfilesService> profiles_service;
  std::shared_ptr<TlsCredentials> tls;  // null: plaintext; outlives the server's ports
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<Listener> listener;  // hands the gRPC port's connections to `server`
  std::unique_ptr<prometheus::Exposer> exposer;
  // Last, so destroyed first: it stops before anything it deletes through goes.
  std::unique_ptr<Housekeeper> housekeeper;
  std::string grpc_address;
  std::string metrics_address;
  bool stopped = false;
};

namespace {

// "host:port" with the port replaced.
std::string WithPort(const std::string& address, int port) {
  const size_t colon = address.rfind(':');
  return absl::StrCat(address.substr(0, colon), ":", port);
}

absl::StatusOr<fpga_model::EnergyModelParams> LoadModel(const std::string& path) {
  if (path.empty()) return fpga_model::ParseEnergyModel(kDefaultEnergyModelJson);
  absl::StatusOr<fpga_model::EnergyModelParams> params = fpga_model::LoadEnergyModel(path);
  if (!params.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--energy-model: ", params.status().message()));
  }
  return params;
}

// protobuf's own log lines (it writes to stderr by default): a client whose
// string fields are not UTF-8 made it print one ERROR line per message, and
// could flood the daemon's log. Parse failures are answered INVALID_ARGUMENT
// (call.h); anything else protobuf reports becomes a logfmt warning.
void ProtobufLog(google::protobuf::LogLevel level, const char* filename, int line,
                 const std::string& message) {
  if (absl::StrContains(message, "parsing a protocol buffer")) return;
  Log(level >= google::protobuf::LOGLEVEL_ERROR ? LogLevel::kError : LogLevel::kWarning, "protobuf",
      {{"message", CapMessage(message)}, {"at", absl::StrCat(filename, ":", line)}});
}

// --reflection=false. Linking grpc++_reflection registers its plugin with every
// ServerBuilder (a static initialiser), so the plugin is taken out of this one.
class WithoutReflection : public grpc::ServerBuilderOption {
 public:
  void UpdateArguments(grpc::ChannelArguments*) override {}
  void UpdatePlugins(std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>* plugins) override {
    std::erase_if(*plugins, [](const std::unique_ptr<grpc::ServerBuilderPlugin>& plugin) {
      return plugin->name() == "proto_server_reflection";
    });
  }
};

constexpr const char* kServices[] = {"mxserve.v1.Compute", "mxserve.v1.Models",
                                     "mxserve.v1.Policies", "mxserve.v1.Profiles",
                                     "mxserve.v1.Telemetry"};

}  // namespace

Daemon::Daemon(std::unique_ptr<State> state) : state_(std::move(state)) {}

Daemon::~Daemon() { Shutdown(); }

const std::string& Daemon::grpc_address() const { return state_->grpc_address; }
const std::string& Daemon::metrics_address() const { return state_->metrics_address; }

absl::StatusOr<std::unique_ptr<Daemon>> Daemon::Start(const DaemonOptions& options) {
  google::protobuf::SetLogHandler(&ProtobufLog);
  auto s = std::make_unique<State>();
  s->options = options;
  const int hardware_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int kernel_threads = options.kernel_threads > 0 ? options.kernel_threads : hardware_threads;
  MX_ASSIGN_OR_RETURN(
      s->backend,
      MakeBackend(options.backend, {.kernel_threads = kernel_threads,
                                    .exact_bf16 = options.exact_bf16,
                                    .xclbin = options.xclbin,
                                    .fpga_device = static_cast<unsigned>(options.fpga_device)}));
  MX_ASSIGN_OR_RETURN(s->core.energy_model, LoadModel(options.energy_model));
  MX_ASSIGN_OR_RETURN(s->policies, PolicyStore::Create(options.policy_dir));
  if (!s->policies->Get(options.default_policy).ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--default-policy: no policy named '", options.default_policy, "'"));
  }
  MX_ASSIGN_OR_RETURN(s->model_dirs, ModelDirs::Create(options.model_dirs));
  s->budget = std::make_unique<MemoryBudget>(options.weight_memory_bytes);
  s->metrics = std::make_unique<Metrics>(options.backend);
  s->metrics->EnableModelEnergy(options.metrics_model_energy);
  // The card's measured energy starts at zero on /metrics, like the model's.
  if (options.backend == "fpga") s->metrics->DeclareEnergySource("fpga");
  s->registry = std::make_unique<Registry>(
      s->budget.get(),
      [backend = s->backend.get()](mx::QuantizedMatrix w) {
        return backend->PrepareWeight(std::move(w));
      },
      [metrics = s->metrics.get()](int evicted) { metrics->RecordEvictions(evicted); });
  s->ledger = std::make_unique<EnergyLedger>(
      EnergyLedgerLimits{.max_runs = static_cast<size_t>(options.max_energy_runs),
                         .max_models = static_cast<size_t>(options.max_energy_models)});
  Scheduler::Options scheduler_options;
  scheduler_options.workers =
      options.workers > 0 ? options.workers
                          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  scheduler_options.queue_capacity = options.queue_size;
  scheduler_options.batch_window = std::chrono::microseconds(options.batch_window_us);
  scheduler_options.max_batch = options.max_batch;
  Metrics* metrics = s->metrics.get();
  s->scheduler = std::make_unique<Scheduler>(
      scheduler_options, [metrics](size_t depth) { metrics->SetQueueDepth(double(depth)); });

  s->core.calls = &s->calls;
  std::optional<AuthTokens> tokens;
  if (!options.auth_tokens.empty()) {
    MX_ASSIGN_OR_RETURN(tokens, AuthTokens::Load(options.auth_tokens));
    Log(LogLevel::kInfo, "auth_tokens_loaded",
        {{"file", Quote(options.auth_tokens)},
         {"tokens", absl::StrCat(tokens->token_count())},
         {"certificates", absl::StrCat(tokens->cert_count())}});
  }
  s->access =
      std::make_unique<Access>(std::move(tokens), Quotas{.weight_bytes = options.quota_weight_bytes,
                                                         .inflight = options.quota_inflight,
                                                         .models = options.quota_models});
  s->core.access = s->access.get();
  s->core.registry = s->registry.get();
  s->core.policies = s->policies.get();
  // Safetensors loads and warm-ups read files and quantize whole models: their
  // own small pool, so they neither wait behind nor take the compute queue's
  // --queue-size room and workers.
  s->loader = std::make_unique<Scheduler>(
      Scheduler::Options{.workers = kLoaderThreads,
                         .queue_capacity = kLoaderQueue,
                         .queue_name = "model-load queue",
                         .queue_limit = absl::StrCat("at most ", kLoaderQueue, " loads wait")});
  // Profiles: computed on the CPU emulation, one batch at a time, on their own
  // worker and kernel threads, whatever the backend.
  s->profiles = std::make_unique<ProfileStore>();
  s->profile_pool = std::make_unique<mx::kernels::ThreadPool>(kernel_threads);
  s->profiler = std::make_unique<Scheduler>(Scheduler::Options{
      .workers = 1,
      .queue_capacity = kProfilerQueue,
      .queue_name = "profiler queue",
      .queue_limit =
          absl::StrCat("at most ", kProfilerQueue, " profile batches or generations wait")});
  s->core.profiles = s->profiles.get();
  s->core.profiler = s->profiler.get();
  s->core.profile_pool = s->profile_pool.get();
  s->core.scheduler = s->scheduler.get();
  s->core.loader = s->loader.get();
  s->core.backend = s->backend.get();
  s->core.metrics = s->metrics.get();
  s->core.ledger = s->ledger.get();
  s->core.default_policy = std::string(CanonicalPolicyName(options.default_policy));
  s->core.max_message_bytes = options.max_message_bytes;
  s->core.quota_weight_bytes = options.quota_weight_bytes;
  s->core.cache_update_copies = options.cache_update_copies;
  s->core.model_dirs = &s->model_dirs;
  s->core.max_power_series = options.max_power_series;
  s->core.power_sources = options.power_sources;
  s->core.max_power_watts = options.max_power_watts;
  s->core.UpdateMemoryGauges();
  s->housekeeper = std::make_unique<Housekeeper>(s->core);

  if (options.metrics_listen != "off") {
    try {
      s->exposer = std::make_unique<prometheus::Exposer>(options.metrics_listen);
    } catch (const std::exception& e) {
      return absl::UnavailableError(absl::StrCat("--metrics-listen: cannot listen on '",
                                                 options.metrics_listen, "': ", e.what()));
    }
    s->exposer->RegisterCollectable(s->metrics->registry());
    const std::vector<int> ports = s->exposer->GetListeningPorts();
    s->metrics_address =
        ports.empty() ? options.metrics_listen : WithPort(options.metrics_listen, ports.front());
  }

  s->compute = std::make_unique<ComputeService>(s->core);
  s->models = std::make_unique<ModelsService>(s->core);
  s->policies_service = std::make_unique<PoliciesService>(s->core);
  s->telemetry = std::make_unique<TelemetryService>(s->core);
  s->profiles_service = std::make_unique<ProfilesService>(s->core);

  std::shared_ptr<grpc::ServerCredentials> credentials = grpc::InsecureServerCredentials();
  if (!options.tls_cert.empty()) {
    MX_ASSIGN_OR_RETURN(s->tls, TlsCredentials::Create({.cert = options.tls_cert,
                                                        .key = options.tls_key,
                                                        .client_ca = options.tls_client_ca}));
    credentials = s->tls->ServerCredentials();
  }
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  // The port is the daemon's own (listener.h), its connections handed to gRPC.
  // Keep some descriptors for everything else: model files, the metrics port,
  // gRPC's own.
  constexpr int64_t kSpareDescriptors = 64;
  const int64_t descriptors = static_cast<int64_t>(OpenFileLimit()) - kSpareDescriptors;
  int max_connections = options.max_connections;
  if (descriptors < max_connections) {
    max_connections = static_cast<int>(std::max<int64_t>(1, descriptors));
    Log(LogLevel::kWarning, "max_connections_lowered",
        {{"max_connections", absl::StrCat(max_connections)},
         {"asked", absl::StrCat(options.max_connections)},
         {"open_file_limit", absl::StrCat(OpenFileLimit())},
         {"message", "the open-file limit leaves room for no more"}});
  }
  MX_ASSIGN_OR_RETURN(
      s->listener,
      Listener::Bind(options.listen,
                     {.max_connections = max_connections,
                      .on_open = [metrics](int64_t open) { metrics->SetConnections(double(open)); },
                      .on_refused =
                          [metrics](const char* reason) {
                            metrics->RecordConnectionRefused(reason);
                          }}));
  grpc::ServerBuilder builder;
  if (!options.reflection) builder.SetOption(std::make_unique<WithoutReflection>());
  std::unique_ptr<grpc::experimental::ExternalConnectionAcceptor> acceptor =
      builder.experimental().AddExternalConnectionAcceptor(
          grpc::ServerBuilder::experimental_type::ExternalConnectionType::FROM_FD, credentials);
  auto milliseconds = [](double seconds) {
    return static_cast<int>(std::min(seconds * 1000, double(std::numeric_limits<int>::max())));
  };
  builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS,
                             std::max(1, milliseconds(options.handshake_timeout_seconds)));
  if (options.idle_timeout_seconds > 0) {
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS,
                               std::max(1, milliseconds(options.idle_timeout_seconds)));
  }
  if (options.max_connection_age_seconds > 0) {
    const int age = std::max(1, milliseconds(options.max_connection_age_seconds));
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_MS, age);
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_GRACE_MS, age);
  }
  builder.SetMaxReceiveMessageSize(static_cast<int>(options.max_message_bytes));
  builder.SetMaxSendMessageSize(static_cast<int>(options.max_message_bytes));
  builder.RegisterService(s->compute.get());
  builder.RegisterService(s->models.get());
  builder.RegisterService(s->policies_service.get());
  builder.RegisterService(s->telemetry.get());
  builder.RegisterService(s->profiles_service.get());
  s->server = builder.BuildAndStart();
  if (!s->server) return absl::UnavailableError("the gRPC server did not start");
  s->listener->Start(std::move(acceptor));
  s->grpc_address = WithPort(options.listen, s->listener->port());
  grpc::HealthCheckServiceInterface* health = s->server->GetHealthCheckService();
  // Every backend is ready once made: the fpga backend opened its card and
  // loaded the xclbin in MakeBackend, before the server was built.
  health->SetServingStatus(true);
  for (const char* service : kServices) health->SetServingStatus(service, true);
  return std::unique_ptr<Daemon>(new Daemon(std::move(s)));
}

absl::Status Daemon::ReloadTls() {
  if (!state_->tls) return absl::FailedPreconditionError("TLS is off (no --tls-cert)");
  return state_->tls->Reload();
}

void Daemon::Shutdown() {
  if (!state_ || state_->stopped) return;
  state_->stopped = true;
  // New connections are refused from here (the kernel answers them).
  state_->listener->Stop();
  if (grpc::HealthCheckServiceInterface* health = state_->server->GetHealthCheckService()) {
    health->SetServingStatus(false);
  }
  const double grace = state_->options.grace_seconds;
  const auto deadline = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(grace * 1000));
  // New work is refused (UNAVAILABLE) from here; queued work still runs. New
  // profiling streams are refused, but the open ones' batches still reach the
  // profiler: a stream may complete within the grace, as an upload may.
  state_->scheduler->Stop();
  state_->loader->Stop();
  state_->profiles_service->StopAccepting();
  Scheduler* queues[] = {state_->scheduler.get(), state_->loader.get(), state_->profiler.get()};
  // Calls still reading or writing (streams, uploads) get the grace period.
  const bool idle = state_->calls.WaitIdle(deadline);
  if (!idle) {
    // The grace is a bound: what has not run is not run.
    const absl::Status stopped = absl::UnavailableError(absl::StrCat(
        "the daemon is stopping and its --grace-seconds (", grace,
        " s) ran out before this request ran; it was not computed"));
    const int64_t open = state_->calls.active();
    size_t cancelled = 0;
    for (Scheduler* queue : queues) cancelled += queue->CancelQueued(stopped);
    Log(LogLevel::kWarning, "grace_expired",
        {{"cancelled_queued", absl::StrCat(cancelled)},
         {"open_calls", absl::StrCat(open)},
         {"message", "queued work cancelled; calls still open are cancelled (UNAVAILABLE)"}});
    // Let those answers leave before the connections close: gRPC's cancellation
    // of the calls still open would overtake them, and their clients would read
    // "Cancelling all calls" instead of why. Bounded, from main's margin.
    state_->calls.WaitAtMost(open - static_cast<int64_t>(cancelled),
                             Clock::now() + std::chrono::milliseconds(400));
  }
  // Every answer is in the kernel's send queues, but the last ones may not have
  // left: a socket closed with bytes queued loses them to a reset at the
  // client's next window update. So the queues drain first, within the grace
  // (past it, briefly, for the answers above).
  // Calls other than compute are still answered meanwhile (a Describe, an
  // upload): the ones that arrive during the drain are waited for too.
  const auto drain_by = idle ? deadline : Clock::now() + std::chrono::milliseconds(200);
  int64_t unsent = state_->listener->AwaitSent(drain_by);
  while (state_->calls.active() > 0 && state_->calls.WaitIdle(drain_by)) {
    unsent = state_->listener->AwaitSent(drain_by);
  }
  if (unsent > 0) {
    Log(LogLevel::kWarning, "answers_unsent",
        {{"bytes", absl::StrCat(unsent)},
         {"message", "clients had not read these bytes of their answers when the grace ran out; "
                     "they are lost with the connections"}});
  }
  // Nothing is in flight (or the grace is over): close every connection now
  // rather than wait for clients that keep idle channels open. gRPC cancels the
  // calls still open (their clients see UNAVAILABLE) and returns once each has
  // finished: for a computation still running, when it ends. mxserved does not
  // wait for that (main.cc).
  state_->server->Shutdown(std::chrono::system_clock::now());
  state_->server->Wait();
}

}  // namespace mxserve
