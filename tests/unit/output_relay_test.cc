#include "common/output_relay.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/process.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace psrt {
namespace {

using ::testing::ElementsAre;

// What the relay writes to its out and err descriptors, read as it comes
// (a pipe of 64 KiB would otherwise block the relay).
class Sink {
 public:
  Sink() {
    EXPECT_EQ(pipe2(fds_, O_CLOEXEC), 0);
    reader_ = std::thread([this] {
      char buf[65536];
      ssize_t n;
      while ((n = read(fds_[0], buf, sizeof(buf))) > 0) text_.append(buf, n);
    });
  }
  int fd() const { return fds_[1]; }
  // Everything written, once the writer's end is closed.
  std::string Finish() {
    close(fds_[1]);
    reader_.join();
    close(fds_[0]);
    return text_;
  }

 private:
  int fds_[2];
  std::thread reader_;
  std::string text_;
};

int Wait(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

pid_t Start(OutputRelay& relay, const std::string& name, const std::string& script) {
  absl::StatusOr<ChildStdio> pipes = relay.Open(name);
  EXPECT_TRUE(pipes.ok()) << pipes.status();
  absl::StatusOr<pid_t> pid = Spawn({"/bin/sh", "-c", script}, {}, false, *pipes);
  relay.Started(*pipes);
  EXPECT_TRUE(pid.ok()) << pid.status();
  return *pid;
}

// Several processes print many lines at once, in pieces (printf of a part,
// then the rest), some longer than a pipe's atomic write.
TEST(OutputRelay, LinesOfProcessesPrintingAtOnceArriveWholeInOrderAndAll) {
  constexpr int kProcesses = 4, kLines = 400;
  Sink out, err;
  std::vector<pid_t> pids;
  {
    OutputRelay relay(/*tag=*/true, out.fd(), err.fd());
    for (int p = 0; p < kProcesses; ++p) {
      // Line i of process p: "p=P i=I " then i % 7 * 1000 x's, in two
      // writes; every tenth also to stderr; the last line has no newline.
      pids.push_back(Start(
          relay, absl::StrCat(p),
          absl::StrCat("i=0; while [ $i -lt ", kLines, " ]; do printf 'p=", p,
                       " i=%d ' $i; head -c $(( i % 7 * 1000 )) /dev/zero | tr '\\0' x; ",
                       "[ $i -lt ", kLines - 1, " ] && echo; [ $(( i % 10 )) -eq 0 ] && echo ",
                       "\"err ", p, " $i\" >&2; i=$((i+1)); done")));
    }
    for (pid_t pid : pids) EXPECT_EQ(Wait(pid), 0);
  }  // the relay drains
  const std::string text = out.Finish();
  ASSERT_FALSE(text.empty());
  ASSERT_EQ(text.back(), '\n') << "the last line got its newline";
  std::map<int, int> next;  // process: the line expected next
  for (absl::string_view line :
       absl::StrSplit(absl::string_view(text).substr(0, text.size() - 1), '\n')) {
    std::vector<absl::string_view> f = absl::StrSplit(line, absl::MaxSplits(' ', 2));
    ASSERT_EQ(f.size(), 3u) << line.substr(0, 80);
    int p = -1, i = -1;
    ASSERT_TRUE(absl::StartsWith(f[0], "[") && absl::SimpleAtoi(f[1].substr(2), &i))
        << line.substr(0, 80);
    ASSERT_TRUE(absl::SimpleAtoi(f[0].substr(1, 1), &p)) << line.substr(0, 80);
    EXPECT_EQ(f[0], absl::StrCat("[", p, "]<stdout>:p=", p)) << line.substr(0, 80);
    EXPECT_EQ(i, next[p]++) << "process " << p << " out of order";
    EXPECT_EQ(f[2], std::string(i % 7 * 1000, 'x')) << "line " << i << " of process " << p;
  }
  for (int p = 0; p < kProcesses; ++p) EXPECT_EQ(next[p], kLines) << "process " << p;
  const std::string errors = err.Finish();
  for (int p = 0; p < kProcesses; ++p) {
    std::vector<std::string> mine;
    for (absl::string_view line : absl::StrSplit(errors, '\n', absl::SkipEmpty())) {
      if (absl::StartsWith(line, absl::StrCat("[", p, "]"))) mine.emplace_back(line);
    }
    ASSERT_EQ(mine.size(), kLines / 10u);
    EXPECT_EQ(mine[3], absl::StrCat("[", p, "]<stderr>:err ", p, " 30"));
  }
}

TEST(OutputRelay, UntaggedKeepsLineEndingsAndRedrawnLines) {
  Sink out, err;
  {
    OutputRelay relay(/*tag=*/false, out.fd(), err.fd());
    EXPECT_EQ(Wait(Start(relay, "0", "printf 'a\\r\\nb 10%%\\rb 100%%\\nlast'")), 0);
  }
  EXPECT_EQ(out.Finish(), "a\r\nb 10%\rb 100%\nlast\n");
  EXPECT_EQ(err.Finish(), "");
}

TEST(OutputRelay, DrainStopsAtItsDeadlineWhenAPipeStaysOpen) {
  Sink out, err;
  OutputRelay relay(/*tag=*/true, out.fd(), err.fd());
  // The shell exits; the sleep it left behind holds the pipes.
  const pid_t pid = Start(relay, "7", "echo before; sleep 30 & echo $! >&2; exit 0");
  EXPECT_EQ(Wait(pid), 0);
  relay.Drain(absl::Milliseconds(300));
  EXPECT_EQ(out.Finish(), "[7]<stdout>:before\n");
  EXPECT_FALSE(relay.Open("8").ok());
  const std::string errors = err.Finish();
  int sleeper = 0;
  ASSERT_TRUE(absl::StartsWith(errors, "[7]<stderr>:")) << errors;
  ASSERT_TRUE(absl::SimpleAtoi(absl::StripSuffix(errors.substr(12), "\n"), &sleeper)) << errors;
  kill(sleeper, SIGKILL);
}

}  // namespace
}  // namespace psrt
