#include "server/store.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "common/logging.h"
#include "absl/time/clock.h"
#include "common/compression.h"
#include "common/key_map.h"
#include "common/optimizer_proto.h"
#include "server/table.h"

namespace psrt {

// More of one worker's pushes than this are never in flight at once.
constexpr int kPushWindow = 8;
// Longest variable name a server stores.
constexpr size_t kMaxNameBytes = 256;
// Pushes at least this big spread their keys over the apply pool.
constexpr int64_t kParallelPushBytes = 256 << 10;
// How often waiting pulls are checked for their deadline and their caller.
constexpr absl::Duration kSweepInterval = absl::Milliseconds(20);

struct Store::Key {
  absl::Mutex mu;
  std::string name;  // "variable#partition"
  v1::KeySpec spec;  // as first registered, without the initial value
  bool is_table = false;  // spec.has_table()
  OptimizerConfig optimizer ABSL_GUARDED_BY(mu);  // rank 0's, once it registered
  int64_t n = 0;
  bool initialized ABSL_GUARDED_BY(mu) = false;
  int64_t version ABSL_GUARDED_BY(mu) = 0;
  double lr ABSL_GUARDED_BY(mu) = 0;
  bool lr_set ABSL_GUARDED_BY(mu) = false;  // changed by a worker before init
  std::vector<float> weights ABSL_GUARDED_BY(mu);
  std::vector<std::vector<float>> slots ABSL_GUARDED_BY(mu);
  std::vector<float*> slot_ptrs ABSL_GUARDED_BY(mu);
  // Sync: the sum of this version's pushes so far, and who sent them.
  std::vector<float> accum ABSL_GUARDED_BY(mu);
  std::vector<char> contributed ABSL_GUARDED_BY(mu);
  int contributions ABSL_GUARDED_BY(mu) = 0;
  // Sync: the last version each worker pushed for, to tell a retry of an
  // applied step from a backup worker's late push.
  std::vector<int64_t> last_step ABSL_GUARDED_BY(mu);
  // Who takes part, and (sync) how many pushes complete a step.
  std::vector<char> active ABSL_GUARDED_BY(mu);
  int required ABSL_GUARDED_BY(mu) = 1;
  // Async and ssp: a compressed gradient decoded, reused for every push.
  std::vector<float> scratch ABSL_GUARDED_BY(mu);
  // Async and ssp: each worker's clock (pushes made), for the staleness bound.
  std::vector<int64_t> clock ABSL_GUARDED_BY(mu);
  // Async: the last kPushWindow push ids applied per worker, so a retried
  // push is applied once even when a worker's pushes overtake each other.
  std::vector<uint64_t> recent_push_ids ABSL_GUARDED_BY(mu);
  std::vector<uint8_t> recent_next ABSL_GUARDED_BY(mu);
  // The copy an armed checkpoint took (buffers kept for the next one).
  bool snap_ready ABSL_GUARDED_BY(mu) = false;
  KeyRecord snap ABSL_GUARDED_BY(mu);
  // Pulls waiting for this key: the pull and the key's index in it.
  std::vector<std::pair<std::shared_ptr<PendingPull>, int>> waiters ABSL_GUARDED_BY(mu);
  // Updates whose gradient held NaN or Inf; with "nonfinite": "fail" the
  // first one stops the key (every push and pull after it gets this error).
  int64_t nonfinite ABSL_GUARDED_BY(mu) = 0;
  absl::Status stopped ABSL_GUARDED_BY(mu);
  // "replicas": 1. A copy of server backup_of's key (-1: this server's own),
  // updated by its Replicate calls; served (pushed, pulled, checkpointed)
  // here once that server is gone.
  int backup_of ABSL_GUARDED_BY(mu) = -1;
  bool serving ABSL_GUARDED_BY(mu) = true;
  int moved_to ABSL_GUARDED_BY(mu) = -1;  // Release: the server that serves it now
  // A sparse table's part (spec.has_table()): its rows, in place of
  // weights, slots and accum.
  std::unique_ptr<Table> table ABSL_GUARDED_BY(mu);

  // An assign key (kernels/optimizer.h) holds data that workers replace (the
  // mean gradient, BatchNorm's statistics, frozen weights): its version does
  // not follow the training step, so checkpoints take it as it is and the
  // step is read from the other keys.
  bool FreeRunning() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return !is_table && optimizer.kind == OptimizerKind::kAssign;
  }
  // The workers that registered this key here (by rank), since when.
  std::vector<char> registrants ABSL_GUARDED_BY(mu);
  absl::Time first_registered ABSL_GUARDED_BY(mu);
  bool partial_told ABSL_GUARDED_BY(mu) = false;  // its warning is logged
  bool snap_stray ABSL_GUARDED_BY(mu) = false;    // the copy is of a Stray key
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

namespace {

const char* DTypeName(v1::DType d) {
  switch (d) {
    case v1::DTYPE_FLOAT32: return "float32";
    case v1::DTYPE_FLOAT16: return "float16";
    case v1::DTYPE_BFLOAT16: return "bfloat16";
    default: return "unspecified";
  }
}

std::string ShapeText(const google::protobuf::RepeatedField<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// A variable name: 1 to kMaxNameBytes bytes of printable ASCII.
absl::Status CheckName(const std::string& name) {
  if (name.empty()) return absl::InvalidArgumentError("a key has an empty variable name");
  if (name.size() > kMaxNameBytes) {
    return absl::InvalidArgumentError(absl::StrCat("variable name '", name.substr(0, 40), "...' has ",
                                                   name.size(), " bytes; names have at most ",
                                                   kMaxNameBytes));
  }
  for (char c : name) {
    if (c < 0x20 || c > 0x7e) {
      return absl::InvalidArgumentError(absl::StrCat(
          "variable name '", absl::CHexEscape(name),
          "' holds a byte that is not printable ASCII; names are printable text"));
    }
  }
  return absl::OkStatus();
}

std::vector<double> TimeBuckets() {
  return {1e-5, 1e-4, 1e-3, 1e-2, 0.1, 1, 10, 100};
}

}  // namespace


Store::Store(StoreOptions options, Metrics* metrics)
    : options_(options),
      bytes_in_(metrics->GetCounter("bytes_in_total", "Payload bytes received in pushes and registrations")),
      bytes_out_(metrics->GetCounter("bytes_out_total", "Payload bytes sent in pulls")),
      pushes_(metrics->GetCounter("push_requests_total", "Push requests accepted")),
      key_pushes_(metrics->GetCounter("key_pushes_total", "Key gradients received")),
      duplicate_pushes_(metrics->GetCounter("duplicate_pushes_total", "Key pushes dropped as retries of applied ones")),
      pulls_(metrics->GetCounter("key_pulls_total", "Keys sent in pulls")),
      updates_(metrics->GetCounter("updates_total", "Optimizer updates applied")),
      nonfinite_updates_(metrics->GetCounter("nonfinite_updates_total", "Updates whose gradient held NaN or Inf: skipped, or (nonfinite: fail) refused")),
      evicted_rows_(metrics->GetCounter("evicted_rows_total", "Sparse table rows dropped by eviction")),
      update_seconds_(metrics->GetHistogram("update_seconds", "Time to apply one optimizer update to a key", TimeBuckets())),
      pull_wait_seconds_(metrics->GetHistogram("pull_wait_seconds", "Time a pulled key waited for its version", TimeBuckets())),
      dropped_pushes_(metrics->GetCounter("dropped_pushes_total", "Sync pushes dropped because their step was applied without them (backup workers)")),
      staleness_(metrics->GetHistogram("staleness", "Clocks by which a pulling worker was ahead of the slowest active worker (async, ssp)", {0, 1, 2, 3, 4, 6, 8, 12, 16, 32, 64})),
      epoch_gauge_(metrics->GetGauge("membership_epoch", "Membership epoch this server works in")),
      compressed_pushes_(metrics->GetCounter("compressed_pushes_total", "Key pushes in float16 or bfloat16")),
      rescaled_pushes_(metrics->GetCounter("rescaled_pushes_total", "Compressed key pushes scaled to fit float16's range")),
      nonfinite_pushes_(metrics->GetCounter("nonfinite_pushes_total", "Key pushes whose gradient held NaN or Inf")),
      waiting_pulls_(metrics->GetGauge("waiting_pulls", "Pulls waiting for a version (none holds a thread)")),
      snapshot_pause_seconds_(metrics->GetHistogram("checkpoint_pause_seconds", "Time a key was held to copy it for a checkpoint", TimeBuckets())) {
  active_.assign(options_.num_workers, 1);
  restore_pending_ = options_.restore_pending;
  epoch_gauge_->Set(1);
  const int threads = options_.apply_threads > 0
                          ? options_.apply_threads
                          : std::max(1u, std::thread::hardware_concurrency());
  apply_pool_ = std::make_unique<ThreadPool>(threads);
  sweeper_ = std::thread([this] { RunSweeper(); });
}

Store::~Store() {
  {
    absl::MutexLock lock(&sweeper_mu_);
    sweeper_stop_ = true;
  }
  sweeper_.join();
  Close();
}

int64_t Store::num_keys() const {
  absl::ReaderMutexLock lock(&map_mu_);
  return static_cast<int64_t>(keys_.size());
}

int64_t Store::bytes_stored() const { return bytes_stored_.load(); }

absl::Status Store::CheckWorker(int32_t rank) const {
  if (rank < 0 || rank >= options_.num_workers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "worker rank ", rank, " is out of range; this job has ", options_.num_workers,
        " workers (ranks 0..", options_.num_workers - 1, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Store::Key*> Store::Find(const std::string& variable,
                                        uint32_t partition) const {
  absl::ReaderMutexLock lock(&map_mu_);
  auto it = keys_.find(KeyName(variable, partition));
  if (it == keys_.end()) {
    return absl::NotFoundError(absl::StrCat(
        "key '", KeyName(variable, partition),
        "' is not registered on this server; register the variable first"));
  }
  return it->second.get();
}

absl::Status Store::CheckSpec(const Key& key, const v1::KeySpec& spec, int32_t rank) const {
  const v1::KeySpec& have = key.spec;
  std::string from;
  {
    absl::MutexLock lock(&restore_mu_);
    from = restored_from_;
  }
  auto mismatch = [&](absl::string_view what, const std::string& a, const std::string& b) {
    return absl::FailedPreconditionError(absl::StrCat(
        "key '", key.name, "' ", from.empty() ? "was registered with " : "holds, in checkpoint " + from + ", ",
        what, " ", a, " but worker ", rank, " registers it with ", b));
  };
  if (!std::equal(have.shape().begin(), have.shape().end(), spec.shape().begin(),
                  spec.shape().end())) {
    return mismatch("shape", ShapeText(have.shape()), ShapeText(spec.shape()));
  }
  if (have.dtype() != spec.dtype()) {
    return mismatch("dtype", DTypeName(have.dtype()), DTypeName(spec.dtype()));
  }
  if (have.offset() != spec.offset() || have.num_elements() != spec.num_elements()) {
    return mismatch("slice",
                    absl::StrCat("[", have.offset(), ", +", have.num_elements(), ")"),
                    absl::StrCat("[", spec.offset(), ", +", spec.num_elements(), ")"));
  }
  if (have.optimizer().name() != spec.optimizer().name()) {
    return mismatch("optimizer", have.optimizer().name(), spec.optimizer().name());
  }
  if (have.table().SerializeAsString() != spec.table().SerializeAsString()) {
    return mismatch("table settings", have.table().ShortDebugString(), spec.table().ShortDebugString());
  }
  return absl::OkStatus();
}

absl::Status Store::CheckDenseSpec(const v1::KeySpec& spec, int32_t rank) const {
  const std::string name = KeyName(spec.variable(), spec.partition());
  int64_t total = 1;
  for (int64_t d : spec.shape()) {
    if (d < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "key '", name, "': shape ", ShapeText(spec.shape()), " has a negative dimension"));
    }
    if (d != 0 && total > INT64_MAX / d) {
      return absl::InvalidArgumentError(absl::StrCat("key '", name, "': shape ", ShapeText(spec.shape()), " overflows 64 bits"));
    }
    total *= d;
  }
  if (spec.num_elements() > options_.max_key_bytes / 4) {
    return absl::InvalidArgumentError(absl::StrCat(
        "key '", name, "' has ", spec.num_elements(), " elements; a key holds at most ",
        options_.max_key_bytes / 4, " float32 (the job's partition size, ", options_.max_key_bytes,
        " bytes)"));
  }
  if (spec.num_elements() <= 0 || spec.offset() < 0 ||
      spec.offset() > total - spec.num_elements()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "key '", name, "': slice [", spec.offset(), ", +", spec.num_elements(),
        ") does not fit shape ", ShapeText(spec.shape()), " of ", total, " elements"));
  }
  if (!spec.init().empty()) {
    if (rank != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "key '", name, "': only rank 0 sends initial values; worker ", rank, " sent one"));
    }
    if (static_cast<int64_t>(spec.init().size()) != spec.num_elements() * 4) {
      return absl::InvalidArgumentError(absl::StrCat(
          "key '", name, "': initial value has ", spec.init().size(), " bytes; expected ",
          spec.num_elements() * 4, " (", spec.num_elements(), " float32)"));
    }
  } else if (rank == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "key '", name, "': rank 0 must send the initial value"));
  }
  return absl::OkStatus();
}

