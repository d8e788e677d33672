// Whole jobs started the way users start them: psrt-run and the daemons as
// real processes talking gRPC over loopback.
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <regex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/grpc_util.h"
#include "common/process.h"
#include "tests/integration/job_util.h"
#include "tests/integration/scrape.h"

namespace psrt {
namespace {

double JsonNumber(const std::string& json, const std::string& key) {
  std::smatch m;
  std::regex re("\"" + key + "\": ([-0-9.eE+a-z]+)");
  if (!std::regex_search(json, m, re)) {
    ADD_FAILURE() << "no '" << key << "' in " << json;
    return NAN;
  }
  return std::stod(m[1]);
}

std::string RunCommand(const std::string& dist, const std::string& token, const std::string& trainer_args) {
  return absl::StrCat(kBin, "/psrt-run --local=2 --token=", token, " --distribution='", dist, "' -- ",
                      kBin, "/psrt-example-linreg ", trainer_args);
}

void ExpectConverges(const std::string& mode, double tolerance) {
  const std::string dir = TempDir();
  const std::string token = RandomToken();
  const std::string dist = absl::StrCat(
      R"({"parameter_server": {"enabled": true, "mode": ")", mode,
      R"(", "servers_per_host": 1, "workers_per_host": 1, "partition_bytes": 4096}})");
  // 2048 weights make 2 keys of 4 KiB, spread over both servers.
  Proc run = Proc::Start(
      RunCommand(dist, token, absl::StrCat("--dim=2048 --batch=256 --steps=300 --lr=0.1 --result=", dir, "/r")),
      dir + "/log");
  ASSERT_EQ(run.Wait(absl::Seconds(120), "psrt-run"), 0) << run.Output();
  EXPECT_NE(run.Output().find("job succeeded"), std::string::npos) << run.Output();
  const std::string r0 = ReadFile(dir + "/r.rank0.json"), r1 = ReadFile(dir + "/r.rank1.json");
  EXPECT_LT(JsonNumber(r0, "relative_error"), tolerance) << r0;
  EXPECT_LT(JsonNumber(r1, "relative_error"), tolerance) << r1;
  if (mode == "sync") {
    // Both read the same final version.
    EXPECT_EQ(JsonNumber(r0, "w0"), JsonNumber(r1, "w0"));
  }
  EXPECT_TRUE(JobProcesses(token).empty()) << "processes of the job outlived it";
}

TEST(JobTest, SyncTrainsToTheKnownSolution) { ExpectConverges("sync", 1e-4); }

// psrt-run's summary, line and JSON, against what the job is known to have
// done: 2 workers pushing 30 steps of 1001 float32 each, and the
// checkpoints committed in its directory (the periodic ones a fast job
// reaches, and the final one).
TEST(JobTest, TheSummaryAddsUpWhatTheJobDid) {
  const std::string dir = TempDir();
  const std::string dist = absl::StrCat(
      R"({"parameter_server": {"enabled": true, "checkpoint": {"uri": "file://)", dir,
      R"(/ckpt", "every_steps": 10}}})");
  Proc run = Proc::Start(absl::StrReplaceAll(RunCommand(dist, RandomToken(), "--dim=1000 --steps=30"),
                                             {{"--local=2", "--local=2 --summary-json=" + dir + "/summary.json"}}),
                         dir + "/log");
  ASSERT_EQ(run.Wait(absl::Seconds(120), "psrt-run"), 0) << run.Output();
  EXPECT_TRUE(std::regex_search(run.Output(), std::regex("psrt-run N summary: [0-9.]+ s, 30 steps .* on 2 workers; "
                                                         "pushed 240.2 kB")))
      << run.Output();
  const std::string json = ReadFile(dir + "/summary.json");
  EXPECT_EQ(JsonNumber(json, "bytes_pushed"), 2 * 30 * 1001 * 4) << json;
  EXPECT_EQ(JsonNumber(json, "steps"), 30) << json;
  EXPECT_EQ(JsonNumber(json, "workers"), 2) << json;
  EXPECT_EQ(JsonNumber(json, "recoveries"), 0) << json;
  // Pulls: every step's, and each rank's first (its initial weights).
  EXPECT_GE(JsonNumber(json, "bytes_pulled"), 2 * 31 * 1001 * 4) << json;
  const double share = JsonNumber(json, "pull_wait_share");
  EXPECT_GT(share, 0) << json;
  EXPECT_LT(share, 1) << json;
  int committed = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir + "/ckpt")) {
    committed += entry.path().filename().string().rfind("step-", 0) == 0;
  }
  EXPECT_GE(committed, 1) << "the final one at least";
  EXPECT_EQ(JsonNumber(json, "checkpoints"), committed) << json;
}

