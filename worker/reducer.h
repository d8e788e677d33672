#ifndef PSRT_WORKER_REDUCER_H_
#define PSRT_WORKER_REDUCER_H_

// The workers' mean (or sum) of tensors, step by step: the one rule behind
// every plugin's "mean gradient" (clipping and loss scaling after the mean,
// a gradient tape that returns the mean, an optimizer run on the workers)
// and behind the collectives and the decisions the workers take together.
//
// It goes through keys of kind assign on the servers, registered at first
// use: "<name>@reduce" per tensor and "<first name>@given..." per set of
// tensors reduced together, whose value says which tensors any worker had
// and, on servers that sum, how many workers pushed. Every worker pushes its share for the key's
// next version, the servers aggregate once every worker's push is in, and every worker pulls the
// same bytes, in one round trip per server.
//
//   psrt::Reducer reducer(client.get());
//   std::vector<psrt::ReduceRef> t = {{"w", w_grad.size(), w_grad.data(), mean.data()}};
//   absl::Status s = reducer.Reduce(absl::MakeSpan(t), psrt::ReduceOp::kMean);

#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "worker/client.h"

namespace psrt {

enum class ReduceOp {
  // A worker without a tensor counts as zeros, as under DDP.
  kMean,
  kSum,
};

// One tensor of a Reduce.
struct ReduceRef {
  std::string name;
  int64_t size = 0;           // float32 values, > 0
  const float* in = nullptr;  // this worker's (GPU memory too); none: it has none this step
  float* out = nullptr;       // host memory: the result, zeros where no worker had one
  bool given = false;         // set: whether any worker had one
};

class Reducer {
 public:
  explicit Reducer(Client* client) : client_(client) {}
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // Fills every `out` with the workers' aggregate and `given` with whether
  // any worker had the tensor; blocks until every worker's share is in (the
  // pull's deadline). Sync jobs only; every worker reduces the same tensors
  // (names, sizes, order) in the same order of calls. kSum on servers that
  // average needs every worker in each step (Client::EveryWorkerEachStep).
  // `compression` is how the shares travel (the result comes back exact).
  // `factor` (optional) receives the servers' aggregate over the workers'
  // mean this step: 1 where they average, the number of workers that pushed
  // where they sum (backup workers and elastic membership make it vary).
  absl::Status Reduce(absl::Span<ReduceRef> tensors, ReduceOp op,
                      Compression compression = Compression::kNone, int* factor = nullptr);

  // OK if every worker's `digest` (of its weights, say) is rank 0's; else
  // FAILED_PRECONDITION naming the workers whose `what` differs. Every
  // worker calls it at the same point (sync, every worker each step).
  absl::Status CheckSame(const std::string& what, uint32_t digest);

 private:
  absl::Status Check(absl::Span<const ReduceRef> tensors, ReduceOp op) const;
  // Registers the keys not registered yet, with zeros.
  absl::Status Register(const std::string& key, int64_t size, Compression compression)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Client* const client_;
  // Reductions follow each other in the order the workers call them.
  absl::Mutex mu_;
  // Key -> the version its next push is for.
  absl::flat_hash_map<std::string, int64_t> steps_ ABSL_GUARDED_BY(mu_);
  std::vector<float> flags_in_ ABSL_GUARDED_BY(mu_), flags_out_ ABSL_GUARDED_BY(mu_);
};

}  // namespace psrt

#endif  // PSRT_WORKER_REDUCER_H_