absl::Status Store::RegisterKeys(const v1::RegisterKeysRequest& req, absl::Time deadline,
                                 const Cancelled& cancelled) {
  if (absl::Status s = CheckWorker(req.worker_rank()); !s.ok()) return s;
  if (req.keys().empty()) return absl::InvalidArgumentError("register request names no keys");
  if (req.has_owner() && (req.owner() < 0 || req.replica())) {
    return absl::InvalidArgumentError(
        absl::StrCat("register request names owner ", req.owner(),
                     "; an owner is a server index (>= 0), and a copy names its primary"));
  }
  if (absl::Status s = WaitForRestore(deadline, cancelled); !s.ok()) return s;
  std::string restored_from;
  {
    absl::MutexLock lock(&restore_mu_);
    restored_from = restored_from_;
  }
  // Validate everything first: a bad request changes nothing.
  std::vector<OptimizerConfig> optimizers;
  Room room;
  absl::flat_hash_set<std::string> names;
  for (const v1::KeySpec& spec : req.keys()) {
    const std::string name = KeyName(spec.variable(), spec.partition());
    if (!names.insert(name).second) {
      return absl::InvalidArgumentError(absl::StrCat("key '", name, "' appears twice in one request"));
    }
    if (absl::Status s = CheckName(spec.variable()); !s.ok()) return s;
    if (spec.dtype() != v1::DTYPE_FLOAT32) {
      return absl::InvalidArgumentError(absl::StrCat(
          "key '", name, "': variables of dtype ", DTypeName(spec.dtype()),
          " are not supported; register float32 variables"));
    }
    if (spec.has_table()) {
      if (absl::Status s = ValidateTableSpec(spec); !s.ok()) return s;
      if (req.replica()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "table '", spec.variable(), "': tables are not replicated (\"replicas\" holds dense variables)"));
      }
    } else if (absl::Status s = CheckDenseSpec(spec, req.worker_rank()); !s.ok()) {
      return s;
    }
    absl::StatusOr<OptimizerConfig> opt = OptimizerFromProto(spec.optimizer());
    if (!opt.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("key '", name, "': ", opt.status().message()));
    }
    optimizers.push_back(*opt);
    if (options_.max_keys_per_variable > 0 && spec.partition() >= static_cast<uint32_t>(options_.max_keys_per_variable)) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "key '", name, "': a variable has at most ", options_.max_keys_per_variable,
          " keys (limits.max_keys_per_variable)"));
    }
    absl::ReaderMutexLock lock(&map_mu_);
    auto it = keys_.find(name);
    if (it != keys_.end()) {
      if (absl::Status s = CheckSpec(*it->second, spec, req.worker_rank()); !s.ok()) return s;
    } else if (absl::Status s = CheckRoomLocked(spec, *opt, &room); !s.ok()) {
      return s;
    } else if (!restored_from.empty()) {
      std::vector<std::string> held;
      for (const auto& [n, k] : keys_) held.push_back(n);
      std::sort(held.begin(), held.end());
      if (held.size() > 8) held.resize(8), held.push_back("...");
      return absl::FailedPreconditionError(absl::StrCat(
          "key '", name, "' is not in checkpoint ", restored_from, " (this server holds ",
          held.empty() ? "none of its keys" : absl::StrJoin(held, ", "),
          "): the checkpoint is of another model, or of this variable with another shape"));
    }
  }
  for (int i = 0; i < req.keys_size(); ++i) {
    const v1::KeySpec& spec = req.keys(i);
    Key* key;
    {
      absl::MutexLock lock(&map_mu_);
      bool added = false;
      key = FindOrAddLocked(spec, &added);
      if (!added) {
        if (absl::Status s = CheckSpec(*key, spec, req.worker_rank()); !s.ok()) {
          return s;  // lost a race with a different registration
        }
      }
      if (req.replica()) {
        absl::MutexLock lock(&key->mu);
        if (key->backup_of < 0 && !key->initialized) {
          key->backup_of = req.primary();
          key->serving = false;
        }
      } else if (req.has_owner() && added) {
        // Another server's key by the key map, served here for now.
        absl::MutexLock lock(&key->mu);
        key->backup_of = req.owner() == options_.self ? -1 : req.owner();
      }
    }
    Completed completed;
    {
      absl::MutexLock lock(&key->mu);
      if (key->registrants.empty()) {
        key->registrants.assign(options_.num_workers, 0);
        key->first_registered = absl::Now();
      }
      key->registrants[req.worker_rank()] = 1;
      bytes_in_->Add(spec.init().size());
      // Rank 0's value and optimizer settings win, once; a restarted rank 0
      // keeps the trained weights.
      // A table needs no initial value: its rows start from its seed.
      if (key->initialized || (spec.init().empty() && !spec.has_table())) continue;
      InitKey(key, optimizers[i]);
      if (spec.has_table()) {
        key->table = std::make_unique<Table>(key->name, spec.table(), key->optimizer, spec.partition());
      } else {
        std::memcpy(key->weights.data(), spec.init().data(), key->n * 4);
        InitSlots(key->optimizer, key->slot_ptrs.data(), key->n);
      }
      if (!key->lr_set) key->lr = key->optimizer.lr;
      NotifyWaiters(key, &completed);  // pulls that waited for rank 0
    }
    for (const auto& p : completed) Complete(p.get());
  }
  return absl::OkStatus();
}

int64_t Store::KeyBytes(int64_t n, const OptimizerConfig& optimizer) const {
  return n * 4 * (1 + NumSlots(optimizer) + (options_.sync ? 1 : 0));
}

