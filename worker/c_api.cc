#include "worker/c_api.h"

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "worker/client.h"
#include "worker/reducer.h"
#include "worker/state_keys.h"

struct psrt_client {
  explicit psrt_client(std::unique_ptr<psrt::Client> c)
      : client(std::move(c)), reducer(client.get()), state(client.get()) {}
  std::unique_ptr<psrt::Client> client;
  psrt::Reducer reducer;
  psrt::StateKeys state;
  // psrt_state_load's bytes until the call that copies them.
  absl::flat_hash_map<std::string, std::string> loaded;
};

namespace {

thread_local std::string last_error;

int Fail(const absl::Status& s) {
  last_error = s.ToString();
  return -static_cast<int>(s.code());
}

int64_t Result(const absl::Status& s) {
  if (!s.ok()) return Fail(s);
  last_error.clear();
  return 0;
}

absl::Status CheckArgs(const psrt_client* c, int n, const char* const* names) {
  if (c == nullptr) return absl::InvalidArgumentError("client is NULL");
  if (n <= 0 || names == nullptr) return absl::InvalidArgumentError("no variables given");
  for (int i = 0; i < n; ++i) {
    if (names[i] == nullptr)
      return absl::InvalidArgumentError(absl::StrCat("name ", i, " is NULL"));
  }
  return absl::OkStatus();
}

std::vector<psrt::TensorRef> Refs(int n, const char* const* names, const float* const* grads,
                                  float* const* out) {
  std::vector<psrt::TensorRef> refs(n);
  for (int i = 0; i < n; ++i) {
    refs[i].name = names[i];
    if (grads != nullptr) refs[i].grad = grads[i];
    if (out != nullptr) refs[i].out = out[i];
  }
  return refs;
}

absl::StatusOr<psrt::OptimizerConfig> ToConfig(const psrt_optimizer& o) {
  absl::StatusOr<psrt::OptimizerKind> kind = psrt::ParseOptimizerKind(o.name);
  if (!kind.ok()) return kind.status();
  psrt::OptimizerConfig cfg;
  cfg.kind = *kind;
  cfg.lr = o.lr;
  cfg.momentum = o.momentum;
  cfg.dampening = o.dampening;
  cfg.nesterov = o.nesterov != 0;
  cfg.weight_decay = o.weight_decay;
  cfg.beta1 = o.beta1;
  cfg.beta2 = o.beta2;
  cfg.eps = o.eps;
  cfg.lr_decay = o.lr_decay;
  cfg.initial_accumulator_value = o.initial_accumulator_value;
  cfg.l1 = o.l1;
  cfg.l2 = o.l2;
  cfg.ftrl_beta = o.ftrl_beta;
  return cfg;
}

absl::Status ToCompression(int push_compression, int pull_compression, psrt::Compression* push,
                           psrt::Compression* pull) {
  auto compression = [](int v, psrt::Compression* out) {
    switch (v) {
      case PSRT_COMPRESSION_JOB_DEFAULT:
        *out = psrt::Compression::kJobDefault;
        return true;
      case PSRT_COMPRESSION_NONE:
        *out = psrt::Compression::kNone;
        return true;
      case PSRT_COMPRESSION_FP16:
        *out = psrt::Compression::kFp16;
        return true;
      case PSRT_COMPRESSION_BF16:
        *out = psrt::Compression::kBf16;
        return true;
      default:
        return false;
    }
  };
  if (!compression(push_compression, push) || !compression(pull_compression, pull)) {
    return absl::InvalidArgumentError(
        absl::StrCat("compression must be one of PSRT_COMPRESSION_*; got ", push_compression,
                     " and ", pull_compression));
  }
  return absl::OkStatus();
}

}  // namespace

