#ifndef PSRT_SERVER_JOB_H_
#define PSRT_SERVER_JOB_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/distribution.h"
#include "common/metrics.h"
#include "psrt/v1/coordinator.pb.h"
#include "psrt/v1/ps.pb.h"
#include "server/checkpointer.h"
#include "server/job_phase.h"
#include "server/placement.h"

namespace psrt {

// The calls a Job makes to the servers itself: GrpcServerCalls
// (server/coordinator.h) makes them over gRPC, unit tests fake them.
class ServerCalls {
 public:
  virtual ~ServerCalls() = default;
  // The Stats of the server at `address`, answered within `timeout`.
  virtual absl::StatusOr<v1::StatsResponse> Stats(const std::string& address,
                                                  absl::Duration timeout) = 0;
};

struct CoordinatorOptions {
  std::vector<std::string> hosts;  // host i runs servers and workers of index i
  PsOptions ps;
  std::string token;
  // Writes the job's checkpoints (none without); outlives the job. The
  // coordinator's is a Checkpointer (server/checkpointer.h).
  CheckpointControl* checkpointer = nullptr;
  // Asks the servers (none answers without); outlives the job.
  ServerCalls* server_calls = nullptr;
  // The checkpoint the job starts from, if any, and its step.
  std::string restore_uri;
  int64_t restored_step = 0;
  // 1 for a new job; more for a coordinator restarted after its loss (the
  // job record's generation + 1).
  int64_t generation = 1;
  // The hosts (indices into `hosts`) still in the job; empty: all.
  std::vector<int> hosts_in_job;
  // The time heartbeats are stamped and judged by, and the deadlines of
  // waits (null: absl::Now).
  std::function<absl::Time()> clock;
  // Whether a thread calls Tick every 50 ms (false: the caller does; tests).
  bool monitor = true;
};

// A job as the coordinator runs it: membership, readiness, heartbeats,
// failures and recoveries, the moves of keys between servers, the checkpoint
// schedule and the end of the job. One lock over its state; a Tick(now)
// advances it (the monitor thread's, or a test's, on a clock of its own).
// The first failure decides the job's fate and its reason is what every
// process reports. Its callers (server/coordinator.h's gRPC service, unit
// tests) have checked the job token.
class Job {
 public:
  Job(CoordinatorOptions options, Metrics* metrics);
  ~Job();

  const v1::JobConfig& config() const { return config_; }

  // One per RPC of psrt.v1.Coordinator.
  absl::Status Register(const v1::RegisterRequest& req, v1::RegisterResponse* resp);
  absl::Status Heartbeat(const v1::HeartbeatRequest& req, v1::HeartbeatResponse* resp);
  absl::Status ReportExit(const v1::ReportExitRequest& req);
  absl::Status GetStatus(v1::JobStatusResponse* resp);
  // Writes a checkpoint now, by `deadline`.
  absl::Status Checkpoint(absl::Time deadline, v1::CheckpointResponse* resp);
  // Answers once the server's keys are on the others and it is gone, by
  // `deadline` or until `cancelled` says its caller went.
  absl::Status RemoveServer(const v1::RemoveServerRequest& req, absl::Time deadline,
                            const std::function<bool()>& cancelled, v1::RemoveServerResponse* resp);
  // The readiness barrier: `done` gets the serialized BarrierResponse once
  // every process is there, or the error that ended the wait (the job
  // ended, the caller went, the barrier's timeout or `deadline` passed). It
  // is called once, outside the job's lock, on this thread or another.
  using BarrierDone =
      std::function<void(const absl::Status& status, std::shared_ptr<const std::string> answer)>;
  void Barrier(const v1::BarrierRequest& req, absl::Time deadline, std::function<bool()> cancelled,
               BarrierDone done);

  // Blocks until the job has ended and every live server and agent has heard
  // so (or a grace period passed). Returns the final state.
  v1::JobState WaitForEnd();
  // Ends the job from outside (a signal to the coordinator).
  void Fail(const std::string& reason);
  // Ends the job from outside after a final checkpoint, written within
  // `grace` where the job can write one; the reason starts with `why` and
  // says what became of the checkpoint. Asked again, it ends the job at once.
  void StopJob(const std::string& why, absl::Duration grace);

