#include "server/job.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/logging.h"

namespace psrt {
namespace {

const char* RoleName(v1::Role r) {
  switch (r) {
    case v1::ROLE_SERVER:
      return "server";
    case v1::ROLE_WORKER:
      return "worker";
    case v1::ROLE_AGENT:
      return "agent";
    default:
      return "unknown";
  }
}

}  // namespace

std::string Job::StateName(v1::JobState s) {
  switch (s) {
    case v1::JOB_RUNNING:
      return "running";
    case v1::JOB_SUCCEEDED:
      return "succeeded";
    case v1::JOB_FAILED:
      return "failed";
    default:
      return "unknown";
  }
}

Job::Job(CoordinatorOptions options, Metrics* metrics)
    : options_(std::move(options)),
      registered_(
          metrics->GetGauge("registered_processes", "Processes registered with the coordinator")),
      heartbeats_(metrics->GetCounter("heartbeats_total", "Heartbeats received")),
      epoch_gauge_(metrics->GetGauge("membership_epoch",
                                     "Membership epoch: changes when a worker is lost or rejoins")),
      active_workers_(metrics->GetGauge("active_workers", "Training processes taking part")),
      recoveries_(metrics->GetCounter(
          "recoveries_total", "Recoveries: rollbacks to the last checkpoint after a failure")),
      failovers_(metrics->GetCounter(
          "failovers_total", "Servers lost whose keys their backups serve since (replicas: 1)")),
      moves_total_(metrics->GetCounter(
          "server_moves_total",
          "Server indices whose keys moved to another server (max_servers: joins, removals)")),
      steps_lost_(
          metrics->GetCounter("recovery_steps_lost_total",
                              "Training steps done again because a recovery rolled them back")),
      step_gauge_(metrics->GetGauge(
          "step", "The furthest worker's training step (the step it pushed last)")),
      steps_(metrics->GetCounter("steps_total",
                                 "Training steps made: how far the furthest worker's step "
                                 "advanced, steps done again after a recovery included")) {
  const PsOptions& ps = options_.ps;
  config_.set_mode(ps.mode);
  config_.set_partition_bytes(ps.partition_bytes);
  config_.set_average_gradients(ps.gradient_aggregation == "mean");
  config_.set_heartbeat_timeout_s(ps.heartbeat_timeout_s);
  config_.set_heartbeat_interval_s(std::clamp(ps.heartbeat_timeout_s / 5, 0.05, 1.0));
  config_.set_barrier_timeout_s(ps.barrier_timeout_s);
  config_.set_workers_per_host(ps.workers_per_host);
  config_.set_staleness(ps.staleness);
  config_.set_backup_workers(ps.backup_workers);
  config_.set_on_worker_failure(ps.on_worker_failure);
  config_.set_restart_workers(ps.restart_workers);
  config_.set_compression(ps.compression);
  config_.set_pull_compression(ps.pull_compression);
  config_.set_transport(ps.transport);
  config_.set_on_failure(ps.on_failure);
  config_.set_max_recoveries(ps.max_recoveries);
  config_.set_host_wait_s(ps.host_wait_s);
  config_.set_generation(options_.generation);
  config_.set_min_workers(ps.elastic_min_workers);
  config_.set_nonfinite(ps.nonfinite);
  config_.set_replicas(ps.replicas);
  config_.set_server_port_base(ps.server_port_base);
  config_.set_local_aggregation(LocalAggregationOff(ps).empty());
  v1::Limits* limits = config_.mutable_limits();
  limits->set_max_server_bytes(ps.limits.max_server_bytes);
  limits->set_max_variables(ps.limits.max_variables);
  limits->set_max_keys_per_variable(ps.limits.max_keys_per_variable);
  limits->set_max_calls_per_worker(ps.limits.max_calls_per_worker);
  limits->set_max_pull_wait_s(ps.limits.max_pull_wait_s);
  config_.mutable_checkpoint()->set_uri(ps.checkpoint.uri);
  config_.mutable_checkpoint()->set_every_steps(ps.checkpoint.every_steps);
  config_.mutable_checkpoint()->set_every_seconds(ps.checkpoint.every_seconds);
  config_.mutable_checkpoint()->set_keep(ps.checkpoint.keep);
  config_.set_restore_uri(options_.restore_uri);
  config_.set_restored_step(options_.restored_step);
  epoch_gauge_->Set(1);
  absl::MutexLock lock(&mu_);
  generation_ = options_.generation;
  start_ = Now();
  for (int h = 0; h < static_cast<int>(options_.hosts.size()); ++h) {
    if (options_.hosts_in_job.empty() ||
        std::find(options_.hosts_in_job.begin(), options_.hosts_in_job.end(), h) !=
            options_.hosts_in_job.end()) {
      hosts_.push_back(h);
    }
    Process p;
    p.id.set_role(v1::ROLE_AGENT);
    p.id.set_index(h);
    p.host_index = h;
    p.expected_host = options_.hosts[h];
    p.name = absl::StrCat("agent on ", p.expected_host);
    agents_.push_back(std::move(p));
  }
  LayOutLocked();
  Record(generation_, config_.restore_uri(), config_.restored_step(), hosts_);  // nothing runs yet
  if (options_.monitor) monitor_ = std::thread([this] { Monitor(); });
}

void Job::LayOutLocked() {
  const PsOptions& ps = options_.ps;
  const int num_hosts = static_cast<int>(hosts_.size());
  config_.set_num_hosts(num_hosts);
  // "max_servers": the key map has max_servers servers; those past the
  // started ones join later, their keys served meanwhile by InitialServer.
  const int started = num_hosts * ps.servers_per_host;
  config_.set_num_servers(std::max(started, ps.max_servers));
  config_.set_started_servers(ps.max_servers > 0 ? started : 0);
  const int slots = num_hosts * ps.workers_per_host;
  config_.set_num_workers(ps.elastic_max_workers > 0 ? std::min(slots, ps.elastic_max_workers)
                                                     : slots);
  servers_.clear();
  workers_.clear();
  for (Process& agent : agents_) {
    auto it = std::find(hosts_.begin(), hosts_.end(), agent.id.index());
    agent.slot = it == hosts_.end() ? -1 : static_cast<int>(it - hosts_.begin());
  }
  auto add = [&](std::vector<Process>* table, v1::Role role, int host) {
    Process p;
    p.id.set_role(role);
    p.id.set_index(static_cast<int>(table->size()));
    p.host_index = host;
    p.expected_host = options_.hosts[host];
    p.name = absl::StrCat(RoleName(role), " ", p.id.index(), " on ", p.expected_host);
    table->push_back(std::move(p));
  };
  for (int slot = 0; slot < num_hosts; ++slot) {
    for (int i = 0; i < ps.servers_per_host; ++i) add(&servers_, v1::ROLE_SERVER, hosts_[slot]);
  }
  for (int index = started; index < config_.num_servers(); ++index) {
    Process p;
    p.id.set_role(v1::ROLE_SERVER);
    p.id.set_index(index);
    p.parked = true;
    p.name = absl::StrCat("server ", index);
    servers_.push_back(std::move(p));
  }
  for (int rank = 0; rank < config_.num_workers(); ++rank) {
    add(&workers_, v1::ROLE_WORKER, hosts_[rank / ps.workers_per_host]);
  }
  active_workers_->Set(config_.num_workers());
  placement_.LayOut(config_.num_servers(), config_.started_servers(), config_.replicas(),
                    ps.servers_per_host);
}

v1::ShardMap Job::ShardMapLocked() const {
  v1::ShardMap m;
  for (const std::string& a : ServerAddressesLocked()) m.add_server_addresses(a);
  placement_.Fill(&m);
  return m;
}

Job::Process* Job::ServerLocked(int index) {
  return index >= 0 && index < static_cast<int>(servers_.size()) ? &servers_[index] : nullptr;
}

JobPhase Job::phase() {
  absl::MutexLock lock(&mu_);
  return phase_;
}

bool Job::MoveToLocked(JobPhase to) {
  if (absl::Status s = CheckJobTransition(phase_, to); !s.ok()) {
    LogError("internal error: ", s.message());
    return false;
  }
  phase_ = to;
  return true;
}

bool Job::AwaitLocked(const absl::Condition& cond, absl::Time deadline) {
  // In slices: a test's clock moves without waking anyone.
  for (absl::Time now = Now(); !cond.Eval() && now < deadline; now = Now()) {
    mu_.AwaitWithTimeout(cond, std::min(deadline - now, absl::Milliseconds(50)));
  }
  return cond.Eval();
}

Job::~Job() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (monitor_.joinable()) monitor_.join();
  FinishReleased();
  std::vector<std::thread> turns;
  {
    absl::MutexLock lock(&mu_);
    turns.swap(checkpoint_turns_);
  }
  for (std::thread& t : turns) t.join();
  if (finisher_.joinable()) finisher_.join();
  if (stopper_.joinable()) stopper_.join();
  if (recoverer_.joinable()) recoverer_.join();
  if (failover_.joinable()) failover_.join();
}

