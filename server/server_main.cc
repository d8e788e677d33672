// psrt-server: holds a shard of the job's keys and applies updates to them.
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <memory>

#include "absl/cleanup/cleanup.h"
#include "absl/functional/bind_front.h"
#include "absl/strings/str_cat.h"
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

int main(int argc, char** argv) {
  std::string coordinator = psrt::EnvOr("PSRT_COORDINATOR", "");
  std::string token = psrt::EnvOr("PSRT_JOB_TOKEN", "");
  std::string host = psrt::HostName();
  std::string bind = "0.0.0.0";
  int index = -1, port = 0, data_port = 0, metrics_port = -1;
  double connect_timeout_s = 60;
  int64_t generation = 0;
  psrt::Flags flags("psrt-server", "--coordinator=HOST:PORT --index=N [flags]");
  flags.Add("coordinator", &coordinator, "Address of psrt-coordinator (env PSRT_COORDINATOR).");
  flags.Add("index", &index, "This server's index in the job, 0..num_servers-1 (required).");
  flags.Add("host", &host, "Host name other processes use to reach this server.");
  flags.Add("bind", &bind, "Address to listen on.");
  flags.Add("port", &port, "Port to listen on; 0 picks a free one.");
  flags.Add("data-port", &data_port,
            "Port of the data channel (tensors beside gRPC); 0 picks a free one.");
  flags.Add("token", &token, "Job token every RPC must carry (env PSRT_JOB_TOKEN); empty disables the check.");
  flags.Add("metrics-port", &metrics_port, "Port for Prometheus /metrics; 0 picks one, -1 disables.");
  flags.Add("connect-timeout", &connect_timeout_s, "Seconds to wait for the coordinator at start.");
  flags.Add("generation", &generation,
            "The job generation this server is started for (by psrt-worker after a recovery); 0: the current one.");
  flags.ParseOrExit(argc, argv);
  if (coordinator.empty() || index < 0 || port < 0 || port > 65535 || data_port < 0 ||
      data_port > 65535 || connect_timeout_s <= 0 || generation < 0) {
    std::fprintf(stderr, "psrt-server: need --coordinator, --index >= 0, --port and --data-port in 0..65535, --connect-timeout > 0 and --generation >= 0 (see --help)\n");
    return 2;
  }
  psrt::InitProcess(absl::StrCat("psrt-server[", index, "]"));
  // Static: the signal thread may outlive main's frame. A handler that
  // hangs (a shard being written to a store that does not answer) does not
  // keep it past 10 s.
  static std::atomic<int> signal_received{0};
  psrt::HandleSignals([](int sig) { signal_received = sig; }, absl::Seconds(10));

  absl::StatusOr<psrt::v1::JobConfig> config =
      psrt::FetchJobConfig(coordinator, token, absl::Seconds(connect_timeout_s));
  if (!config.ok()) {
    psrt::LogError(config.status().message());
    return 1;
  }
  psrt::Metrics metrics("psrt_server");
  psrt::StoreOptions store_options;
  store_options.sync = config->mode() == "sync";
  store_options.num_workers = config->num_workers();
  store_options.average_gradients = config->average_gradients();
  store_options.staleness = config->mode() == "ssp" ? config->staleness() : -1;
  store_options.backup_workers = config->backup_workers();
  store_options.max_key_bytes = config->partition_bytes();
  store_options.restore_pending = !config->restore_uri().empty();
  store_options.fail_on_nonfinite = config->nonfinite() == "fail";
  // Short: such a key never took a step, so taking it as it is loses nothing
  // (docs/runtime.md, "Failures and job end").
  store_options.registration_wait =
      std::min(absl::Seconds(5), absl::Seconds(config->barrier_timeout_s()));
  const psrt::v1::Limits& limits = config->limits();
  // By default a server may fill 90% of its host's memory, not more.
  store_options.max_bytes = limits.max_server_bytes() > 0
                                ? limits.max_server_bytes()
                                : static_cast<int64_t>(0.9 * sysconf(_SC_PHYS_PAGES) * sysconf(_SC_PAGESIZE));
  store_options.max_variables = limits.max_variables();
  store_options.max_keys_per_variable = limits.max_keys_per_variable();
  if (limits.max_pull_wait_s() > 0) store_options.max_pull_wait = absl::Seconds(limits.max_pull_wait_s());
  store_options.self = index;
  // A copy asked for by clients that know it is served here now: the shard
  // map that says so is asked for at once (from the link, once there is
  // one, until it goes). Before the store: outlives its last call.
  struct {
    absl::Mutex mu;
    psrt::CoordinatorLink* link ABSL_GUARDED_BY(mu) = nullptr;
  } wake;
  auto wake_link = [&] {
    absl::MutexLock lock(&wake.mu);
    if (wake.link != nullptr) wake.link->Wake();
  };
  psrt::Store store(store_options, &metrics);
  if (config->started_servers() > 0) store.SetOnCopyAsked(wake_link);
  psrt::PsService service(&store, &metrics, token, limits.max_calls_per_worker());
  // "replicas": 1: this server's updates go to their copies on another
  // server first, and it keeps the copies of the server it backs up.
  const int num_servers = config->num_servers();
  const int servers_per_host = num_servers / std::max(1, config->num_hosts());
  const int backed_up = (index + num_servers - psrt::BackupServer(0, num_servers, servers_per_host)) % num_servers;
  // "max_servers": keys move between servers as servers join and leave, by
  // the same copies.
  const int started = config->started_servers();
  std::unique_ptr<psrt::Replicator> replicator;
  if (config->replicas() > 0 || started > 0) {
    replicator = std::make_unique<psrt::Replicator>(
        index, token, absl::Seconds(2 * config->heartbeat_timeout_s() + 5),
        config->transport() != "grpc",
        /*registered_copies=*/config->replicas() > 0 && started == 0, &store);
    store.SetForward([r = replicator.get()](int owner, const std::string& variable, uint32_t partition,
                                            int64_t version, const float* grad, int64_t n,
                                            const psrt::Store::Origin& origin) {
      return r->Forward(owner, variable, partition, version, grad, n, origin);
    });
    store.SetSeedNew(
        [r = replicator.get()](int owner, const std::function<void(psrt::v1::SeedRequest*)>& fill) {
          return r->SeedNew(owner, fill);
        });
    // The coordinator hears at once that copies are built: until it does, a
    // loss of this server is not failed over to them.
    replicator->SetOnCopiesBuilt(wake_link);
  }

  if (!config->checkpoint().uri().empty()) {
    // Named exactly as the coordinator names it (its Storage::uri()).
    absl::StatusOr<std::unique_ptr<psrt::Storage>> root =
        psrt::OpenStorage(psrt::NormalizeUri(config->checkpoint().uri()));
    if (!root.ok()) {
      psrt::LogError("checkpoint.uri: ", root.status().message());
      return 1;
    }
    service.saver()->Confine((*root)->uri());
    if (store_options.sync && config->checkpoint().every_steps() > 0) {
      service.saver()->ArmPeriodic(config->checkpoint().every_steps(), config->restored_step());
    }
  }
  // Tensors beside gRPC, on a port of their own; under mutual TLS they stay
  // on the encrypted gRPC channel.
  std::unique_ptr<psrt::DataServer> data;
  if (!psrt::TlsEnabled()) {
    absl::StatusOr<std::unique_ptr<psrt::DataServer>> started =
        psrt::DataServer::Start(bind, data_port, token,
                                absl::bind_front(&psrt::PsService::ServeData, &service));
    if (!started.ok()) {
      psrt::LogError(started.status().message());
      return 1;
    }
    data = *std::move(started);
    service.set_data_port(data->port());
  }
  absl::StatusOr<psrt::ServingServer> serving = psrt::StartServer(bind, port, &service, token);
  if (!serving.ok()) {
    psrt::LogError(serving.status().message());
    return 1;
  }
  const int bound_port = serving->port;
  auto http = psrt::ServeMetrics(bind, metrics_port, &metrics);
  if (!http.ok()) {
    psrt::LogError(http.status().message());
    return 1;
  }

  psrt::CoordinatorLink::Options link_options;
  link_options.coordinator = coordinator;
  link_options.token = token;
  link_options.id.set_role(psrt::v1::ROLE_SERVER);
  link_options.id.set_index(index);
  link_options.address = absl::StrCat(host, ":", bound_port);
  link_options.host = host;
  link_options.generation = generation;
  link_options.connect_timeout = absl::Seconds(connect_timeout_s);
  link_options.on_membership = [&store](const psrt::v1::Membership& m) {
    store.SetMembership(m.epoch(), {m.active_workers().begin(), m.active_workers().end()});
    psrt::LogInfo("membership epoch ", m.epoch(), ": ", m.active_workers_size(), " active workers");
  };
  if (replicator != nullptr) {
    link_options.on_shard_map = [r = replicator.get()](const psrt::v1::ShardMap& map) { r->Update(map); };
    link_options.copies_building = [r = replicator.get()] { return r->CopiesBuilding(); };
    if (started > 0) link_options.moving = [r = replicator.get()] { return r->HasCopies(); };
  }
  auto link = psrt::CoordinatorLink::Connect(link_options);
  if (!link.ok()) {
    psrt::LogError(link.status().message());
    return 1;
  }
  {
    absl::MutexLock lock(&wake.mu);
    wake.link = link->get();
  }
  absl::Cleanup forget_link = [&] {
    absl::MutexLock lock(&wake.mu);
    wake.link = nullptr;
  };
  psrt::LogInfo("serving on ", link_options.address, " (", config->mode(), " mode, ",
                config->num_workers(), " workers", psrt::TlsEnabled() ? ", mutual TLS" : "", ")");
  if (store_options.restore_pending && (*link)->spare()) {
    // Its keys are served elsewhere: it gets copies from those servers.
    store.FinishRestore(std::vector<psrt::Store::RestoredKey>{}, config->restored_step(), "");
  } else if (store_options.restore_pending) {
    // Registrations wait until the keys are in; a checkpoint that cannot be
    // read ends the job, with the reason, before any training step.
    const absl::Time start = absl::Now();
    absl::StatusOr<psrt::CheckpointRef> from = psrt::OpenCheckpoint(config->restore_uri());
    absl::StatusOr<std::vector<psrt::Store::RestoredKey>> keys =
        from.ok() ? psrt::LoadServerKeys(*from, index, config->num_servers(), config->partition_bytes())
                  : from.status();
    // "max_servers": the keys of the servers that join later, which this
    // one serves until they do.
    for (int owner = started; started > 0 && keys.ok() && owner < num_servers; ++owner) {
      if (psrt::InitialServer(owner, started) != index) continue;
      absl::StatusOr<std::vector<psrt::Store::RestoredKey>> theirs =
          psrt::LoadServerKeys(*from, owner, num_servers, config->partition_bytes());
      if (!theirs.ok()) {
        keys = theirs.status();
        break;
      }
      for (psrt::Store::RestoredKey& k : *theirs) {
        k.owner = owner;
        keys->push_back(std::move(k));
      }
    }
    // "replicas" on fixed servers: the copies this server keeps (with
    // "max_servers" they are built once the job runs).
    if (keys.ok() && config->replicas() > 0 && started == 0) {
      absl::StatusOr<std::vector<psrt::Store::RestoredKey>> copies =
          psrt::LoadServerKeys(*from, backed_up, num_servers, config->partition_bytes());
      if (copies.ok()) {
        for (psrt::Store::RestoredKey& k : *copies) {
          k.copy_of = backed_up;
          keys->push_back(std::move(k));
        }
      } else {
        keys = copies.status();
      }
    }
    const absl::Status loaded = keys.status();
    const size_t count = keys.ok() ? keys->size() : 0;
    store.FinishRestore(std::move(keys), config->restored_step(), config->restore_uri());
    if (!loaded.ok()) {
      const std::string what = absl::StrCat("cannot restore ", config->restore_uri(), ": ", loaded.message());
      psrt::LogError(what);
      (*link)->ReportExit(link_options.id, 1, what).IgnoreError();
      serving->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
      return 1;
    }
    psrt::LogInfo("restored ", count, " keys from ", config->restore_uri(), " (step ",
                  config->restored_step(), ") in ", absl::FormatDuration(absl::Now() - start));
  }

  psrt::CoordinatorLink::JobEnd end;
  while ((end = (*link)->WaitForEnd(absl::Milliseconds(100))).state == psrt::v1::JOB_RUNNING &&
         signal_received == 0) {
  }
  int code = 0;
  if (signal_received != 0 && generation > 0 && psrt::ParentGone()) {
    // Its agent ended, and this signal is its PR_SET_PDEATHSIG: the loss is
    // the agent's, which psrt-run (or the agent's silence) reports; a report
    // from here would name this server as the process that died.
    psrt::LogWarning("stopped by signal ", signal_received.load(), ": its agent is gone");
    code = 1;
  } else if (signal_received != 0) {
    std::string why = absl::StrCat("stopped by signal ", signal_received.load());
    psrt::LogWarning(why);
    (*link)->ReportExit(link_options.id, 1, why).IgnoreError();
    code = 1;
  } else if (end.left) {
    psrt::LogInfo(end.reason, "; exiting");
  } else {
    code = end.state == psrt::v1::JOB_SUCCEEDED ? 0 : 1;
    psrt::LogInfo("job ", code == 0 ? "succeeded" : "failed", ": ", end.reason, "; exiting");
  }
  store.Close();  // waiting pulls end now, so Shutdown has no handler to wait for
  serving->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  return code;
}