absl::Status Store::CheckRoomLocked(const v1::KeySpec& spec, const OptimizerConfig& optimizer, Room* room) {
  const std::string name = KeyName(spec.variable(), spec.partition());
  if (options_.max_variables > 0 && room->variables.empty()) {
    for (const auto& [n, k] : keys_) room->variables.insert(k->spec.variable());
  }
  if (options_.max_variables > 0 && room->variables.insert(spec.variable()).second &&
      static_cast<int64_t>(room->variables.size()) > options_.max_variables) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "key '", name, "': this server holds ", options_.max_variables,
        " variables already, its limit (limits.max_variables)"));
  }
  room->bytes += KeyBytes(spec.num_elements(), optimizer);
  if (options_.max_bytes > 0 && bytes_stored_.load() + room->bytes > options_.max_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "key '", name, "': this server would hold ", bytes_stored_.load() + room->bytes,
        " bytes of weights and optimizer state, more than limits.max_server_bytes (", options_.max_bytes,
        ")"));
  }
  return absl::OkStatus();
}

bool Store::Owns(const Key* k, int owner) const {
  return k->backup_of == owner || (k->backup_of < 0 && owner >= 0 && owner == options_.self);
}

absl::Status Store::NotServing(const Key* k) const {
  if (k->moved_to >= 0) {
    return absl::UnavailableError(absl::StrCat("key '", k->name, "' moved to server ", k->moved_to,
                                               "; the shard map says so from its next epoch"));
  }
  if (on_copy_asked_) on_copy_asked_();
  // UNAVAILABLE: the client tries again, and this server serves the key as
  // soon as it hears that its primary is gone.
  return absl::UnavailableError(absl::StrCat("key '", k->name, "' is held here as a replica of server ",
                                             k->backup_of, "'s, not served yet"));
}

void Store::SetForward(Forward forward) { forward_ = std::move(forward); }

absl::Status Store::Replicate(const v1::ReplicateRequest& req, absl::string_view gradient) {
  absl::StatusOr<Key*> key = Find(req.variable(), req.partition());
  if (!key.ok()) return key.status();
  Key* k = *key;
  Completed completed;
  {
    absl::MutexLock lock(&k->mu);
    if (k->backup_of < 0 || k->serving) {
      return absl::FailedPreconditionError(absl::StrCat("key '", k->name, "' is not a replica on this server"));
    }
    if (static_cast<int64_t>(gradient.size()) != k->n * 4) {
      return absl::InvalidArgumentError(absl::StrCat("replica update of key '", k->name, "' has ",
                                                     gradient.size(), " bytes; the key holds ", k->n,
                                                     " float32"));
    }
    if (!k->initialized) {
      return absl::FailedPreconditionError(absl::StrCat("replica of key '", k->name, "' has no value yet"));
    }
    if (req.version() < k->version) return absl::OkStatus();  // a retry of an applied update
    if (req.version() > k->version) {
      return absl::FailedPreconditionError(absl::StrCat("replica of key '", k->name, "' is at version ",
                                                        k->version, "; an update for version ", req.version(),
                                                        " would skip one"));
    }
    Origin origin;
    if (req.from_push()) {
      if (options_.sync || !CheckWorker(req.worker()).ok()) {
        return absl::InvalidArgumentError(absl::StrCat("replica update of key '", k->name,
                                                       "' names a push, but not one of an async worker"));
      }
      origin = {req.worker(), req.push_id(), req.clock()};
      RecordPush(k, origin);
    }
    const float* grad = reinterpret_cast<const float*>(gradient.data());
    if (reinterpret_cast<uintptr_t>(grad) % alignof(float) != 0) {
      k->scratch.resize(k->n);
      std::memcpy(k->scratch.data(), gradient.data(), k->n * 4);
      grad = k->scratch.data();
    }
    Apply(k, grad, origin);
    NotifyWaiters(k, &completed);
  }
  for (const auto& p : completed) Complete(p.get());
  return absl::OkStatus();
}

void Store::Promote(int primary) {
  int64_t n = 0;
  for (Key* k : AllKeys()) {
    absl::MutexLock lock(&k->mu);
    if (k->backup_of != primary || k->serving) continue;
    k->serving = true;
    ++n;
  }
  if (n > 0)
    LogInfo("serving the ", n, " keys of server ", primary, " here, from the copies it kept");
}

Store::Key* Store::FindOrAddLocked(const v1::KeySpec& spec, bool* added) {
  const std::string name = KeyName(spec.variable(), spec.partition());
  std::unique_ptr<Key>& slot = keys_[name];
  *added = slot == nullptr;
  if (*added) {
    slot = std::make_unique<Key>();
    slot->name = name;
    slot->spec = spec;
    slot->spec.clear_init();
    slot->is_table = spec.has_table();
    slot->n = spec.num_elements();
  }
  return slot.get();
}

absl::Status Store::Seed(const v1::SeedRequest& req) {
  absl::StatusOr<OptimizerConfig> opt = OptimizerFromProto(req.spec().optimizer());
  const int64_t n = req.spec().num_elements();
  const std::string name = KeyName(req.spec().variable(), req.spec().partition());
  const bool weights = !req.handover() || !req.weights().empty();
  const size_t workers = static_cast<size_t>(options_.num_workers);
  auto sized = [&](size_t size, size_t want) { return size == 0 || size == want; };
  if (!opt.ok() || n <= 0 || req.worker_clocks_size() > options_.num_workers ||
      (weights && (static_cast<int64_t>(req.weights().size()) != n * 4 ||
                   req.slots_size() != NumSlots(*opt))) ||
      !sized(req.accum().size(), n * 4) || !sized(req.contributed_size(), workers) ||
      !sized(req.last_step_size(), workers) ||
      !sized(req.recent_push_ids_size(), workers * kPushWindow) ||
      !sized(req.recent_next_size(), workers)) {
    return absl::InvalidArgumentError(
        absl::StrCat("seed of key '", name, "' does not fit its spec"));
  }
  for (const std::string& slot : req.slots()) {
    if (static_cast<int64_t>(slot.size()) != n * 4) return absl::InvalidArgumentError("seed slot of the wrong size");
  }
  for (int32_t next : req.recent_next()) {
    if (next < 0 || next >= kPushWindow)
      return absl::InvalidArgumentError("seed push window out of range");
  }
  Key* key;
  if (weights) {
    absl::MutexLock lock(&map_mu_);
    bool added = false;
    key = FindOrAddLocked(req.spec(), &added);
  } else {
    absl::StatusOr<Key*> found = Find(req.spec().variable(), req.spec().partition());
    if (!found.ok())
      return absl::FailedPreconditionError(absl::StrCat("key '", name, "' has no copy here"));
    key = *found;
  }
  absl::MutexLock lock(&key->mu);
  if (key->serving && key->initialized) {
    return absl::FailedPreconditionError(absl::StrCat("key '", name, "' is served here; it takes no copy"));
  }
  if (key->n != n) return absl::FailedPreconditionError(absl::StrCat("key '", name, "' has another size here"));
  if (!weights && (!key->initialized || key->version != req.version())) {
    // The hand-over then comes again with the weights.
    return absl::FailedPreconditionError(absl::StrCat("the copy of key '", name, "' is at version ",
                                                      key->version, ", not ", req.version()));
  }
  key->backup_of = req.primary();
  key->serving = false;
  key->moved_to = -1;
  if (!key->initialized) InitKey(key, *opt);
  if (weights) {
    std::memcpy(key->weights.data(), req.weights().data(), n * 4);
    for (int i = 0; i < req.slots_size(); ++i)
      std::memcpy(key->slots[i].data(), req.slots(i).data(), n * 4);
  }
  key->version = req.version();
  key->lr = req.lr();
  for (int w = 0; w < req.worker_clocks_size(); ++w) key->clock[w] = req.worker_clocks(w);
  if (req.handover()) {
    if (options_.sync && !req.accum().empty())
      std::memcpy(key->accum.data(), req.accum().data(), n * 4);
    key->contributions = 0;
    for (int w = 0; w < req.contributed_size(); ++w) {
      key->contributed[w] = req.contributed(w);
      key->contributions += req.contributed(w);
    }
    for (int w = 0; w < req.last_step_size(); ++w) key->last_step[w] = req.last_step(w);
    if (!options_.sync) {
      for (int i = 0; i < req.recent_push_ids_size(); ++i)
        key->recent_push_ids[i] = req.recent_push_ids(i);
      for (int w = 0; w < req.recent_next_size(); ++w)
        key->recent_next[w] = static_cast<uint8_t>(req.recent_next(w));
    }
  }
  return absl::OkStatus();
}

void Store::FillSeed(const Key* k, int primary, v1::SeedRequest* req) const {
  *req->mutable_spec() = k->spec;
  req->set_primary(primary);
  req->set_version(k->version);
  req->set_lr(k->lr);
  for (int64_t c : k->clock) req->add_worker_clocks(c);
}

void Store::FillWeights(const Key* k, v1::SeedRequest* req) const {
  req->set_weights(reinterpret_cast<const char*>(k->weights.data()), k->n * 4);
  for (const auto& slot : k->slots)
    req->add_slots(reinterpret_cast<const char*>(slot.data()), k->n * 4);
}

void Store::FillHandover(const Key* k, v1::SeedRequest* req) const {
  req->set_handover(true);
  if (options_.sync) {
    if (k->contributions > 0)
      req->set_accum(reinterpret_cast<const char*>(k->accum.data()), k->n * 4);
    for (char c : k->contributed) req->add_contributed(c != 0);
    for (int64_t step : k->last_step) req->add_last_step(step);
  } else {
    for (uint64_t id : k->recent_push_ids) req->add_recent_push_ids(id);
    for (uint8_t next : k->recent_next) req->add_recent_next(next);
  }
}

