#include "worker/agent.h"

#include <signal.h>
#include <string.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <memory>

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

v1::ProcessId AgentId(const AgentOptions& options) {
  v1::ProcessId id;
  id.set_role(v1::ROLE_AGENT);
  id.set_index(options.host_index);
  return id;
}

// A training process killed while offering a server shared memory leaves
// the object's name behind; its agent removes it.
void Sweep() {
  if (const int n = SweepSharedMemory(); n > 0)
    LogInfo("removed ", n, n == 1 ? " shared-memory object" : " shared-memory objects",
            " of ended training processes from /dev/shm");
}

// One host's agent over the job's life: the processes it started, of which
// generation, and how often each was started again. Run starts them,
// passes on signals, restarts them for a new generation, and stops them at
// the job's end.
class Agent {
 public:
  Agent(const AgentOptions& options, std::unique_ptr<CoordinatorLink> link,
        std::atomic<int>* pending_signal);
  // The agent's exit code: 0 when the job succeeded.
  int Run();

 private:
  // Starting; false (reported) when a process could not start.
  bool Spawn(v1::Role role, int index, const std::string& name,
             const std::vector<std::string>& argv, const std::map<std::string, std::string>& env);
  bool StartServer(int index);
  void MakeGroup();
  bool StartWorker(int rank);
  void StartAll();

  // Exits of the processes started here.
  void ReportExit(const Child& c, int code, const std::string& message, bool restarting);
  void OnExit(const Exit& e);
  void OnServerExit(const Child& c, const Exit& e, bool running);
  void OnWorkerExit(const Child& c, const Exit& e, bool running);

  // Signals, recoveries and the job's end.
  void OnSignal(int sig);
  void KillPastGrace();
  bool Recover();
  int Finish(const CoordinatorLink::JobEnd& end);

  bool JobRunning() const { return link_->state().state == v1::JOB_RUNNING; }

  static constexpr int kServerRestarts = 3;

  const AgentOptions& options_;
  std::atomic<int>* const pending_signal_;
  const std::unique_ptr<CoordinatorLink> link_;
  // The job's layout as of the current generation: a host that leaves the
  // job changes the others' indices and the job's sizes.
  v1::JobConfig config_;
  int host_index_;
  int64_t generation_;
  const int local_;  // training processes a host
  // Of the job's servers, those started here ("max_servers": the others
  // join later, started by hand).
  const int servers_here_;
  // Before the children: it drains their last lines when the agent goes.
  OutputRelay relay_;
  std::map<pid_t, Child> children_;     // running
  std::map<int, int> restarts_;         // per rank, restarts made so far
  std::map<int, int> server_restarts_;  // per server index, this generation
  // A sync job whose host runs several training processes: they sum their
  // gradients here first, through a group made anew for each generation (a
  // recovery starts them from a clean one).
  std::unique_ptr<SharedRegion> group_;
  absl::Time signalled_at_ = absl::InfiniteFuture();
  bool killed_ = false;
};

int ServersHere(const AgentOptions& options, const v1::JobConfig& config) {
  const int started =
      config.started_servers() > 0 ? config.started_servers() : config.num_servers();
  return options.servers ? started / std::max(1, config.num_hosts()) : 0;
}

Agent::Agent(const AgentOptions& options, std::unique_ptr<CoordinatorLink> link,
             std::atomic<int>* pending_signal)
    : options_(options),
      pending_signal_(pending_signal),
      link_(std::move(link)),
      config_(link_->current_config()),
      host_index_(link_->host_index()),
      generation_(link_->generation()),
      local_(config_.workers_per_host()),
      servers_here_(ServersHere(options, config_)),
      relay_(options.tag_output) {}

