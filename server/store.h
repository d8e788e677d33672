#ifndef PSRT_SERVER_STORE_H_
#define PSRT_SERVER_STORE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/buffer_pool.h"
#include "common/metrics.h"
#include "common/tensor_coding.h"
#include "common/thread_pool.h"
#include "kernels/optimizer.h"
#include "psrt/v1/ps.pb.h"
#include "server/checkpoint/shard_format.h"
#include "server/key_value.h"

namespace psrt {

struct StoreOptions {
  bool sync = true;  // false: async, every push applied at once
  // Not sync: a pull at clock c waits until every active worker's clock is at
  // least c - staleness (SSP); < 0: never waits (async).
  int staleness = -1;
  int num_workers = 1;
  bool average_gradients = true;  // sync: apply the mean of the pushes
  // Sync: a step is applied once (active workers - backup_workers) pushes
  // for it arrived; later ones are dropped and counted.
  int backup_workers = 0;
  // Largest key accepted (the job's partition size): bounds what one
  // registration can make the server allocate.
  int64_t max_key_bytes = 64ll << 20;
  // Longest a pull waits for a version, whatever the caller's deadline.
  absl::Duration max_pull_wait = absl::Minutes(10);
  // The job starts from a checkpoint: registrations wait for FinishRestore.
  bool restore_pending = false;
  // Threads applying the keys of big pushes in parallel; 0: one per core.
  int apply_threads = 0;
  // An update whose gradient holds NaN or Inf is skipped (the version moves
  // on, the weights stay); true: the key stops with an error instead.
  bool fail_on_nonfinite = false;
  // Sync: how long checkpoints wait for every worker to register a key that
  // some worker registered; then they take it as it is (Store::Stray). Such
  // a key never took a step, so taking it early loses nothing.
  absl::Duration registration_wait = absl::Seconds(60);
  // What one token holder can make the store hold (0: no limit): weights
  // and optimizer state in bytes, distinct variables, keys per variable.
  int64_t max_bytes = 0;
  int max_variables = 0;
  int max_keys_per_variable = 0;
  // This server's index in the job (-1: not known, as in tools and tests):
  // a key whose owner is `self` is its own.
  int self = -1;
};

// The keys one server holds: float32 weights, optimizer slots and versions.
// Every entry point validates its whole request before changing anything,
// so a bad request leaves the stored state as it was.
class Store {
 public:
  Store(StoreOptions options, Metrics* metrics);
  ~Store();

  // Waits (while the server restores a checkpoint) until `deadline` at the
  // latest, or until `cancelled` says the caller went away. `resp` (if
  // given) gets the keys' versions.
  using Cancelled = std::function<bool()>;
  absl::Status RegisterKeys(const v1::RegisterKeysRequest& req,
                            absl::Time deadline = absl::InfiniteFuture(),
                            const Cancelled& cancelled = nullptr,
                            v1::RegisterKeysResponse* resp = nullptr);

