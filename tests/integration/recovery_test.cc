// In-job recovery on whole jobs: psrt-run, its agents, servers and the
// example trainer as real processes on loopback, failures made with SIGKILL,
// and a seeded chaos suite over every process kind and both policies.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_util.h"
#include "server/checkpoint/catalog.h"
#include "tests/integration/job_util.h"

namespace psrt {
namespace {

// 2048 weights in keys of 4 KiB over two hosts' servers; rank 0 logs every
// 10 steps, which is what failures are timed by.
constexpr char kTrainer[] = "--dim=2048 --batch=64 --log-every=10";
constexpr int kSteps = 300;
constexpr int kEvery = 50;  // checkpoint interval, steps

std::string Distribution(const std::string& policy, const std::string& root,
                         const std::string& more = "") {
  return absl::StrCat(
      R"({"parameter_server":{"enabled":true,"heartbeat_timeout_s":2,"partition_bytes":4096,)",
      R"("on_failure":")", policy, R"(","checkpoint":{"uri":")", root, R"(","every_steps":)",
      kEvery, "}", more, "}}");
}

// `launcher_args` go to psrt-run; `trainer_args` to the trainer, after (and
// so over) the defaults.
Proc StartJob(const std::string& dist, const std::string& token, const std::string& dir,
              const std::string& trainer_args = "", const std::string& launcher_args = "") {
  return Proc::Start(
      absl::StrCat(kBin, "/psrt-run --local=2 --token=", token, " ", launcher_args,
                   " --distribution='", dist, "' -- ", kBin, "/psrt-example-linreg ", kTrainer,
                   " --steps=", kSteps, " --result=", dir, "/r ", trainer_args),
      dir + "/log");
}

// Rank 0's final weights of the same job run without any failure: one job
// per build that every case compares with.
std::string UninterruptedWeights() {
  static constexpr char kPlain[] =
      R"({"parameter_server":{"enabled":true,"partition_bytes":4096}})";
  return SharedResult(absl::StrCat("recovery_test ", kPlain, " ", kTrainer, " ", kSteps), [] {
    const std::string dir = TempDir();
    Proc run = StartJob(kPlain, RandomToken(), dir);
    const int code = run.Wait(absl::Seconds(120), "the uninterrupted job");
    EXPECT_EQ(code, 0) << run.Output();
    return code == 0 ? ReadFile(dir + "/r.rank0.weights") : std::string();
  });
}

// How long psrt-run may take to exit once both ranks printed their final
// loss: the final checkpoint (a few KiB here) and every process's exit,
// after any failure (docs/runtime.md, "Failures and job end"), with room
// for a loaded machine.
constexpr absl::Duration kPromptEnd = absl::Seconds(5);

struct Ending {
  int code = -1;
  // From both ranks' final loss to psrt-run's exit; infinite if they never
  // printed it.
  absl::Duration after_training = absl::InfiniteDuration();
};

// Waits (bounded) for psrt-run's exit, timing it from the end of training.
Ending WaitForTheEnd(Proc& run, absl::Duration timeout, const std::string& what) {
  const absl::Time deadline = absl::Now() + timeout;
  Ending e;
  absl::Time trained = absl::InfiniteFuture();
  while (absl::Now() < deadline) {
    int status = 0;
    if (waitpid(run.pid, &status, WNOHANG) == run.pid) {
      e.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      run.code = e.code;
      if (trained != absl::InfiniteFuture()) e.after_training = absl::Now() - trained;
      return e;
    }
    if (trained == absl::InfiniteFuture()) {
      const std::string out = run.Output();
      if (out.find("rank 0 final loss") != std::string::npos &&
          out.find("rank 1 final loss") != std::string::npos) {
        trained = absl::Now();
      }
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  e.code = run.Wait(absl::ZeroDuration(), what);  // kills it and says so
  return e;
}

struct Recovery {
  int64_t step = 0;  // rolled back to
  int64_t lost = 0;  // steps lost; -1: not known (the coordinator was lost)
};

std::vector<Recovery> Recoveries(const std::string& out) {
  static const std::regex re(
      "recovery [0-9]+ of at most [0-9]+: .*; rolled back to step ([0-9]+)[^;]*;( ([0-9]+) steps "
      "lost)?");
  std::vector<Recovery> r;
  for (auto it = std::sregex_iterator(out.begin(), out.end(), re); it != std::sregex_iterator();
       ++it) {
    r.push_back({std::stoll((*it)[1]), (*it)[3].matched ? std::stoll((*it)[3]) : -1});
  }
  return r;
}

enum class Kind { kServer, kWorker, kAgent, kCoordinator, kLauncher };
constexpr Kind kKinds[] = {Kind::kServer, Kind::kWorker, Kind::kAgent, Kind::kCoordinator,
                           Kind::kLauncher};

const char* KindName(Kind k) {
  switch (k) {
    case Kind::kServer:
      return "server";
    case Kind::kWorker:
      return "training process";
    case Kind::kAgent:
      return "agent";
    case Kind::kCoordinator:
      return "coordinator";
    case Kind::kLauncher:
      return "launcher";
  }
  return "?";
}

// The process of `kind` on host 1 (the coordinator is host 0's).
pid_t Victim(Kind kind, const std::string& token, const Proc& run) {
  if (kind == Kind::kLauncher) return run.pid;
  if (kind == Kind::kServer) return ServerProcess(token, 1);
  return FindJobProcess(token, [&](pid_t p) {
    const std::string cmd = CmdLine(p);
    auto has = [&](const char* s) { return cmd.find(s) != std::string::npos; };
    switch (kind) {
      case Kind::kWorker:
        return has("psrt-example-linreg") &&
               ReadFile(absl::StrCat("/proc/", p, "/environ"))
                       .find(std::string("PSRT_RANK=1\0", 12)) != std::string::npos;
      case Kind::kAgent:
        return has("psrt-worker") && has("--host-index=1");
      case Kind::kCoordinator:
        return has("psrt-coordinator");
      default:
        return false;
    }
  });
}

struct Outcome {
  std::string policy;
  Kind kind;
  int kill_step = 0;
  int code = -1;
  bool hung = false;
  absl::Duration end = absl::InfiniteDuration();  // after training
  int leftovers = 0;
  std::vector<Recovery> recoveries;
  bool same_weights = false;
  std::string output;
};

// Starts the job, SIGKILLs the process of `kind` once rank 0 logged
// `kill_step`, and waits (bounded) for the end.
Outcome KillOnce(const std::string& policy, Kind kind, int kill_step) {
  Outcome r{policy, kind, kill_step};
  const std::string dir = TempDir(), token = RandomToken();
  Proc run = StartJob(Distribution(policy, dir + "/ckpt"), token, dir);
  if (!run.WaitForOutput(absl::StrCat("step ", kill_step, " "), absl::Seconds(60))) {
    ADD_FAILURE() << "the job never reached step " << kill_step << ":\n" << run.Output();
  }
  const pid_t victim = Victim(kind, token, run);
  EXPECT_NE(victim, 0) << "no " << KindName(kind) << " to kill";
  if (victim != 0) kill(victim, SIGKILL);
  // Detection takes a heartbeat timeout (2 s) at most; a recovery restarts
  // every process and replays at most a checkpoint interval. A killed
  // launcher ends at once; then its processes must go by themselves.
  const Ending e = WaitForTheEnd(
      run, absl::Seconds(90), absl::StrCat("psrt-run after its ", KindName(kind), " was killed"));
  r.code = e.code;
  r.end = e.after_training;
  r.hung = r.code == -1;
  r.leftovers = Leftovers(token);
  r.output = run.Output();
  r.recoveries = Recoveries(r.output);
  r.same_weights = ReadFile(dir + "/r.rank0.weights") == UninterruptedWeights();
  return r;
}

TEST(RecoveryTest, AKilledServerCostsLessThanACheckpointIntervalAndNoWeightChanges) {
  const Outcome r = KillOnce("recover", Kind::kServer, 120);
  ASSERT_EQ(r.code, 0) << r.output;
  ASSERT_EQ(r.recoveries.size(), 1u) << r.output;
  EXPECT_EQ(r.recoveries[0].step, 100) << r.output;
  EXPECT_LT(r.recoveries[0].lost, kEvery) << r.output;
  EXPECT_GE(r.recoveries[0].lost, 20) << r.output;  // it was killed at step 120 or later
  EXPECT_TRUE(std::regex_search(
      r.output, std::regex("recovery 1 of at most 3: server 1 on local1 exited with code 137")))
      << r.output;
  EXPECT_TRUE(r.same_weights) << "final weights differ from the uninterrupted run's\n" << r.output;
  EXPECT_EQ(r.leftovers, 0);
}

TEST(RecoveryTest, AFailureDuringARecoveryIsRecoveredToo) {
  const std::string dir = TempDir(), token = RandomToken();
  Proc run = StartJob(Distribution("recover", dir + "/ckpt"), token, dir);
  ASSERT_TRUE(run.WaitForOutput("step 120 ", absl::Seconds(60))) << run.Output();
  kill(Victim(Kind::kServer, token, run), SIGKILL);
  // The next generation's server 1, killed as soon as it starts.
  ASSERT_TRUE(run.WaitForOutput("the job is recovering (generation 2)", absl::Seconds(30)))
      << run.Output();
  pid_t second = 0;
  for (absl::Time end = absl::Now() + absl::Seconds(10); second == 0 && absl::Now() < end;
       absl::SleepFor(absl::Milliseconds(5))) {
    second = FindJobProcess(token, [](pid_t p) {
      const std::string cmd = CmdLine(p);
      return cmd.find("psrt-server") != std::string::npos &&
             cmd.find("--index=1") != std::string::npos &&
             cmd.find("--generation=2") != std::string::npos;
    });
  }
  ASSERT_NE(second, 0) << run.Output();
  kill(second, SIGKILL);
  ASSERT_EQ(run.Wait(absl::Seconds(90), "psrt-run"), 0) << run.Output();
  const std::vector<Recovery> r = Recoveries(run.Output());
  ASSERT_EQ(r.size(), 2u) << run.Output();
  EXPECT_EQ(r[1].step, r[0].step) << run.Output();  // nothing was checkpointed in between
  EXPECT_TRUE(ReadFile(dir + "/r.rank0.weights") == UninterruptedWeights())
      << "final weights differ";
  EXPECT_EQ(Leftovers(token), 0);
}

TEST(RecoveryTest, AKilledCoordinatorIsRestartedAndGoesOnFromTheJobRecord) {
  const Outcome r = KillOnce("recover", Kind::kCoordinator, 120);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("starting psrt-coordinator again (1 of at most 3)"), std::string::npos)
      << r.output;
  ASSERT_EQ(r.recoveries.size(), 1u) << r.output;
  EXPECT_EQ(r.recoveries[0].step, 100) << r.output;
  EXPECT_TRUE(
      std::regex_search(r.output, std::regex("registered agent on local1 by its heartbeat")))
      << r.output;
  EXPECT_TRUE(r.same_weights) << "final weights differ from the uninterrupted run's\n" << r.output;
  EXPECT_EQ(r.leftovers, 0);
}

TEST(RecoveryTest, AFailureWithNoRecoveryLeftEndsTheJobNamingTheLimit) {
  const std::string dir = TempDir(), token = RandomToken();
  Proc run = StartJob(Distribution("recover", dir + "/ckpt", R"(,"max_recoveries":0)"), token, dir,
                      "--exit-at-step=30 --exit-rank=1");
  EXPECT_EQ(run.Wait(absl::Seconds(60), "psrt-run"), 1);
  const std::string out = run.Output();
  EXPECT_TRUE(std::regex_search(out, std::regex("job failed: worker 1 on local1 exited with code "
                                                "3.*; no recovery left \\(max_recoveries is 0\\)")))
      << out;
  EXPECT_TRUE(Recoveries(out).empty()) << out;
  EXPECT_EQ(Leftovers(token), 0);
}

TEST(RecoveryTest, ATrainingProcessThatFailsIsRolledBackWithEveryOther) {
  const std::string dir = TempDir(), token = RandomToken();
  Proc run = StartJob(Distribution("recover", dir + "/ckpt"), token, dir,
                      "--exit-at-step=130 --exit-rank=1");
  ASSERT_EQ(run.Wait(absl::Seconds(90), "psrt-run"), 0) << run.Output();
  const std::vector<Recovery> r = Recoveries(run.Output());
  ASSERT_EQ(r.size(), 1u) << run.Output();
  EXPECT_EQ(r[0].step, 100);
  EXPECT_TRUE(ReadFile(dir + "/r.rank0.weights") == UninterruptedWeights())
      << "final weights differ";
  EXPECT_EQ(Leftovers(token), 0);
}

// "replicas": 1 on two hosts: each server backs up the other's keys.
std::string ReplicaDistribution(const std::string& more = "") {
  return absl::StrCat(
      R"({"parameter_server":{"enabled":true,"heartbeat_timeout_s":2,"partition_bytes":4096,)",
      R"("replicas":1)", more, "}}");
}

// The seed of the randomized runs: PSRT_CHAOS_SEED, default 1.
unsigned ChaosSeed() {
  const char* seed = std::getenv("PSRT_CHAOS_SEED");
  return seed ? static_cast<unsigned>(std::atoi(seed)) : 1;
}

// How many randomized runs a test makes: the environment variable `name`,
// else `runs`.
int Runs(const char* name, int runs) {
  const char* set = std::getenv(name);
  return set ? std::atoi(set) : runs;
}

// Waits for rank 0 to log `step`, SIGKILLs server `index` and waits
// (bounded) for the end; code -1 if the job never got to the step.
Ending KillServerAt(Proc& run, const std::string& token, int index, int step) {
  if (!run.WaitForOutput(absl::StrCat("step ", step, " "), absl::Seconds(60))) {
    ADD_FAILURE() << "the job never reached step " << step << ":\n" << run.Output();
    return {};
  }
  const pid_t victim = ServerProcess(token, index);
  if (victim == 0) {
    ADD_FAILURE() << "no server " << index << " to kill:\n" << run.Output();
    return {};
  }
  kill(victim, SIGKILL);
  return WaitForTheEnd(run, absl::Seconds(90), "psrt-run after a server was killed");
}

// Seeded (PSRT_CHAOS_SEED) and bounded (PSRT_REPLICA_RUNS, default 8).
// Stratified: run i kills server i % 2 at a random step (a multiple of 10)
// of the i-th of `runs` equal parts of steps 10-250, so any number of runs
// from 2 on kills each server, and early and late, and the runs together
// span the whole range (seed 1's 20 draws of both at random killed
// server 1 in 6 runs only, and neither before step 40).
TEST(ReplicaTest, KillingAnyServerAtAnyMomentLosesNoStep) {
  std::mt19937 rng(ChaosSeed());
  const int runs = Runs("PSRT_REPLICA_RUNS", 8);
  ASSERT_GT(runs, 0) << "PSRT_REPLICA_RUNS must be > 0";
  int same = 0;
  for (int i = 0; i < runs; ++i) {
    const int server = i % 2;
    // Part i of the 25 kill steps: [25 i / runs, 25 (i + 1) / runs), at least one.
    const int first = 25 * i / runs, last = std::max(first, 25 * (i + 1) / runs - 1);
    const int kill_step = 10 * (1 + std::uniform_int_distribution<int>(first, last)(rng));
    const std::string dir = TempDir(), token = RandomToken();
    Proc run = StartJob(ReplicaDistribution(), token, dir);
    const Ending end = KillServerAt(run, token, server, kill_step);
    const int code = end.code;
    const std::string out = run.Output();
    const bool equal = ReadFile(dir + "/r.rank0.weights") == UninterruptedWeights();
    same += code == 0 && equal;
    std::printf(
        "replica run %d: server %d killed at step %3d: exit %d, %s, ended %s after training\n", i,
        server, kill_step, code, equal ? "weights as uninterrupted" : "WEIGHTS DIFFER",
        absl::FormatDuration(end.after_training).c_str());
    EXPECT_EQ(code, 0) << out;
    EXPECT_LT(end.after_training, kPromptEnd) << out;
    EXPECT_TRUE(std::regex_search(
        out, std::regex(absl::StrCat("server ", server, " on local", server, " .*; server ",
                                     1 - server, " serves server ", server,
                                     "'s keys from their replicas, no step lost"))))
        << out;
    EXPECT_TRUE(Recoveries(out).empty()) << out;
    EXPECT_TRUE(equal) << "final weights differ from the uninterrupted run's\n" << out;
    EXPECT_EQ(Leftovers(token), 0);
  }
  std::printf(
      "replicas: %d of %d runs with a server killed ended with the uninterrupted run's weights\n",
      same, runs);
}

TEST(ReplicaTest, ALostServerComesBackAsTheNewBackupAndCanTakeOverInTurn) {
  // Server 1 is killed: server 0 serves its keys; server 1's agent starts
  // it again and server 0 copies every key to it in the background. Then
  // server 0 is killed: server 1 serves everything from those copies.
  const std::string dir = TempDir(), token = RandomToken();
  Proc run = StartJob(ReplicaDistribution(), token, dir);
  ASSERT_TRUE(run.WaitForOutput("step 30 ", absl::Seconds(60))) << run.Output();
  kill(ServerProcess(token, 1), SIGKILL);
  // Both servers' keys (served by server 0 now) are copied, one owner at a time.
  auto copies = [&] {
    const std::string out = run.Output();
    int n = 0;
    for (size_t at = out.find("keys to their new backup"); at != std::string::npos;
         at = out.find("keys to their new backup", at + 1)) {
      ++n;
    }
    return n;
  };
  for (absl::Time end = absl::Now() + absl::Seconds(30); copies() < 2 && absl::Now() < end;) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_EQ(copies(), 2) << run.Output();
  // A failover takes copies the coordinator heard are built.
  ASSERT_TRUE(run.WaitForOutput("server 1 holds a copy of server 0's keys", absl::Seconds(10)));
  ASSERT_TRUE(run.WaitForOutput("server 1 holds a copy of server 1's keys", absl::Seconds(10)));
  kill(ServerProcess(token, 0), SIGKILL);
  ASSERT_EQ(run.Wait(absl::Seconds(90), "psrt-run"), 0) << run.Output();
  const std::string out = run.Output();
  EXPECT_TRUE(std::regex_search(
      out, std::regex("server 1 on local1 is back at .*: it keeps the copies of the keys of "
                      "servers 0, 1 from now on")))
      << out;
  EXPECT_TRUE(std::regex_search(
      out, std::regex("server 0 on local0 .*; server 1 serves server 0's keys, server 1 "
                      "serves server 1's keys from their replicas, no step lost")))
      << out;
  EXPECT_TRUE(Recoveries(out).empty()) << out;
  EXPECT_TRUE(ReadFile(dir + "/r.rank0.weights") == UninterruptedWeights())
      << "final weights differ\n"
      << out;
  EXPECT_EQ(Leftovers(token), 0);
}

// Replicas, recovery and checkpoints together (the slowest ends seen): a
// server killed at a random step fails over, comes back as the copy holder,
// and the job still ends within kPromptEnd of its training, with its final
// checkpoint at the last step. Seeded (PSRT_CHAOS_SEED), PSRT_END_RUNS runs
// (default 4).
TEST(ReplicaTest, AFailedOverJobWithCheckpointsEndsPromptly) {
  std::mt19937 rng(ChaosSeed());
  const int runs = Runs("PSRT_END_RUNS", 4);
  ASSERT_GT(runs, 0) << "PSRT_END_RUNS must be > 0";
  for (int i = 0; i < runs; ++i) {
    const int server = std::uniform_int_distribution<int>(0, 1)(rng);
    const int kill_step = 10 * std::uniform_int_distribution<int>(2, 28)(rng);
    const std::string dir = TempDir(), token = RandomToken();
    Proc run = StartJob(
        ReplicaDistribution(absl::StrCat(R"(,"on_failure":"recover","checkpoint":{"uri":")", dir,
                                         R"(/ckpt","every_steps":20})")),
        token, dir);
    const Ending end = KillServerAt(run, token, server, kill_step);
    const std::string out = run.Output();
    std::printf("run %d: server %d killed at step %3d: exit %d, ended %s after training\n", i,
                server, kill_step, end.code, absl::FormatDuration(end.after_training).c_str());
    EXPECT_EQ(end.code, 0) << out;
    EXPECT_LT(end.after_training, kPromptEnd) << out;
    EXPECT_NE(out.find("no step lost (failover)"), std::string::npos) << out;
    absl::StatusOr<CheckpointRef> final = ResolveCheckpoint("latest", dir + "/ckpt");
    ASSERT_TRUE(final.ok()) << final.status();
    EXPECT_EQ(final->manifest.step(), kSteps);
    EXPECT_EQ(Leftovers(token), 0);
  }
}

// Updates reach the copies over the data channel, or by gRPC where the
// job's "transport" is "grpc" (as under mutual TLS): same outcome.
class ReplicaTransportTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ReplicaTransportTest, AsyncLosesNoPushAndAppliesNoneTwice) {
  // Every push of both workers is applied exactly once: each key's final
  // version, in the checkpoint written at the end, counts them.
  const std::string dir = TempDir(), token = RandomToken();
  Proc run =
      StartJob(ReplicaDistribution(absl::StrCat(R"(,"mode":"async","transport":")", GetParam(),
                                                R"(","checkpoint":{"uri":")", dir, R"(/ckpt"})")),
               token, dir);
  ASSERT_TRUE(run.WaitForOutput("step 120 ", absl::Seconds(60))) << run.Output();
  kill(ServerProcess(token, 1), SIGKILL);
  ASSERT_EQ(run.Wait(absl::Seconds(90), "psrt-run"), 0) << run.Output();
  const std::string out = run.Output();
  EXPECT_NE(out.find("no step lost (failover)"), std::string::npos) << out;
  // Both servers forwarded their updates the way the transport says.
  for (int at : {0, 1}) {
    const bool channel = out.find(absl::StrCat("updates to the copies on server ", at,
                                               " go over its data channel")) != std::string::npos;
    EXPECT_EQ(channel, GetParam() != "grpc") << at << "\n" << out;
  }
  absl::StatusOr<CheckpointRef> final = ResolveCheckpoint("latest", dir + "/ckpt");
  ASSERT_TRUE(final.ok()) << final.status();
  ASSERT_GT(final->manifest.keys_size(), 0);
  for (const v1::ManifestKey& k : final->manifest.keys()) {
    EXPECT_EQ(k.version(), 2 * kSteps) << k.variable() << "#" << k.partition();
  }
  EXPECT_EQ(Leftovers(token), 0);
}

INSTANTIATE_TEST_SUITE_P(Transports, ReplicaTransportTest, ::testing::Values("tcp", "grpc"),
                         [](const ::testing::TestParamInfo<std::string>& p) { return p.param; });

TEST(ReplicaTest, ABackupNeedsAnotherServer) {
  const std::string dir = TempDir();
  Proc run = Proc::Start(absl::StrCat(kBin, "/psrt-run --local=1 --distribution='",
                                      ReplicaDistribution(), "' -- ", kBin, "/psrt-example-linreg"),
                         dir + "/log");
  EXPECT_NE(run.Wait(absl::Seconds(30), "psrt-run"), 0);
  EXPECT_NE(run.Output().find(
                "'replicas' is 1 but the job has 1 server; a key's backup lives on another server"),
            std::string::npos)
      << run.Output();
}

// Elastic: 4 worker slots on 2 hosts; the job starts with 3, the 4th joins
// a second later, and one leaves (exits 3) near the end.
std::string ElasticJob(int min_workers, const std::string& dir, const std::string& token,
                       int exit_at_step = 1200) {
  return absl::StrCat(
      kBin, "/psrt-run --local=2 --token=", token,
      R"( --distribution='{"parameter_server":{"enabled":true,"workers_per_host":2,)",
      R"("partition_bytes":4096,"elastic":{"min_workers":)", min_workers,
      R"(,"max_workers":4}}}' -- )", kBin, "/psrt-example-linreg ", kTrainer,
      " --steps=1500 --late-rank=3 --late-seconds=1 --exit-at-step=", exit_at_step,
      " --exit-rank=1 --result=", dir, "/r");
}

TEST(ElasticTest, WorkersJoinAndLeaveARunningSyncJob) {
  const std::string dir = TempDir(), token = RandomToken();
  Proc run = Proc::Start(ElasticJob(3, dir, token), dir + "/log");
  ASSERT_EQ(run.Wait(absl::Seconds(120), "psrt-run"), 0) << run.Output();
  const std::string out = run.Output();
  EXPECT_TRUE(
      std::regex_search(out, std::regex("starting with 3 of 4 workers \\(elastic.min_workers 3")))
      << out;
  EXPECT_TRUE(std::regex_search(out, std::regex("worker 3 on local1 joined the job"))) << out;
  EXPECT_TRUE(std::regex_search(
      out, std::regex("worker 1 on local0 exited with code 3.*; continuing with 3 workers")))
      << out;
  // Every finishing rank converged, the late one included.
  for (int rank : {0, 2, 3}) {
    const std::string r = ReadFile(absl::StrCat(dir, "/r.rank", rank, ".json"));
    std::smatch m;
    ASSERT_TRUE(std::regex_search(r, m, std::regex("\"relative_error\": ([-0-9.eE+]+)")))
        << rank << ": " << r;
    EXPECT_LT(std::stod(m[1]), 1e-3) << r;
  }
  EXPECT_EQ(Leftovers(token), 0);
}

TEST(ElasticTest, FewerThanMinWorkersEndsTheJobSayingSo) {
  const std::string dir = TempDir(), token = RandomToken();
  // Every worker is in from the start (min_workers 4), so the exit need not
  // wait for a join.
  Proc run = Proc::Start(ElasticJob(4, dir, token, /*exit_at_step=*/100), dir + "/log");
  EXPECT_EQ(run.Wait(absl::Seconds(120), "psrt-run"), 1);
  const std::string out = run.Output();
  EXPECT_TRUE(std::regex_search(
      out, std::regex("job failed: worker 1 on local0 exited with code 3.*; 3 workers are "
                      "left, fewer than elastic.min_workers \\(4\\)")))
      << out;
  EXPECT_EQ(Leftovers(token), 0);
}

// Seeded and bounded: PSRT_CHAOS_SEED (default 1) and PSRT_CHAOS_RUNS
// (default 10: each process kind under both policies) choose the runs; every
// run SIGKILLs one process at a random step. Prints one line per run and the
// totals.
TEST(ChaosTest, SigkillAnyProcessAtRandomNeverHangsNorLeavesProcesses) {
  const unsigned seed = ChaosSeed();
  const int runs = Runs("PSRT_CHAOS_RUNS", 10);
  ASSERT_GT(runs, 0) << "PSRT_CHAOS_RUNS must be > 0";
  std::mt19937 rng(seed);
  int hangs = 0, leftovers = 0, recovered = 0, recover_runs = 0;
  std::vector<int64_t> lost;
  std::printf("chaos seed %u, %d runs\n", seed, runs);
  for (int i = 0; i < runs; ++i) {
    const std::string policy = i % 2 == 0 ? "recover" : "fail";
    const Kind kind = kKinds[(i / 2) % 5];
    const int kill_step = 10 * std::uniform_int_distribution<int>(1, 25)(rng);
    const Outcome r = KillOnce(policy, kind, kill_step);
    hangs += r.hung;
    leftovers += r.leftovers;
    for (const Recovery& x : r.recoveries) {
      if (x.lost >= 0) lost.push_back(x.lost);
    }
    std::printf(
        "run %d: %-7s %-16s killed at step %3d: exit %d%s, %d left behind, %zu recoveries%s, ended "
        "%s "
        "after training\n",
        i, policy.c_str(), KindName(kind), kill_step, r.code, r.hung ? " (hung)" : "", r.leftovers,
        r.recoveries.size(),
        r.code == 0 ? (r.same_weights ? ", weights as uninterrupted" : ", WEIGHTS DIFFER") : "",
        absl::FormatDuration(r.end).c_str());
    EXPECT_FALSE(r.hung) << r.output;
    if (r.code == 0) EXPECT_LT(r.end, kPromptEnd) << r.output;
    EXPECT_EQ(r.leftovers, 0) << r.output;
    const bool survivable = kind != Kind::kLauncher;
    if (policy == "recover" && survivable) {
      ++recover_runs;
      EXPECT_EQ(r.code, 0) << r.output;
      EXPECT_GE(r.recoveries.size(), 1u) << r.output;
      EXPECT_TRUE(r.same_weights) << "final weights differ from the uninterrupted run's\n"
                                  << r.output;
      for (const Recovery& x : r.recoveries) EXPECT_LT(x.lost, 2 * kEvery) << r.output;
      recovered += r.code == 0 && r.same_weights;
    } else if (kind != Kind::kLauncher) {
      // Under "fail": the job ends, with the reason, and without a recovery.
      EXPECT_NE(r.code, 0) << r.output;
      EXPECT_NE(r.output.find("job failed"), std::string::npos) << r.output;
      EXPECT_TRUE(r.recoveries.empty()) << r.output;
    }
  }
  std::string lost_text;
  for (int64_t l : lost) absl::StrAppend(&lost_text, lost_text.empty() ? "" : " ", l);
  std::printf(
      "chaos: %d runs, %d hangs, %d processes left behind, %d of %d survivable failures recovered "
      "and finished with the uninterrupted run's weights; steps lost per recovery: %s\n",
      runs, hangs, leftovers, recovered, recover_runs, lost_text.c_str());
}

// The lines of psrt-run's own log (not its processes') after "job failed".
std::string ClosingList(const std::string& out) {
  const size_t at = out.find("psrt-run E job failed: ");
  return at == std::string::npos ? "" : out.substr(at);
}

// A process's pid is gone, or a zombie (its parent has not reaped it yet).
bool Ended(pid_t pid) {
  const std::string stat = ReadFile(absl::StrCat("/proc/", pid, "/stat"));
  return stat.empty() || stat.find(") Z") != std::string::npos;
}

// SIGTERM to psrt-run (a SageMaker or spot stop), or Ctrl-C at its terminal
// (SIGINT to its whole process group): the job writes a final checkpoint
// within --stop-grace, then every process exits by itself; nothing is
// recovered.
TEST(StopTest, ASignalToTheLauncherWritesAFinalCheckpointAndEveryProcessExitsByItself) {
  for (const bool ctrl_c : {false, true}) {
    const std::string dir = TempDir(), token = RandomToken();
    // No periodic checkpoint: the final one is the only one.
    const std::string dist = absl::StrCat(
        R"({"parameter_server":{"enabled":true,"heartbeat_timeout_s":2,"partition_bytes":4096,)",
        R"("on_failure":"recover","checkpoint":{"uri":")", dir, R"(/ckpt"}}})");
    // setsid: psrt-run leads a process group, as in a terminal.
    Proc run = Proc::Start(
        absl::StrCat("setsid ", kBin, "/psrt-run --local=2 --stop-grace=10 --token=", token,
                     " --distribution='", dist, "' -- ", kBin, "/psrt-example-linreg ", kTrainer,
                     " --steps=100000000"),
        dir + "/log");
    ASSERT_TRUE(run.WaitForOutput("step 50 ", absl::Seconds(60))) << run.Output();
    const absl::Time sent = absl::Now();
    kill(ctrl_c ? -run.pid : run.pid, ctrl_c ? SIGINT : SIGTERM);
    EXPECT_EQ(run.Wait(absl::Seconds(30), "psrt-run after a signal"), 1);
    const absl::Duration took = absl::Now() - sent;
    const std::string out = run.Output();
    EXPECT_LT(took, absl::Seconds(10)) << out;
    absl::StatusOr<CheckpointRef> final = ResolveCheckpoint("latest", dir + "/ckpt");
    ASSERT_TRUE(final.ok()) << final.status() << "\n" << out;
    EXPECT_GE(final->manifest.step(), 50);
    EXPECT_TRUE(std::regex_search(
        ClosingList(out),
        std::regex(absl::StrCat("job failed: the coordinator got signal ", ctrl_c ? 2 : 15,
                                " .*; final checkpoint file://.*/step-0*", final->manifest.step(),
                                " \\(step ", final->manifest.step(), "\\)"))))
        << out;
    // Every daemon stopped by itself: none needed a signal from psrt-run, and
    // none was started again. (A training process that has not exited two
    // heartbeat intervals after the job's end, as on a loaded machine, is
    // stopped by its agent: that is the agents' rule, not a failure here.)
    EXPECT_EQ(out.find("stopping them"), std::string::npos) << out;
    EXPECT_EQ(out.find("starting psrt-"), std::string::npos) << out;
    EXPECT_TRUE(Recoveries(out).empty()) << out;
    EXPECT_EQ(Leftovers(token), 0);
    std::printf("%s: final checkpoint at step %lld; psrt-run exited %s after the signal\n",
                ctrl_c ? "Ctrl-C" : "SIGTERM", static_cast<long long>(final->manifest.step()),
                absl::FormatDuration(took).c_str());
  }
}

// A coordinator stopped while a host hangs (its agent and server stopped
// with SIGSTOP, as a frozen machine) in an async job with training
// processes attached: the final checkpoint cannot be written, and the
// coordinator still exits by itself within its grace.
TEST(StopTest, TheCoordinatorStopsWithinItsGraceWhileAHostHangs) {
  const std::string dir = TempDir(), token = RandomToken();
  const std::string dist = absl::StrCat(
      R"({"parameter_server":{"enabled":true,"mode":"async","heartbeat_timeout_s":2,)",
      R"("partition_bytes":4096,"checkpoint":{"uri":")", dir, R"(/ckpt","every_steps":20}}})");
  Proc run = StartJob(dist, token, dir, "--steps=100000000", "--stop-grace=1");
  ASSERT_TRUE(run.WaitForOutput("step 50 ", absl::Seconds(60))) << run.Output();
  const pid_t server = ServerProcess(token, 1);
  const pid_t agent = Victim(Kind::kAgent, token, run);
  const pid_t coordinator = Victim(Kind::kCoordinator, token, run);
  ASSERT_NE(server, 0);
  ASSERT_NE(agent, 0);
  ASSERT_NE(coordinator, 0);
  kill(agent, SIGSTOP);
  kill(server, SIGSTOP);
  absl::SleepFor(absl::Milliseconds(300));  // the coordinator's calls reach it
  const absl::Time sent = absl::Now();
  kill(coordinator, SIGTERM);
  while (!Ended(coordinator) && absl::Now() - sent < absl::Seconds(60)) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  const absl::Duration took = absl::Now() - sent;
  kill(server, SIGCONT);
  kill(agent, SIGCONT);
  // --stop-grace (1 s), the others' notice of the end (at most the
  // heartbeat timeout, 2 s), and a margin.
  EXPECT_LT(took, absl::Seconds(7)) << run.Output();
  EXPECT_EQ(run.Wait(absl::Seconds(30), "psrt-run"), 1);
  const std::string out = run.Output();
  EXPECT_TRUE(std::regex_search(out, std::regex("psrt-run E +psrt-coordinator exited with code 1")))
      << out;
  // The hung host's silence may end the job first (after the 2 s heartbeat
  // timeout); either way the coordinator exits by itself.
  EXPECT_TRUE(std::regex_search(
      out, std::regex("job failed: (the coordinator got signal 15 .*; no final checkpoint: not "
                      "written within 1s|agent on local1 was lost)")))
      << out;
  EXPECT_EQ(Leftovers(token), 0);
  std::printf("the coordinator exited %s after SIGTERM\n", absl::FormatDuration(took).c_str());
}

// Under "fail", a server killed: the checkpoints stop with the job (none is
// armed for a step the job never reaches), and psrt-run's closing list names
// the server with how it ended.
TEST(RecoveryTest, AFailedJobArmsNoCheckpointAndItsClosingListNamesTheKilledServer) {
  const std::string dir = TempDir(), token = RandomToken();
  const std::string dist = absl::StrCat(
      R"({"parameter_server":{"enabled":true,"heartbeat_timeout_s":2,"partition_bytes":4096,)",
      R"("checkpoint":{"uri":")", dir, R"(/ckpt","every_steps":20}}})");
  Proc run = StartJob(dist, token, dir);
  ASSERT_TRUE(run.WaitForOutput("step 30 ", absl::Seconds(60))) << run.Output();
  kill(ServerProcess(token, 1), SIGKILL);
  EXPECT_EQ(run.Wait(absl::Seconds(30), "psrt-run"), 1);
  const std::string out = run.Output();
  const size_t failed = out.find("psrt-coordinator E job failed: ");
  ASSERT_NE(failed, std::string::npos) << out;
  EXPECT_EQ(out.find("psrt-coordinator W checkpoint at step", failed), std::string::npos) << out;
  static const std::regex armed("checkpoint at step ([0-9]+) failed");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), armed); it != std::sregex_iterator();
       ++it) {
    EXPECT_LE(std::stoll((*it)[1]), 80) << out;  // killed at step 30 or a little later
  }
  EXPECT_TRUE(std::regex_search(
      ClosingList(out),
      std::regex("job failed: server 1 on local1 exited with code 137: killed by signal 9")))
      << out;
  EXPECT_TRUE(std::regex_search(
      ClosingList(out),
      std::regex("psrt-run E +server 1 on local1 killed by signal 9 \\(Killed\\)")))
      << out;
  EXPECT_EQ(Leftovers(token), 0);
}

