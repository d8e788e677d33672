// Local aggregation across network-namespace hosts: what crosses a host's
// interface per step, counted by the interface itself, and a job of three
// hosts of three workers that learns with every rank equal.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/grpc_util.h"
#include "tests/multihost/netns_job.h"

namespace psrt {
namespace {

// The last step rank 0's --loss-log holds ("seconds step loss" lines), or -1.
long LastStep(const std::string& loss_log) {
  std::ifstream in(loss_log);
  double t, loss;
  long step, last = -1;
  while (in >> t >> step >> loss) last = step;
  return last;
}

class TwoHostsTest : public NetnsJobTest {
 protected:
  int NumHosts() const override { return 2; }

  // Bytes host h's interface sent and received so far.
  double InterfaceBytes(int h) {
    double total = 0;
    for (const char* way : {"tx", "rx"}) {
      const std::string path = absl::StrCat(dir_, "/count");
      Proc cat = Proc::Start(
          absl::StrCat(hosts_->Exec(h), "cat /sys/class/net/eth", h, "/statistics/", way, "_bytes"),
          path);
      EXPECT_EQ(cat.Wait(absl::Seconds(10), "cat"), 0) << cat.Output();
      double v = 0;
      EXPECT_TRUE(absl::SimpleAtod(absl::StripAsciiWhitespace(cat.Output()), &v)) << cat.Output();
      total += v;
    }
    return total;
  }

  // Runs a job of 2 hosts x 4 workers (a 1 MiB model in 256 KiB keys, sync,
  // tcp) for 45 steps; returns the most bytes a host's interface carried per
  // step between rank 0's steps 10 and 40 (past registration and start-up,
  // before the end).
  double BytesPerStep(const std::string& ps) {
    const std::string token = RandomToken(), run = TempDir();
    std::vector<Proc> procs;
    for (int h = 0; h < 2; ++h) {
      procs.push_back(Proc::Start(
          absl::StrCat(
              hosts_->Exec(h), kBin, "/psrt-run --token=", token, " --hosts=", IpHosts(),
              " --current-host=", h, R"( --distribution='{"parameter_server": {"enabled": true, )",
              R"("workers_per_host": 4, "partition_bytes": 262144, "transport": "tcp", )", ps,
              "}}' -- ", kBin,
              "/psrt-example-linreg --dim=262143 --steps=45 --batch=8 --lr=1e-7 --loss-log=", run,
              "/loss"),
          absl::StrCat(run, "/host", h, ".log")));
    }
    auto at_step = [&](long step, std::vector<double>* bytes) {
      const absl::Time deadline = absl::Now() + absl::Seconds(120);
      long now = -1;
      while ((now = LastStep(run + "/loss")) < step && absl::Now() < deadline)
        absl::SleepFor(absl::Milliseconds(5));
      for (int h = 0; h < 2; ++h) bytes->push_back(InterfaceBytes(h));
      return now;
    };
    std::vector<double> first, last;
    const long s0 = at_step(10, &first), s1 = at_step(40, &last);
    for (int h = 0; h < 2; ++h) {
      EXPECT_EQ(procs[h].Wait(absl::Seconds(120), "host"), 0) << procs[h].Output();
    }
    EXPECT_EQ(Leftovers(token), 0);
    EXPECT_GT(s1, s0);
    double most = 0;
    for (int h = 0; h < 2; ++h) most = std::max(most, (last[h] - first[h]) / (s1 - s0));
    return most;
  }
};

// 4 workers a host pushing on their own move each key 4 times across the
// host's interface each way; summed on the host, once: a quarter, plus the
// framing and heartbeats both carry.
TEST_F(TwoHostsTest, EachHostsInterfaceCarriesAQuarterOfTheBytesWhenItsFourWorkersSumFirst) {
  const double alone = BytesPerStep(R"("local_aggregation": false)");
  const double summed = BytesPerStep(R"("local_aggregation": true)");
  std::printf("bytes across a host's interface per step: %.3g alone, %.3g summed (%.3f)\n", alone,
              summed, summed / alone);
  RecordProperty("bytes_per_step_alone", absl::StrCat(static_cast<long>(alone)));
  RecordProperty("bytes_per_step_summed", absl::StrCat(static_cast<long>(summed)));
  // Half of the 1 MiB model lives on the other host's server: 4 workers
  // push and pull it (4 MiB), and the other host's 4 do the same with this
  // host's half (4 MiB).
  EXPECT_GT(alone, 8e6);
  EXPECT_LT(summed, 0.3 * alone);
  EXPECT_GT(summed, 0.2 * alone);
}

class ThreeHostsTest : public NetnsJobTest {};

// Three hosts of three workers: every host sums first, the job learns the
// known solution and every rank ends with the same weights.
TEST_F(ThreeHostsTest, ThreeHostsOfThreeWorkersSummingFirstLearnWithEveryRankEqual) {
  for (int h = 0; h < 3; ++h) {
    StartPsrtRun(
        h,
        absl::StrCat("--hosts=", IpHosts(), " --current-host=", h,
                     R"( --distribution='{"parameter_server": {"enabled": true, )",
                     R"("workers_per_host": 3, "partition_bytes": 4096}}')"),
        absl::StrCat(kBin, "/psrt-example-linreg --dim=2048 --steps=300 --result=", dir_, "/r"));
  }
  const std::vector<int> codes = WaitAll(absl::Seconds(180));
  const std::string out = Output();
  EXPECT_EQ(codes, std::vector<int>(3, 0)) << out;
  EXPECT_TRUE(absl::StrContains(HostOutput(0), "on 9 workers (each host summing first)")) << out;
  ExpectLearned();
  const std::string w0 = ReadFile(dir_ + "/r.rank0.weights");
  ASSERT_EQ(w0.size(), 2049 * 4u);
  for (int r = 1; r < 9; ++r) {
    EXPECT_TRUE(ReadFile(absl::StrCat(dir_, "/r.rank", r, ".weights")) == w0) << "rank " << r;
  }
  ExpectNothingLeft();
}

}  // namespace
}  // namespace psrt