  // ---- Replicas ("replicas": 1) ----
  // Sends one update of a key this server serves to its copy on the backup
  // server, before the update is applied here; returns once the backup
  // applied it (or is known to be gone). Set before the store serves: the
  // update path reads it without a lock.
  // Async and ssp: the push an update came from.
  struct Origin {
    int worker = -1;  // -1: a sync step's aggregate
    uint64_t push_id = 0;
    int64_t clock = 0;  // the worker's clock after it
  };
  // Starts sending an update to the key's copy (`owner`: the server whose
  // key it is, -1: this server's own) and returns what waits until the copy
  // holds it (OK, or why it does not); null when there is nothing to wait
  // for. `grad` stays until the waiter has returned.
  using Forwarded = std::function<absl::Status()>;
  using Forward =
      std::function<Forwarded(int owner, const std::string& variable, uint32_t partition,
                              int64_t version, const float* grad, int64_t n, const Origin& origin)>;
  void SetForward(Forward forward);
  // A key of `owner` registered here just now (its first value), for its
  // copy holder where its server builds the copies ("max_servers"): `fill`
  // writes the copy, only if there is a holder to send it to. Called under
  // the key's lock, so no update comes before the copy. Set before serving.
  using SeedNew = std::function<absl::Status(
      int owner, const std::function<void(v1::SeedRequest*)>& fill)>;
  void SetSeedNew(SeedNew seed) { seed_new_ = std::move(seed); }
  // Called when a request finds a copy here that is not served yet: the
  // clients already know it serves it, so the shard map that says so is
  // asked for now. Set before serving.
  void SetOnCopyAsked(std::function<void()> hook) { on_copy_asked_ = std::move(hook); }
  // Applies a primary's update to this server's copy of the key: `req`
  // names it, `gradient` holds its float32 values (req.gradient() over
  // gRPC; the frame's payload over the data channel).
  absl::Status Replicate(const v1::ReplicateRequest& req, absl::string_view gradient);
  // Server `primary` is gone: this server now serves its keys (the copies).
  void Promote(int primary);
  // A whole key from the server that serves it, for a new copy here.
  absl::Status Seed(const v1::SeedRequest& req);
  // Sends every key of server `owner` (-1 or self: this server's own) that
  // this server serves to `send`, each under its lock, so that no update
  // falls between the copy and the updates forwarded after it.
  void SeedCopies(int owner, const std::function<absl::Status(const v1::SeedRequest&)>& send);
  // Server `owner`'s keys (-1 or self: this server's own) moved to server
  // `to`: this server stops serving them and frees their state; pulls
  // waiting for them, and requests that still come, get UNAVAILABLE, so
  // their clients send them again where the shard map says. A sync step
  // half done here is done again there from the resent pushes.
  // `send` hands each key's state over to `to` first (SeedRequest.handover)
  // under the key's lock; null: nothing is handed over.
  using SendSeed = std::function<absl::Status(const v1::SeedRequest&)>;
  void Release(int owner, int to, const SendSeed& send);
  // This server no longer keeps the copies of server `owner`'s keys (their
  // copy holder is another now): frees them.
  void DropCopies(int owner);
  // INVALID_ARGUMENT unless `rank` is a worker of this job.
  absl::Status CheckWorker(int32_t rank) const;
  int num_workers() const { return options_.num_workers; }

  // ---- The data path: requests as received (common/tensor_coding.h) ----
  // Applies (or, in sync mode, accumulates) each key's gradient straight
  // from the request's buffers. Keys of a big push are applied in parallel.
  // Sync: a push with also_for holds those workers' gradients summed with
  // the pusher's (a host summing first) and counts as a push from each.
  absl::Status Push(const WireMessage& req);
  // Cancelled is asked now and then while a pull waits; true ends it (the
  // caller went away).
  // Called once when a pull ends: OK with its keys (values in pooled
  // buffers, in request order), or the error that ended it.
  using PullDone = std::function<void(absl::Status, std::vector<OutKey>)>;
  // Answers when each key has reached the version asked for (sync), or the
  // staleness bound allows (ssp), or at once (async); DEADLINE_EXCEEDED at
  // `deadline` naming what it waited for. No thread waits meanwhile: `done`
  // runs on the calling thread, the thread whose push made the last key
  // ready, or the store's sweeper.
  void PullAsync(const WireMessage& req, absl::Time deadline, Cancelled cancelled, PullDone done);
  // Push, then pull each pushed key at the version after the pushed one
  // (sync) or the newest (async), as `pull_dtype` asks.
  void PushPullAsync(const WireMessage& req, absl::Time deadline, Cancelled cancelled,
                     PullDone done);
  // Pulls waiting now.
  int64_t pending_pulls() const;

  // The same for a parsed protobuf request (tools and tests); the caller's
  // thread waits.
  absl::Status Push(const v1::PushRequest& req);
  absl::Status Pull(const v1::PullRequest& req, absl::Time deadline, v1::PullResponse* resp,
                    const Cancelled& cancelled = nullptr);
  absl::Status PushPull(const v1::PushPullRequest& req, absl::Time deadline,
                        v1::PushPullResponse* resp, const Cancelled& cancelled = nullptr);
  // Ends every wait, now and later, with UNAVAILABLE: the server is stopping.
  void Close();
  absl::StatusOr<int64_t> SetLearningRate(const v1::SetLearningRateRequest& req);
  // The workers taking part from now on (from the coordinator). Sync steps
  // in progress complete if the pushes they have are now enough.
  void SetMembership(int64_t epoch, const std::vector<int>& active_workers);

