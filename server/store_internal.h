// The store's insides, shared by its files (server/store*.cc) and by
// nothing else: a key's state and a waiting pull.
#ifndef PSRT_SERVER_STORE_INTERNAL_H_
#define PSRT_SERVER_STORE_INTERNAL_H_

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/key_value.h"
#include "server/store.h"

namespace psrt {

// More of one worker's pushes than this are never in flight at once.
inline constexpr int kPushWindow = 8;
// Longest variable name a server stores.
inline constexpr size_t kMaxNameBytes = 256;
// Pushes at least this big spread their keys over the apply pool.
inline constexpr int64_t kParallelPushBytes = 256 << 10;
// How often waiting pulls are checked for their deadline and their caller.
inline constexpr absl::Duration kSweepInterval = absl::Milliseconds(20);

struct Store::Key {
  // A sync step being gathered.
  struct SyncStep {
    // Who sent this version's pushes so far (their sum is the value's).
    std::vector<char> contributed;
    int contributions = 0;
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
  // guarded by mu.
  std::unique_ptr<KeyValue> value;
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
};

// Keeps the store's count of the bytes it holds in step with one change to
// a key's value: what the value holds after it, less what it held before.
class BytesHeld {
 public:
  BytesHeld(std::atomic<int64_t>* total, const KeyValue& value)
      : total_(total), value_(value), before_(value.bytes()) {}
  ~BytesHeld() { *total_ += value_.bytes() - before_; }
  BytesHeld(const BytesHeld&) = delete;
  BytesHeld& operator=(const BytesHeld&) = delete;

 private:
  std::atomic<int64_t>* const total_;
  const KeyValue& value_;
  const int64_t before_;
};

// A pull whose keys are not all ready. It holds no thread: each key's
// waiter entry serves it when the key gets there, the sweeper ends it at its
// deadline. Fields above `mu` are set once, before it is shared.
struct Store::PendingPull {
  std::vector<Key*> keys;
  std::vector<std::vector<int64_t>> ids;  // per key: a table's rows to send
  std::vector<int64_t> min_version;
  std::vector<v1::DType> dtypes;
  // Room for each answer in the worker's shared memory (null: none).
  std::vector<char*> shared_at;
  std::vector<SharedSpan> spans;
  absl::Time start;
  absl::Time until;
  Cancelled cancelled;
  PullDone done;
  absl::Mutex mu;
  std::vector<OutKey> out ABSL_GUARDED_BY(mu);
  std::vector<char> served ABSL_GUARDED_BY(mu);
  int remaining ABSL_GUARDED_BY(mu) = 0;
  bool finished ABSL_GUARDED_BY(mu) = false;  // done was called, or is being
  absl::Status error ABSL_GUARDED_BY(mu);     // a key it waits for stopped
};

}  // namespace psrt

#endif  // PSRT_SERVER_STORE_INTERNAL_H_
