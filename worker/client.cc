#include "worker/client.h"

#include <algorithm>
#include <map>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/compression.h"
#include "common/coordinator_link.h"
#include "common/daemon.h"
#include "common/grpc_util.h"
#include "common/key_map.h"
#include "common/logging.h"
#include "common/optimizer_proto.h"
#include "common/thread_pool.h"
#include "kernels/row_optimizer.h"
#include "psrt/v1/ps.grpc.pb.h"
#include "worker/dispatcher.h"
#include "worker/learning_rates.h"
#include "worker/request_codec.h"
#include "worker/server_links.h"
#include "worker/timeline.h"

namespace psrt {

absl::StatusOr<ClientOptions> ClientOptions::FromEnv() {
  ClientOptions o;
  o.coordinator = EnvOr("PSRT_COORDINATOR", "");
  o.token = EnvOr("PSRT_JOB_TOKEN", "");
  o.host = EnvOr("PSRT_HOST", HostName());
  if (o.coordinator.empty()) {
    return absl::FailedPreconditionError(
        "PSRT_COORDINATOR is not set; start training processes with psrt-run");
  }
  // The training process's client logs at the job's level (psrt-run sets it).
  absl::StatusOr<LogLevel> level = LogLevelFromEnv();
  if (!level.ok()) return absl::FailedPreconditionError(level.status().message());
  const std::string rank = EnvOr("PSRT_RANK", "");
  if (!absl::SimpleAtoi(rank, &o.rank) || o.rank < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("PSRT_RANK must be a rank >= 0; got '", rank, "'"));
  }
  const std::string timeout = EnvOr("PSRT_RPC_TIMEOUT_S", "");
  double seconds = 0;
  if (!timeout.empty()) {
    if (!absl::SimpleAtod(timeout, &seconds) || seconds <= 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("PSRT_RPC_TIMEOUT_S must be a number of seconds > 0; got '", timeout, "'"));
    }
    o.rpc_timeout = absl::Seconds(seconds);
  }
  const std::string generation = EnvOr("PSRT_GENERATION", "0");
  if (!absl::SimpleAtoi(generation, &o.generation) || o.generation < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("PSRT_GENERATION must be a job generation >= 0 (psrt-worker sets it); got '",
                     generation, "'"));
  }
  const std::string connections = EnvOr("PSRT_CONNECTIONS_PER_SERVER", "");
  if (!connections.empty() && (!absl::SimpleAtoi(connections, &o.connections_per_server) ||
                               o.connections_per_server < 1 || o.connections_per_server > 64)) {
    return absl::FailedPreconditionError(
        absl::StrCat("PSRT_CONNECTIONS_PER_SERVER must be a number of connections in 1..64; got '",
                     connections, "'"));
  }
  o.timeline = EnvOr("PSRT_TIMELINE", "");
  o.host_group = EnvOr("PSRT_HOST_GROUP", "");
  const std::string local_rank = EnvOr("PSRT_LOCAL_RANK", "0");
  if (!absl::SimpleAtoi(local_rank, &o.local_rank) || o.local_rank < 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "PSRT_LOCAL_RANK must be a local rank >= 0 (psrt-worker sets it); got '", local_rank, "'"));
  }
  SetLogLevel(*level);
  return o;
}

OptimizerConfig DefaultOptimizer(OptimizerKind kind, double lr) {
  OptimizerConfig c;
  c.kind = kind;
  c.lr = lr;
  if (kind == OptimizerKind::kAdaGrad) c.eps = 1e-10;
  if (kind == OptimizerKind::kAdamW) c.weight_decay = 1e-2;
  return c;
}

// The client's state and its request pipeline (worker/dispatcher.h).
class Client::Impl : public Dispatcher {
 public:
  using Dispatcher::Dispatcher;
  LearningRates rates;
};

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Client::~Client() = default;

void Client::Finish() { impl_->link->SendStats(); }

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options) {
  if (options.coordinator.empty()) return absl::InvalidArgumentError("no coordinator address");
  if (options.rank < 0)
    return absl::InvalidArgumentError(absl::StrCat("rank ", options.rank, " < 0"));
  if (options.connections_per_server < 1 || options.connections_per_server > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("connections_per_server must be 1..64; got ", options.connections_per_server));
  }
  TuneForDataPath();
  if (absl::Status s = InitTransportSecurity(); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("TLS: ", s.message()));
  }
  std::unique_ptr<Timeline> timeline;
  if (!options.timeline.empty()) {
    absl::StatusOr<std::unique_ptr<Timeline>> opened =
        Timeline::Open(options.timeline, options.rank);
    if (!opened.ok()) return opened.status();
    timeline = *std::move(opened);
  }
  auto impl = std::make_unique<Impl>(options, std::move(timeline));
  if (absl::Status s = impl->Join(); !s.ok()) return s;
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

