// Job: heartbeats, each role's by its own rules.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "server/job.h"

namespace psrt {

absl::Status Job::Heartbeat(const v1::HeartbeatRequest& req, v1::HeartbeatResponse* resp) {
  absl::MutexLock lock(&mu_);
  Process* p;
  if (absl::Status s = Lookup(req.id(), &p); !s.ok()) return s;
  resp->set_generation(generation_);
  switch (p->id.role()) {  // the three Lookup finds
    case v1::ROLE_AGENT:
      return AgentHeartbeatLocked(req, p, resp);
    case v1::ROLE_SERVER:
      return ServerHeartbeatLocked(req, p, resp);
    default:
      return WorkerHeartbeatLocked(req, p, resp);
  }
}

bool Job::StaleHeartbeatLocked(const v1::HeartbeatRequest& req, v1::HeartbeatResponse* resp) {
  if (!StaleLocked(req.generation())) return false;
  // Replaced by a recovery: it learns so, and its agent stops it.
  resp->set_state(StateLocked());
  resp->set_reason(reason_);
  return true;
}

absl::Status Job::NotRegistered(const Process& p) {
  return absl::FailedPreconditionError(
      absl::StrCat(p.name, " sent a heartbeat before registering"));
}

absl::Status Job::HeardLocked(const v1::HeartbeatRequest& req, Process* p,
                              v1::HeartbeatResponse* resp) {
  heartbeats_->Add();
  p->last_heartbeat = Now();
  if (EndedLocked()) p->saw_end = true;
  resp->set_state(StateLocked());
  resp->set_reason(reason_);
  if (req.membership_epoch() != epoch_) *resp->mutable_membership() = MembershipLocked();
  return absl::OkStatus();
}

void Job::AnswerShardMapLocked(const v1::HeartbeatRequest& req, v1::HeartbeatResponse* resp) {
  if (req.shard_map_epoch() != placement_.epoch() && AllServersRegisteredLocked()) {
    *resp->mutable_shard_map() = ShardMapLocked();
  }
}

absl::Status Job::AgentHeartbeatLocked(const v1::HeartbeatRequest& req, Process* p,
                                       v1::HeartbeatResponse* resp) {
  resp->set_host_index(p->slot);
  *resp->mutable_config() = config_;
  if (p->slot < 0) {
    resp->set_state(StateLocked());
    return absl::OkStatus();  // it left the job, and hears so
  }
  if (StaleHeartbeatLocked(req, resp)) return absl::OkStatus();
  if (!EndedLocked() && p->lost) {
    AgentBackLocked(p);  // its host's link came back
  } else if (!EndedLocked() && !p->registered && options_.generation > 1) {
    // An agent that outlived a lost coordinator: this one was restarted.
    p->registered = true;
    LogInfo("registered ", p->name, " by its heartbeat");
  } else if (!p->registered) {
    return NotRegistered(*p);
  }
  return HeardLocked(req, p, resp);
}

absl::Status Job::ServerHeartbeatLocked(const v1::HeartbeatRequest& req, Process* p,
                                        v1::HeartbeatResponse* resp) {
  if (StaleHeartbeatLocked(req, resp)) return absl::OkStatus();
  if (p->parked) {
    // Removed (its keys are on the other servers): it exits.
    resp->set_state(StateLocked());
    resp->set_leave(true);
    return absl::OkStatus();
  }
  if (!p->registered) return NotRegistered(*p);
  p->applied_epoch = req.membership_epoch();
  // Copies of the keys it serves that it has built since it last said.
  const std::vector<int> before = placement_.CopiesBuilt(p->id.index(), ServerFactsLocked(*p));
  p->shard_epoch = req.shard_map_epoch();
  p->copies_building.assign(req.copies_building().begin(), req.copies_building().end());
  for (int o : placement_.CopiesBuilt(p->id.index(), ServerFactsLocked(*p))) {
    if (config_.replicas() == 0 || std::find(before.begin(), before.end(), o) != before.end())
      continue;
    LogInfo("server ", placement_.CopyAt(o), " holds a copy of server ", o,
            "'s keys (built by server ", p->id.index(), "): a loss of server ", p->id.index(),
            " fails over to it");
  }
  // A move's next step waits for what this server says: taken at once,
  // and its map goes back in this answer.
  if (placement_.moving() && !EndedLocked() && phase_ != JobPhase::kRecovering) {
    AdvanceMovesLocked();
  }
  AnswerShardMapLocked(req, resp);
  return HeardLocked(req, p, resp);
}

absl::Status Job::WorkerHeartbeatLocked(const v1::HeartbeatRequest& req, Process* p,
                                        v1::HeartbeatResponse* resp) {
  if (StaleHeartbeatLocked(req, resp)) return absl::OkStatus();
  if (!p->registered) return NotRegistered(*p);
  p->step = req.step();
  p->stats = req.stats();
  if (req.step() > progress_step_) {
    steps_->Add(req.step() - progress_step_);
    progress_step_ = req.step();
    step_gauge_->Set(static_cast<double>(progress_step_));
  }
  AnswerShardMapLocked(req, resp);
  return HeardLocked(req, p, resp);
}

}  // namespace psrt
