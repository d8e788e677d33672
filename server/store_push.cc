// Store: the push path: checking a push, applying updates (sync steps, async
// and ssp), non-finite gradients.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>

#include "absl/container/flat_hash_set.h"
#include "absl/container/inlined_vector.h"
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

// The workers a push counts for: the pusher, then its also_for (no heap
// allocation for a host of up to 8).
absl::InlinedVector<int, 8> Pushers(const WireMessage& req) {
  absl::InlinedVector<int, 8> out = {req.worker_rank};
  out.insert(out.end(), req.also_for.begin(), req.also_for.end());
  return out;
}

}  // namespace

void Store::Apply(Key* key, const Update& update, const Origin& origin) {
  // The backup applies the same update while this server does; the new
  // version is published here only once the backup holds it too.
  // Only a kind with a kept copy forwards its updates: a table's part
  // keeps none (KeptCopy).
  Forwarded forwarded;
  if (key->role.serving && forward_ && key->value->kept_copy() != nullptr) {
    forwarded = forward_(key->role.copy_of, key->spec.variable(), key->spec.partition(),
                         key->version, update.values, update.n, origin);
  }
  const absl::Time start = absl::Now();
  if (update.values == nullptr) {
    // A sync step without a gradient from any worker: no update, but the
    // value may count it (KeyValue::Apply).
    key->value->Apply(update, key->lr, key->version + 1);
    if (forwarded) {
      if (absl::Status s = forwarded(); !s.ok())
        LogWarning("key '", key->name, "': its replica was not updated: ", s.message());
    }
    NextVersion(key);
    return;
  }
  // An assign key's value is data, not an update: NaN and Inf in it are what
  // the workers must see (GradScaler finds the overflow in the mean gradient).
  const bool skip = !key->FreeRunning() && !key->Held() && !AllFinite(update.values, update.n);
  if (!skip) {
    BytesHeld held(&bytes_stored_, *key->value);
    const int64_t evicted = key->value->Apply(update, key->lr, key->version + 1);
    if (evicted > 0) evicted_rows_->Add(static_cast<double>(evicted));
  }
  if (forwarded) {
    if (absl::Status s = forwarded(); !s.ok())
      LogWarning("key '", key->name, "': its replica was not updated: ", s.message());
  }
  if (skip) {
    SkipNonfinite(key, update.values, update.n);
    return;
  }
  Applied(key, start);
}

void Store::NextVersion(Key* key) {
  ++key->version;
  if (key->version == snapshot_step_.load(std::memory_order_relaxed) && key->role.serving)
    CopyForSnapshot(key);
}

void Store::Applied(Key* key, absl::Time start) {
  NextVersion(key);
  updates_->Add();
  update_seconds_->Observe(absl::ToDoubleSeconds(absl::Now() - start));
}

bool Store::SkipNonfinite(Key* key, const float* grad, int64_t n) {
  if (!AllFinite(grad, n)) {
    // As AMP's GradScaler does, the step is skipped: the weights stay
    // finite. Or ("nonfinite": "fail") the key stops, and says why.
    nonfinite_updates_->Add();
    const std::string what =
        absl::StrCat("key '", key->name, "' got a gradient with NaN or Inf at version ",
                     key->version, " (", ++key->nonfinite, " so far)");
    if (options_.fail_on_nonfinite) {
      key->stopped = absl::FailedPreconditionError(absl::StrCat(
          what,
          "; the job's \"nonfinite\" setting is \"fail\": this key takes no more pushes or pulls"));
      LogError(key->stopped.message());
      return true;
    }
    if (key->nonfinite == 1)
      LogWarning(what, ": skipped (\"nonfinite\": \"skip\"); later ones are counted only");
    NextVersion(key);
    return true;
  }
  return false;
}