// The process that died is the one named: an agent as the agent (not the
// server it took along), the coordinator as the coordinator; in the
// recovery line, the job's reason and psrt-run's closing list.
TEST(RecoveryTest, TheProcessThatDiedIsTheOneNamed) {
  struct Case {
    std::string policy;
    Kind kind;
    int signal;
    std::string expected;  // in psrt-run's output
  };
  const Case cases[] = {
      {"recover", Kind::kAgent, SIGKILL,
       "recovery 1 of at most 3: agent on local1 exited with code 137: killed by signal 9 "
       "\\(Killed\\); rolled back to step"},
      {"fail", Kind::kAgent, SIGKILL,
       "psrt-run E job failed: agent on local1 exited with code 137: killed by signal 9 "
       "\\(Killed\\)\n(.*\n)*.*psrt-run E +psrt-worker\\[1\\] killed by signal 9"},
      {"fail", Kind::kAgent, SIGTERM,
       "psrt-run E job failed: agent on local1 exited with code 1: stopped by signal 15 "
       "\\(Terminated\\)"},
      {"fail", Kind::kCoordinator, SIGKILL,
       "psrt-run E job failed: psrt-coordinator killed by signal 9 \\(Killed\\)\n(.*\n)*.*"
       "psrt-run E +psrt-coordinator killed by signal 9"},
  };
  for (const Case& c : cases) {
    const std::string dir = TempDir(), token = RandomToken();
    const int kill_step = c.policy == "recover" ? 120 : 30;
    Proc run = StartJob(Distribution(c.policy, dir + "/ckpt"), token, dir);
    ASSERT_TRUE(run.WaitForOutput(absl::StrCat("step ", kill_step, " "), absl::Seconds(60)))
        << run.Output();
    const pid_t victim = Victim(c.kind, token, run);
    ASSERT_NE(victim, 0) << run.Output();
    kill(victim, c.signal);
    EXPECT_EQ(run.Wait(absl::Seconds(60), "psrt-run"), c.policy == "recover" ? 0 : 1)
        << run.Output();
    const std::string out = run.Output();
    EXPECT_TRUE(std::regex_search(out, std::regex(c.expected))) << c.expected << "\n" << out;
    EXPECT_FALSE(std::regex_search(
        out, std::regex("(job failed|recovery [0-9]+ of at most [0-9]+): server 1 on local1")))
        << out;
    EXPECT_EQ(Leftovers(token), 0);
  }
}

