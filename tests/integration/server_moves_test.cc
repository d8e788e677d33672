// Servers joining and leaving a running job ("max_servers"): psrt-run, its
// agents, servers and the example trainer as real processes on loopback, a
// server started by hand to join, psrt-ckpt remove-server to let one go.
#include <gtest/gtest.h>
#include <signal.h>

#include <regex>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_util.h"
#include "server/checkpoint/catalog.h"
#include "tests/integration/job_util.h"

namespace psrt {
namespace {

// 8192 weights in keys of 4 KiB (9 keys with the bias) on two hosts'
// servers; steps long enough for a join and a removal in the middle (a join
// and its move take about 15 steps, a removal fewer: 200 steps apart and
// before the end).
constexpr int kSteps = 600;
constexpr char kTrainer[] = "--dim=8192 --batch=64 --lr=0.02 --log-every=50";

std::string Distribution(const std::string& more) {
  return absl::StrCat(
      R"({"parameter_server":{"enabled":true,"heartbeat_timeout_s":2,"partition_bytes":4096)", more,
      "}}");
}

// The trainer's flags beyond kTrainer: none, or a sparse table's.
constexpr char kWithTable[] = " --table-rows=512";

// "max_servers": 3 and "on_failure": "recover", with checkpoints every 100
// steps under `dir`.
std::string RecoveringJob(const std::string& dir) {
  return Distribution(absl::StrCat(R"(,"max_servers":3,"on_failure":"recover",)",
                                   R"("checkpoint":{"uri":")", dir, R"(/ckpt","every_steps":100})"));
}

Proc StartJob(const std::string& dist, const std::string& token, const std::string& dir,
              int steps = kSteps, const std::string& trainer = "") {
  return Proc::Start(absl::StrCat(kBin, "/psrt-run --local=2 --token=", token, " --distribution='",
                                  dist, "' -- ", kBin, "/psrt-example-linreg ", kTrainer, trainer,
                                  " --steps=", steps, " --result=", dir, "/r"),
                     dir + "/log");
}

// Rank 0's final weights (and table rows) of the same training with the
// servers it starts with, none joining or leaving: one job per build that
// every case compares with.
std::string UninterruptedWeights(const std::string& trainer = "") {
  return SharedResult(
      absl::StrCat("server_moves_test ", Distribution(""), " ", kTrainer, trainer, " ", kSteps),
      [&] {
        const std::string dir = TempDir();
        Proc run = StartJob(Distribution(""), RandomToken(), dir, kSteps, trainer);
        const int code = run.Wait(absl::Seconds(120), "the uninterrupted job");
        EXPECT_EQ(code, 0) << run.Output();
        return code == 0 ? ReadFile(dir + "/r.rank0.weights") : std::string();
      });
}

// Rank 0's final weights in `dir` are the uninterrupted run's; `out`: the
// job's output, said otherwise.
void ExpectUninterrupted(const std::string& dir, const std::string& out) {
  EXPECT_TRUE(ReadFile(dir + "/r.rank0.weights") == UninterruptedWeights())
      << "final weights differ from the uninterrupted run's\n"
      << out;
}

std::string CoordinatorAddress(const Proc& run) {
  EXPECT_TRUE(run.WaitForOutput("coordinator at ", absl::Seconds(30))) << run.Output();
  std::smatch m;
  const std::string out = run.Output();
  if (!std::regex_search(out, m, std::regex("coordinator at ([0-9.]+:[0-9]+)"))) return "";
  return m[1];
}

// A server started by hand to join the job as server `index`.
Proc JoinServer(const std::string& coordinator, const std::string& token, int index,
                const std::string& dir) {
  return Proc::Start(absl::StrCat(kBin, "/psrt-server --coordinator=", coordinator,
                                  " --index=", index, " --host=127.0.0.1 --token=", token),
                     absl::StrCat(dir, "/server", index, ".log"));
}

// psrt-ckpt remove-server; its exit code, its output in *out.
int RemoveServer(const std::string& coordinator, const std::string& token, int index,
                 const std::string& dir, std::string* out) {
  Proc p = Proc::Start(absl::StrCat(kBin, "/psrt-ckpt remove-server --coordinator=", coordinator,
                                    " --token=", token, " --index=", index, " --timeout=60"),
                       absl::StrCat(dir, "/remove", index, ".log"));
  const int code = p.Wait(absl::Seconds(90), "psrt-ckpt remove-server");
  *out = p.Output();
  return code;
}

// Waits until the coordinator's log says that `to` serves `owner`'s keys.
bool WaitMoved(const Proc& run, int owner, int to) {
  return run.WaitForOutput(absl::StrCat("server ", to, " serves server ", owner, "'s keys (moved"),
                           absl::Seconds(60));
}

// At step 200 of `run`, server 2 joins (started by hand as *joined); returns
// once its keys moved to it. *coordinator: the job's.
void JoinAtStep200(const Proc& run, const std::string& token, const std::string& dir,
                   std::string* coordinator, Proc* joined) {
  *coordinator = CoordinatorAddress(run);
  ASSERT_FALSE(coordinator->empty()) << run.Output();
  ASSERT_TRUE(run.WaitForOutput("step 200 ", absl::Seconds(60))) << run.Output();
  *joined = JoinServer(*coordinator, token, 2, dir);
  ASSERT_TRUE(WaitMoved(run, 2, 2)) << run.Output() << joined->Output();
}

// Server 2 joins at step 200 of `run` (started by hand as *joined), and
// server 0 is removed at step 400 (psrt-ckpt's output in *said).
void JoinAndRemove(const Proc& run, const std::string& token, const std::string& dir, Proc* joined,
                   std::string* said) {
  std::string coordinator;
  ASSERT_NO_FATAL_FAILURE(JoinAtStep200(run, token, dir, &coordinator, joined));
  ASSERT_TRUE(run.WaitForOutput("step 400 ", absl::Seconds(60))) << run.Output();
  ASSERT_EQ(RemoveServer(coordinator, token, 0, dir, said), 0) << *said << run.Output();
}

// Server 2 joins at step 200 of `run` and is killed once `when` is in the
// job's log; *out: the job's output once it ended, with code 0.
void KillTheJoinedServer(Proc& run, const std::string& token, const std::string& dir,
                         const std::string& when, std::string* out) {
  std::string coordinator;
  Proc joined;
  ASSERT_NO_FATAL_FAILURE(JoinAtStep200(run, token, dir, &coordinator, &joined));
  ASSERT_TRUE(run.WaitForOutput(when, absl::Seconds(60))) << run.Output();
  kill(joined.pid, SIGKILL);
  ASSERT_EQ(run.Wait(absl::Seconds(120), "psrt-run"), 0) << run.Output();
  *out = run.Output();
}

TEST(ServerMovesTest, ASyncJobWithAServerJoiningAndOneLeavingEndsBitForBitAsUninterrupted) {
  // Server 2 joins (server 0 served its keys until then), then server 0
  // leaves: its keys go to another server. Sync steps go on throughout; a
  // step half done when keys move is handed over with them. Checkpoints
  // every 50 steps pause while keys move, and each finds every key.
  const std::string dir = TempDir(), token = RandomToken();
  Proc run = StartJob(Distribution(absl::StrCat(R"(,"max_servers":3,"checkpoint":{"uri":")", dir,
                                                R"(/ckpt","every_steps":50})")),
                      token, dir);
  Proc joined;
  std::string said;
  ASSERT_NO_FATAL_FAILURE(JoinAndRemove(run, token, dir, &joined, &said));
  EXPECT_TRUE(
      std::regex_search(said, std::regex("server 0 left the job; its keys are on server [12]")))
      << said;
  EXPECT_EQ(run.Wait(absl::Seconds(120), "psrt-run"), 0) << run.Output();
  EXPECT_EQ(joined.Wait(absl::Seconds(30), "the server that joined"), 0) << joined.Output();
  const std::string out = run.Output();
  EXPECT_NE(out.find("server 2 on 127.0.0.1 joins the job"), std::string::npos) << out;
  EXPECT_NE(out.find("server 0 on local0 left the job: its keys are on the other servers"),
            std::string::npos)
      << out;
  // Server 0 exited by itself, with code 0, and was not started again.
  EXPECT_NE(out.find("removed from the job: its keys moved to the other servers; exiting"),
            std::string::npos)
      << out;
  // Every checkpoint found each key on one server (a checkpoint may still
  // fail for a step training raced past under load: not this test's).
  EXPECT_EQ(out.find("do not tile"), std::string::npos) << out;
  EXPECT_EQ(out.find(absl::StrCat("checkpoint at step ", kSteps, " failed")), std::string::npos)
      << out;
  ExpectUninterrupted(dir, out);
  absl::StatusOr<CheckpointRef> final = ResolveCheckpoint("latest", dir + "/ckpt");
  ASSERT_TRUE(final.ok()) << final.status();
  EXPECT_EQ(final->manifest.step(), kSteps);
  EXPECT_EQ(final->manifest.num_servers(), 2);  // servers 1 and 2
  // Every checkpoint committed, before, during and after the moves, holds
  // every key at its step.
  absl::StatusOr<std::unique_ptr<Storage>> root = OpenStorage(NormalizeUri(dir + "/ckpt"));
  ASSERT_TRUE(root.ok()) << root.status();
  absl::StatusOr<std::vector<CheckpointEntry>> all = ListCheckpoints(root->get());
  ASSERT_TRUE(all.ok()) << all.status();
  int committed = 0;
  for (const CheckpointEntry& e : *all) {
    if (!e.committed) continue;
    ++committed;
    EXPECT_EQ(e.manifest.keys_size(), 9) << e.name;
    for (const v1::ManifestKey& k : e.manifest.keys())
      EXPECT_EQ(k.version(), e.manifest.step()) << e.name;
  }
  EXPECT_GE(committed, 5) << out;
  EXPECT_EQ(Leftovers(token), 0);
}

TEST(ServerMovesTest, ASparseTablesRowsMoveWithTheirServersBitForBit) {
  // The same join and removal with a table of 512 rows in three parts (one
  // per server of max_servers): part 2 goes from server 0 to server 2 as it
  // joins, part 0 from server 0 to another as it leaves, each whole with its
  // rows' optimizer state and counters and a step half done.
  const std::string dir = TempDir(), token = RandomToken();
  Proc run = StartJob(Distribution(absl::StrCat(R"(,"max_servers":3,"checkpoint":{"uri":")", dir,
                                                R"(/ckpt","every_steps":250})")),
                      token, dir, kSteps, kWithTable);
  Proc joined;
  std::string said;
  ASSERT_NO_FATAL_FAILURE(JoinAndRemove(run, token, dir, &joined, &said));
  EXPECT_EQ(run.Wait(absl::Seconds(120), "psrt-run"), 0) << run.Output();
  EXPECT_EQ(joined.Wait(absl::Seconds(30), "the server that joined"), 0) << joined.Output();
  const std::string out = run.Output() + joined.Output();
  EXPECT_EQ(out.find("was not handed over"), std::string::npos) << out;
  EXPECT_EQ(out.find("not all of its rows arrived"), std::string::npos) << out;
  const std::string weights = ReadFile(dir + "/r.rank0.weights");
  EXPECT_EQ(weights.size(), (8192 + 1 + 512) * sizeof(float));
  EXPECT_TRUE(weights == UninterruptedWeights(kWithTable))
      << "final weights or table rows differ from the uninterrupted run's\n"
      << out;
  // The last checkpoint holds every row the job made, from the servers that
  // hold the parts at the end.
  absl::StatusOr<CheckpointRef> final = ResolveCheckpoint("latest", dir + "/ckpt");
  ASSERT_TRUE(final.ok()) << final.status();
  EXPECT_EQ(final->manifest.step(), kSteps);
  EXPECT_EQ(Leftovers(token), 0);
}