void Store::SeedCopies(int owner, const std::function<absl::Status(const v1::SeedRequest&)>& send) {
  int64_t sent = 0;
  const int primary = owner < 0 ? options_.self : owner;
  for (Key* k : AllKeys()) {
    absl::MutexLock lock(&k->mu);
    if (!k->serving || !k->initialized || !Owns(k, owner)) continue;
    if (k->table != nullptr) {
      LogWarning("key '", k->name,
                 "' is a sparse table's part, which is not copied to other servers");
      continue;
    }
    v1::SeedRequest req;
    FillSeed(k, primary, &req);
    FillWeights(k, &req);
    if (absl::Status s = send(req); !s.ok()) {
      LogWarning("building the copy of key '", k->name, "' failed: ", s.message());
      return;
    }
    ++sent;
  }
  LogInfo("copied ", sent, " keys to their new backup");
}

void Store::Release(int owner, int to, const SendSeed& send) {
  Completed failed;
  int64_t n = 0, handed = 0;
  const int primary = owner < 0 ? options_.self : owner;
  for (Key* k : AllKeys()) {
    absl::MutexLock lock(&k->mu);
    if (!k->serving || !Owns(k, owner)) continue;
    if (send && k->initialized && k->table == nullptr) {
      // Under the key's lock: nothing changes it between the hand-over and
      // the moment it stops being served here. The copy there has every
      // version published here (an update is published once it holds it),
      // so the weights go along only where it does not.
      v1::SeedRequest req;
      FillSeed(k, primary, &req);
      FillHandover(k, &req);
      absl::Status s = send(req);
      if (absl::IsFailedPrecondition(s)) {
        FillWeights(k, &req);
        s = send(req);
      }
      if (s.ok()) {
        ++handed;
      } else {
        LogWarning("key '", k->name, "': its state was not handed over to server ", to, " (",
                   s.message(),
                   "); a step half done here is done there again from the pushes resent to it");
      }
    }
    k->serving = false;
    k->moved_to = to;
    if (k->backup_of < 0) k->backup_of = options_.self;
    const absl::Status moved = NotServing(k);
    for (auto& [p, i] : k->waiters) {
      absl::MutexLock plock(&p->mu);
      if (p->error.ok()) p->error = moved;
      failed.push_back(p);
    }
    k->waiters.clear();
    if (k->initialized) {
      bytes_stored_ -= KeyBytes(k->n, k->optimizer);
      k->initialized = false;
    }
    // Freed: a new copy (Seed) allocates again.
    std::vector<float>().swap(k->weights);
    std::vector<float>().swap(k->accum);
    k->slots.clear();
    k->slot_ptrs.clear();
    k->snap_ready = false;
    ++n;
  }
  for (const auto& p : failed) Complete(p.get());
  if (n > 0) {
    LogInfo("server ", primary, "'s ", n, " keys served here moved to server ", to, " (", handed,
            " handed over)");
  }
}

void Store::InitKey(Key* key, const OptimizerConfig& optimizer) {
  key->optimizer = optimizer;
  // Restored weights and slots are moved in before: kept as they are.
  key->weights.resize(key->n);
  const int num_slots = NumSlots(key->optimizer);
  if (key->slots.size() != static_cast<size_t>(num_slots)) {
    key->slots.assign(num_slots, std::vector<float>(key->n));
  }
  key->slot_ptrs.clear();
  for (auto& s : key->slots) key->slot_ptrs.push_back(s.data());
  if (options_.sync) key->accum.assign(key->n, 0.f);
  key->contributed.assign(options_.num_workers, 0);
  key->last_step.assign(options_.num_workers, -1);
  key->clock.assign(options_.num_workers, 0);
  {
    absl::MutexLock members(&members_mu_);
    key->active = active_;
  }
  key->required = std::max<int>(
      1, std::count(key->active.begin(), key->active.end(), 1) - options_.backup_workers);
  if (!options_.sync) {
    key->recent_push_ids.assign(options_.num_workers * kPushWindow, 0);
    key->recent_next.assign(options_.num_workers, 0);
  }
  key->initialized = true;
  bytes_stored_ += KeyBytes(key->n, key->optimizer);
}

namespace {

// Whether no value is NaN or Inf (exponent bits all ones): an integer OR
// over the bits, which compilers vectorize.
bool AllFinite(const float* v, int64_t n) {
  uint32_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, v + i, sizeof(bits));
    bad |= (bits & 0x7f800000u) == 0x7f800000u;
  }
  return bad == 0;
}

}  // namespace

void Store::Apply(Key* key, const float* grad, const Origin& origin) {
  // The backup applies the same update while this server does; the new
  // version is published here only once the backup holds it too.
  Forwarded forwarded;
  if (key->serving && forward_) {
    forwarded = forward_(key->backup_of, key->spec.variable(), key->spec.partition(), key->version,
                         grad, key->n, origin);
  }
  // An assign key's value is data, not an update: NaN and Inf in it are what
  // the workers must see (GradScaler finds the overflow in the mean gradient).
  const bool skip = !key->FreeRunning() && !AllFinite(grad, key->n);
  const absl::Time start = absl::Now();
  if (!skip) {
    ApplyUpdate(key->optimizer, key->lr, key->version + 1, key->weights.data(), grad,
                key->slot_ptrs.data(), key->n);
  }
  if (forwarded) {
    if (absl::Status s = forwarded(); !s.ok())
      LogWarning("key '", key->name, "': its replica was not updated: ", s.message());
  }
  if (skip) {
    SkipNonfinite(key, grad, key->n);
    return;
  }
  Applied(key, start);
}

void Store::ApplyRows(Key* key, absl::Span<const int64_t> ids, const float* grads, float scale) {
  if (SkipNonfinite(key, grads, static_cast<int64_t>(ids.size()) * key->table->dim())) return;
  const absl::Time start = absl::Now();
  const int64_t rows = key->table->rows();
  key->table->Apply(ids, grads, scale, key->lr, key->version + 1);
  const int64_t evicted = key->table->MaybeEvict(key->version + 1);
  evicted_rows_->Add(static_cast<double>(evicted));
  bytes_stored_ += (key->table->rows() - rows) * key->table->row_bytes();
  Applied(key, start);
}

void Store::Applied(Key* key, absl::Time start) {
  ++key->version;
  if (key->version == snapshot_step_.load(std::memory_order_relaxed) && key->serving) CopyForSnapshot(key);
  updates_->Add();
  update_seconds_->Observe(absl::ToDoubleSeconds(absl::Now() - start));
}

bool Store::SkipNonfinite(Key* key, const float* grad, int64_t n) {
  if (!AllFinite(grad, n)) {
    // As AMP's GradScaler does, the step is skipped: the weights stay
    // finite. Or ("nonfinite": "fail") the key stops, and says why.
    nonfinite_updates_->Add();
    const std::string what = absl::StrCat("key '", key->name, "' got a gradient with NaN or Inf at version ",
                                          key->version, " (", ++key->nonfinite, " so far)");
    if (options_.fail_on_nonfinite) {
      key->stopped = absl::FailedPreconditionError(absl::StrCat(
          what, "; the job's \"nonfinite\" setting is \"fail\": this key takes no more pushes or pulls"));
      LogError(key->stopped.message());
      return true;
    }
    if (key->nonfinite == 1) LogWarning(what, ": skipped (\"nonfinite\": \"skip\"); later ones are counted only");
    ++key->version;
    if (key->version == snapshot_step_.load(std::memory_order_relaxed) && key->serving) CopyForSnapshot(key);
    return true;
  }
  return false;
}