int Agent::Run() {
  StartAll();
  while (true) {
    for (const Exit& e : ReapExited()) OnExit(e);
    if (int sig = pending_signal_->exchange(0); sig != 0) OnSignal(sig);
    KillPastGrace();
    const CoordinatorLink::JobEnd end = link_->WaitForEnd(absl::Milliseconds(50));
    if (end.state == v1::JOB_RUNNING && link_->generation() > generation_ &&
        signalled_at_ == absl::InfiniteFuture()) {
      if (!Recover()) return 1;
      continue;
    }
    if (end.state == v1::JOB_RUNNING) {
      // Told to stop and nothing left to supervise: don't wait for a
      // coordinator that may be stopping too, beyond a moment to hear why.
      if (children_.empty() && absl::Now() - signalled_at_ > absl::Seconds(2)) {
        LogWarning("stopped by signal; exiting");
        return 1;
      }
      continue;
    }
    return Finish(end);
  }
}

bool Agent::Spawn(v1::Role role, int index, const std::string& name,
                  const std::vector<std::string>& argv,
                  const std::map<std::string, std::string>& env) {
  Child c;
  c.id.set_role(role);
  c.id.set_index(index);
  c.name = name;
  c.generation = generation_;
  // Training processes print through the relay, in whole lines.
  ChildStdio stdio;
  if (role == v1::ROLE_WORKER) {
    absl::StatusOr<ChildStdio> pipes = relay_.Open(absl::StrCat(index));
    if (pipes.ok()) stdio = *pipes;
    if (!pipes.ok())
      LogWarning(name, " prints straight to this output: ", pipes.status().message());
  }
  absl::StatusOr<pid_t> pid = psrt::Spawn(argv, env, /*own_process_group=*/false, stdio);
  relay_.Started(stdio);
  if (!pid.ok()) {
    LogError(name, ": ", pid.status().message());
    ReportExit(c, 127, std::string(pid.status().message()), false);
    return false;
  }
  LogInfo("started ", name, " (pid ", *pid, ")",
          role == v1::ROLE_WORKER && restarts_[index] > 0
              ? absl::StrCat(", restart ", restarts_[index])
              : "",
          generation_ > 1 ? absl::StrCat(", generation ", generation_) : "");
  children_[*pid] = std::move(c);
  return true;
}

bool Agent::StartServer(int index) {
  // server_port_base: the host's gRPC ports, then its data ports.
  const int base = config_.server_port_base();
  const int local = index - host_index_ * servers_here_;
  const std::vector<std::string> argv = {
      SelfDirectory() + "/psrt-server",
      "--coordinator=" + options_.coordinator,
      absl::StrCat("--index=", index),
      "--host=" + (options_.server_host.empty() ? options_.host : options_.server_host),
      "--bind=" + options_.server_bind,
      absl::StrCat("--metrics-port=", options_.server_metrics_port),
      absl::StrCat("--port=", base > 0 ? base + local : 0),
      absl::StrCat("--data-port=", base > 0 ? base + servers_here_ + local : 0),
      absl::StrCat("--generation=", generation_),
      absl::StrCat("--connect-timeout=", absl::ToDoubleSeconds(options_.connect_timeout))};
  return Spawn(v1::ROLE_SERVER, index, absl::StrCat("psrt-server[", index, "]"), argv,
               {{"PSRT_JOB_TOKEN", options_.token}});
}

void Agent::MakeGroup() {
  group_.reset();
  std::vector<int> ranks;
  for (int i = 0; i < local_ && host_index_ * local_ + i < config_.num_workers(); ++i) {
    ranks.push_back(host_index_ * local_ + i);
  }
  if (!config_.local_aggregation() || ranks.size() < 2) return;
  absl::StatusOr<std::unique_ptr<SharedRegion>> made = HostGroup::MakeDirectory(ranks);
  if (!made.ok()) {
    LogWarning("this host's training processes push on their own: ", made.status().message());
    return;
  }
  group_ = *std::move(made);
}

