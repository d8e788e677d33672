// A real psrt job on loopback for integration tests: one psrt-coordinator,
// its psrt-servers, and the test process itself registered as the job's
// training workers. No mocks: every process is a child started with
// psrt::Spawn, and every one is stopped and reaped when the cluster goes.
//
//   psrt::testing::ClusterOptions options;
//   options.distribution = R"({"parameter_server":{"enabled":true,"mode":"sync"}})";
//   absl::StatusOr<std::unique_ptr<psrt::testing::TestCluster>> cluster =
//       psrt::testing::TestCluster::Start(options);
//   ASSERT_TRUE(cluster.ok()) << cluster.status();
//   auto stub = psrt::v1::ParameterServer::NewStub(
//       psrt::MakeChannel((*cluster)->server_address(0)));
//
// Every wait in Start() has a deadline; a failure names what it waited for
// and how any child that died ended.
#ifndef PSRT_TESTS_INTEGRATION_TEST_CLUSTER_H_
#define PSRT_TESTS_INTEGRATION_TEST_CLUSTER_H_

#include <sys/types.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/coordinator_link.h"
#include "psrt/v1/coordinator.pb.h"

namespace psrt {
namespace testing {

struct ClusterOptions {
  // The coordinator's --distribution (the parameter_server option as JSON).
  std::string distribution = R"({"parameter_server":{"enabled":true}})";
  // The coordinator's --hosts; the number of servers and workers follows
  // from it and the distribution. Every process still runs on 127.0.0.1.
  std::vector<std::string> hosts = {"local0"};
  // The test registers itself as workers 0..test_workers-1 (each with its
  // own CoordinatorLink, so the coordinator sees their heartbeats). Use -1
  // for every worker of the job, 0 for none (then no shard map is fetched
  // and server addresses stay unknown unless something else registers the
  // workers).
  int test_workers = -1;
  // The job token; empty picks a random one.
  std::string token;
  // Where psrt-coordinator and psrt-server are; empty: PSRT_BIN_DIR.
  std::string bin_dir;
  // Deadline for the whole start: port file, registrations, barrier.
  absl::Duration start_timeout = absl::Seconds(20);
  // How long each process gets between SIGTERM and SIGKILL at the end.
  absl::Duration stop_grace = absl::Seconds(5);
  // Extra flags for the psrt-coordinator and for every psrt-server.
  std::vector<std::string> coordinator_flags;
  std::vector<std::string> server_flags;
  // Extra environment for every child.
  std::map<std::string, std::string> env;
};

class TestCluster {
 public:
  // Starts the coordinator, waits for its port file, starts every server,
  // waits until each has registered, registers the test's workers and passes
  // the readiness barrier.
  static absl::StatusOr<std::unique_ptr<TestCluster>> Start(ClusterOptions options);

  // Stops the servers, then the coordinator (SIGTERM, SIGKILL after the
  // grace), and reaps them.
  ~TestCluster();

  TestCluster(const TestCluster&) = delete;
  TestCluster& operator=(const TestCluster&) = delete;

  const std::string& token() const { return token_; }
  const std::string& coordinator_address() const { return coordinator_address_; }
  const v1::JobConfig& config() const { return config_; }
  int num_servers() const { return static_cast<int>(servers_.size()); }
  // From the barrier's shard map; index i is server i.
  const std::vector<std::string>& server_addresses() const { return server_addresses_; }
  const std::string& server_address(int i) const { return server_addresses_.at(i); }
  pid_t server_pid(int i) const { return servers_.at(i).pid; }
  pid_t coordinator_pid() const { return coordinator_.pid; }
  // The link of test worker `rank` (heartbeats run while it lives).
  CoordinatorLink* worker_link(int rank) const { return worker_links_.at(rank).get(); }

  // Whether the process is still running (waitpid WNOHANG). A process found
  // dead is reaped once and remembered; ExitDescription() says how it ended.
  bool ServerAlive(int i) { return Alive(&servers_.at(i)); }
  bool CoordinatorAlive() { return Alive(&coordinator_); }
  std::string ServerExitDescription(int i) const { return servers_.at(i).exit; }
  // OK while every child runs; otherwise names each one that ended and how.
  absl::Status CheckAllAlive();

 private:
  struct Child {
    std::string name;  // "psrt-server 0"
    pid_t pid = -1;
    bool reaped = false;
    std::string exit;  // how it ended, once reaped
  };

  TestCluster() = default;
  absl::Status StartImpl();
  absl::StatusOr<int> WaitForPortFile(absl::Time deadline);
  absl::Status WaitForServers(absl::Time deadline);
  bool Alive(Child* c);
  void Stop(std::vector<Child*> children);

  ClusterOptions options_;
  std::string token_;
  std::string dir_;  // temporary directory holding the port file
  std::string coordinator_address_;
  v1::JobConfig config_;
  Child coordinator_;
  std::vector<Child> servers_;
  std::vector<std::unique_ptr<CoordinatorLink>> worker_links_;
  std::vector<std::string> server_addresses_;
};

}  // namespace testing
}  // namespace psrt

#endif  // PSRT_TESTS_INTEGRATION_TEST_CLUSTER_H_
