#include "server/coordinator.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/grpc_util.h"
#include "common/key_map.h"
#include "common/logging.h"
#include "psrt/v1/ps.grpc.pb.h"

namespace psrt {
namespace {

const char* RoleName(v1::Role r) {
  switch (r) {
    case v1::ROLE_SERVER: return "server";
    case v1::ROLE_WORKER: return "worker";
    case v1::ROLE_AGENT: return "agent";
    default: return "unknown";
  }
}

std::string StateName(v1::JobState s) {
  switch (s) {
    case v1::JOB_RUNNING: return "running";
    case v1::JOB_SUCCEEDED: return "succeeded";
    case v1::JOB_FAILED: return "failed";
    default: return "unknown";
  }
}

// A callback method's answer, now.
grpc::ServerUnaryReactor* Answer(grpc::CallbackServerContext* ctx, const grpc::Status& s) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(s);
  return reactor;
}

// A raw method's request, parsed as the sync methods' are
// (common/request_traits.h: INVALID_ARGUMENT naming the type).
grpc::Status Decode(const grpc::ByteBuffer& bytes, grpc::protobuf::MessageLite* msg) {
  grpc::ByteBuffer copy(bytes);  // Deserialize consumes its buffer
  return grpc::SerializationTraits<grpc::protobuf::MessageLite>::Deserialize(&copy, msg);
}

grpc::Status Encode(const grpc::protobuf::MessageLite& msg, grpc::ByteBuffer* bytes) {
  bool own = false;
  return grpc::SerializationTraits<grpc::protobuf::MessageLite>::Serialize(msg, bytes, &own);
}

// A raw unary method: parses its Request, runs `serve`, sends its Response.
template <typename Request, typename Response, typename Serve>
grpc::ServerUnaryReactor* Unary(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
                                grpc::ByteBuffer* out, Serve serve) {
  Request req;
  Response resp;
  grpc::Status s = Decode(*in, &req);
  if (s.ok()) s = serve(req, &resp);
  if (s.ok()) s = Encode(resp, out);
  return Answer(ctx, s);
}

}  // namespace

CoordinatorService::CoordinatorService(CoordinatorOptions options, Metrics* metrics)
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
  start_ = absl::Now();
  for (int h = 0; h < static_cast<int>(options_.hosts.size()); ++h) {
    if (options_.hosts_in_job.empty() ||
        std::find(options_.hosts_in_job.begin(), options_.hosts_in_job.end(), h) != options_.hosts_in_job.end()) {
      hosts_.push_back(h);
    }
    Process p;
    p.id.set_role(v1::ROLE_AGENT);
    p.id.set_index(h);
    p.host_index = h;
    p.expected_host = options_.hosts[h];
    p.name = absl::StrCat("agent on ", p.expected_host);
    processes_.push_back(std::move(p));
  }
  LayOutLocked();
  Record(generation_, config_.restore_uri(), config_.restored_step(), hosts_);  // nothing runs yet
  monitor_ = std::thread([this] { Monitor(); });
}

void CoordinatorService::LayOutLocked() {
  const PsOptions& ps = options_.ps;
  const int num_hosts = static_cast<int>(hosts_.size());
  config_.set_num_hosts(num_hosts);
  // "max_servers": the key map has max_servers servers; those past the
  // started ones join later, their keys served meanwhile by InitialServer.
  const int started = num_hosts * ps.servers_per_host;
  config_.set_num_servers(std::max(started, ps.max_servers));
  config_.set_started_servers(ps.max_servers > 0 ? started : 0);
  moves_.clear();
  const int slots = num_hosts * ps.workers_per_host;
  config_.set_num_workers(ps.elastic_max_workers > 0 ? std::min(slots, ps.elastic_max_workers) : slots);
  started_ = false;
  processes_.erase(std::remove_if(processes_.begin(), processes_.end(),
                                  [](const Process& p) { return p.id.role() != v1::ROLE_AGENT; }),
                   processes_.end());
  for (Process& agent : processes_) {
    auto it = std::find(hosts_.begin(), hosts_.end(), agent.id.index());
    agent.slot = it == hosts_.end() ? -1 : static_cast<int>(it - hosts_.begin());
  }
  auto add = [&](v1::Role role, int index, int host) {
    Process p;
    p.id.set_role(role);
    p.id.set_index(index);
    p.host_index = host;
    p.expected_host = options_.hosts[host];
    p.name = absl::StrCat(RoleName(role), " ", index, " on ", p.expected_host);
    processes_.push_back(std::move(p));
  };
  for (int slot = 0; slot < num_hosts; ++slot) {
    for (int i = 0; i < ps.servers_per_host; ++i) add(v1::ROLE_SERVER, slot * ps.servers_per_host + i, hosts_[slot]);
  }
  for (int index = started; index < config_.num_servers(); ++index) {
    Process p;
    p.id.set_role(v1::ROLE_SERVER);
    p.id.set_index(index);
    p.parked = true;
    p.name = absl::StrCat("server ", index);
    processes_.push_back(std::move(p));
  }
  for (int rank = 0; rank < config_.num_workers(); ++rank) {
    add(v1::ROLE_WORKER, rank, hosts_[rank / ps.workers_per_host]);
  }
  active_workers_->Set(config_.num_workers());
  served_by_.resize(config_.num_servers());
  const bool copies = config_.replicas() > 0 || config_.started_servers() > 0;
  replica_at_.assign(copies ? config_.num_servers() : 0, -1);
  replica_since_.assign(replica_at_.size(), 0);
  for (int i = 0; i < config_.num_servers(); ++i) {
    served_by_[i] = InitialServer(i, config_.started_servers());
    // With "max_servers" the copy holders are named once the job runs
    // (AssignCopiesLocked); the workers register each key once.
    if (config_.replicas() > 0 && config_.started_servers() == 0)
      replica_at_[i] = BackupServer(i, config_.num_servers(), options_.ps.servers_per_host);
  }
  ++shard_epoch_;
}

v1::ShardMap CoordinatorService::ShardMapLocked() const {
  v1::ShardMap m;
  for (const std::string& a : ServerAddressesLocked()) m.add_server_addresses(a);
  m.set_epoch(shard_epoch_);
  for (int s : served_by_) m.add_served_by(s);
  for (int s : replica_at_) m.add_replica_at(s);
  for (int64_t e : replica_since_) m.add_replica_since(e);
  return m;
}

