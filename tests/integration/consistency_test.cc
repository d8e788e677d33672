// Consistency modes and membership, on real servers over loopback: sync is
// exact, ssp holds its staleness bound, backup workers drop late pushes, and
// a lost worker fails the job, is left behind, or rejoins, as configured.
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <future>
#include <regex>
#include <sstream>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_util.h"
#include "common/process.h"
#include "tests/integration/job_util.h"
#include "tests/integration/test_cluster.h"
#include "worker/client.h"

namespace psrt {
namespace {

// Runs a shell command to completion (with a deadline); returns exit code
// and output.
std::pair<int, std::string> RunShell(const std::string& cmd, absl::Duration timeout) {
  Proc p = Proc::Start(cmd, TempDir() + "/log");
  const int code = p.Wait(timeout, cmd);
  return {code, p.Output()};
}

std::vector<float> Weights(const std::string& path) {
  const std::string bytes = ReadFile(path);
  std::vector<float> w(bytes.size() / 4);
  std::memcpy(w.data(), bytes.data(), w.size() * 4);
  return w;
}

void ExpectSyncEqualsOneProcess(const std::string& aggregation, double lr) {
  const std::string dir = TempDir();
  const std::string trainer = absl::StrCat(kBin, "/psrt-example-linreg --dim=300 --batch=16 --steps=40 --lr=", lr,
                                           " --result=", dir, "/r");
  auto [code, out] = RunShell(absl::StrCat(kBin, "/psrt-run --local=2 --distribution='{\"parameter_server\": "
                                      "{\"enabled\": true, \"mode\": \"sync\", \"partition_bytes\": 4096, "
                                      "\"gradient_aggregation\": \"", aggregation, "\"}}' -- ", trainer),
                         absl::Seconds(60));
  ASSERT_EQ(code, 0) << out;
  auto [ref_code, ref_out] = RunShell(absl::StrCat(trainer, " --reference=2 --aggregation=", aggregation), absl::Seconds(30));
  ASSERT_EQ(ref_code, 0) << ref_out;
  const std::vector<float> ref = Weights(dir + "/r.reference.weights");
  ASSERT_EQ(ref.size(), 301u);
  for (const char* who : {"rank0", "rank1"}) {
    const std::vector<float> got = Weights(absl::StrCat(dir, "/r.", who, ".weights"));
    ASSERT_EQ(got.size(), ref.size()) << who;
    double worst = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      worst = std::max<double>(worst, std::abs(got[i] - ref[i]) / std::max(1.0f, std::abs(ref[i])));
    }
    // The servers add the same float gradients in the same order; only the
    // optimizer kernel's rounding may differ from the plain loop.
    EXPECT_LT(worst, 1e-5) << who;
  }
  // And it did train: the reference is near the known solution.
  EXPECT_LT(std::abs(ref[0] - std::sin(1.0)), 0.2);
}

TEST(ConsistencyTest, SyncEqualsOneProcessOnTheMeanGradient) { ExpectSyncEqualsOneProcess("mean", 0.1); }

TEST(ConsistencyTest, SyncEqualsOneProcessOnTheSumWhenConfigured) { ExpectSyncEqualsOneProcess("sum", 0.05); }

// `n` clients of a cluster, one per rank, connected concurrently (the
// barrier needs them all).
std::vector<std::unique_ptr<Client>> ConnectAll(const testing::TestCluster& cluster, int n,
                                                absl::Duration rpc_timeout) {
  std::vector<std::future<absl::StatusOr<std::unique_ptr<Client>>>> futures;
  for (int r = 0; r < n; ++r) {
    futures.push_back(std::async(std::launch::async, [&cluster, r, rpc_timeout] {
      ClientOptions o;
      o.coordinator = cluster.coordinator_address();
      o.token = cluster.token();
      o.rank = r;
      o.host = "127.0.0.1";
      o.rpc_timeout = rpc_timeout;
      o.connect_timeout = absl::Seconds(20);
      return Client::Connect(o);
    }));
  }
  std::vector<std::unique_ptr<Client>> clients;
  for (auto& f : futures) {
    auto c = f.get();
    EXPECT_TRUE(c.ok()) << c.status();
    if (c.ok()) clients.push_back(std::move(*c));
  }
  return clients;
}

absl::StatusOr<std::unique_ptr<testing::TestCluster>> StartCluster(const std::string& ps_json, int hosts) {
  testing::ClusterOptions o;
  o.distribution = absl::StrCat(R"({"parameter_server": {"enabled": true, )", ps_json, "}}");
  o.hosts.clear();
  for (int h = 0; h < hosts; ++h) o.hosts.push_back(absl::StrCat("local", h));
  o.test_workers = 0;
  return testing::TestCluster::Start(o);
}

// Registers "w" (4 floats, SGD lr 1) on every client; rank 0's zeros win.
void RegisterW(std::vector<std::unique_ptr<Client>>& clients, std::vector<std::vector<float>>* w) {
  w->assign(clients.size(), std::vector<float>(4, 0.f));
  std::vector<std::future<absl::Status>> fs;
  for (size_t r = 0; r < clients.size(); ++r) {
    fs.push_back(std::async(std::launch::async, [&, r] {
      return clients[r]->RegisterVariable("w", {4}, (*w)[r].data(), DefaultOptimizer(OptimizerKind::kSgd, 1.0));
    }));
  }
  for (auto& f : fs) ASSERT_TRUE(f.get().ok());
}

// Worker `c` pushes a gradient of ones at clock `clock`, then pulls at
// clock+1; returns the pull's status.
absl::Status Step(Client& c, std::vector<float>& w, int64_t clock) {
  std::vector<float> g(4, 1.f);
  if (absl::Status s = c.Wait(c.Push({{"w", g.data(), nullptr}}, clock)); !s.ok()) return s;
  return c.Wait(c.Pull({{"w", nullptr, w.data()}}, clock + 1));
}

TEST(ConsistencyTest, SspBlocksExactlyWhenMoreThanStalenessAhead) {
  auto cluster = StartCluster(R"("mode": "ssp", "staleness": 2, "workers_per_host": 1)", 2);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto clients = ConnectAll(**cluster, 2, absl::Milliseconds(700));
  ASSERT_EQ(clients.size(), 2u);
  std::vector<std::vector<float>> w;
  RegisterW(clients, &w);
  // Worker 1 stays at clock 0. Worker 0 may run to clock 2 (pulls at clocks
  // 1 and 2 need the slowest at >= -1 and >= 0) ...
  ASSERT_TRUE(Step(*clients[0], w[0], 0).ok());
  ASSERT_TRUE(Step(*clients[0], w[0], 1).ok());
  auto clocks = clients[0]->WorkerClocks();
  ASSERT_TRUE(clocks.ok()) << clocks.status();
  EXPECT_EQ(*clocks, (std::vector<int64_t>{2, 0}));
  // ... but its pull at clock 3 is more than 2 ahead of worker 1: it blocks
  // until its deadline, and says whom it waited for.
  const absl::Time start = absl::Now();
  absl::Status blocked = Step(*clients[0], w[0], 2);
  EXPECT_EQ(blocked.code(), absl::StatusCode::kDeadlineExceeded) << blocked;
  EXPECT_NE(blocked.message().find("staleness bound 2 needs every worker at clock >= 1; behind: worker 1 at clock 0"),
            std::string::npos)
      << blocked;
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(500));
  // Once worker 1 reaches clock 1, the same pull goes through at once.
  ASSERT_TRUE(Step(*clients[1], w[1], 0).ok());
  ASSERT_TRUE(clients[0]->Wait(clients[0]->Pull({{"w", nullptr, w[0].data()}}, 3)).ok());
  // Every push was applied once: 3 from worker 0, 1 from worker 1, lr 1.
  EXPECT_EQ(w[0], std::vector<float>(4, -4.f));
  auto staleness = clients[0]->ServerMetric("psrt_server_staleness_count");
  ASSERT_TRUE(staleness.ok()) << staleness.status();
  EXPECT_GE(*staleness, 4);
}

