// psrt-coordinator: membership, readiness, heartbeats, checkpoints and the
// job's end.
#include <grpcpp/grpcpp.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>

#include "absl/base/attributes.h"
#include "absl/base/const_init.h"
#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
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

namespace {

struct CoordinatorFlags {
  std::string bind = "0.0.0.0", hosts = "localhost", port_file;
  std::string distribution = R"({"parameter_server": {"enabled": true}})";
  std::string token = psrt::EnvOr("PSRT_JOB_TOKEN", "");
  int port = 7070, metrics_port = -1;
  double stop_grace_s = 30;
  bool restarted = false;
};

void AddFlags(psrt::Flags* flags, CoordinatorFlags* f) {
  flags->Add("hosts", &f->hosts,
             "Comma-separated hosts of the job; host i runs servers and workers of index i.");
  flags->Add("distribution", &f->distribution,
             "The parameter_server distribution option as JSON (see psrt-run --help).");
  flags->Add("bind", &f->bind, "Address to listen on.");
  flags->Add("port", &f->port, "Port to listen on; 0 picks a free one.");
  flags->Add("port-file", &f->port_file, "Write the bound port to this file once listening.");
  flags->Add("token", &f->token,
             "Job token every RPC must carry (env PSRT_JOB_TOKEN); empty disables the check.");
  flags->Add("metrics-port", &f->metrics_port,
             "Port for Prometheus /metrics; 0 picks one, -1 disables.");
  flags->Add("stop-grace", &f->stop_grace_s,
             "Seconds a SIGTERM or SIGINT leaves for the job's final checkpoint before the job "
             "ends (a second signal ends it at once).");
  flags->Add(
      "restarted", &f->restarted,
      "The job's coordinator was lost (on_failure \"recover\"): go on from the job record next to "
      "its checkpoints, as its next generation.");
}

// The job's options from the flags and the distribution, checked; an
// error's message is what psrt-coordinator prints.
absl::StatusOr<psrt::CoordinatorOptions> CheckFlags(const CoordinatorFlags& f) {
  absl::StatusOr<psrt::PsOptions> ps = psrt::ParseDistribution(f.distribution);
  if (!ps.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--distribution: ", ps.status().message()));
  }
  if (f.port < 0 || f.port > 65535) {
    return absl::InvalidArgumentError("--port must be in 0..65535");
  }
  if (!(f.stop_grace_s >= 0)) return absl::InvalidArgumentError("--stop-grace must be >= 0");
  psrt::CoordinatorOptions options;
  options.hosts = absl::StrSplit(f.hosts, ',', absl::SkipEmpty());
  if (options.hosts.empty()) return absl::InvalidArgumentError("--hosts names no host");
  const int num_servers = static_cast<int>(options.hosts.size()) * ps->servers_per_host;
  if (ps->replicas >= num_servers) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--distribution: 'replicas' is %d but the job has %d server%s; a key's backup lives on "
        "another server, so replicas must be less than the number of servers",
        ps->replicas, num_servers, num_servers == 1 ? "" : "s"));
  }
  if (ps->max_servers > 0 && ps->max_servers < num_servers) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--distribution: 'max_servers' is %d but the job starts %d servers; set "
                        "it to at least that many",
                        ps->max_servers, num_servers));
  }
  options.ps = *ps;
  options.token = f.token;
  return options;
}

// The job while it lives, for the signal handler: under the lock, so that
// it cannot go away in the middle.
ABSL_CONST_INIT absl::Mutex running_mu(absl::kConstInit);
psrt::Job* running ABSL_GUARDED_BY(running_mu) = nullptr;

void SetRunning(psrt::Job* job) {
  absl::MutexLock lock(&running_mu);
  running = job;
}

// Signals are handled on a thread of their own: called before the service
// starts its threads. A signal during start-up or after the end just
// exits, one meanwhile stops the job after a final checkpoint, or at once
// when the process that started it is gone. Whatever hangs, the
// coordinator exits within the grace, the end's notice to the others, and
// a margin.
void HandleStopSignals(absl::Duration stop_grace, absl::Duration heartbeat_timeout) {
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
      stop_grace + heartbeat_timeout + absl::Seconds(10));
}

// The checkpoint to restore, checked before anything starts: a bad one ends
// the job here. False (logged) when it cannot be read.
bool ResolveRestore(const psrt::PsOptions& ps, psrt::CoordinatorOptions* options) {
  absl::StatusOr<psrt::CheckpointRef> from = psrt::ResolveCheckpoint(ps.restore, ps.checkpoint.uri);
  if (!from.ok()) {
    psrt::LogError("cannot restore '", ps.restore, "': ", from.status().message());
    return false;
  }
  options->restore_uri = from->uri();
  options->restored_step = from->manifest.step();
  psrt::LogInfo("restoring ", options->restore_uri, " (step ", options->restored_step,
                ", written by ", from->manifest.num_servers(), " servers)");
  return true;
}