extern "C" {

int psrt_optimizer_defaults(const char* name, double lr, psrt_optimizer* out) {
  if (name == nullptr || out == nullptr) return Fail(absl::InvalidArgumentError("NULL argument"));
  absl::StatusOr<psrt::OptimizerKind> kind = psrt::ParseOptimizerKind(name);
  if (!kind.ok()) return Fail(kind.status());
  psrt::OptimizerConfig c = psrt::DefaultOptimizer(*kind, lr);
  *out = {psrt::OptimizerName(*kind),
          c.lr,
          c.momentum,
          c.dampening,
          c.nesterov ? 1 : 0,
          c.weight_decay,
          c.beta1,
          c.beta2,
          c.eps,
          c.lr_decay,
          c.initial_accumulator_value,
          c.l1,
          c.l2,
          c.ftrl_beta};
  return Result(absl::OkStatus());
}

psrt_client* psrt_connect_from_env(void) {
  absl::StatusOr<psrt::ClientOptions> options = psrt::ClientOptions::FromEnv();
  if (!options.ok()) {
    Fail(options.status());
    return nullptr;
  }
  absl::StatusOr<std::unique_ptr<psrt::Client>> client = psrt::Client::Connect(*options);
  if (!client.ok()) {
    Fail(client.status());
    return nullptr;
  }
  last_error.clear();
  return new psrt_client(std::move(*client));
}

void psrt_close(psrt_client* client) { delete client; }
void psrt_finish(psrt_client* c) {
  if (c != nullptr) c->client->Finish();
}

int psrt_rank(const psrt_client* c) { return c ? c->client->rank() : -1; }
int psrt_num_workers(const psrt_client* c) { return c ? c->client->num_workers() : -1; }
int psrt_active_workers(const psrt_client* c) { return c ? c->client->active_workers() : -1; }
int psrt_num_servers(const psrt_client* c) { return c ? c->client->num_servers() : -1; }
int psrt_is_sync(const psrt_client* c) { return c ? c->client->sync() : -1; }
int psrt_averages(const psrt_client* c) { return c ? c->client->averages() : -1; }
int64_t psrt_restored_step(const psrt_client* c) { return c ? c->client->restored_step() : -1; }

int psrt_register(psrt_client* c, const char* name, const int64_t* shape, int ndim, float* data,
                  const psrt_optimizer* o, int push_compression, int pull_compression) {
  if (c == nullptr || name == nullptr || o == nullptr || o->name == nullptr || ndim < 0 ||
      (ndim > 0 && shape == nullptr)) {
    return Fail(absl::InvalidArgumentError("psrt_register: NULL or negative argument"));
  }
  absl::StatusOr<psrt::OptimizerConfig> cfg = ToConfig(*o);
  if (!cfg.ok()) return Fail(cfg.status());
  psrt::Compression push, pull;
  if (absl::Status s = ToCompression(push_compression, pull_compression, &push, &pull); !s.ok())
    return Fail(s);
  return static_cast<int>(Result(c->client->RegisterVariable(
      name, std::vector<int64_t>(shape, shape + ndim), data, *cfg, push, pull)));
}

int psrt_register_table(psrt_client* c, const char* name, const psrt_table* t,
                        const psrt_optimizer* o) {
  if (c == nullptr || name == nullptr || t == nullptr || o == nullptr || o->name == nullptr) {
    return Fail(absl::InvalidArgumentError("psrt_register_table: NULL argument"));
  }
  absl::StatusOr<psrt::OptimizerConfig> cfg = ToConfig(*o);
  if (!cfg.ok()) return Fail(cfg.status());
  psrt::TableOptions options;
  if (absl::Status s =
          ToCompression(t->push_compression, t->pull_compression, &options.push, &options.pull);
      !s.ok()) {
    return Fail(s);
  }
  options.dim = t->dim;
  options.vocab = t->vocab;
  options.seed = t->seed;
  options.init_std = t->init_std;
  options.max_rows = t->max_rows;
  options.evict_after_steps = t->evict_after_steps;
  options.evict_min_count = t->evict_min_count;
  options.optimizer = *cfg;
  return static_cast<int>(Result(c->client->RegisterTable(name, options)));
}

int64_t psrt_pull_rows(psrt_client* c, const char* table, const int64_t* ids, int64_t n, float* out,
                       int64_t min_version) {
  if (c == nullptr || table == nullptr)
    return Fail(absl::InvalidArgumentError("psrt_pull_rows: NULL argument"));
  return static_cast<int64_t>(c->client->PullRows(table, ids, n, out, min_version));
}

int64_t psrt_push_rows(psrt_client* c, const char* table, const int64_t* ids, int64_t n,
                       const float* grads, int64_t version) {
  if (c == nullptr || table == nullptr)
    return Fail(absl::InvalidArgumentError("psrt_push_rows: NULL argument"));
  return static_cast<int64_t>(c->client->PushRows(table, ids, n, grads, version));
}

int psrt_every_worker_each_step(const psrt_client* c) {
  if (c == nullptr)
    return Fail(absl::InvalidArgumentError("psrt_every_worker_each_step: NULL client"));
  if (absl::Status s = c->client->EveryWorkerEachStep(); !s.ok()) return Fail(s);
  return 0;
}

int psrt_assign_rows(psrt_client* c, const char* table, const int64_t* ids, int64_t n,
                     const float* values) {
  if (c == nullptr || table == nullptr) {
    return Fail(absl::InvalidArgumentError("psrt_assign_rows: NULL argument"));
  }
  if (absl::Status s = c->client->AssignRows(table, ids, n, values); !s.ok()) return Fail(s);
  return 0;
}

int64_t psrt_push(psrt_client* c, int n, const char* const* names, const float* const* grads,
                  int64_t version) {
  if (absl::Status s = CheckArgs(c, n, names); !s.ok()) return Fail(s);
  if (grads == nullptr) return Fail(absl::InvalidArgumentError("no gradient buffers"));
  return static_cast<int64_t>(c->client->Push(Refs(n, names, grads, nullptr), version));
}

int64_t psrt_pull(psrt_client* c, int n, const char* const* names, float* const* out,
                  int64_t min_version) {
  if (absl::Status s = CheckArgs(c, n, names); !s.ok()) return Fail(s);
  if (out == nullptr) return Fail(absl::InvalidArgumentError("no output buffers"));
  return static_cast<int64_t>(c->client->Pull(Refs(n, names, nullptr, out), min_version));
}

int64_t psrt_push_pull(psrt_client* c, int n, const char* const* names, const float* const* grads,
                       float* const* out, int64_t version) {
  if (absl::Status s = CheckArgs(c, n, names); !s.ok()) return Fail(s);
  if (grads == nullptr || out == nullptr) return Fail(absl::InvalidArgumentError("no buffers"));
  return static_cast<int64_t>(c->client->PushPull(Refs(n, names, grads, out), version));
}

int psrt_wait(psrt_client* c, int64_t handle) {
  if (c == nullptr) return Fail(absl::InvalidArgumentError("client is NULL"));
  return static_cast<int>(Result(c->client->Wait(static_cast<psrt::Client::Handle>(handle))));
}

int64_t psrt_pulled_version(psrt_client* c, const char* name) {
  if (c == nullptr || name == nullptr) return Fail(absl::InvalidArgumentError("NULL argument"));
  absl::StatusOr<int64_t> v = c->client->PulledVersion(name);
  if (!v.ok()) return Fail(v.status());
  last_error.clear();
  return *v;
}

int64_t psrt_next_step(psrt_client* c, const char* name, int64_t last) {
  if (c == nullptr || name == nullptr) return Fail(absl::InvalidArgumentError("NULL argument"));
  absl::StatusOr<int64_t> v = c->client->NextStep(name, last);
  if (!v.ok()) return Fail(v.status());
  last_error.clear();
  return *v;
}

int psrt_set_learning_rate(psrt_client* c, const char* variable, double lr) {
  if (c == nullptr) return Fail(absl::InvalidArgumentError("client is NULL"));
  return static_cast<int>(
      Result(c->client->SetLearningRate(lr, variable == nullptr ? "" : variable)));
}

int psrt_allreduce(psrt_client* c, int n, const char* const* names, const int64_t* sizes,
                   const float* const* in, float* const* out, int* given, int op, int compression,
                   int* factor) {
  if (absl::Status s = CheckArgs(c, n, names); !s.ok()) return Fail(s);
  if (sizes == nullptr || in == nullptr || out == nullptr) {
    return Fail(absl::InvalidArgumentError("psrt_allreduce: NULL sizes, inputs or outputs"));
  }
  if (op != PSRT_REDUCE_MEAN && op != PSRT_REDUCE_SUM) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("psrt_allreduce: op must be PSRT_REDUCE_MEAN or PSRT_REDUCE_SUM; got ", op)));
  }
  psrt::Compression push, pull;
  if (absl::Status s = ToCompression(compression, PSRT_COMPRESSION_NONE, &push, &pull); !s.ok()) {
    return Fail(s);
  }
  std::vector<psrt::ReduceRef> refs(n);
  for (int i = 0; i < n; ++i) refs[i] = {names[i], sizes[i], in[i], out[i]};
  const psrt::ReduceOp how = op == PSRT_REDUCE_SUM ? psrt::ReduceOp::kSum : psrt::ReduceOp::kMean;
  if (absl::Status s = c->reducer.Reduce(absl::MakeSpan(refs), how, push, factor); !s.ok())
    return Fail(s);
  if (given != nullptr) {
    for (int i = 0; i < n; ++i) given[i] = refs[i].given ? 1 : 0;
  }
  last_error.clear();
  return 0;
}

