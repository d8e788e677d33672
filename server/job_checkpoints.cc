// Job: the checkpoint schedule (started, paused around
// moves) and the end of the job (its final checkpoint, StopJob).
#include <algorithm>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "server/job.h"

namespace psrt {

std::string Job::NewestCheckpointText() const {
  std::optional<v1::CheckpointResponse> last;
  if (options_.checkpointer != nullptr) last = options_.checkpointer->LastCommitted();
  if (last) return absl::StrCat("; the newest is ", last->uri(), " (step ", last->step(), ")");
  if (!options_.restore_uri.empty()) {
    return absl::StrCat("; the newest is ", options_.restore_uri, " (step ", options_.restored_step,
                        ")");
  }
  return "";
}

void Job::StopJob(const std::string& why, absl::Duration grace) {
  absl::MutexLock lock(&mu_);
  if (EndedLocked()) return;
  if (phase_ == JobPhase::kStopping) {
    FailLocked(absl::StrCat(why, " again, before the final checkpoint was written",
                            NewestCheckpointText()));
    return;
  }
  // Every worker finished: the final checkpoint is on its way.
  if (phase_ == JobPhase::kFinishing || phase_ == JobPhase::kFinalSaved) return;
  const char* none = nullptr;
  if (options_.checkpointer == nullptr) {
    none = "the job has no checkpoint.uri";
  } else if (phase_ == JobPhase::kRecovering) {
    none = "the job was recovering from a failure";
  } else if (phase_ == JobPhase::kStarting) {
    none = "not every server and training process of the job had registered";
  }
  if (none != nullptr) {
    FailLocked(absl::StrCat(why, "; no final checkpoint: ", none, NewestCheckpointText()));
    return;
  }
  if (!MoveToLocked(JobPhase::kStopping)) return;
  LogWarning(why, "; writing a final checkpoint (within ", absl::FormatDuration(grace),
             "), then ending the job");
  stopper_ = std::thread([this, why, grace] { WriteFinalCheckpoint(why, grace); });
}

void Job::WriteFinalCheckpoint(const std::string& why, absl::Duration grace) {
  // Training goes on meanwhile (sync: the servers copy each key as it
  // reaches the step); at the deadline whatever is being written is
  // cancelled, so the grace bounds it even with a server that hangs.
  options_.checkpointer->StopTriggers();
  const absl::Time deadline = Now() + grace;
  absl::Notification saved;
  absl::StatusOr<v1::CheckpointResponse> r;
  std::thread save([&] {
    r = options_.checkpointer->SaveNow(deadline);
    saved.Notify();
  });
  // Until the deadline on the job's clock, in slices (a test's clock moves
  // without waking anyone).
  for (absl::Time now = Now(); !saved.HasBeenNotified() && now < deadline; now = Now()) {
    saved.WaitForNotificationWithTimeout(std::min(deadline - now, absl::Milliseconds(50)));
  }
  const bool in_time = saved.HasBeenNotified();
  if (!in_time) options_.checkpointer->Cancel();
  save.join();
  absl::MutexLock lock(&mu_);
  if (r.ok()) {
    LogInfo("final checkpoint: ", r->uri(), r->already_saved() ? " (already saved)" : "");
    FailLocked(absl::StrCat(why, "; final checkpoint ", r->uri(), " (step ", r->step(), ")"));
    return;
  }
  FailLocked(absl::StrCat(why, "; no final checkpoint: ",
                          in_time
                              ? r.status().message()
                              : absl::StrCat("not written within ", absl::FormatDuration(grace)),
                          NewestCheckpointText()));
}

void Job::MaybeStartLocked() {
  if (phase_ != JobPhase::kStarting || !ReadyLocked()) return;
  if (!MoveToLocked(JobPhase::kRunning)) return;
  if (elastic()) {
    // The job starts with the workers there are; servers stop waiting for
    // the pushes of the others.
    ++epoch_;
    epoch_gauge_->Set(epoch_);
    LogInfo("starting with ", MembershipLocked().active_workers_size(), " of ",
            config_.num_workers(), " workers (elastic.min_workers ", config_.min_workers(),
            "; epoch ", epoch_, ")");
  }
  if (options_.checkpointer != nullptr) {
    options_.checkpointer->Start(LiveServerAddressesLocked(), config_.restored_step());
  }
}

void Job::CheckSuccessLocked() {
  if (EndedLocked() || phase_ == JobPhase::kRecovering) return;
  bool any = false;
  for (const Process& q : workers_) {
    if (q.lost || (elastic() && !q.registered)) continue;
    if (!q.exited || q.exit_code != 0) return;
    any = true;
  }
  if (!any) return;
  if (options_.checkpointer != nullptr && phase_ != JobPhase::kFinalSaved) {
    if (phase_ == JobPhase::kFinishing) return;
    // A job may end before the monitor's next round has started them.
    MaybeStartLocked();
    if (!MoveToLocked(JobPhase::kFinishing)) return;
    // The servers still hold the trained model: save it before anyone hears
    // that the job is over. From the servers there are now: one that joined
    // while the checkpoints were stopped for its keys' move is among them.
    finisher_ = std::thread([this, live = LiveServerAddressesLocked()] {
      absl::StatusOr<v1::CheckpointResponse> r = options_.checkpointer->Finish(live);
      absl::MutexLock lock(&mu_);
      if (phase_ == JobPhase::kFinishing) MoveToLocked(JobPhase::kFinalSaved);
      if (absl::IsNotFound(r.status())) {
        LogInfo("no final checkpoint: ", r.status().message());
      } else if (!r.ok()) {
        FailLocked(absl::StrCat("the final checkpoint failed: ", r.status().message()));
        return;
      } else {
        LogInfo("final checkpoint: ", r->uri(), r->already_saved() ? " (already saved)" : "");
      }
      CheckSuccessLocked();
    });
    return;
  }
  if (!MoveToLocked(JobPhase::kSucceeded)) return;
  reason_ = "every worker finished";
  ended_at_ = Now();
  LogInfo("job succeeded: every worker finished");
}

v1::JobState Job::WaitForEnd() {
  absl::MutexLock lock(&mu_);
  auto ended = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return EndedLocked(); };
  mu_.Await(absl::Condition(&ended));
  // Let live servers and agents hear the outcome through their heartbeats, so
  // they exit with the right code, but never wait for a dead one.
  auto heard = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (status_watch_ == StatusWatch::kWatching) return false;
    auto done = [](const Process& p) {
      return !p.registered || p.exited || p.saw_end || p.lost || p.restarting;
    };
    // Training processes too: they end with the job's reason, not with
    // "lost the coordinator", when they heard it first. An agent whose host
    // left the job has nothing to hear.
    return std::all_of(agents_.begin(), agents_.end(),
                       [&](const Process& p) { return p.slot < 0 || done(p); }) &&
           std::all_of(servers_.begin(), servers_.end(), done) &&
           std::all_of(workers_.begin(), workers_.end(), done);
  };
  const absl::Duration grace = absl::Seconds(
      std::min(config_.heartbeat_timeout_s(), 4 * config_.heartbeat_interval_s() + 1));
  AwaitLocked(absl::Condition(&heard), ended_at_ + grace);
  return StateLocked();
}