TEST(ServerMovesTest, WithReplicasAJoinedServersKeysGetACopyAndFailOverWithNoStepLost) {
  // "replicas": 1 with "max_servers": the copy holders are named once the
  // job runs. Server 2 joins, its keys move to it, and a copy of them is
  // built on another server; then server 2 is killed (no agent supervises
  // a server started by hand): its keys fail over to that copy, no step is
  // lost, and the job ends as the uninterrupted one does.
  const std::string dir = TempDir(), token = RandomToken();
  Proc run = StartJob(Distribution(R"(,"max_servers":3,"replicas":1)"), token, dir);
  std::string out;
  ASSERT_NO_FATAL_FAILURE(
      KillTheJoinedServer(run, token, dir, "a loss of server 2 fails over to it", &out));
  EXPECT_TRUE(std::regex_search(
      out, std::regex("server [01] serves server 2's keys from their replicas, no step lost")))
      << out;
  EXPECT_EQ(out.find("rolled back"), std::string::npos) << out;
  ExpectUninterrupted(dir, out);
  EXPECT_EQ(Leftovers(token), 0);
}

TEST(ServerMovesTest, AJoinedServersLossIsRecoveredLikeAnyServers) {
  // "on_failure": "recover": server 2 joins, a checkpoint finds its keys on
  // it, and it is killed. The job rolls back to that checkpoint on the
  // servers it started with (server 0 serves server 2's keys again, from
  // the checkpoint) and ends as the uninterrupted job does.
  const std::string dir = TempDir(), token = RandomToken();
  Proc run = StartJob(RecoveringJob(dir), token, dir);
  std::string out;
  ASSERT_NO_FATAL_FAILURE(KillTheJoinedServer(run, token, dir, "step-000000000400 committed", &out));
  EXPECT_NE(out.find("server 2 on 127.0.0.1 was lost"), std::string::npos) << out;
  EXPECT_TRUE(std::regex_search(out, std::regex("rolled back to step [4-9]00"))) << out;
  ExpectUninterrupted(dir, out);
  EXPECT_EQ(Leftovers(token), 0);
}