int Client::rank() const { return impl_->options.rank; }
int Client::num_workers() const { return impl_->config.num_workers(); }
int Client::active_workers() const { return impl_->active_workers.load(std::memory_order_relaxed); }
int Client::num_servers() const { return impl_->num_servers; }
bool Client::sync() const { return impl_->config.mode() == "sync"; }
bool Client::averages() const { return impl_->config.average_gradients(); }
int64_t Client::restored_step() const { return impl_->config.restored_step(); }
int64_t Client::checkpoint_every_steps() const {
  const v1::CheckpointConfig& c = impl_->config.checkpoint();
  return c.uri().empty() ? -1 : c.every_steps();
}

absl::Status Client::EveryWorkerEachStep() const {
  const v1::JobConfig& c = impl_->config;
  std::string why;
  if (!sync()) {
    why = absl::StrCat("the job's mode is ", c.mode(), ": each worker's push counts on its own");
  } else if (c.backup_workers() > 0) {
    why = absl::StrCat("\"backup_workers\": ", c.backup_workers(), " completes a step without the ",
                       c.backup_workers(), " slowest workers' pushes");
  } else if (c.min_workers() > 0) {
    why = "\"elastic\": a step takes the workers active at it";
  } else if (c.on_worker_failure() == "continue") {
    why =
        "\"on_worker_failure\": \"continue\": the steps after a loss go on without the lost worker";
  } else {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(
      absl::StrCat("a sum over the job's workers needs every worker's push in each step; ", why));
}

absl::Status Client::StateOnWorkers(bool saves_state) const {
  const v1::JobConfig& c = impl_->config;
  std::string why;
  if (!sync()) {
    why = absl::StrCat("the job's mode is ", c.mode(),
                       ": each worker's push is applied alone, so no step has one mean gradient");
  } else if (!saves_state && (!c.checkpoint().uri().empty() || !c.restore_uri().empty())) {
    why =
        "\"checkpoint\" and \"restore\" keep what the servers hold, and this framework's "
        "plugin does not yet keep the weights and optimizer state that live on the workers";
  } else if (!c.checkpoint().uri().empty() && c.checkpoint().every_seconds() > 0) {
    // Rank 0 saves the workers' state at the steps the checkpoints take
    // (worker/state_keys.h); a checkpoint by the clock has no such step.
    why = "\"checkpoint\": \"every_seconds\" saves at no step the workers know; use every_steps";
  } else if (c.on_failure() == "recover") {
    why =
        "\"on_failure\": \"recover\" rolls the servers back to a checkpoint, and running workers "
        "do not take their state back from it";
  } else if (c.restart_workers() > 0) {
    why = "\"restart_workers\": a restarted worker takes its weights from the servers";
  } else if (absl::Status s = EveryWorkerEachStep(); !s.ok()) {
    // Elastic joins, backup workers, lost workers: the weights' check
    // (Reducer::CheckSame) needs every worker, and a joining one would need
    // the others' state.
    why = std::string(s.message());
  } else {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(
      absl::StrCat("the optimizer cannot run on the workers in this job: ", why));
}

absl::Status Client::RegisterVariable(const std::string& name, std::vector<int64_t> shape,
                                      float* data, const OptimizerConfig& optimizer,
                                      Compression push, Compression pull) {
  v1::DType push_dtype, pull_dtype;
  if (absl::Status s = WireDType(push, impl_->config.compression(), &push_dtype); !s.ok()) return s;
  if (absl::Status s = WireDType(pull, impl_->config.pull_compression(), &pull_dtype); !s.ok())
    return s;
  if (data == nullptr)
    return absl::InvalidArgumentError(absl::StrCat("variable '", name, "' has no buffer"));
  if (absl::Status s = ValidateOptimizerConfig(optimizer); !s.ok()) return s;
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0)
      return absl::InvalidArgumentError(
          absl::StrCat("variable '", name, "' has a negative dimension"));
    n *= d;
  }
  absl::StatusOr<std::vector<Partition>> parts =
      PartitionVariable(name, n, 4, impl_->config.partition_bytes(), num_servers());
  if (!parts.ok()) return parts.status();
  {
    absl::MutexLock lock(&impl_->mu);
    auto [it, inserted] = impl_->variables.try_emplace(name);
    if (!inserted && it->second.num_elements != n) {
      return absl::AlreadyExistsError(absl::StrCat("variable '", name,
                                                   "' is already registered with ",
                                                   it->second.num_elements, " elements"));
    }
    it->second.num_elements = n;
    it->second.parts = *parts;
    it->second.pulled_versions.assign(parts->size(), 0);
    it->second.push_dtype = push_dtype;
    it->second.pull_dtype = pull_dtype;
  }
  if (impl_->group != nullptr) {
    absl::Status s = impl_->group->AddVariable(name, n, static_cast<int64_t>(parts->size()),
                                               absl::Now() + impl_->options.connect_timeout);
    if (!s.ok()) return s;
  }
  struct Batch {
    int server = 0;
    int64_t bytes = 0;
    std::shared_ptr<v1::RegisterKeysRequest> req = std::make_shared<v1::RegisterKeysRequest>();
  };
  std::vector<Batch> batches;
  std::map<int, size_t> open;
  const v1::OptimizerConfig opt = OptimizerToProto(optimizer);
  for (const Partition& p : *parts) {
    Batch& b = BatchFor(&batches, &open, p.server, rank() == 0 ? p.num_elements * 4 : 0);
    b.req->set_worker_rank(rank());
    // Keys may move between servers: each says whose it is by the key map.
    if (impl_->config.started_servers() > 0) b.req->set_owner(p.server);
    v1::KeySpec* spec = b.req->add_keys();
    spec->set_variable(name);
    spec->set_partition(p.index);
    spec->set_dtype(v1::DTYPE_FLOAT32);
    for (int64_t d : shape) spec->add_shape(d);
    spec->set_offset(p.offset);
    spec->set_num_elements(p.num_elements);
    *spec->mutable_optimizer() = opt;
    if (rank() == 0)
      spec->set_init(reinterpret_cast<const char*>(data + p.offset), p.num_elements * 4);
  }
  // "replicas": 1: the backup of each server keeps copies of its keys
  // (with "max_servers", copies its server builds once the job runs).
  const int copies = impl_->config.replicas() > 0 && impl_->config.started_servers() == 0 ? 2 : 1;
  std::vector<Dispatcher::Registration> regs;
  for (const Batch& b : batches) {
    regs.push_back({b.server, b.req});
    if (copies == 1) continue;
    auto req = std::make_shared<v1::RegisterKeysRequest>(*b.req);
    req->set_replica(true);
    req->set_primary(b.server);
    regs.push_back({BackupServer(b.server, num_servers(),
                                 num_servers() / std::max(1, impl_->config.num_hosts())),
                    std::move(req)});
  }
  if (absl::Status s = Wait(impl_->StartRegister(std::move(regs), JsonNames({name}), n * 4));
      !s.ok())
    return s;
  // The starting weights travel exactly, whatever the pull compression.
  if (absl::Status s = Wait(impl_->Start({{name, nullptr, data}}, 0, false, true, /*exact=*/true));
      !s.ok())
    return s;
  if (optimizer.kind != OptimizerKind::kAssign) {  // an assign key takes no rate
    // A key that took no step holds the registered rate (rank 0's, as every
    // worker registers it); one restored or in a running job may not.
    absl::StatusOr<int64_t> pulled = PulledVersion(name);
    impl_->rates.Registered(name, optimizer.lr,
                            restored_step() == 0 && pulled.ok() && *pulled == 0);
  }
  return absl::OkStatus();
}

