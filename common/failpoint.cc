#include "common/failpoint.h"

#include <unistd.h>

#include <cstdlib>
#include <string>

#include "common/logging.h"

namespace psrt {

void Failpoint(absl::string_view name) {
  static const char* const spec = std::getenv("PSRT_FAILPOINT");
  if (spec == nullptr || *spec == '\0') return;
  const absl::string_view s(spec);
  const size_t at = s.find('@');
  if (s.substr(0, at) != name) return;
  if (at != absl::string_view::npos && s.substr(at + 1) != ProcessLogName()) return;
  LogError("failpoint ", name, " reached: ending the process now (PSRT_FAILPOINT)");
  _exit(86);
}

}  // namespace psrt
