// Eight hosts as network namespaces (netns_hosts.h), one server and one
// training process each, as a job past one machine runs: the job trains, a
// host lost mid-job under "recover" is survived, and the start-up (from the
// launch to rank 0's first step, the readiness barrier included) and the end
// are reported against the host count (multihost_bench --scan-hosts goes to
// 16 in `make bench`).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "tests/integration/job_util.h"
#include "tests/multihost/netns_job.h"

namespace psrt {
namespace {

constexpr int kManyHosts = 8;
constexpr char kTrainer[] = "--dim=256 --batch=32 --log-every=10 --steps=300";

// TCP: the hosts share this machine's /dev/shm.
std::string Distribution(const std::string& more = "") {
  return absl::StrCat(R"({"parameter_server":{"enabled":true,"transport":"tcp",)",
                      R"("partition_bytes":4096,"heartbeat_timeout_s":3)", more, "}}");
}

class ManyHostsTest : public NetnsJobTest {
 protected:
  int NumHosts() const override { return kManyHosts; }

  // psrt-run on every host, by IP; returns when they are all started.
  void Start(const std::string& dist) {
    launched_ = absl::Now();
    for (int h = 0; h < kManyHosts; ++h) {
      StartPsrtRun(h,
                   absl::StrCat("--hosts=", IpHosts(), " --current-host=", h,
                                " --distribution='", dist, "'"),
                   absl::StrCat(kBin, "/psrt-example-linreg ", kTrainer, " --result=", dir_, "/r"));
    }
  }
  // Seconds from the launch to rank 0's line for `step`.
  double SecondsTo(int step) {
    EXPECT_TRUE(runs_[0].WaitForOutput(absl::StrCat("step ", step, " "), absl::Seconds(120)))
        << Output();
    return absl::ToDoubleSeconds(absl::Now() - launched_);
  }

  absl::Time launched_;
};

TEST_F(ManyHostsTest, EightHostsTrainAndSayHowLongStartAndEndTook) {
  Start(Distribution());
  const double first_step = SecondsTo(0);
  const std::vector<int> codes = WaitAll(absl::Seconds(180));
  const double end = absl::ToDoubleSeconds(absl::Now() - launched_);
  const std::string out = Output();
  EXPECT_EQ(codes, std::vector<int>(kManyHosts, 0)) << out;
  ExpectLearned();
  // Every host's server and worker took part.
  for (int h = 0; h < kManyHosts; ++h) {
    EXPECT_TRUE(absl::StrContains(HostOutput(h), absl::StrCat("serving on ", hosts_->address(h))))
        << "host " << h << "\n"
        << out;
  }
  EXPECT_TRUE(absl::StrContains(out, "job succeeded")) << out;
  RecordProperty("hosts", kManyHosts);
  RecordProperty("seconds_to_first_step", absl::StrCat(first_step));
  RecordProperty("seconds_to_end", absl::StrCat(end));
  std::printf("%d hosts: first step after %.2f s, all hosts done after %.2f s\n", kManyHosts,
              first_step, end);
  ExpectNothingLeft();
}

TEST_F(ManyHostsTest, AHostLostUnderRecoverIsSurvivedAndTheJobLearns) {
  const std::string ckpt = absl::StrCat("/tmp/psrt-many-hosts-", getpid());
  std::system(("rm -rf " + ckpt).c_str());
  Start(Distribution(absl::StrCat(R"(,"on_failure":"recover","host_wait_s":30,)",
                                  R"("checkpoint":{"uri":")", ckpt, R"(","every_steps":50})")));
  SecondsTo(100);
  ASSERT_TRUE(hosts_->Cut(kManyHosts - 1).ok());
  absl::SleepFor(absl::Seconds(6));  // twice the heartbeat timeout
  ASSERT_TRUE(hosts_->Restore(kManyHosts - 1).ok());
  const std::vector<int> codes = WaitAll(absl::Seconds(180));
  const std::string out = Output();
  std::system(("rm -rf " + ckpt).c_str());
  EXPECT_EQ(codes, std::vector<int>(kManyHosts, 0)) << out;
  EXPECT_TRUE(std::regex_search(
      out, std::regex("recovery 1 of at most 3: .*10\\.213\\.0\\.8.*; rolled back to step")))
      << out;
  ExpectLearned();
  ExpectNothingLeft();
}

}  // namespace
}  // namespace psrt