void CoordinatorService::ServerLostLocked(Process* p, const std::string& reason) {
  if (state_ != v1::JOB_RUNNING || p->lost) return;
  const int i = p->id.index();
  // The keys it served (its own, and those it took over), each to the
  // server with their copy, when every one has a live copy.
  std::vector<int> owners;
  for (int s = 0; s < static_cast<int>(served_by_.size()); ++s) {
    if (served_by_[s] == i) owners.push_back(s);
  }
  bool can = config_.replicas() > 0 && !recovering_;
  for (int s : owners) {
    if (!can) break;
    const int at = replica_at_[s];
    const Process* q = at >= 0 && at != i ? ServerLocked(at) : nullptr;
    // A copy still being built is no copy to serve from.
    can = can && q != nullptr && q->registered && !q->exited && !q->lost && CopyBuiltLocked(*p, s);
  }
  if (!can) {
    LostLocked(reason);
    return;
  }
  p->lost = true;
  std::vector<std::string> moved;
  for (int s : owners) {
    served_by_[s] = replica_at_[s];
    replica_at_[s] = -1;  // until a new copy is built
    moved.push_back(absl::StrCat("server ", served_by_[s], " serves server ", s, "'s keys"));
  }
  for (int& at : replica_at_) {
    if (at == i) at = -1;  // the copies it kept
  }
  ++shard_epoch_;
  failovers_->Add();
  LogWarning(reason, moved.empty() ? "; it served no keys, only copies" : absl::StrCat("; ", absl::StrJoin(moved, ", "),
                                                                                       " from their replicas"),
             ", no step lost (failover)");
  // The checkpoints go on with the servers left.
  std::vector<std::string> live = LiveServerAddressesLocked();
  if (options_.checkpointer != nullptr && checkpoints_started_ && !finishing_) {
    const int64_t restored = config_.restored_step();
    // After the last failover's thread (joined there, not under mu_, which
    // it takes at its end).
    failover_ = std::thread([this, live, restored, previous = std::move(failover_)]() mutable {
      if (previous.joinable()) previous.join();
      options_.checkpointer->Abort(absl::Seconds(2));
      std::optional<v1::CheckpointResponse> last = options_.checkpointer->LastCommitted();
      absl::MutexLock lock(&mu_);
      // Nothing is armed once the job ended or its final checkpoint began.
      if (state_ != v1::JOB_RUNNING || stopping_job_ || finishing_) return;
      options_.checkpointer->Start(live, last ? last->step() : restored);
    });
  }
}

CoordinatorService::Process* CoordinatorService::ServerLocked(int index) {
  v1::ProcessId id;
  id.set_role(v1::ROLE_SERVER);
  id.set_index(index);
  return FindLocked(id);
}

CoordinatorService::~CoordinatorService() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  monitor_.join();
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

std::vector<std::string> CoordinatorService::ServerAddressesLocked() const {
  std::vector<std::string> out;
  for (const Process& q : processes_) {
    if (q.id.role() == v1::ROLE_SERVER) out.push_back(q.address);
  }
  return out;
}

std::vector<std::string> CoordinatorService::LiveServerAddressesLocked() const {
  std::vector<std::string> out;
  for (const Process& q : processes_) {
    if (q.id.role() == v1::ROLE_SERVER && !q.lost && !q.parked) out.push_back(q.address);
  }
  return out;
}

bool CoordinatorService::LiveServerLocked(int index) {
  const Process* q = ServerLocked(index);
  return q != nullptr && q->registered && !q->exited && !q->lost && !q->parked;
}

CoordinatorService::Process* CoordinatorService::FindLocked(const v1::ProcessId& id) {
  for (Process& p : processes_) {
    if (p.id.role() == id.role() && p.id.index() == id.index()) return &p;
  }
  return nullptr;
}

grpc::Status CoordinatorService::Lookup(const v1::ProcessId& id, Process** out) {
  *out = FindLocked(id);
  if (*out != nullptr) return grpc::Status::OK;
  if (id.role() != v1::ROLE_SERVER && id.role() != v1::ROLE_WORKER && id.role() != v1::ROLE_AGENT) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("role ", static_cast<int>(id.role()),
                                     " is not a role of a psrt job (server, worker or agent)"));
  }
  const int count = static_cast<int>(std::count_if(
      processes_.begin(), processes_.end(),
      [&](const Process& p) { return p.id.role() == id.role(); }));
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                      absl::StrCat("no ", RoleName(id.role()), " with index ", id.index(),
                                   " in this job; it has ",
                                   count == 0 ? "none"
                                              : absl::StrCat(count, " ", RoleName(id.role()),
                                                             count == 1 ? "" : "s", " (indices 0..",
                                                             count - 1, ")")));
}

void CoordinatorService::FailLocked(const std::string& reason) {
  if (state_ != v1::JOB_RUNNING) return;
  state_ = v1::JOB_FAILED;
  reason_ = reason;
  ended_at_ = absl::Now();
  LogError("job failed: ", reason);
  // Its servers are going: a checkpoint armed now would only fail, step
  // after step, until the coordinator exits.
  if (options_.checkpointer != nullptr) options_.checkpointer->Cancel();
}

void CoordinatorService::Fail(const std::string& reason) {
  absl::MutexLock lock(&mu_);
  FailLocked(reason);
}

std::string CoordinatorService::NewestCheckpointText() const {
  std::optional<v1::CheckpointResponse> last;
  if (options_.checkpointer != nullptr) last = options_.checkpointer->LastCommitted();
  if (last) return absl::StrCat("; the newest is ", last->uri(), " (step ", last->step(), ")");
  if (!options_.restore_uri.empty()) {
    return absl::StrCat("; the newest is ", options_.restore_uri, " (step ", options_.restored_step,
                        ")");
  }
  return "";
}

void CoordinatorService::StopJob(const std::string& why, absl::Duration grace) {
  absl::MutexLock lock(&mu_);
  if (state_ != v1::JOB_RUNNING) return;
  if (stopping_job_) {
    FailLocked(absl::StrCat(why, " again, before the final checkpoint was written",
                            NewestCheckpointText()));
    return;
  }
  if (finishing_) return;  // every worker finished: the final checkpoint is on its way
  const char* none = nullptr;
  if (options_.checkpointer == nullptr) {
    none = "the job has no checkpoint.uri";
  } else if (recovering_) {
    none = "the job was recovering from a failure";
  } else if (!checkpoints_started_) {
    none = "not every server and training process of the job had registered";
  }
  if (none != nullptr) {
    FailLocked(absl::StrCat(why, "; no final checkpoint: ", none, NewestCheckpointText()));
    return;
  }
  stopping_job_ = true;
  LogWarning(why, "; writing a final checkpoint (within ", absl::FormatDuration(grace),
             "), then ending the job");
  stopper_ = std::thread([this, why, grace] { WriteFinalCheckpoint(why, grace); });
}

