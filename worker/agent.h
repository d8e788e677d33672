#ifndef PSRT_WORKER_AGENT_H_
#define PSRT_WORKER_AGENT_H_

#include <string>
#include <vector>

#include "absl/time/time.h"

namespace psrt {

struct AgentOptions {
  std::string coordinator;
  std::string token;
  int host_index = 0;
  std::string host;
  std::vector<std::string> command;  // the training program and its arguments
  absl::Duration connect_timeout = absl::Seconds(60);
  absl::Duration kill_grace = absl::Seconds(5);
};

// psrt-worker's job on one host: start the host's training processes with
// their rank and the job's addresses in the environment, report each one's
// exit to the coordinator, forward signals, and stop them when the job
// fails. Returns the agent's exit code: 0 when the job succeeded.
int RunAgent(const AgentOptions& options);

}  // namespace psrt

#endif  // PSRT_WORKER_AGENT_H_
