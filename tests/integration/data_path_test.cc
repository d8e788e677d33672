// The data path on real psrt-servers: 64 workers' pulls wait for a version
// without a server thread each, and every one is answered (a plain protobuf
// client on loopback); shared memory and TCP train alike, a worker killed
// in the middle of a transfer leaves the servers serving, no region
// outlives its job, and nobody outside the job can attach one.
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/grpc_util.h"
#include "common/shared_memory.h"
#include "psrt/v1/ps.grpc.pb.h"
#include "tests/integration/job_util.h"
#include "tests/integration/test_cluster.h"

namespace psrt {
namespace {

constexpr int kWorkers = 64;
constexpr int kN = 1000;

// Threads of process `pid` (/proc/PID/status), or -1.
int Threads(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    int n;
    if (line.rfind("Threads:", 0) == 0 && absl::SimpleAtoi(line.substr(8), &n)) return n;
  }
  return -1;
}

class DataPathTest : public ::testing::Test {
 protected:
  void Start(int workers_per_host) {
    testing::ClusterOptions options;
    options.distribution =
        absl::StrCat(R"({"parameter_server":{"enabled":true,"mode":"sync","workers_per_host":)",
                     workers_per_host, "}}");
    absl::StatusOr<std::unique_ptr<testing::TestCluster>> cluster =
        testing::TestCluster::Start(options);
    ASSERT_TRUE(cluster.ok()) << "starting the cluster: " << cluster.status();
    cluster_ = std::move(*cluster);
    stub_ = v1::ParameterServer::NewStub(MakeChannel(cluster_->server_address(0)));
  }

  void Prepare(grpc::ClientContext* ctx) {
    PrepareContext(ctx, cluster_->token(), absl::Seconds(60));
  }

  // Registers "w" (kN float32, SGD with lr 1) as every worker.
  void RegisterW(int workers) {
    for (int r = 0; r < workers; ++r) {
      v1::RegisterKeysRequest req;
      req.set_worker_rank(r);
      v1::KeySpec* k = req.add_keys();
      k->set_variable("w");
      k->set_dtype(v1::DTYPE_FLOAT32);
      k->add_shape(kN);
      k->set_num_elements(kN);
      k->mutable_optimizer()->set_name("sgd");
      k->mutable_optimizer()->set_lr(1);
      if (r == 0) k->set_init(std::string(kN * 4, '\0'));  // zeros
      grpc::ClientContext ctx;
      Prepare(&ctx);
      v1::RegisterKeysResponse resp;
      grpc::Status s = stub_->RegisterKeys(&ctx, req, &resp);
      ASSERT_TRUE(s.ok()) << "registering w as worker " << r << ": " << s.error_message();
    }
  }

  double Metric(const std::string& name) {
    grpc::ClientContext ctx;
    Prepare(&ctx);
    v1::StatsResponse stats;
    grpc::Status s = stub_->Stats(&ctx, v1::StatsRequest(), &stats);
    EXPECT_TRUE(s.ok()) << s.error_message();
    auto it = stats.metrics().find(name);
    return it == stats.metrics().end() ? -1 : it->second;
  }