// --dry-run says what a multi-host job would start, after checking every
// flag, and starts nothing.
TEST(JobTest, DryRunPrintsTheClusterAndStartsNothing) {
  const std::string dir = TempDir();
  const std::string token = RandomToken();
  const std::string dist =
      R"({"parameter_server": {"enabled": true, "servers_per_host": 2, "workers_per_host": 2, )"
      R"("server_port_base": 9000, "checkpoint": {"uri": "file:///ckpt/job", "every_steps": 100}, )"
      R"("restore": "latest"}})";
  Proc dry = Proc::Start(absl::StrCat(kBin, "/psrt-run --dry-run --hosts=algo-1,algo-2 --current-host=algo-2 ",
                                      "--token=", token, " --distribution='", dist, "' -- python train.py"),
                         dir + "/dry");
  ASSERT_EQ(dry.Wait(absl::Seconds(30), "psrt-run --dry-run"), 0) << dry.Output();
  const std::string out = dry.Output();
  for (const char* line :
       {"hosts: 2 from --hosts, this is host 1 (algo-2)", "coordinator: on host 0 at algo-1:7070",
        "psrt-server[3] at algo-2:9001, data port 9003", "worker: PSRT_RANK 3, PSRT_LOCAL_RANK 1",
        "training command (PSRT_WORLD_SIZE 4): python train.py",
        "checkpoints: file:///ckpt/job every 100 steps", "restore: latest",
        "local aggregation: on (each host's 2 training processes"}) {
    EXPECT_TRUE(absl::StrContains(out, line)) << "no '" << line << "' in:\n" << out;
  }
  EXPECT_TRUE(JobProcesses(token).empty());

  Proc bad = Proc::Start(absl::StrCat(kBin, "/psrt-run --dry-run --local=2 --distribution='",
                                      R"({"parameter_server": {"enabled": true, "mode": "fast"}})", "' -- true"),
                         dir + "/bad");
  EXPECT_EQ(bad.Wait(absl::Seconds(30), "psrt-run --dry-run"), 2) << bad.Output();
  EXPECT_TRUE(absl::StrContains(bad.Output(), "mode")) << bad.Output();
}

// psrt's own lines in a job's output (every process's log lines).
int PsrtLines(const std::string& out, char severity) {
  const std::regex line(absl::StrCat(R"((^|\n)[0-9-]+T[0-9:.]+Z \S+ )", std::string(1, severity), " "));
  return std::distance(std::sregex_iterator(out.begin(), out.end(), line), std::sregex_iterator());
}

