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
  // Whether this agent also runs the host's psrt-servers (as psrt-run has
  // it), so that a recovery can restart them; with where they listen and
  // what they announce.
  bool servers = false;
  std::string server_host;  // empty: `host`
  std::string server_bind = "0.0.0.0";
  int server_metrics_port = -1;
  // The GPUs this host's training processes use, one each by local rank
  // (CUDA_VISIBLE_DEVICES; common/gpus.h); empty: their environment's.
  std::vector<std::string> gpus;
  // Training processes' output reaches this agent's stdout and stderr in
  // whole lines (common/output_relay.h); with tag_output each line starts
  // with "[RANK]<stdout>:" or "[RANK]<stderr>:".
  bool tag_output = false;
};

// psrt-worker's job on one host: start the host's training processes (and
// with `servers` its psrt-servers) with their rank and the job's addresses,
// report each one's exit to the coordinator, forward signals, stop them when
// the job fails, and start them all again when a recovery begins a new
// generation. Returns the agent's exit code: 0 when the job succeeded.
int RunAgent(const AgentOptions& options);

}  // namespace psrt

#endif  // PSRT_WORKER_AGENT_H_
