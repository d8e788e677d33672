#ifndef PSRT_COMMON_LOGGING_H_
#define PSRT_COMMON_LOGGING_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace psrt {

// How much a process says. The default is kWarning, as Horovod's and
// BytePS's: a job's output is the training script's, plus psrt's warnings,
// errors and psrt-run's few notices (the job started, the job ended and
// why). kInfo adds every process's start and exit, membership epochs and
// the like; kDebug more still. PSRT_LOG_LEVEL sets it for a process (psrt-run
// passes its own level to every process of the job that way); a program's
// --log-level or --verbose (common/flags.h) overrides that.
enum class LogLevel { kError = 0, kWarning = 1, kInfo = 2, kDebug = 3 };
// "error", "warning", "info" or "debug"; INVALID_ARGUMENT naming them.
absl::StatusOr<LogLevel> ParseLogLevel(absl::string_view text);
const char* LogLevelName(LogLevel level);
// PSRT_LOG_LEVEL's level, kWarning where it is unset or empty;
// INVALID_ARGUMENT naming the variable where it names no level.
absl::StatusOr<LogLevel> LogLevelFromEnv();
void SetLogLevel(LogLevel level);
// The level set, or else PSRT_LOG_LEVEL's (kWarning where that is invalid).
LogLevel CurrentLogLevel();

// Names this process in every log line ("psrt-server[1]").
void SetLogName(absl::string_view name);
std::string ProcessLogName();

// Writes one line to stderr: UTC time, process name, level, message, if
// CurrentLogLevel() shows `level` ('E', 'W', 'N': shown from kWarning on,
// 'I', 'D'). One write(2) per line so lines of concurrent processes never
// interleave.
void LogLine(char level, absl::string_view message);
// Drops every line from now on (fuzz targets: millions of refused inputs).
void SilenceLogs();

template <typename... Args>
void LogDebug(const Args&... args) {
  if (CurrentLogLevel() >= LogLevel::kDebug) LogLine('D', absl::StrCat(args...));
}
template <typename... Args>
void LogInfo(const Args&... args) {
  if (CurrentLogLevel() >= LogLevel::kInfo) LogLine('I', absl::StrCat(args...));
}
// psrt-run's own few lines: the job started, the job ended and why.
template <typename... Args>
void LogNotice(const Args&... args) {
  LogLine('N', absl::StrCat(args...));
}
template <typename... Args>
void LogWarning(const Args&... args) {
  LogLine('W', absl::StrCat(args...));
}
template <typename... Args>
void LogError(const Args&... args) {
  LogLine('E', absl::StrCat(args...));
}

}  // namespace psrt

#endif  // PSRT_COMMON_LOGGING_H_
