// Checkpoints of whole jobs: psrt-run, the daemons and the example trainer as
// real processes, checkpoints to a local folder (and to S3 through moto's
// server), restored onto other numbers of servers, and crashes at every
// phase of a checkpoint.
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "server/checkpoint/catalog.h"
#include "server/checkpoint/s3_client.h"
#include "tests/integration/credentials_endpoint.h"
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

Ran Ckpt(const std::string& args, const std::string& env = "") {
  const std::string log = TempDir() + "/log";
  Proc p = Proc::Start(absl::StrCat(env.empty() ? "" : "env " + env + " ", kBin, "/psrt-ckpt ", args), log);
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

// Temporary files of interrupted writes under `root`.
int Temporaries(const std::string& root) {
  int n = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(root)) {
    n += absl::StrContains(e.path().filename().string(), ".psrt-tmp.");
  }
  return n;
}

// A process killed at each phase of a checkpoint leaves the previous one as
// it was: it verifies, LATEST names it, and it restores to the same end as
// an uninterrupted run. The half-made checkpoint is never taken for a whole.
TEST(CheckpointJobTest, ACrashAtAnyPhaseLeavesThePreviousCheckpointWhole) {
  const std::string dir = TempDir();
  const std::string reference = Reference(Job{}, dir);
  struct Case {
    std::string failpoint;
    bool step30_committed;  // the manifest was written before the crash
  };
  const std::vector<Case> cases = {
      {"storage.half_written@psrt-server[1]", false},  // a shard half written
      {"checkpoint.shard_written@psrt-server[0]", false},  // one shard written
      {"checkpoint.shards_written", false},                 // all shards, no manifest
      {"checkpoint.manifest_written", true},                // manifest, LATEST not moved
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.failpoint);
    const std::string root = dir + "/" + c.failpoint.substr(0, c.failpoint.find('@'));
    Job first;
    first.steps = 20;
    first.ps = Checkpointing(root, 10);
    Ran a = RunJob(first, dir);
    ASSERT_EQ(a.code, 0) << a.output;

    Job crash;
    crash.ps = absl::StrCat(R"("restore":"latest",)", Checkpointing(root, 10));
    crash.env = "'PSRT_FAILPOINT=" + c.failpoint + "'";
    Ran b = RunJob(crash, dir);
    EXPECT_NE(b.code, 0) << b.output;
    EXPECT_TRUE(absl::StrContains(b.output, "failpoint " + c.failpoint.substr(0, c.failpoint.find('@')) + " reached"))
        << b.output;

    EXPECT_EQ(ReadFile(root + "/LATEST"), "step-000000000020\n");
    // A shard half written stays as a temporary file until the next commit.
    EXPECT_EQ(Temporaries(root) > 0, c.failpoint.rfind("storage.half_written", 0) == 0);
    Ran verify = Ckpt("verify " + root);
    EXPECT_EQ(verify.code, 0) << verify.output;
    Ran ls = Ckpt("ls " + root);
    EXPECT_EQ(std::regex_search(ls.output, std::regex(R"(step-000000000030\s+30 .*committed)")), c.step30_committed)
        << ls.output;

    Job rest;
    rest.ps = absl::StrCat(R"("restore":"latest",)", Checkpointing(root, 10));
    rest.result = "after-" + c.failpoint.substr(0, c.failpoint.find('@'));
    Ran r = RunJob(rest, dir);
    ASSERT_EQ(r.code, 0) << r.output;
    EXPECT_TRUE(absl::StrContains(r.output, "restoring file://" + root + "/step-000000000020")) << r.output;
    EXPECT_EQ(Weights(dir, rest.result), reference);
    EXPECT_EQ(Temporaries(root), 0);
  }
}

