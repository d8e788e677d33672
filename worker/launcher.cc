#include "worker/launcher.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/coordinator_link.h"
#include "common/daemon.h"
#include "common/gpus.h"
#include "common/grpc_util.h"
#include "common/logging.h"
#include "common/output_relay.h"
#include "common/process.h"

namespace psrt {
namespace {

struct Child {
  std::string name;
  int host = -1;  // agents: their host
  pid_t pid = 0;
  bool done = false;
  bool replaced = false;  // started again: its exit is not the job's
  Exit exit;
};

// "1.23 GB", "45.6 MB": the summary's sizes, in SI units as the metrics'.
std::string HumanBytes(int64_t b) {
  if (b >= 1000000000) return absl::StrFormat("%.2f GB", b / 1e9);
  if (b >= 1000000) return absl::StrFormat("%.1f MB", b / 1e6);
  if (b >= 1000) return absl::StrFormat("%.1f kB", b / 1e3);
  return absl::StrCat(b, " B");
}

// The job's hosts: the cluster's, or in local mode "local0", "local1", ...
std::vector<std::string> JobHosts(const LaunchOptions& o) {
  if (o.local_hosts == 0) return o.cluster.hosts;
  std::vector<std::string> hosts;
  for (int i = 0; i < o.local_hosts; ++i) hosts.push_back(absl::StrCat("local", i));
  return hosts;
}

// Waits for the coordinator's port file (local mode binds port 0).
absl::StatusOr<int> ReadPortFile(const std::string& path, const Child& coordinator,
                                 absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    std::ifstream in(path);
    int port = 0;
    if (in >> port && port > 0) return port;
    int status = 0;
    if (waitpid(coordinator.pid, &status, WNOHANG) == coordinator.pid) {
      return absl::FailedPreconditionError("psrt-coordinator exited before it was listening");
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return absl::DeadlineExceededError(absl::StrCat("psrt-coordinator did not report its port in ",
                                                  path, " within ", absl::FormatDuration(timeout)));
}

// Tells the coordinator that the agent of `host` ended, as it would say
// itself (best effort: its silence says so too, later and less exactly).
void ReportAgentExit(const std::string& coordinator, const std::string& token, int host,
                     const Exit& e) {
  auto stub = v1::Coordinator::NewStub(MakeChannel(coordinator));
  grpc::ClientContext ctx;
  PrepareContext(&ctx, token, absl::Seconds(1));
  v1::ReportExitRequest req;
  req.mutable_id()->set_role(v1::ROLE_AGENT);
  req.mutable_id()->set_index(host);
  req.set_exit_code(e.code);
  req.set_message(e.description);
  v1::ReportExitResponse resp;
  grpc::Status s = stub->ReportExit(&ctx, req, &resp);
  (void)s;
}

}  // namespace

JobSummary SummarizeJob(const v1::JobStatusResponse& status, absl::Duration wall) {
  const double seconds = absl::ToDoubleSeconds(wall);
  int64_t steps = 0, pushed = 0, pulled = 0;
  double waited = 0, alive = 0;
  const v1::ProcessStatus* slowest = nullptr;
  auto share = [](const v1::ProcessStatus& p) {
    return p.stats().seconds() > 0 ? p.stats().wait_seconds() / p.stats().seconds() : 0.0;
  };
  nlohmann::json workers = nlohmann::json::array();
  for (const v1::ProcessStatus& p : status.processes()) {
    if (p.id().role() != v1::ROLE_WORKER || p.stats().seconds() <= 0) continue;
    const v1::WorkerStats& w = p.stats();
    if (w.bytes_pushed() > 0) steps = std::max(steps, p.step() + 1);
    pushed += w.bytes_pushed();
    pulled += w.bytes_pulled();
    waited += w.wait_seconds();
    alive += w.seconds();
    // In sync mode the others wait for the slowest: it waits the least. In
    // async and ssp it makes the fewest steps.
    const bool sync = status.config().mode() == "sync";
    if (slowest == nullptr || (sync ? share(p) < share(*slowest) : p.step() < slowest->step()))
      slowest = &p;
    workers.push_back({{"rank", p.id().index()},
                       {"host", p.host()},
                       {"steps", w.bytes_pushed() > 0 ? p.step() + 1 : 0},
                       {"bytes_pushed", w.bytes_pushed()},
                       {"bytes_pulled", w.bytes_pulled()},
                       {"pull_wait_seconds", w.wait_seconds()},
                       {"seconds", w.seconds()},
                       {"pull_wait_share", share(p)}});
  }
  const double wait_share = alive > 0 ? waited / alive : 0;
  nlohmann::json j = {
      {"state", v1::JobState_Name(status.state())},
      {"reason", status.reason()},
      {"wall_seconds", seconds},
      {"steps", steps},
      {"steps_per_second", seconds > 0 ? steps / seconds : 0},
      {"workers", workers.size()},
      {"local_aggregation", status.config().local_aggregation()},
      {"bytes_pushed", pushed},
      {"bytes_pulled", pulled},
      {"pull_wait_share", wait_share},
      {"checkpoints", status.checkpoints()},
      {"checkpoint_seconds", status.checkpoint_seconds()},
      {"recoveries", status.recoveries()},
      {"failovers", status.failovers()},
      {"slowest_worker",
       slowest == nullptr ? nlohmann::json(nullptr) : nlohmann::json(slowest->id().index())},
      {"per_worker", workers}};
  std::string line = absl::StrFormat(
      "summary: %.1f s, %d steps (%.1f/s) on %d workers%s; pushed %s, pulled %s; pulls waited for "
      "%.0f%% of the workers' time",
      seconds, steps, seconds > 0 ? steps / seconds : 0.0, static_cast<int>(workers.size()),
      status.config().local_aggregation() ? " (each host summing first)" : "", HumanBytes(pushed),
      HumanBytes(pulled), 100 * wait_share);
  if (slowest != nullptr && workers.size() > 1) {
    absl::StrAppend(&line, " (slowest: rank ", slowest->id().index(), ")");
  }
  absl::StrAppend(&line, absl::StrFormat("; %d checkpoints (%.1f s); %d recoveries, %d failovers",
                                         status.checkpoints(), status.checkpoint_seconds(),
                                         status.recoveries(), status.failovers()));
  return {line, j.dump(2) + "\n"};
}

std::string DescribeLaunch(const LaunchOptions& o) {
  const bool local = o.local_hosts > 0;
  const std::vector<std::string> hosts = JobHosts(o);
  const PsOptions& ps = o.ps;
  const int n = static_cast<int>(hosts.size());
  std::string out = absl::StrCat(
      "psrt-run --dry-run: nothing is started\n", "hosts: ", n,
      local ? " simulated on this machine over loopback" : absl::StrCat(" from ", o.cluster.source),
      local
          ? ""
          : absl::StrCat(", this is host ", o.cluster.current, " (", hosts[o.cluster.current], ")"),
      "\ncoordinator: on host 0 at ",
      local ? "127.0.0.1, a free port" : absl::StrCat(hosts[0], ":", o.coordinator_port), "\n");
  for (int h = 0; h < n; ++h) {
    const std::string address = local ? "127.0.0.1"
                                : h == o.cluster.current && !o.advertise_address.empty()
                                    ? o.advertise_address
                                    : hosts[h];
    absl::StrAppend(&out, "host ", h, " (", hosts[h], "):\n");
    for (int i = 0; i < ps.servers_per_host; ++i) {
      absl::StrAppend(&out, "  psrt-server[", h * ps.servers_per_host + i, "] at ", address,
                      ps.server_port_base > 0 && !local
                          ? absl::StrCat(":", ps.server_port_base + i, ", data port ",
                                         ps.server_port_base + ps.servers_per_host + i)
                          : std::string(", free ports"),
                      "\n");
    }
    // GPUs are known for this machine only.
    const std::vector<std::string> gpus =
        local || h == o.cluster.current
            ? GpusOfHost(o.gpus, local ? h : 0, local ? n : 1, ps.workers_per_host)
            : std::vector<std::string>();
    for (int i = 0; i < ps.workers_per_host; ++i) {
      const std::string gpu = GpuForWorker(gpus, i);
      absl::StrAppend(&out, "  worker: PSRT_RANK ", h * ps.workers_per_host + i,
                      ", PSRT_LOCAL_RANK ", i,
                      gpu.empty() ? "" : absl::StrCat(", CUDA_VISIBLE_DEVICES ", gpu), "\n");
    }
  }
  absl::StrAppend(&out, "training command (PSRT_WORLD_SIZE ", n * ps.workers_per_host,
                  "): ", absl::StrJoin(o.command, " "), "\n");
  absl::StrAppend(
      &out, "mode: ", ps.mode, ps.mode == "ssp" ? absl::StrCat(", staleness ", ps.staleness) : "",
      ps.backup_workers > 0 ? absl::StrCat(", ", ps.backup_workers, " backup workers") : "",
      ps.elastic_max_workers > 0 ? absl::StrCat(", elastic ", ps.elastic_min_workers, "..",
                                                ps.elastic_max_workers, " workers")
                                 : "",
      "; keys of ", ps.partition_bytes, " bytes; compression ", ps.compression, "; transport ",
      ps.transport, "; replicas ", ps.replicas, "\n");
  const std::string off = LocalAggregationOff(ps);
  absl::StrAppend(&out, "local aggregation: ",
                  off.empty() ? absl::StrCat("on (each host's ", ps.workers_per_host,
                                             " training processes sum their gradients and push "
                                             "once per key)")
                              : absl::StrCat("off (", off, ")"),
                  "\n");
  absl::StrAppend(&out, "on failure: ", ps.on_failure,
                  ps.on_failure == "recover"
                      ? absl::StrCat(" (at most ", ps.max_recoveries,
                                     " recoveries, a lost host waited for ", ps.host_wait_s, " s)")
                      : "",
                  "; heartbeat timeout ", ps.heartbeat_timeout_s, " s, barrier timeout ",
                  ps.barrier_timeout_s, " s\n");
  const CheckpointOptions& c = ps.checkpoint;
  if (c.uri.empty()) {
    absl::StrAppend(&out, "checkpoints: none\n");
  } else {
    absl::StrAppend(&out, "checkpoints: ", c.uri,
                    c.every_steps > 0 ? absl::StrCat(" every ", c.every_steps, " steps") : "",
                    c.every_seconds > 0 ? absl::StrCat(" every ", c.every_seconds, " s") : "",
                    c.keep > 0 ? absl::StrCat(", the newest ", c.keep, " kept") : "",
                    ", and a final one at the end\n");
  }
  absl::StrAppend(&out, "restore: ", ps.restore.empty() ? std::string("none") : ps.restore, "\n");
  absl::StrAppend(&out, "token: ", o.token.empty() ? "none (RPCs are not authenticated)" : "set",
                  "\n");
  for (const char* program : {"psrt-coordinator", "psrt-worker", "psrt-server"}) {
    const std::string path = absl::StrCat(o.bin_dir, "/", program);
    absl::StrAppend(&out, "program: ", path,
                    access(path.c_str(), X_OK) == 0 ? "" : " (missing here)", "\n");
  }
  return out;
}

namespace {

// One host's psrt-run over the job's life: its children (the coordinator on
// host 0, an agent per host it runs), what it learned of the job from the
// coordinator, and the deadlines by which it stops waiting. Run goes
// through the phases in order: start the coordinator, start the agents,
// supervise, report.
class Launcher {
 public:
  Launcher(const LaunchOptions& o, std::atomic<int>* pending_signal);
  // 0 when the job succeeded.
  int Run();

