#ifndef PSRT_SERVER_CHECKPOINTER_H_
#define PSRT_SERVER_CHECKPOINTER_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/metrics.h"
#include "psrt/v1/coordinator.pb.h"
#include "psrt/v1/ps.grpc.pb.h"
#include "server/checkpoint/storage.h"

namespace psrt {

struct CheckpointerOptions {
  v1::CheckpointConfig config;  // uri, every_steps, every_seconds, keep
  std::string mode;             // the job's: "sync" | "async" | "ssp"
  int64_t partition_bytes = 0;
  std::string token;
  // Longest one checkpoint may take once its step is reached.
  absl::Duration save_timeout = absl::Minutes(10);
};

// What a Job (server/job.h) asks of its checkpoints; Checkpointer below
// writes them, unit tests fake them. The methods are Checkpointer's.
class CheckpointControl {
 public:
  virtual ~CheckpointControl() = default;
  virtual void Start(const std::vector<std::string>& server_addresses, int64_t start_step) = 0;
  virtual absl::StatusOr<v1::CheckpointResponse> SaveNow(absl::Time deadline) = 0;
  virtual absl::StatusOr<v1::CheckpointResponse> Finish(
      const std::vector<std::string>& server_addresses) = 0;
  virtual void Abort(absl::Duration grace) = 0;
  virtual void StopTriggers() = 0;
  virtual void Cancel() = 0;
  virtual std::optional<v1::CheckpointResponse> LastCommitted() = 0;
  virtual int64_t saved() const = 0;
  virtual double saved_seconds() const = 0;
  virtual absl::Status WriteRecord(int64_t generation, const std::string& uri, int64_t step,
                                   const std::vector<int>& hosts) = 0;
};

// The coordinator's side of checkpoints. Every checkpoint goes the same way:
// each server saves its shard (in parallel; sync mode: every key exactly at
// one step), then the manifest is written (the commit point), then LATEST,
// then checkpoints beyond `keep` are removed. A crash at any moment leaves
// the previous checkpoint as it was.
class Checkpointer final : public CheckpointControl {
 public:
  // Opens the destination and reads it once, so a bad bucket, endpoint or
  // credentials fail the job at start rather than at its first checkpoint.
  static absl::StatusOr<std::unique_ptr<Checkpointer>> Open(CheckpointerOptions options,
                                                            Metrics* metrics);
  ~Checkpointer() override;

  // Begins the every_steps / every_seconds triggers for these servers, from
  // `start_step` (the restored step, if any). May follow Stop or Abort (a
  // recovered job's new servers).
  void Start(const std::vector<std::string>& server_addresses, int64_t start_step) override;
  // The servers the next checkpoint asks (servers joined or left since Start).
  void Retarget(const std::vector<std::string>& server_addresses);
  // Writes a checkpoint now (sync: at the step the fastest key is at) and
  // answers once it is committed, or with why not by `deadline`.
  absl::StatusOr<v1::CheckpointResponse> SaveNow(absl::Time deadline) override;
  // Stops the triggers (their checkpoint in progress ends first), then
  // writes the job's final checkpoint from these servers. Every worker has
  // finished: a key some never registered is taken as it is at once, and a
  // server that does not answer at once is asked again for a while.
  // NOT_FOUND: the workers registered no variable, so nothing was saved.
  absl::StatusOr<v1::CheckpointResponse> Finish(
      const std::vector<std::string>& server_addresses) override;
  // Stops the triggers (a checkpoint in progress ends at its next poll).
  void Stop();
  // Stops the triggers; a checkpoint in progress gets `grace` to commit (its
  // shards may all be written already), then is cancelled: its servers are
  // gone or about to be replaced. The final checkpoint (Finish) is not
  // cancelled. Returns once nothing is being written.
  void Abort(absl::Duration grace) override;
  // Stop the triggers without waiting (callable under a caller's lock): no
  // periodic checkpoint is armed after it. StopTriggers lets one being
  // written go on, and SaveNow still works (a final checkpoint); Cancel also
  // cancels whatever is being written and refuses more (the job failed).
  // Start arms them again.
  void StopTriggers() override;
  void Cancel() override;
  // The newest checkpoint this job committed (uri and step), if any.
  std::optional<v1::CheckpointResponse> LastCommitted() override;
  // Checkpoints committed so far, and the seconds they took together.
  int64_t saved() const override { return saved_->value(); }
  double saved_seconds() const override { return seconds_->sum(); }

  // The job's record next to its checkpoints (JOB): its generation and the
  // checkpoint a recovery returns to; every commit updates the latter.
  absl::Status WriteRecord(int64_t generation, const std::string& uri, int64_t step,
                           const std::vector<int>& hosts) override;
  // This job's record (NOT_FOUND without one; FAILED_PRECONDITION when it is
  // another job's).
  absl::StatusOr<v1::JobRecord> ReadRecord();

