#ifndef PSRT_SERVER_STORE_H_
#define PSRT_SERVER_STORE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/metrics.h"
#include "kernels/optimizer.h"
#include "psrt/v1/ps.pb.h"

namespace psrt {

struct StoreOptions {
  bool sync = true;              // false: async, every push applied at once
  int num_workers = 1;
  bool average_gradients = true;  // sync: apply the mean of the pushes
  // Longest a pull waits for a version, whatever the caller's deadline.
  absl::Duration max_pull_wait = absl::Minutes(10);
};

// The keys one server holds: float32 weights, optimizer slots and versions.
// Every entry point validates its whole request before changing anything,
// so a bad request leaves the stored state as it was.
class Store {
 public:
  Store(StoreOptions options, Metrics* metrics);
  ~Store();

  absl::Status RegisterKeys(const v1::RegisterKeysRequest& req);
  absl::Status Push(const v1::PushRequest& req);
  // Waits (until `deadline`) for each key to reach the version asked for.
  absl::Status Pull(const v1::PullRequest& req, absl::Time deadline,
                    v1::PullResponse* resp);
  // Push, then pull each pushed key at the version after the pushed one
  // (sync) or the newest (async).
  absl::Status PushPull(const v1::PushPullRequest& req, absl::Time deadline,
                        v1::PushPullResponse* resp);
  absl::StatusOr<int64_t> SetLearningRate(const v1::SetLearningRateRequest& req);

  int64_t num_keys() const;
  int64_t bytes_stored() const;

 private:
  struct Key;
  absl::StatusOr<Key*> Find(const std::string& variable, uint32_t partition) const;
  absl::Status CheckWorker(int32_t rank) const;
  absl::Status CheckSpec(const Key& key, const v1::KeySpec& spec, int32_t rank) const;
  void Apply(Key* key, const float* grad) ABSL_EXCLUSIVE_LOCKS_REQUIRED(key->mu);
  absl::Status PullKey(Key* key, int64_t min_version, absl::Time deadline,
                       v1::KeyData* out);

  const StoreOptions options_;
  mutable absl::Mutex map_mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<Key>> keys_ ABSL_GUARDED_BY(map_mu_);
  std::atomic<int64_t> bytes_stored_{0};

  Counter* bytes_in_;
  Counter* bytes_out_;
  Counter* pushes_;
  Counter* key_pushes_;
  Counter* duplicate_pushes_;
  Counter* pulls_;
  Counter* updates_;
  Histogram* update_seconds_;
  Histogram* pull_wait_seconds_;
};

absl::StatusOr<OptimizerConfig> OptimizerFromProto(const v1::OptimizerConfig& p);

}  // namespace psrt

#endif  // PSRT_SERVER_STORE_H_
