#ifndef PSRT_COMMON_BACKOFF_H_
#define PSRT_COMMON_BACKOFF_H_

#include <algorithm>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace psrt {

// The waits between tries of something that may work a little later (a
// server restarting or slow to connect, a host name not yet resolvable):
// from `first`, doubling up to 1 s, never past `deadline`.
class Backoff {
 public:
  explicit Backoff(absl::Time deadline, absl::Duration first = absl::Milliseconds(100))
      : deadline_(deadline), next_(first) {}

  // Sleeps before the next try; false, at once, if that try would come
  // after the deadline.
  bool Wait() {
    if (absl::Now() + next_ > deadline_) return false;
    absl::SleepFor(next_);
    next_ = std::min(2 * next_, absl::Seconds(1));
    return true;
  }

 private:
  const absl::Time deadline_;
  absl::Duration next_;
};

}  // namespace psrt

#endif  // PSRT_COMMON_BACKOFF_H_
