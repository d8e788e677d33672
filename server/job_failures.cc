// Job: failures (a process lost or exited), failover,
// recovery to the last checkpoint, and the monitor that notices them.
#include <algorithm>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "server/job.h"

namespace psrt {

void Job::ServerLostLocked(Process* p, const std::string& reason) {
  if (EndedLocked() || p->lost) return;
  // The keys it served (its own, and those it took over), each to the
  // server with their copy, when every one has a live copy.
  std::optional<std::vector<int>> owners;
  if (config_.replicas() > 0 && phase_ != JobPhase::kRecovering)
    owners = placement_.FailOver(p->id.index(), ServersLocked());
  if (!owners.has_value()) {
    LostLocked(reason);
    return;
  }
  p->lost = true;
  std::vector<std::string> moved;
  for (int s : *owners) {
    moved.push_back(
        absl::StrCat("server ", placement_.ServedBy(s), " serves server ", s, "'s keys"));
  }
  failovers_->Add();
  LogWarning(reason,
             moved.empty() ? "; it served no keys, only copies"
                           : absl::StrCat("; ", absl::StrJoin(moved, ", "), " from their replicas"),
             ", no step lost (failover)");
  // The checkpoints go on with the servers left.
  std::vector<std::string> live = LiveServerAddressesLocked();
  if (options_.checkpointer != nullptr && (JobPhaseRuns(phase_) || phase_ == JobPhase::kStopping)) {
    const int64_t restored = config_.restored_step();
    // After the last failover's thread (joined there, not under mu_, which
    // it takes at its end).
    failover_ = std::thread([this, live, restored, previous = std::move(failover_)]() mutable {
      if (previous.joinable()) previous.join();
      options_.checkpointer->Abort(absl::Seconds(2));
      std::optional<v1::CheckpointResponse> last = options_.checkpointer->LastCommitted();
      absl::MutexLock lock(&mu_);
      // Nothing is armed once the job ended or its final checkpoint began.
      if (EndingLocked()) return;
      options_.checkpointer->Start(live, last ? last->step() : restored);
    });
  }
}

void Job::FailLocked(const std::string& reason) {
  if (EndedLocked() || !MoveToLocked(JobPhase::kFailed)) return;
  reason_ = reason;
  ended_at_ = Now();
  LogError("job failed: ", reason);
  // Its servers are going: a checkpoint armed now would only fail, step
  // after step, until the coordinator exits.
  if (options_.checkpointer != nullptr) options_.checkpointer->Cancel();
}

void Job::Fail(const std::string& reason) {
  absl::MutexLock lock(&mu_);
  FailLocked(reason);
}

void Job::LostLocked(const std::string& reason) {
  if (EndedLocked()) return;
  if (config_.on_failure() != "recover" || EndingLocked()) {
    FailLocked(reason);
    return;
  }
  if (phase_ == JobPhase::kRecovering) {
    LogWarning(reason, " (while recovering)");
    return;
  }
  if (generation_ - 1 >= config_.max_recoveries()) {
    FailLocked(absl::StrCat(reason, "; no recovery left (max_recoveries is ",
                            config_.max_recoveries(), ")"));
    return;
  }
  if (!MoveToLocked(JobPhase::kRecovering)) return;
  LogWarning(reason, "; recovering");
  // After the last recovery's thread, which may still be writing the job
  // record: joined there, not under mu_.
  recoverer_ = std::thread([this, reason, previous = std::move(recoverer_)]() mutable {
    if (previous.joinable()) previous.join();
    Recover(reason);
  });
}

int64_t Job::ReachedStep(const std::vector<std::string>& servers) const {
  int64_t reached = 0;
  if (options_.server_calls == nullptr) return reached;
  for (const std::string& address : servers) {
    if (address.empty()) continue;
    absl::StatusOr<v1::StatsResponse> answer =
        options_.server_calls->Stats(address, absl::Seconds(1));
    if (!answer.ok()) continue;  // the lost one
    const v1::StatsResponse& stats = *answer;
    // In sync mode a key's version is the step; otherwise it counts every
    // worker's pushes, while steps (and checkpoints) count one worker's.
    if (config_.mode() == "sync") reached = std::max(reached, stats.max_version());
    for (int64_t c : stats.worker_clocks()) reached = std::max(reached, c);
  }
  return reached;
}

void Job::Recover(std::string reason) {
  std::vector<std::string> servers;
  {
    absl::MutexLock lock(&mu_);
    servers = ServerAddressesLocked();
  }
  // From here on no checkpoint of the failed generation commits: the one to
  // return to is known. One whose shards are all written commits first.
  if (options_.checkpointer != nullptr) options_.checkpointer->Abort(absl::Seconds(2));
  const int64_t reached = ReachedStep(servers);
  std::string uri = options_.restore_uri;
  int64_t step = options_.restored_step;
  if (options_.checkpointer != nullptr) {
    if (std::optional<v1::CheckpointResponse> last = options_.checkpointer->LastCommitted()) {
      uri = last->uri();
      step = last->step();
    }
  }
  absl::ReleasableMutexLock lock(&mu_);
  if (EndedLocked() || stop_) return;
  ++generation_;
  config_.set_generation(generation_);
  config_.set_restore_uri(uri);
  config_.set_restored_step(step);
  std::string moved;
  for (int h : drop_hosts_) {
    hosts_.erase(std::remove(hosts_.begin(), hosts_.end(), h), hosts_.end());
    absl::StrAppend(&moved, "; ", options_.hosts[h], " leaves the job");
  }
  drop_hosts_.clear();
  if (!moved.empty()) {
    absl::StrAppend(&moved, ": its keys move to the servers of the ", hosts_.size(),
                    " hosts left, and ", hosts_.size() * options_.ps.workers_per_host,
                    " training processes go on");
  }
  LayOutLocked();  // every server and worker of the new generation yet to register
  MoveToLocked(JobPhase::kStarting);
  ++epoch_;
  epoch_gauge_->Set(epoch_);
  active_workers_->Set(MembershipLocked().active_workers_size());
  start_ = Now();
  const int64_t lost = std::max<int64_t>(0, std::max(reached, progress_step_) - step);
  progress_step_ = step;
  step_gauge_->Set(static_cast<double>(step));
  recoveries_->Add();
  steps_lost_->Add(static_cast<double>(lost));
  LogWarning(
      "recovery ", generation_ - 1, " of at most ", config_.max_recoveries(), ": ", reason,
      "; rolled back to step ", step,
      uri.empty() ? " (the start: nothing was checkpointed yet)" : absl::StrCat(" (", uri, ")"),
      "; ", lost, " steps lost", moved,
      "; restarting every server and training process (generation ", generation_, ")");
  const int64_t generation = generation_;
  const std::vector<int> hosts = hosts_;
  lock.Release();  // the record is written to storage (S3 too): not under the lock heartbeats need
  Record(generation, uri, step, hosts);
}

void Job::AgentBackLocked(Process* p) {
  p->lost = false;
  LogInfo(p->name, " came back after ",
          absl::FormatDuration(absl::Trunc(Now() - p->lost_at, absl::Milliseconds(100))));
}

void Job::Record(int64_t generation, const std::string& uri, int64_t step,
                 const std::vector<int>& hosts) {
  if (options_.checkpointer == nullptr) return;
  // A restarted coordinator goes on from here: the next generation, this
  // checkpoint (until a newer one commits).
  absl::Status s = options_.checkpointer->WriteRecord(generation, uri, step, hosts);
  if (!s.ok()) LogWarning("could not write the job record next to the checkpoints: ", s.message());
}

void Job::WorkerLostLocked(Process* p, const std::string& reason) {
  if (EndedLocked() || p->lost) return;
  if (config_.on_worker_failure() != "continue" && !elastic()) {
    LostLocked(reason);
    return;
  }
  p->lost = true;
  p->restarting = false;
  ++epoch_;
  const v1::Membership m = MembershipLocked();
  epoch_gauge_->Set(epoch_);
  active_workers_->Set(m.active_workers_size());
  LogWarning(reason, "; continuing with ", m.active_workers_size(), " workers (epoch ", epoch_,
             ")");
  if (m.active_workers_size() == 0) {
    FailLocked(absl::StrCat("every worker was lost; the last: ", reason));
    return;
  }
  if (elastic() && m.active_workers_size() < config_.min_workers()) {
    FailLocked(absl::StrCat(reason, "; ", m.active_workers_size(),
                            " workers are left, fewer than elastic.min_workers (",
                            config_.min_workers(), ")"));
    return;
  }
  CheckSuccessLocked();
}

Job::Process* Job::SilentAgentLocked(const Process& p, absl::Time now) {
  // Agents are by host index; a parked server has no host.
  if (p.restarting || p.host_index < 0 || p.host_index >= static_cast<int>(agents_.size())) {
    return nullptr;
  }
  // A live agent is never more than one interval (plus scheduling) late.
  const absl::Duration late = 2 * absl::Seconds(config_.heartbeat_interval_s());
  Process& a = agents_[p.host_index];
  const bool silent = a.slot >= 0 && a.registered && !a.lost && now - a.last_heartbeat > late;
  return silent ? &a : nullptr;
}

void Job::Monitor() {
  absl::MutexLock lock(&mu_);
  // Its period is this thread's, in real time; what a round judges is on
  // the job's clock (Now).
  while (!stop_) {
    mu_.AwaitWithTimeout(absl::Condition(&stop_), absl::Milliseconds(50));
    ReleaseBarriersLocked();
    if (!released_.empty()) {
      mu_.Unlock();
      FinishReleased();
      mu_.Lock();
    }
    if (!stop_) TickLocked(Now());
  }
  // Answered by the destructor, outside mu_.
  for (WaitingBarrier& b : barriers_) {
    released_.push_back({b, absl::UnavailableError("the coordinator is stopping"), nullptr});
  }
  barriers_.clear();
}

void Job::Tick(absl::Time now) {
  absl::MutexLock lock(&mu_);
  TickLocked(now);
}

void Job::TickLocked(absl::Time now) {
  auto going = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !EndedLocked() && phase_ != JobPhase::kRecovering;
  };
  if (!going()) return;
  LoseSilentHostsLocked(now);
  // After a loss the job fails or recovers: nothing more this round.
  if (!going() || GiveUpHostsLocked(now)) return;
  LoseSilentProcessesLocked(now);
  if (!going()) return;
  AdvanceMovesLocked();
  AssignCopiesLocked();
  MaybeStartLocked();
  const absl::Duration barrier = absl::Seconds(config_.barrier_timeout_s());
  if (!ReadyLocked() && now - start_ > barrier) {
    FailLocked(absl::StrCat("readiness barrier timed out after ", absl::FormatDuration(barrier),
                            "; not arrived: ", absl::StrJoin(MissingLocked(), ", ")));
  }
}

