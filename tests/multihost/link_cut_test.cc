// Three hosts as network namespaces (tests/multihost/netns_hosts.h), each
// running psrt-run as a real host would, and one host's link cut in the middle
// of training: under "recover" a cut shorter than host_wait_s is a recovery
// after which the job ends with the weights of an uninterrupted run, and a
// host cut off for longer leaves the job while the others train on; under
// "fail" a cut ends the job naming the host. Every process on every host
// exits.
#include <gtest/gtest.h>
#include <signal.h>

#include <cstring>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "tests/integration/job_util.h"
#include "tests/multihost/netns_job.h"

namespace psrt {
namespace {

constexpr char kTrainer[] = "--dim=2048 --batch=64 --log-every=10 --steps=400";

std::string Distribution(const std::string& policy, const std::string& more = "") {
  return absl::StrCat(
      R"({"parameter_server":{"enabled":true,"heartbeat_timeout_s":2,"partition_bytes":4096,)",
      R"("on_failure":")", policy, R"(","checkpoint":{"uri":"/tmp/psrt-multihost-)", getpid(),
      R"(","every_steps":50})", more, "}}");
}

class LinkCutTest : public NetnsJobTest {
 protected:
  void SetUp() override {
    NetnsJobTest::SetUp();
    std::system(absl::StrCat("rm -rf /tmp/psrt-multihost-", getpid()).c_str());
  }
  void TearDown() override {
    NetnsJobTest::TearDown();
    std::system(absl::StrCat("rm -rf /tmp/psrt-multihost-", getpid()).c_str());
  }

  // psrt-run on every host, by IP.
  void Start(const std::string& dist) {
    for (int h = 0; h < kHosts; ++h) {
      StartPsrtRun(h,
                   absl::StrCat("--hosts=", IpHosts(), " --current-host=", h,
                                " --distribution='", dist, "'"),
                   absl::StrCat(kBin, "/psrt-example-linreg ", kTrainer, " --result=", dir_, "/r"));
    }
  }
  // Cuts host 2's link once rank 0 (on host 0) logged step 100.
  void CutAtStep100() {
    ASSERT_TRUE(runs_[0].WaitForOutput("step 100 ", absl::Seconds(60))) << Output();
    ASSERT_TRUE(hosts_->Cut(2).ok());
  }
};

// The weights of the same job on three loopback hosts, never interrupted.
std::string UninterruptedWeights() {
  const std::string dir = TempDir();
  Proc run = Proc::Start(
      absl::StrCat(
          kBin, "/psrt-run --local=", NetnsJobTest::kHosts,
          R"( --distribution='{"parameter_server":{"enabled":true,"partition_bytes":4096}}' -- )",
          kBin, "/psrt-example-linreg ", kTrainer, " --result=", dir, "/r"),
      dir + "/log");
  EXPECT_EQ(run.Wait(absl::Seconds(120), "the uninterrupted job"), 0) << run.Output();
  return ReadFile(dir + "/r.rank0.weights");
}

std::vector<float> Floats(const std::string& bytes) {
  std::vector<float> v(bytes.size() / sizeof(float));
  std::memcpy(v.data(), bytes.data(), v.size() * sizeof(float));
  return v;
}

TEST_F(LinkCutTest, ABlipLongerThanTheHeartbeatTimeoutIsRecoveredAndTrainsAsUninterrupted) {
  Start(Distribution("recover", R"(,"host_wait_s":30)"));
  CutAtStep100();
  absl::SleepFor(absl::Seconds(4));  // twice the heartbeat timeout
  ASSERT_TRUE(hosts_->Restore(2).ok());
  const std::vector<int> codes = WaitAll(absl::Seconds(120));
  const std::string out = Output();
  EXPECT_EQ(codes, std::vector<int>(kHosts, 0)) << out;
  EXPECT_TRUE(std::regex_search(
      out, std::regex("recovery 1 of at most 3: .*10\\.213\\.0\\.3.*; rolled back to step")))
      << out;
  // Host 2 took part again: its agent restarted its processes for the next
  // generation (whether the coordinator had declared the agent itself lost
  // depends on which of the host's heartbeats it missed first).
  EXPECT_TRUE(std::regex_search(
      runs_[2].Output(),
      std::regex("psrt-worker\\[2\\] W the job is recovering \\(generation [0-9]+\\)")))
      << out;
  // Three workers' gradients are summed in the order they arrive, so two
  // runs agree to rounding, not bit for bit.
  const std::vector<float> got = Floats(ReadFile(dir_ + "/r.rank0.weights"));
  const std::vector<float> want = Floats(UninterruptedWeights());
  ASSERT_EQ(got.size(), want.size()) << out;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], 1e-4) << "weight " << i << "\n" << out;
  ExpectNothingLeft();
}

TEST_F(LinkCutTest, ALastingCutFailsTheJobNamingTheHostUnderFail) {
  Start(Distribution("fail"));
  CutAtStep100();
  const absl::Time cut = absl::Now();
  const std::vector<int> codes = WaitAll(absl::Seconds(60));
  const std::string out = Output();
  for (int c : codes) EXPECT_EQ(c, 1) << out;
  EXPECT_LT(absl::Now() - cut, absl::Seconds(30)) << out;
  EXPECT_TRUE(std::regex_search(
      out, std::regex("job failed: .* on 10\\.213\\.0\\.3 was lost: no heartbeat")))
      << out;
  // Host 2 learns it lost the coordinator.
  EXPECT_TRUE(
      std::regex_search(runs_[2].Output(), std::regex("lost the coordinator at 10\\.213\\.0\\.1")))
      << out;
  ExpectNothingLeft();
}

TEST_F(LinkCutTest, AHostGoneLongerThanHostWaitLeavesAndTheOthersTrainOn) {
  Start(Distribution("recover", R"(,"host_wait_s":4)"));
  CutAtStep100();
  const std::vector<int> codes = WaitAll(absl::Seconds(120));
  const std::string out = Output();
  EXPECT_EQ(codes, (std::vector<int>{0, 0, 1})) << out;
  // First the usual recovery, then the host leaves: its keys are restored
  // onto the two servers left and two training processes finish the job.
  EXPECT_TRUE(std::regex_search(
      out, std::regex("recovery 1 of at most 3: agent on 10\\.213\\.0\\.3 was lost")))
      << out;
  EXPECT_TRUE(std::regex_search(
      out,
      std::regex(
          "recovery 2 of at most 3: agent on 10\\.213\\.0\\.3 did not come back within 4s "
          "\\(host_wait_s\\)"
          ".*; 10\\.213\\.0\\.3 leaves the job: its keys move to the servers of the 2 hosts left")))
      << out;
  EXPECT_TRUE(std::regex_search(out, std::regex("as host 1 of 2"))) << out;
  EXPECT_TRUE(std::regex_search(out, std::regex("job succeeded"))) << out;
  ExpectLearned();
  ExpectNothingLeft();
}

}  // namespace
}  // namespace psrt