TEST(ConsistencyTest, SspWithZeroStalenessIsLockStepAndAsyncNeverBlocks) {
  {
    auto cluster = StartCluster(R"("mode": "ssp", "staleness": 0, "workers_per_host": 1)", 2);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    auto clients = ConnectAll(**cluster, 2, absl::Milliseconds(500));
    ASSERT_EQ(clients.size(), 2u);
    std::vector<std::vector<float>> w;
    RegisterW(clients, &w);
    EXPECT_EQ(Step(*clients[0], w[0], 0).code(), absl::StatusCode::kDeadlineExceeded);
    ASSERT_TRUE(Step(*clients[1], w[1], 0).ok());  // both at clock 1 now
    ASSERT_TRUE(clients[0]->Wait(clients[0]->Pull({{"w", nullptr, w[0].data()}}, 1)).ok());
  }
  auto cluster = StartCluster(R"("mode": "async", "workers_per_host": 1)", 2);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto clients = ConnectAll(**cluster, 2, absl::Milliseconds(500));
  ASSERT_EQ(clients.size(), 2u);
  std::vector<std::vector<float>> w;
  RegisterW(clients, &w);
  for (int64_t c = 0; c < 20; ++c) ASSERT_TRUE(Step(*clients[0], w[0], c).ok()) << c;
  EXPECT_EQ(w[0], std::vector<float>(4, -20.f));
  auto clocks = clients[0]->WorkerClocks();
  ASSERT_TRUE(clocks.ok());
  EXPECT_EQ(*clocks, (std::vector<int64_t>{20, 0}));
}

