#include "tests/integration/job_util.h"

#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/process.h"

namespace psrt {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

namespace {

// The folders TempDir made, removed as the test program ends with every
// test passed; a failure's are kept to look into.
class TempDirs {
 public:
  ~TempDirs() {
    if (!::testing::UnitTest::GetInstance()->Passed()) return;
    std::error_code ignored;
    for (const std::string& dir : dirs_) std::filesystem::remove_all(dir, ignored);
  }
  void Add(const std::string& dir) {
    std::lock_guard<std::mutex> lock(mu_);
    dirs_.push_back(dir);
  }

 private:
  std::mutex mu_;
  std::vector<std::string> dirs_;
};

TempDirs temp_dirs;

}  // namespace

std::string TempDir() {
  char dir[] = "/tmp/psrt-test-XXXXXX";
  if (mkdtemp(dir) == nullptr) return "/tmp";
  temp_dirs.Add(dir);
  return dir;
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

std::vector<pid_t> JobProcesses(const std::string& token) {
  std::vector<pid_t> out;
  const std::string needle = "PSRT_JOB_TOKEN=" + token;
  DIR* d = opendir("/proc");
  while (dirent* e = d ? readdir(d) : nullptr) {
    const pid_t pid = std::atoi(e->d_name);
    if (pid <= 0) continue;
    const std::string env = ReadFile(absl::StrCat("/proc/", pid, "/environ"));
    for (absl::string_view kv : absl::StrSplit(env, '\0')) {
      if (kv == needle) {
        // A zombie has left the job already; only running ones count.
        const std::string stat = ReadFile(absl::StrCat("/proc/", pid, "/stat"));
        if (stat.find(") Z") == std::string::npos) out.push_back(pid);
        break;
      }
    }
  }
  if (d) closedir(d);
  return out;
}

std::string CmdLine(pid_t pid) {
  std::string s = ReadFile(absl::StrCat("/proc/", pid, "/cmdline"));
  for (char& c : s) {
    if (c == '\0') c = ' ';
  }
  return s;
}

pid_t FindJobProcess(const std::string& token, const std::function<bool(pid_t)>& match) {
  for (pid_t p : JobProcesses(token)) {
    if (match(p)) return p;
  }
  return 0;
}

pid_t ServerProcess(const std::string& token, int index) {
  return FindJobProcess(token, [&](pid_t p) {
    const std::string cmd = CmdLine(p);
    return cmd.find("psrt-server") != std::string::npos &&
           cmd.find(absl::StrCat("--index=", index, " ")) != std::string::npos;
  });
}

int Leftovers(const std::string& token) {
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  std::vector<pid_t> left;
  while (!(left = JobProcesses(token)).empty() && absl::Now() < deadline)
    absl::SleepFor(absl::Milliseconds(100));
  for (pid_t p : left) kill(p, SIGKILL);
  return static_cast<int>(left.size());
}

std::string SharedResult(const std::string& key, const std::function<std::string()>& make) {
  std::string identity = key;
  for (const char* program :
       {"psrt-run", "psrt-coordinator", "psrt-server", "psrt-worker", "psrt-example-linreg"}) {
    const std::string path = absl::StrCat(kBin, "/", program);
    struct stat st {};
    if (stat(path.c_str(), &st) != 0) return make();  // not a build we can name: no sharing
    absl::StrAppend(&identity, "\n", path, " ", st.st_size, " ", st.st_mtim.tv_sec, ".",
                    st.st_mtim.tv_nsec);
  }
  const std::string dir = "/tmp/psrt-shared-results";
  mkdir(dir.c_str(), 0755);
  const std::string path =
      absl::StrCat(dir, "/", std::hash<std::string>()(identity), "-", identity.size());
  // The identity is kept beside the result, so a hash collision is seen.
  std::string kept = ReadFile(path);
  const size_t end = kept.find('\0');
  if (end != std::string::npos && kept.compare(0, end, identity) == 0) return kept.substr(end + 1);
  const std::string made = make();
  if (made.empty()) return made;
  // Written aside and renamed: cases running at once each see a whole file.
  const std::string part = absl::StrCat(path, ".", getpid());
  std::ofstream out(part, std::ios::binary);
  out << identity << '\0' << made;
  out.close();
  if (!out || std::rename(part.c_str(), path.c_str()) != 0) std::remove(part.c_str());
  return made;
}

}  // namespace psrt
