// Store: pulls, and the pulls that wait for a version (their sweeper).
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

int64_t Store::SlowestClock(Key* k) const {
  int64_t m = INT64_MAX;
  for (int w = 0; w < options_.num_workers; ++w) {
    if (k->active[w]) m = std::min(m, k->window.clock[w]);
  }
  return m;
}

bool Store::Serve(Key* k, PendingPull* p, int i) {
  const v1::DType dtype = p->dtypes[i];
  const int64_t n = k->value->Size(p->ids[i]);
  auto write = [&](char* to) ABSL_EXCLUSIVE_LOCKS_REQUIRED(k->mu) {
    BytesHeld held(&bytes_stored_, *k->value);  // a table makes the rows it lacks
    return k->value->Write(p->ids[i], k->version, dtype, to);
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
  if (!options_.sync)
    staleness_->Observe(std::max<int64_t>(0, p->min_version[i] - SlowestClock(k)));
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
      if (k->active[w] && !k->sync.contributed[w]) missing.push_back(w);
    }
    why = absl::StrCat("the key is at version ", k->version, "; waiting for pushes from workers ",
                       absl::StrJoin(missing, ", "));
  } else {
    std::vector<std::string> behind;
    for (int w = 0; w < options_.num_workers; ++w) {
      if (k->active[w] && k->window.clock[w] < min_version - options_.staleness) {
        behind.push_back(absl::StrCat("worker ", w, " at clock ", k->window.clock[w]));
      }
    }
    why = absl::StrCat("staleness bound ", options_.staleness,
                       " needs every worker at clock >= ", min_version - options_.staleness,
                       "; behind: ", absl::StrJoin(behind, ", "));
  }
  const bool capped = p->until == p->start + options_.max_pull_wait;
  return absl::StrCat(
      "pull of key '", k->name, "' waited ",
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
  return absl::InvalidArgumentError(
      absl::StrCat("pull of key '", key, "' asks for dtype ", dtype,
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
      return done(absl::InvalidArgumentError(absl::StrCat(
                      "key '", (*key)->name, "' appears twice in one pull; name each key once")),
                  {});
    }
    if (!kd.data.empty()) {
      return done(absl::InvalidArgumentError(
                      absl::StrCat("pull of key '", (*key)->name,
                                   "' carries data; a pull names keys and versions only")),
                  {});
    }
    if (absl::Status s = CheckPullDtype((*key)->name, kd.dtype); !s.ok()) return done(s, {});
    absl::Status checked;
    {
      absl::MutexLock lock(&(*key)->mu);
      checked = (*key)->value->CheckPull(kd.ids);
    }
    if (!checked.ok()) return done(checked, {});
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
  for (int i = 0; i < n; ++i) {
    absl::Status s;
    {
      Key* k = p->keys[i];
      absl::MutexLock lock(&k->mu);
      s = CheckPull(k, *p, i);
    }
    if (!s.ok()) return Fail(p.get(), s);
  }
  absl::Status bad;
  bool complete = false;
  for (int i = 0; i < n && bad.ok(); ++i) {
    Key* k = p->keys[i];
    absl::MutexLock lock(&k->mu);
    if (!(bad = CheckPull(k, *p, i)).ok()) {  // the key stopped meanwhile
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

absl::Status Store::CheckPull(Key* k, const PendingPull& p, int i) {
  const int64_t min_version = p.min_version[i];
  if (!k->stopped.ok()) return k->stopped;
  if (!k->role.serving) return NotServing(k);
  if (absl::Status s = CheckRowsLocked(k, p.ids[i]); !s.ok()) return s;
  if (min_version < 0) {
    return absl::OutOfRangeError(absl::StrCat("pull of key '", k->name, "' asks for version ",
                                              min_version, "; versions start at 0"));
  }
  if (options_.sync && k->initialized && min_version > k->version + 1) {
    return absl::OutOfRangeError(absl::StrCat(
        "pull of key '", k->name, "' asks for version ", min_version, " but the key is at version ",
        k->version, "; in sync mode a pull may ask at most one version ahead"));
  }
  return absl::OkStatus();
}

void Store::PushPullAsync(const WireMessage& req, absl::Time deadline, Cancelled cancelled,
                          PullDone done) {
  // The pull part is checked first: a refused push-pull pushes nothing.
  if (req.assign_rows) {
    return done(
        absl::InvalidArgumentError("a push-pull cannot assign rows (assign_rows); push them"), {});
  }
  for (const WireKey& kd : req.keys) {
    if (absl::Status s = CheckPullDtype(KeyName(kd.variable, kd.partition), kd.pull_dtype);
        !s.ok()) {
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

}  // namespace psrt
