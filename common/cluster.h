// Which hosts a job runs on and which of them this process is on.
//
// The same binary is started by hand (--hosts), by SageMaker (SM_HOSTS and
// SM_CURRENT_HOST), by TensorFlow-style launchers (TF_CONFIG) and by Slurm's
// srun (SLURM_STEP_NODELIST, common/slurm.h), so all four are understood; a
// process started with none of them runs alone on "localhost".

#ifndef PSRT_COMMON_CLUSTER_H_
#define PSRT_COMMON_CLUSTER_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace psrt {

struct ClusterSpec {
  // Distinct host names, in the same order on every host so that indices
  // agree across the job.
  std::vector<std::string> hosts;
  // Index into `hosts` of the host this process runs on.
  int current = 0;
  // Where the spec came from: "--hosts", "SM_HOSTS", "TF_CONFIG", "Slurm" or
  // "local".
  std::string source;
  // GPUs a host has for the job as the environment says (Slurm's
  // SLURM_GPUS_ON_NODE); 0: it does not say.
  int gpus_per_host = 0;
};

// Resolves the cluster, first match wins:
//  1. flag_hosts: comma-separated "h1,h2". flag_current is a host name or a
//     0-based index; it may be omitted only when there is a single host.
//  2. SM_HOSTS (JSON list of host names) with SM_CURRENT_HOST.
//  3. TF_CONFIG: {"cluster": {"chief": [...], "worker": [...], "ps": [...]},
//     "task": {"type": ..., "index": ...}}. hosts are the distinct host names
//     (":port" stripped) of the chief, worker and ps entries in that order;
//     current is the host of the task.
//  4. Slurm, when SLURM_JOB_ID is set: the step's nodes (ClusterFromSlurm in
//     common/slurm.h). After the others because Slurm sets its variables for
//     every process of a job while the others are set on purpose; a Slurm
//     environment that cannot give a job of its nodes is an error rather than
//     a job of this host alone.
//  5. {"localhost"}, current 0, unless CheckNotOneOfSeveral objects.
// Environment variables set to an empty string count as unset. flag_current
// without flag_hosts is an error rather than being silently ignored.
// getenv_fn is injected so tests need not touch the process environment; an
// empty std::function means std::getenv.
// Errors are InvalidArgumentError naming the source and the problem.
// An InvalidArgumentError where the environment says this process is one of
// several that a launcher started for one job, each of which would train a
// job of its own if it ran alone: a Slurm step of several nodes (or one
// ClusterFromSlurm refuses), several MPI processes (OMPI_COMM_WORLD_SIZE,
// PMI_SIZE or PMIX_SIZE > 1). psrt-run --local checks it.
absl::Status CheckNotOneOfSeveral(
    const std::function<const char*(const char*)>& getenv_fn);

absl::StatusOr<ClusterSpec> ResolveCluster(
    absl::string_view flag_hosts, absl::string_view flag_current,
    const std::function<const char*(const char*)>& getenv_fn);

}  // namespace psrt

#endif  // PSRT_COMMON_CLUSTER_H_