  // Per worker rank, the least clock over all keys (async and ssp); empty
  // while this server holds no key.
  std::vector<int64_t> WorkerClocks() const;
  int64_t membership_epoch() const;

  int64_t num_keys() const;
  int64_t bytes_stored() const;
  // Least and greatest version over the initialized keys (0, 0 with none).
  std::pair<int64_t, int64_t> VersionRange() const;

  // ---- Checkpoints ----
  // Arms a snapshot: each key is copied the moment it reaches version `step`
  // (at once if it is there), so a sync checkpoint sees every key at the
  // same step while training runs on; the pause is one copy of one key.
  // step < 0 copies every key now. FAILED_PRECONDITION (and nothing armed)
  // if a key is already past `step`.
  absl::Status ArmSnapshot(int64_t step);
  // Waits until every key is copied or `deadline`; the keys left to copy.
  int64_t WaitSnapshot(absl::Time deadline);
  // Disarms, encodes the copies as a shard into `out` and describes them in
  // `info` (keys, variables, worker clocks, longest pause). The copies'
  // buffers stay for the next checkpoint.
  void EncodeSnapshot(std::string* out, v1::SaveShardResponse* info);
  void DisarmSnapshot();
  // Every worker has finished (the job's final checkpoint): a key some
  // never registered never will be, so checkpoints take it at once.
  void EndRegistrations() { registrations_ended_ = true; }

  // A key as a checkpoint holds it: spec (no initial value) and state.
  struct RestoredKey {
    v1::KeySpec spec;
    KeyRecord state;
    int copy_of = -1;  // a copy of that server's key ("replicas": 1)
    int owner = -1;    // served here, but that server's key by the key map
  };
  // Installs the keys of a checkpoint (or, with an error, refuses every
  // registration with it) and lets registrations in. Workers resume at
  // `step`: every worker's clock starts there. From then on a registration
  // must match a restored key: another model's variables are refused.
  void FinishRestore(absl::StatusOr<std::vector<RestoredKey>> keys, int64_t step,
                     const std::string& from);

 private:
  struct PendingPull;
  struct Key {
    // A sync step being gathered.
    struct SyncStep {
      // Who sent this version's pushes so far (their sum is the value's).
      std::vector<char> contributed;
      int contributions = 0;
      // Those of the contributions that carried a gradient (the others
      // said KeyData.no_gradient); none: the step makes no update.
      int gradients = 0;
      // The last version each worker pushed for, to tell a retry of an
      // applied step from a backup worker's late push.
      std::vector<int64_t> last_step;
      // How many pushes complete a step.
      int required = 1;
    };
    // Async and ssp: what a worker's pushes have done so far.
    struct PushWindow {
      // A compressed gradient decoded, reused for every push.
      std::vector<float> scratch;
      // Each worker's clock (pushes made), for the staleness bound.
      std::vector<int64_t> clock;
      // The last kPushWindow push ids applied per worker, so a retried push is
      // applied once even when a worker's pushes overtake each other.
      std::vector<uint64_t> recent_push_ids;
      std::vector<uint8_t> recent_next;
    };
    // "replicas" and servers joining or leaving: whose key this is here.
    struct ReplicaRole {
      // A copy of server copy_of's key (-1: this server's own), updated by its
      // Replicate calls; served (pushed, pulled, checkpointed) here once that
      // server is gone.
      int copy_of = -1;
      bool serving = true;
      int moved_to = -1;  // Release: the server that serves it now
      // A table's part whose rows are still being handed over (Seed's
      // more_rows): not served until they are all here.
      bool rows_coming = false;
    };
    // The copy an armed checkpoint took (buffers kept for the next one).
    struct SnapshotSlot {
      bool ready = false;
      KeyRecord copy;
      bool stray = false;  // the copy is of a Stray key
    };
    // The workers that registered this key here (by rank), since when.
    struct Registrants {
      std::vector<char> by;
      absl::Time first;
      bool warned = false;  // the warning of a partial registration is logged
    };