void CoordinatorService::WriteFinalCheckpoint(const std::string& why, absl::Duration grace) {
  // Training goes on meanwhile (sync: the servers copy each key as it
  // reaches the step); at the deadline whatever is being written is
  // cancelled, so the grace bounds it even with a server that hangs.
  options_.checkpointer->StopTriggers();
  const absl::Time deadline = absl::Now() + grace;
  absl::Notification saved;
  absl::StatusOr<v1::CheckpointResponse> r;
  std::thread save([&] {
    r = options_.checkpointer->SaveNow(deadline);
    saved.Notify();
  });
  const bool in_time = saved.WaitForNotificationWithDeadline(deadline);
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

v1::Membership CoordinatorService::MembershipLocked() const {
  v1::Membership m;
  m.set_epoch(epoch_);
  for (const Process& p : processes_) {
    // Elastic: a worker takes part from its registration on.
    if (p.id.role() == v1::ROLE_WORKER && !p.lost && !p.exited && (p.registered || !elastic())) {
      m.add_active_workers(p.id.index());
    }
  }
  return m;
}

void CoordinatorService::LostLocked(const std::string& reason) {
  if (state_ != v1::JOB_RUNNING) return;
  if (config_.on_failure() != "recover" || finishing_ || stopping_job_) {
    FailLocked(reason);
    return;
  }
  if (recovering_) {
    LogWarning(reason, " (while recovering)");
    return;
  }
  if (generation_ - 1 >= config_.max_recoveries()) {
    FailLocked(absl::StrCat(reason, "; no recovery left (max_recoveries is ", config_.max_recoveries(), ")"));
    return;
  }
  recovering_ = true;
  LogWarning(reason, "; recovering");
  // After the last recovery's thread, which may still be writing the job
  // record: joined there, not under mu_.
  recoverer_ = std::thread([this, reason, previous = std::move(recoverer_)]() mutable {
    if (previous.joinable()) previous.join();
    Recover(reason);
  });
}

int64_t CoordinatorService::ReachedStep(const std::vector<std::string>& servers) const {
  int64_t reached = 0;
  for (const std::string& address : servers) {
    if (address.empty()) continue;
    auto stub = v1::ParameterServer::NewStub(MakeControlChannel(address));
    grpc::ClientContext ctx;
    PrepareContext(&ctx, options_.token, absl::Seconds(1));
    v1::StatsResponse stats;
    if (!stub->Stats(&ctx, v1::StatsRequest(), &stats).ok()) continue;  // the lost one
    // In sync mode a key's version is the step; otherwise it counts every
    // worker's pushes, while steps (and checkpoints) count one worker's.
    if (config_.mode() == "sync") reached = std::max(reached, stats.max_version());
    for (int64_t c : stats.worker_clocks()) reached = std::max(reached, c);
  }
  return reached;
}

void CoordinatorService::Recover(std::string reason) {
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
  recovering_ = false;
  if (state_ != v1::JOB_RUNNING || stop_) return;
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
    absl::StrAppend(&moved, ": its keys move to the servers of the ", hosts_.size(), " hosts left, and ",
                    hosts_.size() * options_.ps.workers_per_host, " training processes go on");
  }
  LayOutLocked();  // every server and worker of the new generation yet to register
  ++epoch_;
  epoch_gauge_->Set(epoch_);
  active_workers_->Set(MembershipLocked().active_workers_size());
  checkpoints_started_ = false;
  start_ = absl::Now();
  const int64_t lost = std::max<int64_t>(0, std::max(reached, progress_step_) - step);
  progress_step_ = step;
  step_gauge_->Set(static_cast<double>(step));
  recoveries_->Add();
  steps_lost_->Add(static_cast<double>(lost));
  LogWarning("recovery ", generation_ - 1, " of at most ", config_.max_recoveries(), ": ", reason,
             "; rolled back to step ", step,
             uri.empty() ? " (the start: nothing was checkpointed yet)" : absl::StrCat(" (", uri, ")"),
             "; ", lost, " steps lost", moved, "; restarting every server and training process (generation ",
             generation_, ")");
  const int64_t generation = generation_;
  const std::vector<int> hosts = hosts_;
  lock.Release();  // the record is written to storage (S3 too): not under the lock heartbeats need
  Record(generation, uri, step, hosts);
}

void CoordinatorService::AgentBackLocked(Process* p) {
  p->lost = false;
  LogInfo(p->name, " came back after ",
          absl::FormatDuration(absl::Trunc(absl::Now() - p->lost_at, absl::Milliseconds(100))));
}

void CoordinatorService::Record(int64_t generation, const std::string& uri, int64_t step,
                                const std::vector<int>& hosts) {
  if (options_.checkpointer == nullptr) return;
  // A restarted coordinator goes on from here: the next generation, this
  // checkpoint (until a newer one commits).
  absl::Status s = options_.checkpointer->WriteRecord(generation, uri, step, hosts);
  if (!s.ok()) LogWarning("could not write the job record next to the checkpoints: ", s.message());
}

void CoordinatorService::WorkerLostLocked(Process* p, const std::string& reason) {
  if (state_ != v1::JOB_RUNNING || p->lost) return;
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
  LogWarning(reason, "; continuing with ", m.active_workers_size(), " workers (epoch ", epoch_, ")");
  if (m.active_workers_size() == 0) {
    FailLocked(absl::StrCat("every worker was lost; the last: ", reason));
    return;
  }
  if (elastic() && m.active_workers_size() < config_.min_workers()) {
    FailLocked(absl::StrCat(reason, "; ", m.active_workers_size(), " workers are left, fewer than elastic.min_workers (",
                            config_.min_workers(), ")"));
    return;
  }
  CheckSuccessLocked();
}

void CoordinatorService::MaybeStartCheckpointsLocked() {
  if (options_.checkpointer == nullptr || checkpoints_started_ || stopping_job_ || !ReadyLocked())
    return;
  checkpoints_started_ = true;
  options_.checkpointer->Start(LiveServerAddressesLocked(), config_.restored_step());
}

void CoordinatorService::CheckSuccessLocked() {
  if (state_ != v1::JOB_RUNNING || recovering_) return;
  bool any = false;
  for (const Process& q : processes_) {
    if (q.id.role() != v1::ROLE_WORKER || q.lost || (elastic() && !q.registered)) continue;
    if (!q.exited || q.exit_code != 0) return;
    any = true;
  }
  if (!any) return;
  if (options_.checkpointer != nullptr && !final_saved_) {
    if (finishing_) return;
    finishing_ = true;
    // A job may end before the monitor's next round has started them.
    MaybeStartCheckpointsLocked();
    // The servers still hold the trained model: save it before anyone hears
    // that the job is over. From the servers there are now: one that joined
    // while the checkpoints were stopped for its keys' move is among them.
    finisher_ = std::thread([this, live = LiveServerAddressesLocked()] {
      absl::StatusOr<v1::CheckpointResponse> r = options_.checkpointer->Finish(live);
      absl::MutexLock lock(&mu_);
      final_saved_ = true;
      if (!r.ok()) {
        FailLocked(absl::StrCat("the final checkpoint failed: ", r.status().message()));
        return;
      }
      LogInfo("final checkpoint: ", r->uri(), r->already_saved() ? " (already saved)" : "");
      CheckSuccessLocked();
    });
    return;
  }
  state_ = v1::JOB_SUCCEEDED;
  reason_ = "every worker finished";
  ended_at_ = absl::Now();
  LogInfo("job succeeded: every worker finished");
}

std::vector<std::string> CoordinatorService::MissingLocked() const {
  std::vector<std::string> missing;
  for (const Process& p : processes_) {
    if (!p.registered && !p.parked && p.id.role() != v1::ROLE_AGENT) missing.push_back(p.name);
  }
  return missing;
}

bool CoordinatorService::ReadyLocked() const {
  // Asked at every registration and heartbeat tick: no names made here.
  if (!elastic()) {
    return std::all_of(processes_.begin(), processes_.end(), [](const Process& p) {
      return p.registered || p.parked || p.id.role() == v1::ROLE_AGENT;
    });
  }
  int workers = 0;
  for (const Process& p : processes_) {
    if (p.id.role() == v1::ROLE_SERVER && !p.registered && !p.parked) return false;
    workers += p.id.role() == v1::ROLE_WORKER && p.registered && !p.lost && !p.exited;
  }
  return workers >= config_.min_workers();
}

bool CoordinatorService::AllServersRegisteredLocked() const {
  return std::all_of(processes_.begin(), processes_.end(), [](const Process& p) {
    return p.id.role() != v1::ROLE_SERVER || p.registered || p.parked;
  });
}

bool CoordinatorService::ServersApplyLocked(int64_t epoch) const {
  return std::all_of(processes_.begin(), processes_.end(), [&](const Process& p) {
    return p.id.role() != v1::ROLE_SERVER || p.lost || p.parked || p.applied_epoch >= epoch;
  });
}

