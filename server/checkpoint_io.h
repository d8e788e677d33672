#ifndef PSRT_SERVER_CHECKPOINT_IO_H_
#define PSRT_SERVER_CHECKPOINT_IO_H_

// A server's part of checkpoints: saving its shard when the coordinator asks,
// and loading the keys it holds from a checkpoint at start, whatever number
// of servers and partition size wrote it.

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "psrt/v1/ps.pb.h"
#include "server/checkpoint/catalog.h"
#include "server/store.h"

namespace psrt {

// Serves SaveShard. One checkpoint is armed at a time; asking with another
// name re-arms. The answer for a written shard is kept, so the coordinator
// may ask again (a retry, or after a timeout) without a second write.
class ShardSaver {
 public:
  explicit ShardSaver(Store* store) : store_(store) {}
  // The one destination this server writes shards under: the job's
  // checkpoint.uri as the coordinator names it (Storage::uri()). Set before
  // serving; without one every SaveShard is PERMISSION_DENIED.
  void Confine(std::string root_uri) { root_ = std::move(root_uri); }
  // Answers by `deadline` (the caller's) at the latest: a call that finds
  // another one saving waits for it only until then, and answers not done.
  absl::Status Save(const v1::SaveShardRequest& req, absl::Time deadline, v1::SaveShardResponse* resp);

  // Sync jobs with checkpoint.every_steps: arms the first periodic
  // checkpoint after `start_step` now, and each next one the moment the
  // previous shard is written, so that fast steps cannot pass a checkpoint's
  // step before the coordinator asks for it. Needs Confine first.
  void ArmPeriodic(int64_t every_steps, int64_t start_step);

 private:
  // Save's work once it holds the turn; waits for the keys until `until`.
  absl::Status SaveTurn(const v1::SaveShardRequest& req, absl::Time until, v1::SaveShardResponse* resp);
  void ArmNextPeriodic(int64_t after);  // holds the turn

  Store* const store_;
  std::string root_;
  absl::Mutex mu_;
  // One call at a time saves: it takes the turn (busy_) and then owns the
  // fields below without holding mu_, so that the others can give up at
  // their deadline instead of queueing on the mutex.
  bool busy_ ABSL_GUARDED_BY(mu_) = false;
  std::string armed_;    // root_uri + "\n" + name
  std::string written_;  // the same, of the last shard written
  v1::SaveShardResponse result_;
  int64_t every_steps_ = 0;
  std::string buffer_;  // reused for every shard
  std::unique_ptr<Storage> storage_;
};

// The keys server `index` of `num_servers` holds, partitioned with
// `partition_bytes`, cut from the checkpoint's records by element range.
// Reads only the shards it needs, and verifies each (DATA_LOSS names the file
// and record).
absl::StatusOr<std::vector<Store::RestoredKey>> LoadServerKeys(const CheckpointRef& checkpoint,
                                                               int index, int num_servers,
                                                               int64_t partition_bytes);

}  // namespace psrt

#endif  // PSRT_SERVER_CHECKPOINT_IO_H_
