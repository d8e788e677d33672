#include "server/checkpoint/aws_credential_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"

extern char** environ;

namespace psrt {
namespace {

constexpr size_t kMaxOutput = 1 << 20;

// Reads both pipes until both close or the deadline; false at the deadline.
bool Drain(int out_fd, int err_fd, absl::Time deadline, std::string* out, std::string* err) {
  pollfd fds[2] = {{out_fd, POLLIN, 0}, {err_fd, POLLIN, 0}};
  std::string* sinks[2] = {out, err};
  int open = 2;
  char buffer[4096];
  while (open > 0) {
    const int64_t left = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (left <= 0) return false;
    const int ready = poll(fds, 2, static_cast<int>(std::min<int64_t>(left, 1000)));
    if (ready < 0 && errno != EINTR) return false;
    for (int i = 0; i < 2 && ready > 0; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      const ssize_t n = read(fds[i].fd, buffer, sizeof(buffer));
      if (n > 0) {
        if (sinks[i]->size() < kMaxOutput) sinks[i]->append(buffer, n);
      } else if (n == 0 || errno != EINTR) {
        fds[i].fd = -1;
        --open;
      }
    }
  }
  return true;
}

}  // namespace

absl::StatusOr<std::string> RunCredentialProcess(absl::string_view command,
                                                 absl::Duration timeout) {
  const std::string what = absl::StrCat("credential_process '", command, "'");
  int out_pipe[2], err_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat(what, ": pipe: ", strerror(errno)));
  }
  if (pipe2(err_pipe, O_CLOEXEC) != 0) {
    close(out_pipe[0]);
    close(out_pipe[1]);
    return absl::InternalError(absl::StrCat(what, ": pipe: ", strerror(errno)));
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, out_pipe[1], 1);
  posix_spawn_file_actions_adddup2(&actions, err_pipe[1], 2);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  // Its own process group, so the deadline stops what the shell started too.
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attr, 0);
  const std::string cmd(command);
  const char* argv[] = {"/bin/sh", "-c", cmd.c_str(), nullptr};
  pid_t pid = 0;
  const int rc =
      posix_spawn(&pid, "/bin/sh", &actions, &attr, const_cast<char* const*>(argv), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  close(out_pipe[1]);
  close(err_pipe[1]);
  std::string out, err;
  bool finished = false;
  if (rc == 0) {
    finished = Drain(out_pipe[0], err_pipe[0], absl::Now() + timeout, &out, &err);
    if (!finished) kill(-pid, SIGKILL);
  }
  close(out_pipe[0]);
  close(err_pipe[0]);
  if (rc != 0) {
    return absl::InternalError(absl::StrCat(what, ": cannot start /bin/sh: ", strerror(rc)));
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!finished) {
    return absl::DeadlineExceededError(
        absl::StrCat(what, " did not finish within ", absl::FormatDuration(timeout)));
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " failed (",
                     WIFEXITED(status) ? absl::StrCat("exit code ", WEXITSTATUS(status))
                                       : absl::StrCat("signal ", WTERMSIG(status)),
                     "): ", absl::StripAsciiWhitespace(err.substr(0, 300))));
  }
  return out;
}

}  // namespace psrt