absl::Status Client::RegisterTable(const std::string& name, const TableOptions& options) {
  v1::DType push_dtype, pull_dtype;
  if (absl::Status s = WireDType(options.push, impl_->config.compression(), &push_dtype); !s.ok())
    return s;
  if (absl::Status s = WireDType(options.pull, impl_->config.pull_compression(), &pull_dtype);
      !s.ok())
    return s;
  if (absl::Status s = ValidateRowOptimizer(options.optimizer); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("table '", name, "': ", s.message()));
  }
  if (impl_->config.replicas() > 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "table '", name,
        "': tables are not replicated; this job has \"replicas\": ", impl_->config.replicas()));
  }
  v1::KeySpec spec;
  spec.set_variable(name);
  spec.set_dtype(v1::DTYPE_FLOAT32);
  spec.add_shape(options.vocab);
  spec.add_shape(options.dim);
  *spec.mutable_optimizer() = OptimizerToProto(options.optimizer);
  v1::TableSpec* t = spec.mutable_table();
  t->set_dim(options.dim);
  t->set_vocab(options.vocab);
  t->set_seed(options.seed);
  t->set_init_std(options.init_std);
  t->set_max_rows(options.max_rows);
  t->set_evict_after_steps(options.evict_after_steps);
  t->set_evict_min_count(options.evict_min_count);
  t->set_num_shards(num_servers());
  {
    absl::MutexLock lock(&impl_->mu);
    auto [it, inserted] = impl_->variables.try_emplace(name);
    if (!inserted && it->second.dim != options.dim) {
      return absl::AlreadyExistsError(absl::StrCat("variable '", name, "' is already registered"));
    }
    it->second.dim = options.dim;
    it->second.pulled_versions.assign(num_servers(), 0);
    it->second.push_dtype = push_dtype;
    it->second.pull_dtype = pull_dtype;
  }
  if (impl_->group != nullptr) {
    absl::Status s = impl_->group->AddTable(name, options.dim, num_servers(),
                                            absl::Now() + impl_->options.connect_timeout);
    if (!s.ok()) return s;
  }
  std::vector<Dispatcher::Registration> regs;
  for (int s = 0; s < num_servers(); ++s) {
    auto req = std::make_shared<v1::RegisterKeysRequest>();
    req->set_worker_rank(rank());
    v1::KeySpec* k = req->add_keys();
    *k = spec;
    k->set_partition(static_cast<uint32_t>(s));
    // Part s is server s's ("max_servers": served elsewhere until it joins).
    if (impl_->config.started_servers() > 0) req->set_owner(s);
    regs.push_back({s, std::move(req)});
  }
  auto record = [this, name](int s, const v1::RegisterKeysResponse& resp) {
    if (resp.versions_size() == 1) {
      // A running sync job's table: this worker's steps start there.
      absl::MutexLock lock(&impl_->mu);
      impl_->RecordPulled(name, static_cast<uint32_t>(s), resp.versions(0), /*at_least=*/true);
    }
    return absl::OkStatus();
  };
  Handle handle = impl_->StartRegister(std::move(regs), JsonNames({name}), 0, std::move(record));
  // A table's rate is not tracked (LearningRates): a rate for every
  // variable is the dense ones', and one they hold already is not sent, so
  // it leaves a table's own rate alone.
  return Wait(handle);
}

