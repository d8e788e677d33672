// Store: registering keys (validation, room, initial values) and restoring
// them from a checkpoint.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/compression.h"
#include "common/key_map.h"
#include "common/logging.h"
#include "common/optimizer_proto.h"
#include "server/store.h"
#include "server/store_internal.h"

namespace psrt {

namespace {

std::string ShapeText(const google::protobuf::RepeatedField<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// A variable name: 1 to kMaxNameBytes bytes of printable ASCII.
absl::Status CheckName(const std::string& name) {
  if (name.empty()) return absl::InvalidArgumentError("a key has an empty variable name");
  if (name.size() > kMaxNameBytes) {
    return absl::InvalidArgumentError(absl::StrCat("variable name '", name.substr(0, 40),
                                                   "...' has ", name.size(),
                                                   " bytes; names have at most ", kMaxNameBytes));
  }
  for (char c : name) {
    if (c < 0x20 || c > 0x7e) {
      return absl::InvalidArgumentError(
          absl::StrCat("variable name '", absl::CHexEscape(name),
                       "' holds a byte that is not printable ASCII; names are printable text"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Store::CheckSpec(const Key& key, const v1::KeySpec& spec, int32_t rank) const {
  const v1::KeySpec& have = key.spec;
  std::string from;
  {
    absl::MutexLock lock(&restore_mu_);
    from = restored_from_;
  }
  auto mismatch = [&](absl::string_view what, const std::string& a, const std::string& b) {
    return absl::FailedPreconditionError(
        absl::StrCat("key '", key.name, "' ",
                     from.empty() ? "was registered with " : "holds, in checkpoint " + from + ", ",
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
    return mismatch("slice", absl::StrCat("[", have.offset(), ", +", have.num_elements(), ")"),
                    absl::StrCat("[", spec.offset(), ", +", spec.num_elements(), ")"));
  }
  if (have.optimizer().name() != spec.optimizer().name()) {
    return mismatch("optimizer", have.optimizer().name(), spec.optimizer().name());
  }
  if (have.table().SerializeAsString() != spec.table().SerializeAsString()) {
    return mismatch("table settings", have.table().ShortDebugString(),
                    spec.table().ShortDebugString());
  }
  return absl::OkStatus();
}

absl::Status Store::RegisterKeys(const v1::RegisterKeysRequest& req, absl::Time deadline,
                                 const Cancelled& cancelled, v1::RegisterKeysResponse* resp) {
  if (absl::Status s = CheckWorker(req.worker_rank()); !s.ok()) return s;
  if (req.keys().empty()) return absl::InvalidArgumentError("register request names no keys");
  if (req.has_owner() && (req.owner() < 0 || req.replica())) {
    return absl::InvalidArgumentError(
        absl::StrCat("register request names owner ", req.owner(),
                     "; an owner is a server index (>= 0), and a copy names its primary"));
  }
  if (absl::Status s = WaitForRestore(deadline, cancelled); !s.ok()) return s;
  // Validate everything first: a bad request changes nothing.
  std::vector<OptimizerConfig> optimizers;
  if (absl::Status s = CheckRegistration(req, &optimizers); !s.ok()) return s;
  for (int i = 0; i < req.keys_size(); ++i) {
    absl::StatusOr<Key*> key = FindOrAddRegistered(req, req.keys(i));
    if (!key.ok()) return key.status();
    Register(*key, req, req.keys(i), optimizers[i], resp);
  }
  return absl::OkStatus();
}

absl::Status Store::CheckRegistration(const v1::RegisterKeysRequest& req,
                                      std::vector<OptimizerConfig>* optimizers) {
  std::string restored_from;
  {
    absl::MutexLock lock(&restore_mu_);
    restored_from = restored_from_;
  }
  Room room;
  absl::flat_hash_set<std::string> names;
  for (const v1::KeySpec& spec : req.keys()) {
    const std::string name = KeyName(spec.variable(), spec.partition());
    if (!names.insert(name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("key '", name, "' appears twice in one request"));
    }
    if (absl::Status s = CheckName(spec.variable()); !s.ok()) return s;
    if (spec.dtype() != v1::DTYPE_FLOAT32) {
      return absl::InvalidArgumentError(
          absl::StrCat("key '", name, "': variables of dtype ", DTypeName(spec.dtype()),
                       " are not supported; register float32 variables"));
    }
    if (absl::Status s =
            KeyValue::CheckSpec(spec, req.worker_rank(), req.replica(), options_.max_key_bytes);
        !s.ok()) {
      return s;
    }
    absl::StatusOr<OptimizerConfig> opt = OptimizerFromProto(spec.optimizer());
    if (!opt.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("key '", name, "': ", opt.status().message()));
    }
    optimizers->push_back(*opt);
    if (options_.max_keys_per_variable > 0 &&
        spec.partition() >= static_cast<uint32_t>(options_.max_keys_per_variable)) {
      return absl::ResourceExhaustedError(absl::StrCat("key '", name, "': a variable has at most ",
                                                       options_.max_keys_per_variable,
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
  return absl::OkStatus();
}

absl::StatusOr<Store::Key*> Store::FindOrAddRegistered(const v1::RegisterKeysRequest& req,
                                                       const v1::KeySpec& spec) {
  absl::MutexLock lock(&map_mu_);
  bool added = false;
  Key* key = FindOrAddLocked(spec, &added);
  if (!added) {
    if (absl::Status s = CheckSpec(*key, spec, req.worker_rank()); !s.ok()) {
      return s;  // lost a race with a different registration
    }
  }
  if (req.replica()) {
    absl::MutexLock lock(&key->mu);
    if (key->role.copy_of < 0 && !key->initialized) {
      key->role.copy_of = req.primary();
      key->role.serving = false;
    }
  } else if (req.has_owner() && added) {
    // Another server's key by the key map, served here for now.
    absl::MutexLock lock(&key->mu);
    key->role.copy_of = req.owner() == options_.self ? -1 : req.owner();
  }
  return key;
}

void Store::Register(Key* key, const v1::RegisterKeysRequest& req, const v1::KeySpec& spec,
                     const OptimizerConfig& optimizer, v1::RegisterKeysResponse* resp) {
  Completed completed;
  {
    absl::MutexLock lock(&key->mu);
    if (key->registered.by.empty()) {
      key->registered.by.assign(options_.num_workers, 0);
      key->registered.first = absl::Now();
    }
    key->registered.by[req.worker_rank()] = 1;
    if (resp != nullptr) resp->add_versions(key->version);
    bytes_in_->Add(spec.init().size());
    // Rank 0's value and optimizer settings win, once; a restarted rank 0
    // keeps the trained weights. (A table's part needs no initial value:
    // its rows start from its seed.)
    if (key->initialized || !key->value->StartsFrom(spec.init())) return;
    StartKey(key, spec, optimizer);
    NotifyWaiters(key, &completed);  // pulls that waited for rank 0
  }
  for (const auto& p : completed) Complete(p.get());
}

void Store::StartKey(Key* key, const v1::KeySpec& spec, const OptimizerConfig& optimizer) {
  InitKey(key, optimizer);
  {
    BytesHeld held(&bytes_stored_, *key->value);
    key->value->Start(spec.init());
  }
  if (!key->lr_set) key->lr = key->optimizer.lr;
  // Only a kind with a kept copy has one for its copy holder (KeptCopy).
  const KeptCopy* kept = key->value->kept_copy();
  if (seed_new_ && key->role.serving && kept != nullptr) {
    const int owner = key->role.copy_of < 0 ? options_.self : key->role.copy_of;
    // Called at once, on this thread.
    const absl::Status s =
        seed_new_(owner, [&](v1::SeedRequest* copy) ABSL_EXCLUSIVE_LOCKS_REQUIRED(key->mu) {
          FillSeed(key, owner, copy);
          kept->WriteCopy(copy);
        });
    if (!s.ok())
      LogWarning("key '", key->name, "' was not copied to its copy holder: ", s.message());
  }
}

int64_t Store::KeyBytes(int64_t n, const OptimizerConfig& optimizer) const {
  return n * 4 * (1 + NumSlots(optimizer) + (options_.sync ? 1 : 0));
}

absl::Status Store::CheckRoomLocked(const v1::KeySpec& spec, const OptimizerConfig& optimizer,
                                    Room* room) {
  const std::string name = KeyName(spec.variable(), spec.partition());
  if (options_.max_variables > 0 && room->variables.empty()) {
    for (const auto& [n, k] : keys_) room->variables.insert(k->spec.variable());
  }
  if (options_.max_variables > 0 && room->variables.insert(spec.variable()).second &&
      static_cast<int64_t>(room->variables.size()) > options_.max_variables) {
    return absl::ResourceExhaustedError(
        absl::StrCat("key '", name, "': this server holds ", options_.max_variables,
                     " variables already, its limit (limits.max_variables)"));
  }
  room->bytes += KeyBytes(spec.num_elements(), optimizer);
  if (options_.max_bytes > 0 && bytes_stored_.load() + room->bytes > options_.max_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "key '", name, "': this server would hold ", bytes_stored_.load() + room->bytes,
        " bytes of weights and optimizer state, more than limits.max_server_bytes (",
        options_.max_bytes, ")"));
  }
  return absl::OkStatus();
}

void Store::InitKey(Key* key, const OptimizerConfig& optimizer) {
  key->optimizer = optimizer;
  {
    BytesHeld held(&bytes_stored_, *key->value);
    key->value->Init(optimizer);
  }
  // A key this server served before (moved away, back as a copy) starts
  // with no step half done.
  key->sync.contributed.assign(options_.num_workers, 0);
  key->sync.contributions = 0;
  key->sync.last_step.assign(options_.num_workers, -1);
  key->window.clock.assign(options_.num_workers, 0);
  {
    absl::MutexLock members(&members_mu_);
    key->active = active_;
  }
  key->sync.required = std::max<int>(
      1, std::count(key->active.begin(), key->active.end(), 1) - options_.backup_workers);
  if (!options_.sync) {
    key->window.recent_push_ids.assign(options_.num_workers * kPushWindow, 0);
    key->window.recent_next.assign(options_.num_workers, 0);
  }
  key->initialized = true;
}

absl::Status Store::WaitForRestore(absl::Time deadline, const Cancelled& cancelled) {
  const absl::Time start = absl::Now();
  deadline = std::min(deadline, start + options_.max_pull_wait);
  absl::MutexLock lock(&restore_mu_);
  auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(restore_mu_) { return !restore_pending_; };
  // A restore ends without a caller's wake-up: look every 100 ms whether
  // the caller went away.
  while (!restore_mu_.AwaitWithDeadline(
      absl::Condition(&done), std::min(deadline, absl::Now() + absl::Milliseconds(100)))) {
    if (cancelled && cancelled()) return absl::CancelledError("the caller went away");
    if (absl::Now() >= deadline) {
      return absl::UnavailableError(
          absl::StrCat("this server is still restoring its checkpoint after ",
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
      key->n = r.spec.num_elements();
      key->value = KeyValue::New(name, r.spec, options_.sync);
      absl::StatusOr<OptimizerConfig> opt = OptimizerFromProto(r.spec.optimizer());
      absl::Status s = opt.status();
      if (s.ok()) {
        absl::MutexLock lock(&key->mu);
        {
          BytesHeld held(&bytes_stored_, *key->value);
          s = key->value->Restore(*opt, &r.state);
        }
        if (s.ok()) {
          InitKey(key.get(), *opt);
          key->version = r.state.version;
          key->lr = r.state.learning_rate;
          key->role.copy_of = r.copy_of >= 0 ? r.copy_of : r.owner;
          key->role.serving = r.copy_of < 0;
          std::fill(key->window.clock.begin(), key->window.clock.end(), step);
        }
      }
      if (!s.ok()) {
        restored = absl::DataLossError(absl::StrCat("checkpoint ", from, ": ", s.message()));
        break;
      }
      absl::MutexLock map_lock(&map_mu_);
      keys_[name] = std::move(key);
    }
  }
  absl::MutexLock lock(&restore_mu_);
  restore_pending_ = false;
  restore_status_ =
      restored.ok()
          ? absl::OkStatus()
          : absl::FailedPreconditionError(absl::StrCat(
                "this server could not restore its checkpoint: ", restored.status().message()));
  restored_from_ = from;
}

}  // namespace psrt
