// Store: its keys, membership and learning rates; the other concerns are in
// store_registration.cc, store_push.cc, store_pulls.cc, store_replicas.cc,
// store_snapshot.cc and store_wire.cc.
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
#include "absl/time/clock.h"
#include "common/compression.h"
#include "common/key_map.h"
#include "common/logging.h"
#include "common/optimizer_proto.h"
#include "server/store_internal.h"
#include "server/table.h"

namespace psrt {

namespace {

std::vector<double> TimeBuckets() { return {1e-5, 1e-4, 1e-3, 1e-2, 0.1, 1, 10, 100}; }

}  // namespace

Store::Store(StoreOptions options, Metrics* metrics)
    : options_(options),
      bytes_in_(metrics->GetCounter("bytes_in_total",
                                    "Payload bytes received in pushes and registrations")),
      bytes_out_(metrics->GetCounter("bytes_out_total", "Payload bytes sent in pulls")),
      pushes_(metrics->GetCounter("push_requests_total", "Push requests accepted")),
      key_pushes_(metrics->GetCounter("key_pushes_total", "Key gradients received")),
      duplicate_pushes_(metrics->GetCounter("duplicate_pushes_total",
                                            "Key pushes dropped as retries of applied ones")),
      pulls_(metrics->GetCounter("key_pulls_total", "Keys sent in pulls")),
      updates_(metrics->GetCounter("updates_total", "Optimizer updates applied")),
      nonfinite_updates_(metrics->GetCounter(
          "nonfinite_updates_total",
          "Updates whose gradient held NaN or Inf: skipped, or (nonfinite: fail) refused")),
      evicted_rows_(
          metrics->GetCounter("evicted_rows_total", "Sparse table rows dropped by eviction")),
      update_seconds_(metrics->GetHistogram(
          "update_seconds", "Time to apply one optimizer update to a key", TimeBuckets())),
      pull_wait_seconds_(metrics->GetHistogram(
          "pull_wait_seconds", "Time a pulled key waited for its version", TimeBuckets())),
      dropped_pushes_(metrics->GetCounter(
          "dropped_pushes_total",
          "Sync pushes dropped because their step was applied without them (backup workers)")),
      staleness_(metrics->GetHistogram(
          "staleness",
          "Clocks by which a pulling worker was ahead of the slowest active worker (async, ssp)",
          {0, 1, 2, 3, 4, 6, 8, 12, 16, 32, 64})),
      epoch_gauge_(metrics->GetGauge("membership_epoch", "Membership epoch this server works in")),
      compressed_pushes_(
          metrics->GetCounter("compressed_pushes_total", "Key pushes in float16 or bfloat16")),
      rescaled_pushes_(metrics->GetCounter("rescaled_pushes_total",
                                           "Compressed key pushes scaled to fit float16's range")),
      nonfinite_pushes_(metrics->GetCounter("nonfinite_pushes_total",
                                            "Key pushes whose gradient held NaN or Inf")),
      waiting_pulls_(
          metrics->GetGauge("waiting_pulls", "Pulls waiting for a version (none holds a thread)")),
      snapshot_pause_seconds_(
          metrics->GetHistogram("checkpoint_pause_seconds",
                                "Time a key was held to copy it for a checkpoint", TimeBuckets())) {
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
    return absl::InvalidArgumentError(
        absl::StrCat("worker rank ", rank, " is out of range; this job has ", options_.num_workers,
                     " workers (ranks 0..", options_.num_workers - 1, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Store::Key*> Store::Find(const std::string& variable, uint32_t partition) const {
  absl::ReaderMutexLock lock(&map_mu_);
  auto it = keys_.find(KeyName(variable, partition));
  if (it == keys_.end()) {
    return absl::NotFoundError(
        absl::StrCat("key '", KeyName(variable, partition),
                     "' is not registered on this server; register the variable first"));
  }
  return it->second.get();
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
  const int required =
      std::max<int>(1, std::count(active.begin(), active.end(), 1) - options_.backup_workers);
  for (Key* k : AllKeys()) {
    Completed completed;
    {
      absl::MutexLock lock(&k->mu);
      if (!k->initialized) continue;
      k->active = active;
      k->sync.required = required;
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
    for (int w = 0; w < options_.num_workers; ++w)
      clocks[w] = std::min(clocks[w], k->window.clock[w]);
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
  for (const auto& p : TakePending())
    Fail(p.get(), absl::UnavailableError("the server is stopping"));
}

bool Store::Ready(Key* k, int64_t min_version) const {
  if (!k->initialized) return false;
  if (options_.sync) return k->version >= min_version;
  if (options_.staleness < 0) return true;  // async
  return SlowestClock(k) >= min_version - options_.staleness;
}

absl::StatusOr<int64_t> Store::SetLearningRate(const v1::SetLearningRateRequest& req) {
  if (absl::Status s = CheckWorker(req.worker_rank()); !s.ok()) return s;
  if (!(req.lr() >= 0) || !std::isfinite(static_cast<float>(req.lr()))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "learning rate must be >= 0 and finite as float32, the precision updates run in; got ",
        req.lr()));
  }
  std::vector<Key*> keys;
  {
    absl::ReaderMutexLock lock(&map_mu_);
    for (auto& [name, key] : keys_) {
      // A rate for every variable is the dense ones': a table's optimizer
      // has a rate of its own (psrt.keras.Embedding's lr beside the model's
      // schedule), set by its name.
      if (req.variable().empty() ? !key->spec.has_table() : key->spec.variable() == req.variable())
        keys.push_back(key.get());
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
      return absl::InvalidArgumentError(
          absl::StrCat("learning rate for key '", k->name, "': ", s.message()));
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

}  // namespace psrt