absl::Status Store::Push(const WireMessage& req) {
  if (absl::Status s = CheckWorker(req.worker_rank); !s.ok()) return s;
  if (req.keys.empty()) return absl::InvalidArgumentError("push request names no keys");
  const int w = req.worker_rank;
  std::vector<Key*> keys;
  keys.reserve(req.keys.size());
  int64_t bytes = 0;
  for (const WireKey& kd : req.keys) {
    absl::StatusOr<Key*> key = Find(kd.variable, kd.partition);
    if (!key.ok()) return key.status();
    Key* k = *key;
    if (std::find(keys.begin(), keys.end(), k) != keys.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("key '", k->name, "' appears twice in one push; send one gradient per key"));
    }
    const int bpv = BytesPerValue(kd.dtype);
    if (bpv == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "push to key '", k->name, "' has dtype ", DTypeName(kd.dtype),
          "; gradients are float32, float16 or bfloat16"));
    }
    if (k->is_table) {
      const int64_t dim = k->spec.table().dim();
      if (kd.data.size() != static_cast<int64_t>(kd.ids.size()) * dim * bpv) {
        return absl::InvalidArgumentError(absl::StrCat(
            "push to table '", k->spec.variable(), "' has ", kd.data.size(), " bytes for ", kd.ids.size(),
            " ids; rows of dim ", dim, " in ", DTypeName(kd.dtype), " take ", kd.ids.size() * dim * bpv));
      }
    } else if (!kd.ids.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("push to key '", k->name, "' names ids, but the variable is not a table"));
    } else if (kd.data.size() != k->n * bpv) {
      return absl::InvalidArgumentError(absl::StrCat(
          "push to key '", k->name, "' has ", kd.data.size(), " bytes; the key holds ", k->n, " ",
          DTypeName(kd.dtype), " (", k->n * bpv, " bytes)"));
    }
    // Values are divided by the scale: its inverse must be finite too.
    if (!std::isfinite(kd.scale) || kd.scale < 0 || (kd.scale != 0 && !std::isfinite(1.0f / kd.scale))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "push to key '", k->name, "' has scale ", kd.scale,
          "; a scale is finite and positive, at least 3e-39 (0 stands for 1)"));
    }
    absl::MutexLock lock(&k->mu);
    if (!k->serving) return NotServing(k);
    if (!k->initialized) {
      return absl::FailedPreconditionError(absl::StrCat(
          "key '", k->name, "' has no value yet: rank 0 has not registered it"));
    }
    if (!k->stopped.ok()) return k->stopped;
    if (!k->active[w]) {
      return absl::FailedPreconditionError(absl::StrCat(
          "worker ", w, " is not an active worker of this job (it was lost); it must rejoin first"));
    }
    if (kd.version < 0 || (options_.sync && kd.version > k->version)) {
      return absl::OutOfRangeError(absl::StrCat(
          "push to key '", k->name, "' is for version ", kd.version, " but the key is at version ",
          k->version, options_.sync ? "; in sync mode a worker pushes for the version it pulled" : ""));
    }
    // Async and ssp: a worker's clock moves one push at a time; a push far
    // ahead would let it outrun the staleness bound (or be garbage).
    if (!options_.sync && kd.version > k->clock[w]) {
      return absl::OutOfRangeError(absl::StrCat(
          "push to key '", k->name, "' is for clock ", kd.version, " but worker ", w,
          "'s clock there is ", k->clock[w], "; a worker's clock advances one push at a time"));
    }
    if (k->table) {
      if (absl::Status s = CheckRowsLocked(k, kd.ids); !s.ok()) return s;
    }
    keys.push_back(k);
    bytes += kd.data.size();
  }
  pushes_->Add();
  // A key that moved to another server since it was checked (Release) is
  // not applied here: the push is answered UNAVAILABLE and sent again where
  // the shard map says, which takes the keys applied here as pushed (their
  // state was handed over).
  absl::Mutex moved_mu;
  absl::Status moved;
  auto push_key = [&](int i) {
    const WireKey& kd = req.keys[i];
    Key* k = keys[i];
    bytes_in_->Add(kd.data.size());
    key_pushes_->Add();
    if (kd.dtype != v1::DTYPE_FLOAT32) compressed_pushes_->Add();
    if (kd.scale != 0 && kd.scale != 1) rescaled_pushes_->Add();
    if (kd.nonfinite) nonfinite_pushes_->Add();
    Completed completed;
    {
      absl::MutexLock lock(&k->mu);
      if (!k->serving) {
        absl::MutexLock mlock(&moved_mu);
        moved = NotServing(k);
        return;
      }
      ApplyPush(k, w, req.push_id, kd);
      NotifyWaiters(k, &completed);
    }
    for (const auto& p : completed) Complete(p.get());
  };
  // The keys of a big push are applied in parallel, on this thread and the
  // store's pool; a small one right here (a hand-off costs more).
  if (keys.size() > 1 && bytes >= kParallelPushBytes) {
    apply_pool_->ParallelFor(static_cast<int>(keys.size()), push_key);
  } else {
    for (size_t i = 0; i < keys.size(); ++i) push_key(static_cast<int>(i));
  }
  absl::MutexLock lock(&moved_mu);
  return moved;
}

void Store::ApplyPush(Key* k, int w, uint64_t push_id, const WireKey& kd) {
  if (!options_.sync) {
    uint64_t* recent = &k->recent_push_ids[w * kPushWindow];
    if (push_id != 0 && std::find(recent, recent + kPushWindow, push_id) != recent + kPushWindow) {
      duplicate_pushes_->Add();
      return;
    }
    const Origin origin{w, push_id, kd.version + 1};
    RecordPush(k, origin);
    // A float32 gradient in one aligned piece is applied where it lies;
    // anything else is decoded once into the key's scratch buffer.
    const float* grad = Gradient(k, kd);
    if (k->table) {
      ApplyRows(k, kd.ids, grad, 1);
    } else {
      Apply(k, grad, origin);
    }
    return;
  }
  // Sync: one push per worker and version; a retry finds its step applied
  // or its bit set, a backup worker's late push finds its step applied.
  if (kd.version < k->version) {
    (k->last_step[w] == kd.version ? duplicate_pushes_ : dropped_pushes_)->Add();
    return;
  }
  if (k->contributed[w]) {
    duplicate_pushes_->Add();
    return;
  }
  k->last_step[w] = kd.version;
  if (!k->table && k->contributions == 0 && k->required == 1 && (kd.scale == 0 || kd.scale == 1)) {
    // The step's one gradient (a single worker): applied from where it
    // lies, as an async push is, without the pass through the accumulator.
    Apply(k, Gradient(k, kd), Origin());
    return;
  }
  if (k->table) {
    k->table->Accumulate(kd.ids, Gradient(k, kd));
  } else {
    DecodePayload(kd.data, kd.dtype, kd.scale, k->accum.data(), k->contributions > 0);
  }
  k->contributed[w] = 1;
  ++k->contributions;
  MaybeFinishStep(k);
}

const float* Store::Gradient(Key* k, const WireKey& kd) {
  const std::vector<absl::string_view>& pieces = kd.data.pieces();
  if (kd.dtype == v1::DTYPE_FLOAT32 && pieces.size() == 1 &&
      reinterpret_cast<uintptr_t>(pieces[0].data()) % alignof(float) == 0) {
    return reinterpret_cast<const float*>(pieces[0].data());
  }
  k->scratch.resize(kd.data.size() / BytesPerValue(kd.dtype));
  DecodePayload(kd.data, kd.dtype, kd.scale, k->scratch.data(), false);
  return k->scratch.data();
}

absl::Status Store::CheckRowsLocked(Key* k, absl::Span<const int64_t> ids) {
  absl::StatusOr<int64_t> missing = k->table->CheckIds(ids);
  if (!missing.ok()) return missing.status();
  if (options_.max_bytes > 0) {
    const int64_t more = *missing * k->table->row_bytes();
    if (more > 0 && bytes_stored_.load() + more > options_.max_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "table '", k->spec.variable(), "': ", more / k->table->row_bytes(), " new rows would make this server hold ",
          bytes_stored_.load() + more, " bytes, more than limits.max_server_bytes (", options_.max_bytes, ")"));
    }
  }
  return absl::OkStatus();
}

void Store::RecordPush(Key* k, const Origin& origin) {
  const int w = origin.worker;
  k->recent_push_ids[w * kPushWindow + k->recent_next[w]] = origin.push_id;
  k->recent_next[w] = (k->recent_next[w] + 1) % kPushWindow;
  k->clock[w] = std::max(k->clock[w], origin.clock);
}

void Store::MaybeFinishStep(Key* k) {
  if (k->contributions == 0 || k->contributions < k->required) return;
  if (k->table) {
    const float scale = options_.average_gradients && k->contributions > 1 ? 1.0f / k->contributions : 1.0f;
    ApplyRows(k, k->table->accumulated_ids(), k->table->accumulated(), scale);
    k->table->ClearAccumulated();
    std::fill(k->contributed.begin(), k->contributed.end(), 0);
    k->contributions = 0;
    return;
  }
  if (options_.average_gradients && k->contributions > 1) {
    const float scale = 1.0f / k->contributions;
    for (float& v : k->accum) v *= scale;
  }
  Apply(k, k->accum.data(), Origin());
  std::fill(k->contributed.begin(), k->contributed.end(), 0);
  k->contributions = 0;
}

std::vector<Store::Key*> Store::AllKeys() const {
  std::vector<Key*> keys;
  absl::ReaderMutexLock lock(&map_mu_);
  for (const auto& [name, key] : keys_) keys.push_back(key.get());
  return keys;
}

void Store::SetMembership(int64_t epoch, const std::vector<int>& active_workers) {
  std::vector<char> active(options_.num_workers, 0);
  for (int w : active_workers) {
    if (w >= 0 && w < options_.num_workers) active[w] = 1;
  }
  {
    absl::MutexLock lock(&members_mu_);
    if (epoch <= epoch_) return;
    epoch_ = epoch;
    active_ = active;
  }
  epoch_gauge_->Set(epoch);
  const int required = std::max<int>(1, std::count(active.begin(), active.end(), 1) - options_.backup_workers);
  for (Key* k : AllKeys()) {
    Completed completed;
    {
      absl::MutexLock lock(&k->mu);
      if (!k->initialized) continue;
      k->active = active;
      k->required = required;
      if (options_.sync) MaybeFinishStep(k);
      NotifyWaiters(k, &completed);  // ssp: the slowest worker may have left
    }
    for (const auto& p : completed) Complete(p.get());
  }
}

std::vector<int64_t> Store::WorkerClocks() const {
  std::vector<int64_t> clocks(options_.num_workers, INT64_MAX);
  bool any = false;
  for (Key* k : AllKeys()) {
    absl::MutexLock lock(&k->mu);
    if (!k->initialized) continue;
    any = true;
    for (int w = 0; w < options_.num_workers; ++w) clocks[w] = std::min(clocks[w], k->clock[w]);
  }
  if (!any) clocks.clear();  // no key here: nothing to say about clocks
  return clocks;
}

int64_t Store::membership_epoch() const {
  absl::MutexLock lock(&members_mu_);
  return epoch_;
}

void Store::Close() {
  closing_ = true;
  for (const auto& p : TakePending()) Fail(p.get(), absl::UnavailableError("the server is stopping"));
}

bool Store::Ready(Key* k, int64_t min_version) const {
  if (!k->initialized) return false;
  if (options_.sync) return k->version >= min_version;
  if (options_.staleness < 0) return true;  // async
  return SlowestClock(k) >= min_version - options_.staleness;
}