// Async and ssp recover too, and count the steps lost in the workers'
// steps, as their checkpoints do (a key's version counts both workers'
// pushes).
TEST(RecoveryTest, AsyncAndSspRecoverAndCountStepsLostInSteps) {
  for (const std::string mode : {"async", "ssp"}) {
    const std::string dir = TempDir(), token = RandomToken();
    Proc run = StartJob(Distribution("recover", dir + "/ckpt",
                                     absl::StrCat(R"(,"mode":")", mode, R"(")",
                                                  mode == "ssp" ? R"(,"staleness":2)" : "")),
                        token, dir);
    ASSERT_TRUE(run.WaitForOutput("step 120 ", absl::Seconds(60))) << run.Output();
    kill(ServerProcess(token, 1), SIGKILL);
    ASSERT_EQ(run.Wait(absl::Seconds(60), "psrt-run"), 0) << mode << "\n" << run.Output();
    const std::string out = run.Output();
    const std::vector<Recovery> r = Recoveries(out);
    ASSERT_EQ(r.size(), 1u) << out;
    // The newest checkpoint before the kill: at least every worker's step
    // 50, at most rank 0's logged step.
    EXPECT_GE(r[0].step, kEvery) << out;
    EXPECT_LE(r[0].step, 120 + 10) << out;
    EXPECT_GE(r[0].lost, 0) << out;
    EXPECT_LT(r[0].lost, 2 * kEvery) << out;
    EXPECT_NE(out.find("job succeeded"), std::string::npos) << out;
    EXPECT_EQ(Leftovers(token), 0);
    std::printf("%s: rolled back to step %lld, %lld steps lost\n", mode.c_str(),
                static_cast<long long>(r[0].step), static_cast<long long>(r[0].lost));
  }
}

}  // namespace
}  // namespace psrt
