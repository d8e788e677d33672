#include "tests/integration/test_cluster.h"

#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/grpc_util.h"
#include "common/process.h"

namespace psrt {
namespace testing {
namespace {

constexpr absl::Duration kPollInterval = absl::Milliseconds(10);

std::string DescribeStatus(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exited with code ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return absl::StrCat("was killed by signal ", WTERMSIG(status), " (", strsignal(WTERMSIG(status)),
                        ")");
  }
  return "ended in an unknown way";
}

std::string Seconds(absl::Duration d) {
  return absl::FormatDuration(absl::Trunc(d, absl::Milliseconds(100)));
}

absl::Duration Remaining(absl::Time deadline) {
  return std::max(absl::Milliseconds(100), deadline - absl::Now());
}

}  // namespace

absl::StatusOr<std::unique_ptr<TestCluster>> TestCluster::Start(ClusterOptions options) {
  std::unique_ptr<TestCluster> cluster(new TestCluster());
  cluster->options_ = std::move(options);
  // On failure the cluster's destructor stops whatever did start.
  if (absl::Status s = cluster->StartImpl(); !s.ok()) return s;
  return cluster;
}

absl::Status TestCluster::StartImpl() {
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + options_.start_timeout;
  token_ = options_.token.empty() ? RandomToken() : options_.token;
  std::string bin_dir = options_.bin_dir;
#ifdef PSRT_BIN_DIR
  if (bin_dir.empty()) bin_dir = PSRT_BIN_DIR;
#endif
  if (bin_dir.empty()) bin_dir = SelfDirectory();

  const char* tmp = getenv("TMPDIR");
  std::string dir_template = absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp",
                                          "/psrt_test_cluster_XXXXXX");
  if (mkdtemp(dir_template.data()) == nullptr) {
    return absl::InternalError(absl::StrCat("mkdtemp ", dir_template, ": ", strerror(errno)));
  }
  dir_ = dir_template;

  std::map<std::string, std::string> env = options_.env;
  env["PSRT_JOB_TOKEN"] = token_;

  // --- coordinator -----------------------------------------------------------
  const std::string port_file = absl::StrCat(dir_, "/coordinator.port");
  coordinator_.name = "psrt-coordinator";
  std::vector<std::string> coordinator_argv = {
      absl::StrCat(bin_dir, "/psrt-coordinator"), "--bind=127.0.0.1", "--port=0",
      absl::StrCat("--port-file=", port_file),
      absl::StrCat("--hosts=", absl::StrJoin(options_.hosts, ",")),
      absl::StrCat("--distribution=", options_.distribution)};
  coordinator_argv.insert(coordinator_argv.end(), options_.coordinator_flags.begin(),
                          options_.coordinator_flags.end());
  absl::StatusOr<pid_t> pid = Spawn(coordinator_argv, env);
  if (!pid.ok()) return pid.status();
  coordinator_.pid = *pid;
  absl::StatusOr<int> port = WaitForPortFile(deadline);
  if (!port.ok()) return port.status();
  coordinator_address_ = absl::StrCat("127.0.0.1:", *port);

  // The coordinator listens once the port file exists; its status carries
  // the job's settings (how many servers and workers to expect).
  absl::StatusOr<v1::JobStatusResponse> status =
      QueryJobStatus(coordinator_address_, token_, Remaining(deadline));
  if (!status.ok()) {
    return absl::Status(status.status().code(),
                        absl::StrCat("reading the job status from the coordinator at ",
                                     coordinator_address_, ": ", status.status().message()));
  }
  config_ = status->config();

  // --- servers ---------------------------------------------------------------
  for (int i = 0; i < config_.num_servers(); ++i) {
    Child server;
    server.name = absl::StrCat("psrt-server ", i);
    std::vector<std::string> argv = {absl::StrCat(bin_dir, "/psrt-server"),
                                     absl::StrCat("--coordinator=", coordinator_address_),
                                     absl::StrCat("--index=", i), "--host=127.0.0.1",
                                     "--bind=127.0.0.1"};
    argv.insert(argv.end(), options_.server_flags.begin(), options_.server_flags.end());
    absl::StatusOr<pid_t> server_pid = Spawn(argv, env);
    if (!server_pid.ok()) return server_pid.status();
    server.pid = *server_pid;
    servers_.push_back(std::move(server));
  }
  if (absl::Status s = WaitForServers(deadline); !s.ok()) return s;

  // --- the test's own workers --------------------------------------------------
  const int num_workers = config_.num_workers();
  const int test_workers =
      options_.test_workers < 0 ? num_workers : std::min(options_.test_workers, num_workers);
  for (int rank = 0; rank < test_workers; ++rank) {
    CoordinatorLink::Options link;
    link.coordinator = coordinator_address_;
    link.token = token_;
    link.id.set_role(v1::ROLE_WORKER);
    link.id.set_index(rank);
    link.host = "127.0.0.1";
    link.connect_timeout = Remaining(deadline);
    link.rpc_timeout = std::min(absl::Seconds(10), Remaining(deadline));
    absl::StatusOr<std::unique_ptr<CoordinatorLink>> connected =
        CoordinatorLink::Connect(std::move(link));
    if (!connected.ok()) {
      return absl::Status(connected.status().code(),
                          absl::StrCat("registering the test as worker ", rank,
                                       " with the coordinator at ", coordinator_address_, ": ",
                                       connected.status().message()));
    }
    worker_links_.push_back(std::move(*connected));
  }
  if (test_workers < num_workers) return absl::OkStatus();