void Job::PauseCheckpointsLocked() {
  if (phase_ != JobPhase::kRunning) return;  // pausing or paused already
  if (options_.checkpointer == nullptr) {
    MoveToLocked(JobPhase::kCheckpointsPaused);
    return;
  }
  MoveToLocked(JobPhase::kPausingCheckpoints);
  checkpoint_turns_.emplace_back([this] {
    options_.checkpointer->Abort(absl::Seconds(2));
    absl::MutexLock lock(&mu_);
    // Unless the job went on meanwhile (it recovered, finished or ended).
    if (phase_ == JobPhase::kPausingCheckpoints) MoveToLocked(JobPhase::kCheckpointsPaused);
  });
}

void Job::ResumeCheckpointsLocked() {
  if (!MoveToLocked(JobPhase::kRunning) || options_.checkpointer == nullptr) return;
  std::vector<std::string> live = LiveServerAddressesLocked();
  const int64_t restored = config_.restored_step();
  checkpoint_turns_.emplace_back([this, live, restored] {
    // From a step no key has reached: a snapshot armed before the keys
    // moved is not on the server that holds them now.
    std::optional<v1::CheckpointResponse> last = options_.checkpointer->LastCommitted();
    const int64_t from = std::max(last ? last->step() : restored, ReachedStep(live));
    absl::MutexLock lock(&mu_);
    if (EndingLocked() || placement_.moving()) return;
    options_.checkpointer->Start(live, from);
  });
}

}  // namespace psrt
