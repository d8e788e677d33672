#include "common/cluster.h"

#include <functional>
#include <initializer_list>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace psrt {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Stands in for the process environment so tests neither read nor modify it.
class FakeEnv {
 public:
  FakeEnv() = default;
  FakeEnv(std::initializer_list<std::pair<const std::string, std::string>> vars)
      : vars_(vars) {}

  void Set(const std::string& name, const std::string& value) {
    vars_[name] = value;
  }

  std::function<const char*(const char*)> Getenv() const {
    return [this](const char* name) -> const char* {
      auto it = vars_.find(name);
      return it == vars_.end() ? nullptr : it->second.c_str();
    };
  }

 private:
  std::map<std::string, std::string> vars_;
};

ClusterSpec ResolveOk(absl::string_view hosts, absl::string_view current,
                      const FakeEnv& env) {
  absl::StatusOr<ClusterSpec> spec =
      ResolveCluster(hosts, current, env.Getenv());
  EXPECT_TRUE(spec.ok()) << spec.status();
  return spec.ok() ? *spec : ClusterSpec();
}

std::string ResolveError(absl::string_view hosts, absl::string_view current,
                         const FakeEnv& env) {
  absl::StatusOr<ClusterSpec> spec =
      ResolveCluster(hosts, current, env.Getenv());
  EXPECT_FALSE(spec.ok()) << "unexpectedly resolved";
  if (spec.ok()) return "";
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(spec.status().message());
}

const char kTfConfig[] = R"({
  "cluster": {
    "ps": ["ps0:2222", "h1:2223"],
    "worker": ["h1:2222", "h2:2222", "h2:2224"],
    "chief": ["c0:2222"]
  },
  "task": {"type": "worker", "index": 1},
  "environment": "cloud"
})";

// ---- local ----------------------------------------------------------------

TEST(ResolveClusterTest, NothingSetMeansLocalhost) {
  const ClusterSpec spec = ResolveOk("", "", FakeEnv());
  EXPECT_THAT(spec.hosts, ElementsAre("localhost"));
  EXPECT_EQ(spec.current, 0);
  EXPECT_EQ(spec.source, "local");
}

TEST(ResolveClusterTest, EmptyEnvValuesCountAsUnset) {
  const ClusterSpec spec = ResolveOk(
      "", "", FakeEnv({{"SM_HOSTS", ""}, {"TF_CONFIG", "  "}}));
  EXPECT_EQ(spec.source, "local");
}

// ---- --hosts ----------------------------------------------------------------

TEST(ResolveClusterTest, FlagHostsWithCurrentName) {
  const ClusterSpec spec = ResolveOk("h1,h2,h3", "h2", FakeEnv());
  EXPECT_THAT(spec.hosts, ElementsAre("h1", "h2", "h3"));
  EXPECT_EQ(spec.current, 1);
  EXPECT_EQ(spec.source, "--hosts");
}

TEST(ResolveClusterTest, FlagHostsWithCurrentIndex) {
  EXPECT_EQ(ResolveOk("h1,h2,h3", "2", FakeEnv()).current, 2);
  EXPECT_EQ(ResolveOk("h1,h2,h3", "0", FakeEnv()).current, 0);
}

TEST(ResolveClusterTest, FlagHostsTrimsWhitespace) {
  const ClusterSpec spec = ResolveOk(" h1 , h2 ", " h2 ", FakeEnv());
  EXPECT_THAT(spec.hosts, ElementsAre("h1", "h2"));
  EXPECT_EQ(spec.current, 1);
}

TEST(ResolveClusterTest, NumericHostNameMatchesByNameFirst) {
  // "1" is the name of the host at index 2, not index 1.
  EXPECT_EQ(ResolveOk("10.0.0.1,0,1", "1", FakeEnv()).current, 2);
}

TEST(ResolveClusterTest, SingleFlagHostNeedsNoCurrent) {
  const ClusterSpec spec = ResolveOk("only", "", FakeEnv());
  EXPECT_THAT(spec.hosts, ElementsAre("only"));
  EXPECT_EQ(spec.current, 0);
}