  std::unique_ptr<testing::TestCluster> cluster_;
  std::unique_ptr<v1::ParameterServer::Stub> stub_;
};

TEST_F(DataPathTest, SixtyFourWaitingPullsHoldNoThreadAndAllAreAnswered) {
  Start(kWorkers);
  ASSERT_EQ(cluster_->config().num_workers(), kWorkers);
  RegisterW(kWorkers);
  const pid_t server = cluster_->server_pid(0);
  const int before = Threads(server);
  ASSERT_GT(before, 0);

  // Every worker asks for version 1, which needs every worker's push.
  struct Call {
    grpc::ClientContext ctx;
    v1::PullRequest req;
    v1::PullResponse resp;
    grpc::Status status;
  };
  std::vector<std::unique_ptr<Call>> calls;
  absl::Mutex mu;
  int answered = 0;
  for (int r = 0; r < kWorkers; ++r) {
    auto c = std::make_unique<Call>();
    Prepare(&c->ctx);
    c->req.set_worker_rank(r);
    v1::KeyData* k = c->req.add_keys();
    k->set_variable("w");
    k->set_version(1);
    Call* raw = c.get();
    stub_->async()->Pull(&c->ctx, &c->req, &c->resp, [raw, &mu, &answered](grpc::Status s) {
      absl::MutexLock lock(&mu);
      raw->status = std::move(s);
      ++answered;
    });
    calls.push_back(std::move(c));
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (Metric("psrt_server_waiting_pulls") < kWorkers && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_EQ(Metric("psrt_server_waiting_pulls"), kWorkers)
      << "the server never had every pull waiting";
  const int waiting = Threads(server);
  std::printf("psrt-server threads: %d before the pulls, %d with %d pulls waiting\n", before, waiting,
              kWorkers);
  // A thread per waiting pull would add 64; the server's threads do not
  // depend on how many pulls wait.
  EXPECT_LT(waiting - before, 8) << "threads before the pulls: " << before
                                 << ", with 64 waiting: " << waiting;
  {
    absl::MutexLock lock(&mu);
    EXPECT_EQ(answered, 0) << "a pull for version 1 was answered before any push";
  }

  // Every worker pushes its gradient r + 1; version 1 is 0 - mean = -32.5.
  for (int r = 0; r < kWorkers; ++r) {
    v1::PushRequest push;
    push.set_worker_rank(r);
    push.set_push_id(1);
    v1::KeyData* k = push.add_keys();
    k->set_variable("w");
    k->set_version(0);
    k->set_dtype(v1::DTYPE_FLOAT32);
    const std::vector<float> g(kN, static_cast<float>(r + 1));
    k->set_data(reinterpret_cast<const char*>(g.data()), kN * 4);
    grpc::ClientContext ctx;
    Prepare(&ctx);
    v1::PushResponse resp;
    grpc::Status s = stub_->Push(&ctx, push, &resp);
    ASSERT_TRUE(s.ok()) << "push of worker " << r << ": " << s.error_message();
  }
  {
    absl::MutexLock lock(&mu);
    auto all = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return answered == kWorkers; };
    ASSERT_TRUE(mu.AwaitWithTimeout(absl::Condition(&all), absl::Seconds(30)))
        << answered << " of " << kWorkers << " pulls answered";
  }
  for (int r = 0; r < kWorkers; ++r) {
    SCOPED_TRACE(absl::StrCat("worker ", r));
    const Call& c = *calls[r];
    ASSERT_TRUE(c.status.ok()) << c.status.error_message();
    ASSERT_EQ(c.resp.keys_size(), 1);
    EXPECT_EQ(c.resp.keys(0).version(), 1);
    ASSERT_EQ(c.resp.keys(0).data().size(), static_cast<size_t>(kN * 4));
    std::vector<float> w(kN);
    std::memcpy(w.data(), c.resp.keys(0).data().data(), kN * 4);
    EXPECT_EQ(w.front(), -32.5f);
    EXPECT_EQ(w.back(), -32.5f);
  }
  const absl::Time drained = absl::Now() + absl::Seconds(5);
  while (Metric("psrt_server_waiting_pulls") != 0 && absl::Now() < drained) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(Metric("psrt_server_waiting_pulls"), 0);
  EXPECT_LT(Threads(server) - before, 8);
  EXPECT_TRUE(cluster_->ServerAlive(0)) << cluster_->ServerExitDescription(0);
}

// A pull that waits past its deadline ends with an error naming the
// workers it waited for; the waiting costs no thread and leaves nothing.
TEST_F(DataPathTest, AWaitingPullEndsAtItsDeadlineNamingTheMissingWorkers) {
  Start(2);
  RegisterW(2);
  v1::PullRequest req;
  req.set_worker_rank(1);
  v1::KeyData* k = req.add_keys();
  k->set_variable("w");
  k->set_version(1);
  grpc::ClientContext ctx;
  PrepareContext(&ctx, cluster_->token(), absl::Milliseconds(800));
  v1::PullResponse resp;
  const absl::Time start = absl::Now();
  grpc::Status s = stub_->Pull(&ctx, req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_NE(s.error_message().find("waiting for pushes from workers 0, 1"), std::string::npos)
      << s.error_message();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_EQ(Metric("psrt_server_waiting_pulls"), 0);
}

// The psrt shared-memory objects in /dev/shm made by the training processes a
// job's output names ("started worker 1 (pid 123)").
std::vector<std::string> SharedObjectsOf(const std::string& job_output) {
  std::vector<std::string> prefixes;
  const std::regex started(R"(started worker \d+ \(pid (\d+)\))");
  for (std::sregex_iterator m(job_output.begin(), job_output.end(), started), end; m != end; ++m)
    prefixes.push_back(absl::StrCat("psrt-", (*m)[1].str(), "-"));
  EXPECT_FALSE(prefixes.empty()) << job_output;
  std::vector<std::string> names;
  if (DIR* d = opendir("/dev/shm")) {
    while (dirent* e = readdir(d)) {
      for (const std::string& p : prefixes)
        if (std::string(e->d_name).rfind(p, 0) == 0) names.push_back(e->d_name);
    }
    closedir(d);
  }
  return names;
}

std::string LinregJob(const std::string& ps_json, int hosts, const std::string& trainer_flags,
                      const std::string& result) {
  return absl::StrCat(kBin, "/psrt-run --local=", hosts,
                      " --distribution='{\"parameter_server\": {\"enabled\": true, ", ps_json,
                      "}}' -- ", kBin, "/psrt-example-linreg ", trainer_flags,
                      " --result=", result);
}

TEST(SharedMemoryJobTest, SharedMemoryDataChannelAndGrpcTrainBitForBitAlike) {
  const std::string dir = TempDir();
  std::map<std::string, std::string> weights;
  for (const char* transport : {"auto", "tcp", "grpc"}) {
    SCOPED_TRACE(transport);
    // fp16 pushes and bf16 pulls, keys of 64 KiB: conversion on the way in
    // and out, several keys per request and server.
    Proc p = Proc::Start(
        LinregJob(
            absl::StrCat(R"("mode": "sync", "compression": "fp16", "pull_compression": "bf16", )",
                         R"("partition_bytes": 65536, "transport": ")", transport, "\""),
            2, "--dim=100000 --steps=20 --lr=0.05", absl::StrCat(dir, "/", transport)),
        absl::StrCat(dir, "/", transport, ".log"));
    ASSERT_EQ(p.Wait(absl::Seconds(120), transport), 0) << p.Output();
    const bool shared = p.Output().find("tensors travel through shared memory with every server") !=
                        std::string::npos;
    EXPECT_EQ(shared, std::string(transport) == "auto") << p.Output();
    const bool channels = p.Output().find("pushes and pulls go over data channels to every server") !=
                          std::string::npos;
    EXPECT_EQ(channels, std::string(transport) != "grpc") << p.Output();
    weights[transport] = ReadFile(absl::StrCat(dir, "/", transport, ".rank1.weights"));
    EXPECT_EQ(weights[transport].size(), 100001u * 4);
    EXPECT_EQ(SharedObjectsOf(p.Output()), std::vector<std::string>{})
        << "a job left shared memory behind";
  }
  EXPECT_TRUE(weights["auto"] == weights["tcp"]) << "shared memory trained other weights than TCP";
  EXPECT_TRUE(weights["grpc"] == weights["tcp"]) << "the data channel trained other weights than gRPC";
}

// Training processes that die between offering a server shared memory and
// removing its name: their agents remove the names.
TEST(SharedMemoryJobTest, ObjectsOfAKilledTrainingProcessAreRemoved) {
  const std::string dir = TempDir();
  Proc p = Proc::Start(absl::StrCat("env PSRT_FAILPOINT=shared_memory.offered ",
                                    LinregJob(R"("mode": "sync")", 2, "--dim=1000 --steps=5",
                                              dir + "/r")),
                       dir + "/job.log");
  EXPECT_NE(p.Wait(absl::Seconds(120), "the job whose workers die"), 0) << p.Output();
  EXPECT_NE(p.Output().find("failpoint shared_memory.offered reached"), std::string::npos)
      << p.Output();
  EXPECT_NE(p.Output().find(" of ended training processes from /dev/shm"),
            std::string::npos)
      << p.Output();
  EXPECT_EQ(SharedObjectsOf(p.Output()), std::vector<std::string>{}) << p.Output();
}

TEST(SharedMemoryJobTest, AWorkerKilledMidTransferLeavesTheServersServing) {
  const std::string dir = TempDir();
  // 4 MiB a step each way over shared memory: much of a step is transfer.
  Proc p = Proc::Start(LinregJob(R"("mode": "sync", "on_worker_failure": "continue")", 3,
                                 "--dim=1000000 --steps=40 --batch=4 --lr=0.00001", dir + "/r"),
                       dir + "/job.log");
  ASSERT_TRUE(p.WaitForOutput("step 0 ", absl::Seconds(60))) << p.Output();
  std::smatch m;
  const std::string out = p.Output();
  ASSERT_TRUE(std::regex_search(out, m, std::regex(R"(started worker 1 \(pid (\d+)\))"))) << out;
  absl::SleepFor(absl::Milliseconds(300));
  ASSERT_EQ(kill(std::stoi(m[1]), SIGKILL), 0);
  ASSERT_EQ(p.Wait(absl::Seconds(180), "the job after worker 1 was killed"), 0) << p.Output();
  EXPECT_NE(p.Output().find("continuing with 2 workers"), std::string::npos) << p.Output();
  for (const char* rank : {"rank0", "rank2"}) {
    EXPECT_NE(ReadFile(absl::StrCat(dir, "/r.", rank, ".json")).find("relative_error"),
              std::string::npos)
        << rank << " did not finish\n"
        << p.Output();
  }
  EXPECT_EQ(SharedObjectsOf(p.Output()), std::vector<std::string>{});
}

// A server maps only owner-only psrt objects, only for callers with the
// job's token; once attached the name is gone, so nobody can attach it.
TEST_F(DataPathTest, OnlyTheJobCanAttachSharedMemory) {
  Start(1);
  absl::StatusOr<std::unique_ptr<SharedRegion>> region = SharedRegion::Create(1 << 20);
  ASSERT_TRUE(region.ok()) << region.status();
  auto attach = [&](const std::string& token, const std::string& name, int64_t size) {
    v1::AttachSharedMemoryRequest req;
    req.set_worker_rank(0);
    req.set_name(name);
    req.set_size(size);
    grpc::ClientContext ctx;
    PrepareContext(&ctx, token, absl::Seconds(10));
    v1::AttachSharedMemoryResponse resp;
    return stub_->AttachSharedMemory(&ctx, req, &resp);
  };
  const std::string name = (*region)->name();
  EXPECT_EQ(attach("another-jobs-token", name, 1 << 20).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(attach(cluster_->token(), name, 1 << 19).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(attach(cluster_->token(), "/etc/passwd", 1 << 20).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  // An object others may read is refused.
  const std::string open_name = "/psrt-0123456789abcdef0123456789abcdef";
  const int fd = shm_open(open_name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0644);
  ASSERT_GE(fd, 0);
  fchmod(fd, 0644);
  ASSERT_EQ(ftruncate(fd, 1 << 20), 0);
  close(fd);
  grpc::Status open_status = attach(cluster_->token(), open_name, 1 << 20);
  shm_unlink(open_name.c_str());
  EXPECT_EQ(open_status.error_code(), grpc::StatusCode::PERMISSION_DENIED)
      << open_status.error_message();
  // The job's own offer is taken; then the name is removed.
  grpc::Status ok = attach(cluster_->token(), name, 1 << 20);
  EXPECT_TRUE(ok.ok()) << ok.error_message();
  (*region)->Unlink();
  EXPECT_EQ(attach(cluster_->token(), name, 1 << 20).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_TRUE(cluster_->ServerAlive(0)) << cluster_->ServerExitDescription(0);
}

}  // namespace
}  // namespace psrt
