#include "common/daemon.h"

#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/grpc_util.h"
#include "common/logging.h"

namespace psrt {
namespace {

pid_t parent_at_start = 0;

}  // namespace

void InitProcess(const std::string& log_name) {
  parent_at_start = getppid();
  SetLogName(log_name);
  signal(SIGPIPE, SIG_IGN);
  TuneForDataPath();
  if (absl::Status s = InitTransportSecurity(); !s.ok()) {
    LogError("TLS: ", s.message());
    std::exit(2);
  }
}

void TuneForDataPath() {
  // Requests are at most 16 MiB and keys a few MiB: serve them from the heap
  // (reused) rather than fresh mmap'd pages, and do not hand freed memory back.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
}

void HandleSignals(std::function<void(int)> on_signal, absl::Duration exit_within) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::thread([set, on_signal = std::move(on_signal), exit_within] {
    bool armed = false;
    while (true) {
      int sig = 0;
      if (sigwait(&set, &sig) != 0) continue;
      if (!armed && exit_within != absl::InfiniteDuration()) {
        armed = true;
        std::thread([sig, exit_within] {
          absl::SleepFor(exit_within);
          LogError("still running ", absl::FormatDuration(exit_within), " after signal ", sig, " (",
                   strsignal(sig), "); exiting now");
          std::_Exit(1);
        }).detach();
      }
      on_signal(sig);
    }
  }).detach();
}

bool ParentGone() {
  if (parent_at_start == 0) return false;
  // PR_SET_PDEATHSIG fires as the thread that started this process exits;
  // the parent's other threads may still be ending then, keeping the
  // parent's pid, but its main thread is a zombie already (or about to be).
  auto gone = [] {
    if (getppid() != parent_at_start) return true;
    std::ifstream in("/proc/" + std::to_string(parent_at_start) + "/stat");
    std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t end = stat.rfind(')');
    if (end == std::string::npos || end + 2 >= stat.size()) return true;
    const char state = stat[end + 2];
    return state == 'Z' || state == 'X';
  };
  if (gone()) return true;
  absl::SleepFor(absl::Milliseconds(10));
  return gone();
}

std::string EnvOr(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::string(v) : fallback;
}

std::string HostName() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "localhost";
  return buf;
}

}  // namespace psrt