TEST(ResolveClusterTest, FlagHostsErrors) {
  EXPECT_THAT(ResolveError("h1,h2", "", FakeEnv()),
              AllOf(HasSubstr("--hosts"), HasSubstr("--current"),
                    HasSubstr("0..1")));
  EXPECT_THAT(ResolveError("h1,h2", "h3", FakeEnv()),
              AllOf(HasSubstr("--current"), HasSubstr("'h3'"),
                    HasSubstr("not in --hosts"), HasSubstr("h1, h2")));
  EXPECT_THAT(ResolveError("h1,h2", "2", FakeEnv()),
              AllOf(HasSubstr("--current"), HasSubstr("out of range"),
                    HasSubstr("0..1")));
  EXPECT_THAT(ResolveError("h1,,h2", "h1", FakeEnv()),
              AllOf(HasSubstr("--hosts"), HasSubstr("#2"),
                    HasSubstr("empty")));
  EXPECT_THAT(ResolveError("h1,h2,", "h1", FakeEnv()),
              AllOf(HasSubstr("--hosts"), HasSubstr("empty")));
  EXPECT_THAT(ResolveError("h1,h2,h1", "h1", FakeEnv()),
              AllOf(HasSubstr("--hosts"), HasSubstr("duplicate host 'h1'")));
  EXPECT_THAT(ResolveError("h1,h 2", "h1", FakeEnv()),
              AllOf(HasSubstr("--hosts"), HasSubstr("whitespace")));
}

TEST(ResolveClusterTest, CurrentWithoutHostsIsAnError) {
  EXPECT_THAT(ResolveError("", "h1", FakeEnv({{"SM_HOSTS", "[\"h1\"]"},
                                              {"SM_CURRENT_HOST", "h1"}})),
              AllOf(HasSubstr("--current"), HasSubstr("without --hosts")));
}

// ---- SM_HOSTS ---------------------------------------------------------------

TEST(ResolveClusterTest, SageMakerHosts) {
  const ClusterSpec spec = ResolveOk(
      "", "",
      FakeEnv({{"SM_HOSTS", R"(["algo-1","algo-2","algo-3"])"},
               {"SM_CURRENT_HOST", "algo-3"}}));
  EXPECT_THAT(spec.hosts, ElementsAre("algo-1", "algo-2", "algo-3"));
  EXPECT_EQ(spec.current, 2);
  EXPECT_EQ(spec.source, "SM_HOSTS");
}

TEST(ResolveClusterTest, SageMakerErrors) {
  struct Case {
    std::string sm_hosts;
    const char* sm_current;  // nullptr: unset
    std::vector<std::string> substrings;
  };
  const std::vector<Case> cases = {
      {R"(["algo-1")", "algo-1", {"SM_HOSTS", "invalid", "parse error"}},
      {R"({"algo-1": 1})", "algo-1", {"SM_HOSTS", "JSON list", "object"}},
      {R"([])", "algo-1", {"SM_HOSTS", "empty list"}},
      {R"(["algo-1", 2])", "algo-1", {"SM_HOSTS", "entry 1", "string"}},
      {R"(["algo-1", ""])", "algo-1", {"SM_HOSTS", "entry 1", "empty"}},
      {R"(["algo-1", "algo-1"])", "algo-1",
       {"SM_HOSTS", "duplicate host 'algo-1'"}},
      {R"(["algo-1", "algo-2"])", nullptr,
       {"SM_HOSTS", "SM_CURRENT_HOST is not"}},
      {R"(["algo-1", "algo-2"])", "algo-9",
       {"SM_CURRENT_HOST", "'algo-9'", "not in SM_HOSTS", "algo-1, algo-2"}},
  };
  for (const Case& c : cases) {
    FakeEnv env({{"SM_HOSTS", c.sm_hosts}});
    if (c.sm_current != nullptr) env.Set("SM_CURRENT_HOST", c.sm_current);
    const std::string message = ResolveError("", "", env);
    for (const std::string& s : c.substrings) {
      EXPECT_THAT(message, HasSubstr(s)) << c.sm_hosts;
    }
  }
}

// ---- TF_CONFIG --------------------------------------------------------------

