// Job: servers joining and leaving ("max_servers") and
// the copies of their keys, through its Placement.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "server/job.h"

namespace psrt {

void Job::AdvanceMovesLocked() {
  // Moves wait while the job starts (none begins before every server is
  // there), recovers or ends.
  if (!placement_.moving() || !JobPhaseRuns(phase_)) return;
  PauseCheckpointsLocked();
  if (phase_ != JobPhase::kCheckpointsPaused) return;
  const absl::Time now = Now();
  const absl::Duration limit = absl::Seconds(std::max(60.0, config_.barrier_timeout_s()));
  const Placement::Progress p = placement_.Advance(ServersLocked(), now, limit);
  const Placement::Move& m = p.move;
  switch (p.kind) {
    case Placement::Progress::kNone:
      return;
    case Placement::Progress::kStarted:
      LogInfo("moving server ", m.owner, "'s keys from server ", m.from, " to server ", m.to,
              ": copying them (shard map epoch ", placement_.epoch(), ")");
      return;
    case Placement::Progress::kEnded:
      moves_total_->Add();
      LogInfo("server ", m.to, " serves server ", m.owner, "'s keys (moved from server ", m.from,
              " in ", absl::FormatDuration(absl::Trunc(now - m.since, absl::Milliseconds(1))),
              ", shard map epoch ", placement_.epoch(), ")");
      break;
    case Placement::Progress::kGivenUp:
      // The removals under way stop (RemoveServer says why); joins go on.
      move_error_ = p.error;
      LogWarning(p.error);
      for (Process& q : servers_) q.leaving = false;
      break;
  }
  ParkLeaversLocked();
  if (!placement_.moving()) ResumeCheckpointsLocked();
}

Placement::Server Job::ServerFactsLocked(const Process& p) {
  Placement::Server s;
  s.live = LiveServerLocked(p.id.index());
  s.leaving = p.leaving;
  s.host = p.host;
  s.shard_epoch = p.shard_epoch;
  s.copies_building = p.copies_building;
  return s;
}

Placement::Servers Job::ServersLocked() {
  Placement::Servers servers(config_.num_servers());
  for (const Process& p : servers_) servers[p.id.index()] = ServerFactsLocked(p);
  return servers;
}

void Job::AssignCopiesLocked() {
  if (config_.replicas() == 0 || config_.started_servers() == 0 || placement_.moving() ||
      EndingLocked() || !ReadyLocked()) {
    return;
  }
  std::vector<std::string> named;
  for (const auto& [owner, at] : placement_.AssignCopies(ServersLocked()))
    named.push_back(absl::StrCat("server ", owner, "'s on server ", at));
  if (!named.empty()) {
    LogInfo("copies of keys kept (built by the servers serving them): ", absl::StrJoin(named, ", "),
            " (shard map epoch ", placement_.epoch(), ")");
  }
}

void Job::ParkLeaversLocked() {
  for (Process& q : servers_) {
    if (!q.leaving) continue;
    if (!placement_.OwnersServedBy(q.id.index()).empty()) continue;
    q.leaving = false;
    q.parked = true;
    q.registered = false;
    q.address.clear();
    placement_.DropCopiesAt(q.id.index());  // the copies it kept go with it
    placement_.Changed();
    LogInfo(q.name, " left the job: its keys are on the other servers");
  }
}

absl::Status Job::RemoveServer(const v1::RemoveServerRequest& request, absl::Time deadline,
                               const std::function<bool()>& cancelled,
                               v1::RemoveServerResponse* resp) {
  const v1::RemoveServerRequest* req = &request;
  absl::MutexLock lock(&mu_);
  if (config_.started_servers() == 0) {
    return absl::FailedPreconditionError(
        "this job's servers are fixed: set \"max_servers\" in the parameter_server option for "
        "servers to join and leave a running job");
  }
  const int index = req->index();
  if (index < 0 || index >= config_.num_servers()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "no server ", index, " in this job: its servers are 0..", config_.num_servers() - 1));
  }
  Process* p = ServerLocked(index);
  if (EndedLocked() || phase_ == JobPhase::kRecovering || !ReadyLocked()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the job is not running with all its processes (", StateName(StateLocked()),
                     phase_ == JobPhase::kRecovering ? ", recovering" : "", ")"));
  }
  if (!LiveServerLocked(index) || p->leaving) {
    return absl::FailedPreconditionError(absl::StrCat(
        "server ", index, p->leaving ? " is already leaving" : " is not in the job now"));
  }
  int others = 0;
  for (const Process& q : servers_) {
    others += q.id.index() != index && !q.leaving && LiveServerLocked(q.id.index());
  }
  if (others == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("server ", index, " is the job's last server; its keys have nowhere to go"));
  }
  p->leaving = true;
  move_error_.clear();
  const std::vector<int> owners = placement_.Remove(index);
  LogInfo("removing ", p->name, ": the keys of servers ", absl::StrJoin(owners, ", "),
          " move to the other servers");
  ParkLeaversLocked();  // it serves none: it leaves at once
  // Looked up anew each time: a recovery lays the processes out again.
  const int64_t generation = generation_;
  auto gone = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const Process* q = ServerLocked(index);
    return q == nullptr || q->parked || !q->leaving;
  };
  auto over = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return gone() || EndedLocked() || generation_ != generation ||
           phase_ == JobPhase::kRecovering || cancelled();
  };
  AwaitLocked(absl::Condition(&over), deadline);
  if (EndedLocked()) {
    return absl::AbortedError(absl::StrCat("the job ended: ", reason_));
  }
  if (generation_ != generation || phase_ == JobPhase::kRecovering) {
    return absl::AbortedError(
        "the job recovered from a failure meanwhile: it goes on with the servers it "
        "started with");
  }
  if (const Process* q = ServerLocked(index); q != nullptr && q->parked) {
    for (int o : owners) resp->add_moved_to(placement_.ServedBy(o));
    return absl::OkStatus();
  }
  if (gone()) {
    return absl::AbortedError(absl::StrCat("server ", index, " did not leave: ", move_error_));
  }
  if (cancelled()) return absl::CancelledError("the caller went away");
  return absl::DeadlineExceededError(
      absl::StrCat("server ", index,
                   "'s keys are still moving; it leaves once they are on "
                   "the other servers (see the coordinator's log)"));
}

}  // namespace psrt
