#include "common/key_map.h"

#include <gtest/gtest.h>

#include <map>

namespace psrt {
namespace {

TEST(KeyMapTest, CoversEveryElementOnceWithinTheLimit) {
  auto parts = PartitionVariable("emb", 10'000'001, 4, 4 << 20, 3);
  ASSERT_TRUE(parts.ok()) << parts.status();
  int64_t next = 0;
  for (const Partition& p : *parts) {
    EXPECT_EQ(p.offset, next);
    EXPECT_LE(p.num_elements * 4, 4 << 20);
    EXPECT_GT(p.num_elements, 0);
    next += p.num_elements;
  }
  EXPECT_EQ(next, 10'000'001);
  EXPECT_EQ(parts->size(), 10u);  // ceil(40000004 / 4194304)
}

TEST(KeyMapTest, SpreadsABigVariableEvenlyOverAllServers) {
  auto parts = PartitionVariable("big", 64 << 20, 4, 4 << 20, 4);  // 256 MiB
  ASSERT_TRUE(parts.ok());
  std::map<int, int64_t> bytes;
  for (const Partition& p : *parts) bytes[p.server] += p.num_elements * 4;
  ASSERT_EQ(bytes.size(), 4u);
  for (const auto& [server, b] : bytes) EXPECT_EQ(b, 64ll << 20) << "server " << server;
}

TEST(KeyMapTest, IsDeterministicAndDependsOnTheName) {
  auto a = PartitionVariable("layer1/weight", 100, 4, 4096, 7);
  auto b = PartitionVariable("layer1/weight", 100, 4, 4096, 7);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ((*a)[0].server, (*b)[0].server);
  // FNV-1a of "a" is a published constant.
  EXPECT_EQ(StableHash("a"), 0xaf63dc4c8601ec8cull);
  std::map<int, int> first_servers;
  for (int i = 0; i < 70; ++i) {
    auto p = PartitionVariable("v" + std::to_string(i), 10, 4, 4096, 7);
    ASSERT_TRUE(p.ok());
    ++first_servers[(*p)[0].server];
  }
  EXPECT_GT(first_servers.size(), 4u);  // small variables land on many servers
}

TEST(KeyMapTest, EqualSizedPartitions) {
  auto parts = PartitionVariable("x", 1025, 4, 4096, 2);  // 1024 per part max
  ASSERT_TRUE(parts.ok());
  ASSERT_EQ(parts->size(), 2u);
  EXPECT_EQ((*parts)[0].num_elements, 513);
  EXPECT_EQ((*parts)[1].num_elements, 512);
  EXPECT_NE((*parts)[0].server, (*parts)[1].server);
}

TEST(KeyMapTest, RejectsBadInput) {
  EXPECT_EQ(PartitionVariable("", 1, 4, 4096, 1).status().code(), absl::StatusCode::kInvalidArgument);
  auto s = PartitionVariable("w", 0, 4, 4096, 1).status();
  EXPECT_NE(s.message().find("'w' has 0 elements"), absl::string_view::npos) << s;
  EXPECT_FALSE(PartitionVariable("w", 10, 4, 2, 1).ok());
  EXPECT_FALSE(PartitionVariable("w", 10, 4, 4096, 0).ok());
}

TEST(KeyMapTest, KeyName) { EXPECT_EQ(KeyName("a/b", 3), "a/b#3"); }

}  // namespace
}  // namespace psrt