// A flipped byte in a shard: verify names the file and the record, and a
// restore from it fails at start with the same, before any training step.
TEST(CheckpointJobTest, AFlippedByteIsFoundByVerifyAndByRestore) {
  const std::string dir = TempDir(), root = dir + "/ckpt";
  Job first;
  first.steps = 10;
  first.ps = Checkpointing(root, 0);
  Ran a = RunJob(first, dir);
  ASSERT_EQ(a.code, 0) << a.output;
  // The weight variable's shard: the larger one. Flip a byte inside its
  // second record's weights.
  std::string shard;
  for (int i = 0; i < 2; ++i) {
    const std::string path = root + "/" + ShardPath("step-000000000010", i, 2);
    if (ReadFile(path).size() > ReadFile(shard).size()) shard = path;
  }
  std::string bytes = ReadFile(shard);
  ASSERT_GT(bytes.size(), 20000u);
  bytes[bytes.size() / 2] ^= 0x10;
  std::ofstream(shard, std::ios::binary | std::ios::trunc) << bytes;

  Ran verify = Ckpt("verify " + root);
  EXPECT_EQ(verify.code, 1) << verify.output;
  EXPECT_TRUE(absl::StrContains(verify.output, "FAILED")) << verify.output;
  EXPECT_TRUE(absl::StrContains(verify.output, shard)) << verify.output;
  EXPECT_TRUE(std::regex_search(verify.output, std::regex("record [0-9]+"))) << verify.output;

  Job rest;
  rest.ps = absl::StrCat(R"("restore":"latest",)", Checkpointing(root, 0));
  Ran r = RunJob(rest, dir);
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_TRUE(absl::StrContains(r.output, "cannot restore")) << r.output;
  EXPECT_TRUE(absl::StrContains(r.output, shard)) << r.output;
  EXPECT_TRUE(std::regex_search(r.output, std::regex("record [0-9]+"))) << r.output;
  EXPECT_FALSE(absl::StrContains(r.output, "step 10 loss")) << r.output;
}

// What cannot be restored is refused at start, naming what exists instead.
TEST(CheckpointJobTest, BadRestoresFailAtStartWithTheReason) {
  const std::string dir = TempDir(), root = dir + "/ckpt";
  Job none;
  none.ps = absl::StrCat(R"("restore":"latest",)", Checkpointing(root, 0));
  Ran a = RunJob(none, dir);
  EXPECT_NE(a.code, 0);
  EXPECT_TRUE(absl::StrContains(a.output, "no checkpoint under file://" + root)) << a.output;

  Job first;
  first.steps = 10;
  first.ps = Checkpointing(root, 0);
  ASSERT_EQ(RunJob(first, dir).code, 0);

  Job step;
  step.ps = absl::StrCat(R"("restore":"7",)", Checkpointing(root, 0));
  Ran b = RunJob(step, dir);
  EXPECT_NE(b.code, 0);
  EXPECT_TRUE(absl::StrContains(b.output, "no committed checkpoint step-000000000007")) << b.output;
  EXPECT_TRUE(absl::StrContains(b.output, "committed checkpoints there: step-000000000010")) << b.output;

  // Another model: the trainer's weight has 100 elements, the checkpoint's 3000.
  Job other;
  other.trainer = absl::StrReplaceAll(kTrainer, {{"--dim=3000", "--dim=100"}});
  other.ps = absl::StrCat(R"("restore":"latest",)", Checkpointing(root, 0));
  Ran c = RunJob(other, dir);
  EXPECT_NE(c.code, 0);
  EXPECT_TRUE(absl::StrContains(c.output, "in checkpoint file://" + root + "/step-000000000010")) << c.output;
  EXPECT_TRUE(absl::StrContains(c.output, "[3000]")) << c.output;
  EXPECT_FALSE(absl::StrContains(c.output, " loss ")) << "it trained:\n" << c.output;
}

