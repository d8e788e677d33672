#include "server/job_phase.h"

#include "absl/strings/str_cat.h"

namespace psrt {

const char* JobPhaseName(JobPhase phase) {
  switch (phase) {
    case JobPhase::kStarting:
      return "starting";
    case JobPhase::kRunning:
      return "running";
    case JobPhase::kPausingCheckpoints:
      return "pausing checkpoints";
    case JobPhase::kCheckpointsPaused:
      return "checkpoints paused";
    case JobPhase::kRecovering:
      return "recovering";
    case JobPhase::kFinishing:
      return "finishing";
    case JobPhase::kFinalSaved:
      return "final checkpoint saved";
    case JobPhase::kStopping:
      return "stopping";
    case JobPhase::kSucceeded:
      return "succeeded";
    case JobPhase::kFailed:
      return "failed";
  }
  return "unknown";
}

bool JobPhaseAllows(JobPhase from, JobPhase to) {
  using P = JobPhase;
  if (from == P::kSucceeded || from == P::kFailed) return false;  // the end is the end
  if (to == P::kFailed) return true;                              // any failure ends it
  switch (from) {
    case P::kStarting:
      // Workers may all finish before a server or two registered.
      return to == P::kRunning || to == P::kRecovering || to == P::kFinishing ||
             to == P::kSucceeded;
    case P::kRunning:
      return to == P::kPausingCheckpoints || to == P::kCheckpointsPaused || to == P::kRecovering ||
             to == P::kStopping || to == P::kFinishing || to == P::kSucceeded;
    case P::kPausingCheckpoints:
      // Not kSucceeded: only a job with checkpoints pauses them, and it
      // succeeds through its final checkpoint.
      return to == P::kCheckpointsPaused || to == P::kRecovering || to == P::kStopping ||
             to == P::kFinishing;
    case P::kCheckpointsPaused:
      return to == P::kRunning || to == P::kRecovering || to == P::kStopping ||
             to == P::kFinishing || to == P::kSucceeded;
    case P::kRecovering:
      return to == P::kStarting;
    case P::kStopping:
      return to == P::kFinishing;
    case P::kFinishing:
      return to == P::kFinalSaved;
    case P::kFinalSaved:
      return to == P::kSucceeded;
    case P::kSucceeded:
    case P::kFailed:
      return false;
  }
  return false;
}

absl::Status CheckJobTransition(JobPhase from, JobPhase to) {
  if (JobPhaseAllows(from, to)) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("the job cannot go from ", JobPhaseName(from), " to ",
                                          JobPhaseName(to), " (a bug of the coordinator)"));
}

v1::JobState JobStateOf(JobPhase phase) {
  switch (phase) {
    case JobPhase::kSucceeded:
      return v1::JOB_SUCCEEDED;
    case JobPhase::kFailed:
      return v1::JOB_FAILED;
    default:
      return v1::JOB_RUNNING;
  }
}

}  // namespace psrt