Client::Handle Client::PullRows(const std::string& table, const int64_t* ids, int64_t n, float* out,
                                int64_t min_version) {
  return impl_->StartRows(table, ids, n, nullptr, out, min_version, false);
}

absl::Status Client::AssignRows(const std::string& table, const int64_t* ids, int64_t n,
                                const float* values) {
  absl::StatusOr<Variable> var = impl_->Find(table);
  if (!var.ok()) return var.status();
  // In slices of about 64 MiB: the requests copy their rows, so a big table
  // never takes twice its size on the worker.
  const int64_t slice =
      std::max<int64_t>(1, (int64_t{64} << 20) / std::max<int64_t>(1, var->dim * 4));
  int64_t at = 0;
  do {
    const int64_t k = std::min(slice, n - at);
    if (absl::Status s = Wait(impl_->StartAssignRows(table, ids + at, k, values + at * var->dim));
        !s.ok()) {
      return s;
    }
    at += k;
  } while (at < n);
  return absl::OkStatus();
}

Client::Handle Client::PushRows(const std::string& table, const int64_t* ids, int64_t n,
                                const float* grads, int64_t version) {
  impl_->link->SetProgress(version);
  return impl_->StartRows(table, ids, n, grads, nullptr, version, true);
}

Client::Handle Client::Push(std::vector<TensorRef> tensors, int64_t version) {
  impl_->link->SetProgress(version);
  return impl_->Start(std::move(tensors), version, true, false);
}
Client::Handle Client::Pull(std::vector<TensorRef> tensors, int64_t min_version) {
  return impl_->Start(std::move(tensors), min_version, false, true);
}
Client::Handle Client::PushPull(std::vector<TensorRef> tensors, int64_t version) {
  impl_->link->SetProgress(version);
  return impl_->Start(std::move(tensors), version, true, true);
}

