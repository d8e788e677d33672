// The rates a worker knows the servers hold (worker/learning_rates.h).
#include "worker/learning_rates.h"

#include "gtest/gtest.h"

namespace psrt {
namespace {

TEST(LearningRatesTest, ARegisteredRateIsHeldAndOnlyAChangeIsSent) {
  LearningRates rates;
  EXPECT_FALSE(rates.Held("w", 0.1));  // never registered
  EXPECT_FALSE(rates.Held("", 0.1));   // nothing registered: send
  rates.Registered("w", 0.1, /*known=*/true);
  rates.Registered("b", 0.1, /*known=*/true);
  EXPECT_TRUE(rates.Held("w", 0.1));
  EXPECT_TRUE(rates.Held("", 0.1));
  EXPECT_FALSE(rates.Held("w", 0.05));
  rates.Sent("b", 0.05);
  EXPECT_TRUE(rates.Held("b", 0.05));
  EXPECT_FALSE(rates.Held("", 0.1));  // b's differs
  EXPECT_FALSE(rates.Held("", 0.05));
  rates.Sent("", 0.02);
  EXPECT_TRUE(rates.Held("", 0.02));
  EXPECT_TRUE(rates.Held("w", 0.02));
  EXPECT_TRUE(rates.Held("b", 0.02));
}

TEST(LearningRatesTest, AnUnknownRateIsSentOnceThenHeld) {
  LearningRates rates;
  rates.Registered("w", 0.1, /*known=*/true);
  // Restored, or joined a running job: the servers may hold another rate.
  rates.Registered("t", 0.1, /*known=*/false);
  EXPECT_FALSE(rates.Held("t", 0.1));
  EXPECT_FALSE(rates.Held("", 0.1));
  rates.Sent("t", 0.1);
  EXPECT_TRUE(rates.Held("", 0.1));
  rates.Registered("t", 0.1, /*known=*/false);  // registered again
  EXPECT_FALSE(rates.Held("", 0.1));
  rates.Sent("", 0.1);
  EXPECT_TRUE(rates.Held("t", 0.1));
}

TEST(LearningRatesTest, ATableSetByNameStaysOutOfEveryVariablesRate) {
  LearningRates rates;
  rates.Registered("w", 0.1, /*known=*/true);
  rates.Sent("table", 0.5);  // never registered here: a table
  EXPECT_FALSE(rates.Held("table", 0.5));
  EXPECT_TRUE(rates.Held("", 0.1));
  rates.Sent("", 0.2);  // the dense variables' rate leaves the table's alone
  EXPECT_FALSE(rates.Held("table", 0.2));
  EXPECT_TRUE(rates.Held("w", 0.2));
}

}  // namespace
}  // namespace psrt
