#ifndef PSRT_WORKER_LEARNING_RATES_H_
#define PSRT_WORKER_LEARNING_RATES_H_

// The learning rates the servers hold, as this worker last set them, so that
// Client::SetLearningRate sends a rate only when it changes: a plugin sets
// the optimizer's rate before every step (a scheduler's, or the one a user
// wrote into a param group), and most steps it is the one already held.

#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"

namespace psrt {

class LearningRates {
 public:
  // `name` was registered with `lr`; `known`: whether the servers hold that
  // rate (not where the key had taken steps already: a restored checkpoint's
  // or a running job's rate may differ).
  void Registered(const std::string& name, double lr, bool known);
  // Whether the servers hold `lr` for `variable` (empty: for every dense
  // variable this worker registered), so that setting it again changes
  // nothing. Tables are not tracked (never Registered): a rate for every
  // variable is the dense ones' on the servers too, and a table's own rate
  // is sent by name whenever it is set.
  bool Held(const std::string& variable, double lr) const;
  // The servers took `lr` for `variable` (empty: every dense variable).
  void Sent(const std::string& variable, double lr);

 private:
  mutable absl::Mutex mu_;
  // Registered variable -> the rate its keys hold, where known.
  absl::flat_hash_map<std::string, std::optional<double>> held_ ABSL_GUARDED_BY(mu_);
};

}  // namespace psrt

#endif  // PSRT_WORKER_LEARNING_RATES_H_
