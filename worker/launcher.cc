#include "worker/launcher.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <fstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/coordinator_link.h"
#include "common/daemon.h"
#include "common/logging.h"
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
  return absl::DeadlineExceededError(absl::StrCat(
      "psrt-coordinator did not report its port in ", path, " within ", absl::FormatDuration(timeout)));
}

}  // namespace

int RunLauncher(const LaunchOptions& o) {
  // Static: the signal thread may outlive this frame.
  static std::atomic<int> pending_signal{0};
  HandleSignals([](int sig) { pending_signal = sig; });
  const bool local = o.local_hosts > 0;
  std::vector<std::string> hosts = o.cluster.hosts;
  if (local) {
    hosts.clear();
    for (int i = 0; i < o.local_hosts; ++i) hosts.push_back(absl::StrCat("local", i));
  }
  std::vector<int> my_hosts;
  if (local) {
    for (int i = 0; i < o.local_hosts; ++i) my_hosts.push_back(i);
  } else {
    my_hosts.push_back(o.cluster.current);
  }
  const std::map<std::string, std::string> env = {{"PSRT_JOB_TOKEN", o.token}};
  std::vector<Child> children;
  auto start = [&](const std::string& name, std::vector<std::string> argv, int host = -1) -> bool {
    absl::StatusOr<pid_t> pid = Spawn(argv, env);
    if (!pid.ok()) {
      LogError("cannot start ", name, ": ", pid.status().message());
      return false;
    }
    children.push_back({name, host, *pid});
    return true;
  };
  auto stop_all = [&]() {
    std::vector<pid_t> pids;
    for (const Child& c : children) {
      if (!c.done) pids.push_back(c.pid);
    }
    for (const Exit& e : Terminate(pids, absl::Seconds(5))) {
      for (Child& c : children) {
        if (c.pid == e.pid) {
          c.done = true;
          c.exit = e;
        }
      }
    }
  };

  // The coordinator first: everything else registers with it.
  std::string coordinator = absl::StrCat(hosts[0], ":", o.coordinator_port);
  std::string tmp_dir;
  const std::vector<std::string> coordinator_argv = {
      o.bin_dir + "/psrt-coordinator", "--hosts=" + absl::StrJoin(hosts, ","),
      "--distribution=" + o.distribution, absl::StrCat("--metrics-port=", o.metrics_port)};
  if (my_hosts[0] == 0) {
    std::vector<std::string> argv = coordinator_argv;
    std::string port_file;
    if (local) {
      char dir[] = "/tmp/psrt-run-XXXXXX";
      if (mkdtemp(dir) == nullptr) {
        LogError("cannot make a temporary directory");
        return 1;
      }
      tmp_dir = dir;
      port_file = tmp_dir + "/coordinator.port";
      argv.push_back("--bind=127.0.0.1");
      argv.push_back("--port=0");
      argv.push_back("--port-file=" + port_file);
    } else {
      argv.push_back(absl::StrCat("--port=", o.coordinator_port));
    }
    if (!start("psrt-coordinator", argv)) return 1;
    if (local) {
      absl::StatusOr<int> port = ReadPortFile(port_file, children.back(), absl::Seconds(30));
      unlink(port_file.c_str());
      rmdir(tmp_dir.c_str());
      if (!port.ok()) {
        LogError(port.status().message());
        stop_all();
        return 1;
      }
      coordinator = absl::StrCat("127.0.0.1:", *port);
    }
  }
  const std::string connect_timeout = absl::StrCat("--connect-timeout=", o.ps.barrier_timeout_s);
  // Each host's agent runs its servers and training processes, so that it
  // can start them again when the job recovers from a failure.
  auto agent_argv = [&](int h) {
    std::vector<std::string> argv = {o.bin_dir + "/psrt-worker", "--coordinator=" + coordinator,
                                     absl::StrCat("--host-index=", h), "--host=" + hosts[h],
                                     connect_timeout, "--servers",
                                     "--server-host=" + (local                               ? std::string("127.0.0.1")
                                                         : o.advertise_address.empty() ? hosts[h]
                                                                                       : o.advertise_address)};
    if (local) argv.push_back("--server-bind=127.0.0.1");
    if (o.metrics_port >= 0) argv.push_back("--server-metrics-port=0");
    argv.push_back("--");
    argv.insert(argv.end(), o.command.begin(), o.command.end());
    return argv;
  };
  for (int h : my_hosts) {
    if (!start(absl::StrCat("psrt-worker[", h, "]"), agent_argv(h), h)) {
      stop_all();
      return 1;
    }
  }
  LogInfo("started ", children.size(), " processes for ", my_hosts.size(), " of ", hosts.size(),
          " hosts; coordinator at ", coordinator);

  // Supervise. Once anything fails, the rest get time to hear of it from the
  // coordinator and exit on their own, then are stopped.
  // With on_failure "recover" an agent or the coordinator killed by a signal
  // is started again (one that exits has decided: the job's end, or that
  // the coordinator is gone for good), as often as the job may recover; the
  // coordinator on its port, to go on from the job record.
  auto restart_coordinator = [&] {
    std::vector<std::string> argv = coordinator_argv;
    argv.push_back("--port=" + coordinator.substr(coordinator.rfind(':') + 1));
    if (local) argv.push_back("--bind=127.0.0.1");
    argv.push_back("--restarted");
    return start("psrt-coordinator", argv);
  };
  const absl::Duration settle = absl::Seconds(o.ps.heartbeat_timeout_s + 10);
  const bool recover = o.ps.on_failure == "recover";
  int restarts = 0;
  absl::Time give_up = absl::InfiniteFuture();
  absl::Time next_poll = absl::Now();
  std::string reason;
  bool job_running = true;
  while (true) {
    std::vector<int> to_restart;  // hosts of agents; -1: the coordinator
    for (const Exit& e : ReapExited()) {
      for (Child& c : children) {
        if (c.pid != e.pid || c.done) continue;
        c.done = true;
        c.exit = e;
        if (e.code != 0) {
          LogWarning(c.name, " ", e.description);
          // Killed (by a signal): started again. Exited: it decided (the
          // job's end, or that its coordinator is gone for good).
          if (recover && e.code > 128 && job_running &&
              give_up == absl::InfiniteFuture() && restarts < o.ps.max_recoveries) {
            to_restart.push_back(c.host);
            c.replaced = true;
          } else {
            give_up = std::min(give_up, absl::Now() + settle);
          }
        }
      }
    }
    for (int h : to_restart) {
      ++restarts;
      const std::string name = h < 0 ? "psrt-coordinator" : absl::StrCat("psrt-worker[", h, "]");
      LogWarning("starting ", name, " again (", restarts, " of at most ", o.ps.max_recoveries, ")");
      if (!(h < 0 ? restart_coordinator() : start(name, agent_argv(h), h))) {
        give_up = std::min(give_up, absl::Now() + settle);
      }
    }
    if (std::all_of(children.begin(), children.end(), [](const Child& c) { return c.done; })) break;
    if (int sig = pending_signal.exchange(0); sig != 0) {
      LogWarning("got signal ", sig, "; stopping the job");
      for (const Child& c : children) {
        if (!c.done) kill(c.pid, SIGTERM);
      }
      give_up = std::min(give_up, absl::Now() + settle);
    }
    if (absl::Now() > give_up) {
      LogWarning("processes still running ", absl::FormatDuration(settle), " after a failure; stopping them");
      stop_all();
      break;
    }
    if (absl::Now() >= next_poll) {
      // Remember why the job ended while the coordinator can still say.
      auto status = QueryJobStatus(coordinator, o.token, absl::Milliseconds(500));
      if (status.ok() && status->state() != v1::JOB_RUNNING) {
        reason = status->reason();
        job_running = false;
      }
      next_poll = absl::Now() + absl::Milliseconds(250);
    }
    absl::SleepFor(absl::Milliseconds(20));
  }

  std::vector<std::string> failed;
  for (const Child& c : children) {
    if (c.exit.code != 0 && !c.replaced) failed.push_back(absl::StrCat(c.name, " ", c.exit.description));
  }
  if (failed.empty()) {
    LogInfo("job succeeded");
    return 0;
  }
  LogError("job failed: ", reason.empty() ? "see the processes below" : reason);
  for (const std::string& f : failed) LogError("  ", f);
  return 1;
}

}  // namespace psrt