// `psrt-ckpt save` checkpoints a running job at once, next to every_seconds
// and keep; async jobs record each key's version and resume at the least
// worker clock.
TEST(CheckpointJobTest, OnDemandCheckpointOfARunningAsyncJob) {
  const std::string dir = TempDir(), root = dir + "/ckpt";
  const std::string token = "ckpt-test-token";
  const std::string dist = absl::StrCat(
      R"({"parameter_server":{"enabled":true,"mode":"async","partition_bytes":4096,)",
      R"("checkpoint":{"uri":")", root, R"(","every_seconds":0.3,"keep":3}}})");
  Proc job = Proc::Start(absl::StrCat(kBin, "/psrt-run --local=2 --token=", token, " --distribution='", dist,
                                      "' -- ", kBin, "/psrt-example-linreg ", kTrainer, " --steps=100000000"),
                         dir + "/job.log");
  ASSERT_TRUE(job.WaitForOutput("coordinator at ", absl::Seconds(30))) << job.Output();
  std::smatch m;
  const std::string out = job.Output();
  ASSERT_TRUE(std::regex_search(out, m, std::regex("coordinator at ([0-9.]+:[0-9]+)"))) << out;
  const std::string coordinator = m[1];
  ASSERT_TRUE(job.WaitForOutput("step 1000 loss", absl::Seconds(60))) << job.Output();

  Ran bad = Ckpt("save --coordinator=" + coordinator + " --token=wrong");
  EXPECT_EQ(bad.code, 1) << bad.output;
  EXPECT_TRUE(absl::StrContains(bad.output, "token")) << bad.output;

  Ran save = Ckpt("save --coordinator=" + coordinator + " --token=" + token);
  ASSERT_EQ(save.code, 0) << save.output << job.Output();
  ASSERT_TRUE(std::regex_search(save.output, m, std::regex(R"(committed (\S+) \(step ([0-9]+)\))"))) << save.output;
  const std::string uri = m[1];
  // Async: the step is the slowest worker's clock, behind rank 0's 1000 by
  // however far the scheduler let that worker fall.
  EXPECT_GT(std::stol(m[2]), 0);
  kill(job.pid, SIGTERM);
  job.Wait(absl::Seconds(30), "the stopped job");
  // every_seconds wrote more than `keep`; the oldest went.
  const std::string log = job.Output();
  int commits = 0;
  for (size_t at = 0; (at = log.find(" committed: ", at)) != std::string::npos; ++at) ++commits;
  EXPECT_GT(commits, 3) << log;
  Ran ls = Ckpt("ls " + root);
  int listed = 0;
  for (size_t at = 0; (at = ls.output.find("committed", at)) != std::string::npos; ++at) ++listed;
  EXPECT_EQ(listed, 3) << ls.output;

  Ran verify = Ckpt("verify " + uri);
  EXPECT_EQ(verify.code, 0) << verify.output;
  Ran inspect = Ckpt("inspect " + uri);
  EXPECT_TRUE(absl::StrContains(inspect.output, "async mode")) << inspect.output;

  // Restored, async training goes on from the saved clock: 300 more steps
  // end far closer to the solution than 300 steps from scratch.
  auto error_after = [&](const std::string& ps, int64_t steps) {
    Job j;
    j.steps = steps;
    j.ps = ps;
    Ran r = RunJob(j, dir);
    EXPECT_EQ(r.code, 0) << r.output;
    std::smatch e;
    EXPECT_TRUE(std::regex_search(r.output, e, std::regex("rank 0 final loss \\S+ relative error (\\S+)")))
        << r.output;
    return e.size() > 1 ? std::stod(e[1]) : 1e9;
  };
  const double resumed = error_after(absl::StrCat(R"("mode":"async","restore":")", uri, R"(")"), std::stol(m[2]) + 300);
  const double scratch = error_after(R"("mode":"async")", 300);
  EXPECT_LT(resumed, 0.5 * scratch) << "resumed " << resumed << ", from scratch " << scratch;
}

