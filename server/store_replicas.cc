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
#include "server/key_value.h"
#include "server/store.h"
#include "server/store_internal.h"

namespace psrt {
namespace {

// A table's part is handed over in parts of about this many bytes (well
// under gRPC's message limit).
constexpr int64_t kHandoverPartBytes = 32 << 20;

}  // namespace

bool Store::Owns(const Key* k, int owner) const {
  return k->role.copy_of == owner || (k->role.copy_of < 0 && owner >= 0 && owner == options_.self);
}

absl::Status Store::NotServing(const Key* k) const {
  if (k->role.moved_to >= 0) {
    return absl::UnavailableError(absl::StrCat("key '", k->name, "' moved to server ",
                                               k->role.moved_to,
                                               "; the shard map says so from its next epoch"));
  }
  if (k->role.rows_coming) {
    return absl::DataLossError(absl::StrCat(
        "table part '", k->name, "' was being handed over from server ", k->role.copy_of,
        " and not all of its rows arrived; its rows are lost here (a job with "
        "\"on_failure\": \"recover\" rolls back to its last checkpoint)"));
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
    if (req.no_gradient() && (!options_.sync || req.from_push() || !gradient.empty())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "replica update of key '", k->name,
          "' says no worker had a gradient, but carries one or is not of a sync step"));
    }
    if (!req.no_gradient() && static_cast<int64_t>(gradient.size()) != k->n * 4) {
      return absl::InvalidArgumentError(absl::StrCat("replica update of key '", k->name, "' has ",
                                                     gradient.size(), " bytes; the key holds ",
                                                     k->n, " float32"));
    }
    if (!k->initialized) {
      return absl::NotFoundError(absl::StrCat("replica of key '", k->name, "' has no value yet"));
    }
    if (req.version() < k->version) return absl::OkStatus();  // a retry of an applied update
    // A hold key jumps to the step rank 0 set it for (Store::ApplyPush).
    if (k->Held()) k->version = req.version();
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
    Update update;  // none: no worker had a gradient
    if (!req.no_gradient()) {
      const float* grad = reinterpret_cast<const float*>(gradient.data());
      if (reinterpret_cast<uintptr_t>(grad) % alignof(float) != 0) {
        k->window.scratch.resize(k->n);
        std::memcpy(k->window.scratch.data(), gradient.data(), k->n * 4);
        grad = k->window.scratch.data();
      }
      update = {{}, grad, k->n, 1};
    }
    Apply(k, update, origin);
    NotifyWaiters(k, &completed);
  }
  for (const auto& p : completed) Complete(p.get());
  return absl::OkStatus();
}

void Store::Promote(int primary) {
  int64_t n = 0;
  for (Key* k : AllKeys()) {
    absl::MutexLock lock(&k->mu);
    if (k->role.copy_of != primary || k->role.serving || k->role.rows_coming) continue;
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
    slot->n = spec.num_elements();
    slot->value = KeyValue::New(name, spec, options_.sync);
  }
  return slot.get();
}

absl::Status Store::CheckHandover(const v1::SeedRequest& req, const std::string& name) const {
  const size_t workers = static_cast<size_t>(options_.num_workers);
  auto sized = [&](size_t size, size_t want) { return size == 0 || size == want; };
  if (req.worker_clocks_size() > options_.num_workers || !sized(req.contributed_size(), workers) ||
      !sized(req.last_step_size(), workers) ||
      !sized(req.recent_push_ids_size(), workers * kPushWindow) ||
      !sized(req.recent_next_size(), workers)) {
    return absl::InvalidArgumentError(
        absl::StrCat("seed of key '", name, "' does not fit this job's workers"));
  }
  if (req.step_gradients() < 0 || req.step_gradients() > options_.num_workers ||
      req.skipped_steps() < 0 || req.skipped_steps() > req.version()) {
    return absl::InvalidArgumentError(
        absl::StrCat("seed of key '", name, "' has step counts that do not fit its version"));
  }
  for (int32_t next : req.recent_next()) {
    if (next < 0 || next >= kPushWindow)
      return absl::InvalidArgumentError("seed push window out of range");
  }
  return absl::OkStatus();
}

void Store::TakeHandover(Key* k, const v1::SeedRequest& req) {
  k->version = req.version();
  k->lr = req.lr();
  for (int w = 0; w < req.worker_clocks_size(); ++w) k->window.clock[w] = req.worker_clocks(w);
  if (!req.handover()) return;
  if (options_.sync) k->value->TakeStepSum(req);
  k->sync.contributions = 0;
  for (int w = 0; w < req.contributed_size(); ++w) {
    k->sync.contributed[w] = req.contributed(w);
    k->sync.contributions += req.contributed(w);
  }
  k->sync.gradients = req.step_gradients();
  for (int w = 0; w < req.last_step_size(); ++w) k->sync.last_step[w] = req.last_step(w);
  if (!options_.sync) {
    for (int i = 0; i < req.recent_push_ids_size(); ++i)
      k->window.recent_push_ids[i] = req.recent_push_ids(i);
    for (int w = 0; w < req.recent_next_size(); ++w)
      k->window.recent_next[w] = static_cast<uint8_t>(req.recent_next(w));
  }
}

