#include "common/daemon.h"

#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "common/grpc_util.h"
#include "common/logging.h"

namespace psrt {

void InitProcess(const std::string& log_name) {
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

void HandleSignals(std::function<void(int)> on_signal) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::thread([set, on_signal = std::move(on_signal)] {
    while (true) {
      int sig = 0;
      if (sigwait(&set, &sig) == 0) on_signal(sig);
    }
  }).detach();
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
