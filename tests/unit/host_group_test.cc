// The host group's shared memory and waits (worker/host_group.h), with the
// group's processes as HostGroup objects of this one process: each maps the
// same regions, as the processes of a host do.
#include "worker/host_group.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <memory>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"

namespace psrt {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

absl::Status Running() { return absl::OkStatus(); }

// A group of two processes (ranks 0 and 1), as objects of this one.
struct TwoProcesses {
  std::unique_ptr<SharedRegion> dir;
  std::unique_ptr<HostGroup> g[2];
  void Join() {
    absl::StatusOr<std::unique_ptr<SharedRegion>> made = HostGroup::MakeDirectory({0, 1});
    ASSERT_TRUE(made.ok()) << made.status();
    dir = *std::move(made);
    for (int i = 0; i < 2; ++i) {
      absl::StatusOr<std::unique_ptr<HostGroup>> joined =
          HostGroup::Join(dir->name(), i, i, Running);
      ASSERT_TRUE(joined.ok()) << joined.status();
      g[i] = *std::move(joined);
    }
  }
};

TEST(HostGroupTest, ItsProcessesShareEachVariablesSlotsAndWakeEachOther) {
  absl::StatusOr<std::unique_ptr<SharedRegion>> dir = HostGroup::MakeDirectory({4, 5, 6});
  ASSERT_TRUE(dir.ok()) << dir.status();
  std::unique_ptr<HostGroup> g[3];
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<std::unique_ptr<HostGroup>> joined =
        HostGroup::Join((*dir)->name(), i, 4 + i, Running);
    ASSERT_TRUE(joined.ok()) << joined.status();
    g[i] = *std::move(joined);
  }
  EXPECT_EQ(g[1]->size(), 3);
  EXPECT_EQ(g[1]->others(), (std::vector<int32_t>{4, 6}));
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(g[i]->AddVariable("w", 1000, 4, deadline).ok());
  HostGroup::Slots* s[3];
  for (int i = 0; i < 3; ++i) s[i] = g[i]->Find("w");
  ASSERT_NE(s[0], nullptr);
  EXPECT_EQ(g[0]->Find("v"), nullptr);
  // Partitions go round the local ranks from the name's place.
  EXPECT_NE(s[0]->owner(0), s[0]->owner(1));
  EXPECT_EQ(s[0]->owner(0), s[2]->owner(0));
  EXPECT_EQ(s[0]->owner(3), s[0]->owner(0));
  // What one writes, the others read; fresh control words are 0.
  EXPECT_EQ(s[2]->handed(1, 1), 0);
  s[1]->grad(1)[999] = 7;
  s[1]->set_handed(1, 1, 12);
  EXPECT_EQ(s[2]->grad(1)[999], 7);
  EXPECT_EQ(s[2]->handed(1, 1), 12);
  s[0]->weights(5)[3] = 1.5;
  EXPECT_EQ(s[2]->weights(7)[3], 1.5) << "one buffer per parity";
  EXPECT_NE(s[2]->weights(6), s[2]->weights(7));

  // A wait ends once another process's word says so.
  absl::Notification done;
  absl::Status result = absl::UnknownError("not run");
  g[0]->When([&] { return s[0]->published(2) >= 3; }, [] { return std::string("never"); },
             absl::Now() + absl::Seconds(10),
             [&](const absl::Status& st) {
               result = st;
               done.Notify();
             });
  EXPECT_FALSE(done.WaitForNotificationWithTimeout(absl::Milliseconds(100)));
  s[2]->set_published(2, 3);
  g[2]->Ring();
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_TRUE(result.ok()) << result;
}

