#include "common/logging.h"

#include <unistd.h>

#include <atomic>
#include <string>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace psrt {
namespace {
absl::Mutex name_mu;
std::atomic<bool> silenced{false};
std::string& LogName() {
  static auto* name = new std::string("psrt");
  return *name;
}
}  // namespace

void SetLogName(absl::string_view name) {
  absl::MutexLock lock(&name_mu);
  LogName() = std::string(name);
}

std::string ProcessLogName() {
  absl::MutexLock lock(&name_mu);
  return LogName();
}

void SilenceLogs() { silenced = true; }

void LogLine(char level, absl::string_view message) {
  if (silenced.load(std::memory_order_relaxed)) return;
  const std::string name = ProcessLogName();
  std::string line = absl::StrCat(
      absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(), absl::UTCTimeZone()),
      " ", name, " ", std::string(1, level), " ", message, "\n");
  // Best effort: a full or closed stderr must not take the daemon down.
  ssize_t ignored = write(STDERR_FILENO, line.data(), line.size());
  (void)ignored;
}

}  // namespace psrt
