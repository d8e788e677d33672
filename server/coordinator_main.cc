// psrt-coordinator: membership, readiness, heartbeats, checkpoints and the
// job's end.
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "common/daemon.h"
#include "common/distribution.h"
#include "common/flags.h"
#include "common/grpc_util.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "common/metrics_server.h"
#include "server/checkpoint/catalog.h"
#include "server/checkpointer.h"
#include "server/coordinator.h"

int main(int argc, char** argv) {
  std::string bind = "0.0.0.0", hosts = "localhost", port_file;
  std::string distribution = R"({"parameter_server": {"enabled": true}})";
  std::string token = psrt::EnvOr("PSRT_JOB_TOKEN", "");
  int port = 7070, metrics_port = -1;
  double stop_grace_s = 30;
  bool restarted = false;
  psrt::Flags flags("psrt-coordinator", "--hosts=H1,H2 --distribution=JSON [flags]");
  flags.Add("hosts", &hosts,
            "Comma-separated hosts of the job; host i runs servers and workers of index i.");
  flags.Add("distribution", &distribution,
            "The parameter_server distribution option as JSON (see psrt-run --help).");
  flags.Add("bind", &bind, "Address to listen on.");
  flags.Add("port", &port, "Port to listen on; 0 picks a free one.");
  flags.Add("port-file", &port_file, "Write the bound port to this file once listening.");
  flags.Add("token", &token,
            "Job token every RPC must carry (env PSRT_JOB_TOKEN); empty disables the check.");
  flags.Add("metrics-port", &metrics_port,
            "Port for Prometheus /metrics; 0 picks one, -1 disables.");
  flags.Add("stop-grace", &stop_grace_s,
            "Seconds a SIGTERM or SIGINT leaves for the job's final checkpoint before the job ends "
            "(a second signal ends it at once).");
  flags.Add(
      "restarted", &restarted,
      "The job's coordinator was lost (on_failure \"recover\"): go on from the job record next to "
      "its checkpoints, as its next generation.");
  flags.ParseOrExit(argc, argv);
  psrt::InitProcess("psrt-coordinator");

  absl::StatusOr<psrt::PsOptions> ps = psrt::ParseDistribution(distribution);
  if (!ps.ok()) {
    std::fprintf(stderr, "psrt-coordinator: --distribution: %s\n",
                 std::string(ps.status().message()).c_str());
    return 2;
  }
  if (port < 0 || port > 65535) {
    std::fprintf(stderr, "psrt-coordinator: --port must be in 0..65535\n");
    return 2;
  }
  if (!(stop_grace_s >= 0)) {
    std::fprintf(stderr, "psrt-coordinator: --stop-grace must be >= 0\n");
    return 2;
  }
  psrt::CoordinatorOptions options;
  psrt::Metrics metrics("psrt_coordinator");
  options.hosts = absl::StrSplit(hosts, ',', absl::SkipEmpty());
  if (options.hosts.empty()) {
    std::fprintf(stderr, "psrt-coordinator: --hosts names no host\n");
    return 2;
  }
  const int num_servers = static_cast<int>(options.hosts.size()) * ps->servers_per_host;
  if (ps->replicas >= num_servers) {
    std::fprintf(
        stderr,
        "psrt-coordinator: --distribution: 'replicas' is %d but the job has %d server%s; a key's "
        "backup lives on another server, so replicas must be less than the number of servers\n",
        ps->replicas, num_servers, num_servers == 1 ? "" : "s");
    return 2;
  }
  if (ps->max_servers > 0 && ps->max_servers < num_servers) {
    std::fprintf(
        stderr,
        "psrt-coordinator: --distribution: 'max_servers' is %d but the job starts %d servers; "
        "set it to at least that many\n",
        ps->max_servers, num_servers);
    return 2;
  }
  options.ps = *ps;
  options.token = token;
  psrt::GrpcServerCalls server_calls(token);  // outlives the job
  options.server_calls = &server_calls;

  // Signals are handled on one thread of their own: block them before the
  // service starts its threads.
  // The service while it lives: a signal during start-up or after the end
  // just exits, one meanwhile stops the job after a final checkpoint, or at
  // once when the process that started it is gone (under the lock, so the
  // service cannot go away in the middle). Whatever hangs, the coordinator
  // exits within the grace, the end's notice to the others, and a margin.
  static absl::Mutex running_mu;
  static psrt::Job* running ABSL_GUARDED_BY(running_mu) = nullptr;
  const absl::Duration stop_grace = absl::Seconds(stop_grace_s);
  psrt::HandleSignals(
      [stop_grace](int sig) {
        absl::MutexLock lock(&running_mu);
        if (running == nullptr) std::_Exit(1);
        const std::string why =
            absl::StrCat("the coordinator got signal ", sig, " (", strsignal(sig), ")");
        if (psrt::ParentGone()) {
          running->Fail(absl::StrCat(why, ": the process that started it is gone"));
        } else {
          running->StopJob(why, stop_grace);
        }
      },
      stop_grace + absl::Seconds(ps->heartbeat_timeout_s) + absl::Seconds(10));
  // Checkpoint destination and restore source are checked before anything
  // starts: a bad bucket, credentials or checkpoint ends the job here.
  std::unique_ptr<psrt::Checkpointer> checkpointer;
  if (!ps->restore.empty()) {
    absl::StatusOr<psrt::CheckpointRef> from =
        psrt::ResolveCheckpoint(ps->restore, ps->checkpoint.uri);
    if (!from.ok()) {
      psrt::LogError("cannot restore '", ps->restore, "': ", from.status().message());
      return 1;
    }
    options.restore_uri = from->uri();
    options.restored_step = from->manifest.step();
    psrt::LogInfo("restoring ", options.restore_uri, " (step ", options.restored_step,
                  ", written by ", from->manifest.num_servers(), " servers)");
  }
  if (!ps->checkpoint.uri.empty()) {
    psrt::CheckpointerOptions c;
    c.config.set_uri(ps->checkpoint.uri);
    c.config.set_every_steps(ps->checkpoint.every_steps);
    c.config.set_every_seconds(ps->checkpoint.every_seconds);
    c.config.set_keep(ps->checkpoint.keep);
    c.mode = ps->mode;
    c.partition_bytes = ps->partition_bytes;
    c.token = token;
    absl::StatusOr<std::unique_ptr<psrt::Checkpointer>> opened =
        psrt::Checkpointer::Open(c, &metrics);
    if (!opened.ok()) {
      psrt::LogError("checkpoint.uri: ", opened.status().message());
      return 1;
    }
    checkpointer = *std::move(opened);
    options.checkpointer = checkpointer.get();
  }
  if (restarted) {
    if (checkpointer == nullptr || ps->on_failure != "recover") {
      psrt::LogError(
          "--restarted needs on_failure \"recover\" and checkpoint.uri in the distribution");
      return 2;
    }
    absl::StatusOr<psrt::v1::JobRecord> record = checkpointer->ReadRecord();
    if (!record.ok()) {
      psrt::LogError("cannot go on after the coordinator's loss: ", record.status().message());
      return 1;
    }
    options.generation = record->generation() + 1;
    options.restore_uri = record->checkpoint_uri();
    options.restored_step = record->checkpoint_step();
    options.hosts_in_job.assign(record->hosts().begin(), record->hosts().end());
    if (options.generation - 1 > ps->max_recoveries) {
      psrt::LogError("job failed: the coordinator was lost; no recovery left (max_recoveries is ",
                     ps->max_recoveries, ")");
      return 1;
    }
    psrt::LogWarning(
        "recovery ", options.generation - 1, " of at most ", ps->max_recoveries,
        ": the coordinator was lost and restarted; rolled back to step ", options.restored_step,
        options.restore_uri.empty() ? " (the start: nothing was checkpointed yet)"
                                    : absl::StrCat(" (", options.restore_uri, ")"),
        "; restarting every server and training process (generation ", options.generation, ")");
  }

  psrt::Job job(options, &metrics);
  psrt::CoordinatorService service(&job, token);
  {
    absl::MutexLock lock(&running_mu);
    running = &job;
  }
  absl::Cleanup gone = [] {  // on every way out, before the job goes
    absl::MutexLock lock(&running_mu);
    running = nullptr;
  };
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
  if (!port_file.empty()) {
    const std::string tmp = port_file + ".tmp";
    std::ofstream(tmp) << bound_port << "\n";
    std::rename(tmp.c_str(), port_file.c_str());
  }
  psrt::LogInfo("listening on ", bind, ":", bound_port, " for ", job.config().num_servers(),
                " servers and ", job.config().num_workers(), " workers on ", options.hosts.size(),
                " hosts (", job.config().mode(), " mode", psrt::TlsEnabled() ? ", mutual TLS" : "",
                ")");
  const psrt::v1::JobState state = job.WaitForEnd();
  if (checkpointer != nullptr) checkpointer->Stop();
  serving->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  psrt::LogInfo("exiting");
  return state == psrt::v1::JOB_SUCCEEDED ? 0 : 1;
}
