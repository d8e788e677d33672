#ifndef PSRT_SERVER_JOB_PHASE_H_
#define PSRT_SERVER_JOB_PHASE_H_

#include <string>

#include "absl/status/status.h"
#include "psrt/v1/coordinator.pb.h"

namespace psrt {

// Where a Job (server/job.h) is in its life: one value, changed only along
// the transitions JobPhaseAllows lists:
//   starting -> running (every process is there), recovering, finishing, succeeded
//   running -> pausing checkpoints (or checkpoints paused, with none armed),
//              recovering, stopping, finishing, succeeded
//   pausing checkpoints -> checkpoints paused, recovering, stopping, finishing
//   checkpoints paused -> running (the keys moved), recovering, stopping, finishing,
//                         succeeded
//   recovering -> starting (the next generation)
//   stopping -> finishing (every worker finished meanwhile)
//   finishing -> final checkpoint saved -> succeeded
// and every phase but the two ends -> failed.
enum class JobPhase {
  // This generation's processes are registering; no checkpoint is armed.
  kStarting,
  // Every process is there (elastic: min_workers of them); the periodic
  // checkpoints are armed, where the job has them.
  kRunning,
  // Keys are about to move between servers: the checkpoint being written
  // ends first (a checkpoint must find every key on one server).
  kPausingCheckpoints,
  // Keys move; no checkpoint is armed until they have.
  kCheckpointsPaused,
  // A process the job cannot go on without was lost: the next generation
  // is being prepared (on a thread of its own).
  kRecovering,
  // Every worker finished: the final checkpoint is being written.
  kFinishing,
  // The final checkpoint is written; the job succeeds once every worker is
  // done (it is, unless one came back meanwhile).
  kFinalSaved,
  // Stopped from outside (StopJob): a final checkpoint is being written
  // within the grace, then the job fails saying so. Workers that all finish
  // meanwhile still end it with their own final checkpoint (kFinishing).
  kStopping,
  // The job ended.
  kSucceeded,
  kFailed,
};

// "running", "pausing checkpoints", ...
const char* JobPhaseName(JobPhase phase);

// Whether the job may go from `from` to `to`.
bool JobPhaseAllows(JobPhase from, JobPhase to);

// OK where allowed; otherwise an INTERNAL error naming both phases (a bug
// of the coordinator, never of what a client sent).
absl::Status CheckJobTransition(JobPhase from, JobPhase to);

// What the job's processes and psrt-run are told: running until it ended.
v1::JobState JobStateOf(JobPhase phase);

// The phases in which the job runs (kRunning with the checkpoints armed,
// pausing or paused).
inline bool JobPhaseRuns(JobPhase phase) {
  return phase == JobPhase::kRunning || phase == JobPhase::kPausingCheckpoints ||
         phase == JobPhase::kCheckpointsPaused;
}

}  // namespace psrt

#endif  // PSRT_SERVER_JOB_PHASE_H_
