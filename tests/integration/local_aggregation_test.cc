// Local aggregation on real jobs (docs/runtime.md, "Local aggregation"): a
// host's training processes sum their gradients in shared memory and push
// once per key; the job trains as without it, and a process of the host
// that stalls or dies ends the others' waits with its name, never a hang.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <cmath>
#include <regex>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_util.h"
#include "tests/integration/job_util.h"

namespace psrt {
namespace {

constexpr char kTrainer[] = "/psrt-example-linreg --dim=3000 --steps=20 --log-every=100";

struct JobRun {
  int code = -1;
  std::string log, dir;
  double pushed = -1, pulled = -1;  // bytes the workers pushed and pulled, from the summary
  std::string weights(int rank) const {
    return ReadFile(absl::StrCat(dir, "/r.rank", rank, ".weights"));
  }
};

// Runs the example on `hosts` simulated hosts of 2 training processes.
JobRun Train(int hosts, const std::string& ps, const std::string& trainer = kTrainer) {
  JobRun r;
  r.dir = TempDir();
  Proc job = Proc::Start(
      absl::StrCat(kBin, "/psrt-run --local=", hosts, " --summary-json=", r.dir, "/summary.json",
                   R"( --distribution='{"parameter_server": {"enabled": true, )",
                   R"("workers_per_host": 2, "partition_bytes": 4096, )", ps, "}}' -- ", kBin,
                   trainer, " --result=", r.dir, "/r"),
      r.dir + "/log");
  r.code = job.Wait(absl::Seconds(120), "job");
  r.log = job.Output();
  std::smatch m;
  const std::string summary = ReadFile(r.dir + "/summary.json");
  if (std::regex_search(summary, m, std::regex("\"bytes_pushed\": ([0-9.eE+]+)")))
    r.pushed = std::stod(m[1]);
  if (std::regex_search(summary, m, std::regex("\"bytes_pulled\": ([0-9.eE+]+)")))
    r.pulled = std::stod(m[1]);
  return r;
}

// Two hosts of two: each host's pushes are one per key, half the bytes of
// four workers pushing on their own, and the weights are those of one
// process applying the four batches' mean gradient: bit for bit on each
// host's ranks, within float32 rounding of the sum's other order.
TEST(LocalAggregationTest, EachHostPushesOncePerKeyAndTrainsAsOneProcessOnTheMean) {
  const JobRun summed = Train(2, R"("transport": "auto")");
  ASSERT_EQ(summed.code, 0) << summed.log;
  EXPECT_TRUE(absl::StrContains(summed.log, "on 4 workers (each host summing first)"))
      << summed.log;
  const JobRun alone = Train(2, R"("local_aggregation": false)");
  ASSERT_EQ(alone.code, 0) << alone.log;
  EXPECT_FALSE(absl::StrContains(alone.log, "summing first")) << alone.log;
  ASSERT_GT(alone.pushed, 0);
  EXPECT_EQ(summed.pushed * 2, alone.pushed);

  const std::string dir = TempDir();
  Proc reference = Proc::Start(absl::StrCat(kBin, kTrainer, " --reference=4 --result=", dir, "/r"),
                               dir + "/log");
  ASSERT_EQ(reference.Wait(absl::Seconds(60), "reference"), 0) << reference.Output();
  const std::string want = ReadFile(dir + "/r.reference.weights");
  ASSERT_EQ(want.size(), 3001 * 4u);
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_EQ(summed.weights(rank), summed.weights(0)) << "rank " << rank;
  }
  const std::string got = summed.weights(0), unsummed = alone.weights(0);
  ASSERT_EQ(got.size(), want.size());
  ASSERT_EQ(unsummed.size(), want.size());
  const float* g = reinterpret_cast<const float*>(got.data());
  const float* w = reinterpret_cast<const float*>(want.data());
  const float* u = reinterpret_cast<const float*>(unsummed.data());
  for (int i = 0; i < 3001; ++i) {
    EXPECT_NEAR(g[i], w[i], 1e-5 + 1e-5 * std::abs(w[i])) << "weight " << i;
    EXPECT_NEAR(g[i], u[i], 1e-5 + 1e-5 * std::abs(u[i])) << "weight " << i;
  }

