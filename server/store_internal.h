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