  // Advances the job to `now`: processes silent past their timeout are
  // lost (the job fails, fails over, recovers or goes on without them),
  // keys move, copies are named, checkpoints start, and a readiness barrier
  // past its time fails the job. The monitor thread calls it every 50 ms.
  void Tick(absl::Time now);

  // Where the job is in its life (server/job_phase.h).
  JobPhase phase() ABSL_LOCKS_EXCLUDED(mu_);
  // The time on the job's clock (CoordinatorOptions::clock): its callers'
  // deadlines are on it too.
  absl::Time Now() const { return options_.clock ? options_.clock() : absl::Now(); }

 private:
  struct Process {
    v1::ProcessId id;
    std::string name;  // "server 1 on host-b"
    std::string expected_host;
    int host_index = -1;  // into options_.hosts
    std::string host;
    std::string address;
    bool registered = false;
    bool exited = false;
    int exit_code = 0;
    absl::Time last_heartbeat;
    bool saw_end = false;       // heartbeat answered after the job ended
    bool restarting = false;    // its agent is starting it again
    bool lost = false;          // a worker the job goes on without; an agent gone
    absl::Time lost_at;         // agents: when
    int slot = -1;              // agents: their host's index in the job now; -1: it left
    int64_t applied_epoch = 0;  // servers: the membership epoch they said they apply
    // Servers ("max_servers"): no process has this index now (it joins
    // later, or it left); leaving: RemoveServer is moving its keys away.
    bool parked = false;
    bool leaving = false;
    int64_t shard_epoch = 0;           // servers: the shard map they said they apply
    std::vector<int> copies_building;  // servers: as their last heartbeat said
    int64_t step = 0;                  // training processes: the latest step they pushed
    v1::WorkerStats stats;             // training processes: as of their last heartbeat
  };

