// Store: replicated keys (the backup's copies, failover) and keys handed
// over to another server when servers join or leave.
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
#include "server/table.h"

namespace psrt {

bool Store::Owns(const Key* k, int owner) const {
  return k->role.copy_of == owner || (k->role.copy_of < 0 && owner >= 0 && owner == options_.self);
}

absl::Status Store::NotServing(const Key* k) const {
  if (k->role.moved_to >= 0) {
    return absl::UnavailableError(absl::StrCat("key '", k->name, "' moved to server ",
                                               k->role.moved_to,
                                               "; the shard map says so from its next epoch"));
  }
  if (on_copy_asked_) on_copy_asked_();
  // UNAVAILABLE: the client tries again, and this server serves the key as
  // soon as it hears that its primary is gone.
  return absl::UnavailableError(absl::StrCat("key '", k->name,
                                             "' is held here as a replica of server ",
                                             k->role.copy_of, "'s, not served yet"));
}

void Store::SetForward(Forward forward) { forward_ = std::move(forward); }

absl::Status Store::Replicate(const v1::ReplicateRequest& req, absl::string_view gradient) {
  absl::StatusOr<Key*> key = Find(req.variable(), req.partition());
  if (!key.ok()) return key.status();
  Key* k = *key;
  Completed completed;
  {
    absl::MutexLock lock(&k->mu);
    if (k->role.copy_of < 0 || k->role.serving) {
      return absl::FailedPreconditionError(
          absl::StrCat("key '", k->name, "' is not a replica on this server"));
    }
    if (static_cast<int64_t>(gradient.size()) != k->n * 4) {
      return absl::InvalidArgumentError(absl::StrCat("replica update of key '", k->name, "' has ",
                                                     gradient.size(), " bytes; the key holds ",
                                                     k->n, " float32"));
    }
    if (!k->initialized) {
      return absl::FailedPreconditionError(
          absl::StrCat("replica of key '", k->name, "' has no value yet"));
    }
    if (req.version() < k->version) return absl::OkStatus();  // a retry of an applied update
    if (req.version() > k->version) {
      return absl::FailedPreconditionError(
          absl::StrCat("replica of key '", k->name, "' is at version ", k->version,
                       "; an update for version ", req.version(), " would skip one"));
    }
    Origin origin;
    if (req.from_push()) {
      if (options_.sync || !CheckWorker(req.worker()).ok()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "replica update of key '", k->name, "' names a push, but not one of an async worker"));
      }
      origin = {req.worker(), req.push_id(), req.clock()};
      RecordPush(k, origin);
    }
    const float* grad = reinterpret_cast<const float*>(gradient.data());
    if (reinterpret_cast<uintptr_t>(grad) % alignof(float) != 0) {
      k->window.scratch.resize(k->n);
      std::memcpy(k->window.scratch.data(), gradient.data(), k->n * 4);
      grad = k->window.scratch.data();
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
    if (k->role.copy_of != primary || k->role.serving) continue;
    k->role.serving = true;
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
    if (static_cast<int64_t>(slot.size()) != n * 4)
      return absl::InvalidArgumentError("seed slot of the wrong size");
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
  if (key->role.serving && key->initialized) {
    return absl::FailedPreconditionError(
        absl::StrCat("key '", name, "' is served here; it takes no copy"));
  }
  if (key->n != n)
    return absl::FailedPreconditionError(absl::StrCat("key '", name, "' has another size here"));
  if (!weights && (!key->initialized || key->version != req.version())) {
    // The hand-over then comes again with the weights.
    return absl::FailedPreconditionError(absl::StrCat("the copy of key '", name, "' is at version ",
                                                      key->version, ", not ", req.version()));
  }
  key->role.copy_of = req.primary();
  key->role.serving = false;
  key->role.moved_to = -1;
  if (!key->initialized) InitKey(key, *opt);
  if (weights) {
    std::memcpy(key->weights.data(), req.weights().data(), n * 4);
    for (int i = 0; i < req.slots_size(); ++i)
      std::memcpy(key->slots[i].data(), req.slots(i).data(), n * 4);
  }
  key->version = req.version();
  key->lr = req.lr();
  for (int w = 0; w < req.worker_clocks_size(); ++w) key->window.clock[w] = req.worker_clocks(w);
  if (req.handover()) {
    if (options_.sync && !req.accum().empty())
      std::memcpy(key->sync.accum.data(), req.accum().data(), n * 4);
    key->sync.contributions = 0;
    for (int w = 0; w < req.contributed_size(); ++w) {
      key->sync.contributed[w] = req.contributed(w);
      key->sync.contributions += req.contributed(w);
    }
    for (int w = 0; w < req.last_step_size(); ++w) key->sync.last_step[w] = req.last_step(w);
    if (!options_.sync) {
      for (int i = 0; i < req.recent_push_ids_size(); ++i)
        key->window.recent_push_ids[i] = req.recent_push_ids(i);
      for (int w = 0; w < req.recent_next_size(); ++w)
        key->window.recent_next[w] = static_cast<uint8_t>(req.recent_next(w));
    }
  }
  return absl::OkStatus();
}

void Store::FillSeed(const Key* k, int primary, v1::SeedRequest* req) const {
  *req->mutable_spec() = k->spec;
  req->set_primary(primary);
  req->set_version(k->version);
  req->set_lr(k->lr);
  for (int64_t c : k->window.clock) req->add_worker_clocks(c);
}

void Store::FillWeights(const Key* k, v1::SeedRequest* req) const {
  req->set_weights(reinterpret_cast<const char*>(k->weights.data()), k->n * 4);
  for (const auto& slot : k->slots)
    req->add_slots(reinterpret_cast<const char*>(slot.data()), k->n * 4);
}

void Store::FillHandover(const Key* k, v1::SeedRequest* req) const {
  req->set_handover(true);
  if (options_.sync) {
    if (k->sync.contributions > 0)
      req->set_accum(reinterpret_cast<const char*>(k->sync.accum.data()), k->n * 4);
    for (char c : k->sync.contributed) req->add_contributed(c != 0);
    for (int64_t step : k->sync.last_step) req->add_last_step(step);
  } else {
    for (uint64_t id : k->window.recent_push_ids) req->add_recent_push_ids(id);
    for (uint8_t next : k->window.recent_next) req->add_recent_next(next);
  }
}

void Store::SeedCopies(int owner, const std::function<absl::Status(const v1::SeedRequest&)>& send) {
  int64_t sent = 0;
  const int primary = owner < 0 ? options_.self : owner;
  for (Key* k : AllKeys()) {
    absl::MutexLock lock(&k->mu);
    if (!k->role.serving || !k->initialized || !Owns(k, owner)) continue;
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
    if (!k->role.serving || !Owns(k, owner)) continue;
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
    k->role.serving = false;
    k->role.moved_to = to;
    if (k->role.copy_of < 0) k->role.copy_of = options_.self;
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
    std::vector<float>().swap(k->sync.accum);
    k->slots.clear();
    k->slot_ptrs.clear();
    k->snapshot.ready = false;
    ++n;
  }
  for (const auto& p : failed) Complete(p.get());
  if (n > 0) {
    LogInfo("server ", primary, "'s ", n, " keys served here moved to server ", to, " (", handed,
            " handed over)");
  }
}

}  // namespace psrt