 private:
  // Starting: false (logged) when the job cannot start.
  bool Start(const std::string& name, std::vector<std::string> argv, int host = -1);
  bool StartCoordinator();
  bool RestartCoordinator();
  std::vector<std::string> AgentArgv(int h) const;
  bool StartAgents();

  // Supervising: once anything fails, the rest get time to hear of it from
  // the coordinator and exit on their own, then are stopped.
  void Supervise();
  std::vector<int> ReapChildren();
  void RestartChildren(const std::vector<int>& hosts);
  void OnSignal(int sig);
  bool PastDeadlines();
  void PollCoordinator();

  // Stopping and the end.
  void StopAll();
  void SignalAll(int sig);
  int Report();
  void Summarize();

  const LaunchOptions& o_;
  std::atomic<int>* const pending_signal_;
  const absl::Time launched_ = absl::Now();
  const bool local_;
  const std::vector<std::string> hosts_;
  std::vector<int> my_hosts_;  // the hosts whose agents run here
  const std::map<std::string, std::string> env_;
  // Several hosts' agents here share this output: their lines come through
  // a relay, whole. Before `children_`, so it drains after they ended.
  std::unique_ptr<OutputRelay> relay_;
  std::vector<Child> children_;
  // What psrt-run saw die, in the order it learned of it: its own children
  // and, from the coordinator, servers and training processes (with their
  // generation; its own children: 0).
  std::vector<std::pair<int64_t, std::string>> died_;
  std::string coordinator_;  // its address
  const std::vector<std::string> coordinator_argv_;

