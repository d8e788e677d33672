#include "common/net.h"

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace psrt {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

TEST(InterfaceAddressTest, LoopbackIs127001) {
  absl::StatusOr<std::string> lo = InterfaceAddress("lo");
  ASSERT_TRUE(lo.ok()) << lo.status();
  EXPECT_EQ(*lo, "127.0.0.1");
}

TEST(InterfaceAddressTest, AnUnknownInterfaceNamesTheOnesThereAre) {
  absl::StatusOr<std::string> none = InterfaceAddress("psrt-no-such0");
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(none.status().message(),
              AllOf(HasSubstr("'psrt-no-such0'"), HasSubstr("it has"), HasSubstr("lo")));
}

TEST(HostOfTest, StripsPortsAndBrackets) {
  EXPECT_EQ(HostOf("algo-1:7070"), "algo-1");
  EXPECT_EQ(HostOf("10.0.0.5:1"), "10.0.0.5");
  EXPECT_EQ(HostOf("[::1]:7070"), "::1");
  EXPECT_EQ(HostOf("::1"), "::1");
  EXPECT_EQ(HostOf("algo-1"), "algo-1");
}

TEST(WaitForHostNameTest, AddressesAndLocalhostResolveAtOnce) {
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  EXPECT_TRUE(WaitForHostName("127.0.0.1:7070", deadline, "the coordinator").ok());
  EXPECT_TRUE(WaitForHostName("[::1]:7070", deadline, "the coordinator").ok());
  EXPECT_TRUE(WaitForHostName("localhost:7070", deadline, "the coordinator").ok());
}

TEST(WaitForHostNameTest, ANameThatNeverResolvesIsAnErrorNamingItAfterTheDeadline) {
  // .invalid never resolves (RFC 6761).
  absl::Status s = WaitForHostName("algo-9.psrt.invalid:7070",
                                   absl::Now() + absl::Milliseconds(700), "the coordinator");
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("'algo-9.psrt.invalid'"),
                                 HasSubstr("of the coordinator did not resolve within")));
}

}  // namespace
}  // namespace psrt