TEST(HostGroupTest, EveryWaitEndsAtItsDeadlineOrWhenTheJobFailsOrTheGroupCloses) {
  absl::StatusOr<std::unique_ptr<SharedRegion>> dir = HostGroup::MakeDirectory({0, 1});
  ASSERT_TRUE(dir.ok()) << dir.status();
  absl::Status job = absl::OkStatus();
  absl::Mutex mu;
  auto stop = [&] {
    absl::MutexLock lock(&mu);
    return job;
  };
  absl::StatusOr<std::unique_ptr<HostGroup>> g = HostGroup::Join((*dir)->name(), 0, 0, stop);
  ASSERT_TRUE(g.ok()) << g.status();
  auto wait = [&](absl::Duration timeout) {
    auto done = std::make_shared<absl::Notification>();
    auto result = std::make_shared<absl::Status>();
    (*g)->When([] { return false; }, [] { return std::string("local rank 1 (rank 1) is late"); },
               absl::Now() + timeout,
               [done, result](const absl::Status& s) {
                 *result = s;
                 done->Notify();
               });
    return std::make_pair(done, result);
  };
  auto [late, late_result] = wait(absl::Milliseconds(200));
  ASSERT_TRUE(late->WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(late_result->code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(late_result->message(), HasSubstr("local rank 1 (rank 1) is late"));

  auto [failed, failed_result] = wait(absl::Seconds(60));
  {
    absl::MutexLock lock(&mu);
    job = absl::AbortedError("the job failed: worker 1 exited");
  }
  ASSERT_TRUE(failed->WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(failed_result->code(), absl::StatusCode::kAborted);

  {
    absl::MutexLock lock(&mu);
    job = absl::OkStatus();
  }
  auto [closed, closed_result] = wait(absl::Seconds(60));
  (*g)->Close();
  ASSERT_TRUE(closed->HasBeenNotified());
  EXPECT_EQ(closed_result->code(), absl::StatusCode::kCancelled);
}

TEST(HostGroupTest, ADirectoryThatDisagreesOrAVariableOfAnotherSizeIsRefused) {
  absl::StatusOr<std::unique_ptr<SharedRegion>> dir = HostGroup::MakeDirectory({2, 3});
  ASSERT_TRUE(dir.ok()) << dir.status();
  EXPECT_THAT(HostGroup::Join((*dir)->name(), 1, 7, Running).status().message(),
              AllOf(HasSubstr("local rank 1"), HasSubstr("rank 7")));
  EXPECT_FALSE(HostGroup::Join((*dir)->name(), 2, 4, Running).ok());
  EXPECT_FALSE(HostGroup::Join("/psrt-1-0000", 0, 2, Running).ok());
  EXPECT_FALSE(HostGroup::MakeDirectory({1}).ok());
  absl::StatusOr<std::unique_ptr<HostGroup>> a = HostGroup::Join((*dir)->name(), 0, 2, Running);
  absl::StatusOr<std::unique_ptr<HostGroup>> b = HostGroup::Join((*dir)->name(), 1, 3, Running);
  ASSERT_TRUE(a.ok() && b.ok());
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  ASSERT_TRUE((*a)->AddVariable("w", 100, 1, deadline).ok());
  absl::Status s = (*b)->AddVariable("w", 101, 1, deadline);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("'w'"), HasSubstr("101"), HasSubstr("local rank 0")));
  EXPECT_EQ((*b)->Find("w"), nullptr);
  // A table is not a variable of the same name, nor one of other rows.
  EXPECT_EQ((*b)->AddTable("w", 4, 1, deadline).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE((*a)->AddTable("t", 4, 2, deadline).ok());
  EXPECT_THAT((*b)->AddTable("t", 8, 2, deadline).message(), HasSubstr("rows of 4"));
}

TEST(HostGroupTest, ATablesRowsLieInASegmentOfTheirWritersThatGrowsAsTheyDo) {
  TwoProcesses p;
  ASSERT_NO_FATAL_FAILURE(p.Join());
  std::unique_ptr<HostGroup>* g = p.g;
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(g[i]->AddTable("emb", 16, 3, deadline).ok());
  HostGroup::Slots* writer = g[1]->Find("emb");
  HostGroup::Slots* reader = g[0]->Find("emb");
  ASSERT_NE(reader, nullptr);
  EXPECT_FALSE(reader->RowsOf(1).ok()) << "nothing written yet";

  absl::StatusOr<char*> small = writer->RowsToWrite(1, 100);
  ASSERT_TRUE(small.ok()) << small.status();
  std::strcpy(*small, "step 1");
  absl::StatusOr<std::pair<const char*, int64_t>> seen = reader->RowsOf(1);
  ASSERT_TRUE(seen.ok()) << seen.status();
  EXPECT_STREQ(seen->first, "step 1");
  const int64_t first_bytes = seen->second;
  EXPECT_GE(first_bytes, 100);
  // Rows that fit reuse the segment; more than fit get a new one, which
  // the reader finds by its name.
  ASSERT_EQ(*writer->RowsToWrite(1, first_bytes), *small);
  absl::StatusOr<char*> big = writer->RowsToWrite(1, first_bytes + 1);
  ASSERT_TRUE(big.ok()) << big.status();
  std::strcpy(*big, "step 3");
  seen = reader->RowsOf(1);
  ASSERT_TRUE(seen.ok()) << seen.status();
  EXPECT_STREQ(seen->first, "step 3");
  EXPECT_GT(seen->second, first_bytes);
}

// A table's cache of pulled rows: the first to want a row of a version
// claims it, the others wait for it and then copy it; a failed claim sends
// the others to the servers; a later version of the same parity takes an
// entry over once its row is in, and a copy of the earlier row then fails.
TEST(HostGroupTest, ATablesPulledRowsAreClaimedOnceAndSharedPerVersion) {
  TwoProcesses p;
  ASSERT_NO_FATAL_FAILURE(p.Join());
  std::unique_ptr<HostGroup>* g = p.g;
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(g[i]->AddTable("emb", 3, 1, deadline).ok());
  HostGroup::Slots* a = g[0]->Find("emb");
  HostGroup::Slots* b = g[1]->Find("emb");
  using Cached = HostGroup::Slots::Cached;
  float row[3] = {1, 2, 3}, got[3] = {0, 0, 0};

  const Cached claim = a->Look(4, 77, 0, got);
  ASSERT_EQ(claim.kind, Cached::kClaimed);
  const Cached wait = b->Look(4, 77, 1, got);
  ASSERT_EQ(wait.kind, Cached::kWait);
  EXPECT_EQ(wait.claimer, 0);
  EXPECT_TRUE(HostGroup::Slots::Fetching(claim.entry, 4, 0));
  EXPECT_TRUE(HostGroup::Slots::Fetching(wait.entry, 4, 0)) << "one entry, mapped by each";
  EXPECT_FALSE(b->Copy(wait.entry, 4, 77, got)) << "not in yet";
  EXPECT_EQ(b->Look(5, 77, 1, got).kind, Cached::kClaimed) << "another version, another parity";
  a->Fill(claim.entry, 4, 0, row);
  EXPECT_FALSE(HostGroup::Slots::Fetching(wait.entry, 4, 0));
  ASSERT_TRUE(b->Copy(wait.entry, 4, 77, got));
  EXPECT_EQ(got[2], 3);
  got[2] = 0;
  EXPECT_EQ(b->Look(4, 77, 1, got).kind, Cached::kCopied);
  EXPECT_EQ(got[2], 3);
  EXPECT_FALSE(b->Copy(wait.entry, 4, 78, got)) << "another id";

  // Version 6 (the same parity) takes the entry over; version 4's row is gone.
  const Cached later = b->Look(6, 77, 1, got);
  ASSERT_EQ(later.kind, Cached::kClaimed);
  EXPECT_FALSE(a->Copy(claim.entry, 4, 77, got));
  EXPECT_EQ(a->Look(4, 77, 0, got).kind, Cached::kClaimed) << "version 4 again: elsewhere";
  // A claim that fails sends the others to the servers.
  b->Fill(later.entry, 6, 1, nullptr);
  EXPECT_EQ(a->Look(6, 77, 0, got).kind, Cached::kPull);
  // An entry still being pulled for an earlier version is not taken over.
  const Cached pending = a->Look(8, 9, 0, got);
  ASSERT_EQ(pending.kind, Cached::kClaimed);
  const Cached next = b->Look(10, 9, 1, got);
  ASSERT_EQ(next.kind, Cached::kClaimed);
  EXPECT_TRUE(HostGroup::Slots::Fetching(pending.entry, 8, 0));
}

}  // namespace
}  // namespace psrt