void Job::LoseSilentHostsLocked(absl::Time now) {
  // Agents first: every silent host is lost as a whole (and waited for, with
  // "recover", for host_wait_s), whichever of its processes is noticed first.
  const absl::Duration timeout = absl::Seconds(config_.heartbeat_timeout_s());
  for (Process& p : agents_) {
    if (p.slot < 0 || !p.registered || p.lost) continue;
    const absl::Duration silent = now - p.last_heartbeat;
    if (silent <= timeout) continue;
    p.lost = true;
    p.lost_at = now;
    LostLocked(absl::StrCat(p.name, " was lost: no heartbeat for ",
                            absl::FormatDuration(absl::Trunc(silent, absl::Milliseconds(100)))));
  }
}

bool Job::GiveUpHostsLocked(absl::Time now) {
  const absl::Duration host_wait = absl::Seconds(config_.host_wait_s());
  for (Process& p : agents_) {
    if (p.slot < 0 || !p.lost || now - p.lost_at <= host_wait) continue;  // left, or not lost
    const std::string reason =
        absl::StrCat(p.name, " did not come back within ", absl::FormatDuration(host_wait),
                     " (host_wait_s) of being lost");
    if (hosts_.size() == 1) {
      FailLocked(reason);
      return true;
    }
    // The job goes on without the host.
    drop_hosts_.push_back(p.id.index());
    LostLocked(reason);
    return true;
  }
  return false;
}

