#include "common/process.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <climits>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace psrt {
namespace {

Exit Describe(pid_t pid, int status) {
  Exit e;
  e.pid = pid;
  if (WIFEXITED(status)) {
    e.code = WEXITSTATUS(status);
    e.description = absl::StrCat("exited with code ", e.code);
  } else if (WIFSIGNALED(status)) {
    e.code = 128 + WTERMSIG(status);
    e.description = DescribeExitCode(e.code);
  } else {
    e.code = 1;
    e.description = "ended in an unknown way";
  }
  return e;
}

}  // namespace

std::string DescribeExitCode(int code) {
  if (code <= 128 || code >= 128 + NSIG) return absl::StrCat("exited with code ", code);
  return absl::StrCat("killed by signal ", code - 128, " (", strsignal(code - 128), ")");
}

absl::StatusOr<pid_t> Spawn(const std::vector<std::string>& argv,
                            const std::map<std::string, std::string>& env, bool own_process_group,
                            ChildStdio stdio) {
  if (argv.empty()) return absl::InvalidArgumentError("no command to start");
  // Build everything before fork: only async-signal-safe calls after it.
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string kv = *e;
    std::string key = kv.substr(0, kv.find('='));
    if (env.count(key) == 0) env_strings.push_back(kv);
  }
  for (const auto& [k, v] : env) env_strings.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (std::string& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  int pipefd[2];
  if (pipe2(pipefd, O_CLOEXEC) != 0)
    return absl::InternalError(absl::StrCat("pipe: ", strerror(errno)));
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    close(pipefd[0]);
    close(pipefd[1]);
    return absl::InternalError(absl::StrCat("fork: ", strerror(errno)));
  }
  if (pid == 0) {
    sigset_t all;
    sigemptyset(&all);
    sigprocmask(SIG_SETMASK, &all, nullptr);
    signal(SIGPIPE, SIG_DFL);
    if (own_process_group) setpgid(0, 0);
    // dup2 clears close-on-exec on the copy.
    if (stdio.out >= 0 && dup2(stdio.out, STDOUT_FILENO) < 0) _exit(127);
    if (stdio.err >= 0 && dup2(stdio.err, STDERR_FILENO) < 0) _exit(127);
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(127);
    execvpe(args[0], args.data(), envp.data());
    int err = errno;
    ssize_t ignored = write(pipefd[1], &err, sizeof(err));
    (void)ignored;
    _exit(127);
  }
  close(pipefd[1]);
  int err = 0;
  ssize_t n;
  do {
    n = read(pipefd[0], &err, sizeof(err));
  } while (n < 0 && errno == EINTR);
  close(pipefd[0]);
  if (n == sizeof(err)) {
    waitpid(pid, nullptr, 0);
    return absl::NotFoundError(absl::StrCat("cannot start '", argv[0], "': ", strerror(err)));
  }
  return pid;
}

std::vector<Exit> ReapExited() {
  std::vector<Exit> out;
  while (true) {
    int status = 0;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid <= 0) break;
    out.push_back(Describe(pid, status));
  }
  return out;
}

std::vector<Exit> Terminate(const std::vector<pid_t>& pids, absl::Duration grace) {
  std::vector<Exit> out;
  std::vector<pid_t> left = pids;
  for (pid_t p : left) kill(p, SIGTERM);
  const absl::Time deadline = absl::Now() + grace;
  while (!left.empty()) {
    for (auto it = left.begin(); it != left.end();) {
      int status = 0;
      pid_t r = waitpid(*it, &status, WNOHANG);
      if (r == *it) {
        out.push_back(Describe(r, status));
        it = left.erase(it);
      } else if (r < 0) {
        it = left.erase(it);  // not our child any more
      } else {
        ++it;
      }
    }
    if (left.empty()) break;
    if (absl::Now() > deadline) {
      for (pid_t p : left) kill(p, SIGKILL);
      for (pid_t p : left) {
        int status = 0;
        if (waitpid(p, &status, 0) == p) out.push_back(Describe(p, status));
      }
      break;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return out;
}

std::string SelfDirectory() {
  char buf[PATH_MAX] = {};
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ".";
  std::string path(buf, n);
  return path.substr(0, path.rfind('/'));
}

}  // namespace psrt
