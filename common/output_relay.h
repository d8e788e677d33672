// Copies child processes' stdout and stderr to this process's, in whole
// lines. A process's stdio flushes blocks that end mid-line, so several
// processes writing to one terminal or log interleave inside lines; through
// the relay every line goes out in one write(2) (lines up to PIPE_BUF bytes
// cannot mix with another writer's), in order per stream, and a last line
// without a newline gets one when its stream ends. stdout and stderr of one
// process are two streams: their relative order is not kept (as with mpirun).

#ifndef PSRT_COMMON_OUTPUT_RELAY_H_
#define PSRT_COMMON_OUTPUT_RELAY_H_

#include <unistd.h>

#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/process.h"

namespace psrt {

class OutputRelay {
 public:
  // With `tag`, each line starts with "[NAME]<stdout>:" or "[NAME]<stderr>:"
  // (Horovod's and mpirun --tag-output's form). Lines go to out_fd and
  // err_fd, which stay open (this process's stdout and stderr by default).
  explicit OutputRelay(bool tag, int out_fd = STDOUT_FILENO, int err_fd = STDERR_FILENO);
  // Drains for at most 5 s (Drain).
  ~OutputRelay();
  OutputRelay(const OutputRelay&) = delete;
  OutputRelay& operator=(const OutputRelay&) = delete;

  // Opens the pipes of a child called `name` (its tag) and returns the
  // child's ends (close-on-exec here) for Spawn; the relay reads them from
  // now on. Call Started once the child was spawned (or was not).
  absl::StatusOr<ChildStdio> Open(absl::string_view name);
  // Closes this process's copy of the child's ends, so that the relay sees
  // the end of its output when the child (and whatever it started) exits.
  void Started(ChildStdio pipes);

  // Relays until every stream has ended, for at most `timeout` (a process
  // the child left behind may hold its pipes open), then writes what is
  // left as lines and stops. Idempotent; Open fails after it.
  void Drain(absl::Duration timeout);

 private:
  struct Stream {
    int fd = -1;  // the read end
    int to = -1;  // where its lines go
    std::string prefix;
    std::string partial;  // read, up to a line's end not yet
  };
  void Loop();
  // Reads what `s` has; false at its end (EOF or an error).
  bool Read(Stream& s);
  // Writes the complete lines of s.partial (all of it, as a line, with
  // `flush`), in writes of whole lines.
  void Emit(Stream& s, bool flush);
  void Wake();

  const bool tag_;
  const int out_fd_;
  const int err_fd_;
  int wake_[2] = {-1, -1};  // a byte on it: the streams or the deadline changed
  absl::Mutex mu_;
  std::vector<Stream> added_ ABSL_GUARDED_BY(mu_);  // opened, not yet polled
  absl::Time deadline_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace psrt

#endif  // PSRT_COMMON_OUTPUT_RELAY_H_