std::vector<std::string> Job::ServerAddressesLocked() const {
  std::vector<std::string> out;
  for (const Process& q : servers_) out.push_back(q.address);
  return out;
}

std::vector<std::string> Job::LiveServerAddressesLocked() const {
  std::vector<std::string> out;
  for (const Process& q : servers_) {
    if (!q.lost && !q.parked) out.push_back(q.address);
  }
  return out;
}

bool Job::LiveServerLocked(int index) {
  const Process* q = ServerLocked(index);
  return q != nullptr && q->registered && !q->exited && !q->lost && !q->parked;
}

std::vector<Job::Process>* Job::TableLocked(v1::Role role) {
  switch (role) {
    case v1::ROLE_AGENT:
      return &agents_;
    case v1::ROLE_SERVER:
      return &servers_;
    case v1::ROLE_WORKER:
      return &workers_;
    default:
      return nullptr;
  }
}

Job::Process* Job::FindLocked(const v1::ProcessId& id) {
  std::vector<Process>* table = TableLocked(id.role());
  if (table == nullptr || id.index() < 0 || id.index() >= static_cast<int>(table->size())) {
    return nullptr;
  }
  return &(*table)[id.index()];
}

absl::Status Job::Lookup(const v1::ProcessId& id, Process** out) {
  *out = FindLocked(id);
  if (*out != nullptr) return absl::OkStatus();
  const std::vector<Process>* table = TableLocked(id.role());
  if (table == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("role ", static_cast<int>(id.role()),
                     " is not a role of a psrt job (server, worker or agent)"));
  }
  const int count = static_cast<int>(table->size());
  return absl::InvalidArgumentError(
      absl::StrCat("no ", RoleName(id.role()), " with index ", id.index(), " in this job; it has ",
                   count == 0 ? "none"
                              : absl::StrCat(count, " ", RoleName(id.role()), count == 1 ? "" : "s",
                                             " (indices 0..", count - 1, ")")));
}

