#include "worker/agent.h"

#include <signal.h>
#include <string.h>

#include <algorithm>
#include <atomic>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/coordinator_link.h"
#include "common/daemon.h"
#include "common/gpus.h"
#include "common/logging.h"
#include "common/output_relay.h"
#include "common/process.h"
#include "common/shared_memory.h"
#include "worker/host_group.h"

namespace psrt {
namespace {

// A process this agent started: a psrt-server or a training process, of one
// generation of the job.
struct Child {
  v1::ProcessId id;
  std::string name;  // "psrt-server[1]", "worker 3"
  int64_t generation = 0;
};

}  // namespace

int RunAgent(const AgentOptions& options) {
  // Static: the signal thread may outlive this frame. Stopped, it exits
  // once its processes have (SIGKILL after the kill grace), and whatever
  // hangs, within the kill grace and a margin.
  static std::atomic<int> pending_signal{0};
  HandleSignals([](int sig) { pending_signal = sig; }, options.kill_grace + absl::Seconds(10));

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
  // The job's layout as of the current generation: a host that leaves the
  // job changes the others' indices and the job's sizes.
  v1::JobConfig config = (*link)->current_config();
  int host_index = (*link)->host_index();
  const int local = config.workers_per_host();
  // Of the job's servers, those started here ("max_servers": the others
  // join later, started by hand).
  const int started =
      config.started_servers() > 0 ? config.started_servers() : config.num_servers();
  const int servers_here = options.servers ? started / std::max(1, config.num_hosts()) : 0;
  int64_t generation = (*link)->generation();

  // Before the children: it drains their last lines when this returns.
  OutputRelay relay(options.tag_output);
  std::map<pid_t, Child> children;     // running
  std::map<int, int> restarts;         // per rank, restarts made so far
  std::map<int, int> server_restarts;  // per server index, this generation
  constexpr int kServerRestarts = 3;
  auto report_exit = [&](const Child& c, int code, const std::string& message, bool restarting) {
    absl::Status s = (*link)->ReportExit(c.id, code, message, restarting, c.generation);
    // Once the job has ended, the coordinator no longer needs to hear it.
    if (!s.ok() && (*link)->state().state == v1::JOB_RUNNING) {
      LogWarning("could not report the exit of ", c.name, ": ", s.message());
    }
  };
  auto spawn = [&](v1::Role role, int index, const std::string& name,
                   const std::vector<std::string>& argv,
                   const std::map<std::string, std::string>& env) {
    Child c;
    c.id.set_role(role);
    c.id.set_index(index);
    c.name = name;
    c.generation = generation;
    // Training processes print through the relay, in whole lines.
    ChildStdio stdio;
    if (role == v1::ROLE_WORKER) {
      absl::StatusOr<ChildStdio> pipes = relay.Open(absl::StrCat(index));
      if (pipes.ok()) stdio = *pipes;
      if (!pipes.ok())
        LogWarning(name, " prints straight to this output: ", pipes.status().message());
    }
    absl::StatusOr<pid_t> pid = Spawn(argv, env, /*own_process_group=*/false, stdio);
    relay.Started(stdio);
    if (!pid.ok()) {
      LogError(name, ": ", pid.status().message());
      report_exit(c, 127, std::string(pid.status().message()), false);
      return false;
    }
    LogInfo("started ", name, " (pid ", *pid, ")",
            role == v1::ROLE_WORKER && restarts[index] > 0
                ? absl::StrCat(", restart ", restarts[index])
                : "",
            generation > 1 ? absl::StrCat(", generation ", generation) : "");
    children[*pid] = std::move(c);
    return true;
  };
  auto start_server = [&](int index) {
    // server_port_base: the host's gRPC ports, then its data ports.
    const int base = config.server_port_base();
    const int local = index - host_index * servers_here;
    const std::vector<std::string> argv = {
        SelfDirectory() + "/psrt-server",
        "--coordinator=" + options.coordinator,
        absl::StrCat("--index=", index),
        "--host=" + (options.server_host.empty() ? options.host : options.server_host),
        "--bind=" + options.server_bind,
        absl::StrCat("--metrics-port=", options.server_metrics_port),
        absl::StrCat("--port=", base > 0 ? base + local : 0),
        absl::StrCat("--data-port=", base > 0 ? base + servers_here + local : 0),
        absl::StrCat("--generation=", generation),
        absl::StrCat("--connect-timeout=", absl::ToDoubleSeconds(options.connect_timeout))};
    return spawn(v1::ROLE_SERVER, index, absl::StrCat("psrt-server[", index, "]"), argv,
                 {{"PSRT_JOB_TOKEN", options.token}});
  };
  // A sync job whose host runs several training processes: they sum their
  // gradients here first, through a group made anew for each generation (a
  // recovery starts them from a clean one).
  std::unique_ptr<SharedRegion> group;
  auto make_group = [&] {
    group.reset();
    std::vector<int> ranks;
    for (int i = 0; i < local && host_index * local + i < config.num_workers(); ++i) {
      ranks.push_back(host_index * local + i);
    }
    if (!config.local_aggregation() || ranks.size() < 2) return;
    absl::StatusOr<std::unique_ptr<SharedRegion>> made = HostGroup::MakeDirectory(ranks);
    if (!made.ok()) {
      LogWarning("this host's training processes push on their own: ", made.status().message());
      return;
    }
    group = *std::move(made);
  };
  auto start_worker = [&](int rank) {
    const int local_rank = rank - host_index * local;
    std::map<std::string, std::string> env = {
        {"PSRT_COORDINATOR", options.coordinator},
        {"PSRT_JOB_TOKEN", options.token},
        {"PSRT_RANK", absl::StrCat(rank)},
        {"PSRT_LOCAL_RANK", absl::StrCat(local_rank)},
        {"PSRT_WORLD_SIZE", absl::StrCat(config.num_workers())},
        {"PSRT_LOCAL_WORLD_SIZE", absl::StrCat(local)},
        {"PSRT_HOST", options.host},
        {"PSRT_RESTART_COUNT", absl::StrCat(restarts[rank])},
        {"PSRT_GENERATION", absl::StrCat(generation)},
        // Its output goes through a pipe (the relay): Python would hold it
        // back in blocks, a terminal's user would see nothing for a while.
        {"PYTHONUNBUFFERED", EnvOr("PYTHONUNBUFFERED", "1")},
        // Not RANK, LOCAL_RANK or WORLD_SIZE: libraries read those as "start
        // torch.distributed" (accelerate, Lightning), which a psrt job does
        // not run (docs/frameworks.md).
    };
    if (group != nullptr) env["PSRT_HOST_GROUP"] = group->name();
    if (std::string gpu = GpuForWorker(options.gpus, local_rank); !gpu.empty()) {
      env["CUDA_VISIBLE_DEVICES"] = gpu;
    }
    return spawn(v1::ROLE_WORKER, rank, absl::StrCat("worker ", rank), options.command, env);
  };
  auto start_all = [&] {
    make_group();
    for (int i = 0; i < servers_here; ++i) {
      if (!start_server(host_index * servers_here + i)) return;
    }
    // Elastic jobs may have fewer worker ranks than hosts * workers_per_host.
    for (int i = 0; i < local && host_index * local + i < config.num_workers(); ++i) {
      if (!start_worker(host_index * local + i)) return;
    }
  };
  start_all();

  // A training process killed while offering a server shared memory leaves
  // the object's name behind; its agent removes it.
  auto sweep = [] {
    if (const int n = SweepSharedMemory(); n > 0)
      LogInfo("removed ", n, n == 1 ? " shared-memory object" : " shared-memory objects",
              " of ended training processes from /dev/shm");
  };

  auto report = [&](const Exit& e) {
    auto it = children.find(e.pid);
    if (it == children.end()) return;
    const Child c = std::move(it->second);
    children.erase(it);
    const bool running = (*link)->state().state == v1::JOB_RUNNING;
    if (c.id.role() == v1::ROLE_SERVER) {
      if (e.code != 0 && running) {
        LogWarning(c.name, " ", e.description);
      } else {
        LogInfo(c.name, " ", e.description);
      }
      report_exit(c, e.code, e.description, false);
      // "replicas": 1: its keys moved to their copies; started again, it
      // keeps new copies (the coordinator says which).
      const int index = c.id.index();
      if (config.replicas() > 0 && running && e.code != 0 && c.generation == generation &&
          server_restarts[index] < kServerRestarts) {
        ++server_restarts[index];
        start_server(index);
      }
      return;
    }
    const int rank = c.id.index();
    LogInfo("worker ", rank, " (pid ", e.pid, ") ", e.description);
    if (e.code != 0) sweep();
    const bool restart = e.code != 0 && restarts[rank] < config.restart_workers() && running &&
                         c.generation == generation;
    report_exit(c, e.code, e.description, restart);
    if (restart) {
      ++restarts[rank];
      start_worker(rank);
    }
  };

  absl::Time signalled_at = absl::InfiniteFuture();
  bool killed = false;
  while (true) {
    for (const Exit& e : ReapExited()) report(e);
    if (int sig = pending_signal.exchange(0); sig != 0) {
      if (signalled_at == absl::InfiniteFuture() && (*link)->state().state == v1::JOB_RUNNING) {
        // The job hears that this agent stops before its processes' exits
        // (theirs follow from this signal): the loss is the agent's.
        const std::string why =
            absl::StrCat("stopped by signal ", sig, " (", strsignal(sig), ")",
                         ParentGone() ? ", as the process that started it is gone" : "");
        absl::Status s = (*link)->ReportExit(lo.id, 1, why);
        if (!s.ok()) LogWarning("could not report that this agent stops: ", s.message());
      }
      LogWarning("got signal ", sig, "; passing it to ", children.size(), " processes");
      for (const auto& [pid, c] : children) kill(pid, sig);
      signalled_at = std::min(signalled_at, absl::Now());
    }
    if (!killed && !children.empty() && absl::Now() - signalled_at > options.kill_grace) {
      LogWarning(children.size(), " processes still running ",
                 absl::FormatDuration(options.kill_grace),
                 " (--kill-grace) after the signal; killing them");
      for (const auto& [pid, c] : children) kill(pid, SIGKILL);
      killed = true;
    }
    const CoordinatorLink::JobEnd end = (*link)->WaitForEnd(absl::Milliseconds(50));
    if (end.state == v1::JOB_RUNNING && (*link)->generation() > generation &&
        signalled_at == absl::InfiniteFuture()) {
      // A recovery: this generation's processes go, the next one's start
      // from the checkpoint the coordinator chose. Their exits are not news.
      std::vector<pid_t> pids;
      for (const auto& [pid, c] : children) pids.push_back(pid);
      children.clear();
      generation = (*link)->generation();
      config = (*link)->current_config();
      server_restarts.clear();
      host_index = (*link)->host_index();
      Terminate(pids, options.kill_grace);
      sweep();
      if (host_index < 0) {
        LogError("this host left the job: it was gone for longer than host_wait_s; exiting");
        return 1;
      }
      LogWarning("the job is recovering (generation ", generation, "): restarting ", servers_here,
                 servers_here == 1 ? " server and " : " servers and ", local,
                 local == 1 ? " training process" : " training processes", " as host ", host_index,
                 " of ", config.num_hosts());
      start_all();
      continue;
    }
    if (end.state == v1::JOB_RUNNING) {
      // Told to stop and nothing left to supervise: don't wait for a
      // coordinator that may be stopping too, beyond a moment to hear why.
      if (children.empty() && absl::Now() - signalled_at > absl::Seconds(2)) {
        LogWarning("stopped by signal; exiting");
        return 1;
      }
      continue;
    }
    // Training processes (on failure) and servers hear of the end through
    // their own heartbeats and exit by themselves; give them a moment to.
    const absl::Time deadline = absl::Now() + absl::Seconds(2 * config.heartbeat_interval_s() + 1);
    auto waited_for = [&]() -> size_t {
      if (end.state == v1::JOB_FAILED) return children.size();
      return std::count_if(children.begin(), children.end(),
                           [](const auto& c) { return c.second.id.role() == v1::ROLE_SERVER; });
    };
    while (waited_for() > 0 && absl::Now() < deadline) {
      for (const Exit& e : ReapExited()) report(e);
      absl::SleepFor(absl::Milliseconds(20));
    }
    if (!children.empty()) {
      std::vector<pid_t> pids;
      for (const auto& [pid, c] : children) pids.push_back(pid);
      LogWarning("job ended (", end.reason, "); stopping ", pids.size(), " processes");
      for (const Exit& e : Terminate(pids, options.kill_grace)) report(e);
    }
    sweep();
    const bool ok = end.state == v1::JOB_SUCCEEDED;
    LogInfo("job ", ok ? "succeeded" : "failed", ": ", end.reason, "; exiting");
    return ok ? 0 : 1;
  }
}

}  // namespace psrt
