#include "worker/agent.h"

#include <signal.h>

#include <atomic>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/coordinator_link.h"
#include "common/daemon.h"
#include "common/logging.h"
#include "common/process.h"

namespace psrt {

int RunAgent(const AgentOptions& options) {
  // Static: the signal thread may outlive this frame.
  static std::atomic<int> pending_signal{0};
  HandleSignals([](int sig) { pending_signal = sig; });

  CoordinatorLink::Options lo;
  lo.coordinator = options.coordinator;
  lo.token = options.token;
  lo.id.set_role(v1::ROLE_AGENT);
  lo.id.set_index(options.host_index);
  lo.host = options.host;
  lo.connect_timeout = options.connect_timeout;
  absl::StatusOr<std::unique_ptr<CoordinatorLink>> link = CoordinatorLink::Connect(lo);
  if (!link.ok()) {
    LogError(link.status().message());
    return 1;
  }
  const v1::JobConfig& config = (*link)->config();
  const int local = config.workers_per_host();

  std::map<pid_t, int> rank_of;        // running training processes
  std::map<int, int> restarts;         // per rank, restarts made so far
  auto report_exit = [&](int rank, int code, const std::string& message, bool restarting) {
    v1::ProcessId id;
    id.set_role(v1::ROLE_WORKER);
    id.set_index(rank);
    absl::Status s = (*link)->ReportExit(id, code, message, restarting);
    if (!s.ok()) LogWarning("could not report worker ", rank, "'s exit: ", s.message());
  };
  auto start = [&](int rank) {
    const int local_rank = rank - options.host_index * local;
    std::map<std::string, std::string> env = {
        {"PSRT_COORDINATOR", options.coordinator},
        {"PSRT_JOB_TOKEN", options.token},
        {"PSRT_RANK", absl::StrCat(rank)},
        {"PSRT_LOCAL_RANK", absl::StrCat(local_rank)},
        {"PSRT_WORLD_SIZE", absl::StrCat(config.num_workers())},
        {"PSRT_LOCAL_WORLD_SIZE", absl::StrCat(local)},
        {"PSRT_HOST", options.host},
        {"PSRT_RESTART_COUNT", absl::StrCat(restarts[rank])},
        // The names torch.distributed and most launchers use.
        {"RANK", absl::StrCat(rank)},
        {"LOCAL_RANK", absl::StrCat(local_rank)},
        {"WORLD_SIZE", absl::StrCat(config.num_workers())},
    };
    absl::StatusOr<pid_t> pid = Spawn(options.command, env);
    if (!pid.ok()) {
      LogError("worker ", rank, ": ", pid.status().message());
      report_exit(rank, 127, std::string(pid.status().message()), false);
      return false;
    }
    LogInfo("started worker ", rank, " (pid ", *pid, ")",
            restarts[rank] > 0 ? absl::StrCat(", restart ", restarts[rank]) : "");
    rank_of[*pid] = rank;
    return true;
  };
  for (int i = 0; i < local; ++i) {
    if (!start(options.host_index * local + i)) break;
  }

  auto report = [&](const Exit& e) {
    auto it = rank_of.find(e.pid);
    if (it == rank_of.end()) return;
    const int rank = it->second;
    rank_of.erase(it);
    LogInfo("worker ", rank, " (pid ", e.pid, ") ", e.description);
    const bool restart = e.code != 0 && restarts[rank] < config.restart_workers() &&
                         (*link)->state().state == v1::JOB_RUNNING;
    report_exit(rank, e.code, e.description, restart);
    if (restart) {
      ++restarts[rank];
      start(rank);
    }
  };

  absl::Time signalled_at = absl::InfiniteFuture();
  while (true) {
    for (const Exit& e : ReapExited()) report(e);
    if (int sig = pending_signal.exchange(0); sig != 0) {
      LogWarning("got signal ", sig, "; passing it to ", rank_of.size(), " training processes");
      for (const auto& [pid, rank] : rank_of) kill(pid, sig);
      signalled_at = std::min(signalled_at, absl::Now());
    }
    const CoordinatorLink::JobEnd end = (*link)->WaitForEnd(absl::Milliseconds(50));
    if (end.state == v1::JOB_RUNNING) {
      // Told to stop and nothing left to supervise: don't wait for a
      // coordinator that may be stopping too, beyond a moment to hear why.
      if (rank_of.empty() && absl::Now() - signalled_at > absl::Seconds(2)) {
        LogWarning("stopped by signal; exiting");
        return 1;
      }
      continue;
    }
    if (!rank_of.empty() && end.state == v1::JOB_FAILED) {
      // Training processes hear of the failure through their own heartbeats
      // and exit with their own error; give them a moment to say it.
      const absl::Time deadline = absl::Now() + absl::Seconds(2 * config.heartbeat_interval_s() + 1);
      while (!rank_of.empty() && absl::Now() < deadline) {
        for (const Exit& e : ReapExited()) report(e);
        absl::SleepFor(absl::Milliseconds(20));
      }
    }
    if (!rank_of.empty()) {
      std::vector<pid_t> pids;
      for (const auto& [pid, rank] : rank_of) pids.push_back(pid);
      LogWarning("job ended (", end.reason, "); stopping ", pids.size(), " training processes");
      for (const Exit& e : Terminate(pids, options.kill_grace)) report(e);
    }
    const bool ok = end.state == v1::JOB_SUCCEEDED;
    LogInfo("job ", ok ? "succeeded" : "failed", ": ", end.reason, "; exiting");
    return ok ? 0 : 1;
  }
}

}  // namespace psrt