grpc::Status CoordinatorService::DoRegister(grpc::ServerContextBase* ctx, const v1::RegisterRequest* req,
                                          v1::RegisterResponse* resp) {
  if (grpc::Status s = CheckToken(ctx, options_.token); !s.ok()) return s;
  if (req->id().role() == v1::ROLE_SERVER && req->address().empty()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "a server must register the address it listens on");
  }
  absl::MutexLock lock(&mu_);
  Process* p;
  if (grpc::Status s = Lookup(req->id(), &p); !s.ok()) return s;
  if (state_ != v1::JOB_RUNNING) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        absl::StrCat("the job has ended (", StateName(state_), "): ", reason_));
  }
  if (StaleLocked(req->generation())) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        absl::StrCat(p->name, " was started for generation ", req->generation(),
                                     ", but a recovery moved the job to generation ", generation_));
  }
  if (p->id.role() == v1::ROLE_AGENT && p->slot < 0) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        absl::StrCat(p->expected_host, " left the job: it was gone for longer than host_wait_s"));
  }
  if (p->id.role() == v1::ROLE_AGENT && p->lost) AgentBackLocked(p);
  // "max_servers": a server index with no process joins the running job:
  // it starts empty, and its keys move to it from the server serving them.
  const bool joins = p->id.role() == v1::ROLE_SERVER && p->parked;
  if (joins && !ReadyLocked()) {
    // Asked again by the server's link until it connects.
    return grpc::Status(
        grpc::StatusCode::UNAVAILABLE,
        absl::StrCat(p->name, " joins a running job; this one has not started yet (not arrived: ",
                     absl::StrJoin(MissingLocked(), ", "), ")"));
  }
  if (joins) {
    p->parked = false;
    p->lost = false;
    p->shard_epoch = 0;
    p->copies_building.clear();
    Move m;
    m.owner = p->id.index();
    m.to = p->id.index();
    moves_.push_back(m);
    p->name = absl::StrCat("server ", p->id.index(), " on ", req->host());
    LogInfo(p->name, " joins the job at ", req->address(), ": its keys move to it from server ",
            served_by_[p->id.index()]);
  }
  // A server back after its keys moved ("replicas": 1) is a spare.
  const bool spare = p->id.role() == v1::ROLE_SERVER && p->lost && config_.replicas() > 0;
  if (!spare && p->registered && !p->exited && p->id.role() == v1::ROLE_SERVER &&
      p->address != req->address()) {
    return grpc::Status(grpc::StatusCode::ALREADY_EXISTS,
                        absl::StrCat(p->name, " is already registered at ", p->address));
  }
  const bool again = p->registered;
  if (p->id.role() == v1::ROLE_WORKER && (p->lost || p->exited || (!again && started_))) {
    // A lost worker that comes back, or (elastic) a new one, takes part
    // from the next step.
    const bool rejoins = p->lost || p->exited;
    p->lost = false;
    ++epoch_;
    epoch_gauge_->Set(epoch_);
    LogInfo(p->name, rejoins ? " rejoined" : " joined the job", " (epoch ", epoch_, ")");
  }
  if (spare) {
    // It keeps the copies that are missing now, which the servers serving
    // them build in the background.
    p->lost = false;
    std::vector<int> copies;
    ++shard_epoch_;
    for (int s = 0; s < static_cast<int>(replica_at_.size()); ++s) {
      if (replica_at_[s] < 0 && served_by_[s] != p->id.index()) {
        replica_at_[s] = p->id.index();
        replica_since_[s] = shard_epoch_;
        copies.push_back(s);
      }
    }
    LogInfo(p->name, " is back at ", req->address(), ": it keeps the copies of the keys of servers ",
            absl::StrJoin(copies, ", "), " from now on");
  }
  resp->set_spare(spare || joins);
  p->registered = true;
  p->exited = false;
  p->restarting = false;
  p->host = req->host();
  p->address = req->address();
  p->last_heartbeat = absl::Now();
  LogInfo(again ? "re-registered " : "registered ", p->name,
          p->address.empty() ? "" : absl::StrCat(" at ", p->address), " (pid ", req->pid(), ")");
  registered_->Set(std::count_if(processes_.begin(), processes_.end(),
                                 [](const Process& q) { return q.registered; }));
  if (elastic() && !started_ && ReadyLocked()) {
    // The job starts with the workers there are; servers stop waiting for
    // the pushes of the others.
    started_ = true;
    ++epoch_;
    epoch_gauge_->Set(epoch_);
    LogInfo("starting with ", MembershipLocked().active_workers_size(), " of ", config_.num_workers(),
            " workers (elastic.min_workers ", config_.min_workers(), "; epoch ", epoch_, ")");
  }
  active_workers_->Set(MembershipLocked().active_workers_size());
  *resp->mutable_config() = config_;
  resp->set_host_index(p->slot);
  ReleaseBarriersLocked();
  return grpc::Status::OK;
}

grpc::ServerUnaryReactor* CoordinatorService::Barrier(grpc::CallbackServerContext* ctx,
                                                      const grpc::ByteBuffer* bytes,
                                                      grpc::ByteBuffer* resp) {
  if (grpc::Status s = CheckToken(ctx, options_.token); !s.ok()) return Answer(ctx, s);
  v1::BarrierRequest request;
  if (grpc::Status s = Decode(*bytes, &request); !s.ok()) return Answer(ctx, s);
  const absl::Duration timeout = absl::Seconds(
      request.timeout_s() > 0 ? request.timeout_s() : config_.barrier_timeout_s());
  grpc::ServerUnaryReactor* reactor;
  {
    absl::MutexLock lock(&mu_);
    Process* p;
    if (grpc::Status s = Lookup(request.id(), &p); !s.ok()) return Answer(ctx, s);
    if (!p->registered) {
      return Answer(ctx,
                    grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                                 absl::StrCat(p->name, " entered the barrier before registering")));
    }
    reactor = ctx->DefaultReactor();
    barriers_.push_back({ctx, reactor, resp, absl::Now() + TimeLeft(ctx, timeout), timeout});
    ReleaseBarriersLocked();
  }
  FinishReleased();
  return reactor;
}

void CoordinatorService::ReleaseBarriersLocked() {
  if (barriers_.empty()) return;
  // Elastic: a worker that joins also waits until every server counts it
  // (applies the epoch that made it active), so its first push is counted.
  const bool passed =
      state_ != v1::JOB_RUNNING || (ReadyLocked() && (!elastic() || ServersApplyLocked(epoch_)));
  const absl::Time now = absl::Now();
  // Serialized once for all: a job's every server and worker waits here,
  // and each answer holds the shard map (a line per server).
  std::shared_ptr<grpc::ByteBuffer> answer;
  if (passed && state_ == v1::JOB_RUNNING) {
    v1::BarrierResponse r;
    *r.mutable_shard_map() = ShardMapLocked();
    *r.mutable_config() = config_;
    *r.mutable_membership() = MembershipLocked();
    answer = std::make_shared<grpc::ByteBuffer>();
    if (grpc::Status s = Encode(r, answer.get()); !s.ok()) {
      FailLocked(absl::StrCat("cannot serialize the barrier's answer: ", s.error_message()));
      answer.reset();
    }
  }
  size_t kept = 0;
  for (WaitingBarrier& b : barriers_) {
    grpc::Status s;
    if (passed && (state_ != v1::JOB_RUNNING || answer == nullptr)) {
      s = grpc::Status(grpc::StatusCode::ABORTED,
                       absl::StrCat("the job has ended (", StateName(state_), "): ", reason_));
    } else if (passed) {
      released_.push_back({b, grpc::Status::OK, answer});
      continue;
    } else if (b.ctx->IsCancelled()) {
      s = grpc::Status(grpc::StatusCode::CANCELLED, "the caller went away");
    } else if (now >= b.deadline) {
      s = grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                       absl::StrCat("readiness barrier timed out after ",
                                    absl::FormatDuration(b.timeout), "; not arrived: ",
                                    absl::StrJoin(MissingLocked(), ", ")));
    } else {
      barriers_[kept++] = b;
      continue;
    }
    released_.push_back({b, s, nullptr});
  }
  barriers_.resize(kept);
}

