#include "common/flags.h"

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "common/logging.h"
#include "gtest/gtest.h"

namespace psrt {
namespace {

// Keeps the strings alive and hands out a writable argv.
class Args {
 public:
  explicit Args(std::vector<std::string> args) : strings_(std::move(args)) {
    strings_.insert(strings_.begin(), "prog");
    for (std::string& s : strings_) ptrs_.push_back(s.data());
    ptrs_.push_back(nullptr);
  }
  int argc() const { return static_cast<int>(strings_.size()); }
  char** argv() { return ptrs_.data(); }

 private:
  std::vector<std::string> strings_;
  std::vector<char*> ptrs_;
};

#define EXPECT_HAS(haystack, needle)                                  \
  EXPECT_TRUE(absl::StrContains((haystack), (needle)))                \
      << "text: " << (haystack) << "\nwanted: " << (needle)

// One flag of each type, with non-trivial defaults.
struct Bound {
  std::string name = "alice";
  std::string empty;
  int64_t big = 7;
  int count = 3;
  double rate = 0.25;
  bool loud = false;
  bool color = true;
  Flags flags{"prog", "[flags] -- command"};

  Bound() {
    flags.Add("name", &name, "Who to greet.");
    flags.Add("empty", &empty, "Starts out empty.");
    flags.Add("big", &big, "A 64-bit count.");
    flags.Add("count", &count, "How many times.");
    flags.Add("rate", &rate, "Fraction per step.");
    flags.Add("loud", &loud, "Talk more.");
    flags.Add("color", &color, "Use colour.");
  }
  absl::Status Parse(std::vector<std::string> args) {
    Args a(std::move(args));
    return flags.Parse(a.argc(), a.argv());
  }
};

TEST(FlagsTest, NoArgumentsKeepsDefaults) {
  Bound b;
  ASSERT_TRUE(b.Parse({}).ok());
  EXPECT_EQ(b.name, "alice");
  EXPECT_EQ(b.big, 7);
  EXPECT_EQ(b.count, 3);
  EXPECT_EQ(b.rate, 0.25);
  EXPECT_FALSE(b.loud);
  EXPECT_TRUE(b.color);
  EXPECT_FALSE(b.flags.help_requested());
  EXPECT_TRUE(b.flags.command().empty());
}

TEST(FlagsTest, EqualsForm) {
  Bound b;
  absl::Status s = b.Parse({"--count=11", "--big=-9000000000", "--rate=1.5e-3",
                            "--name=bob", "--loud=true", "--color=false"});
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(b.count, 11);
  EXPECT_EQ(b.big, -9000000000);
  EXPECT_EQ(b.rate, 1.5e-3);
  EXPECT_EQ(b.name, "bob");
  EXPECT_TRUE(b.loud);
  EXPECT_FALSE(b.color);
}

TEST(FlagsTest, SpaceForm) {
  Bound b;
  absl::Status s = b.Parse({"--count", "12", "--big", "9000000001", "--rate", "-2.5",
                            "--name", "carol"});
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(b.count, 12);
  EXPECT_EQ(b.big, 9000000001);
  EXPECT_EQ(b.rate, -2.5);
  EXPECT_EQ(b.name, "carol");
}

TEST(FlagsTest, SpaceFormTakesTheNextArgumentVerbatim) {
  Bound b;
  ASSERT_TRUE(b.Parse({"--name", "--not-a-flag", "--count", "-4"}).ok());
  EXPECT_EQ(b.name, "--not-a-flag");
  EXPECT_EQ(b.count, -4);
}

TEST(FlagsTest, ValueMayContainEqualsAndBeEmpty) {
  Bound b;
  ASSERT_TRUE(b.Parse({"--name=a=b=c"}).ok());
  EXPECT_EQ(b.name, "a=b=c");
  ASSERT_TRUE(b.Parse({"--name="}).ok());
  EXPECT_EQ(b.name, "");
}

TEST(FlagsTest, LaterValueWins) {
  Bound b;
  ASSERT_TRUE(b.Parse({"--count=1", "--count", "2"}).ok());
  EXPECT_EQ(b.count, 2);
}

TEST(FlagsTest, Bools) {
  {
    Bound b;
    ASSERT_TRUE(b.Parse({"--loud"}).ok());
    EXPECT_TRUE(b.loud);
  }
  {
    Bound b;
    ASSERT_TRUE(b.Parse({"--color=false"}).ok());
    EXPECT_FALSE(b.color);
    ASSERT_TRUE(b.Parse({"--color"}).ok());
    EXPECT_TRUE(b.color);
    ASSERT_TRUE(b.Parse({"--color=0"}).ok());
    EXPECT_FALSE(b.color);
    ASSERT_TRUE(b.Parse({"--color=1"}).ok());
    EXPECT_TRUE(b.color);
  }
  {
    // A bare bool does not eat the next argument.
    Bound b;
    ASSERT_TRUE(b.Parse({"--loud", "--count=5"}).ok());
    EXPECT_TRUE(b.loud);
    EXPECT_EQ(b.count, 5);
  }
  {
    Bound b;
    absl::Status s = b.Parse({"--loud=maybe"});
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_HAS(s.message(), "--loud");
    EXPECT_HAS(s.message(), "maybe");
  }
}

TEST(FlagsTest, UnknownFlagListsAcceptedFlags) {
  Bound b;
  absl::Status s = b.Parse({"--colour=true"});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_HAS(s.message(), "--colour");
  for (const char* f : {"--name", "--empty", "--big", "--count", "--rate", "--loud",
                        "--color"}) {
    EXPECT_HAS(s.message(), f);
  }
  // The space form too, and nothing after it is parsed.
  Bound c;
  s = c.Parse({"--nope", "--count=9"});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_HAS(s.message(), "--nope");
}

TEST(FlagsTest, BadNumbersNameTheFlag) {
  struct Case {
    std::vector<std::string> args;
    const char* flag;
  };
  for (const Case& c : std::vector<Case>{
           {{"--count=abc"}, "--count"},
           {{"--count=1.5"}, "--count"},
           {{"--count", "12x"}, "--count"},
           {{"--count=99999999999"}, "--count"},  // over int's range
           {{"--count="}, "--count"},
           {{"--big=1e3"}, "--big"},
           {{"--big=99999999999999999999"}, "--big"},  // over int64's range
           {{"--rate=fast"}, "--rate"},
           {{"--rate", "1.0.0"}, "--rate"},
           {{"--rate="}, "--rate"},
       }) {
    Bound b;
    absl::Status s = b.Parse(c.args);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.args[0] << ": " << s;
    EXPECT_HAS(s.message(), c.flag);
  }
  Bound b;
  absl::Status s = b.Parse({"--count=abc"});
  EXPECT_HAS(s.message(), "'abc'");
}

TEST(FlagsTest, MissingValue) {
  for (const char* flag : {"--count", "--big", "--rate", "--name"}) {
    Bound b;
    absl::Status s = b.Parse({"--loud", flag});
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << flag << ": " << s;
    EXPECT_HAS(s.message(), flag);
    EXPECT_HAS(s.message(), "needs a value");
  }
}

TEST(FlagsTest, PositionalArgumentBeforeDashDashIsRejected) {
  Bound b;
  absl::Status s = b.Parse({"--count=1", "stray"});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_HAS(s.message(), "stray");
}

TEST(FlagsTest, CommandAfterDashDashIsKeptVerbatim) {
  Bound b;
  absl::Status s = b.Parse({"--count=2", "--", "python3", "train.py", "--count=100",
                            "--help", "--", "-x", "--unknown", ""});
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(b.count, 2);  // the command's --count is not ours
  EXPECT_FALSE(b.flags.help_requested());
  EXPECT_EQ(b.flags.command(),
            (std::vector<std::string>{"python3", "train.py", "--count=100", "--help", "--",
                                      "-x", "--unknown", ""}));
}

TEST(FlagsTest, DashDashAloneGivesEmptyCommand) {
  Bound b;
  ASSERT_TRUE(b.Parse({"--loud", "--"}).ok());
  EXPECT_TRUE(b.loud);
  EXPECT_TRUE(b.flags.command().empty());
}

TEST(FlagsTest, HelpIsRequestedAndListsEveryFlag) {
  for (const char* help : {"--help", "-h"}) {
    Bound b;
    absl::Status s = b.Parse({"--count=4", help, "--loud"});
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_TRUE(b.flags.help_requested()) << help;
    EXPECT_EQ(b.count, 4);
    EXPECT_TRUE(b.loud);
  }
  Bound b;
  const std::string text = b.flags.Help();
  EXPECT_HAS(text, "prog");
  EXPECT_HAS(text, "[flags] -- command");
  EXPECT_HAS(text, "--name\n      Who to greet. (default: \"alice\")\n");
  EXPECT_HAS(text, "--empty\n      Starts out empty.\n");
  EXPECT_HAS(text, "--big\n      A 64-bit count. (default: 7)\n");
  EXPECT_HAS(text, "--count\n      How many times. (default: 3)\n");
  EXPECT_HAS(text, "--rate\n      Fraction per step. (default: 0.25)\n");
  EXPECT_HAS(text, "--loud\n      Talk more. (default: false)\n");
  EXPECT_HAS(text, "--color\n      Use colour. (default: true)\n");
  EXPECT_HAS(text, "--help");
  // Flags appear in the order they were added.
  EXPECT_LT(text.find("--name"), text.find("--empty"));
  EXPECT_LT(text.find("--empty"), text.find("--big"));
  EXPECT_LT(text.find("--rate"), text.find("--loud"));
  EXPECT_LT(text.find("--loud"), text.find("--color"));
}

TEST(FlagsTest, HelpShowsDefaultsAsAdded) {
  // The default is the value at Add() time, not after parsing.
  Bound b;
  ASSERT_TRUE(b.Parse({"--count=42"}).ok());
  EXPECT_HAS(b.flags.Help(), "How many times. (default: 3)");
}

TEST(FlagsTest, AFlagBeforeTheSeparatorNeedsAValue) {
  Bound b;
  absl::Status s = b.Parse({"--name", "--", "cmd"});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_HAS(s.message(), "--name needs a value");
}

TEST(FlagsTest, ABadValueLeavesTheFlagAsItWas) {
  Bound b;
  EXPECT_FALSE(b.Parse({"--rate=abc"}).ok());
  EXPECT_EQ(b.rate, 0.25);
  EXPECT_FALSE(b.Parse({"--count=99999999999"}).ok());
  EXPECT_EQ(b.count, 3);
}

// PSRT_LOG_LEVEL set (or unset) for one test, then as it was.
class ScopedLogEnv {
 public:
  explicit ScopedLogEnv(const char* value) {
    const char* old = std::getenv("PSRT_LOG_LEVEL");
    had_ = old != nullptr;
    if (had_) old_ = old;
    if (value != nullptr) {
      setenv("PSRT_LOG_LEVEL", value, 1);
    } else {
      unsetenv("PSRT_LOG_LEVEL");
    }
  }
  ~ScopedLogEnv() {
    if (had_) {
      setenv("PSRT_LOG_LEVEL", old_.c_str(), 1);
    } else {
      unsetenv("PSRT_LOG_LEVEL");
    }
    SetLogLevel(LogLevelFromEnv().value_or(LogLevel::kWarning));
  }