v1::Membership Job::MembershipLocked() const {
  v1::Membership m;
  m.set_epoch(epoch_);
  for (const Process& p : workers_) {
    // Elastic: a worker takes part from its registration on.
    if (!p.lost && !p.exited && (p.registered || !elastic())) {
      m.add_active_workers(p.id.index());
    }
  }
  return m;
}

std::vector<std::string> Job::MissingLocked() const {
  std::vector<std::string> missing;
  for (const std::vector<Process>* table : {&servers_, &workers_}) {
    for (const Process& p : *table) {
      if (!p.registered && !p.parked) missing.push_back(p.name);
    }
  }
  return missing;
}

bool Job::ReadyLocked() const {
  // Asked at every registration and heartbeat tick: no names made here.
  if (!AllServersRegisteredLocked()) return false;
  if (!elastic()) {
    return std::all_of(workers_.begin(), workers_.end(),
                       [](const Process& p) { return p.registered || p.parked; });
  }
  int workers = 0;
  for (const Process& p : workers_) workers += p.registered && !p.lost && !p.exited;
  return workers >= config_.min_workers();
}

bool Job::AllServersRegisteredLocked() const {
  return std::all_of(servers_.begin(), servers_.end(),
                     [](const Process& p) { return p.registered || p.parked; });
}

bool Job::ServersApplyLocked(int64_t epoch) const {
  return std::all_of(servers_.begin(), servers_.end(), [&](const Process& p) {
    return p.lost || p.parked || p.applied_epoch >= epoch;
  });
}

absl::Status Job::Register(const v1::RegisterRequest& req, v1::RegisterResponse* resp) {
  absl::Status s = RegisterProcess(&req, resp);
  FinishReleased();  // this one may have been the last awaited
  return s;
}