TEST(ConsistencyTest, BackupWorkersApplyAStepWithoutTheSlowestAndCountItsDrop) {
  auto cluster = StartCluster(R"("mode": "sync", "backup_workers": 1, "workers_per_host": 1)", 3);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto clients = ConnectAll(**cluster, 3, absl::Seconds(5));
  ASSERT_EQ(clients.size(), 3u);
  std::vector<std::vector<float>> w;
  RegisterW(clients, &w);
  // Workers 0 and 1 push step 0 with gradients 1 and 3; worker 2 is slow.
  std::vector<float> g1(4, 1.f), g3(4, 3.f), g9(4, 9.f);
  ASSERT_TRUE(clients[0]->Wait(clients[0]->Push({{"w", g1.data(), nullptr}}, 0)).ok());
  ASSERT_TRUE(clients[1]->Wait(clients[1]->Push({{"w", g3.data(), nullptr}}, 0)).ok());
  ASSERT_TRUE(clients[0]->Wait(clients[0]->Pull({{"w", nullptr, w[0].data()}}, 1)).ok());
  EXPECT_EQ(w[0], std::vector<float>(4, -2.f));  // mean of the two that came
  // The slow worker's push for step 0 arrives late: dropped and counted.
  ASSERT_TRUE(clients[2]->Wait(clients[2]->Push({{"w", g9.data(), nullptr}}, 0)).ok());
  auto dropped = clients[2]->ServerMetric("psrt_server_dropped_pushes_total");
  ASSERT_TRUE(dropped.ok()) << dropped.status();
  EXPECT_EQ(*dropped, 1);
  ASSERT_TRUE(clients[2]->Wait(clients[2]->Pull({{"w", nullptr, w[2].data()}}, 1)).ok());
  EXPECT_EQ(w[2], std::vector<float>(4, -2.f));
  auto version = clients[2]->PulledVersion("w");
  ASSERT_TRUE(version.ok());
  EXPECT_EQ(*version, 1);  // it goes on from step 1
}

std::string LossJob(const std::string& ps_json, const std::string& dir) {
  return absl::StrCat(kBin, "/psrt-run --local=3 --distribution='{\"parameter_server\": {\"enabled\": true, "
                      "\"heartbeat_timeout_s\": 3, ", ps_json, "}}' -- ", kBin,
                      "/psrt-example-linreg --dim=64 --steps=150 --exit-at-step=30 --exit-rank=1 --result=", dir, "/r");
}

double RelativeError(const std::string& json) {
  std::smatch m;
  if (!std::regex_search(json, m, std::regex("\"relative_error\": ([-0-9.eE+]+)"))) return INFINITY;
  return std::stod(m[1]);
}

TEST(ConsistencyTest, ALostWorkerFailsTheJobByDefault) {
  const std::string dir = TempDir();
  auto [code, out] = RunShell(LossJob(R"("mode": "sync")", dir), absl::Seconds(60));
  EXPECT_EQ(code, 1) << out;
  EXPECT_NE(out.find("job failed: worker 1 on local1 exited with code 3"), std::string::npos) << out;
  for (const char* p : {"psrt-coordinator", "psrt-server\\[0\\]", "psrt-worker\\[0\\]", "psrt-worker\\[2\\]"}) {
    EXPECT_TRUE(std::regex_search(out, std::regex(absl::StrCat(p, " exited with code 1")))) << p << "\n" << out;
  }
}

TEST(ConsistencyTest, ALostWorkerIsLeftBehindWithContinue) {
  for (const char* mode : {"sync", "ssp"}) {
    SCOPED_TRACE(mode);
    const std::string dir = TempDir();
    auto [code, out] = RunShell(LossJob(absl::StrCat(R"("on_worker_failure": "continue", "mode": ")", mode, "\"",
                                                std::string(mode) == "ssp" ? R"(, "staleness": 1)" : ""),
                                   dir),
                           absl::Seconds(90));
    EXPECT_EQ(code, 0) << out;
    EXPECT_NE(out.find("worker 1 on local1 exited with code 3: exited with code 3; continuing with 2 workers (epoch 2)"),
              std::string::npos)
        << out;
    EXPECT_LT(RelativeError(ReadFile(dir + "/r.rank0.json")), 1e-3) << out;
    EXPECT_LT(RelativeError(ReadFile(dir + "/r.rank2.json")), 1e-3) << out;
  }
}

TEST(ConsistencyTest, ARestartedWorkerRejoinsAndFinishes) {
  const std::string dir = TempDir();
  auto [code, out] = RunShell(LossJob(R"("mode": "sync", "restart_workers": 1)", dir), absl::Seconds(90));
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("worker 1 on local1 exited with code 3: exited with code 3; its agent restarts it"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("started worker 1 (pid"), std::string::npos);
  for (int r = 0; r < 3; ++r) {
    EXPECT_LT(RelativeError(ReadFile(absl::StrCat(dir, "/r.rank", r, ".json"))), 1e-3) << "rank " << r << "\n" << out;
  }
}

}  // namespace
}  // namespace psrt
