// Checkpoints of whole jobs: psrt-run, the daemons and the example trainer as
// real processes, checkpoints to a local folder (and to S3 through moto's
// server), restored onto other numbers of servers, and crashes at every
// phase of a checkpoint.
#include <signal.h>

#include <fstream>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/checkpoint/catalog.h"
#include "tests/integration/job_util.h"
#include "tests/integration/moto_server.h"

namespace psrt {
namespace {

// A short Adam regression: 3000 weights in partitions of 1024 floats, so
// variables span several keys and re-partitioning cuts through records.
constexpr char kTrainer[] = "--dim=3000 --batch=8 --optimizer=adam --lr=0.01 --log-every=1000";

struct Job {
  std::string ps;                 // extra parameter_server settings, JSON members
  int hosts = 2;                  // psrt-run --local
  int partition_bytes = 4096;
  int steps = 40;
  std::string trainer = kTrainer;
  std::string env;                // VAR=value ... before psrt-run
  std::string result;             // --result prefix (empty: none)
};

struct Ran {
  int code = -1;
  std::string output;
};

Ran RunJob(const Job& job, const std::string& dir) {
  const std::string dist =
      absl::StrCat(R"({"parameter_server":{"enabled":true,"heartbeat_timeout_s":3,"partition_bytes":)",
                   job.partition_bytes, job.ps.empty() ? "" : ",", job.ps, "}}");
  const std::string log = TempDir() + "/log";
  Proc p = Proc::Start(
      absl::StrCat(job.env.empty() ? "" : "env " + job.env + " ", kBin, "/psrt-run --local=", job.hosts,
                   " --distribution='", dist, "' -- ", kBin, "/psrt-example-linreg ", job.trainer,
                   " --steps=", job.steps, job.result.empty() ? "" : " --result=" + dir + "/" + job.result),
      log);
  Ran r;
  r.code = p.Wait(absl::Seconds(120), "job");
  r.output = p.Output();
  return r;
}

Ran Ckpt(const std::string& args) {
  const std::string log = TempDir() + "/log";
  Proc p = Proc::Start(absl::StrCat(kBin, "/psrt-ckpt ", args), log);
  Ran r;
  r.code = p.Wait(absl::Seconds(60), "psrt-ckpt " + args);
  r.output = p.Output();
  return r;
}

std::string Weights(const std::string& dir, const std::string& result) {
  return ReadFile(absl::StrCat(dir, "/", result, ".rank0.weights"));
}

std::string Checkpointing(const std::string& root, int every_steps, const std::string& more = "") {
  return absl::StrCat(R"("checkpoint":{"uri":")", root, R"(","every_steps":)", every_steps, "}", more);
}

// The weights of an uninterrupted run of `job` (no checkpoints).
std::string Reference(Job job, const std::string& dir) {
  job.result = "reference";
  Ran r = RunJob(job, dir);
  EXPECT_EQ(r.code, 0) << r.output;
  std::string w = Weights(dir, job.result);
  EXPECT_FALSE(w.empty());
  return w;
}

TEST(CheckpointJobTest, SyncRoundTripContinuesAsIfUninterrupted) {
  const std::string dir = TempDir(), root = dir + "/ckpt";
  const std::string reference = Reference(Job{}, dir);

  Job first;
  first.steps = 20;
  first.ps = Checkpointing(root, 10);
  Ran a = RunJob(first, dir);
  ASSERT_EQ(a.code, 0) << a.output;
  EXPECT_TRUE(absl::StrContains(a.output, "step-000000000010 committed")) << a.output;
  EXPECT_TRUE(absl::StrContains(a.output, "step-000000000020 committed")) << a.output;
  EXPECT_EQ(ReadFile(root + "/LATEST"), "step-000000000020\n");

  Ran ls = Ckpt("ls " + root);
  EXPECT_EQ(ls.code, 0) << ls.output;
  EXPECT_TRUE(std::regex_search(ls.output, std::regex(R"(\* step-000000000020\s+20 )"))) << ls.output;
  Ran verify = Ckpt("verify file://" + root);
  EXPECT_EQ(verify.code, 0) << verify.output;
  EXPECT_TRUE(absl::StrContains(verify.output, "OK file://" + root + "/step-000000000010")) << verify.output;
  Ran inspect = Ckpt("inspect " + root);
  EXPECT_EQ(inspect.code, 0) << inspect.output;
  EXPECT_TRUE(absl::StrContains(inspect.output, "step 20, sync mode, written by 2 servers")) << inspect.output;
  EXPECT_TRUE(std::regex_search(inspect.output, std::regex(R"(weight\s+shape \[3000\] DTYPE_FLOAT32, 3 keys, version 20; optimizer adam lr=0.01)")))
      << inspect.output;

  // Restored and saved again at once into another folder, with the same
  // servers and partitions: every shard is byte for byte the one restored
  // (weights, optimizer slots, versions, learning rates).
  Job again;
  again.steps = 20;
  again.ps = absl::StrCat(R"("restore":")", root, R"(/step-000000000020",)", Checkpointing(dir + "/again", 1000));
  Ran b = RunJob(again, dir);
  ASSERT_EQ(b.code, 0) << b.output;
  EXPECT_TRUE(absl::StrContains(b.output, "restoring file://" + root + "/step-000000000020 (step 20")) << b.output;
  for (int i = 0; i < 2; ++i) {
    const std::string shard = ShardPath("step-000000000020", i, 2);
    const std::string saved = ReadFile(root + "/" + shard);
    ASSERT_FALSE(saved.empty());
    EXPECT_EQ(ReadFile(dir + "/again/" + shard), saved) << shard;
  }

  // Restored, the job trains on to step 40 and ends where an uninterrupted
  // run ends, bit for bit.
  Job rest;
  rest.ps = absl::StrCat(R"("restore":"latest",)", Checkpointing(root, 10));
  rest.result = "restored";
  Ran c = RunJob(rest, dir);
  ASSERT_EQ(c.code, 0) << c.output;
  EXPECT_FALSE(absl::StrContains(c.output, "step 0 loss")) << "training started over:\n" << c.output;
  EXPECT_EQ(Weights(dir, rest.result), reference);
}

// A checkpoint of 3 servers restores onto 2 and onto 5 (with other partition
// sizes too), and training ends exactly where it would have.
TEST(CheckpointJobTest, RestoresOntoFewerAndMoreServers) {
  const std::string dir = TempDir(), root = dir + "/ckpt";
  Job base;
  base.hosts = 1;
  const std::string reference = Reference(base, dir);
  Job write = base;
  write.steps = 20;
  write.ps = absl::StrCat(R"("servers_per_host":3,)", Checkpointing(root, 0));
  Ran a = RunJob(write, dir);
  ASSERT_EQ(a.code, 0) << a.output;
  for (const auto& [servers, partition] : std::vector<std::pair<int, int>>{{2, 8192}, {5, 4096}, {5, 12288}}) {
    Job rest = base;
    rest.partition_bytes = partition;
    rest.ps = absl::StrCat(R"("servers_per_host":)", servers, R"(,"restore":")", root, R"(/step-000000000020")");
    rest.result = absl::StrCat("on", servers, "-", partition);
    Ran r = RunJob(rest, dir);
    ASSERT_EQ(r.code, 0) << r.output;
    EXPECT_TRUE(absl::StrContains(r.output, "written by 3 servers")) << r.output;
    EXPECT_EQ(Weights(dir, rest.result), reference) << servers << " servers, partitions of " << partition;
  }
}

}  // namespace
}  // namespace psrt