int psrt_state_on_workers(const psrt_client* c, int saves_state) {
  if (c == nullptr) return Fail(absl::InvalidArgumentError("psrt_state_on_workers: NULL client"));
  return static_cast<int>(Result(c->client->StateOnWorkers(saves_state != 0)));
}

int psrt_state_load(psrt_client* c, const char* name, void* buf, int64_t capacity, int64_t* size) {
  if (c == nullptr || name == nullptr || size == nullptr) {
    return Fail(absl::InvalidArgumentError("psrt_state_load: NULL client, name or size"));
  }
  auto it = c->loaded.find(name);
  if (it == c->loaded.end()) {
    absl::StatusOr<std::string> state = c->state.Load(name);
    if (!state.ok()) return Fail(state.status());
    it = c->loaded.emplace(name, *std::move(state)).first;
  }
  *size = static_cast<int64_t>(it->second.size());
  if (buf != nullptr && capacity >= *size) {
    std::memcpy(buf, it->second.data(), it->second.size());
    c->loaded.erase(it);
  }
  return static_cast<int>(Result(absl::OkStatus()));
}

int psrt_state_save(psrt_client* c, const char* name, const void* bytes, int64_t size,
                    int64_t step) {
  if (c == nullptr || name == nullptr || (bytes == nullptr && size != 0) || size < 0 || step <= 0) {
    return Fail(absl::InvalidArgumentError(
        "psrt_state_save: NULL client or name, no bytes, or a step not > 0"));
  }
  return static_cast<int>(Result(c->state.Save(
      name, absl::string_view(static_cast<const char*>(bytes), static_cast<size_t>(size)), step)));
}

int psrt_state_due(const psrt_client* c, int64_t step, int last) {
  if (c == nullptr) return Fail(absl::InvalidArgumentError("psrt_state_due: NULL client"));
  const int64_t every = c->client->checkpoint_every_steps();
  if (every < 0 || step <= 0) return 0;
  return last != 0 || (every > 0 && step % every == 0) ? 1 : 0;
}

int psrt_check_same(psrt_client* c, const char* what, uint32_t digest) {
  if (c == nullptr || what == nullptr || *what == '\0') {
    return Fail(absl::InvalidArgumentError("psrt_check_same: NULL client or no name"));
  }
  return static_cast<int>(Result(c->reducer.CheckSame(what, digest)));
}

const char* psrt_last_error(void) { return last_error.c_str(); }

}  // extern "C"