// The checkpoint destination, opened before anything starts: a bad bucket
// or credentials end the job here. Null without checkpoint.uri.
absl::StatusOr<std::unique_ptr<psrt::Checkpointer>> OpenCheckpointer(const psrt::PsOptions& ps,
                                                                     const std::string& token,
                                                                     psrt::Metrics* metrics) {
  if (ps.checkpoint.uri.empty()) return nullptr;
  psrt::CheckpointerOptions c;
  c.config.set_uri(ps.checkpoint.uri);
  c.config.set_every_steps(ps.checkpoint.every_steps);
  c.config.set_every_seconds(ps.checkpoint.every_seconds);
  c.config.set_keep(ps.checkpoint.keep);
  c.mode = ps.mode;
  c.partition_bytes = ps.partition_bytes;
  c.token = token;
  return psrt::Checkpointer::Open(c, metrics);
}

// --restarted: the job goes on from its record as its next generation,
// from the record's checkpoint and hosts. False (logged) when it cannot.
bool GoOnFromRecord(psrt::Checkpointer* checkpointer, psrt::CoordinatorOptions* options) {
  const psrt::PsOptions& ps = options->ps;
  absl::StatusOr<psrt::v1::JobRecord> record = checkpointer->ReadRecord();
  if (!record.ok()) {
    psrt::LogError("cannot go on after the coordinator's loss: ", record.status().message());
    return false;
  }
  options->generation = record->generation() + 1;
  options->restore_uri = record->checkpoint_uri();
  options->restored_step = record->checkpoint_step();
  options->hosts_in_job.assign(record->hosts().begin(), record->hosts().end());
  if (options->generation - 1 > ps.max_recoveries) {
    psrt::LogError("job failed: the coordinator was lost; no recovery left (max_recoveries is ",
                   ps.max_recoveries, ")");
    return false;
  }
  psrt::LogWarning(
      "recovery ", options->generation - 1, " of at most ", ps.max_recoveries,
      ": the coordinator was lost and restarted; rolled back to step ", options->restored_step,
      options->restore_uri.empty() ? " (the start: nothing was checkpointed yet)"
                                   : absl::StrCat(" (", options->restore_uri, ")"),
      "; restarting every server and training process (generation ", options->generation, ")");
  return true;
}

// Written whole (renamed into place): psrt-run reads it as it appears.
void WritePortFile(const std::string& port_file, int port) {
  const std::string tmp = port_file + ".tmp";
  std::ofstream(tmp) << port << "\n";
  std::rename(tmp.c_str(), port_file.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  CoordinatorFlags f;
  psrt::Flags flags("psrt-coordinator", "--hosts=H1,H2 --distribution=JSON [flags]");
  AddFlags(&flags, &f);
  flags.ParseOrExit(argc, argv);
  psrt::InitProcess("psrt-coordinator");
  absl::StatusOr<psrt::CoordinatorOptions> checked = CheckFlags(f);
  if (!checked.ok()) {
    std::fprintf(stderr, "psrt-coordinator: %s\n", std::string(checked.status().message()).c_str());
    return 2;
  }
  psrt::CoordinatorOptions options = *std::move(checked);
  const psrt::PsOptions& ps = options.ps;
  psrt::Metrics metrics("psrt_coordinator");
  psrt::GrpcServerCalls server_calls(f.token);  // outlives the job
  options.server_calls = &server_calls;
  HandleStopSignals(absl::Seconds(f.stop_grace_s), absl::Seconds(ps.heartbeat_timeout_s));
  if (!ps.restore.empty() && !ResolveRestore(ps, &options)) return 1;
  absl::StatusOr<std::unique_ptr<psrt::Checkpointer>> checkpointer =
      OpenCheckpointer(ps, f.token, &metrics);
  if (!checkpointer.ok()) {
    psrt::LogError("checkpoint.uri: ", checkpointer.status().message());
    return 1;
  }
  options.checkpointer = checkpointer->get();
  if (f.restarted) {
    if (*checkpointer == nullptr || ps.on_failure != "recover") {
      psrt::LogError(
          "--restarted needs on_failure \"recover\" and checkpoint.uri in the distribution");
      return 2;
    }
    if (!GoOnFromRecord(checkpointer->get(), &options)) return 1;
  }

  psrt::Job job(options, &metrics);
  psrt::CoordinatorService service(&job, f.token);
  SetRunning(&job);
  absl::Cleanup gone = [] { SetRunning(nullptr); };  // on every way out, before the job goes
  absl::StatusOr<psrt::ServingServer> serving =
      psrt::StartServer(f.bind, f.port, &service, f.token);
  if (!serving.ok()) {
    psrt::LogError(serving.status().message());
    return 1;
  }
  auto http = psrt::ServeMetrics(f.bind, f.metrics_port, &metrics);
  if (!http.ok()) {
    psrt::LogError(http.status().message());
    return 1;
  }
  if (!f.port_file.empty()) WritePortFile(f.port_file, serving->port);
  psrt::LogInfo("listening on ", f.bind, ":", serving->port, " for ", job.config().num_servers(),
                " servers and ", job.config().num_workers(), " workers on ", options.hosts.size(),
                " hosts (", job.config().mode(), " mode", psrt::TlsEnabled() ? ", mutual TLS" : "",
                ")");
  const psrt::v1::JobState state = job.WaitForEnd();
  if (*checkpointer != nullptr) (*checkpointer)->Stop();
  serving->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  psrt::LogInfo("exiting");
  return state == psrt::v1::JOB_SUCCEEDED ? 0 : 1;
}