// The same through S3: moto's S3 server on loopback, the endpoint and
// credentials in the standard AWS variables as every process of a job would
// have them. The weight's shard (26 MB with Adam's slots) goes up in parts.
class S3CheckpointJobTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string why = moto_.Start();
    if (!why.empty()) GTEST_SKIP() << why;
    S3ClientOptions options;
    options.endpoint = moto_.endpoint();
    options.region = "us-east-1";
    options.credentials = AwsCredentials{"testing", "testing", ""};
    absl::StatusOr<std::unique_ptr<S3Client>> client = S3Client::Create(options);
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
    ASSERT_TRUE(client_->CreateBucket("psrt-jobs").ok());
  }
  std::string Env(const std::string& key = "testing") const {
    return absl::StrCat("AWS_ENDPOINT_URL=", moto_.endpoint(), " AWS_ACCESS_KEY_ID=", key,
                        " AWS_SECRET_ACCESS_KEY=testing AWS_REGION=us-east-1");
  }

  MotoServer moto_;
  std::unique_ptr<S3Client> client_;
};

TEST_F(S3CheckpointJobTest, RoundTripReshardAndMultipart) {
  const std::string dir = TempDir(), root = "s3://psrt-jobs/runs/a";
  Job base;
  base.hosts = 1;
  base.steps = 6;
  base.partition_bytes = 16 << 20;
  base.trainer = "--dim=2200000 --batch=2 --optimizer=adam --lr=0.01";
  base.env = Env();
  const std::string reference = Reference(base, dir);

  Job first = base;
  first.steps = 3;
  first.ps = Checkpointing(root, 0);
  Ran a = RunJob(first, dir);
  ASSERT_EQ(a.code, 0) << a.output;
  absl::StatusOr<S3ObjectInfo> head = client_->HeadObject("psrt-jobs", "runs/a/LATEST");
  ASSERT_TRUE(head.ok()) << head.status();
  absl::StatusOr<std::vector<S3ObjectInfo>> objects = client_->ListObjectsV2("psrt-jobs", "runs/a/step-000000000003/");
  ASSERT_TRUE(objects.ok()) << objects.status();
  bool multipart = false;
  for (const S3ObjectInfo& o : *objects) multipart = multipart || absl::StrContains(o.etag, "-");
  EXPECT_TRUE(multipart) << "no shard went up in parts";

  Ran verify = Ckpt("verify " + root, Env());
  EXPECT_EQ(verify.code, 0) << verify.output;

  Job rest = base;  // onto 2 servers, in 4 MiB partitions
  rest.partition_bytes = 4 << 20;
  rest.ps = absl::StrCat(R"("servers_per_host":2,"restore":"latest",)", Checkpointing(root, 0));
  rest.result = "restored";
  Ran r = RunJob(rest, dir);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(absl::StrContains(r.output, "restoring " + root + "/step-000000000003")) << r.output;
  EXPECT_EQ(Weights(dir, rest.result), reference);
}

TEST_F(S3CheckpointJobTest, BadDestinationsFailTheJobAtStart) {
  const std::string dir = TempDir();
  Job job;
  job.env = Env();
  job.ps = Checkpointing("s3://no-such-bucket/x", 0);
  Ran a = RunJob(job, dir);
  EXPECT_NE(a.code, 0);
  EXPECT_TRUE(absl::StrContains(a.output, "NoSuchBucket")) << a.output;
  EXPECT_FALSE(absl::StrContains(a.output, " loss ")) << a.output;

  job.env = absl::StrCat("AWS_ENDPOINT_URL=http://127.0.0.1:", FreePort(),
                         " AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing AWS_REGION=us-east-1");
  job.ps = Checkpointing("s3://psrt-jobs/x", 0);
  Ran b = RunJob(job, dir);
  EXPECT_NE(b.code, 0);
  EXPECT_TRUE(absl::StrContains(b.output, "cannot read checkpoint destination s3://psrt-jobs/x")) << b.output;
  EXPECT_FALSE(absl::StrContains(b.output, " loss ")) << b.output;
}

