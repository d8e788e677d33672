#include "worker/op_tracker.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace psrt {

std::pair<OpTracker::Handle, std::shared_ptr<Op>> OpTracker::New(int pending, absl::Status status,
                                                                  const char* kind) {
  auto op = std::make_shared<Op>();
  op->kind = kind;
  {
    absl::MutexLock lock(&op->mu);
    op->pending = pending;
    op->status = std::move(status);
  }
  absl::MutexLock lock(&mu_);
  const Handle h = next_++;
  op->handle = h;
  ops_[h] = op;
  return {h, op};
}

void OpTracker::Add(Op* op, int n) {
  absl::MutexLock lock(&op->mu);
  op->pending += n;
}

void OpTracker::Done(Op* op, const absl::Status& s) {
  absl::MutexLock lock(&op->mu);
  if (op->status.ok() && !s.ok()) op->status = s;
  --op->pending;
}

absl::Status OpTracker::Wait(Handle handle, absl::Time deadline, absl::Duration expected,
                             const std::function<absl::Status()>& stop,
                             std::shared_ptr<Op>* found) {
  std::shared_ptr<Op>& op = *found;
  {
    absl::MutexLock lock(&mu_);
    auto it = ops_.find(handle);
    if (it == ops_.end()) {
      return absl::NotFoundError(absl::StrCat("no pending operation with handle ", handle));
    }
    op = it->second;
    ops_.erase(it);
  }
  absl::MutexLock lock(&op->mu);
  auto done = [&op]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(op->mu) { return op->pending == 0; };
  while (!op->mu.AwaitWithTimeout(absl::Condition(&done), absl::Milliseconds(50))) {
    if (absl::Status s = stop(); !s.ok()) return s;
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat("operation ", handle, " did not finish within ",
                                                      absl::FormatDuration(expected)));
    }
  }
  return op->status;
}

void LaunchTurns::Run(uint64_t ticket, std::function<void()> launch) {
  absl::MutexLock lock(&mu_);
  waiting_[ticket] = std::move(launch);
  while (!waiting_.empty() && waiting_.begin()->first == next_) {
    std::function<void()> next = std::move(waiting_.begin()->second);
    waiting_.erase(waiting_.begin());
    ++next_;
    next();
  }
}

}  // namespace psrt