// Under the default level a job's output is the trainer's, plus psrt-run's
// notices (it started, it ended); --log-level=info brings back every
// process's lines; a level that names none is refused before anything
// starts. (ctest runs these tests with PSRT_LOG_LEVEL=info: `env -u` takes
// it away.)
TEST(JobTest, TheDefaultLevelLeavesTheOutputToTheTrainer) {
  const std::string dir = TempDir();
  const std::string dist = R"({"parameter_server": {"enabled": true}})";
  const std::string trainer = "--dim=64 --steps=30 --log-every=10";
  Proc quiet = Proc::Start("env -u PSRT_LOG_LEVEL " + RunCommand(dist, RandomToken(), trainer), dir + "/quiet");
  ASSERT_EQ(quiet.Wait(absl::Seconds(120), "psrt-run"), 0) << quiet.Output();
  const std::string out = quiet.Output();
  EXPECT_NE(out.find("step 20 loss"), std::string::npos) << "the trainer's own lines:\n" << out;
  const int notices = PsrtLines(out, 'N');
  EXPECT_GE(notices, 1) << out;
  EXPECT_LE(notices + PsrtLines(out, 'W') + PsrtLines(out, 'E'), 3) << out;
  EXPECT_EQ(PsrtLines(out, 'I'), 0) << out;
  EXPECT_TRUE(absl::StrContains(out, "psrt-run N job succeeded")) << out;

  Proc loud = Proc::Start("env -u PSRT_LOG_LEVEL " + absl::StrReplaceAll(RunCommand(dist, RandomToken(), trainer),
                                                                         {{"--local=2", "--local=2 --log-level=info"}}),
                          dir + "/loud");
  ASSERT_EQ(loud.Wait(absl::Seconds(120), "psrt-run"), 0) << loud.Output();
  EXPECT_GE(PsrtLines(loud.Output(), 'I'), 10) << loud.Output();
  EXPECT_TRUE(absl::StrContains(loud.Output(), "registered worker 0")) << loud.Output();

  for (const auto& [how, named] : std::vector<std::pair<std::string, std::string>>{
           {"--log-level=chatty", "--log-level: 'chatty' is no log level"},
           {"PSRT_LOG_LEVEL=chatty", "PSRT_LOG_LEVEL: 'chatty' is no log level"}}) {
    const std::string token = RandomToken();
    const std::string command = RunCommand(dist, token, trainer);
    Proc bad = Proc::Start(how[0] == '-' ? absl::StrReplaceAll(command, {{"--local=2", "--local=2 " + how}})
                                         : absl::StrCat("env ", how, " ", command),
                           dir + "/bad");
    EXPECT_EQ(bad.Wait(absl::Seconds(30), "psrt-run"), 2) << bad.Output();
    EXPECT_TRUE(absl::StrContains(bad.Output(), named)) << bad.Output();
    EXPECT_TRUE(JobProcesses(token).empty()) << "nothing starts";
  }
}

TEST(JobTest, AsyncTrainsToTheKnownSolution) { ExpectConverges("async", 1e-3); }

TEST(JobTest, FailingWorkerFailsTheJobAndNamesIt) {
  const std::string dir = TempDir();
  const std::string token = RandomToken();
  Proc run = Proc::Start(
      RunCommand(R"({"parameter_server": {"enabled": true}})", token, "--steps=1000 --exit-at-step=5"),
      dir + "/log");
  EXPECT_EQ(run.Wait(absl::Seconds(60), "psrt-run"), 1);
  const std::string out = run.Output();
  EXPECT_TRUE(std::regex_search(out, std::regex("job failed: worker [01] on local[01] exited with code 3")))
      << out;
  EXPECT_TRUE(JobProcesses(token).empty());
}

TEST(JobTest, ADivergingJobFailsAndSaysWhy) {
  // A learning rate of 1e30: gradients turn Inf/NaN within a few steps.
  for (const std::string nonfinite : {"skip", "fail"}) {
    const std::string dir = TempDir();
    Proc run = Proc::Start(
        RunCommand(absl::StrCat(R"({"parameter_server": {"enabled": true, "nonfinite": ")", nonfinite, R"("}})"),
                   RandomToken(), "--steps=50 --lr=1e30"),
        dir + "/log");
    EXPECT_EQ(run.Wait(absl::Seconds(60), "psrt-run"), 1) << nonfinite;
    const std::string out = run.Output();
    if (nonfinite == "skip") {
      // The servers skip the bad steps; the trainer sees the result diverged.
      EXPECT_TRUE(std::regex_search(out, std::regex("got a gradient with NaN or Inf at version [0-9]+ \\(1 so far\\): skipped")))
          << out;
      EXPECT_TRUE(std::regex_search(out, std::regex("linear_regression: rank [01] ended with a loss of .*training diverged")))
          << out;
    } else {
      EXPECT_TRUE(std::regex_search(
          out, std::regex("linear_regression: FAILED_PRECONDITION: .*key '(weight|bias)#0' got a gradient with NaN or Inf")))
          << out;
    }
    EXPECT_NE(out.find("job failed"), std::string::npos) << out;
  }
}

