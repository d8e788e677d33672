// psrt-server: holds a shard of the job's keys and applies updates to them.
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <functional>
#include <memory>

#include "absl/cleanup/cleanup.h"
#include "absl/functional/bind_front.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/coordinator_link.h"
#include "common/daemon.h"
#include "common/flags.h"
#include "common/grpc_util.h"
#include "common/key_map.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "common/metrics_server.h"
#include "server/checkpoint_io.h"
#include "server/data_server.h"
#include "server/ps_service.h"
#include "server/replicator.h"
#include "server/store.h"

namespace {

// Static: the signal thread may outlive main's frame.
std::atomic<int> signal_received{0};

struct ServerFlags {
  std::string coordinator = psrt::EnvOr("PSRT_COORDINATOR", "");
  std::string token = psrt::EnvOr("PSRT_JOB_TOKEN", "");
  std::string host = psrt::HostName();
  std::string bind = "0.0.0.0";
  int index = -1, port = 0, data_port = 0, metrics_port = -1;
  double connect_timeout_s = 60;
  int64_t generation = 0;
};

// Exits after --help or a flag that does not parse (as Flags::ParseOrExit);
// an error's message is what psrt-server prints.
absl::StatusOr<ServerFlags> ParseFlags(int argc, char** argv) {
  ServerFlags f;
  psrt::Flags flags("psrt-server", "--coordinator=HOST:PORT --index=N [flags]");
  flags.Add("coordinator", &f.coordinator, "Address of psrt-coordinator (env PSRT_COORDINATOR).");
  flags.Add("index", &f.index, "This server's index in the job, 0..num_servers-1 (required).");
  flags.Add("host", &f.host, "Host name other processes use to reach this server.");
  flags.Add("bind", &f.bind, "Address to listen on.");
  flags.Add("port", &f.port, "Port to listen on; 0 picks a free one.");
  flags.Add("data-port", &f.data_port,
            "Port of the data channel (tensors beside gRPC); 0 picks a free one.");
  flags.Add("token", &f.token,
            "Job token every RPC must carry (env PSRT_JOB_TOKEN); empty disables the check.");
  flags.Add("metrics-port", &f.metrics_port,
            "Port for Prometheus /metrics; 0 picks one, -1 disables.");
  flags.Add("connect-timeout", &f.connect_timeout_s,
            "Seconds to wait for the coordinator at start.");
  flags.Add("generation", &f.generation,
            "The job generation this server is started for (by psrt-worker after a recovery); 0: "
            "the current one.");
  flags.ParseOrExit(argc, argv);
  if (f.coordinator.empty() || f.index < 0 || f.port < 0 || f.port > 65535 || f.data_port < 0 ||
      f.data_port > 65535 || f.connect_timeout_s <= 0 || f.generation < 0) {
    return absl::InvalidArgumentError(
        "need --coordinator, --index >= 0, --port and --data-port in 0..65535, --connect-timeout "
        "> 0 and --generation >= 0 (see --help)");
  }
  return f;
}

// The store's settings from the job's.
psrt::StoreOptions StoreOptionsFor(const psrt::v1::JobConfig& config, int index) {
  psrt::StoreOptions o;
  o.sync = config.mode() == "sync";
  o.num_workers = config.num_workers();
  o.average_gradients = config.average_gradients();
  o.staleness = config.mode() == "ssp" ? config.staleness() : -1;
  o.backup_workers = config.backup_workers();
  o.max_key_bytes = config.partition_bytes();
  o.restore_pending = !config.restore_uri().empty();
  o.fail_on_nonfinite = config.nonfinite() == "fail";
  // Short: such a key never took a step, so taking it as it is loses nothing
  // (docs/runtime.md, "Failures and job end").
  o.registration_wait = std::min(absl::Seconds(5), absl::Seconds(config.barrier_timeout_s()));
  const psrt::v1::Limits& limits = config.limits();
  // By default a server may fill 90% of its host's memory, not more.
  o.max_bytes = limits.max_server_bytes() > 0
                    ? limits.max_server_bytes()
                    : static_cast<int64_t>(0.9 * sysconf(_SC_PHYS_PAGES) * sysconf(_SC_PAGESIZE));
  o.max_variables = limits.max_variables();
  o.max_keys_per_variable = limits.max_keys_per_variable();
  if (limits.max_pull_wait_s() > 0) o.max_pull_wait = absl::Seconds(limits.max_pull_wait_s());
  o.self = index;
  return o;
}

// A copy asked for by clients that know it is served here now: the shard
// map that says so is asked for at once (from the link, once there is one,
// until it goes).
class LinkWaker {
 public:
  void Set(psrt::CoordinatorLink* link) {
    absl::MutexLock lock(&mu_);
    link_ = link;
  }
  void Wake() {
    absl::MutexLock lock(&mu_);
    if (link_ != nullptr) link_->Wake();
  }