TEST(ResolveClusterTest, TfConfigOrdersChiefWorkerPsAndDedupsHosts) {
  const ClusterSpec spec =
      ResolveOk("", "", FakeEnv({{"TF_CONFIG", kTfConfig}}));
  EXPECT_THAT(spec.hosts, ElementsAre("c0", "h1", "h2", "ps0"));
  EXPECT_EQ(spec.current, 2);  // worker[1] is on h2.
  EXPECT_EQ(spec.source, "TF_CONFIG");
}

TEST(ResolveClusterTest, TfConfigTaskTypes) {
  const std::string cluster =
      R"("cluster": {"chief": ["c0:1"], "worker": ["w0:1", "w1:1"],
                     "ps": ["p0:1", "w0:2"]})";
  const auto current = [&](const std::string& task) {
    const FakeEnv env({{"TF_CONFIG", "{" + cluster + ", " + task + "}"}});
    return ResolveOk("", "", env).current;
  };
  EXPECT_EQ(current(R"("task": {"type": "chief", "index": 0})"), 0);
  EXPECT_EQ(current(R"("task": {"type": "worker", "index": 0})"), 1);
  EXPECT_EQ(current(R"("task": {"type": "worker", "index": 1})"), 2);
  EXPECT_EQ(current(R"("task": {"type": "ps", "index": 0})"), 3);
  EXPECT_EQ(current(R"("task": {"type": "ps", "index": 1})"), 1);
}

TEST(ResolveClusterTest, TfConfigHostsWithoutPortsAndIpv6) {
  const ClusterSpec spec = ResolveOk(
      "", "",
      FakeEnv({{"TF_CONFIG",
                R"({"cluster": {"worker": ["a", "[::1]:2222", "10.0.0.5:80"]},
                    "task": {"type": "worker", "index": 1}})"}}));
  EXPECT_THAT(spec.hosts, ElementsAre("a", "[::1]", "10.0.0.5"));
  EXPECT_EQ(spec.current, 1);
}

TEST(ResolveClusterTest, TfConfigErrors) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {R"({"cluster": )", {"TF_CONFIG", "invalid", "parse error"}},
      {R"([1])", {"TF_CONFIG", "JSON object", "array"}},
      {R"({"task": {"type": "worker", "index": 0}})",
       {"TF_CONFIG", "'cluster'"}},
      {R"({"cluster": {"evaluator": ["e:1"]},
           "task": {"type": "worker", "index": 0}})",
       {"TF_CONFIG", "unknown job 'evaluator'", "chief, worker, ps"}},
      {R"({"cluster": {"worker": "h1:1"},
           "task": {"type": "worker", "index": 0}})",
       {"TF_CONFIG", "cluster.worker", "list"}},
      {R"({"cluster": {"worker": ["h1:1", 7]},
           "task": {"type": "worker", "index": 0}})",
       {"TF_CONFIG", "cluster.worker[1]", "string"}},
      {R"({"cluster": {"worker": [":2222"]},
           "task": {"type": "worker", "index": 0}})",
       {"TF_CONFIG", "cluster.worker[0]", "empty host name"}},
      {R"({"cluster": {"worker": ["h1:1", "h1:1"]},
           "task": {"type": "worker", "index": 0}})",
       {"TF_CONFIG", "duplicate address 'h1:1'"}},
      {R"({"cluster": {}, "task": {"type": "worker", "index": 0}})",
       {"TF_CONFIG", "no hosts"}},
      {R"({"cluster": {"worker": ["h1:1"]}})", {"TF_CONFIG", "'task'"}},
      {R"({"cluster": {"worker": ["h1:1"]}, "task": {"index": 0}})",
       {"TF_CONFIG", "task.type"}},
      {R"({"cluster": {"worker": ["h1:1"]},
           "task": {"type": "evaluator", "index": 0}})",
       {"TF_CONFIG", "task type 'evaluator' is unknown", "chief, worker, ps"}},
      {R"({"cluster": {"worker": ["h1:1"]}, "task": {"type": "worker"}})",
       {"TF_CONFIG", "task.index", "integer"}},
      {R"({"cluster": {"worker": ["h1:1"]},
           "task": {"type": "worker", "index": "0"}})",
       {"TF_CONFIG", "task.index", "integer"}},
      {R"({"cluster": {"worker": ["h1:1"]},
           "task": {"type": "worker", "index": 1}})",
       {"TF_CONFIG", "index 1", "out of range", "'worker'", "1 task"}},
      {R"({"cluster": {"worker": ["h1:1"]},
           "task": {"type": "worker", "index": -1}})",
       {"TF_CONFIG", "index -1", "out of range"}},
      {R"({"cluster": {"worker": ["h1:1"]},
           "task": {"type": "ps", "index": 0}})",
       {"TF_CONFIG", "out of range", "'ps'", "0 task"}},
  };
  for (const auto& [tf_config, substrings] : cases) {
    const std::string message =
        ResolveError("", "", FakeEnv({{"TF_CONFIG", tf_config}}));
    for (const std::string& s : substrings) {
      EXPECT_THAT(message, HasSubstr(s)) << tf_config;
    }
  }
}