absl::Status Store::Seed(const v1::SeedRequest& req) {
  const v1::KeySpec& spec = req.spec();
  const std::string name = KeyName(spec.variable(), spec.partition());
  absl::StatusOr<OptimizerConfig> opt = OptimizerFromProto(spec.optimizer());
  if (absl::Status s = CheckHandover(req, name); !s.ok()) return s;
  absl::StatusOr<SeedPart> part = KeyValue::ReadSeed(name, req, opt);
  if (!part.ok()) return part.status();
  Key* key;
  if (part->value) {
    absl::MutexLock lock(&map_mu_);
    bool added = false;
    key = FindOrAddLocked(spec, &added);
  } else {
    absl::StatusOr<Key*> found = Find(spec.variable(), spec.partition());
    if (!found.ok())
      return absl::FailedPreconditionError(absl::StrCat("key '", name, "' has no copy here"));
    key = *found;
  }
  absl::MutexLock lock(&key->mu);
  // Every check before the first change: a refused seed changes nothing.
  if (key->role.serving && key->initialized) {
    return absl::FailedPreconditionError(
        absl::StrCat("key '", name, "' is served here; it takes no copy"));
  }
  if (part->rows_before > 0 && (!key->role.rows_coming || !key->initialized)) {
    return absl::FailedPreconditionError(absl::StrCat("table part '", name, "': rows after ",
                                                      part->rows_before,
                                                      " came without the rows before them"));
  }
  if (absl::Status s = key->value->CheckSeed(*opt, *part, req); !s.ok()) return s;
  if (!part->value && (!key->initialized || key->version != req.version())) {
    // The hand-over then comes again with the values.
    return absl::FailedPreconditionError(absl::StrCat("the copy of key '", name, "' is at version ",
                                                      key->version, ", not ", req.version()));
  }
  if (part->starts_over) {
    BytesHeld held(&bytes_stored_, *key->value);
    key->value->Free();
  }
  if (part->starts_over || !key->initialized) InitKey(key, *opt);
  {
    BytesHeld held(&bytes_stored_, *key->value);
    if (!key->value->TakeSeed(*part, req)) return absl::OkStatus();  // taken before
  }
  key->role.copy_of = req.primary();
  key->role.serving = false;
  key->role.moved_to = -1;
  key->role.rows_coming = part->more;
  if (!part->more) TakeHandover(key, req);
  return absl::OkStatus();
}

void Store::FillSeed(const Key* k, int primary, v1::SeedRequest* req) const {
  *req->mutable_spec() = k->spec;
  req->set_primary(primary);
  req->set_version(k->version);
  req->set_lr(k->lr);
  for (int64_t c : k->window.clock) req->add_worker_clocks(c);
}

void Store::FillHandover(const Key* k, v1::SeedRequest* req) const {
  req->set_handover(true);
  if (options_.sync) {
    if (k->sync.gradients > 0) k->value->WriteStepSum(req);
    req->set_step_gradients(k->sync.gradients);
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
    // Only a kind with a kept copy has one to build: a table's part goes
    // whole when its server lets it go (Release). ("replicas" refuses tables.)
    const KeptCopy* copy = k->value->kept_copy();
    if (copy == nullptr) continue;
    v1::SeedRequest req;
    FillSeed(k, primary, &req);
    copy->WriteCopy(&req);
    if (absl::Status s = send(req); !s.ok()) {
      LogWarning("building the copy of key '", k->name, "' failed: ", s.message());
      return;
    }
    ++sent;
  }
  LogInfo("copied ", sent, " keys to their new backup");
}

void Store::Free(Key* k) {
  {
    // A new copy (Seed) allocates again.
    BytesHeld held(&bytes_stored_, *k->value);
    k->value->Free();
  }
  k->initialized = false;
  k->snapshot.ready = false;
}

void Store::DropCopies(int owner) {
  int64_t n = 0;
  for (Key* k : AllKeys()) {
    absl::MutexLock lock(&k->mu);
    if (k->role.serving || k->role.copy_of != owner || !k->initialized) continue;
    Free(k);
    ++n;
  }
  if (n > 0) LogInfo("dropped the ", n, " copies of server ", owner, "'s keys kept here");
}

void Store::Release(int owner, int to, const SendSeed& send) {
  Completed failed;
  int64_t n = 0, handed = 0;
  const int primary = owner < 0 ? options_.self : owner;
  for (Key* k : AllKeys()) {
    absl::MutexLock lock(&k->mu);
    if (!k->role.serving || !Owns(k, owner)) continue;
    if (send && k->initialized) {
      // Under the key's lock: nothing changes it between the hand-over and
      // the moment it stops being served here.
      auto fill = [&](v1::SeedRequest* req, bool last) ABSL_EXCLUSIVE_LOCKS_REQUIRED(k->mu) {
        FillSeed(k, primary, req);
        if (last) FillHandover(k, req);
      };
      if (absl::Status s = k->value->HandOver(fill, send, kHandoverPartBytes); s.ok()) {
        ++handed;
      } else if (absl::IsDataLoss(s)) {
        LogError("key '", k->name, "' was not handed over to server ", to, ": ", s.message());
      } else {
        LogWarning("key '", k->name, "' was not handed over to server ", to, ": ", s.message());
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
    Free(k);
    ++n;
  }
  for (const auto& p : failed) Complete(p.get());
  if (n > 0) {
    LogInfo("server ", primary, "'s ", n, " keys served here moved to server ", to, " (", handed,
            " handed over)");
  }
}

}  // namespace psrt