// A 2-host job that trains until something stops it, with a 2 s heartbeat
// timeout, for failure drills.
Proc StartEndlessJob(const std::string& token) {
  return Proc::Start(RunCommand(R"({"parameter_server": {"enabled": true, "heartbeat_timeout_s": 2}})",
                                token, "--steps=100000000 --log-every=10"),
                     TempDir() + "/log");
}

TEST(JobTest, KilledServerFailsEveryProcessWithinTheDeadline) {
  const std::string token = RandomToken();
  Proc run = StartEndlessJob(token);
  ASSERT_TRUE(run.WaitForOutput("step 10 ", absl::Seconds(60))) << run.Output();
  const pid_t server1 = FindJobProcess(token, [](pid_t p) {
    const std::string cmd = CmdLine(p);
    return cmd.find("psrt-server") != std::string::npos && cmd.find("--index=1") != std::string::npos;
  });
  ASSERT_NE(server1, 0) << "psrt-server 1 not found";
  const absl::Time killed = absl::Now();
  kill(server1, SIGKILL);
  EXPECT_EQ(run.Wait(absl::Seconds(60), "psrt-run after a server was killed"), 1);
  // Heartbeat timeout (2 s) plus retries and shutdown, well short of a hang.
  EXPECT_LT(absl::Now() - killed, absl::Seconds(30));
  const std::string out = run.Output();
  EXPECT_NE(out.find("job failed"), std::string::npos) << out;
  EXPECT_TRUE(std::regex_search(out, std::regex("server 1 (on local1 was lost|on local1 exited with code 137|at 127\\.0\\.0\\.1:[0-9]+ failed)")))
      << out;
  EXPECT_TRUE(std::regex_search(out, std::regex("psrt-server\\[1\\] killed by signal 9"))) << out;
  // The training processes end with an error that says what happened.
  EXPECT_TRUE(std::regex_search(
      out, std::regex("linear_regression: (ABORTED: the job failed: server 1 on local1 (was lost|exited with code 137)|"
                      "UNAVAILABLE: push-pull to server 1 at 127\\.0\\.0\\.1:[0-9]+ failed)")))
      << out;
  for (const char* name : {"psrt-coordinator", "psrt-server\\[0\\]", "psrt-worker\\[0\\]", "psrt-worker\\[1\\]"}) {
    EXPECT_TRUE(std::regex_search(out, std::regex(absl::StrCat(name, " exited with code 1")))) << name << "\n" << out;
  }
  EXPECT_TRUE(JobProcesses(token).empty());
}

TEST(JobTest, AWorkerThatGoesSilentIsLostWithinTheHeartbeatTimeout) {
  const std::string token = RandomToken();
  Proc run = StartEndlessJob(token);
  ASSERT_TRUE(run.WaitForOutput("step 10 ", absl::Seconds(60))) << run.Output();
  // Freeze worker 1: alive, but silent (no exit for its agent to see).
  const pid_t worker1 = FindJobProcess(token, [](pid_t p) {
    return CmdLine(p).find("psrt-example-linreg") != std::string::npos &&
           ReadFile(absl::StrCat("/proc/", p, "/environ")).find(std::string("PSRT_RANK=1\0", 12)) !=
               std::string::npos;
  });
  ASSERT_NE(worker1, 0) << "training process of rank 1 not found";
  const absl::Time stopped = absl::Now();
  kill(worker1, SIGSTOP);
  EXPECT_EQ(run.Wait(absl::Seconds(60), "psrt-run after a worker froze"), 1);
  EXPECT_LT(absl::Now() - stopped, absl::Seconds(30));
  EXPECT_TRUE(std::regex_search(run.Output(), std::regex("job failed: worker 1 on local1 was lost: no heartbeat for 2")))
      << run.Output();
  EXPECT_TRUE(JobProcesses(token).empty());
}

