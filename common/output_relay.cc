#include "common/output_relay.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <string.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace psrt {
namespace {

// A line longer than this without its end goes out in pieces of this size
// (each ended by "\n"),
// so that a process that never ends a line cannot fill memory.
constexpr size_t kMaxLine = 1 << 20;

void WriteAll(int fd, absl::string_view data) {
  while (!data.empty()) {
    const ssize_t n = write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // nowhere to write (a closed terminal): dropped
    data.remove_prefix(n);
  }
}

void CloseBoth(int fds[2]) {
  close(fds[0]);
  close(fds[1]);
}

}  // namespace

OutputRelay::OutputRelay(bool tag, int out_fd, int err_fd)
    : tag_(tag), out_fd_(out_fd), err_fd_(err_fd) {
  if (pipe2(wake_, O_CLOEXEC | O_NONBLOCK) != 0) wake_[0] = wake_[1] = -1;
  thread_ = std::thread([this] { Loop(); });
}

OutputRelay::~OutputRelay() {
  Drain(absl::Seconds(5));
  if (wake_[0] >= 0) CloseBoth(wake_);
}

absl::StatusOr<ChildStdio> OutputRelay::Open(absl::string_view name) {
  int out[2], err[2];
  if (pipe2(out, O_CLOEXEC) != 0)
    return absl::InternalError(absl::StrCat("pipe: ", strerror(errno)));
  if (pipe2(err, O_CLOEXEC) != 0) {
    const int e = errno;
    CloseBoth(out);
    return absl::InternalError(absl::StrCat("pipe: ", strerror(e)));
  }
  fcntl(out[0], F_SETFL, O_NONBLOCK);
  fcntl(err[0], F_SETFL, O_NONBLOCK);
  {
    absl::MutexLock lock(&mu_);
    if (draining_) {
      CloseBoth(out);
      CloseBoth(err);
      return absl::FailedPreconditionError("the output relay is draining");
    }
    added_.push_back({out[0], out_fd_, tag_ ? absl::StrCat("[", name, "]<stdout>:") : ""});
    added_.push_back({err[0], err_fd_, tag_ ? absl::StrCat("[", name, "]<stderr>:") : ""});
  }
  Wake();
  return ChildStdio{out[1], err[1]};
}

void OutputRelay::Started(ChildStdio pipes) {
  if (pipes.out >= 0) close(pipes.out);
  if (pipes.err >= 0) close(pipes.err);
}

void OutputRelay::Drain(absl::Duration timeout) {
  {
    absl::MutexLock lock(&mu_);
    if (!draining_) {
      draining_ = true;
      deadline_ = absl::Now() + timeout;
    }
  }
  Wake();
  if (thread_.joinable()) thread_.join();
}

void OutputRelay::Wake() {
  const char byte = 0;
  if (wake_[1] >= 0) {
    ssize_t ignored = write(wake_[1], &byte, 1);  // full: a wake is pending anyway
    (void)ignored;
  }
}

void OutputRelay::Loop() {
  std::vector<Stream> streams;
  std::vector<pollfd> fds;
  while (true) {
    bool draining;
    absl::Time deadline;
    {
      absl::MutexLock lock(&mu_);
      for (Stream& s : added_) streams.push_back(std::move(s));
      added_.clear();
      draining = draining_;
      deadline = deadline_;
    }
    const absl::Time now = absl::Now();
    if ((draining && streams.empty()) || now >= deadline) break;
    fds.assign(1, pollfd{wake_[0], POLLIN, 0});
    for (const Stream& s : streams) fds.push_back(pollfd{s.fd, POLLIN, 0});
    const int timeout_ms =
        deadline == absl::InfiniteFuture()
            ? -1
            : static_cast<int>(std::ceil(absl::ToDoubleMilliseconds(deadline - now)));
    if (poll(fds.data(), fds.size(), std::max(timeout_ms, -1)) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (fds[0].revents != 0) {
      char buf[64];
      while (read(wake_[0], buf, sizeof(buf)) > 0) {
      }
    }
    for (size_t i = streams.size(); i-- > 0;) {
      if (fds[i + 1].revents == 0 || Read(streams[i])) continue;
      Emit(streams[i], /*flush=*/true);
      close(streams[i].fd);
      streams.erase(streams.begin() + i);
    }
  }
  // Past the deadline: what was read goes out, as lines.
  absl::MutexLock lock(&mu_);
  for (Stream& s : added_) streams.push_back(std::move(s));
  added_.clear();
  for (Stream& s : streams) {
    Emit(s, /*flush=*/true);
    close(s.fd);
  }
}

bool OutputRelay::Read(Stream& s) {
  char buf[65536];
  const ssize_t n = read(s.fd, buf, sizeof(buf));
  if (n < 0) return errno == EINTR || errno == EAGAIN;
  if (n == 0) return false;
  s.partial.append(buf, n);
  Emit(s, /*flush=*/false);
  return true;
}

void OutputRelay::Emit(Stream& s, bool flush) {
  std::string batch;
  size_t start = 0;
  while (start < s.partial.size()) {
    // A line ends at "\n", "\r\n" or "\r" (a progress bar redrawing its
    // line), which it keeps.
    size_t end = s.partial.find_first_of("\r\n", start);
    absl::string_view ending = "\n";
    if (end == std::string::npos) {
      if (!flush && s.partial.size() - start < kMaxLine) break;
      end = std::min(s.partial.size(), start + kMaxLine);
    } else if (s.partial[end] == '\r') {
      const bool last = end + 1 == s.partial.size();
      if (last && !flush) break;  // "\r" or "\r\n": the next read says
      ending = !last && s.partial[end + 1] == '\n' ? "\r\n" : "\r";
    }
    const absl::string_view line(s.partial.data() + start, end - start);
    // Several lines share a write while it stays atomic on a pipe.
    if (!batch.empty() && batch.size() + s.prefix.size() + line.size() + 2 > PIPE_BUF) {
      WriteAll(s.to, batch);
      batch.clear();
    }
    absl::StrAppend(&batch, s.prefix, line, ending);
    start = end < s.partial.size() && (s.partial[end] == '\n' || s.partial[end] == '\r')
                ? end + ending.size()
                : end;
  }
  if (!batch.empty()) WriteAll(s.to, batch);
  s.partial.erase(0, start);
}

}  // namespace psrt
