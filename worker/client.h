#ifndef PSRT_WORKER_CLIENT_H_
#define PSRT_WORKER_CLIENT_H_

// The worker side of psrt: register variables, push gradients and pull
// weights for many tensors at once, asynchronously, waiting on handles.
//
//   auto client = psrt::Client::Connect(psrt::ClientOptions::FromEnv().value());
//   client->RegisterVariable("w", {1024}, w.data(), psrt::SgdOptions(0.1));
//   psrt::Client::Handle h = client->PushPull({{"w", grad.data(), w.data()}}, step);
//   absl::Status s = client->Wait(h);

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "kernels/optimizer.h"

namespace psrt {

struct ClientOptions {
  std::string coordinator;  // host:port of psrt-coordinator
  std::string token;        // the job token
  int rank = -1;            // this worker's rank
  std::string host;
  // Longest any single push, pull or registration may take, waits for a
  // version included.
  absl::Duration rpc_timeout = absl::Seconds(120);
  // How long to keep retrying a server that cannot be reached.
  absl::Duration retry_budget = absl::Seconds(5);
  absl::Duration connect_timeout = absl::Seconds(120);
  // TCP connections to each server that pushes and pulls are spread over
  // (docs/runtime.md, "Data path", says how the default was chosen).
  int connections_per_server = 2;
  // The job generation this process was started for (psrt-worker sets it
  // after a recovery); 0: the current one.
  int64_t generation = 0;
  // Non-empty: write a timeline of this worker's pushes, pulls and waits
  // (worker/timeline.h) to this path (rank 0) or to it with ".rank<R>"
  // before its extension (rank R).
  std::string timeline;
  // The host group this process sums its gradients with (psrt-worker's
  // shared-memory directory, in a sync job with local aggregation) and its
  // place in it; empty: none.
  std::string host_group;
  int local_rank = 0;

  // PSRT_COORDINATOR, PSRT_JOB_TOKEN, PSRT_RANK (as psrt-worker sets them),
  // PSRT_RPC_TIMEOUT_S, PSRT_CONNECTIONS_PER_SERVER, PSRT_GENERATION,
  // PSRT_TIMELINE, PSRT_HOST_GROUP, PSRT_LOCAL_RANK.
  static absl::StatusOr<ClientOptions> FromEnv();
};

// Optimizer settings with PyTorch's defaults.
OptimizerConfig DefaultOptimizer(OptimizerKind kind, double lr);

// One variable in a push or pull. Buffers hold the whole variable as
// float32 and must stay valid until the operation's Wait returns. They may
// be in GPU memory (in a build with CUDA): gradients are then compressed on
// the device before the device-to-host copy.
struct TensorRef {
  std::string name;
  const float* grad = nullptr;  // pushed (Push, PushPull); none: no gradient this step
  float* out = nullptr;         // filled (Pull, PushPull)
};

// How a variable's values travel; kJobDefault takes the job's
// "compression" / "pull_compression" setting.
enum class Compression { kJobDefault, kNone, kFp16, kBf16 };

// A sparse table (docs/sparse.md): rows of `dim` float32 keyed by int64
// ids, spread over the servers by a hash of the id.
struct TableOptions {
  int64_t dim = 0;
  int64_t vocab = 0;  // > 0: ids in [0, vocab); 0: an open hash table (any id)
  uint64_t seed = 0;
  double init_std = 1.0;  // new rows are N(0, init_std^2), as nn.Embedding's
  int64_t max_rows = 0;   // per server; 0: no cap
  // Open hash tables: rows not pushed or pulled for evict_after_steps
  // steps, and rows pushed fewer than evict_min_count times in their first
  // evict_after_steps steps, are dropped (0: off).
  int64_t evict_after_steps = 0;
  int64_t evict_min_count = 0;
  // Row-wise: sgd, adagrad, adam (the lazy form of torch.optim.SparseAdam)
  // or ftrl.
  OptimizerConfig optimizer;
  Compression push = Compression::kJobDefault;
  Compression pull = Compression::kJobDefault;
};

class Client {
 public:
  using Handle = uint64_t;

