#ifndef PSRT_COMMON_DAEMON_H_
#define PSRT_COMMON_DAEMON_H_

#include <functional>
#include <string>

#include "absl/time/time.h"

namespace psrt {

// Start-up every psrt daemon shares: log name, SIGPIPE off, TuneForDataPath,
// and the transport security (exits with status 2 naming what is wrong).
void InitProcess(const std::string& log_name);

// Process-wide settings for the data path. glibc keeps freed buffers (up
// to 32 MiB each) for reuse instead of returning them to the kernel: fresh
// pages cost far more than the copy into them. Abseil's mutex deadlock
// detection, on in Debian's build, is turned off: it updates a lock graph on
// every lock (about 1% of a small round trip's CPU). Training processes call
// it through the client.
void TuneForDataPath();

// Blocks SIGINT, SIGTERM and SIGHUP in every thread started afterwards and
// calls `on_signal` with the signal number from a thread of its own. Call it
// before starting any thread. With a finite `exit_within`, a process still
// running that long after the first signal says so and exits (status 1)
// there and then: a peer that hangs must not keep a daemon from stopping.
void HandleSignals(std::function<void(int)> on_signal,
                   absl::Duration exit_within = absl::InfiniteDuration());

// Whether the process that started this one has ended since InitProcess
// (this one was re-parented): a SIGTERM then is its PR_SET_PDEATHSIG.
bool ParentGone();

// The value of environment variable `name`, or `fallback`.
std::string EnvOr(const char* name, const std::string& fallback);

// This machine's host name.
std::string HostName();

}  // namespace psrt

#endif  // PSRT_COMMON_DAEMON_H_