absl::Status Store::Push(const WireMessage& req) {
  if (absl::Status s = CheckWorker(req.worker_rank); !s.ok()) return s;
  if (req.keys.empty()) return absl::InvalidArgumentError("push request names no keys");
  if (req.assign_rows) return AssignRows(req);
  const int w = req.worker_rank;
  if (absl::Status s = CheckAlsoFor(req); !s.ok()) return s;
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
    // Values are divided by the scale: its inverse must be finite too.
    if (!std::isfinite(kd.scale) || kd.scale < 0 ||
        (kd.scale != 0 && !std::isfinite(1.0f / kd.scale))) {
      return absl::InvalidArgumentError(
          absl::StrCat("push to key '", k->name, "' has scale ", kd.scale,
                       "; a scale is finite and positive, at least 3e-39 (0 stands for 1)"));
    }
    absl::MutexLock lock(&k->mu);
    if (kd.no_gradient) {
      if (absl::Status s = CheckNoGradient(k, kd); !s.ok()) return s;
    } else if (const int bpv = BytesPerValue(kd.dtype); bpv == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("push to key '", k->name, "' has dtype ", DTypeName(kd.dtype),
                       "; gradients are float32, float16 or bfloat16"));
    } else if (absl::Status s = k->value->CheckPush(kd.ids, kd.data.size(), bpv, kd.dtype);
               !s.ok()) {
      return s;
    }
    if (absl::Status s = Pushable(k); !s.ok()) return s;
    for (int r : Pushers(req)) {
      if (!k->active[r]) {
        return absl::FailedPreconditionError(absl::StrCat(
            "worker ", r,
            " is not an active worker of this job (it was lost); it must rejoin first"));
      }
    }
    if (k->Held()) {
      if (absl::Status s = CheckHeldPush(k, req, kd); !s.ok()) return s;
    }
    if (kd.version < 0 || (options_.sync && kd.version > k->version && !k->Held())) {
      return absl::OutOfRangeError(absl::StrCat(
          "push to key '", k->name, "' is for version ", kd.version, " but the key is at version ",
          k->version,
          options_.sync ? "; in sync mode a worker pushes for the version it pulled" : ""));
    }
    // Async and ssp: a worker's clock moves one push at a time; a push far
    // ahead would let it outrun the staleness bound (or be garbage).
    if (!options_.sync && kd.version > k->window.clock[w]) {
      return absl::OutOfRangeError(absl::StrCat("push to key '", k->name, "' is for clock ",
                                                kd.version, " but worker ", w, "'s clock there is ",
                                                k->window.clock[w],
                                                "; a worker's clock advances one push at a time"));
    }
    if (absl::Status s = CheckRowsLocked(k, kd.ids); !s.ok()) return s;
    if (options_.sync && kd.version == k->version && !req.also_for.empty()) {
      // A push for several workers is counted whole: none of them pushed
      // this step's gradient on its own (it would be summed twice).
      const int counted = Counted(k, req);
      if (counted > 0 && counted < 1 + static_cast<int>(req.also_for.size())) {
        return absl::FailedPreconditionError(
            absl::StrCat("push to key '", k->name, "' for workers ", req.worker_rank, ", ",
                         absl::StrJoin(req.also_for, ", "), ": some of them pushed for version ",
                         k->version, " on their own already"));
      }
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
      if (!k->role.serving) {
        absl::MutexLock mlock(&moved_mu);
        moved = NotServing(k);
        return;
      }
      ApplyPush(k, req, kd);
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

absl::Status Store::CheckNoGradient(const Key* k, const WireKey& kd) {
  if (kd.data.size() != 0 || !kd.ids.empty() || kd.nonfinite || kd.scale != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("push to key '", k->name,
                     "' says it has no gradient (no_gradient) but carries values, ids, a scale "
                     "or the nonfinite mark; send one or the other"));
  }
  return absl::OkStatus();
}

absl::Status Store::CheckHeldPush(const Key* k, const WireMessage& req, const WireKey& kd) const {
  const std::string what = absl::StrCat("key '", k->name, "' holds the workers' state (kind hold)");
  if (!options_.sync) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ", which follows a sync job's steps; this job is not sync"));
  }
  if (req.worker_rank != 0 || !req.also_for.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": rank 0 alone sets it; worker ", req.worker_rank, " pushed to it"));
  }
  if (kd.no_gradient || kd.dtype != v1::DTYPE_FLOAT32 || (kd.scale != 0 && kd.scale != 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": it is set whole, as float32 and unscaled"));
  }
  return absl::OkStatus();
}