TEST(ServerMovesTest, AnAsyncJobLosesNoPushAndAppliesNoneTwiceWhileServersJoinAndLeave) {
  // Every push of both workers is applied exactly once: each key's final
  // version, in the checkpoint written at the end, counts them.
  const std::string dir = TempDir(), token = RandomToken();
  Proc run = StartJob(Distribution(absl::StrCat(R"(,"max_servers":3,"mode":"async",)",
                                                R"("checkpoint":{"uri":")", dir, R"(/ckpt"})")),
                      token, dir);
  std::string coordinator;
  Proc joined;
  ASSERT_NO_FATAL_FAILURE(JoinAtStep200(run, token, dir, &coordinator, &joined));
  std::string said;
  ASSERT_EQ(RemoveServer(coordinator, token, 1, dir, &said), 0) << said << run.Output();
  ASSERT_EQ(run.Wait(absl::Seconds(120), "psrt-run"), 0) << run.Output();
  EXPECT_EQ(joined.Wait(absl::Seconds(30), "the server that joined"), 0) << joined.Output();
  absl::StatusOr<CheckpointRef> final = ResolveCheckpoint("latest", dir + "/ckpt");
  ASSERT_TRUE(final.ok()) << final.status();
  // Two servers wrote it: server 1 had left.
  EXPECT_EQ(final->manifest.num_servers(), 2);
  EXPECT_EQ(final->manifest.keys_size(), 9);
  for (const v1::ManifestKey& k : final->manifest.keys()) {
    EXPECT_EQ(k.version(), 2 * kSteps) << k.variable() << "#" << k.partition();
  }
  EXPECT_EQ(Leftovers(token), 0);
}