void CoordinatorService::FinishReleased() {
  std::vector<ReleasedBarrier> released;
  {
    absl::MutexLock lock(&mu_);
    released.swap(released_);
  }
  for (ReleasedBarrier& r : released) {
    if (r.answer != nullptr) *r.barrier.resp = *r.answer;  // shares its slices
    r.barrier.reactor->Finish(r.status);
  }
}

grpc::Status CoordinatorService::DoHeartbeat(grpc::ServerContextBase* ctx, const v1::HeartbeatRequest* req,
                                           v1::HeartbeatResponse* resp) {
  if (grpc::Status s = CheckToken(ctx, options_.token); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  Process* p;
  if (grpc::Status s = Lookup(req->id(), &p); !s.ok()) return s;
  resp->set_generation(generation_);
  if (p->id.role() == v1::ROLE_AGENT) {
    resp->set_host_index(p->slot);
    *resp->mutable_config() = config_;
    if (p->slot < 0) {
      resp->set_state(state_);
      return grpc::Status::OK;  // it left the job, and hears so
    }
  }
  if (StaleLocked(req->generation())) {
    // Replaced by a recovery: it learns so, and its agent stops it.
    resp->set_state(state_);
    resp->set_reason(reason_);
    return grpc::Status::OK;
  }
  if (p->id.role() == v1::ROLE_SERVER && p->parked) {
    // Removed (its keys are on the other servers): it exits.
    resp->set_state(state_);
    resp->set_leave(true);
    return grpc::Status::OK;
  }
  if (p->id.role() == v1::ROLE_AGENT && state_ == v1::JOB_RUNNING && p->lost) {
    AgentBackLocked(p);  // its host's link came back
  } else if (p->id.role() == v1::ROLE_AGENT && state_ == v1::JOB_RUNNING && !p->registered &&
             options_.generation > 1) {
    // An agent that outlived a lost coordinator: this one was restarted.
    p->registered = true;
    LogInfo("registered ", p->name, " by its heartbeat");
  } else if (!p->registered) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        absl::StrCat(p->name, " sent a heartbeat before registering"));
  }
  heartbeats_->Add();
  if (p->id.role() == v1::ROLE_WORKER) {
    p->step = req->step();
    p->stats = req->stats();
  }
  if (p->id.role() == v1::ROLE_WORKER && req->step() > progress_step_) {
    steps_->Add(req->step() - progress_step_);
    progress_step_ = req->step();
    step_gauge_->Set(static_cast<double>(progress_step_));
  }
  if (p->id.role() == v1::ROLE_SERVER) {
    p->applied_epoch = req->membership_epoch();
    // Copies of the keys it serves that it has built since it last said.
    auto kept = [&] {
      std::vector<int> owners;
      for (int o = 0; o < static_cast<int>(replica_at_.size()) && config_.replicas() > 0; ++o) {
        if (served_by_[o] == p->id.index() && replica_at_[o] >= 0 && CopyBuiltLocked(*p, o))
          owners.push_back(o);
      }
      return owners;
    };
    const std::vector<int> before = kept();
    p->shard_epoch = req->shard_map_epoch();
    p->copies_building.assign(req->copies_building().begin(), req->copies_building().end());
    for (int o : kept()) {
      if (std::find(before.begin(), before.end(), o) != before.end()) continue;
      LogInfo("server ", replica_at_[o], " holds a copy of server ", o, "'s keys (built by server ",
              p->id.index(), "): a loss of server ", p->id.index(), " fails over to it");
    }
    // A move's next step waits for what this server says: taken at once,
    // and its map goes back in this answer.
    if (!moves_.empty() && state_ == v1::JOB_RUNNING && !recovering_) AdvanceMovesLocked();
  }
  if (p->id.role() != v1::ROLE_AGENT && req->shard_map_epoch() != shard_epoch_ &&
      AllServersRegisteredLocked()) {
    *resp->mutable_shard_map() = ShardMapLocked();
  }
  p->last_heartbeat = absl::Now();
  if (state_ != v1::JOB_RUNNING) p->saw_end = true;
  resp->set_state(state_);
  resp->set_reason(reason_);
  if (req->membership_epoch() != epoch_) *resp->mutable_membership() = MembershipLocked();
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::DoReportExit(grpc::ServerContextBase* ctx,
                                              const v1::ReportExitRequest* req) {
  if (grpc::Status s = CheckToken(ctx, options_.token); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  Process* p;
  if (grpc::Status s = Lookup(req->id(), &p); !s.ok()) return s;
  if (p->exited) return grpc::Status::OK;  // the agent and the worker may both report
  if (p->parked) return grpc::Status::OK;  // removed: its exit was expected
  if (StaleLocked(req->generation())) return grpc::Status::OK;  // replaced by a recovery
  const std::string what = absl::StrCat(p->name, " exited with code ", req->exit_code(),
                                        req->message().empty() ? "" : absl::StrCat(": ", req->message()));
  if (p->id.role() == v1::ROLE_AGENT) {
    // Reported by the agent as it stops, or by psrt-run, which saw it end:
    // its host is lost (and waited for) as when its heartbeats stop, and
    // named first, before the servers and training processes it took along.
    if (state_ != v1::JOB_RUNNING || p->slot < 0 || p->lost) return grpc::Status::OK;
    p->lost = true;
    p->lost_at = absl::Now();
    LostLocked(req->exit_code() != 0 ? what
                                     : absl::StrCat(p->name, " stopped while the job was running"));
    return grpc::Status::OK;
  }
  if (req->restarting() && p->id.role() == v1::ROLE_WORKER && state_ == v1::JOB_RUNNING) {
    // Its heartbeats stop until the new process registers; the barrier
    // timeout bounds how long that may take.
    p->restarting = true;
    p->last_heartbeat = absl::Now();
    LogWarning(what, "; its agent restarts it");
    return grpc::Status::OK;
  }
  p->exited = true;
  p->exit_code = req->exit_code();
  if (state_ != v1::JOB_RUNNING) p->saw_end = true;
  LogInfo(what);
  if (p->id.role() == v1::ROLE_WORKER) {
    if (req->exit_code() != 0) {
      WorkerLostLocked(p, what);
    } else {
      // A finished worker takes no further part: nobody waits for it.
      ++epoch_;
      epoch_gauge_->Set(epoch_);
      active_workers_->Set(MembershipLocked().active_workers_size());
      CheckSuccessLocked();
    }
  } else if (state_ == v1::JOB_RUNNING) {
    const std::string why =
        req->exit_code() != 0 ? what : absl::StrCat(p->name, " stopped while the job was running");
    ServerLostLocked(p, why);
  }
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::DoGetJobStatus(grpc::ServerContextBase* ctx,
                                                v1::JobStatusResponse* resp) {
  if (grpc::Status s = CheckToken(ctx, options_.token); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  status_watched_ = true;
  status_heard_end_ = status_heard_end_ || state_ != v1::JOB_RUNNING;
  resp->set_state(state_);
  resp->set_reason(reason_);
  *resp->mutable_config() = config_;
  *resp->mutable_membership() = MembershipLocked();
  resp->set_recoveries(static_cast<int>(generation_ - 1));
  resp->set_failovers(static_cast<int>(failovers_->value()));
  if (options_.checkpointer != nullptr) {
    resp->set_checkpoints(static_cast<int>(options_.checkpointer->saved()));
    resp->set_checkpoint_seconds(options_.checkpointer->saved_seconds());
  }
  const absl::Time now = absl::Now();
  resp->set_seconds(absl::ToDoubleSeconds(now - born_));
  for (int s : served_by_) resp->add_served_by(s);
  resp->set_moves(static_cast<int>(moves_total_->value()));
  for (const Process& p : processes_) {
    v1::ProcessStatus* s = resp->add_processes();
    *s->mutable_id() = p.id;
    s->set_name(p.name);
    s->set_host(p.host);
    s->set_registered(p.registered);
    s->set_exited(p.exited);
    s->set_exit_code(p.exit_code);
    if (p.registered) s->set_seconds_since_heartbeat(absl::ToDoubleSeconds(now - p.last_heartbeat));
    if (p.id.role() == v1::ROLE_WORKER) {
      s->set_step(p.step);
      *s->mutable_stats() = p.stats;
    }
  }
  return grpc::Status::OK;
}

grpc::ServerUnaryReactor* CoordinatorService::Register(grpc::CallbackServerContext* ctx,
                                                       const grpc::ByteBuffer* in,
                                                       grpc::ByteBuffer* out) {
  return Unary<v1::RegisterRequest, v1::RegisterResponse>(
      ctx, in, out, [&](const v1::RegisterRequest& req, v1::RegisterResponse* resp) {
        grpc::Status s = DoRegister(ctx, &req, resp);
        FinishReleased();  // this one may have been the last awaited
        return s;
      });
}

grpc::ServerUnaryReactor* CoordinatorService::Heartbeat(grpc::CallbackServerContext* ctx,
                                                        const grpc::ByteBuffer* in,
                                                        grpc::ByteBuffer* out) {
  return Unary<v1::HeartbeatRequest, v1::HeartbeatResponse>(
      ctx, in, out, [&](const v1::HeartbeatRequest& req, v1::HeartbeatResponse* resp) {
        return DoHeartbeat(ctx, &req, resp);
      });
}

grpc::ServerUnaryReactor* CoordinatorService::ReportExit(grpc::CallbackServerContext* ctx,
                                                         const grpc::ByteBuffer* in,
                                                         grpc::ByteBuffer* out) {
  return Unary<v1::ReportExitRequest, v1::ReportExitResponse>(
      ctx, in, out, [&](const v1::ReportExitRequest& req, v1::ReportExitResponse*) {
        return DoReportExit(ctx, &req);
      });
}

grpc::ServerUnaryReactor* CoordinatorService::GetJobStatus(grpc::CallbackServerContext* ctx,
                                                           const grpc::ByteBuffer* in,
                                                           grpc::ByteBuffer* out) {
  return Unary<v1::JobStatusRequest, v1::JobStatusResponse>(
      ctx, in, out,
      [&](const v1::JobStatusRequest&, v1::JobStatusResponse* resp) { return DoGetJobStatus(ctx, resp); });
}

grpc::Status CoordinatorService::Checkpoint(grpc::ServerContext* ctx, const v1::CheckpointRequest*,
                                            v1::CheckpointResponse* resp) {
  if (grpc::Status s = CheckToken(ctx, options_.token); !s.ok()) return s;
  if (options_.checkpointer == nullptr) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "this job writes no checkpoints: set checkpoint.uri in the parameter_server option");
  }
  {
    absl::MutexLock lock(&mu_);
    if (state_ != v1::JOB_RUNNING || finishing_) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          "the job is ending; its final checkpoint is written (or it failed)");
    }
    if (!moves_.empty()) {
      return grpc::Status(
          grpc::StatusCode::UNAVAILABLE,
          "keys are moving between servers (a server joins or leaves); ask again once they are");
    }
    MaybeStartCheckpointsLocked();  // the monitor's next round may not have yet
    if (!checkpoints_started_) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                          absl::StrCat("the job's processes have not all registered yet: ",
                                       absl::StrJoin(MissingLocked(), ", ")));
    }
  }
  absl::StatusOr<v1::CheckpointResponse> r =
      options_.checkpointer->SaveNow(absl::Now() + TimeLeft(ctx, absl::Minutes(10)));
  if (!r.ok()) return ToGrpc(r.status());
  *resp = *r;
  return grpc::Status::OK;
}