absl::Status Job::RegisterProcess(const v1::RegisterRequest* req, v1::RegisterResponse* resp) {
  // The request's own fault, whichever process it names.
  if (req->id().role() == v1::ROLE_SERVER && req->address().empty()) {
    return absl::InvalidArgumentError("a server must register the address it listens on");
  }
  absl::MutexLock lock(&mu_);
  Process* p;
  if (absl::Status s = Lookup(req->id(), &p); !s.ok()) return s;
  if (EndedLocked()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the job has ended (", StateName(StateLocked()), "): ", reason_));
  }
  if (StaleLocked(req->generation())) {
    return absl::FailedPreconditionError(
        absl::StrCat(p->name, " was started for generation ", req->generation(),
                     ", but a recovery moved the job to generation ", generation_));
  }
  bool starts_empty = false;
  absl::Status admitted;
  switch (p->id.role()) {  // the three Lookup finds
    case v1::ROLE_AGENT:
      admitted = AgentRegistersLocked(p);
      break;
    case v1::ROLE_SERVER:
      admitted = ServerRegistersLocked(*req, p, &starts_empty);
      break;
    default:
      WorkerRegistersLocked(p);
      break;
  }
  if (!admitted.ok()) return admitted;
  resp->set_spare(starts_empty);
  const bool again = p->registered;
  p->registered = true;
  p->exited = false;
  p->restarting = false;
  p->host = req->host();
  p->address = req->address();
  p->last_heartbeat = Now();
  LogInfo(again ? "re-registered " : "registered ", p->name,
          p->address.empty() ? "" : absl::StrCat(" at ", p->address), " (pid ", req->pid(), ")");
  int registered = 0;
  ForEachLocked([&](const Process& q) { registered += q.registered; });
  registered_->Set(registered);
  MaybeStartLocked();
  active_workers_->Set(MembershipLocked().active_workers_size());
  *resp->mutable_config() = config_;
  resp->set_host_index(p->slot);
  ReleaseBarriersLocked();
  return absl::OkStatus();
}

absl::Status Job::AgentRegistersLocked(Process* p) {
  if (p->slot < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(p->expected_host, " left the job: it was gone for longer than host_wait_s"));
  }
  if (p->lost) AgentBackLocked(p);
  return absl::OkStatus();
}

absl::Status Job::ServerRegistersLocked(const v1::RegisterRequest& req, Process* p,
                                        bool* starts_empty) {
  // "max_servers": a server index with no process joins the running job:
  // it starts empty, and its keys move to it from the server serving them.
  const bool joins = p->parked;
  if (joins && !ReadyLocked()) {
    // Asked again by the server's link until it connects.
    return absl::UnavailableError(
        absl::StrCat(p->name, " joins a running job; this one has not started yet (not arrived: ",
                     absl::StrJoin(MissingLocked(), ", "), ")"));
  }
  if (joins) {
    p->parked = false;
    p->lost = false;
    p->shard_epoch = 0;
    p->copies_building.clear();
    placement_.Join(p->id.index());
    p->name = absl::StrCat("server ", p->id.index(), " on ", req.host());
    LogInfo(p->name, " joins the job at ", req.address(), ": its keys move to it from server ",
            placement_.ServedBy(p->id.index()));
  }
  // A server back after its keys moved ("replicas": 1) is a spare.
  const bool spare = p->lost && config_.replicas() > 0;
  if (!spare && p->registered && !p->exited && p->address != req.address()) {
    return absl::AlreadyExistsError(
        absl::StrCat(p->name, " is already registered at ", p->address));
  }
  if (spare) {
    // It keeps the copies that are missing now, which the servers serving
    // them build in the background.
    p->lost = false;
    const std::vector<int> copies = placement_.KeepMissingCopies(p->id.index());
    LogInfo(p->name, " is back at ", req.address(), ": it keeps the copies of the keys of servers ",
            absl::StrJoin(copies, ", "), " from now on");
  }
  *starts_empty = spare || joins;
  return absl::OkStatus();
}

void Job::WorkerRegistersLocked(Process* p) {
  const bool started = elastic() && phase_ != JobPhase::kStarting;
  if (!p->lost && !p->exited && (p->registered || !started)) return;
  // A lost worker that comes back, or (elastic) a new one, takes part from
  // the next step.
  const bool rejoins = p->lost || p->exited;
  p->lost = false;
  ++epoch_;
  epoch_gauge_->Set(epoch_);
  LogInfo(p->name, rejoins ? " rejoined" : " joined the job", " (epoch ", epoch_, ")");
}