// SageMaker, ECS and EKS Pod Identity give a container no keys, only a
// credentials endpoint. Its credentials live 2 s here and rank 1 joins 3 s
// late, so every checkpoint is written after the first credentials of every
// process expired: with refreshed ones, or not at all.
TEST_F(S3CheckpointJobTest, ContainerCredentialsExpireAndAreRefreshedDuringTheJob) {
  CredentialsEndpoint endpoint(absl::Seconds(2), "Bearer job-token");
  const std::string dir = TempDir(), root = "s3://psrt-jobs/runs/refresh";
  Job job;
  job.steps = 30;
  job.trainer = absl::StrCat(kTrainer, " --late-rank=1 --late-seconds=3");
  job.ps = absl::StrCat(R"("checkpoint":{"uri":")", root, R"(","every_steps":5,"keep":0})");
  job.env = absl::StrCat(
      "-u AWS_ACCESS_KEY_ID -u AWS_SECRET_ACCESS_KEY -u AWS_SESSION_TOKEN -u AWS_PROFILE "
      "AWS_SHARED_CREDENTIALS_FILE=/nonexistent AWS_CONFIG_FILE=/nonexistent "
      "AWS_EC2_METADATA_DISABLED=true AWS_REGION=us-east-1 AWS_ENDPOINT_URL=",
      moto_.endpoint(), " AWS_CONTAINER_CREDENTIALS_FULL_URI=", endpoint.url(),
      " AWS_CONTAINER_AUTHORIZATION_TOKEN='Bearer job-token'");
  Ran r = RunJob(job, dir);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(endpoint.refused(), 0);
  EXPECT_FALSE(absl::StrContains(r.output, "checkpoint failed")) << r.output;
  EXPECT_FALSE(absl::StrContains(r.output, "refreshing AWS credentials failed")) << r.output;
  // The coordinator and both servers fetched once at start and refreshed
  // while the job ran.
  int refreshed = 0;
  for (size_t at = r.output.find("AWS credentials refreshed from container endpoint");
       at != std::string::npos;
       at = r.output.find("AWS credentials refreshed from container endpoint", at + 1)) {
    ++refreshed;
  }
  EXPECT_GE(refreshed, 3) << r.output;
  EXPECT_GE(endpoint.served(), 3 + refreshed);
  // Every checkpoint the job took landed whole (a multiple of 5 that fast
  // steps passed while the previous write ran is skipped by design): as many
  // manifests as the summary counts, the final one LATEST, all verifying
  // with psrt-ckpt, which finds its credentials the same way.
  std::smatch taken;
  ASSERT_TRUE(std::regex_search(r.output, taken, std::regex(R"((\d+) checkpoints \()"))) << r.output;
  absl::StatusOr<std::vector<S3ObjectInfo>> objects = client_->ListObjectsV2("psrt-jobs", "runs/refresh/");
  ASSERT_TRUE(objects.ok()) << objects.status();
  int manifests = 0;
  for (const S3ObjectInfo& o : *objects) manifests += absl::EndsWith(o.key, "/MANIFEST.json");
  EXPECT_EQ(manifests, std::stoi(taken[1])) << r.output;
  EXPECT_GE(manifests, 2) << r.output;
  EXPECT_EQ(client_->GetObject("psrt-jobs", "runs/refresh/LATEST").value_or(""), "step-000000000030\n");
  Ran verify = Ckpt("verify " + root, job.env);
  EXPECT_EQ(verify.code, 0) << verify.output;
  EXPECT_EQ(endpoint.refused(), 0);
}

TEST(S3CheckpointAuthTest, WrongCredentialsFailTheJobAtStart) {
  MotoServer moto;
  const std::string why = moto.Start({{"INITIAL_NO_AUTH_ACTION_COUNT", "0"}});
  if (!why.empty()) GTEST_SKIP() << why;
  Job job;
  job.env = absl::StrCat("AWS_ENDPOINT_URL=", moto.endpoint(),
                         " AWS_ACCESS_KEY_ID=AKIANOTAKEY00000000 AWS_SECRET_ACCESS_KEY=nope AWS_REGION=us-east-1");
  job.ps = Checkpointing("s3://psrt-jobs/x", 0);
  Ran a = RunJob(job, TempDir());
  EXPECT_NE(a.code, 0);
  EXPECT_TRUE(absl::StrContains(a.output, "HTTP 403")) << a.output;
  EXPECT_FALSE(absl::StrContains(a.output, " loss ")) << a.output;
}

}  // namespace
}  // namespace psrt