  // Every server and worker has registered, so the barrier returns at once
  // with the shard map.
  absl::StatusOr<v1::BarrierResponse> barrier = worker_links_.at(0)->Barrier();
  if (!barrier.ok()) {
    return absl::Status(barrier.status().code(),
                        absl::StrCat("readiness barrier at the coordinator at ", coordinator_address_,
                                     ": ", barrier.status().message()));
  }
  server_addresses_.assign(barrier->shard_map().server_addresses().begin(),
                           barrier->shard_map().server_addresses().end());
  if (static_cast<int>(server_addresses_.size()) != num_servers()) {
    return absl::InternalError(absl::StrCat("the barrier's shard map lists ",
                                            server_addresses_.size(), " servers; the job has ",
                                            num_servers()));
  }
  for (int i = 0; i < num_servers(); ++i) {
    if (server_addresses_[i].empty()) {
      return absl::InternalError(absl::StrCat("the shard map has no address for server ", i));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<int> TestCluster::WaitForPortFile(absl::Time deadline) {
  const std::string path = absl::StrCat(dir_, "/coordinator.port");
  const absl::Time start = absl::Now();
  while (true) {
    std::ifstream in(path);
    std::string text;
    if (in && std::getline(in, text)) {
      int port = 0;
      if (absl::SimpleAtoi(absl::StripAsciiWhitespace(text), &port) && port > 0 && port <= 65535) {
        return port;
      }
      return absl::InternalError(
          absl::StrCat("psrt-coordinator wrote '", text, "' to its port file ", path));
    }
    if (!Alive(&coordinator_)) {
      return absl::InternalError(absl::StrCat("psrt-coordinator ", coordinator_.exit,
                                              " before writing its port file ", path));
    }
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat("timed out after ",
                                                      Seconds(absl::Now() - start),
                                                      " waiting for psrt-coordinator to write "
                                                      "its port file ",
                                                      path));
    }
    absl::SleepFor(kPollInterval);
  }
}

absl::Status TestCluster::WaitForServers(absl::Time deadline) {
  const absl::Time start = absl::Now();
  std::string last;  // what the last poll saw, for the timeout message
  while (true) {
    for (Child& server : servers_) {
      if (!Alive(&server)) {
        return absl::InternalError(absl::StrCat(server.name, " ", server.exit,
                                                " before registering with the coordinator at ",
                                                coordinator_address_));
      }
    }
    if (!Alive(&coordinator_)) {
      return absl::InternalError(absl::StrCat("psrt-coordinator ", coordinator_.exit,
                                              " while the servers were starting"));
    }
    absl::StatusOr<v1::JobStatusResponse> status =
        QueryJobStatus(coordinator_address_, token_, std::min(absl::Seconds(2), Remaining(deadline)));
    if (status.ok()) {
      std::vector<std::string> missing;
      for (const v1::ProcessStatus& p : status->processes()) {
        if (p.id().role() == v1::ROLE_SERVER && !p.registered()) missing.push_back(p.name());
      }
      if (missing.empty()) return absl::OkStatus();
      last = absl::StrCat("not registered: ", absl::StrJoin(missing, ", "));
    } else {
      last = absl::StrCat("GetJobStatus failed: ", status.status().ToString());
    }
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "timed out after ", Seconds(absl::Now() - start), " waiting for ", servers_.size(),
          " psrt-server(s) to register with the coordinator at ", coordinator_address_, " (",
          last, ")"));
    }
    absl::SleepFor(kPollInterval);
  }
}

bool TestCluster::Alive(Child* c) {
  if (c->reaped || c->pid <= 0) return false;
  int status = 0;
  const pid_t r = waitpid(c->pid, &status, WNOHANG);
  if (r == 0) return true;
  c->reaped = true;
  c->exit = r == c->pid ? DescribeStatus(status) : "is no longer a child of the test";
  return false;
}

absl::Status TestCluster::CheckAllAlive() {
  std::vector<std::string> dead;
  if (!Alive(&coordinator_)) dead.push_back(absl::StrCat(coordinator_.name, " ", coordinator_.exit));
  for (Child& s : servers_) {
    if (!Alive(&s)) dead.push_back(absl::StrCat(s.name, " ", s.exit));
  }
  if (dead.empty()) return absl::OkStatus();
  return absl::InternalError(absl::StrJoin(dead, "; "));
}

void TestCluster::Stop(std::vector<Child*> children) {
  std::vector<pid_t> pids;
  std::vector<Child*> running;
  for (Child* c : children) {
    if (Alive(c)) {
      pids.push_back(c->pid);
      running.push_back(c);
    }
  }
  if (pids.empty()) return;
  std::vector<Exit> exits = Terminate(pids, options_.stop_grace);
  for (Child* c : running) {
    c->reaped = true;
    c->exit = "was stopped";
    for (const Exit& e : exits) {
      if (e.pid == c->pid) c->exit = e.description;
    }
  }
}

TestCluster::~TestCluster() {
  std::vector<Child*> servers;
  for (Child& s : servers_) servers.push_back(&s);
  Stop(servers);
  // The job ended with its servers (unless its settings outlive them). The
  // test hears that as psrt-run and training processes do: its workers in a
  // heartbeat sent now, its status query (Start() asked once) in another;
  // else the coordinator waits out its grace for them (up to the heartbeat
  // timeout) before it exits.
  if (Alive(&coordinator_)) {
    for (const auto& link : worker_links_) link->Wake();
    bool ended = true;
    for (const auto& link : worker_links_)
      ended = link->WaitForEnd(absl::Seconds(2)).state != v1::JOB_RUNNING && ended;
    if (ended) (void)QueryJobStatus(coordinator_address_, token_, absl::Seconds(2));
  }
  worker_links_.clear();  // stops their heartbeats while the coordinator still answers
  Stop({&coordinator_});
  if (!dir_.empty()) {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
}

}  // namespace testing
}  // namespace psrt