void Job::Barrier(const v1::BarrierRequest& req, absl::Time deadline,
                  std::function<bool()> cancelled, BarrierDone done) {
  const absl::Duration timeout =
      absl::Seconds(req.timeout_s() > 0 ? req.timeout_s() : config_.barrier_timeout_s());
  absl::Status refused;
  {
    absl::MutexLock lock(&mu_);
    Process* p;
    refused = Lookup(req.id(), &p);
    if (refused.ok() && !p->registered) {
      refused = absl::FailedPreconditionError(
          absl::StrCat(p->name, " entered the barrier before registering"));
    }
    if (refused.ok()) {
      barriers_.push_back(
          {std::move(cancelled), std::move(done), std::min(deadline, Now() + timeout), timeout});
      ReleaseBarriersLocked();
    }
  }
  if (!refused.ok()) return done(refused, nullptr);
  FinishReleased();
}

void Job::ReleaseBarriersLocked() {
  if (barriers_.empty()) return;
  // Elastic: a worker that joins also waits until every server counts it
  // (applies the epoch that made it active), so its first push is counted.
  const bool passed =
      EndedLocked() || (ReadyLocked() && (!elastic() || ServersApplyLocked(epoch_)));
  const absl::Time now = Now();
  // Serialized once for all: a job's every server and worker waits here,
  // and each answer holds the shard map (a line per server).
  std::shared_ptr<std::string> answer;
  if (passed && !EndedLocked()) {
    v1::BarrierResponse r;
    *r.mutable_shard_map() = ShardMapLocked();
    *r.mutable_config() = config_;
    *r.mutable_membership() = MembershipLocked();
    answer = std::make_shared<std::string>();
    if (!r.SerializeToString(answer.get())) {
      FailLocked("cannot serialize the barrier's answer");
      answer.reset();
    }
  }
  size_t kept = 0;
  for (WaitingBarrier& b : barriers_) {
    absl::Status s;
    if (passed && (EndedLocked() || answer == nullptr)) {
      s = absl::AbortedError(
          absl::StrCat("the job has ended (", StateName(StateLocked()), "): ", reason_));
    } else if (passed) {
      released_.push_back({b, absl::OkStatus(), answer});
      continue;
    } else if (b.cancelled && b.cancelled()) {
      s = absl::CancelledError("the caller went away");
    } else if (now >= b.deadline) {
      s = absl::DeadlineExceededError(
          absl::StrCat("readiness barrier timed out after ", absl::FormatDuration(b.timeout),
                       "; not arrived: ", absl::StrJoin(MissingLocked(), ", ")));
    } else {
      barriers_[kept++] = b;
      continue;
    }
    released_.push_back({b, s, nullptr});
  }
  barriers_.resize(kept);
}

void Job::FinishReleased() {
  std::vector<ReleasedBarrier> released;
  {
    absl::MutexLock lock(&mu_);
    released.swap(released_);
  }
  for (ReleasedBarrier& r : released) r.barrier.done(r.status, std::move(r.answer));
}

absl::Status Job::ReportExit(const v1::ReportExitRequest& request) {
  const v1::ReportExitRequest* req = &request;
  absl::MutexLock lock(&mu_);
  Process* p;
  if (absl::Status s = Lookup(req->id(), &p); !s.ok()) return s;
  if (p->exited) return absl::OkStatus();  // the agent and the worker may both report
  if (p->parked) return absl::OkStatus();  // removed: its exit was expected
  if (StaleLocked(req->generation())) return absl::OkStatus();  // replaced by a recovery
  const std::string what =
      absl::StrCat(p->name, " exited with code ", req->exit_code(),
                   req->message().empty() ? "" : absl::StrCat(": ", req->message()));
  // A clean exit while the job runs is a loss all the same, but for a
  // worker's.
  const std::string loss =
      req->exit_code() != 0 ? what : absl::StrCat(p->name, " stopped while the job was running");
  switch (p->id.role()) {  // the three Lookup finds
    case v1::ROLE_AGENT:
      // Reported by the agent as it stops, or by psrt-run, which saw it
      // end: its host is lost (and waited for) as when its heartbeats stop,
      // and named first, before the servers and training processes it took
      // along.
      if (EndedLocked() || p->slot < 0 || p->lost) return absl::OkStatus();
      p->lost = true;
      p->lost_at = Now();
      LostLocked(loss);
      return absl::OkStatus();
    case v1::ROLE_SERVER:
      ExitedLocked(*req, p, what);
      if (!EndedLocked()) ServerLostLocked(p, loss);
      return absl::OkStatus();
    default:
      WorkerExitedLocked(*req, p, what);
      return absl::OkStatus();
  }
}