CoordinatorService::Process* CoordinatorService::SilentAgentLocked(const Process& p, absl::Time now) {
  if (p.id.role() == v1::ROLE_AGENT || p.restarting) return nullptr;
  // A live agent is never more than one interval (plus scheduling) late.
  const absl::Duration late = 2 * absl::Seconds(config_.heartbeat_interval_s());
  for (Process& a : processes_) {
    if (a.id.role() == v1::ROLE_AGENT && a.slot >= 0 && a.registered && !a.lost && a.host_index == p.host_index &&
        now - a.last_heartbeat > late) {
      return &a;
    }
  }
  return nullptr;
}

void CoordinatorService::Monitor() {
  const absl::Duration timeout = absl::Seconds(config_.heartbeat_timeout_s());
  const absl::Duration barrier = absl::Seconds(config_.barrier_timeout_s());
  absl::MutexLock lock(&mu_);
  while (!stop_) {
    mu_.AwaitWithTimeout(absl::Condition(&stop_), absl::Milliseconds(50));
    ReleaseBarriersLocked();
    if (!released_.empty()) {
      mu_.Unlock();
      FinishReleased();
      mu_.Lock();
    }
    if (stop_ || state_ != v1::JOB_RUNNING || recovering_) continue;
    const absl::Time now = absl::Now();
    const absl::Duration host_wait = absl::Seconds(config_.host_wait_s());
    // Agents first: every silent host is lost as a whole (and waited for, with
    // "recover", for host_wait_s), whichever of its processes is noticed first.
    for (Process& p : processes_) {
      if (p.id.role() != v1::ROLE_AGENT || p.slot < 0 || !p.registered || p.lost) continue;
      const absl::Duration silent = now - p.last_heartbeat;
      if (silent <= timeout) continue;
      p.lost = true;
      p.lost_at = now;
      LostLocked(absl::StrCat(p.name, " was lost: no heartbeat for ",
                              absl::FormatDuration(absl::Trunc(silent, absl::Milliseconds(100)))));
    }
    if (state_ != v1::JOB_RUNNING || recovering_) continue;
    for (Process& p : processes_) {
      if (p.id.role() == v1::ROLE_AGENT && p.slot < 0) continue;  // left the job
      if (p.id.role() == v1::ROLE_AGENT && p.lost && now - p.lost_at > host_wait) {
        const std::string reason = absl::StrCat(p.name, " did not come back within ",
                                                absl::FormatDuration(host_wait), " (host_wait_s) of being lost");
        if (hosts_.size() == 1) {
          FailLocked(reason);
          break;
        }
        // The job goes on without the host.
        drop_hosts_.push_back(p.id.index());
        LostLocked(reason);
        break;
      }
      if (!p.registered || p.exited || p.lost) continue;
      const absl::Duration silent = now - p.last_heartbeat;
      if (silent <= (p.restarting ? barrier : timeout)) continue;
      if (Process* agent = SilentAgentLocked(p, now); agent != nullptr) {
        // Its host went silent as a whole, and the agent's heartbeat was just
        // not due yet: one loss, the host's.
        agent->lost = true;
        agent->lost_at = now;
        LostLocked(absl::StrCat(agent->name, " was lost: no heartbeat for ",
                                absl::FormatDuration(absl::Trunc(now - agent->last_heartbeat, absl::Milliseconds(100))),
                                " (nor from ", p.name, ")"));
        break;
      }
      const std::string reason =
          p.restarting
              ? absl::StrCat(p.name, " did not come back within ", absl::FormatDuration(barrier),
                             " of its restart")
              : absl::StrCat(p.name, " was lost: no heartbeat for ",
                             absl::FormatDuration(absl::Trunc(silent, absl::Milliseconds(100))));
      if (p.id.role() == v1::ROLE_WORKER) {
        WorkerLostLocked(&p, reason);
      } else {
        ServerLostLocked(&p, reason);
      }
      if (state_ != v1::JOB_RUNNING || recovering_) break;
    }
    if (state_ != v1::JOB_RUNNING || recovering_) continue;
    AdvanceMovesLocked();
    AssignCopiesLocked();
    MaybeStartCheckpointsLocked();
    if (!ReadyLocked() && now - start_ > barrier) {
      FailLocked(absl::StrCat("readiness barrier timed out after ", absl::FormatDuration(barrier),
                              "; not arrived: ", absl::StrJoin(MissingLocked(), ", ")));
    }
  }
  // Answered by the destructor, outside mu_.
  for (WaitingBarrier& b : barriers_) {
    released_.push_back(
        {b, grpc::Status(grpc::StatusCode::UNAVAILABLE, "the coordinator is stopping"), nullptr});
  }
  barriers_.clear();
}

