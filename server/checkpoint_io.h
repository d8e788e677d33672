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
  absl::Status Save(const v1::SaveShardRequest& req, v1::SaveShardResponse* resp);

  // Sync jobs with checkpoint.every_steps: arms the first periodic
  // checkpoint after `start_step` now, and each next one the moment the
  // previous shard is written, so that fast steps cannot pass a checkpoint's
  // step before the coordinator asks for it. `root_uri` as the coordinator
  // names it (Storage::uri()).
  void ArmPeriodic(const std::string& root_uri, int64_t every_steps, int64_t start_step);

 private:
  void ArmNextPeriodic(int64_t after) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Store* const store_;
  absl::Mutex mu_;
  std::string armed_ ABSL_GUARDED_BY(mu_);  // root_uri + "\n" + name
  std::string written_ ABSL_GUARDED_BY(mu_);  // the same, of the last shard written
  v1::SaveShardResponse result_ ABSL_GUARDED_BY(mu_);
  std::string periodic_root_ ABSL_GUARDED_BY(mu_);
  int64_t every_steps_ ABSL_GUARDED_BY(mu_) = 0;
  std::string buffer_ ABSL_GUARDED_BY(mu_);  // reused for every shard
  std::string storage_uri_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<Storage> storage_ ABSL_GUARDED_BY(mu_);
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