TEST(JobTest, MissingServerFailsTheBarrierNamingIt) {
  const std::string dir = TempDir();
  const std::string token = RandomToken();
  const std::string env = absl::StrCat("env PSRT_JOB_TOKEN=", token, " ");
  Proc coord = Proc::Start(
      absl::StrCat(env, kBin, "/psrt-coordinator --bind=127.0.0.1 --port=0 --port-file=", dir,
                   "/port --hosts=hostA,hostB --distribution='{\"parameter_server\": {\"enabled\": true, "
                   "\"barrier_timeout_s\": 2}}'"),
      dir + "/coord.log");
  Proc port_file;
  port_file.log = dir + "/port";
  ASSERT_TRUE(port_file.WaitForOutput("\n", absl::Seconds(20))) << coord.Output();
  const std::string address = absl::StrCat("127.0.0.1:", std::stoi(ReadFile(dir + "/port")));
  // Server 1 (on hostB) never starts.
  Proc server = Proc::Start(absl::StrCat(env, kBin, "/psrt-server --coordinator=", address,
                                         " --index=0 --host=127.0.0.1 --bind=127.0.0.1"),
                            dir + "/server.log");
  std::vector<Proc> agents;
  for (int h = 0; h < 2; ++h) {
    agents.push_back(Proc::Start(absl::StrCat(env, kBin, "/psrt-worker --coordinator=", address,
                                              " --host-index=", h, " -- ", kBin, "/psrt-example-linreg"),
                                 absl::StrCat(dir, "/agent", h, ".log")));
  }
  EXPECT_EQ(coord.Wait(absl::Seconds(30), "psrt-coordinator"), 1);
  EXPECT_NE(coord.Output().find("readiness barrier timed out after 2s; not arrived: server 1 on hostB"),
            std::string::npos)
      << coord.Output();
  EXPECT_EQ(server.Wait(absl::Seconds(30), "psrt-server"), 1);
  for (Proc& a : agents) {
    EXPECT_EQ(a.Wait(absl::Seconds(30), "psrt-worker"), 1);
    EXPECT_NE(a.Output().find("server 1 on hostB"), std::string::npos) << a.Output();
  }
}

// Whether nothing listens on 127.0.0.1:port now.
bool PortFree(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool free = bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  close(fd);
  return free;
}

// server_port_base fixes the data channel's port too, the one after the
// host's gRPC ports: a firewall opens both. The training command (started
// beside the server) connects to each, within 20 s, before it trains; a port
// that never listens fails it, and the job.
TEST(JobTest, ServerPortBaseFixesTheDataPortsToo) {
  int base = 0;
  for (int i = 0; i < 20 && base == 0; ++i) {
    const int p = PickFreePort();
    if (p < 65535 && PortFree(p + 1)) base = p;
  }
  ASSERT_NE(base, 0) << "no two free ports in a row";
  const std::string dir = TempDir();
  const std::string connect = absl::StrCat(
      "for p in ", base, " ", base + 1,
      "; do for i in $(seq 200); do (exec 3<>/dev/tcp/127.0.0.1/$p) 2>/dev/null && break; sleep 0.1; done; "
      "(exec 3<>/dev/tcp/127.0.0.1/$p) || exit 3; echo port $p listens; done; exec ",
      kBin, "/psrt-example-linreg --steps=20");
  Proc run = Proc::Start(absl::StrCat(kBin, "/psrt-run --local=1 --distribution='",
                                      R"({"parameter_server": {"enabled": true, "server_port_base": )", base,
                                      "}}' -- bash -c '", connect, "'"),
                         dir + "/log");
  EXPECT_EQ(run.Wait(absl::Seconds(120), "psrt-run with server_port_base"), 0) << run.Output();
  EXPECT_TRUE(absl::StrContains(run.Output(), absl::StrCat("port ", base + 1, " listens"))) << run.Output();
}

