#ifndef PSRT_COMMON_PROCESS_H_
#define PSRT_COMMON_PROCESS_H_

#include <sys/types.h>

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace psrt {

// Where a child's stdout and stderr go: these descriptors, or (-1) this
// process's.
struct ChildStdio {
  int out = -1;
  int err = -1;
};

// Starts `argv` with this process's environment plus `env`. The child dies
// with its parent (PR_SET_PDEATHSIG), so no process of a job outlives the one
// that started it, and gets default signal handling back. With
// `own_process_group` it leads a process group of its own, so a terminal's
// Ctrl-C (SIGINT to the foreground group) reaches the parent alone, which
// decides how its children stop. `stdio` becomes its stdout and stderr.
absl::StatusOr<pid_t> Spawn(const std::vector<std::string>& argv,
                            const std::map<std::string, std::string>& env,
                            bool own_process_group = false, ChildStdio stdio = {});

// One child that ended.
struct Exit {
  pid_t pid = 0;
  int code = 0;             // exit code, or 128 + signal
  std::string description;  // "exited with code 3", "killed by signal 9 (Killed)"
};

// "exited with code 3", or for codes above 128, "killed by signal 9 (Killed)".
std::string DescribeExitCode(int code);

// Reaps every child that has ended, without blocking.
std::vector<Exit> ReapExited();

// Sends SIGTERM to each pid still running, waits up to `grace` for them, then
// SIGKILLs the rest. Returns how they ended.
std::vector<Exit> Terminate(const std::vector<pid_t>& pids, absl::Duration grace);

// The directory holding this executable, to find sibling psrt programs.
std::string SelfDirectory();

}  // namespace psrt

#endif  // PSRT_COMMON_PROCESS_H_
