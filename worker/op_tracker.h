#ifndef PSRT_WORKER_OP_TRACKER_H_
#define PSRT_WORKER_OP_TRACKER_H_

// The client's operations in flight, as ps-lite's customer tracks its
// requests: each has a handle and ends once every request it was fanned
// out into has ended (Done); Wait takes it by its handle. Its own lock,
// apart from the client's. And LaunchTurns, the order in which operations
// that wait for something first launch their requests.

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace psrt {

// One operation fanned out over servers.
struct Op {
  absl::Mutex mu;
  int pending ABSL_GUARDED_BY(mu) = 0;
  absl::Status status ABSL_GUARDED_BY(mu);  // the first error of its requests
  // What the timeline says of it: its kind ("PUSH_PULL", "REGISTER", ...)
  // and handle, and, only with a timeline, its tensors and their bytes.
  const char* kind = "";
  uint64_t handle = 0;
  std::string tensors;  // a JSON array
  int64_t bytes = 0;
};

class OpTracker {
 public:
  using Handle = uint64_t;

  // A new operation, ended after `pending` Done calls (0: ended already,
  // with `status`).
  std::pair<Handle, std::shared_ptr<Op>> New(int pending, absl::Status status = absl::OkStatus(),
                                             const char* kind = "");
  // `n` more Done calls before op ends: parts it fans out into once it runs
  // (called while one of its parts is still pending).
  static void Add(Op* op, int n);
  // One of op's requests ended with `s`.
  static void Done(Op* op, const absl::Status& s);
  // Takes operation `handle` (NOT_FOUND: there is none, or it was waited
  // for already; its Op in *found otherwise) and waits until it ended, or
  // `stop` says why it will not (asked every 50 ms: the job failed), or
  // `deadline` passed (DEADLINE_EXCEEDED, saying it did not end within
  // `expected`).
  absl::Status Wait(Handle handle, absl::Time deadline, absl::Duration expected,
                    const std::function<absl::Status()>& stop, std::shared_ptr<Op>* found);

 private:
  absl::Mutex mu_;
  absl::flat_hash_map<Handle, std::shared_ptr<Op>> ops_ ABSL_GUARDED_BY(mu_);
  Handle next_ ABSL_GUARDED_BY(mu_) = 1;
};

// Launches in the order their operations started, whenever each is ready:
// an operation takes a ticket when it starts (Take), and its launch runs
// once every earlier ticket's has (Run). Its own lock.
class LaunchTurns {
 public:
  uint64_t Take() { return tickets_.fetch_add(1); }
  // Runs `launch` now, on this thread, if every earlier ticket's launch
  // ran; else keeps it for the thread that runs the last of those. A
  // launch must take no lock of this (it runs under it, so that two turns
  // never run out of order).
  void Run(uint64_t ticket, std::function<void()> launch) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  std::atomic<uint64_t> tickets_{0};
  absl::Mutex mu_;
  uint64_t next_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<uint64_t, std::function<void()>> waiting_ ABSL_GUARDED_BY(mu_);
};

}  // namespace psrt

#endif  // PSRT_WORKER_OP_TRACKER_H_
