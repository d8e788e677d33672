// Small helpers the C++ benchmarks share: reading their jobs' files and the
// machine's load for their reports.
#ifndef PSRT_BENCHMARKS_BENCH_UTIL_H_
#define PSRT_BENCHMARKS_BENCH_UTIL_H_

#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"

namespace psrt {

// The whole file; empty when it cannot be read.
inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The last `max_chars` of `text`, marked as cut.
inline std::string Tail(const std::string& text, size_t max_chars) {
  return text.size() <= max_chars ? text : "..." + text.substr(text.size() - max_chars);
}

// The 1-, 5- and 15-minute load averages.
inline std::string LoadAverage() {
  std::istringstream in(ReadFile("/proc/loadavg"));
  std::string one, five, fifteen;
  in >> one >> five >> fifteen;
  return absl::StrCat(one, " ", five, " ", fifteen);
}

}  // namespace psrt

#endif  // PSRT_BENCHMARKS_BENCH_UTIL_H_