 private:
  bool had_ = false;
  std::string old_;
};

TEST(FlagsTest, EveryProgramTakesALogLevel) {
  ScopedLogEnv env(nullptr);
  Bound b;
  ASSERT_TRUE(b.Parse({}).ok());
  EXPECT_EQ(CurrentLogLevel(), LogLevel::kWarning) << "the default";
  ASSERT_TRUE(b.Parse({"--log-level=debug"}).ok());
  EXPECT_EQ(CurrentLogLevel(), LogLevel::kDebug);
  ASSERT_TRUE(b.Parse({"--log-level", "error", "--", "cmd"}).ok());
  EXPECT_EQ(CurrentLogLevel(), LogLevel::kError) << "set before the command";
  Bound verbose;
  ASSERT_TRUE(verbose.Parse({"--verbose"}).ok());
  EXPECT_EQ(CurrentLogLevel(), LogLevel::kInfo);
  EXPECT_HAS(b.flags.Help(), "--log-level\n");
  EXPECT_HAS(b.flags.Help(), "--verbose\n");
}

TEST(FlagsTest, TheEnvironmentsLevelYieldsToTheFlag) {
  ScopedLogEnv env("info");
  Bound b;
  ASSERT_TRUE(b.Parse({}).ok());
  EXPECT_EQ(CurrentLogLevel(), LogLevel::kInfo);
  Bound flagged;
  ASSERT_TRUE(flagged.Parse({"--log-level=warning"}).ok());
  EXPECT_EQ(CurrentLogLevel(), LogLevel::kWarning);
}

TEST(FlagsTest, ALevelThatNamesNoneIsRefusedNamingWhereItCameFrom) {
  ScopedLogEnv env(nullptr);
  SetLogLevel(LogLevel::kInfo);
  Bound b;
  absl::Status s = b.Parse({"--log-level=loud"});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_HAS(s.message(), "--log-level: 'loud' is no log level: error, warning, info or debug");
  EXPECT_EQ(CurrentLogLevel(), LogLevel::kInfo) << "a refused flag changes nothing";
  {
    ScopedLogEnv bad("chatty");
    Bound fromenv;
    s = fromenv.Parse({});
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_HAS(s.message(), "PSRT_LOG_LEVEL: 'chatty' is no log level");
    Bound overridden;
    EXPECT_TRUE(overridden.Parse({"--verbose"}).ok()) << "the flag wins over the environment";
  }
}

}  // namespace
}  // namespace psrt
