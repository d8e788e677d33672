// A psrt job from Slurm's environment: `srun --ntasks-per-node=1 psrt-run`
// (by hand or in an sbatch script) runs psrt-run once on every node of the
// step, and each takes the job's hosts, its own index and the GPUs of its
// node from the variables slurmd gives the task.

#ifndef PSRT_COMMON_SLURM_H_
#define PSRT_COMMON_SLURM_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/cluster.h"

namespace psrt {

// Expands a Slurm host list such as "gpu-[01-04,07]" or "n[1-2],login" into
// its names, in order: a bracket holds numbers and ranges, a range keeps the
// zero padding of its first number, and several brackets in one name give
// every combination ("r[1-2]n[1-2]"). Bad input (unbalanced or nested
// brackets, reversed ranges, empty items, non-digits in a bracket,
// duplicates, more than 65536 names) is an InvalidArgumentError naming it.
absl::StatusOr<std::vector<std::string>> ExpandSlurmHostList(absl::string_view list);

// Expands Slurm's per-node counts such as "2(x3),1" (SLURM_TASKS_PER_NODE's
// form) into one count per node: {2, 2, 2, 1}.
absl::StatusOr<std::vector<int>> ExpandSlurmCounts(absl::string_view counts);

// True when the environment is a Slurm job's (SLURM_JOB_ID is set).
bool InSlurmJob(const std::function<const char*(const char*)>& getenv_fn);

// The cluster of the Slurm job this process runs in (source "Slurm").
//  - In a step (SLURM_STEP_ID is set; srun's tasks): the hosts are
//    SLURM_STEP_NODELIST's, this host is SLURMD_NODENAME (else SLURM_NODEID)
//    and the step must run one task on each node
//    (SLURM_STEP_TASKS_PER_NODE): psrt-run starts its node's training
//    processes itself, so several tasks of a node would be several jobs.
//  - Outside a step (the batch script, on the allocation's first node): a
//    one-node allocation is that node; with several nodes psrt-run would
//    train on this node alone, so it is an error that says to use srun.
// gpus_per_host is SLURM_GPUS_ON_NODE (0 when not set).
// Errors are InvalidArgumentError naming the variable and what is wrong.
absl::StatusOr<ClusterSpec> ClusterFromSlurm(
    const std::function<const char*(const char*)>& getenv_fn);

}  // namespace psrt

#endif  // PSRT_COMMON_SLURM_H_