 private:
  Checkpointer(CheckpointerOptions options, std::unique_ptr<Storage> root, Metrics* metrics);
  void Loop();
  bool sync() const { return options_.mode == "sync"; }
  // One call to every server at once, by gRPC's callback API: a thread per
  // server would mean thousands, at every poll of a large job. `start(i,
  // stub, ctx, done)` starts server i's call, which ends by calling done. Returns
  // each call's status once all have ended; Cancel cancels them, and after
  // it a call is CANCELLED without being sent.
  using StartCall = std::function<void(int, v1::ParameterServer::Stub*, grpc::ClientContext*,
                                       std::function<void(grpc::Status)>)>;
  std::vector<grpc::Status> CallEach(absl::Duration timeout, const StartCall& start);
  // Per server, its Stats (asked all at once); or the first error. Servers
  // that could not be reached are asked again until `retry_until`.
  absl::StatusOr<std::vector<v1::StatsResponse>> AllStats(absl::Time retry_until);
  // Registers a server call so that Abort can cancel it; false once cancelled.
  bool Track(grpc::ClientContext* ctx);
  void Untrack(grpc::ClientContext* ctx);
  // The checkpoint SaveNow writes: sync, the version of the fastest key;
  // otherwise the least worker clock (keys are copied as they are).
  absl::StatusOr<int64_t> CurrentStep(absl::Time retry_until);
  // SaveNow; `final`: the job's last checkpoint (SaveShardRequest.final).
  absl::StatusOr<v1::CheckpointResponse> Save(absl::Time deadline, bool final);
  // What the triggers' loop carries from one turn to the next.
  struct LoopState {
    int64_t target = -1;                           // the step of the next periodic checkpoint
    bool target_checked = false;                   // whether it is known not to be committed
    int64_t warned = -1;                           // the step whose failure was last logged
    std::vector<v1::SaveShardResponse> responses;  // of the target's rounds
    absl::Time last;                               // the last checkpoint's end
  };
  // One turn of the sync triggers' loop; returns how long to wait before
  // the next (without holding save_mu_, which on-demand saves need).
  absl::Duration SyncTurn(LoopState* state);
  // One SaveShard to every server in parallel, each waiting up to `wait`
  // for its keys to reach `step`. OK with *done when every shard is written.
  // `responses` carries over between rounds of one checkpoint: once a
  // server wrote keys, servers holding none may answer with empty shards.
  absl::Status Round(const std::string& name, int64_t step, absl::Duration wait, bool final,
                     std::vector<v1::SaveShardResponse>* responses, bool* done);
  absl::StatusOr<v1::CheckpointResponse> Commit(const std::string& name, int64_t step,
                                                const std::vector<v1::SaveShardResponse>& shards,
                                                absl::Time started)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(save_mu_);
  // The committed checkpoint `name`, if there is one.
  absl::StatusOr<bool> Committed(const std::string& name);
  v1::CheckpointResponse Response(const std::string& name, int64_t step, bool already) const;
  bool stopping();
  absl::Status PutRecord() ABSL_EXCLUSIVE_LOCKS_REQUIRED(record_mu_);
  void Halt(absl::Duration grace);

  const CheckpointerOptions options_;
  const std::unique_ptr<Storage> root_;
  absl::Mutex save_mu_;  // one checkpoint at a time
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  // Finish is writing the final checkpoint: an Abort (a failover or
  // recovery that began just before the end) does not cancel it; Cancel
  // (the job failed) does.
  bool finishing_ ABSL_GUARDED_BY(mu_) = false;
  bool job_failed_ ABSL_GUARDED_BY(mu_) = false;                  // Cancel was called
  bool looping_ ABSL_GUARDED_BY(mu_) = false;                     // the triggers' thread runs
  std::vector<grpc::ClientContext*> calls_ ABSL_GUARDED_BY(mu_);  // server calls in flight
  std::optional<v1::CheckpointResponse> last_committed_ ABSL_GUARDED_BY(mu_);
  absl::Mutex record_mu_;
  v1::JobRecord record_ ABSL_GUARDED_BY(record_mu_);
  // Set by Start while no checkpoint is being written.
  std::vector<std::string> addresses_;
  // Their stubs, made at the first call after Start (Servers): a channel per
  // server takes a while at thousands of servers, and the coordinator calls
  // Start under its lock.
  const std::vector<std::unique_ptr<v1::ParameterServer::Stub>>& Servers();
  absl::Mutex stubs_mu_;
  std::vector<std::unique_ptr<v1::ParameterServer::Stub>> servers_ ABSL_GUARDED_BY(stubs_mu_);
  int64_t start_step_ = 0;
  // The triggers' thread: started and joined under halt_mu_, since a
  // failover's Abort and the job's Finish may stop it at the same time.
  absl::Mutex halt_mu_;
  std::thread loop_ ABSL_GUARDED_BY(halt_mu_);
  Counter* saved_;
  Counter* failed_;
  Histogram* seconds_;
  Gauge* last_step_;
  Gauge* last_pause_;
};

}  // namespace psrt

#endif  // PSRT_SERVER_CHECKPOINTER_H_
