#ifndef PSRT_SERVER_CHECKPOINT_AWS_CREDENTIAL_PROCESS_H_
#define PSRT_SERVER_CHECKPOINT_AWS_CREDENTIAL_PROCESS_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace psrt {

// Runs a profile's credential_process through /bin/sh and returns what it
// wrote to stdout. Killed (its whole process group) at the deadline; a
// non-zero exit is an error with its stderr's start.
absl::StatusOr<std::string> RunCredentialProcess(absl::string_view command, absl::Duration timeout);

}  // namespace psrt

#endif  // PSRT_SERVER_CHECKPOINT_AWS_CREDENTIAL_PROCESS_H_
