// Small helpers the C++ benchmarks share: reading their jobs' files and the
// machine's load for their reports.
#ifndef PSRT_BENCHMARKS_BENCH_UTIL_H_
#define PSRT_BENCHMARKS_BENCH_UTIL_H_

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

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

// A comma-separated list of whole numbers in [lo, hi] ("4,8,16"); the error
// names the first that is not one.
inline absl::StatusOr<std::vector<int>> ParseCounts(absl::string_view text, int lo, int hi) {
  std::vector<int> counts;
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    int n = 0;
    if (!absl::SimpleAtoi(item, &n) || n < lo || n > hi) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", item, "' is no whole number in ", lo, "..", hi));
    }
    counts.push_back(n);
  }
  return counts;
}

}  // namespace psrt

#endif  // PSRT_BENCHMARKS_BENCH_UTIL_H_