absl::Status Client::Wait(Handle handle) {
  std::shared_ptr<Op> op;
  Timeline* timeline = impl_->timeline.get();
  const int64_t trace_start = timeline != nullptr ? timeline->NowMicros() : 0;
  const absl::Time start = absl::Now();
  absl::Status s = impl_->Wait(handle, &op);
  const absl::Time end = absl::Now();
  if (timeline != nullptr) impl_->TraceWait(handle, op.get(), trace_start, s);
  if (op != nullptr && absl::StrContains(op->kind, "PULL")) {
    impl_->counters.Waited(end - start);
  }
  return s;
}

absl::StatusOr<int64_t> Client::PulledVersion(const std::string& name) const {
  absl::MutexLock lock(&impl_->mu);
  auto it = impl_->variables.find(name);
  if (it == impl_->variables.end()) {
    return absl::NotFoundError(absl::StrCat("variable '", name, "' is not registered"));
  }
  return *std::min_element(it->second.pulled_versions.begin(), it->second.pulled_versions.end());
}

absl::StatusOr<int64_t> Client::NextStep(const std::string& name, int64_t last) const {
  absl::StatusOr<int64_t> pulled = PulledVersion(name);
  if (!pulled.ok() || sync()) return pulled;
  return last < 0 ? restored_step() : last + 1;
}

absl::Status Client::SetLearningRate(double lr, const std::string& variable) {
  if (impl_->rates.Held(variable, lr)) return absl::OkStatus();
  v1::SetLearningRateRequest req;
  req.set_worker_rank(rank());
  req.set_lr(lr);
  req.set_variable(variable);
  // A variable's rate goes to the servers holding its keys (the others
  // would answer NOT_FOUND); every variable's to every server.
  std::vector<char> holds(num_servers(), variable.empty());
  if (!variable.empty()) {
    absl::StatusOr<Variable> var = impl_->Find(variable);
    if (!var.ok()) return var.status();
    for (const Partition& p : var->parts) holds[p.server] = 1;
    if (var->dim > 0) holds.assign(num_servers(), 1);  // a table has a part on every server
  }
  for (int s : impl_->OnePerServer(holds)) {
    v1::SetLearningRateResponse resp;
    absl::Status st = impl_->Call(s, "set-learning-rate", [&](grpc::ClientContext* ctx) {
      return impl_->Stub(s)->SetLearningRate(ctx, req, &resp);
    });
    if (!st.ok()) return st;
  }
  impl_->rates.Sent(variable, lr);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int64_t>> Client::WorkerClocks() {
  std::vector<int64_t> clocks(num_workers(), INT64_MAX);
  for (int s : impl_->OnePerServer(std::vector<char>(num_servers(), 1))) {
    v1::StatsResponse resp;
    absl::Status st = impl_->Call(s, "stats", [&](grpc::ClientContext* ctx) {
      return impl_->Stub(s)->Stats(ctx, v1::StatsRequest(), &resp);
    });
    if (!st.ok()) return st;
    for (int w = 0; w < resp.worker_clocks_size() && w < num_workers(); ++w) {
      clocks[w] = std::min(clocks[w], resp.worker_clocks(w));
    }
  }
  for (int64_t& c : clocks) {
    if (c == INT64_MAX) c = 0;  // no server holds a key yet
  }
  return clocks;
}

absl::StatusOr<double> Client::ServerMetric(const std::string& name) {
  double total = 0;
  for (int s : impl_->OnePerServer(std::vector<char>(num_servers(), 1))) {
    v1::StatsResponse resp;
    absl::Status st = impl_->Call(s, "stats", [&](grpc::ClientContext* ctx) {
      return impl_->Stub(s)->Stats(ctx, v1::StatsRequest(), &resp);
    });
    if (!st.ok()) return st;
    auto it = resp.metrics().find(name);
    if (it == resp.metrics().end())
      return absl::NotFoundError(absl::StrCat("server ", s, " has no metric '", name, "'"));
    total += it->second;
  }
  return total;
}

}  // namespace psrt
