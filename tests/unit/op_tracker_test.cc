// The client's operations in flight (worker/op_tracker.h), without servers.
#include "worker/op_tracker.h"

#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace psrt {
namespace {

absl::Status Running() { return absl::OkStatus(); }

TEST(OpTrackerTest, AnOperationEndsOnceEachRequestDidWithTheFirstError) {
  OpTracker ops;
  auto [handle, op] = ops.New(3, absl::OkStatus(), "PUSH");
  EXPECT_EQ(op->handle, handle);
  std::thread requests([op = op] {
    OpTracker::Done(op.get(), absl::OkStatus());
    absl::SleepFor(absl::Milliseconds(20));
    OpTracker::Done(op.get(), absl::UnavailableError("server 1 is gone"));
    OpTracker::Done(op.get(), absl::InternalError("a later error"));
  });
  std::shared_ptr<Op> found;
  const absl::Status s =
      ops.Wait(handle, absl::Now() + absl::Seconds(10), absl::Seconds(10), Running, &found);
  requests.join();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_EQ(found, op);
  EXPECT_STREQ(found->kind, "PUSH");
  // Each handle is waited for once.
  const absl::Status again = ops.Wait(handle, absl::Now(), absl::Seconds(1), Running, &found);
  EXPECT_EQ(again.code(), absl::StatusCode::kNotFound) << again;
  EXPECT_EQ(ops.Wait(12345, absl::Now(), absl::Seconds(1), Running, &found).code(),
            absl::StatusCode::kNotFound);
}

TEST(OpTrackerTest, AnOperationRefusedAtTheStartHasEndedWithItsError) {
  OpTracker ops;
  auto [handle, op] = ops.New(0, absl::InvalidArgumentError("no such variable"));
  std::shared_ptr<Op> found;
  EXPECT_EQ(ops.Wait(handle, absl::Now(), absl::Seconds(1), Running, &found).code(),
            absl::StatusCode::kInvalidArgument);
  // Handles are not reused.
  EXPECT_NE(ops.New(0).first, handle);
}

TEST(OpTrackerTest, AWaitEndsWhenTheJobDoesOrAtItsDeadlineSayingWhat) {
  OpTracker ops;
  auto [stuck, op] = ops.New(1);
  std::shared_ptr<Op> found;
  const absl::Status failed = ops.Wait(
      stuck, absl::Now() + absl::Seconds(10), absl::Seconds(10),
      [] { return absl::AbortedError("the job failed: server 0 was lost"); }, &found);
  EXPECT_EQ(failed.code(), absl::StatusCode::kAborted) << failed;
  auto [late, op2] = ops.New(1);
  const absl::Status timed_out =
      ops.Wait(late, absl::Now() + absl::Milliseconds(100), absl::Seconds(3), Running, &found);
  EXPECT_EQ(timed_out.code(), absl::StatusCode::kDeadlineExceeded) << timed_out;
  EXPECT_NE(timed_out.message().find("did not finish within 3s"), std::string::npos) << timed_out;
}

TEST(LaunchTurnsTest, LaunchesRunInTheOrderOfTheirTicketsWhateverOrderTheyAreReadyIn) {
  LaunchTurns turns;
  const uint64_t first = turns.Take(), second = turns.Take(), third = turns.Take();
  std::vector<uint64_t> ran;
  turns.Run(third, [&] { ran.push_back(third); });
  turns.Run(second, [&] { ran.push_back(second); });
  EXPECT_TRUE(ran.empty());  // both wait for the first
  turns.Run(first, [&] { ran.push_back(first); });
  EXPECT_EQ(ran, (std::vector<uint64_t>{first, second, third}));
  const uint64_t fourth = turns.Take();
  turns.Run(fourth, [&] { ran.push_back(fourth); });  // its turn: at once
  EXPECT_EQ(ran.back(), fourth);
}

}  // namespace
}  // namespace psrt
