#include "tests/integration/job_util.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "absl/time/clock.h"
#include "common/process.h"

namespace psrt {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string TempDir() {
  char dir[] = "/tmp/psrt-test-XXXXXX";
  return mkdtemp(dir) ? dir : "/tmp";
}

Proc Proc::Start(const std::string& cmd, const std::string& log) {
  Proc p;
  p.log = log;
  auto pid = Spawn({"/bin/sh", "-c", "exec " + cmd + " >" + log + " 2>&1"}, {});
  EXPECT_TRUE(pid.ok()) << pid.status();
  p.pid = pid.ok() ? *pid : 0;
  return p;
}

int Proc::Wait(absl::Duration timeout, const std::string& what) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      return code;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  ADD_FAILURE() << what << " did not end within " << absl::FormatDuration(timeout) << "; output:\n"
                << ReadFile(log);
  return -1;
}

bool Proc::WaitForOutput(const std::string& text, absl::Duration timeout) const {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (Output().find(text) != std::string::npos) return true;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return false;
}

}  // namespace psrt