void Job::LoseSilentProcessesLocked(absl::Time now) {
  const absl::Duration timeout = absl::Seconds(config_.heartbeat_timeout_s());
  const absl::Duration barrier = absl::Seconds(config_.barrier_timeout_s());
  // Each role's rule for a loss.
  using Lose = void (Job::*)(Process*, const std::string&);
  const std::pair<std::vector<Process>*, Lose> roles[] = {
      {&servers_, &Job::ServerLostLocked},
      {&workers_, &Job::WorkerLostLocked},
  };
  for (const auto& [table, lose] : roles) {
    for (Process& p : *table) {
      if (!p.registered || p.exited || p.lost) continue;
      const absl::Duration silent = now - p.last_heartbeat;
      if (silent <= (p.restarting ? barrier : timeout)) continue;
      if (Process* agent = SilentAgentLocked(p, now); agent != nullptr) {
        // Its host went silent as a whole, and the agent's heartbeat was
        // just not due yet: one loss, the host's.
        agent->lost = true;
        agent->lost_at = now;
        LostLocked(absl::StrCat(
            agent->name, " was lost: no heartbeat for ",
            absl::FormatDuration(absl::Trunc(now - agent->last_heartbeat, absl::Milliseconds(100))),
            " (nor from ", p.name, ")"));
        return;
      }
      const std::string reason =
          p.restarting
              ? absl::StrCat(p.name, " did not come back within ", absl::FormatDuration(barrier),
                             " of its restart")
              : absl::StrCat(p.name, " was lost: no heartbeat for ",
                             absl::FormatDuration(absl::Trunc(silent, absl::Milliseconds(100))));
      (this->*lose)(&p, reason);
      if (EndedLocked() || phase_ == JobPhase::kRecovering) return;
    }
  }
}

}  // namespace psrt