  // One host of two, its keys kept on a backup server too: the host's sum is
  // the whole step's, in rank order, as the reference sums: bit for bit.
  const JobRun one = Train(1, R"("transport": "tcp", "servers_per_host": 2, "replicas": 1)");
  ASSERT_EQ(one.code, 0) << one.log;
  Proc reference2 = Proc::Start(
      absl::StrCat(kBin, kTrainer, " --reference=2 --result=", dir, "/r2"), dir + "/log2");
  ASSERT_EQ(reference2.Wait(absl::Seconds(60), "reference"), 0) << reference2.Output();
  EXPECT_TRUE(one.weights(0) == ReadFile(dir + "/r2.reference.weights"));
  EXPECT_TRUE(one.weights(1) == one.weights(0));
}

// A table's rows: each host sums its processes' rows per id and pushes
// every row once, and pulls every row of a step once. 16 ids under batches
// of 32 put nearly every id in every batch, so a host's pushed and pulled
// rows are about half its processes' (with each on its own, the bytes
// would barely drop: the dense part is 2 floats). The rows trained equal
// those of the job without it, within float32 rounding, and on every rank
// bit for bit.
TEST(LocalAggregationTest, AHostSumsItsTablesRowsPerIdAndMovesEachOnce) {
  constexpr char kTable[] = "/psrt-example-linreg --dim=1 --steps=20 --table-rows=16";
  const JobRun summed = Train(2, R"("transport": "auto")", kTable);
  ASSERT_EQ(summed.code, 0) << summed.log;
  const JobRun alone = Train(2, R"("local_aggregation": false)", kTable);
  ASSERT_EQ(alone.code, 0) << alone.log;
  ASSERT_GT(alone.pushed, 0);
  EXPECT_LT(summed.pushed, 0.6 * alone.pushed);
  EXPECT_GT(summed.pushed, 0.4 * alone.pushed);
  ASSERT_GT(alone.pulled, 0);
  EXPECT_LT(summed.pulled, 0.6 * alone.pulled);
  EXPECT_GT(summed.pulled, 0.4 * alone.pulled);
  const std::string got = summed.weights(0), want = alone.weights(0);
  ASSERT_EQ(got.size(), (2 + 16) * 4u);
  ASSERT_EQ(want.size(), got.size());
  for (int rank = 1; rank < 4; ++rank) {
    EXPECT_EQ(summed.weights(rank), got) << "rank " << rank;
  }
  const float* g = reinterpret_cast<const float*>(got.data());
  const float* w = reinterpret_cast<const float*>(want.data());
  for (int i = 0; i < 18; ++i) EXPECT_NEAR(g[i], w[i], 1e-6) << "element " << i;
  EXPECT_NE(g[2], 0) << "the table learned";
}

// Compressed pushes are the host's sum, compressed once: the job still
// converges to the known solution.
TEST(LocalAggregationTest, AHostsSumIsCompressedOnceAndConverges) {
  const JobRun r = Train(2, R"("compression": "fp16", "pull_compression": "bf16")",
                         "/psrt-example-linreg --dim=256 --steps=300");
  ASSERT_EQ(r.code, 0) << r.log;
  std::smatch m;
  const std::string r0 = ReadFile(r.dir + "/r.rank0.json");
  ASSERT_TRUE(std::regex_search(r0, m, std::regex("\"relative_error\": ([-0-9.eE+]+)"))) << r0;
  EXPECT_LT(std::stod(m[1]), 1e-2) << r0;
}

// A process that stops (SIGSTOP: alive, silent) while its host sums: the
// host's others end their waits (for its gradients, its table rows, or a
// row it claimed to pull) at their deadline naming it, the job fails and
// every process exits.
TEST(LocalAggregationTest, AStalledProcessIsNamedByTheOthersWaitAndTheJobEnds) {
  const std::string token = RandomToken();
  const std::string dir = TempDir();
  Proc job = Proc::Start(
      absl::StrCat(
          "env PSRT_RPC_TIMEOUT_S=4 ", kBin, "/psrt-run --local=1 --token=", token,
          R"( --distribution='{"parameter_server": {"enabled": true, )",
          R"("workers_per_host": 2, "heartbeat_timeout_s": 60}}' -- )", kBin,
          "/psrt-example-linreg --dim=64 --table-rows=64 --steps=1000000 --lr=0.01 --log-every=1"),
      dir + "/log");
  ASSERT_TRUE(job.WaitForOutput("step 3 loss", absl::Seconds(60))) << job.Output();
  const pid_t stalled = FindJobProcess(token, [](pid_t pid) {
    return absl::StrContains(CmdLine(pid), "psrt-example-linreg") &&
           absl::StrContains(ReadFile(absl::StrCat("/proc/", pid, "/environ")),
                             std::string("PSRT_LOCAL_RANK=1\0", 18));
  });
  ASSERT_GT(stalled, 0);
  ASSERT_EQ(kill(stalled, SIGSTOP), 0);
  EXPECT_NE(job.Wait(absl::Seconds(60), "job"), 0);
  const std::string out = job.Output();
  EXPECT_TRUE(absl::StrContains(out, "local rank 1 (rank 1) did not")) << out;
  EXPECT_EQ(Leftovers(token), 0);
}

}  // namespace
}  // namespace psrt