    absl::Mutex mu;
    std::string name;  // "variable#partition"
    v1::KeySpec spec;  // as first registered, without the initial value
    // Its kind (dense or a table's part), made with the key; what it holds is
    // guarded by mu (the pointer itself never changes).
    std::unique_ptr<KeyValue> value ABSL_PT_GUARDED_BY(mu);
    OptimizerConfig optimizer ABSL_GUARDED_BY(mu);  // rank 0's, once it registered
    int64_t n = 0;
    bool initialized ABSL_GUARDED_BY(mu) = false;
    int64_t version ABSL_GUARDED_BY(mu) = 0;
    double lr ABSL_GUARDED_BY(mu) = 0;
    bool lr_set ABSL_GUARDED_BY(mu) = false;  // changed by a worker before init
    // Who takes part.
    std::vector<char> active ABSL_GUARDED_BY(mu);
    SyncStep sync ABSL_GUARDED_BY(mu);
    PushWindow window ABSL_GUARDED_BY(mu);
    ReplicaRole role ABSL_GUARDED_BY(mu);
    SnapshotSlot snapshot ABSL_GUARDED_BY(mu);
    Registrants registered ABSL_GUARDED_BY(mu);
    // Pulls waiting for this key: the pull and the key's index in it.
    std::vector<std::pair<std::shared_ptr<PendingPull>, int>> waiters ABSL_GUARDED_BY(mu);
    // Updates whose gradient held NaN or Inf; with "nonfinite": "fail" the
    // first one stops the key (every push and pull after it gets this error).
    int64_t nonfinite ABSL_GUARDED_BY(mu) = 0;
    absl::Status stopped ABSL_GUARDED_BY(mu);