  // Registers with the coordinator, passes the readiness barrier and learns
  // the shard map.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const ClientOptions& options);
  ~Client();
  // The training is done: sends this process's totals (bytes pushed and
  // pulled, time waiting for pulls) to the coordinator for the job's
  // summary. The destructor does so too; a process that never destroys its
  // client (an interpreter's exit) calls this.
  void Finish();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  int rank() const;
  int num_workers() const;
  // Workers taking part now (the membership, as last heard): fewer than
  // num_workers() once some left or, in an elastic job, before all joined.
  int active_workers() const;
  int num_servers() const;
  bool sync() const;  // false: async mode
  // Sync: the servers apply the mean of a step's pushes (gradient_aggregation
  // "mean"); false: their sum.
  bool averages() const;
  // The step the job resumes at when it started from a checkpoint (0
  // otherwise): a training loop starts counting there. In sync mode it is
  // also the version RegisterVariable pulls.
  int64_t restored_step() const;
  // The job's checkpoints' every_steps (0: the final one alone; -1: none).
  int64_t checkpoint_every_steps() const;
  // OK where every sync step waits for every worker's push (no backup
  // workers, not elastic, a lost worker ends the job), so a sum over a
  // step's pushes is one over the job's workers: what collectives through
  // the servers need. Otherwise FAILED_PRECONDITION saying which option.
  absl::Status EveryWorkerEachStep() const;
  // OK where the weights and optimizer state may live on the workers, each
  // applying its own optimizer to the step's mean gradient (Reducer): a sync
  // job in which no running process must receive them from elsewhere later
  // (no recovery, worker restarts or elastic joins, which hand over only
  // what the servers hold), checkpointed by steps, and in which every worker
  // takes part in each step (EveryWorkerEachStep: the weights' check needs
  // them all). `saves_state`: the plugin keeps its state in the job's
  // checkpoints (StateKeys); without it, checkpoints and restore are refused
  // too. Otherwise FAILED_PRECONDITION saying which option.
  absl::Status StateOnWorkers(bool saves_state) const;

  // Registers a float32 variable on the servers. Rank 0's `data` is the
  // initial value; then every rank's `data` is overwritten with the current
  // weights (rank 0's value, or the trained weights for a worker that rejoins).
  // `push` and `pull` choose how its gradients and weights travel (fp16 and
  // bf16 halve the bytes; servers keep float32 master weights).
  absl::Status RegisterVariable(const std::string& name, std::vector<int64_t> shape, float* data,
                                const OptimizerConfig& optimizer,
                                Compression push = Compression::kJobDefault,
                                Compression pull = Compression::kJobDefault);

  // Registers a sparse table on every server; every rank registers it with
  // the same options.
  absl::Status RegisterTable(const std::string& name, const TableOptions& options);
  // Pulls the rows of `n` distinct ids into `out` (n * dim floats), at
  // least at `min_version` (sync: the step). Rows not made yet are made.
  Handle PullRows(const std::string& table, const int64_t* ids, int64_t n, float* out,
                  int64_t min_version);
  // Before a table's first step, the rows of `n` distinct ids take `values`
  // (n * dim floats) on the servers, with fresh optimizer state: a table
  // that starts from pretrained rows. One rank assigns them, in messages of
  // at most a few MiB, and the others must not pull them before it is done
  // (a barrier). Blocks until the servers hold them.
  absl::Status AssignRows(const std::string& table, const int64_t* ids, int64_t n,
                          const float* values);
  // Pushes the gradients (n * dim floats) of the rows of `n` distinct ids,
  // computed at `version`. In sync mode every worker pushes once per step
  // (n may be 0): the servers apply the step's mean gradient per row. The
  // part for a server this worker has not pulled from at `version` (none
  // of its ids there) waits until that server has applied the step before.
  // Table buffers are host memory and must live until Wait returns.
  Handle PushRows(const std::string& table, const int64_t* ids, int64_t n, const float* grads,
                  int64_t version);

  // Pushes gradients computed from weights of `version` (sync mode: the step).
  Handle Push(std::vector<TensorRef> tensors, int64_t version);
  // Pulls weights of at least `min_version` (waits for it on the servers).
  Handle Pull(std::vector<TensorRef> tensors, int64_t min_version);
  // Pushes, then pulls each tensor at the following version (sync) or the
  // newest (async), in one round trip per server.
  Handle PushPull(std::vector<TensorRef> tensors, int64_t version);
  // Waits for an operation; each handle can be waited on once.
  absl::Status Wait(Handle handle);

  // The version of `name` its latest pull returned (the least over its keys):
  // in sync mode the step to push next.
  absl::StatusOr<int64_t> PulledVersion(const std::string& name) const;
  // The step of `name`'s next push after one for `last` (< 0: its first):
  // sync, the version its latest pull returned (the servers' step: a
  // restored job resumes there, a worker that joins a running job joins its
  // step); async and ssp, this worker's clock, which starts at the restored
  // step. The one rule every plugin follows.
  absl::StatusOr<int64_t> NextStep(const std::string& name, int64_t last = -1) const;

  // Sets the learning rate of `variable` (empty: of every dense variable) on
  // every server; nothing is sent where the servers hold it already as this
  // worker last set or registered it (a plugin sets the rate every step).
  absl::Status SetLearningRate(double lr, const std::string& variable = "");

  // Per worker rank, the least clock over every key on every server (async
  // and ssp: the pushes each worker has made).
  absl::StatusOr<std::vector<int64_t>> WorkerClocks();

  // Sum of a metric over all servers, by its full name
  // (e.g. "psrt_server_bytes_in_total").
  absl::StatusOr<double> ServerMetric(const std::string& name);

 private:
  class Impl;
  explicit Client(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace psrt

#endif  // PSRT_WORKER_CLIENT_H_
