#ifndef PSRT_COMMON_LOGGING_H_
#define PSRT_COMMON_LOGGING_H_

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace psrt {

// Names this process in every log line ("psrt-server[1]").
void SetLogName(absl::string_view name);
std::string ProcessLogName();

// Writes one line to stderr: UTC time, process name, level, message. One
// write(2) per line so lines of concurrent processes never interleave.
void LogLine(char level, absl::string_view message);
// Drops every line from now on (fuzz targets: millions of refused inputs).
void SilenceLogs();

template <typename... Args>
void LogInfo(const Args&... args) {
  LogLine('I', absl::StrCat(args...));
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
