// A fixture for jobs across network-namespace hosts (netns_hosts.h): a
// psrt-run (or whatever starts a host) per host, their output in files, and
// checks that every process of the job is gone at the end.
#ifndef PSRT_TESTS_MULTIHOST_NETNS_JOB_H_
#define PSRT_TESTS_MULTIHOST_NETNS_JOB_H_

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "tests/integration/job_util.h"
#include "tests/multihost/netns_hosts.h"

namespace psrt {

class NetnsJobTest : public ::testing::Test {
 public:
  static constexpr int kHosts = 3;

 protected:

  // How many hosts SetUp makes; a test of a manifest with more overrides it.
  virtual int NumHosts() const { return kHosts; }
  void SetUp() override;
  void TearDown() override;

  // Runs `command` (through the shell) in host h; its output goes to
  // dir_/hostH.log. Hosts may be started in any order, each once.
  void StartHost(int h, const std::string& command);
  // psrt-run on host h with the job's token, `flags` and the training
  // command after "--".
  void StartPsrtRun(int h, const std::string& flags, const std::string& training);
  // Waits (bounded) for every started host's command; their exit codes in
  // host order.
  std::vector<int> WaitAll(absl::Duration timeout);
  // The hosts by IP, as --hosts takes them: "10.213.0.1,10.213.0.2,...".
  std::string IpHosts() const;
  // Every host's output, in host order.
  std::string Output() const;
  const std::string& HostOutputPath(int h) const { return runs_[h].log; }
  std::string HostOutput(int h) const { return runs_[h].Output(); }
  // Every process of the job, on every host, exits within a bound.
  void ExpectNothingLeft();
  // psrt-example-linreg run with --result=dir_/r learned: rank 0's relative
  // error is under 5%.
  void ExpectLearned() const;

  std::unique_ptr<NetnsHosts> hosts_;
  std::string dir_, token_;
  std::vector<Proc> runs_;  // by host; pid 0 where not started
  // The interpreter of the repository's .venv (the plugins, psrt-sagemaker
  // and the deploy/ tools).
  const std::string python_ = std::string(PSRT_SOURCE_DIR) + "/.venv/bin/python";
};

}  // namespace psrt

#endif  // PSRT_TESTS_MULTIHOST_NETNS_JOB_H_