v1::JobState CoordinatorService::WaitForEnd() {
  absl::MutexLock lock(&mu_);
  auto ended = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return state_ != v1::JOB_RUNNING; };
  mu_.Await(absl::Condition(&ended));
  // Let live servers and agents hear the outcome through their heartbeats, so
  // they exit with the right code, but never wait for a dead one.
  auto heard = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (status_watched_ && !status_heard_end_) return false;
    return std::all_of(processes_.begin(), processes_.end(), [](const Process& p) {
      // Training processes too: they end with the job's reason, not with
      // "lost the coordinator", when they heard it first.
      return (p.id.role() == v1::ROLE_AGENT && p.slot < 0) || !p.registered || p.exited || p.saw_end || p.lost ||
             p.restarting;
    });
  };
  const absl::Duration grace =
      absl::Seconds(std::min(config_.heartbeat_timeout_s(), 4 * config_.heartbeat_interval_s() + 1));
  mu_.AwaitWithDeadline(absl::Condition(&heard), ended_at_ + grace);
  return state_;
}

}  // namespace psrt

namespace psrt {

void CoordinatorService::PauseCheckpointsLocked() {
  if (checkpoints_paused_ || pausing_) return;
  if (options_.checkpointer == nullptr || !checkpoints_started_) {
    checkpoints_paused_ = true;
    return;
  }
  pausing_ = true;
  checkpoint_turns_.emplace_back([this] {
    options_.checkpointer->Abort(absl::Seconds(2));
    absl::MutexLock lock(&mu_);
    pausing_ = false;
    checkpoints_paused_ = true;
  });
}

void CoordinatorService::ResumeCheckpointsLocked() {
  checkpoints_paused_ = false;
  if (options_.checkpointer == nullptr || !checkpoints_started_ || stopping_job_) return;
  std::vector<std::string> live = LiveServerAddressesLocked();
  const int64_t restored = config_.restored_step();
  checkpoint_turns_.emplace_back([this, live, restored] {
    // From a step no key has reached: a snapshot armed before the keys
    // moved is not on the server that holds them now.
    std::optional<v1::CheckpointResponse> last = options_.checkpointer->LastCommitted();
    const int64_t from = std::max(last ? last->step() : restored, ReachedStep(live));
    absl::MutexLock lock(&mu_);
    if (state_ != v1::JOB_RUNNING || stopping_job_ || finishing_ || !moves_.empty()) return;
    options_.checkpointer->Start(live, from);
  });
}

void CoordinatorService::AdvanceMovesLocked() {
  if (moves_.empty() || finishing_ || stopping_job_) return;
  PauseCheckpointsLocked();
  if (!checkpoints_paused_) return;
  Move& m = moves_.front();
  const absl::Time now = absl::Now();
  const absl::Duration limit = absl::Seconds(std::max(60.0, config_.barrier_timeout_s()));
  if (m.phase == Move::kWaiting) {
    m.from = served_by_[m.owner];
    if (m.to < 0) {
      // The live server serving the fewest owners, not leaving.
      int best = -1, best_count = 0;
      for (const Process& q : processes_) {
        const int i = q.id.index();
        if (q.id.role() != v1::ROLE_SERVER || q.leaving || !LiveServerLocked(i)) continue;
        const int count = static_cast<int>(std::count(served_by_.begin(), served_by_.end(), i));
        if (best < 0 || count < best_count) best = i, best_count = count;
      }
      m.to = best;
    }
    if (m.to < 0 || m.from == m.to || !LiveServerLocked(m.from) || !LiveServerLocked(m.to)) {
      return EndMoveLocked(absl::StrCat("server ", m.owner, "'s keys cannot move from server ",
                                        m.from, " to server ", m.to, ": one of them is not there"));
    }
    ++shard_epoch_;
    replica_at_[m.owner] = m.to;
    replica_since_[m.owner] = shard_epoch_;
    m.epoch = shard_epoch_;
    m.phase = Move::kCopying;
    m.since = now;
    LogInfo("moving server ", m.owner, "'s keys from server ", m.from, " to server ", m.to,
            ": copying them (shard map epoch ", shard_epoch_, ")");
    return;
  }
  Process* from = ServerLocked(m.from);
  if (m.phase == Move::kCopying) {
    const bool built = CopyBuiltLocked(*from, m.owner);
    if (!built && now - m.since > limit) {
      // Nothing has changed hands: the old server goes on serving them.
      ++shard_epoch_;
      replica_at_[m.owner] = -1;
      replica_since_[m.owner] = shard_epoch_;
      return EndMoveLocked(absl::StrCat("server ", m.owner, "'s keys were not copied to server ",
                                        m.to, " within ", absl::FormatDuration(limit),
                                        "; they stay on server ", m.from));
    }
    if (!built) return;
    ++shard_epoch_;
    served_by_[m.owner] = -1;
    m.epoch = shard_epoch_;
    m.phase = Move::kLetGo;
    return;
  }
  if (m.phase == Move::kLetGo) {
    // Once the old server has let them go, the new one serves them.
    if (from->shard_epoch < m.epoch) return;
    ++shard_epoch_;
    served_by_[m.owner] = m.to;
    replica_at_[m.owner] = -1;
    replica_since_[m.owner] = shard_epoch_;
    m.epoch = shard_epoch_;
    m.phase = Move::kTakeOver;
    return;
  }
  // kTakeOver: the new server serves them (so a checkpoint finds them there).
  if (ServerLocked(m.to)->shard_epoch < m.epoch) return;
  moves_total_->Add();
  LogInfo("server ", m.to, " serves server ", m.owner, "'s keys (moved from server ", m.from,
          " in ", absl::FormatDuration(absl::Trunc(now - m.since, absl::Milliseconds(1))),
          ", shard map epoch ", shard_epoch_, ")");
  EndMoveLocked("");
}

void CoordinatorService::EndMoveLocked(const std::string& error) {
  moves_.pop_front();
  if (!error.empty()) {
    // The removals under way stop (RemoveServer says why); joins go on.
    move_error_ = error;
    LogWarning(error);
    for (Process& q : processes_) q.leaving = false;
    moves_.erase(
        std::remove_if(moves_.begin(), moves_.end(), [](const Move& m) { return m.to < 0; }),
        moves_.end());
  }
  ParkLeaversLocked();
  if (moves_.empty()) ResumeCheckpointsLocked();
}

bool CoordinatorService::CopyBuiltLocked(const Process& serving, int owner) const {
  return serving.shard_epoch >= replica_since_[owner] &&
         std::find(serving.copies_building.begin(), serving.copies_building.end(), owner) ==
             serving.copies_building.end();
}

void CoordinatorService::AssignCopiesLocked() {
  if (config_.replicas() == 0 || config_.started_servers() == 0 || !moves_.empty() || finishing_ ||
      stopping_job_ || !ReadyLocked()) {
    return;
  }
  std::vector<std::string> named;
  for (int s = 0; s < static_cast<int>(served_by_.size()); ++s) {
    const int by = served_by_[s];
    if (by < 0 || replica_at_[s] >= 0) continue;
    const Process* serving = ServerLocked(by);
    // A live server other than the one serving them, on another host where
    // there is one, keeping the fewest copies.
    int best = -1, best_count = 0;
    bool best_apart = false;
    for (const Process& q : processes_) {
      const int i = q.id.index();
      if (q.id.role() != v1::ROLE_SERVER || i == by || q.leaving || !LiveServerLocked(i)) continue;
      const bool apart = serving == nullptr || q.host != serving->host;
      const int count = static_cast<int>(std::count(replica_at_.begin(), replica_at_.end(), i));
      if (best < 0 || (apart && !best_apart) || (apart == best_apart && count < best_count)) {
        best = i, best_count = count, best_apart = apart;
      }
    }
    if (best < 0) continue;
    if (named.empty()) ++shard_epoch_;
    replica_at_[s] = best;
    replica_since_[s] = shard_epoch_;
    named.push_back(absl::StrCat("server ", s, "'s on server ", best));
  }
  if (!named.empty()) {
    LogInfo("copies of keys kept (built by the servers serving them): ", absl::StrJoin(named, ", "),
            " (shard map epoch ", shard_epoch_, ")");
  }
}

void CoordinatorService::ParkLeaversLocked() {
  for (Process& q : processes_) {
    if (q.id.role() != v1::ROLE_SERVER || !q.leaving) continue;
    if (std::count(served_by_.begin(), served_by_.end(), q.id.index()) > 0) continue;
    q.leaving = false;
    q.parked = true;
    q.registered = false;
    q.address.clear();
    for (int& at : replica_at_) {
      if (at == q.id.index()) at = -1;  // the copies it kept go with it
    }
    ++shard_epoch_;
    LogInfo(q.name, " left the job: its keys are on the other servers");
  }
}

grpc::Status CoordinatorService::RemoveServer(grpc::ServerContext* ctx,
                                              const v1::RemoveServerRequest* req,
                                              v1::RemoveServerResponse* resp) {
  if (grpc::Status s = CheckToken(ctx, options_.token); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  if (config_.started_servers() == 0) {
    return grpc::Status(
        grpc::StatusCode::FAILED_PRECONDITION,
        "this job's servers are fixed: set \"max_servers\" in the parameter_server option for "
        "servers to join and leave a running job");
  }
  const int index = req->index();
  if (index < 0 || index >= config_.num_servers()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("no server ", index, " in this job: its servers are 0..",
                                     config_.num_servers() - 1));
  }
  Process* p = ServerLocked(index);
  if (state_ != v1::JOB_RUNNING || recovering_ || !ReadyLocked()) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        absl::StrCat("the job is not running with all its processes (",
                                     StateName(state_), recovering_ ? ", recovering" : "", ")"));
  }
  if (!LiveServerLocked(index) || p->leaving) {
    return grpc::Status(
        grpc::StatusCode::FAILED_PRECONDITION,
        absl::StrCat("server ", index,
                     p->leaving ? " is already leaving" : " is not in the job now"));
  }
  int others = 0;
  for (const Process& q : processes_) {
    others += q.id.role() == v1::ROLE_SERVER && q.id.index() != index && !q.leaving &&
              LiveServerLocked(q.id.index());
  }
  if (others == 0) {
    return grpc::Status(
        grpc::StatusCode::FAILED_PRECONDITION,
        absl::StrCat("server ", index, " is the job's last server; its keys have nowhere to go"));
  }
  p->leaving = true;
  move_error_.clear();
  std::vector<int> owners;
  for (int o = 0; o < static_cast<int>(served_by_.size()); ++o) {
    if (served_by_[o] != index) continue;
    Move m;
    m.owner = o;
    moves_.push_back(m);
    owners.push_back(o);
  }
  LogInfo("removing ", p->name, ": the keys of servers ", absl::StrJoin(owners, ", "),
          " move to the other servers");
  ParkLeaversLocked();  // it serves none: it leaves at once
  const absl::Time deadline = absl::Now() + TimeLeft(ctx, absl::Minutes(10));
  // Looked up anew each time: a recovery lays the processes out again.
  const int64_t generation = generation_;
  auto gone = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const Process* q = ServerLocked(index);
    return q == nullptr || q->parked || !q->leaving;
  };
  auto over = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return gone() || state_ != v1::JOB_RUNNING || generation_ != generation || recovering_ ||
           ctx->IsCancelled();
  };
  while (!over() && absl::Now() < deadline) {
    mu_.AwaitWithTimeout(absl::Condition(&over), absl::Milliseconds(100));
  }
  if (state_ != v1::JOB_RUNNING) {
    return grpc::Status(grpc::StatusCode::ABORTED, absl::StrCat("the job ended: ", reason_));
  }
  if (generation_ != generation || recovering_) {
    return grpc::Status(grpc::StatusCode::ABORTED,
                        "the job recovered from a failure meanwhile: it goes on with the servers it "
                        "started with");
  }
  if (const Process* q = ServerLocked(index); q != nullptr && q->parked) {
    for (int o : owners) resp->add_moved_to(served_by_[o]);
    return grpc::Status::OK;
  }
  if (gone()) {
    return grpc::Status(grpc::StatusCode::ABORTED,
                        absl::StrCat("server ", index, " did not leave: ", move_error_));
  }
  if (ctx->IsCancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "the caller went away");
  return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                      absl::StrCat("server ", index,
                                   "'s keys are still moving; it leaves once they are on "
                                   "the other servers (see the coordinator's log)"));
}

}  // namespace psrt