 private:
  absl::Mutex mu_;
  psrt::CoordinatorLink* link_ ABSL_GUARDED_BY(mu_) = nullptr;
};

// "replicas": 1: this server's updates go to their copies on another server
// first, and it keeps the copies of the server it backs up. "max_servers":
// keys move between servers as servers join and leave, by the same copies.
// Null when the job has neither.
std::unique_ptr<psrt::Replicator> MakeReplicator(const psrt::v1::JobConfig& config, int index,
                                                 const std::string& token, psrt::Store* store,
                                                 std::function<void()> wake_link) {
  const int started = config.started_servers();
  if (config.replicas() == 0 && started == 0) return nullptr;
  auto replicator = std::make_unique<psrt::Replicator>(
      index, token, absl::Seconds(2 * config.heartbeat_timeout_s() + 5),
      config.transport() != "grpc",
      /*registered_copies=*/config.replicas() > 0 && started == 0, store);
  store->SetForward([r = replicator.get()](int owner, const std::string& variable,
                                           uint32_t partition, int64_t version, const float* grad,
                                           int64_t n, const psrt::Store::Origin& origin) {
    return r->Forward(owner, variable, partition, version, grad, n, origin);
  });
  store->SetSeedNew(
      [r = replicator.get()](int owner, const std::function<void(psrt::v1::SeedRequest*)>& fill) {
        return r->SeedNew(owner, fill);
      });
  // The coordinator hears at once that copies are built: until it does, a
  // loss of this server is not failed over to them.
  replicator->SetOnCopiesBuilt(std::move(wake_link));
  return replicator;
}

// Shards are written only under the job's checkpoint URI; a sync job's
// every_steps checkpoints are armed here. False (logged) when the URI
// cannot be opened.
bool SetUpCheckpoints(const psrt::v1::JobConfig& config, bool sync, psrt::PsService* service) {
  if (config.checkpoint().uri().empty()) return true;
  // Named exactly as the coordinator names it (its Storage::uri()).
  absl::StatusOr<std::unique_ptr<psrt::Storage>> root =
      psrt::OpenStorage(psrt::NormalizeUri(config.checkpoint().uri()));
  if (!root.ok()) {
    psrt::LogError("checkpoint.uri: ", root.status().message());
    return false;
  }
  service->saver()->Confine((*root)->uri());
  if (sync && config.checkpoint().every_steps() > 0) {
    service->saver()->ArmPeriodic(config.checkpoint().every_steps(), config.restored_step());
  }
  return true;
}

// Tensors beside gRPC, on a port of their own; under mutual TLS they stay
// on the encrypted gRPC channel (null).
absl::StatusOr<std::unique_ptr<psrt::DataServer>> StartDataServer(const ServerFlags& f,
                                                                  psrt::PsService* service) {
  if (psrt::TlsEnabled()) return nullptr;
  absl::StatusOr<std::unique_ptr<psrt::DataServer>> data = psrt::DataServer::Start(
      f.bind, f.data_port, f.token, absl::bind_front(&psrt::PsService::ServeData, service));
  if (data.ok()) service->set_data_port((*data)->port());
  return data;
}

psrt::CoordinatorLink::Options LinkOptions(const ServerFlags& f, const psrt::v1::JobConfig& config,
                                           int bound_port, psrt::Store* store,
                                           psrt::Replicator* replicator) {
  psrt::CoordinatorLink::Options o;
  o.coordinator = f.coordinator;
  o.token = f.token;
  o.id.set_role(psrt::v1::ROLE_SERVER);
  o.id.set_index(f.index);
  o.address = absl::StrCat(f.host, ":", bound_port);
  o.host = f.host;
  o.generation = f.generation;
  o.connect_timeout = absl::Seconds(f.connect_timeout_s);
  o.on_membership = [store](const psrt::v1::Membership& m) {
    store->SetMembership(m.epoch(), {m.active_workers().begin(), m.active_workers().end()});
    psrt::LogInfo("membership epoch ", m.epoch(), ": ", m.active_workers_size(), " active workers");
  };
  if (replicator != nullptr) {
    o.on_shard_map = [replicator](const psrt::v1::ShardMap& map) { replicator->Update(map); };
    o.copies_building = [replicator] { return replicator->CopiesBuilding(); };
    if (config.started_servers() > 0) o.moving = [replicator] { return replicator->HasCopies(); };
  }
  return o;
}

// This server's keys from the checkpoint `from`, with, under "max_servers",
// those of the servers that join later, which it serves until they do,
// and, under "replicas" on fixed servers, the copies it keeps (with
// "max_servers" they are built once the job runs).
absl::StatusOr<std::vector<psrt::Store::RestoredKey>> LoadKeys(const psrt::CheckpointRef& from,
                                                               const psrt::v1::JobConfig& config,
                                                               int index) {
  const int num_servers = config.num_servers();
  const int started = config.started_servers();
  // Server `shard`'s keys appended to `keys`, each marked by `mark`.
  auto append = [&](int shard, std::vector<psrt::Store::RestoredKey>* keys,
                    const std::function<void(psrt::Store::RestoredKey&)>& mark) -> absl::Status {
    absl::StatusOr<std::vector<psrt::Store::RestoredKey>> loaded =
        psrt::LoadServerKeys(from, shard, num_servers, config.partition_bytes());
    if (!loaded.ok()) return loaded.status();
    for (psrt::Store::RestoredKey& k : *loaded) {
      mark(k);
      keys->push_back(std::move(k));
    }
    return absl::OkStatus();
  };
  std::vector<psrt::Store::RestoredKey> keys;
  if (absl::Status s = append(index, &keys, [](psrt::Store::RestoredKey&) {}); !s.ok()) return s;
  for (int owner = started; started > 0 && owner < num_servers; ++owner) {
    if (psrt::InitialServer(owner, started) != index) continue;
    absl::Status s =
        append(owner, &keys, [owner](psrt::Store::RestoredKey& k) { k.owner = owner; });
    if (!s.ok()) return s;
  }
  if (config.replicas() > 0 && started == 0) {
    const int servers_per_host = num_servers / std::max(1, config.num_hosts());
    const int backed_up =
        (index + num_servers - psrt::BackupServer(0, num_servers, servers_per_host)) % num_servers;
    absl::Status s = append(backed_up, &keys,
                            [backed_up](psrt::Store::RestoredKey& k) { k.copy_of = backed_up; });
    if (!s.ok()) return s;
  }
  return keys;
}

// The job restores from a checkpoint: registrations wait until the keys
// are in. A spare server's keys are served elsewhere: it gets copies from
// those servers. False when the checkpoint cannot be read, which ends the
// job (reported, with the reason) before any training step.
bool RestoreKeys(const psrt::v1::JobConfig& config, int index, psrt::CoordinatorLink* link,
                 const psrt::v1::ProcessId& id, psrt::Store* store) {
  if (link->spare()) {
    store->FinishRestore(std::vector<psrt::Store::RestoredKey>{}, config.restored_step(), "");
    return true;
  }
  const absl::Time start = absl::Now();
  absl::StatusOr<psrt::CheckpointRef> from = psrt::OpenCheckpoint(config.restore_uri());
  absl::StatusOr<std::vector<psrt::Store::RestoredKey>> keys =
      from.ok() ? LoadKeys(*from, config, index) : from.status();
  const absl::Status loaded = keys.status();
  const size_t count = keys.ok() ? keys->size() : 0;
  store->FinishRestore(std::move(keys), config.restored_step(), config.restore_uri());
  if (!loaded.ok()) {
    const std::string what =
        absl::StrCat("cannot restore ", config.restore_uri(), ": ", loaded.message());
    psrt::LogError(what);
    link->ReportExit(id, 1, what).IgnoreError();
    return false;
  }
  psrt::LogInfo("restored ", count, " keys from ", config.restore_uri(), " (step ",
                config.restored_step(), ") in ", absl::FormatDuration(absl::Now() - start));
  return true;
}

// Serves until the job ends or a signal comes; returns the exit code.
int AwaitEnd(psrt::CoordinatorLink* link, const psrt::v1::ProcessId& id, int64_t generation) {
  psrt::CoordinatorLink::JobEnd end;
  while ((end = link->WaitForEnd(absl::Milliseconds(100))).state == psrt::v1::JOB_RUNNING &&
         signal_received == 0) {
  }
  if (signal_received != 0 && generation > 0 && psrt::ParentGone()) {
    // Its agent ended, and this signal is its PR_SET_PDEATHSIG: the loss is
    // the agent's, which psrt-run (or the agent's silence) reports; a report
    // from here would name this server as the process that died.
    psrt::LogWarning("stopped by signal ", signal_received.load(), ": its agent is gone");
    return 1;
  }
  if (signal_received != 0) {
    std::string why = absl::StrCat("stopped by signal ", signal_received.load());
    psrt::LogWarning(why);
    link->ReportExit(id, 1, why).IgnoreError();
    return 1;
  }
  if (end.left) {
    psrt::LogInfo(end.reason, "; exiting");
    return 0;
  }
  const int code = end.state == psrt::v1::JOB_SUCCEEDED ? 0 : 1;
  psrt::LogInfo("job ", code == 0 ? "succeeded" : "failed", ": ", end.reason, "; exiting");
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  absl::StatusOr<ServerFlags> f = ParseFlags(argc, argv);
  if (!f.ok()) {
    std::fprintf(stderr, "psrt-server: %s\n", std::string(f.status().message()).c_str());
    return 2;
  }
  psrt::InitProcess(absl::StrCat("psrt-server[", f->index, "]"));
  // A handler that hangs (a shard being written to a store that does not
  // answer) does not keep it past 10 s.
  psrt::HandleSignals([](int sig) { signal_received = sig; }, absl::Seconds(10));

  absl::StatusOr<psrt::v1::JobConfig> config =
      psrt::FetchJobConfig(f->coordinator, f->token, absl::Seconds(f->connect_timeout_s));
  if (!config.ok()) {
    psrt::LogError(config.status().message());
    return 1;
  }
  psrt::Metrics metrics("psrt_server");
  const psrt::StoreOptions store_options = StoreOptionsFor(*config, f->index);
  LinkWaker wake;  // before the store: outlives its last call
  auto wake_link = [&wake] { wake.Wake(); };
  psrt::Store store(store_options, &metrics);
  if (config->started_servers() > 0) store.SetOnCopyAsked(wake_link);
  psrt::PsService service(&store, &metrics, f->token, config->limits().max_calls_per_worker());
  std::unique_ptr<psrt::Replicator> replicator =
      MakeReplicator(*config, f->index, f->token, &store, wake_link);
  if (!SetUpCheckpoints(*config, store_options.sync, &service)) return 1;
  absl::StatusOr<std::unique_ptr<psrt::DataServer>> data = StartDataServer(*f, &service);
  if (!data.ok()) {
    psrt::LogError(data.status().message());
    return 1;
  }
  absl::StatusOr<psrt::ServingServer> serving =
      psrt::StartServer(f->bind, f->port, &service, f->token);
  if (!serving.ok()) {
    psrt::LogError(serving.status().message());
    return 1;
  }
  auto http = psrt::ServeMetrics(f->bind, f->metrics_port, &metrics);
  if (!http.ok()) {
    psrt::LogError(http.status().message());
    return 1;
  }

  const psrt::CoordinatorLink::Options link_options =
      LinkOptions(*f, *config, serving->port, &store, replicator.get());
  auto link = psrt::CoordinatorLink::Connect(link_options);
  if (!link.ok()) {
    psrt::LogError(link.status().message());
    return 1;
  }
  wake.Set(link->get());
  absl::Cleanup forget_link = [&wake] { wake.Set(nullptr); };
  psrt::LogInfo("serving on ", link_options.address, " (", config->mode(), " mode, ",
                config->num_workers(), " workers", psrt::TlsEnabled() ? ", mutual TLS" : "", ")");
  if (store_options.restore_pending &&
      !RestoreKeys(*config, f->index, link->get(), link_options.id, &store)) {
    serving->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    return 1;
  }
  const int code = AwaitEnd(link->get(), link_options.id, f->generation);
  store.Close();  // waiting pulls end now, so Shutdown has no handler to wait for
  serving->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  return code;
}
