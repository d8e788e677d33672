// Store: snapshots of the keys for checkpoints.
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

void Store::CopyForSnapshot(Key* k) {
  const absl::Time start = absl::Now();
  KeyRecord& r = k->snapshot.copy;
  r.variable = k->spec.variable();
  r.partition = k->spec.partition();
  r.offset = k->spec.offset();
  r.version = k->version;
  r.learning_rate = k->lr;
  r.optimizer = OptimizerToProto(k->optimizer).name();
  k->value->Save(&r);
  k->snapshot.ready = true;
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
    if (!k->registered.warned) {
      k->registered.warned = true;
      LogWarning("key '", k->name, "' is at version ", k->version, ", short of step ", step,
                 ", and every worker finished: the final checkpoint ",
                 k->initialized ? "takes it as it is" : "leaves it out (it has no value)");
    }
    return true;
  }
  // A hold key is rank 0's alone: no other worker registers it.
  if (k->version != 0 || k->Held() || k->registered.by.empty() ||
      absl::Now() - k->registered.first < options_.registration_wait) {
    return false;
  }
  // Asked on every poll of a waiting checkpoint: the lists are made only
  // for the one warning.
  auto missing = [&](int w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(k->mu) {
    return !k->registered.by[w] && (k->active.empty() || k->active[w]);
  };
  int w = 0;
  while (w < options_.num_workers && !missing(w)) ++w;
  if (w == options_.num_workers) return false;
  if (!k->registered.warned) {
    k->registered.warned = true;
    std::vector<int> by, not_by;
    for (int i = 0; i < options_.num_workers; ++i) {
      if (k->registered.by[i]) by.push_back(i);
      if (missing(i)) not_by.push_back(i);
    }
    LogWarning("key '", k->name, "' was registered by worker", by.size() > 1 ? "s " : " ",
               absl::StrJoin(by, ", "), " but not by worker", not_by.size() > 1 ? "s " : " ",
               absl::StrJoin(not_by, ", "), " in ",
               absl::FormatDuration(options_.registration_wait),
               ", so it cannot take a step: checkpoints ",
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
    k->snapshot.ready = false;
  }
  max_pause_s_ = 0;
  snapshot_now_ = step < 0;
  snapshot_step_ = step >= 0 ? step : kNotArmed;
  for (Key* k : keys) {
    absl::MutexLock lock(&k->mu);
    if (!k->initialized || k->snapshot.ready || !k->role.serving) continue;
    k->snapshot.stray = Stray(k, step);
    if (step < 0 || k->version == step || k->FreeRunning() || k->snapshot.stray) {
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
      const bool stray = !k->snapshot.ready && (k->snapshot.stray = Stray(k, snapshot_step_));
      if ((k->FreeRunning() || stray) && k->initialized && !k->snapshot.ready && k->role.serving)
        CopyForSnapshot(k);
      if (!k->snapshot.ready && k->role.serving && !stray) ++waiting;
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
    if (!k->snapshot.ready || !k->role.serving) continue;
    records.push_back(&k->snapshot.copy);
    v1::ManifestKey* mk = info->add_keys();
    mk->set_variable(k->snapshot.copy.variable);
    mk->set_partition(k->snapshot.copy.partition);
    mk->set_offset(k->snapshot.copy.offset);
    mk->set_num_elements(k->snapshot.copy.num_elements);
    mk->set_version(k->snapshot.copy.version);
    mk->set_rows(static_cast<int64_t>(k->snapshot.copy.row_ids.size()));
    if (k->snapshot.stray) info->add_stray_keys(k->name);
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

}  // namespace psrt