  static std::string StateName(v1::JobState s);  // "running", ...
  // Register's rules per role: refusals, a lost agent back, a server
  // joining or back as a spare (`starts_empty`), a worker rejoining.
  absl::Status AgentRegistersLocked(Process* p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status ServerRegistersLocked(const v1::RegisterRequest& req, Process* p, bool* starts_empty)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void WorkerRegistersLocked(Process* p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // ReportExit's: the process exited (`what` says how); a worker's exit,
  // which may be a restart or the end of its work.
  void ExitedLocked(const v1::ReportExitRequest& req, Process* p, const std::string& what)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void WorkerExitedLocked(const v1::ReportExitRequest& req, Process* p, const std::string& what)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Heartbeat's work per role (job_heartbeats.cc), under mu_.
  absl::Status AgentHeartbeatLocked(const v1::HeartbeatRequest& req, Process* p,
                                    v1::HeartbeatResponse* resp) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status ServerHeartbeatLocked(const v1::HeartbeatRequest& req, Process* p,
                                     v1::HeartbeatResponse* resp)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status WorkerHeartbeatLocked(const v1::HeartbeatRequest& req, Process* p,
                                     v1::HeartbeatResponse* resp)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A heartbeat of a generation a recovery replaced: answered so (true).
  bool StaleHeartbeatLocked(const v1::HeartbeatRequest& req, v1::HeartbeatResponse* resp)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static absl::Status NotRegistered(const Process& p);
  // The shard map, to a server or worker that applies an older one.
  void AnswerShardMapLocked(const v1::HeartbeatRequest& req, v1::HeartbeatResponse* resp)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A heartbeat taken: p is alive now; the answer says the job's state.
  absl::Status HeardLocked(const v1::HeartbeatRequest& req, Process* p, v1::HeartbeatResponse* resp)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Register's work, under mu_, which it takes (the barriers it releases
  // are answered after, outside it).
  absl::Status RegisterProcess(const v1::RegisterRequest* req, v1::RegisterResponse* resp)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The table of `role`; null for a role that is no psrt process's.
  std::vector<Process>* TableLocked(v1::Role role) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Every process: agents, servers, then workers (GetStatus' order).
  template <typename F>
  void ForEachLocked(F f) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (std::vector<Process>* table : {&agents_, &servers_, &workers_}) {
      for (Process& p : *table) f(p);
    }
  }
  template <typename F>
  void ForEachLocked(F f) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const std::vector<Process>* table : {&agents_, &servers_, &workers_}) {
      for (const Process& p : *table) f(p);
    }
  }
  Process* FindLocked(const v1::ProcessId& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Lookup(const v1::ProcessId& id, Process** out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FailLocked(const std::string& reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A worker died or went silent: the job fails, recovers, or goes on
  // without it.
  void WorkerLostLocked(Process* p, const std::string& reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A process the job cannot go on without was lost: it fails, or (with
  // on_failure "recover") rolls back to its last checkpoint.
  void LostLocked(const std::string& reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // p's host's agent, when it too has missed heartbeats; else null.
  Process* SilentAgentLocked(const Process& p, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Stops the checkpoints, finds the checkpoint to return to, then starts
  // the next generation (on a thread of its own: it waits on servers).
  void Recover(std::string reason);
  // Servers and workers for the hosts in the job, none registered; the
  // job's sizes in config_.
  void LayOutLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A lost agent registered or sent a heartbeat again.
  void AgentBackLocked(Process* p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes the job record (generation, checkpoint to return to, hosts).
  void Record(int64_t generation, const std::string& uri, int64_t step,
              const std::vector<int>& hosts);
  // The final checkpoint StopJob asked for, then the job's end.
  void WriteFinalCheckpoint(const std::string& why, absl::Duration grace);
  // "; the newest is URI (step N)", naming the checkpoint a restart would
  // go on from; empty when there is none.
  std::string NewestCheckpointText() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  v1::ShardMap ShardMapLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool AllServersRegisteredLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Process* ServerLocked(int index) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A server was lost: its backup takes over ("replicas": 1) where it can,
  // else as LostLocked.
  void ServerLostLocked(Process* p, const std::string& reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The furthest step (sync) or worker clock any live server reached.
  int64_t ReachedStep(const std::vector<std::string>& servers) const;
  // Whether a request of `generation` (0: the current one) is of the past.
  bool StaleLocked(int64_t generation) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return generation != 0 && generation != generation_;
  }
  // Once every process has registered (elastic: min_workers of them), the
  // generation runs: elastic, the servers stop waiting for the others'
  // pushes (a new epoch); the checkpointer starts.
  void MaybeStartLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CheckSuccessLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  v1::Membership MembershipLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<std::string> MissingLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Every server registered, and every worker (elastic: min_workers of them).
  bool ReadyLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Every server applies membership `epoch` or a later one.
  bool ServersApplyLocked(int64_t epoch) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool elastic() const { return options_.ps.elastic_min_workers > 0; }
  void Monitor();
  void TickLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Tick's parts: hosts silent past the heartbeat timeout are lost; lost
  // ones not back within host_wait_s are given up (true: one was, and the
  // job failed or recovers); servers and workers silent past theirs are
  // lost by their role's rule.
  void LoseSilentHostsLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool GiveUpHostsLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LoseSilentProcessesLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves the job to phase `to` where JobPhaseAllows it; otherwise logs the
  // bug (an internal error naming both phases), changes nothing and
  // returns false.
  bool MoveToLocked(JobPhase to) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  v1::JobState StateLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return JobStateOf(phase_); }
  bool EndedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return StateLocked() != v1::JOB_RUNNING;
  }
  // The job's final checkpoint is under way or written (or it ended): no
  // periodic checkpoint is armed any more, no key moves.
  bool EndingLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return EndedLocked() || phase_ == JobPhase::kStopping || phase_ == JobPhase::kFinishing ||
           phase_ == JobPhase::kFinalSaved;
  }
  // Waits on mu_ until `cond` holds or `deadline` passes on the job's clock;
  // whether `cond` holds.
  bool AwaitLocked(const absl::Condition& cond, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes the barriers that may end (passed, the job ended, their caller
  // went or their time is up) into released_; FinishReleased answers them
  // outside mu_.
  void ReleaseBarriersLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FinishReleased() ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<std::string> ServerAddressesLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The addresses of the servers that hold keys now (not lost, not parked).
  std::vector<std::string> LiveServerAddressesLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool LiveServerLocked(int index) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves of keys between servers ("max_servers", Placement::Move), one at
  // a time, with the checkpoints paused; once one ends (or is given up),
  // the servers leaving that serve nothing now leave.
  void AdvanceMovesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ParkLeaversLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What placement_ is told of the servers.
  Placement::Server ServerFactsLocked(const Process& p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Placement::Servers ServersLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // "replicas" with "max_servers": names a copy holder for every owner's
  // keys that have none (at the start, after a move or a failover).
  void AssignCopiesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The checkpoints stop while keys move (a checkpoint must find every key
  // on one server) and start again after, with the servers there are then.
  void PauseCheckpointsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ResumeCheckpointsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const CoordinatorOptions options_;
  v1::JobConfig config_;
  absl::Mutex mu_;
  absl::Time start_ ABSL_GUARDED_BY(mu_);  // of the current generation
  const absl::Time born_ = Now();          // this coordinator's start
  // The processes, a table per role, each in the order of their index
  // (agents: their host's): a role's rules are the loops over its table.
  std::vector<Process> agents_ ABSL_GUARDED_BY(mu_);
  std::vector<Process> servers_ ABSL_GUARDED_BY(mu_);
  std::vector<Process> workers_ ABSL_GUARDED_BY(mu_);
  // The job's life cycle: the one state its threads and RPCs read and move
  // along JobPhaseAllows' transitions.
  JobPhase phase_ ABSL_GUARDED_BY(mu_) = JobPhase::kStarting;
  std::string reason_ ABSL_GUARDED_BY(mu_);  // why it ended
  absl::Time ended_at_ ABSL_GUARDED_BY(mu_);
  // This object is being destroyed (its threads stop), whatever the job's
  // phase: a fact of the coordinator process, not of the job.
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  int64_t epoch_ ABSL_GUARDED_BY(mu_) = 1;
  // Recovery: servers and training processes belong to a generation; a
  // recovery replaces them all with those of the next one.
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 1;
  int64_t progress_step_ ABSL_GUARDED_BY(mu_) = 0;    // highest step pushed this generation
  std::vector<int> hosts_ ABSL_GUARDED_BY(mu_);       // in the job, by index into options_.hosts
  std::vector<int> drop_hosts_ ABSL_GUARDED_BY(mu_);  // leave at the next recovery
  Placement placement_ ABSL_GUARDED_BY(mu_);          // the shard map and the moves
  std::string move_error_ ABSL_GUARDED_BY(mu_);       // why the last RemoveServer failed
  // Stop and start the checkpoints around moves; they take mu_ at their
  // end, so they are joined only by the destructor (outside mu_).
  std::vector<std::thread> checkpoint_turns_ ABSL_GUARDED_BY(mu_);
  struct WaitingBarrier {
    std::function<bool()> cancelled;
    BarrierDone done;
    absl::Time deadline;
    absl::Duration timeout;
  };
  std::vector<WaitingBarrier> barriers_ ABSL_GUARDED_BY(mu_);
  struct ReleasedBarrier {
    WaitingBarrier barrier;
    absl::Status status;
    std::shared_ptr<const std::string> answer;  // when it passed
  };
  std::vector<ReleasedBarrier> released_ ABSL_GUARDED_BY(mu_);
  std::thread failover_;  // restarts the checkpoints with the servers left
  Counter* failovers_;
  Counter* moves_total_;
  std::thread recoverer_;
  Counter* recoveries_;
  Counter* steps_lost_;
  Gauge* registered_;
  Gauge* epoch_gauge_;
  Gauge* active_workers_;
  Counter* heartbeats_;
  // The furthest worker's step (progress_step_), and the steps it advanced
  // by: a dashboard's steps per second.
  Gauge* step_gauge_;
  Counter* steps_;
  // Write the final checkpoint: once every worker finished (kFinishing),
  // or when stopped from outside (kStopping).
  std::thread finisher_;
  std::thread stopper_;
  // Whether someone (psrt-run) watches the job's status, and has read it
  // since the job ended: the coordinator waits for that too, so psrt-run
  // can print the reason rather than guess it. Apart from phase_: it is
  // what an onlooker heard, not where the job is.
  enum class StatusWatch { kNone, kWatching, kHeardEnd };
  StatusWatch status_watch_ ABSL_GUARDED_BY(mu_) = StatusWatch::kNone;
  std::thread monitor_;
};

}  // namespace psrt

#endif  // PSRT_SERVER_JOB_H_