    // An assign key (kernels/optimizer.h) holds data that workers replace (the
    // mean gradient, BatchNorm's statistics, frozen weights): its version does
    // not follow the training step, so checkpoints take it as it is and the
    // step is read from the other keys.
    bool FreeRunning() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
      return optimizer.kind == OptimizerKind::kAssign;  // never a table's
    }
    // A hold key (kernels/optimizer.h) holds the workers' state: rank 0
    // alone registers and sets it, whole, for the step it names, which
    // becomes its version (it does not move between those steps).
    bool Held() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
      return optimizer.kind == OptimizerKind::kHold;
    }
  };
  using Completed = std::vector<std::shared_ptr<PendingPull>>;
  absl::StatusOr<Key*> Find(const std::string& variable, uint32_t partition) const;
  // The key `spec` names, made (without a value) if it is new.
  Key* FindOrAddLocked(const v1::KeySpec& spec, bool* added) ABSL_EXCLUSIVE_LOCKS_REQUIRED(map_mu_);
  absl::Status NotServing(const Key* k) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(k->mu);
  // Whether k is server `owner`'s key (-1 or self: this server's own).
  bool Owns(const Key* k, int owner) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(k->mu);
  // A Seed of k for server `primary`'s copy: its spec, version, rate and
  // clocks (its values: KeptCopy::WriteCopy); and (handover) what a move
  // adds.
  void FillSeed(const Key* k, int primary, v1::SeedRequest* req) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(k->mu);
  void FillHandover(const Key* k, v1::SeedRequest* req) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(k->mu);
  // Frees k's values (a key moved away, or a copy no longer kept).
  void Free(Key* k) ABSL_EXCLUSIVE_LOCKS_REQUIRED(k->mu);
  // Seed's checks of what a hand-over adds; taking it (and the version,
  // rate and clocks every seed has) into k.
  absl::Status CheckHandover(const v1::SeedRequest& req, const std::string& name) const;
  void TakeHandover(Key* k, const v1::SeedRequest& req) ABSL_EXCLUSIVE_LOCKS_REQUIRED(k->mu);
  // What a new key costs in weights, optimizer slots and (sync) accumulator.
  int64_t KeyBytes(int64_t n, const OptimizerConfig& optimizer) const;
  // New keys of one registration so far, against the limits.
  struct Room {
    absl::flat_hash_set<std::string> variables;  // held, plus those registered
    int64_t bytes = 0;
  };
  absl::Status CheckRoomLocked(const v1::KeySpec& spec, const OptimizerConfig& optimizer,
                               Room* room) ABSL_SHARED_LOCKS_REQUIRED(map_mu_);
  absl::Status CheckSpec(const Key& key, const v1::KeySpec& spec, int32_t rank) const;
  // RegisterKeys, by concern: the whole request checked (each key's
  // optimizer into `optimizers`); each key found or made, with its role;
  // its registrant counted, and the key started by rank 0's registration
  // (StartKey: initial value, rate, the copy for its copy holder).
  absl::Status CheckRegistration(const v1::RegisterKeysRequest& req,
                                 std::vector<OptimizerConfig>* optimizers);
  absl::StatusOr<Key*> FindOrAddRegistered(const v1::RegisterKeysRequest& req,
                                           const v1::KeySpec& spec);
  void Register(Key* key, const v1::RegisterKeysRequest& req, const v1::KeySpec& spec,
                const OptimizerConfig& optimizer, v1::RegisterKeysResponse* resp);
  void StartKey(Key* key, const v1::KeySpec& spec, const OptimizerConfig& optimizer)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(key->mu);
  // One update of key's value (forwarded to its copy, where it has one).
  void Apply(Key* key, const Update& update, const Origin& origin)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(key->mu);
  // The version moves on (and a checkpoint may copy it): after an update
  // (Applied, which counts it), or a step that made none.
  void NextVersion(Key* key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(key->mu);
  void Applied(Key* key, absl::Time start) ABSL_EXCLUSIVE_LOCKS_REQUIRED(key->mu);
  // A gradient with NaN or Inf is not applied: true, and the key skips the
  // version or stops ("nonfinite").
  bool SkipNonfinite(Key* key, const float* grad, int64_t n) ABSL_EXCLUSIVE_LOCKS_REQUIRED(key->mu);
  // A push's gradient as float32: where it lies, or decoded into scratch.
  Update Gradient(Key* k, const WireKey& kd) ABSL_EXCLUSIVE_LOCKS_REQUIRED(k->mu);
  // A request's ids (a table's), and room for the rows it would make.
  absl::Status CheckRowsLocked(Key* k, absl::Span<const int64_t> ids)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(k->mu);
  // Async: remembers a push as applied (its id, the worker's clock after it).
  void RecordPush(Key* k, const Origin& origin) ABSL_EXCLUSIVE_LOCKS_REQUIRED(k->mu);
  // Sync: applies the step when enough pushes for it arrived.
  void MaybeFinishStep(Key* key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(key->mu);
  std::vector<Key*> AllKeys() const;
  // Sizes a key's state for `optimizer` (slots initialised, weights unset).
  void InitKey(Key* key, const OptimizerConfig& optimizer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(key->mu);
  void CopyForSnapshot(Key* key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(key->mu);
  // Sync: a key some active worker has not registered registration_wait
  // after the first did, still at version 0 at a checkpoint of a later step
  // (or, once registrations ended, any key short of the step):
  // it cannot reach the step, so the checkpoint takes it as it is (or leaves
  // it out without a value) instead of waiting for it. Warns once per key.
  bool Stray(Key* key, int64_t step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(key->mu);
  absl::Status WaitForRestore(absl::Time deadline, const Cancelled& cancelled);
  // A push to a hold key: rank 0's, whole, float32, in a sync job.
  absl::Status CheckHeldPush(const Key* k, const WireMessage& req, const WireKey& kd) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(k->mu);
  // One key of a validated push.
  void ApplyPush(Key* k, const WireMessage& req, const WireKey& kd)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(k->mu);
  // A push's also_for: sync only; ranks of the job, each once, not the
  // pusher's own.
  absl::Status CheckAlsoFor(const WireMessage& req) const;
  // A push whose assign_rows is set: rows' values for a table's part before
  // its first step.
  absl::Status AssignRows(const WireMessage& req);
  // Whether key k takes pushes now: served here, registered by rank 0, not
  // stopped (by a NaN with "nonfinite": "fail").
  absl::Status Pushable(Key* k) ABSL_EXCLUSIVE_LOCKS_REQUIRED(k->mu);
  // A push's key that says it has no gradient carries nothing else.
  static absl::Status CheckNoGradient(const Key* k, const WireKey& kd);
  // Sync: how many of the workers a push counts for (the pusher and its
  // also_for) pushed for k's step already.
  int Counted(Key* k, const WireMessage& req) ABSL_EXCLUSIVE_LOCKS_REQUIRED(k->mu);

  // ---- Waiting pulls ----
  bool Ready(Key* k, int64_t min_version) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(k->mu);
  int64_t SlowestClock(Key* k) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(k->mu);
  // Copies key `k` (index i of `p`) into `p`'s answer; true when that was
  // the last key the pull waited for.
  bool Serve(Key* k, PendingPull* p, int i) ABSL_EXCLUSIVE_LOCKS_REQUIRED(k->mu);
  // Key `k` (index i of `p`) can be pulled (not served yet: serving a
  // table's key makes its new rows, which a refused pull must not leave).
  absl::Status CheckPull(Key* k, const PendingPull& p, int i) ABSL_EXCLUSIVE_LOCKS_REQUIRED(k->mu);
  // Serves the waiters `k` can now answer; pulls that became whole go to
  // `completed`, to be completed once `k` is unlocked.
  void NotifyWaiters(Key* k, Completed* completed) ABSL_EXCLUSIVE_LOCKS_REQUIRED(k->mu);
  void Complete(PendingPull* p);
  void Fail(PendingPull* p, const absl::Status& status);
  std::string WhyWaiting(PendingPull* p);
  std::vector<std::shared_ptr<PendingPull>> TakePending();
  void Sweep();
  void RunSweeper();
  absl::Status WaitPull(const std::function<void(PullDone)>& start,
                        google::protobuf::RepeatedPtrField<v1::KeyData>* out);

  const StoreOptions options_;
  mutable absl::Mutex map_mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<Key>> keys_ ABSL_GUARDED_BY(map_mu_);
  std::atomic<int64_t> bytes_stored_{0};
  std::atomic<bool> closing_{false};
  mutable absl::Mutex members_mu_;
  std::vector<char> active_ ABSL_GUARDED_BY(members_mu_);
  int64_t epoch_ ABSL_GUARDED_BY(members_mu_) = 1;

  static constexpr int64_t kNotArmed = INT64_MIN;
  std::atomic<int64_t> snapshot_step_{kNotArmed};
  std::atomic<bool> snapshot_now_{false};  // armed with step < 0: all copied
  std::atomic<bool> registrations_ended_{false};
  std::atomic<double> max_pause_s_{0};
  mutable absl::Mutex restore_mu_;
  bool restore_pending_ ABSL_GUARDED_BY(restore_mu_);
  absl::Status restore_status_ ABSL_GUARDED_BY(restore_mu_);
  std::string restored_from_ ABSL_GUARDED_BY(restore_mu_);

  BufferPool buffers_;  // pulled values on their way out
  std::unique_ptr<ThreadPool> apply_pool_;
  Forward forward_;                      // set before serving, then read only
  SeedNew seed_new_;                     // set before serving, then read only
  std::function<void()> on_copy_asked_;  // the same
  mutable absl::Mutex pending_mu_;
  std::vector<std::shared_ptr<PendingPull>> pending_ ABSL_GUARDED_BY(pending_mu_);
  absl::Mutex sweeper_mu_;
  bool sweeper_stop_ ABSL_GUARDED_BY(sweeper_mu_) = false;
  std::thread sweeper_;

  Counter* bytes_in_;
  Counter* bytes_out_;
  Counter* pushes_;
  Counter* key_pushes_;
  Counter* duplicate_pushes_;
  Counter* pulls_;
  Counter* updates_;
  Counter* nonfinite_updates_;
  Counter* evicted_rows_;
  Histogram* update_seconds_;
  Histogram* pull_wait_seconds_;
  Counter* dropped_pushes_;
  Histogram* staleness_;
  Gauge* epoch_gauge_;
  Counter* compressed_pushes_;
  Counter* rescaled_pushes_;
  Counter* nonfinite_pushes_;
  Gauge* waiting_pulls_;
  Histogram* snapshot_pause_seconds_;
};

}  // namespace psrt

#endif  // PSRT_SERVER_STORE_H_
