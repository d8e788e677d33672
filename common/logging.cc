#include "common/logging.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <string>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace psrt {
namespace {
absl::Mutex name_mu;
std::atomic<bool> silenced{false};
std::atomic<int> level{-1};  // -1: not set; PSRT_LOG_LEVEL's on first use
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

absl::StatusOr<LogLevel> ParseLogLevel(absl::string_view text) {
  for (LogLevel l : {LogLevel::kError, LogLevel::kWarning, LogLevel::kInfo, LogLevel::kDebug}) {
    if (text == LogLevelName(l)) return l;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("'", text, "' is no log level: error, warning, info or debug"));
}

const char* LogLevelName(LogLevel l) {
  switch (l) {
    case LogLevel::kError:
      return "error";
    case LogLevel::kWarning:
      return "warning";
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kDebug:
      return "debug";
  }
  return "warning";
}

absl::StatusOr<LogLevel> LogLevelFromEnv() {
  const char* env = std::getenv("PSRT_LOG_LEVEL");
  if (env == nullptr || *env == '\0') return LogLevel::kWarning;
  absl::StatusOr<LogLevel> l = ParseLogLevel(env);
  if (!l.ok())
    return absl::InvalidArgumentError(absl::StrCat("PSRT_LOG_LEVEL: ", l.status().message()));
  return l;
}

void SetLogLevel(LogLevel l) { level.store(static_cast<int>(l), std::memory_order_relaxed); }

LogLevel CurrentLogLevel() {
  int l = level.load(std::memory_order_relaxed);
  if (l < 0) {
    // Programs refuse a bad PSRT_LOG_LEVEL at their flags, the client
    // library at ClientOptions::FromEnv; a library call before either
    // still logs, at the default.
    l = static_cast<int>(LogLevelFromEnv().value_or(LogLevel::kWarning));
    int unset = -1;
    level.compare_exchange_strong(unset, l, std::memory_order_relaxed);
  }
  return static_cast<LogLevel>(l);
}

void LogLine(char severity, absl::string_view message) {
  if (silenced.load(std::memory_order_relaxed)) return;
  const LogLevel shown = severity == 'E'                      ? LogLevel::kError
                         : severity == 'W' || severity == 'N' ? LogLevel::kWarning
                         : severity == 'I'                    ? LogLevel::kInfo
                                                              : LogLevel::kDebug;
  if (CurrentLogLevel() < shown) return;
  const std::string name = ProcessLogName();
  std::string line =
      absl::StrCat(absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(), absl::UTCTimeZone()), " ",
                   name, " ", std::string(1, severity), " ", message, "\n");
  // Best effort: a full or closed stderr must not take the daemon down.
  ssize_t ignored = write(STDERR_FILENO, line.data(), line.size());
  (void)ignored;
}

}  // namespace psrt