bool Agent::StartWorker(int rank) {
  const int local_rank = rank - host_index_ * local_;
  std::map<std::string, std::string> env = {
      {"PSRT_COORDINATOR", options_.coordinator},
      {"PSRT_JOB_TOKEN", options_.token},
      {"PSRT_RANK", absl::StrCat(rank)},
      {"PSRT_LOCAL_RANK", absl::StrCat(local_rank)},
      {"PSRT_WORLD_SIZE", absl::StrCat(config_.num_workers())},
      {"PSRT_LOCAL_WORLD_SIZE", absl::StrCat(local_)},
      {"PSRT_HOST", options_.host},
      {"PSRT_RESTART_COUNT", absl::StrCat(restarts_[rank])},
      {"PSRT_GENERATION", absl::StrCat(generation_)},
      // Its output goes through a pipe (the relay): Python would hold it
      // back in blocks, a terminal's user would see nothing for a while.
      {"PYTHONUNBUFFERED", EnvOr("PYTHONUNBUFFERED", "1")},
      // Not RANK, LOCAL_RANK or WORLD_SIZE: libraries read those as "start
      // torch.distributed" (accelerate, Lightning), which a psrt job does
      // not run (docs/frameworks.md).
  };
  if (group_ != nullptr) env["PSRT_HOST_GROUP"] = group_->name();
  if (std::string gpu = GpuForWorker(options_.gpus, local_rank); !gpu.empty()) {
    env["CUDA_VISIBLE_DEVICES"] = gpu;
  }
  return Spawn(v1::ROLE_WORKER, rank, absl::StrCat("worker ", rank), options_.command, env);
}

void Agent::StartAll() {
  MakeGroup();
  for (int i = 0; i < servers_here_; ++i) {
    if (!StartServer(host_index_ * servers_here_ + i)) return;
  }
  // Elastic jobs may have fewer worker ranks than hosts * workers_per_host.
  for (int i = 0; i < local_ && host_index_ * local_ + i < config_.num_workers(); ++i) {
    if (!StartWorker(host_index_ * local_ + i)) return;
  }
}

void Agent::ReportExit(const Child& c, int code, const std::string& message, bool restarting) {
  absl::Status s = link_->ReportExit(c.id, code, message, restarting, c.generation);
  // Once the job has ended, the coordinator no longer needs to hear it.
  if (!s.ok() && JobRunning()) {
    LogWarning("could not report the exit of ", c.name, ": ", s.message());
  }
}

void Agent::OnExit(const Exit& e) {
  auto it = children_.find(e.pid);
  if (it == children_.end()) return;
  const Child c = std::move(it->second);
  children_.erase(it);
  const bool running = JobRunning();
  if (c.id.role() == v1::ROLE_SERVER) {
    OnServerExit(c, e, running);
  } else {
    OnWorkerExit(c, e, running);
  }
}

void Agent::OnServerExit(const Child& c, const Exit& e, bool running) {
  if (e.code != 0 && running) {
    LogWarning(c.name, " ", e.description);
  } else {
    LogInfo(c.name, " ", e.description);
  }
  ReportExit(c, e.code, e.description, false);
  // "replicas": 1: its keys moved to their copies; started again, it
  // keeps new copies (the coordinator says which).
  const int index = c.id.index();
  if (config_.replicas() > 0 && running && e.code != 0 && c.generation == generation_ &&
      server_restarts_[index] < kServerRestarts) {
    ++server_restarts_[index];
    StartServer(index);
  }
}

void Agent::OnWorkerExit(const Child& c, const Exit& e, bool running) {
  const int rank = c.id.index();
  LogInfo("worker ", rank, " (pid ", e.pid, ") ", e.description);
  if (e.code != 0) Sweep();
  const bool restart = e.code != 0 && restarts_[rank] < config_.restart_workers() && running &&
                       c.generation == generation_;
  ReportExit(c, e.code, e.description, restart);
  if (restart) {
    ++restarts_[rank];
    StartWorker(rank);
  }
}