void Job::ExitedLocked(const v1::ReportExitRequest& req, Process* p, const std::string& what) {
  p->exited = true;
  p->exit_code = req.exit_code();
  if (EndedLocked()) p->saw_end = true;
  LogInfo(what);
}

void Job::WorkerExitedLocked(const v1::ReportExitRequest& req, Process* p,
                             const std::string& what) {
  if (req.restarting() && !EndedLocked()) {
    // Its heartbeats stop until the new process registers; the barrier
    // timeout bounds how long that may take.
    p->restarting = true;
    p->last_heartbeat = Now();
    LogWarning(what, "; its agent restarts it");
    return;
  }
  ExitedLocked(req, p, what);
  if (req.exit_code() != 0) {
    WorkerLostLocked(p, what);
    return;
  }
  // A finished worker takes no further part: nobody waits for it.
  ++epoch_;
  epoch_gauge_->Set(epoch_);
  active_workers_->Set(MembershipLocked().active_workers_size());
  CheckSuccessLocked();
}

absl::Status Job::GetStatus(v1::JobStatusResponse* resp) {
  absl::MutexLock lock(&mu_);
  if (EndedLocked()) {
    status_watch_ = StatusWatch::kHeardEnd;
  } else if (status_watch_ == StatusWatch::kNone) {
    status_watch_ = StatusWatch::kWatching;
  }
  resp->set_state(StateLocked());
  resp->set_reason(reason_);
  *resp->mutable_config() = config_;
  *resp->mutable_membership() = MembershipLocked();
  resp->set_recoveries(static_cast<int>(generation_ - 1));
  resp->set_failovers(static_cast<int>(failovers_->value()));
  if (options_.checkpointer != nullptr) {
    resp->set_checkpoints(static_cast<int>(options_.checkpointer->saved()));
    resp->set_checkpoint_seconds(options_.checkpointer->saved_seconds());
  }
  const absl::Time now = Now();
  resp->set_seconds(absl::ToDoubleSeconds(now - born_));
  for (int s : placement_.served_by()) resp->add_served_by(s);
  resp->set_moves(static_cast<int>(moves_total_->value()));
  auto add = [&](const Process& p) {
    v1::ProcessStatus* s = resp->add_processes();
    *s->mutable_id() = p.id;
    s->set_name(p.name);
    s->set_host(p.host);
    s->set_registered(p.registered);
    s->set_exited(p.exited);
    s->set_exit_code(p.exit_code);
    if (p.registered) s->set_seconds_since_heartbeat(absl::ToDoubleSeconds(now - p.last_heartbeat));
    return s;
  };
  for (const Process& p : agents_) add(p);
  for (const Process& p : servers_) add(p);
  for (const Process& p : workers_) {
    v1::ProcessStatus* s = add(p);  // and a worker's own
    s->set_step(p.step);
    *s->mutable_stats() = p.stats;
  }
  return absl::OkStatus();
}

absl::Status Job::Checkpoint(absl::Time deadline, v1::CheckpointResponse* resp) {
  if (options_.checkpointer == nullptr) {
    return absl::FailedPreconditionError(
        "this job writes no checkpoints: set checkpoint.uri in the parameter_server option");
  }
  {
    absl::MutexLock lock(&mu_);
    if (EndingLocked() && phase_ != JobPhase::kStopping) {
      return absl::FailedPreconditionError(
          "the job is ending; its final checkpoint is written (or it failed)");
    }
    if (placement_.moving()) {
      return absl::UnavailableError(
          "keys are moving between servers (a server joins or leaves); ask again once they are");
    }
    MaybeStartLocked();  // the monitor's next round may not have yet
    if (phase_ == JobPhase::kStarting) {
      return absl::UnavailableError(
          absl::StrCat("the job's processes have not all registered yet: ",
                       absl::StrJoin(MissingLocked(), ", ")));
    }
  }
  absl::StatusOr<v1::CheckpointResponse> r = options_.checkpointer->SaveNow(deadline);
  if (!r.ok()) return r.status();
  *resp = *r;
  return absl::OkStatus();
}

}  // namespace psrt