absl::Status Store::Pushable(Key* k) {
  if (!k->role.serving) return NotServing(k);
  if (!k->initialized) {
    return absl::FailedPreconditionError(
        absl::StrCat("key '", k->name, "' has no value yet: rank 0 has not registered it"));
  }
  return k->stopped;
}

absl::Status Store::AssignRows(const WireMessage& req) {
  if (req.keys.size() != 1 || !req.also_for.empty()) {
    return absl::InvalidArgumentError(
        "an assignment of rows (assign_rows) names one table part, for no other worker");
  }
  const WireKey& kd = req.keys[0];
  absl::StatusOr<Key*> key = Find(kd.variable, kd.partition);
  if (!key.ok()) return key.status();
  Key* k = *key;
  absl::MutexLock lock(&k->mu);
  // Only a kind with rows set by id takes them (AssignedRows).
  AssignedRows* rows = k->value->rows();
  if (rows == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("key '", k->name, "' is not a table's: only a table's rows are assigned"));
  }
  if (kd.dtype != v1::DTYPE_FLOAT32 || (kd.scale != 0 && kd.scale != 1)) {
    return absl::InvalidArgumentError(absl::StrCat("rows assigned to '", k->name, "' are ",
                                                   DTypeName(kd.dtype),
                                                   "; assigned rows travel as float32, unscaled"));
  }
  if (absl::Status s = k->value->CheckPush(kd.ids, kd.data.size(), 4, kd.dtype); !s.ok()) return s;
  if (absl::Status s = Pushable(k); !s.ok()) return s;
  // Once a gradient is in, the rows are being trained: a value set then
  // would differ between the workers that pulled before and after it.
  if (k->version != 0 || kd.version != 0 || k->sync.contributions != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rows assigned to '", k->name, "' at version ", kd.version, ", but the part is at version ",
        k->version,
        options_.sync ? absl::StrCat(" with ", k->sync.contributions, " pushes in") : "",
        "; a table's rows are assigned before its first step"));
  }
  if (absl::Status s = CheckRowsLocked(k, kd.ids); !s.ok()) return s;
  std::vector<float> scratch;
  const float* values = PayloadValues(kd.data, kd.dtype, kd.scale, &scratch);
  BytesHeld held(&bytes_stored_, *k->value);
  rows->Assign(kd.ids, values);
  pushes_->Add();
  bytes_in_->Add(kd.data.size());
  return absl::OkStatus();
}

absl::Status Store::CheckAlsoFor(const WireMessage& req) const {
  if (req.also_for.empty()) return absl::OkStatus();
  if (!options_.sync) {
    return absl::InvalidArgumentError(
        "a push for several workers (also_for) is for sync jobs; async and ssp apply each "
        "worker's push on its own");
  }
  std::vector<int> seen = {req.worker_rank};
  for (int32_t r : req.also_for) {
    if (absl::Status s = CheckWorker(r); !s.ok()) return s;
    if (std::find(seen.begin(), seen.end(), r) != seen.end()) {
      return absl::InvalidArgumentError(absl::StrCat("push of worker ", req.worker_rank,
                                                     " names worker ", r, " twice (also_for)"));
    }
    seen.push_back(r);
  }
  return absl::OkStatus();
}

int Store::Counted(Key* k, const WireMessage& req) {
  int counted = 0;
  for (int r : Pushers(req)) counted += k->sync.contributed[r] != 0;
  return counted;
}