int64_t Store::SlowestClock(Key* k) const {
  int64_t m = INT64_MAX;
  for (int w = 0; w < options_.num_workers; ++w) {
    if (k->active[w]) m = std::min(m, k->clock[w]);
  }
  return m;
}

bool Store::Serve(Key* k, PendingPull* p, int i) {
  const v1::DType dtype = p->dtypes[i];
  int64_t n = k->n;
  const float* values = k->weights.data();
  // A table's rows asked for, in the request's order (made, if new): float32
  // straight into the answer, else gathered first and converted from there.
  const bool rows_in_place = k->table != nullptr && dtype == v1::DTYPE_FLOAT32;
  if (k->table) {
    n = static_cast<int64_t>(p->ids[i].size()) * k->table->dim();
    if (!rows_in_place) {
      thread_local std::vector<float> rows;
      rows.resize(n);
      GatherRows(k, p->ids[i], rows.data());
      values = rows.data();
    }
  }
  // The one copy of the weights on the way out, fused with the conversion.
  auto write = [&](char* to) {
    if (!rows_in_place) return EncodeValues(values, n, dtype, to).scale;
    GatherRows(k, p->ids[i], reinterpret_cast<float*>(to));
    return 0.0f;
  };
  const int64_t bytes = n * BytesPerValue(dtype);
  OutKey out;
  out.variable = k->spec.variable();
  out.partition = k->spec.partition();
  out.version = k->version;
  out.dtype = dtype;
  out.size = bytes;
  // Into the worker's shared memory, or a pooled buffer gRPC sends from.
  const bool to_shared = p->shared_at[i] != nullptr && bytes <= p->spans[i].capacity;
  if (!to_shared) {
    BufferRef buf = buffers_.Get(bytes);
    out.scale = write(buf.data());
    out.data = buf.data();
    out.owner = std::move(buf);
  }
  if (!options_.sync) staleness_->Observe(std::max<int64_t>(0, p->min_version[i] - SlowestClock(k)));
  pull_wait_seconds_->Observe(absl::ToDoubleSeconds(absl::Now() - p->start));
  absl::MutexLock lock(&p->mu);
  if (p->finished || p->served[i]) return false;
  if (to_shared) {
    // Written only while the pull is live: once it has ended the worker
    // may use that memory for something else.
    out.scale = write(p->shared_at[i]);
    out.has_shared = true;
    out.shared = p->spans[i];
    out.shared.size = bytes;
    out.shared.capacity = 0;
  }
  bytes_out_->Add(bytes);
  pulls_->Add();
  p->out[i] = std::move(out);
  p->served[i] = 1;
  return --p->remaining == 0;
}

void Store::GatherRows(Key* k, absl::Span<const int64_t> ids, float* out) {
  const int64_t before = k->table->rows();
  k->table->Gather(ids, k->version, out);
  bytes_stored_ += (k->table->rows() - before) * k->table->row_bytes();
}

void Store::NotifyWaiters(Key* k, Completed* completed) {
  if (!k->stopped.ok()) {
    // Every pull waiting for the key ends with its error (Complete fails them).
    for (auto& [p, i] : k->waiters) {
      absl::MutexLock lock(&p->mu);
      if (p->error.ok()) p->error = k->stopped;
      completed->push_back(p);
    }
    k->waiters.clear();
    return;
  }
  size_t kept = 0;
  for (size_t j = 0; j < k->waiters.size(); ++j) {
    auto& [p, i] = k->waiters[j];
    bool keep;
    {
      absl::MutexLock lock(&p->mu);
      keep = !p->finished;
    }
    if (keep && Ready(k, p->min_version[i])) {
      if (Serve(k, p.get(), i)) completed->push_back(p);
      keep = false;
    }
    if (keep) {
      if (kept != j) k->waiters[kept] = std::move(k->waiters[j]);
      ++kept;
    }
  }
  k->waiters.resize(kept);
}

void Store::Complete(PendingPull* p) {
  std::vector<OutKey> out;
  absl::Status error;
  {
    absl::MutexLock lock(&p->mu);
    if (p->finished) return;
    error = p->error;
    if (error.ok()) {
      p->finished = true;
      out = std::move(p->out);
    }
  }
  if (!error.ok()) return Fail(p, error);
  p->done(absl::OkStatus(), std::move(out));
}

void Store::Fail(PendingPull* p, const absl::Status& status) {
  {
    absl::MutexLock lock(&p->mu);
    if (p->finished) return;
    p->finished = true;
    p->out.clear();
  }
  for (Key* k : p->keys) {
    absl::MutexLock lock(&k->mu);
    auto& w = k->waiters;
    w.erase(std::remove_if(w.begin(), w.end(), [p](const auto& e) { return e.first.get() == p; }),
            w.end());
  }
  p->done(status, {});
}

std::string Store::WhyWaiting(PendingPull* p) {
  int i = 0;
  {
    absl::MutexLock lock(&p->mu);
    while (i + 1 < static_cast<int>(p->keys.size()) && p->served[i]) ++i;
  }
  Key* k = p->keys[i];
  const int64_t min_version = p->min_version[i];
  absl::MutexLock lock(&k->mu);
  std::string why;
  if (!k->initialized) {
    why = "rank 0 has not registered it";
  } else if (options_.sync) {
    std::vector<int> missing;
    for (int w = 0; w < options_.num_workers; ++w) {
      if (k->active[w] && !k->contributed[w]) missing.push_back(w);
    }
    why = absl::StrCat("the key is at version ", k->version, "; waiting for pushes from workers ",
                       absl::StrJoin(missing, ", "));
  } else {
    std::vector<std::string> behind;
    for (int w = 0; w < options_.num_workers; ++w) {
      if (k->active[w] && k->clock[w] < min_version - options_.staleness) {
        behind.push_back(absl::StrCat("worker ", w, " at clock ", k->clock[w]));
      }
    }
    why = absl::StrCat("staleness bound ", options_.staleness, " needs every worker at clock >= ",
                       min_version - options_.staleness, "; behind: ", absl::StrJoin(behind, ", "));
  }
  const bool capped = p->until == p->start + options_.max_pull_wait;
  return absl::StrCat("pull of key '", k->name, "' waited ",
                      absl::FormatDuration(absl::Trunc(absl::Now() - p->start, absl::Milliseconds(1))),
                      capped ? absl::StrCat(" (the longest this server lets a pull wait: limits.max_pull_wait_s, ",
                                            absl::FormatDuration(options_.max_pull_wait), ")")
                             : "",
                      options_.sync ? " for version " : " at clock ", min_version, ": ", why);
}

std::vector<std::shared_ptr<Store::PendingPull>> Store::TakePending() {
  absl::MutexLock lock(&pending_mu_);
  return std::exchange(pending_, {});
}

void Store::Sweep() {
  const absl::Time now = absl::Now();
  std::vector<std::shared_ptr<PendingPull>> pending = TakePending();
  std::vector<std::shared_ptr<PendingPull>> still;
  for (auto& p : pending) {
    bool cancelled;
    {
      // Asked under the lock: once finished, the caller may be gone.
      absl::MutexLock lock(&p->mu);
      if (p->finished) continue;
      cancelled = p->cancelled && p->cancelled();
    }
    if (closing_) {
      Fail(p.get(), absl::UnavailableError("the server is stopping"));
    } else if (cancelled) {
      Fail(p.get(), absl::CancelledError("the caller cancelled the pull"));
    } else if (now >= p->until) {
      Fail(p.get(), absl::DeadlineExceededError(WhyWaiting(p.get())));
    } else {
      still.push_back(std::move(p));
    }
  }
  absl::MutexLock lock(&pending_mu_);
  pending_.insert(pending_.end(), std::make_move_iterator(still.begin()),
                  std::make_move_iterator(still.end()));
  waiting_pulls_->Set(static_cast<double>(pending_.size()));
}

void Store::RunSweeper() {
  absl::MutexLock lock(&sweeper_mu_);
  auto stop = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(sweeper_mu_) { return sweeper_stop_; };
  while (!sweeper_mu_.AwaitWithTimeout(absl::Condition(&stop), kSweepInterval)) {
    sweeper_mu_.Unlock();
    Sweep();
    sweeper_mu_.Lock();
  }
}

int64_t Store::pending_pulls() const {
  absl::MutexLock lock(&pending_mu_);
  return static_cast<int64_t>(pending_.size());
}

// The dtype a pull asks its weights in (unspecified: float32).
static absl::Status CheckPullDtype(const std::string& key, v1::DType dtype) {
  if (dtype == v1::DTYPE_UNSPECIFIED || BytesPerValue(dtype) != 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("pull of key '", key, "' asks for dtype ", dtype,
                                                 "; weights are sent as float32, float16 or bfloat16"));
}

