#ifndef PSRT_WORKER_STATE_KEYS_H_
#define PSRT_WORKER_STATE_KEYS_H_

// The workers' own state, where the optimizer runs on the workers (their
// weights, the optimizer's state, anything a plugin serializes), kept on the
// servers in keys of kind hold so that the job's checkpoints save it once,
// with the servers' keys, and a restore gives it back to every worker.
//
// Rank 0 alone sets it, at the steps it chooses (the checkpoints' steps and
// the last one): the keys' version becomes that step, so a checkpoint at
// step S waits for rank 0's state of step S as for any key of the step.
// Every value carries 3 bytes of the state as a whole number below 2^24,
// exact in float32 and never a NaN. The state is "<name>@state" (its size)
// and chunks "<name>@state/<i>" of 2^(14+i) values, registered as the state
// grows (so a state that grows, LBFGS's history, costs at most twice its
// bytes) and all set at each step (one that shrank leaves none behind).
//
//   psrt::StateKeys state(client.get());
//   absl::StatusOr<std::string> restored = state.Load("torch");  // every worker, at start
//   absl::Status s = state.Save("torch", bytes, step);           // rank 0's counts

#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "worker/client.h"

namespace psrt {

class StateKeys {
 public:
  explicit StateKeys(Client* client) : client_(client) {}
  StateKeys(const StateKeys&) = delete;
  StateKeys& operator=(const StateKeys&) = delete;

  // Every worker, before its first Save: the state `name` the job restored
  // (empty: none, as in a job that starts fresh; FAILED_PRECONDITION where a
  // restored job's checkpoint holds none). Registers its keys.
  absl::StatusOr<std::string> Load(const std::string& name);
  // Rank 0: `bytes` is the state of step `step` (> the last one set); the
  // other ranks return at once. Blocks until the servers hold it.
  absl::Status Save(const std::string& name, absl::string_view bytes, int64_t step);

 private:
  struct Keys {
    std::vector<float> header;  // the size's three parts
    int chunks = 0;             // registered
    std::vector<float> values;  // every chunk's, reused from save to save
  };
  absl::Status Register(const std::string& key, int64_t size, float* data)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Registers the chunks up to `n` (pulling their values).
  absl::Status Grow(const std::string& name, Keys* keys, int n) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Client* const client_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, Keys> keys_ ABSL_GUARDED_BY(mu_);
};

}  // namespace psrt

#endif  // PSRT_WORKER_STATE_KEYS_H_
