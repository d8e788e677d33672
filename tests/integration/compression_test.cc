// FP16/BF16 compression over real servers: bytes on the wire halve, and
// training converges as with float32.
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <future>
#include <regex>
#include <sstream>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/process.h"
#include "tests/integration/job_util.h"
#include "tests/integration/test_cluster.h"
#include "worker/client.h"

namespace psrt {
namespace {


std::unique_ptr<Client> ConnectOne(const testing::TestCluster& cluster) {
  ClientOptions o;
  o.coordinator = cluster.coordinator_address();
  o.token = cluster.token();
  o.rank = 0;
  o.host = "127.0.0.1";
  o.rpc_timeout = absl::Seconds(10);
  auto c = Client::Connect(o);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? std::move(*c) : nullptr;
}

// Bytes the servers received for one push of `n` float32 gradients.
double PushedBytes(const std::string& compression, Compression per_variable, int64_t n) {
  testing::ClusterOptions o;
  o.distribution = absl::StrCat(R"({"parameter_server": {"enabled": true, "compression": ")", compression,
                                R"(", "servers_per_host": 2}})");
  o.test_workers = 0;
  auto cluster = testing::TestCluster::Start(o);
  EXPECT_TRUE(cluster.ok()) << cluster.status();
  if (!cluster.ok()) return -1;
  auto client = ConnectOne(**cluster);
  if (client == nullptr) return -1;
  std::vector<float> w(n, 0.f), g(n);
  for (int64_t i = 0; i < n; ++i) g[i] = std::sin(i * 0.1f) * (i % 7 == 0 ? 1e6f : 1.f);
  EXPECT_TRUE(client->RegisterVariable("w", {n}, w.data(), DefaultOptimizer(OptimizerKind::kSgd, 1e-6),
                                       per_variable).ok());
  const double before = client->ServerMetric("psrt_server_bytes_in_total").value_or(-1);
  EXPECT_TRUE(client->Wait(client->PushPull({{"w", g.data(), w.data()}}, 0)).ok());
  const double after = client->ServerMetric("psrt_server_bytes_in_total").value_or(-1);
  if (compression == "fp16" || per_variable == Compression::kFp16) {
    // Gradients of 1e6 exceed fp16: they arrived scaled, and the weights
    // moved by lr * g without overflow.
    EXPECT_GT(client->ServerMetric("psrt_server_rescaled_pushes_total").value_or(-1), 0);
    EXPECT_NEAR(w[7], -1e-6 * g[7], std::abs(g[7]) * 1e-6 * 1e-3);
    EXPECT_TRUE(std::isfinite(w[7]));
  }
  return after - before;
}

TEST(CompressedJobTest, Fp16AndBf16HalveTheBytesServersReceive) {
  constexpr int64_t kN = 3 << 20;  // 12 MiB of float32, several keys on two servers
  const double none = PushedBytes("none", Compression::kJobDefault, kN);
  EXPECT_EQ(none, kN * 4.0);
  EXPECT_EQ(PushedBytes("fp16", Compression::kJobDefault, kN), kN * 2.0);
  EXPECT_EQ(PushedBytes("bf16", Compression::kJobDefault, kN), kN * 2.0);
  // Per variable, through the client API, in a job without compression.
  EXPECT_EQ(PushedBytes("none", Compression::kFp16, kN), kN * 2.0);
}

// Trains the example on 2 simulated hosts; returns rank 0's relative error
// against the known solution.
double TrainedError(const std::string& ps_json) {
  const std::string dir = TempDir();
  Proc job = Proc::Start(
      absl::StrCat(kBin, "/psrt-run --local=2 --distribution='{\"parameter_server\": {\"enabled\": true, ",
                   ps_json, "}}' -- ", kBin, "/psrt-example-linreg --dim=256 --steps=300 --result=", dir, "/r"),
      dir + "/log");
  const int code = job.Wait(absl::Seconds(90), "job");
  if (code == -1) return INFINITY;
  EXPECT_EQ(code, 0) << job.Output();
  std::smatch m;
  const std::string r0 = ReadFile(dir + "/r.rank0.json");
  if (!std::regex_search(r0, m, std::regex("\"relative_error\": ([-0-9.eE+]+)"))) return INFINITY;
  return std::stod(m[1]);
}

TEST(CompressedJobTest, TrainingConvergesWithFp16AndBf16) {
  const double fp32 = TrainedError(R"("compression": "none")");
  EXPECT_LT(fp32, 1e-5);
  // Compressed gradients only: the servers' float32 weights still converge
  // to the solution, to within the gradients' last rounding.
  EXPECT_LT(TrainedError(R"("compression": "fp16")"), 1e-3);
  EXPECT_LT(TrainedError(R"("compression": "bf16")"), 1e-2);
  // Compressed both ways: workers see weights rounded to 11 (fp16) or 8
  // (bf16) significant bits, which bounds how close they get.
  EXPECT_LT(TrainedError(R"("compression": "fp16", "pull_compression": "fp16")"), 2e-3);
  EXPECT_LT(TrainedError(R"("compression": "bf16", "pull_compression": "bf16")"), 1e-2);
}

}  // namespace
}  // namespace psrt