void Store::PullAsync(const WireMessage& req, absl::Time deadline, Cancelled cancelled,
                      PullDone done) {
  if (absl::Status s = CheckWorker(req.worker_rank); !s.ok()) return done(s, {});
  if (req.keys.empty()) return done(absl::InvalidArgumentError("pull request names no keys"), {});
  auto p = std::make_shared<PendingPull>();
  for (const WireKey& kd : req.keys) {
    absl::StatusOr<Key*> key = Find(kd.variable, kd.partition);
    if (!key.ok()) return done(key.status(), {});
    if (std::find(p->keys.begin(), p->keys.end(), *key) != p->keys.end()) {
      return done(absl::InvalidArgumentError(
                      absl::StrCat("key '", (*key)->name, "' appears twice in one pull; name each key once")),
                  {});
    }
    if (!kd.data.empty()) {
      return done(absl::InvalidArgumentError(absl::StrCat(
                      "pull of key '", (*key)->name, "' carries data; a pull names keys and versions only")),
                  {});
    }
    if (absl::Status s = CheckPullDtype((*key)->name, kd.dtype); !s.ok()) return done(s, {});
    if (!(*key)->is_table && !kd.ids.empty()) {
      return done(absl::InvalidArgumentError(absl::StrCat("pull of key '", (*key)->name,
                                                          "' names ids, but the variable is not a table")),
                  {});
    }
    p->keys.push_back(*key);
    p->ids.push_back(kd.ids);
    p->min_version.push_back(kd.version);
    p->dtypes.push_back(kd.dtype == v1::DTYPE_UNSPECIFIED ? v1::DTYPE_FLOAT32 : kd.dtype);
    p->shared_at.push_back(kd.shared_at);
    p->spans.push_back(kd.shared);
  }
  const int n = static_cast<int>(p->keys.size());
  p->start = absl::Now();
  p->until = std::min(deadline, p->start + options_.max_pull_wait);
  p->cancelled = std::move(cancelled);
  p->done = std::move(done);
  {
    absl::MutexLock lock(&p->mu);
    p->out.resize(n);
    p->served.assign(n, 0);
    p->remaining = n;
  }
  // Every key is checked before any is served: serving a table's key makes
  // its new rows, which a refused pull must not leave behind.
  auto check = [&](int i) ABSL_EXCLUSIVE_LOCKS_REQUIRED(p->keys[i]->mu) -> absl::Status {
    Key* k = p->keys[i];
    const int64_t min_version = p->min_version[i];
    if (!k->stopped.ok()) return k->stopped;
    if (!k->serving) return NotServing(k);
    if (k->table) {
      if (absl::Status s = CheckRowsLocked(k, p->ids[i]); !s.ok()) return s;
    }
    if (min_version < 0) {
      return absl::OutOfRangeError(
          absl::StrCat("pull of key '", k->name, "' asks for version ", min_version, "; versions start at 0"));
    }
    if (options_.sync && k->initialized && min_version > k->version + 1) {
      return absl::OutOfRangeError(absl::StrCat("pull of key '", k->name, "' asks for version ", min_version,
                                                " but the key is at version ", k->version,
                                                "; in sync mode a pull may ask at most one version ahead"));
    }
    return absl::OkStatus();
  };
  for (int i = 0; i < n; ++i) {
    absl::Status s;
    {
      absl::MutexLock lock(&p->keys[i]->mu);
      s = check(i);
    }
    if (!s.ok()) return Fail(p.get(), s);
  }
  absl::Status bad;
  bool complete = false;
  for (int i = 0; i < n && bad.ok(); ++i) {
    Key* k = p->keys[i];
    absl::MutexLock lock(&k->mu);
    if (!(bad = check(i)).ok()) {  // the key stopped meanwhile
    } else if (Ready(k, p->min_version[i])) {
      complete = Serve(k, p.get(), i);
    } else {
      k->waiters.emplace_back(p, i);
    }
  }
  if (!bad.ok()) return Fail(p.get(), bad);
  if (complete) return Complete(p.get());
  if (closing_) return Fail(p.get(), absl::UnavailableError("the server is stopping"));
  absl::MutexLock lock(&pending_mu_);
  pending_.push_back(std::move(p));
}

void Store::PushPullAsync(const WireMessage& req, absl::Time deadline, Cancelled cancelled,
                          PullDone done) {
  // The pull part is checked first: a refused push-pull pushes nothing.
  for (const WireKey& kd : req.keys) {
    if (absl::Status s = CheckPullDtype(KeyName(kd.variable, kd.partition), kd.pull_dtype); !s.ok()) {
      return done(s, {});
    }
  }
  if (absl::Status s = Push(req); !s.ok()) return done(s, {});
  WireMessage pull;
  pull.worker_rank = req.worker_rank;
  pull.keys.resize(req.keys.size());
  for (size_t i = 0; i < req.keys.size(); ++i) {
    pull.keys[i].variable = req.keys[i].variable;
    pull.keys[i].partition = req.keys[i].partition;
    pull.keys[i].version = req.keys[i].version + 1;
    pull.keys[i].dtype = req.keys[i].pull_dtype;
    // The answer may go where the pushed values were (consumed by now).
    pull.keys[i].has_shared = req.keys[i].has_shared;
    pull.keys[i].shared = req.keys[i].shared;
    pull.keys[i].shared_at = req.keys[i].shared_at;
    pull.keys[i].ids = req.keys[i].ids;
  }
  PullAsync(pull, deadline, std::move(cancelled), std::move(done));
}

namespace {

// A parsed protobuf request as the data path sees it (values by reference).
WireKey ToWire(const v1::KeyData& kd) {
  WireKey k;
  k.variable = kd.variable();
  k.partition = kd.partition();
  k.version = kd.version();
  k.dtype = kd.dtype();
  k.data.Add(kd.data());
  k.scale = kd.scale();
  k.nonfinite = kd.nonfinite();
  k.pull_dtype = kd.pull_dtype();
  k.ids.assign(kd.ids().begin(), kd.ids().end());
  return k;
}

template <typename Request>
WireMessage ToWire(const Request& req) {
  WireMessage m;
  m.worker_rank = req.worker_rank();
  for (const v1::KeyData& kd : req.keys()) m.keys.push_back(ToWire(kd));
  return m;
}

void ToProto(const std::vector<OutKey>& keys,
             google::protobuf::RepeatedPtrField<v1::KeyData>* out) {
  for (const OutKey& o : keys) {
    v1::KeyData* kd = out->Add();
    kd->set_variable(std::string(o.variable));
    kd->set_partition(o.partition);
    kd->set_version(o.version);
    kd->set_dtype(o.dtype);
    kd->set_scale(o.scale);
    kd->set_data(o.data, o.size);
  }
}

}  // namespace

absl::Status Store::Push(const v1::PushRequest& req) {
  WireMessage m = ToWire(req);
  m.push_id = req.push_id();
  return Push(m);
}

absl::Status Store::WaitPull(
    const std::function<void(PullDone)>& start,
    google::protobuf::RepeatedPtrField<v1::KeyData>* out) {
  absl::Notification finished;
  absl::Status status;
  std::vector<OutKey> keys;
  start([&](absl::Status s, std::vector<OutKey> k) {
    status = std::move(s);
    keys = std::move(k);
    finished.Notify();
  });
  // Ends by the pull's own deadline (the sweeper fails it then).
  finished.WaitForNotification();
  if (status.ok()) ToProto(keys, out);
  return status;
}

absl::Status Store::Pull(const v1::PullRequest& req, absl::Time deadline,
                         v1::PullResponse* resp, const Cancelled& cancelled) {
  const WireMessage m = ToWire(req);
  return WaitPull([&](PullDone done) { PullAsync(m, deadline, cancelled, std::move(done)); },
                  resp->mutable_keys());
}

absl::Status Store::PushPull(const v1::PushPullRequest& req, absl::Time deadline,
                             v1::PushPullResponse* resp, const Cancelled& cancelled) {
  WireMessage m = ToWire(req.push());
  m.push_id = req.push().push_id();
  return WaitPull([&](PullDone done) { PushPullAsync(m, deadline, cancelled, std::move(done)); },
                  resp->mutable_keys());
}

absl::StatusOr<int64_t> Store::SetLearningRate(const v1::SetLearningRateRequest& req) {
  if (absl::Status s = CheckWorker(req.worker_rank()); !s.ok()) return s;
  if (!(req.lr() >= 0) || !std::isfinite(static_cast<float>(req.lr()))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "learning rate must be >= 0 and finite as float32, the precision updates run in; got ", req.lr()));
  }
  std::vector<Key*> keys;
  {
    absl::ReaderMutexLock lock(&map_mu_);
    for (auto& [name, key] : keys_) {
      if (req.variable().empty() || key->spec.variable() == req.variable()) keys.push_back(key.get());
    }
  }
  if (keys.empty() && !req.variable().empty()) {
    return absl::NotFoundError(absl::StrCat("variable '", req.variable().substr(0, kMaxNameBytes),
                                            "' has no key on this server; register it first"));
  }
  // Checked against every key's optimizer before any key changes.
  for (Key* k : keys) {
    absl::MutexLock lock(&k->mu);
    if (!k->initialized) continue;
    if (absl::Status s = ValidateLearningRate(k->optimizer, req.lr()); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("learning rate for key '", k->name, "': ", s.message()));
    }
  }
  for (Key* k : keys) {
    absl::MutexLock lock(&k->mu);
    k->lr = req.lr();
    k->lr_set = true;
  }
  return static_cast<int64_t>(keys.size());
}

std::pair<int64_t, int64_t> Store::VersionRange() const {
  int64_t lo = INT64_MAX, hi = 0;
  for (Key* k : AllKeys()) {
    absl::MutexLock lock(&k->mu);
    if (!k->initialized || k->FreeRunning()) continue;
    lo = std::min(lo, k->version);
    hi = std::max(hi, k->version);
  }
  return {lo == INT64_MAX ? 0 : lo, hi};
}

