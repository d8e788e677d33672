// The shard map's decisions (server/placement.h) without a coordinator:
// where keys start, moves as servers join and leave, copies and failover.
#include "server/placement.h"

#include <string>
#include <vector>

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace psrt {
namespace {

using ::testing::ElementsAre;

constexpr absl::Duration kLimit = absl::Seconds(60);
const absl::Time kT0 = absl::FromUnixSeconds(1000);

// Servers 0..n-1, live, on hosts "h<i / per_host>", each applying `epoch`.
Placement::Servers Live(int n, int per_host, int64_t epoch) {
  Placement::Servers servers(n);
  for (int i = 0; i < n; ++i) {
    servers[i].live = true;
    servers[i].host = "h" + std::to_string(i / per_host);
    servers[i].shard_epoch = epoch;
  }
  return servers;
}

TEST(PlacementTest, KeysStartOnTheirServerOrTheOneServingThemUntilItJoins) {
  Placement fixed;
  fixed.LayOut(4, /*started=*/0, /*replicas=*/1, /*servers_per_host=*/2);
  EXPECT_THAT(fixed.served_by(), ElementsAre(0, 1, 2, 3));
  // Each copy on the next host, same slot.
  EXPECT_EQ(fixed.CopyAt(0), 2);
  EXPECT_EQ(fixed.CopyAt(3), 1);
  Placement growing;
  growing.LayOut(5, /*started=*/2, /*replicas=*/1, /*servers_per_host=*/1);
  EXPECT_THAT(growing.served_by(), ElementsAre(0, 1, 0, 1, 0));
  // With "max_servers", copies are named once the job runs.
  for (int o = 0; o < 5; ++o) EXPECT_EQ(growing.CopyAt(o), -1);
  v1::ShardMap map;
  growing.Fill(&map);
  EXPECT_EQ(map.epoch(), growing.epoch());
  EXPECT_EQ(map.served_by_size(), 5);
  EXPECT_EQ(map.replica_at_size(), 5);
}

TEST(PlacementTest, AJoinMovesTheKeysInPhasesEachTakenOnceTheServersApplyTheLast) {
  Placement p;
  p.LayOut(3, /*started=*/2, /*replicas=*/0, 1);
  Placement::Servers servers = Live(3, 1, p.epoch());
  p.Join(2);
  ASSERT_TRUE(p.moving());
  // Copy: server 2 keeps a copy of its keys, built by server 0.
  Placement::Progress step = p.Advance(servers, kT0, kLimit);
  EXPECT_EQ(step.kind, Placement::Progress::kStarted);
  EXPECT_EQ(step.move.from, 0);
  EXPECT_EQ(step.move.to, 2);
  EXPECT_EQ(p.CopyAt(2), 2);
  EXPECT_EQ(p.ServedBy(2), 0);
  // Not built yet (server 0 has not heard of it, then is building it).
  EXPECT_EQ(p.Advance(servers, kT0, kLimit).kind, Placement::Progress::kNone);
  servers[0].shard_epoch = p.epoch();
  servers[0].copies_building = {2};
  EXPECT_EQ(p.Advance(servers, kT0, kLimit).kind, Placement::Progress::kNone);
  EXPECT_EQ(p.ServedBy(2), 0);
  // Built: server 0 lets them go; nobody serves them for a moment.
  servers[0].copies_building.clear();
  p.Advance(servers, kT0, kLimit);
  EXPECT_EQ(p.ServedBy(2), -1);
  const int64_t let_go = p.epoch();
  // Server 0 says it let go: server 2 serves them, without a copy.
  p.Advance(servers, kT0, kLimit);
  EXPECT_EQ(p.ServedBy(2), -1);
  servers[0].shard_epoch = let_go;
  p.Advance(servers, kT0, kLimit);
  EXPECT_EQ(p.ServedBy(2), 2);
  EXPECT_EQ(p.CopyAt(2), -1);
  // The move ends once server 2 says it serves them.
  EXPECT_EQ(p.Advance(servers, kT0, kLimit).kind, Placement::Progress::kNone);
  servers[2].shard_epoch = p.epoch();
  step = p.Advance(servers, kT0 + absl::Seconds(1), kLimit);
  EXPECT_EQ(step.kind, Placement::Progress::kEnded);
  EXPECT_FALSE(p.moving());
}

TEST(PlacementTest, ARemovalMovesEachOwnerToTheLeastLoadedServerNotLeaving) {
  Placement p;
  p.LayOut(4, /*started=*/3, /*replicas=*/0, 1);  // server 0 serves owners 0 and 3
  Placement::Servers servers = Live(4, 1, p.epoch());
  servers[3].live = false;  // never joined
  servers[0].leaving = true;
  EXPECT_THAT(p.Remove(0), ElementsAre(0, 3));
  Placement::Progress step = p.Advance(servers, kT0, kLimit);
  ASSERT_EQ(step.kind, Placement::Progress::kStarted);
  EXPECT_EQ(step.move.owner, 0);
  EXPECT_EQ(step.move.from, 0);
  EXPECT_EQ(step.move.to, 1);  // servers 1 and 2 serve one owner each: the first
}

TEST(PlacementTest, ACopyNotBuiltInTimeGivesTheMoveUpAndStopsTheRemovals) {
  Placement p;
  p.LayOut(3, /*started=*/3, /*replicas=*/0, 1);
  Placement::Servers servers = Live(3, 1, p.epoch());
  p.Remove(1);
  p.Join(2);  // queued behind: goes on
  ASSERT_EQ(p.Advance(servers, kT0, kLimit).kind, Placement::Progress::kStarted);
  servers[1].copies_building = {1};
  servers[1].shard_epoch = p.epoch();
  EXPECT_EQ(p.Advance(servers, kT0 + kLimit, kLimit).kind, Placement::Progress::kNone);
  Placement::Progress step = p.Advance(servers, kT0 + kLimit + absl::Seconds(1), kLimit);
  EXPECT_EQ(step.kind, Placement::Progress::kGivenUp);
  EXPECT_NE(step.error.find("were not copied to server"), std::string::npos) << step.error;
  EXPECT_NE(step.error.find("they stay on server 1"), std::string::npos) << step.error;
  EXPECT_EQ(p.ServedBy(1), 1);
  EXPECT_EQ(p.CopyAt(1), -1);
  EXPECT_TRUE(p.moving());  // the join
  // A move to a server that is not there is given up at once.
  servers[2].live = false;
  step = p.Advance(servers, kT0, kLimit);
  EXPECT_EQ(step.kind, Placement::Progress::kGivenUp);
  EXPECT_NE(step.error.find("one of them is not there"), std::string::npos) << step.error;
  EXPECT_FALSE(p.moving());
}

TEST(PlacementTest, AFailoverTakesOnlyCopiesBuiltOnALiveServer) {
  Placement p;
  p.LayOut(2, /*started=*/0, /*replicas=*/1, 1);  // each server backs the other up
  Placement::Servers servers = Live(2, 1, p.epoch());
  // Server 1 is lost; its copy on server 0 was registered with it: built.
  std::optional<std::vector<int>> moved = p.FailOver(1, servers);
  ASSERT_TRUE(moved.has_value());
  EXPECT_THAT(*moved, ElementsAre(1));
  EXPECT_THAT(p.served_by(), ElementsAre(0, 0));
  EXPECT_EQ(p.CopyAt(0), -1);  // it kept server 0's copies
  EXPECT_EQ(p.CopyAt(1), -1);
  // It comes back as a spare and keeps every missing copy, built anew.
  EXPECT_THAT(p.KeepMissingCopies(1), ElementsAre(0, 1));
  const int64_t named = p.epoch();
  // Server 0 is lost before it said the copies are built: no failover, and
  // nothing changes.
  servers[0].shard_epoch = named - 1;
  EXPECT_FALSE(p.FailOver(0, servers).has_value());
  servers[0].shard_epoch = named;
  servers[0].copies_building = {1};
  EXPECT_FALSE(p.FailOver(0, servers).has_value());
  EXPECT_EQ(p.epoch(), named);
  // Built, but its holder is gone too.
  servers[0].copies_building.clear();
  servers[1].live = false;
  EXPECT_FALSE(p.FailOver(0, servers).has_value());
  servers[1].live = true;
  moved = p.FailOver(0, servers);
  ASSERT_TRUE(moved.has_value());
  EXPECT_THAT(p.served_by(), ElementsAre(1, 1));
}

TEST(PlacementTest, CopiesGoToAnotherHostThenToTheServerKeepingFewest) {
  Placement p;
  p.LayOut(4, /*started=*/3, /*replicas=*/1, 1);       // owner 3 served by server 0
  Placement::Servers servers = Live(4, 2, p.epoch());  // hosts: h0 = {0, 1}, h1 = {2, 3}
  servers[3].live = false;
  const std::vector<std::pair<int, int>> named = p.AssignCopies(servers);
  // Owners 0, 1 and 3 (served on h0) -> server 2, the only live one on h1;
  // owner 2 (h1) -> server 0, the first of h0's, both keeping none.
  EXPECT_EQ(named, (std::vector<std::pair<int, int>>{{0, 2}, {1, 2}, {2, 0}, {3, 2}}));
  for (int o = 0; o < 4; ++o) EXPECT_NE(p.CopyAt(o), p.ServedBy(o));
  // Nothing to name: the map does not change.
  const int64_t epoch = p.epoch();
  EXPECT_TRUE(p.AssignCopies(servers).empty());
  EXPECT_EQ(p.epoch(), epoch);
  // Server 2 leaves: the copies it kept are gone, and named elsewhere.
  p.DropCopiesAt(2);
  servers[2].live = false;
  const std::vector<std::pair<int, int>> again = p.AssignCopies(servers);
  EXPECT_EQ(again, (std::vector<std::pair<int, int>>{{0, 1}, {1, 0}, {3, 1}}));
}

}  // namespace
}  // namespace psrt
