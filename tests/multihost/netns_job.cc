#include "tests/multihost/netns_job.h"

#include <signal.h>

#include <regex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/grpc_util.h"

namespace psrt {

void NetnsJobTest::SetUp() {
  absl::StatusOr<std::unique_ptr<NetnsHosts>> hosts = NetnsHosts::Create(NumHosts());
  if (!hosts.ok()) GTEST_SKIP() << hosts.status().message();
  hosts_ = *std::move(hosts);
  dir_ = TempDir();
  token_ = RandomToken();
  runs_.resize(NumHosts());
}

void NetnsJobTest::TearDown() {
  if (token_.empty()) return;
  for (pid_t p : JobProcesses(token_)) kill(p, SIGKILL);
}

void NetnsJobTest::StartHost(int h, const std::string& command) {
  ASSERT_EQ(runs_[h].pid, 0) << "host " << h << " started twice";
  runs_[h] = Proc::Start(hosts_->Exec(h) + command, absl::StrCat(dir_, "/host", h, ".log"));
}

void NetnsJobTest::StartPsrtRun(int h, const std::string& flags, const std::string& training) {
  StartHost(h, absl::StrCat(kBin, "/psrt-run --token=", token_, " ", flags, " -- ", training));
}

std::vector<int> NetnsJobTest::WaitAll(absl::Duration timeout) {
  std::vector<int> codes;
  for (int h = 0; h < hosts_->size(); ++h) {
    if (runs_[h].pid == 0) continue;
    codes.push_back(runs_[h].Wait(timeout, absl::StrCat("the command of host ", h)));
  }
  return codes;
}

std::string NetnsJobTest::IpHosts() const {
  std::vector<std::string> addresses;
  for (int h = 0; h < hosts_->size(); ++h) addresses.push_back(hosts_->address(h));
  return absl::StrJoin(addresses, ",");
}

std::string NetnsJobTest::Output() const {
  std::string all;
  for (int h = 0; h < hosts_->size(); ++h) {
    if (runs_[h].pid != 0) absl::StrAppend(&all, "--- host ", h, "\n", runs_[h].Output(), "\n");
  }
  return all;
}

void NetnsJobTest::ExpectLearned() const {
  const std::string result = ReadFile(dir_ + "/r.rank0.json");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(result, m, std::regex("\"relative_error\": ([-0-9.eE+]+)")))
      << result << Output();
  EXPECT_LT(std::stod(m[1]), 0.05) << result;
}

void NetnsJobTest::ExpectNothingLeft() {
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (!JobProcesses(token_).empty() && absl::Now() < deadline)
    absl::SleepFor(absl::Milliseconds(100));
  EXPECT_TRUE(JobProcesses(token_).empty()) << "processes of the job outlived it";
}

}  // namespace psrt