void Store::ApplyPush(Key* k, const WireMessage& req, const WireKey& kd) {
  const int w = req.worker_rank;
  const uint64_t push_id = req.push_id;
  if (k->Held()) {
    // Rank 0's state for step kd.version (CheckHeldPush): the key jumps to
    // the step before it, so that applying the value makes it that step
    // (and takes an armed checkpoint's copy); a step it reached is done.
    if (kd.version <= k->version) {
      duplicate_pushes_->Add();
      return;
    }
    k->version = kd.version - 1;
    Apply(k, Gradient(k, kd), Origin());
    return;
  }
  if (!options_.sync) {
    uint64_t* recent = &k->window.recent_push_ids[w * kPushWindow];
    if (push_id != 0 && std::find(recent, recent + kPushWindow, push_id) != recent + kPushWindow) {
      duplicate_pushes_->Add();
      return;
    }
    const Origin origin{w, push_id, kd.version + 1};
    RecordPush(k, origin);
    // No gradient: the worker's clock moves, nothing is applied.
    if (kd.no_gradient) return;
    // A float32 gradient in one aligned piece is applied where it lies;
    // anything else is decoded once into the key's scratch buffer.
    Apply(k, Gradient(k, kd), origin);
    return;
  }
  // Sync: one push per worker and version; a retry finds its step applied
  // or its bit set, a backup worker's late push finds its step applied.
  if (kd.version < k->version) {
    (k->sync.last_step[w] == kd.version ? duplicate_pushes_ : dropped_pushes_)->Add();
    return;
  }
  // A retry finds every bit set; a push for several workers found partly
  // counted (checked above, so only a worker racing itself) is dropped.
  const int pushers = 1 + static_cast<int>(req.also_for.size());
  if (const int counted = Counted(k, req); counted > 0) {
    (counted == pushers ? duplicate_pushes_ : dropped_pushes_)->Add();
    return;
  }
  for (int r : Pushers(req)) k->sync.last_step[r] = kd.version;
  if (pushers == 1 && k->sync.contributions == 0 && k->sync.required == 1 &&
      (kd.scale == 0 || kd.scale == 1)) {
    // The step's one gradient (a single worker): applied from where it
    // lies, as an async push is, without the pass through the step's sum.
    Apply(k, kd.no_gradient ? Update() : Gradient(k, kd), Origin());
    return;
  }
  if (!kd.no_gradient) {
    k->value->Accumulate(kd.ids, kd.data, kd.dtype, kd.scale, k->sync.gradients == 0,
                         &k->window.scratch);
    k->sync.gradients += pushers;
  }
  for (int r : Pushers(req)) k->sync.contributed[r] = 1;
  k->sync.contributions += pushers;
  MaybeFinishStep(k);
}

Update Store::Gradient(Key* k, const WireKey& kd) {
  const float* values = PayloadValues(kd.data, kd.dtype, kd.scale, &k->window.scratch);
  return {kd.ids, values, k->value->Size(kd.ids), 1};
}

absl::Status Store::CheckRowsLocked(Key* k, absl::Span<const int64_t> ids) {
  absl::StatusOr<int64_t> more = k->value->CheckIds(ids);
  if (!more.ok()) return more.status();
  if (options_.max_bytes > 0 && *more > 0 && bytes_stored_.load() + *more > options_.max_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("key '", k->name, "': its new rows (", *more,
                     " bytes) would make this server hold ", bytes_stored_.load() + *more,
                     " bytes, more than limits.max_server_bytes (", options_.max_bytes, ")"));
  }
  return absl::OkStatus();
}

void Store::RecordPush(Key* k, const Origin& origin) {
  const int w = origin.worker;
  k->window.recent_push_ids[w * kPushWindow + k->window.recent_next[w]] = origin.push_id;
  k->window.recent_next[w] = (k->window.recent_next[w] + 1) % kPushWindow;
  k->window.clock[w] = std::max(k->window.clock[w], origin.clock);
}

void Store::MaybeFinishStep(Key* k) {
  if (k->sync.contributions == 0 || k->sync.contributions < k->sync.required) return;
  // The mean is over every contribution: a worker without a gradient adds
  // zero to it, as under DDP (and as one process on the global batch).
  const float scale =
      options_.average_gradients && k->sync.contributions > 1 ? 1.0f / k->sync.contributions : 1.0f;
  if (k->sync.gradients == 0) {
    Apply(k, Update(), Origin());
  } else {
    // The sum stays until the next step's first push starts a new one.
    Apply(k, k->value->StepSum(scale), Origin());
  }
  std::fill(k->sync.contributed.begin(), k->sync.contributed.end(), 0);
  k->sync.contributions = 0;
  k->sync.gradients = 0;
}

}  // namespace psrt