// Passes the signal on to every process started here. Stopped, the agent
// exits once they have (SIGKILL after the kill grace).
void Agent::OnSignal(int sig) {
  if (signalled_at_ == absl::InfiniteFuture() && JobRunning()) {
    // The job hears that this agent stops before its processes' exits
    // (theirs follow from this signal): the loss is the agent's.
    const std::string why =
        absl::StrCat("stopped by signal ", sig, " (", strsignal(sig), ")",
                     ParentGone() ? ", as the process that started it is gone" : "");
    absl::Status s = link_->ReportExit(AgentId(options_), 1, why);
    if (!s.ok()) LogWarning("could not report that this agent stops: ", s.message());
  }
  LogWarning("got signal ", sig, "; passing it to ", children_.size(), " processes");
  for (const auto& [pid, c] : children_) kill(pid, sig);
  signalled_at_ = std::min(signalled_at_, absl::Now());
}

void Agent::KillPastGrace() {
  if (killed_ || children_.empty() || absl::Now() - signalled_at_ <= options_.kill_grace) return;
  LogWarning(children_.size(), " processes still running ",
             absl::FormatDuration(options_.kill_grace),
             " (--kill-grace) after the signal; killing them");
  for (const auto& [pid, c] : children_) kill(pid, SIGKILL);
  killed_ = true;
}

// A recovery: this generation's processes go, the next one's start from the
// checkpoint the coordinator chose. Their exits are not news. False when
// this host left the job.
bool Agent::Recover() {
  std::vector<pid_t> pids;
  for (const auto& [pid, c] : children_) pids.push_back(pid);
  children_.clear();
  generation_ = link_->generation();
  config_ = link_->current_config();
  server_restarts_.clear();
  host_index_ = link_->host_index();
  Terminate(pids, options_.kill_grace);
  Sweep();
  if (host_index_ < 0) {
    LogError("this host left the job: it was gone for longer than host_wait_s; exiting");
    return false;
  }
  LogWarning("the job is recovering (generation ", generation_, "): restarting ", servers_here_,
             servers_here_ == 1 ? " server and " : " servers and ", local_,
             local_ == 1 ? " training process" : " training processes", " as host ", host_index_,
             " of ", config_.num_hosts());
  StartAll();
  return true;
}

// The job ended: training processes (on failure) and servers hear of it
// through their own heartbeats and exit by themselves; they get a moment
// to, then are stopped. Returns the agent's exit code.
int Agent::Finish(const CoordinatorLink::JobEnd& end) {
  const absl::Time deadline = absl::Now() + absl::Seconds(2 * config_.heartbeat_interval_s() + 1);
  auto waited_for = [&]() -> size_t {
    if (end.state == v1::JOB_FAILED) return children_.size();
    return std::count_if(children_.begin(), children_.end(),
                         [](const auto& c) { return c.second.id.role() == v1::ROLE_SERVER; });
  };
  while (waited_for() > 0 && absl::Now() < deadline) {
    for (const Exit& e : ReapExited()) OnExit(e);
    absl::SleepFor(absl::Milliseconds(20));
  }
  if (!children_.empty()) {
    std::vector<pid_t> pids;
    for (const auto& [pid, c] : children_) pids.push_back(pid);
    LogWarning("job ended (", end.reason, "); stopping ", pids.size(), " processes");
    for (const Exit& e : Terminate(pids, options_.kill_grace)) OnExit(e);
  }
  Sweep();
  const bool ok = end.state == v1::JOB_SUCCEEDED;
  LogInfo("job ", ok ? "succeeded" : "failed", ": ", end.reason, "; exiting");
  return ok ? 0 : 1;
}

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
  lo.id = AgentId(options);
  lo.host = options.host;
  lo.connect_timeout = options.connect_timeout;
  absl::StatusOr<std::unique_ptr<CoordinatorLink>> link = CoordinatorLink::Connect(lo);
  if (!link.ok()) {
    LogError(link.status().message());
    return 1;
  }
  Agent agent(options, *std::move(link), &pending_signal);
  return agent.Run();
}

}  // namespace psrt
