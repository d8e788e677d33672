#ifndef PSRT_COMMON_FAILPOINT_H_
#define PSRT_COMMON_FAILPOINT_H_

#include "absl/strings/string_view.h"

namespace psrt {

// Crash drills. When the environment variable PSRT_FAILPOINT names this
// point ("checkpoint.manifest_written"), optionally for one process only
// ("checkpoint.shard_half_written@psrt-server[1]", the process's log name),
// the process logs it and ends at once with _exit(86): no destructors, no
// flushing, as if the machine had died there. Unset, a failpoint costs one
// cached comparison.
void Failpoint(absl::string_view name);

}  // namespace psrt

#endif  // PSRT_COMMON_FAILPOINT_H_
