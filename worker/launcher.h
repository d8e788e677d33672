#ifndef PSRT_WORKER_LAUNCHER_H_
#define PSRT_WORKER_LAUNCHER_H_

#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/cluster.h"
#include "common/distribution.h"
#include "psrt/v1/coordinator.pb.h"

namespace psrt {

struct LaunchOptions {
  std::string distribution;  // the JSON as given, handed to the coordinator
  PsOptions ps;              // the same, parsed
  ClusterSpec cluster;
  // > 0: simulate this many hosts on this machine over loopback and start
  // every process of the job here.
  int local_hosts = 0;
  int coordinator_port = 7070;
  std::string token;
  std::string bin_dir;  // where psrt-server, psrt-coordinator, psrt-worker are
  std::vector<std::string> command;
  int metrics_port = -1;  // coordinator's; servers pick free ports when >= 0
  // What this host's servers announce to the job (an address or a name);
  // empty: its name in `cluster`.
  std::string advertise_address;
  // What a SIGTERM or SIGINT leaves for the job's final checkpoint before
  // its processes are stopped (SageMaker's stop allows 30 s).
  absl::Duration stop_grace = absl::Seconds(30);
  // Host 0 also writes the job's summary here as JSON (empty: not written).
  std::string summary_json;
  // This machine's GPUs, handed out one per training process
  // (common/gpus.h); empty: training processes see what psrt-run sees.
  std::vector<std::string> gpus;
  // Each line a training process prints starts with "[RANK]<stdout>:" or
  // "[RANK]<stderr>:" (lines are whole either way).
  bool tag_output = false;
};

// What RunLauncher would start, for `psrt-run --dry-run`: the hosts, the
// coordinator, every server with its address and port, every training
// process with its ranks and command, the programs it would run, and the
// consistency, recovery, checkpoint and restore settings.
std::string DescribeLaunch(const LaunchOptions& options);

// The job's summary from the coordinator's last status (its workers' totals
// as of their last heartbeats) and psrt-run's wall time: one line of text,
// and the same figures, with each worker's, as JSON.
struct JobSummary {
  std::string line;
  std::string json;
};
JobSummary SummarizeJob(const v1::JobStatusResponse& status, absl::Duration wall);

// Starts this host's share of the job (host 0 also runs the coordinator; in
// local mode, every host's share), waits for it to end, and prints why it
// failed and every process that died. Returns 0 when the job succeeded.
int RunLauncher(const LaunchOptions& options);

}  // namespace psrt

#endif  // PSRT_WORKER_LAUNCHER_H_