  const absl::Duration settle_;
  const bool recover_;
  int restarts_ = 0;
  absl::Time give_up_ = absl::InfiniteFuture();
  absl::Time next_poll_ = absl::Now();
  std::optional<v1::JobStatusResponse> last_status_;  // the coordinator's latest
  std::string reason_;                                // the coordinator's, once the job ended
  bool job_running_ = true;
  // Stopped by a signal: the first asks for a final checkpoint and the
  // job's end (host 0's coordinator writes it; other hosts wait for it), a
  // second stops every process now.
  int signals_ = 0;
  absl::Time stop_at_ = absl::InfiniteFuture();  // hosts without the coordinator
  absl::flat_hash_set<std::string> known_dead_;
  int64_t generation_ = 1;
  // The job's end as psrt-run saw it first (a signal, or a process that died
  // and was not started again): the reason when the coordinator cannot say.
  std::string first_cause_;
};

Launcher::Launcher(const LaunchOptions& o, std::atomic<int>* pending_signal)
    : o_(o),
      pending_signal_(pending_signal),
      local_(o.local_hosts > 0),
      hosts_(JobHosts(o)),
      env_({{"PSRT_JOB_TOKEN", o.token}}),
      coordinator_(absl::StrCat(hosts_[0], ":", o.coordinator_port)),
      coordinator_argv_({o.bin_dir + "/psrt-coordinator", "--hosts=" + absl::StrJoin(hosts_, ","),
                         "--distribution=" + o.distribution,
                         absl::StrCat("--metrics-port=", o.metrics_port),
                         absl::StrCat("--stop-grace=", absl::ToDoubleSeconds(o.stop_grace))}),
      settle_(absl::Seconds(o.ps.heartbeat_timeout_s + 10)),
      recover_(o.ps.on_failure == "recover") {
  if (local_) {
    for (int i = 0; i < o.local_hosts; ++i) my_hosts_.push_back(i);
  } else {
    my_hosts_.push_back(o.cluster.current);
  }
  if (my_hosts_.size() > 1) relay_ = std::make_unique<OutputRelay>(/*tag=*/false);
}

int Launcher::Run() {
  if (my_hosts_[0] == 0 && !StartCoordinator()) return 1;
  if (!StartAgents()) return 1;
  LogNotice("started ", children_.size(), " processes for ", my_hosts_.size(), " of ",
            hosts_.size(), " hosts; coordinator at ", coordinator_);
  Supervise();
  return Report();
}

// Its own process group each: a terminal's Ctrl-C reaches psrt-run alone,
// which stops the job in order.
bool Launcher::Start(const std::string& name, std::vector<std::string> argv, int host) {
  ChildStdio stdio;
  if (relay_ != nullptr && host >= 0) {
    absl::StatusOr<ChildStdio> pipes = relay_->Open(name);
    if (pipes.ok()) stdio = *pipes;
  }
  absl::StatusOr<pid_t> pid = Spawn(argv, env_, /*own_process_group=*/true, stdio);
  if (relay_ != nullptr) relay_->Started(stdio);
  if (!pid.ok()) {
    LogError("cannot start ", name, ": ", pid.status().message());
    return false;
  }
  children_.push_back({name, host, *pid});
  return true;
}

// The coordinator first: everything else registers with it. In local mode
// it binds a free port and says which in a file.
bool Launcher::StartCoordinator() {
  std::vector<std::string> argv = coordinator_argv_;
  if (!local_) {
    argv.push_back(absl::StrCat("--port=", o_.coordinator_port));
    return Start("psrt-coordinator", argv);
  }
  char dir[] = "/tmp/psrt-run-XXXXXX";
  if (mkdtemp(dir) == nullptr) {
    LogError("cannot make a temporary directory");
    return false;
  }
  const std::string tmp_dir = dir;
  const std::string port_file = tmp_dir + "/coordinator.port";
  argv.push_back("--bind=127.0.0.1");
  argv.push_back("--port=0");
  argv.push_back("--port-file=" + port_file);
  if (!Start("psrt-coordinator", argv)) return false;
  absl::StatusOr<int> port = ReadPortFile(port_file, children_.back(), absl::Seconds(30));
  unlink(port_file.c_str());
  rmdir(tmp_dir.c_str());
  if (!port.ok()) {
    LogError(port.status().message());
    StopAll();
    return false;
  }
  coordinator_ = absl::StrCat("127.0.0.1:", *port);
  return true;
}

// On its port, to go on from the job record.
bool Launcher::RestartCoordinator() {
  std::vector<std::string> argv = coordinator_argv_;
  argv.push_back("--port=" + coordinator_.substr(coordinator_.rfind(':') + 1));
  if (local_) argv.push_back("--bind=127.0.0.1");
  argv.push_back("--restarted");
  return Start("psrt-coordinator", argv);
}

// Each host's agent runs its servers and training processes, so that it
// can start them again when the job recovers from a failure.
std::vector<std::string> Launcher::AgentArgv(int h) const {
  std::vector<std::string> argv = {
      o_.bin_dir + "/psrt-worker",
      "--coordinator=" + coordinator_,
      absl::StrCat("--host-index=", h),
      "--host=" + hosts_[h],
      absl::StrCat("--connect-timeout=", o_.ps.barrier_timeout_s),
      "--servers",
      "--server-host=" + (local_                         ? std::string("127.0.0.1")
                          : o_.advertise_address.empty() ? hosts_[h]
                                                         : o_.advertise_address)};
  if (local_) argv.push_back("--server-bind=127.0.0.1");
  if (o_.metrics_port >= 0) argv.push_back("--server-metrics-port=0");
  if (o_.tag_output) argv.push_back("--tag-output");
  const std::vector<std::string> gpus =
      GpusOfHost(o_.gpus, local_ ? h : 0, my_hosts_.size(), o_.ps.workers_per_host);
  if (!gpus.empty()) argv.push_back("--gpus=" + absl::StrJoin(gpus, ","));
  argv.push_back("--");
  argv.insert(argv.end(), o_.command.begin(), o_.command.end());
  return argv;
}

bool Launcher::StartAgents() {
  for (int h : my_hosts_) {
    if (!Start(absl::StrCat("psrt-worker[", h, "]"), AgentArgv(h), h)) {
      StopAll();
      return false;
    }
  }
  return true;
}

void Launcher::Supervise() {
  while (true) {
    RestartChildren(ReapChildren());
    if (std::all_of(children_.begin(), children_.end(), [](const Child& c) { return c.done; }))
      return;
    if (int sig = pending_signal_->exchange(0); sig != 0) OnSignal(sig);
    if (PastDeadlines()) return;
    if (absl::Now() >= next_poll_) PollCoordinator();
    absl::SleepFor(absl::Milliseconds(20));
  }
}

// Notes the children that ended. With on_failure "recover" an agent or the
// coordinator killed by a signal is started again (one that exits has
// decided: the job's end, or that the coordinator is gone for good), as
// often as the job may recover. Returns those to start again: hosts of
// agents, -1 for the coordinator.
std::vector<int> Launcher::ReapChildren() {
  std::vector<int> to_restart;
  for (const Exit& e : ReapExited()) {
    for (Child& c : children_) {
      if (c.pid != e.pid || c.done) continue;
      c.done = true;
      c.exit = e;
      if (e.code == 0) continue;
      LogWarning(c.name, " ", e.description);
      // The coordinator hears of a lost agent from here at once, before
      // the exits of the processes it took along.
      if (c.host >= 0 && job_running_) ReportAgentExit(coordinator_, o_.token, c.host, e);
      if (recover_ && e.code > 128 && job_running_ && signals_ == 0 &&
          give_up_ == absl::InfiniteFuture() && restarts_ < o_.ps.max_recoveries) {
        to_restart.push_back(c.host);
        c.replaced = true;
      } else {
        died_.push_back({0, absl::StrCat(c.name, " ", e.description)});
        if (first_cause_.empty() && job_running_) first_cause_ = died_.back().second;
        give_up_ = std::min(give_up_, absl::Now() + settle_);
      }
    }
  }
  return to_restart;
}

void Launcher::RestartChildren(const std::vector<int>& hosts) {
  for (int h : hosts) {
    ++restarts_;
    const std::string name = h < 0 ? "psrt-coordinator" : absl::StrCat("psrt-worker[", h, "]");
    LogWarning("starting ", name, " again (", restarts_, " of at most ", o_.ps.max_recoveries, ")");
    if (!(h < 0 ? RestartCoordinator() : Start(name, AgentArgv(h), h))) {
      give_up_ = std::min(give_up_, absl::Now() + settle_);
    }
  }
}

// The first signal: where the coordinator runs here, it is passed on (the
// coordinator checkpoints and ends the job); elsewhere the job gets
// --stop-grace to end. A second stops every process now.
void Launcher::OnSignal(int sig) {
  ++signals_;
  next_poll_ = absl::Now();
  if (first_cause_.empty())
    first_cause_ = absl::StrCat("psrt-run got signal ", sig, " (", strsignal(sig), ")");
  auto coordinator_here = std::find_if(children_.begin(), children_.end(),
                                       [](const Child& c) { return c.host < 0 && !c.done; });
  if (signals_ > 1) {
    LogWarning("got signal ", sig, " again; stopping every process now");
    SignalAll(SIGTERM);
    give_up_ = std::min(give_up_, absl::Now() + absl::Seconds(5));
  } else if (coordinator_here != children_.end()) {
    LogWarning("got signal ", sig, " (", strsignal(sig),
               "); the coordinator writes a final checkpoint (within ",
               absl::FormatDuration(o_.stop_grace), ", --stop-grace) and ends the job");
    kill(coordinator_here->pid, sig);
    give_up_ = std::min(give_up_, absl::Now() + o_.stop_grace + settle_);
  } else {
    LogWarning("got signal ", sig, " (", strsignal(sig), "); waiting up to ",
               absl::FormatDuration(o_.stop_grace),
               " (--stop-grace) for the job to end, then stopping this host's processes");
    stop_at_ = absl::Now() + o_.stop_grace;
  }
}

// Acts on the deadlines that passed; true once it stopped waiting for the
// children.
bool Launcher::PastDeadlines() {
  if (absl::Now() > stop_at_) {
    LogWarning("the job did not end within ", absl::FormatDuration(o_.stop_grace),
               "; stopping this host's processes");
    SignalAll(SIGTERM);
    stop_at_ = absl::InfiniteFuture();
    give_up_ = std::min(give_up_, absl::Now() + settle_);
  }
  if (absl::Now() > give_up_) {
    LogWarning("processes still running ", absl::FormatDuration(settle_),
               " after a failure; stopping them");
    StopAll();
    return true;
  }
  return false;
}

// Remembers why the job ended, and who died, while the coordinator can
// still say.
void Launcher::PollCoordinator() {
  auto status = QueryJobStatus(coordinator_, o_.token, absl::Milliseconds(500));
  if (status.ok()) {
    last_status_ = *status;
    generation_ = status->config().generation();
    for (const v1::ProcessStatus& p : status->processes()) {
      if (!p.exited() || p.exit_code() == 0) continue;
      if (!known_dead_.insert(absl::StrCat(generation_, " ", p.name())).second) continue;
      died_.push_back({generation_, absl::StrCat(p.name(), " ", DescribeExitCode(p.exit_code()))});
    }
    if (status->state() != v1::JOB_RUNNING) {
      reason_ = status->reason();
      job_running_ = false;
    }
  }
  // Stopping, the job may end and every process exit within a moment.
  next_poll_ = absl::Now() + (signals_ > 0 ? absl::Milliseconds(20) : absl::Milliseconds(250));
}

// Stops the children still running (SIGTERM, SIGKILL after 5 s) and notes
// how they ended.
void Launcher::StopAll() {
  std::vector<pid_t> pids;
  for (const Child& c : children_) {
    if (!c.done) pids.push_back(c.pid);
  }
  for (const Exit& e : Terminate(pids, absl::Seconds(5))) {
    for (Child& c : children_) {
      if (c.pid == e.pid) {
        c.done = true;
        c.exit = e;
        if (e.code != 0) died_.push_back({0, absl::StrCat(c.name, " ", e.description)});
      }
    }
  }
}

void Launcher::SignalAll(int sig) {
  for (const Child& c : children_) {
    if (!c.done) kill(c.pid, sig);
  }
}

int Launcher::Report() {
  if (std::none_of(children_.begin(), children_.end(),
                   [](const Child& c) { return c.exit.code != 0 && !c.replaced; })) {
    LogNotice("job succeeded");
    Summarize();
    return 0;
  }
  LogError("job failed: ", !reason_.empty()        ? reason_
                           : !first_cause_.empty() ? first_cause_
                                                   : "see the processes below");
  // The servers and training processes of generations a recovery replaced
  // were recovered from; the last generation's are part of the end.
  for (const auto& [g, what] : died_) {
    if (g == 0 || g == generation_) LogError("  ", what);
  }
  Summarize();
  return 1;
}

// Host 0's psrt-run sums the job up, from the coordinator's last word.
void Launcher::Summarize() {
  if (my_hosts_[0] != 0 || !last_status_.has_value()) return;
  JobSummary summary = SummarizeJob(*last_status_, absl::Now() - launched_);
  LogNotice(summary.line);
  if (o_.summary_json.empty()) return;
  std::ofstream out(o_.summary_json, std::ios::trunc);
  out << summary.json;
  if (!out.flush()) LogWarning("cannot write the summary to ", o_.summary_json);
}

}  // namespace

int RunLauncher(const LaunchOptions& o) {
  // Static: the signal thread may outlive this frame.
  static std::atomic<int> pending_signal{0};
  HandleSignals([](int sig) { pending_signal = sig; });
  Launcher launcher(o, &pending_signal);
  return launcher.Run();
}

}  // namespace psrt