TEST(ServerMovesTest, RemovalsThatCannotBeAreRefusedSayingWhyAndChangeNothing) {
  const std::string dir = TempDir(), token = RandomToken();
  std::string said;
  {
    // A job whose servers are fixed.
    Proc run = StartJob(Distribution(""), token, dir, /*steps=*/250);
    const std::string coordinator = CoordinatorAddress(run);
    ASSERT_TRUE(run.WaitForOutput("step 100 ", absl::Seconds(60))) << run.Output();
    EXPECT_EQ(RemoveServer(coordinator, token, 0, dir, &said), 1) << said;
    EXPECT_NE(said.find("this job's servers are fixed: set \"max_servers\""), std::string::npos)
        << said;
    EXPECT_EQ(run.Wait(absl::Seconds(120), "psrt-run"), 0) << run.Output();
  }
  const std::string token2 = RandomToken(), dir2 = TempDir();
  Proc run = StartJob(Distribution(R"(,"max_servers":3)"), token2, dir2);
  const std::string coordinator = CoordinatorAddress(run);
  ASSERT_TRUE(run.WaitForOutput("step 100 ", absl::Seconds(60))) << run.Output();
  EXPECT_EQ(RemoveServer(coordinator, token2, 5, dir2, &said), 1) << said;
  EXPECT_NE(said.find("no server 5 in this job: its servers are 0..2"), std::string::npos) << said;
  EXPECT_EQ(RemoveServer(coordinator, token2, 2, dir2, &said), 1) << said;
  EXPECT_NE(said.find("server 2 is not in the job now"), std::string::npos) << said;
  EXPECT_EQ(RemoveServer(coordinator, "wrong-token", 0, dir2, &said), 1) << said;
  EXPECT_NE(said.find("not this job's"), std::string::npos) << said;
  // A server of an index the job does not have cannot join.
  Proc stray = JoinServer(coordinator, token2, 7, dir2);
  EXPECT_NE(stray.Wait(absl::Seconds(30), "a server of index 7"), 0);
  EXPECT_NE(stray.Output().find("no server with index 7 in this job"), std::string::npos)
      << stray.Output();
  // The last server stays.
  ASSERT_EQ(RemoveServer(coordinator, token2, 0, dir2, &said), 0) << said << run.Output();
  EXPECT_EQ(RemoveServer(coordinator, token2, 1, dir2, &said), 1) << said;
  EXPECT_NE(said.find("server 1 is the job's last server"), std::string::npos) << said;
  EXPECT_EQ(run.Wait(absl::Seconds(120), "psrt-run"), 0) << run.Output();
  ExpectUninterrupted(dir2, run.Output());
  EXPECT_EQ(Leftovers(token2), 0);
}

TEST(ServerMovesTest, ARecoveryRestoresTheKeysOfServersThatJoinLater) {
  // Server 2 never joins: server 0 serves its keys, saves them in the
  // checkpoints and restores them when server 1 is killed and the job rolls
  // back.
  const std::string dir = TempDir(), token = RandomToken();
  Proc run = StartJob(RecoveringJob(dir), token, dir);
  ASSERT_TRUE(run.WaitForOutput("step 350 ", absl::Seconds(60))) << run.Output();
  kill(ServerProcess(token, 1), SIGKILL);
  ASSERT_EQ(run.Wait(absl::Seconds(120), "psrt-run"), 0) << run.Output();
  const std::string out = run.Output();
  EXPECT_NE(out.find("rolled back to step"), std::string::npos) << out;
  ExpectUninterrupted(dir, out);
  EXPECT_EQ(Leftovers(token), 0);
}

}  // namespace
}  // namespace psrt