void Store::CopyForSnapshot(Key* k) {
  const absl::Time start = absl::Now();
  KeyRecord& r = k->snap;
  r.variable = k->spec.variable();
  r.partition = k->spec.partition();
  r.offset = k->spec.offset();
  r.version = k->version;
  r.learning_rate = k->lr;
  r.optimizer = OptimizerToProto(k->optimizer).name();
  if (k->table) {
    k->table->Save(&r);
  } else {
    r.num_elements = k->n;
    r.weights.assign(k->weights.begin(), k->weights.end());
    r.slots.resize(k->slots.size());
    for (size_t i = 0; i < k->slots.size(); ++i) r.slots[i].assign(k->slots[i].begin(), k->slots[i].end());
  }
  k->snap_ready = true;
  const double pause = absl::ToDoubleSeconds(absl::Now() - start);
  snapshot_pause_seconds_->Observe(pause);
  double seen = max_pause_s_.load();
  while (pause > seen && !max_pause_s_.compare_exchange_weak(seen, pause)) {
  }
}

bool Store::Stray(Key* k, int64_t step) {
  if (!options_.sync || step <= 0) return false;
  if (registrations_ended_) {
    // Every worker finished: nothing moves this key any more. An assign
    // key is taken as it is anyway, once it has its value.
    if (k->initialized && (k->version >= step || k->FreeRunning())) return false;
    if (!k->partial_told) {
      k->partial_told = true;
      LogWarning("key '", k->name, "' is at version ", k->version, ", short of step ", step,
                 ", and every worker finished: the final checkpoint ",
                 k->initialized ? "takes it as it is" : "leaves it out (it has no value)");
    }
    return true;
  }
  if (k->version != 0 || k->registrants.empty() ||
      absl::Now() - k->first_registered < options_.registration_wait) {
    return false;
  }
  // Asked on every poll of a waiting checkpoint: the lists are made only
  // for the one warning.
  auto missing = [&](int w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(k->mu) {
    return !k->registrants[w] && (k->active.empty() || k->active[w]);
  };
  int w = 0;
  while (w < options_.num_workers && !missing(w)) ++w;
  if (w == options_.num_workers) return false;
  if (!k->partial_told) {
    k->partial_told = true;
    std::vector<int> by, not_by;
    for (int i = 0; i < options_.num_workers; ++i) {
      if (k->registrants[i]) by.push_back(i);
      if (missing(i)) not_by.push_back(i);
    }
    LogWarning("key '", k->name, "' was registered by worker", by.size() > 1 ? "s " : " ", absl::StrJoin(by, ", "),
               " but not by worker", not_by.size() > 1 ? "s " : " ", absl::StrJoin(not_by, ", "), " in ",
               absl::FormatDuration(options_.registration_wait), ", so it cannot take a step: checkpoints ",
               k->initialized ? "take it as it is (version 0)" : "leave it out (it has no value)");
  }
  return true;
}

absl::Status Store::ArmSnapshot(int64_t step) {
  const std::vector<Key*> keys = AllKeys();
  // Forget the last copies before arming, so a key that reaches the step
  // while the loop below runs keeps the copy it took.
  for (Key* k : keys) {
    absl::MutexLock lock(&k->mu);
    k->snap_ready = false;
  }
  max_pause_s_ = 0;
  snapshot_now_ = step < 0;
  snapshot_step_ = step >= 0 ? step : kNotArmed;
  for (Key* k : keys) {
    absl::MutexLock lock(&k->mu);
    if (!k->initialized || k->snap_ready || !k->serving) continue;
    k->snap_stray = Stray(k, step);
    if (step < 0 || k->version == step || k->FreeRunning() || k->snap_stray) {
      CopyForSnapshot(k);
    } else if (k->version > step) {
      snapshot_step_ = kNotArmed;
      return absl::FailedPreconditionError(absl::StrCat(
          "key '", k->name, "' is at version ", k->version, ", past the checkpoint's step ", step));
    }
  }
  return absl::OkStatus();
}

int64_t Store::WaitSnapshot(absl::Time deadline) {
  if (snapshot_now_) return 0;  // every key was copied when armed
  for (;;) {
    int64_t waiting = 0;
    for (Key* k : AllKeys()) {
      absl::MutexLock lock(&k->mu);
      // A key still waiting for rank 0's initial value counts: it reaches
      // the step like the others, and a shard without it is not whole. An
      // assign key is taken as it is once it has that value.
      const bool stray = !k->snap_ready && (k->snap_stray = Stray(k, snapshot_step_));
      if ((k->FreeRunning() || stray) && k->initialized && !k->snap_ready && k->serving) CopyForSnapshot(k);
      if (!k->snap_ready && k->serving && !stray) ++waiting;
    }
    if (waiting == 0 || closing_ || absl::Now() >= deadline) return waiting;
    absl::SleepFor(absl::Milliseconds(2));
  }
}

void Store::DisarmSnapshot() { snapshot_step_ = kNotArmed; }

void Store::EncodeSnapshot(std::string* out, v1::SaveShardResponse* info) {
  DisarmSnapshot();  // from here on nothing writes the copies
  std::vector<Key*> keys = AllKeys();
  std::sort(keys.begin(), keys.end(), [](Key* a, Key* b) { return a->name < b->name; });
  std::vector<const KeyRecord*> records;
  absl::flat_hash_set<std::string> variables;
  for (Key* k : keys) {
    absl::MutexLock lock(&k->mu);
    if (!k->snap_ready || !k->serving) continue;
    records.push_back(&k->snap);
    v1::ManifestKey* mk = info->add_keys();
    mk->set_variable(k->snap.variable);
    mk->set_partition(k->snap.partition);
    mk->set_offset(k->snap.offset);
    mk->set_num_elements(k->snap.num_elements);
    mk->set_version(k->snap.version);
    mk->set_rows(static_cast<int64_t>(k->snap.row_ids.size()));
    if (k->snap_stray) info->add_stray_keys(k->name);
    if (variables.insert(k->spec.variable()).second) {
      v1::ManifestVariable* v = info->add_variables();
      v->set_name(k->spec.variable());
      *v->mutable_shape() = k->spec.shape();
      v->set_dtype(k->spec.dtype());
      *v->mutable_optimizer() = OptimizerToProto(k->optimizer);
      if (k->spec.has_table()) *v->mutable_table() = k->spec.table();
    }
  }
  EncodeShardTo(records, out);
  for (int64_t c : WorkerClocks()) info->add_worker_clocks(c);
  info->set_max_pause_s(max_pause_s_.load());
}

absl::Status Store::WaitForRestore(absl::Time deadline, const Cancelled& cancelled) {
  const absl::Time start = absl::Now();
  deadline = std::min(deadline, start + options_.max_pull_wait);
  absl::MutexLock lock(&restore_mu_);
  auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(restore_mu_) { return !restore_pending_; };
  // A restore ends without a caller's wake-up: look every 100 ms whether
  // the caller went away.
  while (!restore_mu_.AwaitWithDeadline(absl::Condition(&done),
                                        std::min(deadline, absl::Now() + absl::Milliseconds(100)))) {
    if (cancelled && cancelled()) return absl::CancelledError("the caller went away");
    if (absl::Now() >= deadline) {
      return absl::UnavailableError(absl::StrCat("this server is still restoring its checkpoint after ",
                                                 absl::FormatDuration(absl::Now() - start)));
    }
  }
  return restore_status_;
}

void Store::FinishRestore(absl::StatusOr<std::vector<RestoredKey>> restored, int64_t step,
                          const std::string& from) {
  if (restored.ok()) {
    for (RestoredKey& r : *restored) {
      const std::string name = KeyName(r.spec.variable(), r.spec.partition());
      auto key = std::make_unique<Key>();
      key->name = name;
      key->spec = r.spec;
      key->is_table = r.spec.has_table();
      key->n = r.spec.num_elements();
      absl::StatusOr<OptimizerConfig> opt = OptimizerFromProto(r.spec.optimizer());
      if (opt.ok() && r.spec.has_table()) {
        absl::MutexLock lock(&key->mu);
        InitKey(key.get(), *opt);
        key->table = std::make_unique<Table>(name, r.spec.table(), *opt, r.spec.partition());
        if (absl::Status s = key->table->Load(r.state); !s.ok()) {
          restored = absl::DataLossError(absl::StrCat("checkpoint ", from, ": ", s.message()));
          break;
        }
        bytes_stored_ += key->table->rows() * key->table->row_bytes();
        key->version = r.state.version;
        key->lr = r.state.learning_rate;
        std::fill(key->clock.begin(), key->clock.end(), step);
      } else if (!opt.ok() || NumSlots(*opt) != static_cast<int>(r.state.slots.size()) ||
          static_cast<int64_t>(r.state.weights.size()) != key->n) {
        restored = absl::DataLossError(absl::StrCat(
            "checkpoint ", from, ": key '", name, "' does not fit its optimizer ",
            r.spec.optimizer().name(), " (", r.state.slots.size(), " slots, ", r.state.weights.size(),
            " weights for ", key->n, " elements)", opt.ok() ? "" : absl::StrCat(": ", opt.status().message())));
        break;
      }
      if (!r.spec.has_table()) {
        absl::MutexLock lock(&key->mu);
        key->weights = std::move(r.state.weights);
        key->slots = std::move(r.state.slots);
        InitKey(key.get(), *opt);
        key->version = r.state.version;
        key->lr = r.state.learning_rate;
        key->backup_of = r.backup_of >= 0 ? r.backup_of : r.owner;
        key->serving = r.backup_of < 0;
        std::fill(key->clock.begin(), key->clock.end(), step);
      }
      absl::MutexLock map_lock(&map_mu_);
      keys_[name] = std::move(key);
    }
  }
  absl::MutexLock lock(&restore_mu_);
  restore_pending_ = false;
  restore_status_ = restored.ok() ? absl::OkStatus()
                                  : absl::FailedPreconditionError(absl::StrCat(
                                        "this server could not restore its checkpoint: ",
                                        restored.status().message()));
  restored_from_ = from;
}

}  // namespace psrt
