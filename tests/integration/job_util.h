// Helpers for tests that run whole jobs: psrt-run and the programs as real
// processes, their output in files.
#ifndef PSRT_TESTS_INTEGRATION_JOB_UTIL_H_
#define PSRT_TESTS_INTEGRATION_JOB_UTIL_H_

#include <sys/types.h>

#include <functional>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace psrt {

// Where the programs are (the build's bin folder, or "." under Bazel).
inline const std::string kBin = PSRT_BIN_DIR;

std::string ReadFile(const std::string& path);
// A fresh directory under /tmp.
std::string TempDir();

// A command started through the shell with its output in a file.
struct Proc {
  pid_t pid = 0;
  std::string log;
  int code = -1;

  static Proc Start(const std::string& cmd, const std::string& log);
  // Waits for the exit; on timeout kills it and fails the test.
  int Wait(absl::Duration timeout, const std::string& what);
  std::string Output() const { return ReadFile(log); }
  bool WaitForOutput(const std::string& text, absl::Duration timeout) const;
};

// Pids of live processes whose environment carries this job's token.
std::vector<pid_t> JobProcesses(const std::string& token);
// A process's command line, arguments joined by spaces.
std::string CmdLine(pid_t pid);
// The live process of the job for which `match` holds, or 0.
pid_t FindJobProcess(const std::string& token, const std::function<bool(pid_t)>& match);
// The job's psrt-server of that index, or 0.
pid_t ServerProcess(const std::string& token, int index);
// Waits (bounded) for every process of the job to be gone; kills and
// returns those that are not.
int Leftovers(const std::string& token);

// What `make` returns (a job's result file, e.g. the weights of a job run
// without failures, which several cases compare with), made once per build
// of the programs: ctest runs each case in a process of its own, so the
// result is kept under /tmp, named by `key` (what `make` runs: its flags) and
// by the size and modification time of psrt-run, the daemons and the example
// trainer, and made again whenever one of them changes. `make` returns ""
// when it failed (and says so); that is not kept.
std::string SharedResult(const std::string& key, const std::function<std::string()>& make);

}  // namespace psrt

#endif  // PSRT_TESTS_INTEGRATION_JOB_UTIL_H_