// ---- precedence -------------------------------------------------------------

TEST(ResolveClusterTest, FlagsBeatSageMakerAndTfConfig) {
  const FakeEnv env({{"SM_HOSTS", R"(["algo-1"])"},
                     {"SM_CURRENT_HOST", "algo-1"},
                     {"TF_CONFIG", kTfConfig}});
  const ClusterSpec spec = ResolveOk("x,y", "y", env);
  EXPECT_EQ(spec.source, "--hosts");
  EXPECT_THAT(spec.hosts, ElementsAre("x", "y"));
  EXPECT_EQ(spec.current, 1);
}

TEST(ResolveClusterTest, SageMakerBeatsTfConfig) {
  const FakeEnv env({{"SM_HOSTS", R"(["algo-1","algo-2"])"},
                     {"SM_CURRENT_HOST", "algo-1"},
                     {"TF_CONFIG", kTfConfig}});
  const ClusterSpec spec = ResolveOk("", "", env);
  EXPECT_EQ(spec.source, "SM_HOSTS");
  EXPECT_EQ(spec.current, 0);
}

TEST(ResolveClusterTest, BrokenLowerPrioritySourceIsNotRead) {
  // A higher-priority source decides; junk further down does not matter.
  const FakeEnv env({{"SM_HOSTS", R"(["algo-1"])"},
                     {"SM_CURRENT_HOST", "algo-1"},
                     {"TF_CONFIG", "{not json"}});
  EXPECT_EQ(ResolveOk("", "", env).source, "SM_HOSTS");
  EXPECT_EQ(ResolveOk("h", "", FakeEnv({{"SM_HOSTS", "junk"}})).source,
            "--hosts");
}

TEST(ResolveClusterTest, SmCurrentHostAloneDoesNotSelectSageMaker) {
  const FakeEnv env(
      {{"SM_CURRENT_HOST", "algo-1"}, {"TF_CONFIG", kTfConfig}});
  EXPECT_EQ(ResolveOk("", "", env).source, "TF_CONFIG");
}

TEST(ResolveClusterTest, OneOfSeveralMpiProcessesWithoutHostsIsRefused) {
  EXPECT_THAT(ResolveError("", "", FakeEnv({{"OMPI_COMM_WORLD_SIZE", "4"}})),
              AllOf(HasSubstr("one of 4 that MPI started (OMPI_COMM_WORLD_SIZE=4)"),
                    HasSubstr("each would train alone")));
  EXPECT_THAT(ResolveError("", "", FakeEnv({{"PMI_SIZE", "2"}})), HasSubstr("PMI_SIZE=2"));
  // One rank is a job of one; a host list says what the job is.
  EXPECT_EQ(ResolveOk("", "", FakeEnv({{"OMPI_COMM_WORLD_SIZE", "1"}})).source, "local");
  EXPECT_EQ(ResolveOk("a,b", "a", FakeEnv({{"OMPI_COMM_WORLD_SIZE", "2"}})).source, "--hosts");
}

}  // namespace
}  // namespace psrt