TEST(JobTest, MetricsOverHttpAndSignalsStopTheWholeJob) {
  const std::string dir = TempDir();
  const std::string token = RandomToken();
  const int port = PickFreePort();
  Proc run = Proc::Start(absl::StrCat(kBin, "/psrt-run --local=1 --metrics-port=", port, " --token=", token,
                                      " -- ", kBin, "/psrt-example-linreg --steps=100000000 --log-every=10"),
                         dir + "/log");
  ASSERT_TRUE(run.WaitForOutput("step 20 ", absl::Seconds(60))) << run.Output();
  std::smatch m;
  const std::string out = run.Output();
  ASSERT_TRUE(std::regex_search(out, m, std::regex("psrt-server\\[0\\] I metrics at http://127.0.0.1:([0-9]+)/metrics")))
      << out;
  const ScrapeResult server = Scrape(absl::StrCat("http://127.0.0.1:", m[1].str(), "/metrics"));
  ASSERT_EQ(server.status, 200) << server.error;
  EXPECT_GT(SampleValue(server.body, "psrt_server_bytes_in_total"), 0) << server.body;
  EXPECT_GT(SampleValue(server.body, "psrt_server_updates_total"), 0) << server.body;
  EXPECT_NE(server.body.find("# TYPE psrt_server_update_seconds histogram"), std::string::npos)
      << server.body;
  const ScrapeResult coordinator = Scrape(absl::StrCat("http://127.0.0.1:", port, "/metrics"));
  ASSERT_EQ(coordinator.status, 200) << coordinator.error;
  EXPECT_GT(SampleValue(coordinator.body, "psrt_coordinator_heartbeats_total"), 0) << coordinator.body;
  EXPECT_EQ(SampleValue(coordinator.body, "psrt_coordinator_registered_processes"), 3)
      << coordinator.body;

  kill(run.pid, SIGTERM);
  EXPECT_EQ(run.Wait(absl::Seconds(30), "psrt-run after SIGTERM"), 1);
  EXPECT_NE(run.Output().find("job failed"), std::string::npos) << run.Output();
  EXPECT_TRUE(JobProcesses(token).empty());
}

TEST(JobTest, EveryProgramExplainsItsFlags) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> programs = {
      {"psrt-server", {"--coordinator", "--index", "--port", "--token", "--metrics-port"}},
      {"psrt-coordinator", {"--hosts", "--distribution", "--port", "--port-file", "--token"}},
      {"psrt-worker", {"--coordinator", "--host-index", "--kill-grace"}},
      {"psrt-run", {"--distribution", "--local", "--hosts", "--current-host", "staleness", "checkpoint"}},
  };
  const std::string dir = TempDir();
  for (const auto& [program, flags] : programs) {
    Proc help = Proc::Start(absl::StrCat(kBin, "/", program, " --help"), dir + "/help");
    EXPECT_EQ(help.Wait(absl::Seconds(10), program), 0);
    for (const std::string& f : flags) EXPECT_NE(help.Output().find(f), std::string::npos) << program << " " << f;
    Proc bad = Proc::Start(absl::StrCat(kBin, "/", program, " --no-such-flag=1"), dir + "/bad");
    EXPECT_EQ(bad.Wait(absl::Seconds(10), program), 2);
    EXPECT_NE(bad.Output().find("unknown flag --no-such-flag"), std::string::npos) << bad.Output();
  }
}

TEST(JobTest, LauncherRefusesABadDistribution) {
  const std::string dir = TempDir();
  Proc run = Proc::Start(absl::StrCat(kBin, "/psrt-run --local=1 --distribution='{\"parameter_server\": "
                                      "{\"enabled\": true, \"stalenes\": 2}}' -- /bin/true"),
                         dir + "/log");
  EXPECT_EQ(run.Wait(absl::Seconds(10), "psrt-run"), 2);
  EXPECT_NE(run.Output().find("unknown key 'stalenes'"), std::string::npos) << run.Output();
  EXPECT_NE(run.Output().find("staleness"), std::string::npos) << run.Output();
}

}  // namespace
}  // namespace psrt
