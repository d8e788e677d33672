#include "common/slurm.h"

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/cluster.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace psrt {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

using Env = std::map<std::string, std::string>;

std::function<const char*(const char*)> Getenv(const Env& env) {
  return [&env](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  };
}

std::string ListError(const std::string& list) {
  absl::StatusOr<std::vector<std::string>> hosts = ExpandSlurmHostList(list);
  EXPECT_FALSE(hosts.ok()) << list << " expanded";
  if (hosts.ok()) return "";
  EXPECT_EQ(hosts.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(hosts.status().message());
}

TEST(SlurmHostList, ExpandsRangesAndKeepsPadding) {
  EXPECT_THAT(*ExpandSlurmHostList("gpu-[01-04,07]"),
              ElementsAre("gpu-01", "gpu-02", "gpu-03", "gpu-04", "gpu-07"));
  EXPECT_THAT(*ExpandSlurmHostList("n[1-2],login"), ElementsAre("n1", "n2", "login"));
  EXPECT_THAT(*ExpandSlurmHostList("n[8-11]"), ElementsAre("n8", "n9", "n10", "n11"));
  EXPECT_THAT(*ExpandSlurmHostList("n[098-101]"), ElementsAre("n098", "n099", "n100", "n101"));
  EXPECT_THAT(*ExpandSlurmHostList("solo"), ElementsAre("solo"));
  EXPECT_THAT(*ExpandSlurmHostList("a[3],b[1-2]-ib"), ElementsAre("a3", "b1-ib", "b2-ib"));
}

TEST(SlurmHostList, SeveralBracketsGiveEveryCombination) {
  EXPECT_THAT(*ExpandSlurmHostList("r[1-2]n[1-2]"), ElementsAre("r1n1", "r1n2", "r2n1", "r2n2"));
}

TEST(SlurmHostList, RefusesBadInputNamingIt) {
  EXPECT_THAT(ListError("n[1-2"), HasSubstr("'[' without ']'"));
  EXPECT_THAT(ListError("n1-2]"), HasSubstr("']' without '['"));
  EXPECT_THAT(ListError("n[1-[2]]"), HasSubstr("nested '['"));
  EXPECT_THAT(ListError("n[5-3]"), HasSubstr("range '5-3' is reversed"));
  EXPECT_THAT(ListError("n1,,n2"), HasSubstr("item 2 is empty"));
  EXPECT_THAT(ListError("n1,"), HasSubstr("item 2 is empty"));
  EXPECT_THAT(ListError(""), HasSubstr("item 1 is empty"));
  EXPECT_THAT(ListError("n[]"), HasSubstr("empty range"));
  EXPECT_THAT(ListError("n[1,]"), HasSubstr("empty range"));
  EXPECT_THAT(ListError("n[a-b]"), HasSubstr("range 'a-b'"));
  EXPECT_THAT(ListError("n[1-]"), HasSubstr("range '1-'"));
  EXPECT_THAT(ListError("[1-2]"), HasSubstr("item 1 has no name"));
  EXPECT_THAT(ListError("n[1-2],n2"), HasSubstr("names 'n2' twice"));
  EXPECT_THAT(ListError("n 1"), HasSubstr("whitespace"));
  EXPECT_THAT(ListError("n[0-999999999]"), HasSubstr("more than 65536 names"));
  EXPECT_THAT(ListError("n[1-9999999999]"), HasSubstr("at most 9 digits"));
  // Each range alone is allowed, their product is not.
  EXPECT_THAT(ListError("r[0-999]n[0-999]"), HasSubstr("more than 65536 hosts"));
}

TEST(SlurmCounts, ExpandsRepeats) {
  EXPECT_THAT(*ExpandSlurmCounts("2(x3),1"), ElementsAre(2, 2, 2, 1));
  EXPECT_THAT(*ExpandSlurmCounts("1"), ElementsAre(1));
  for (const char* bad : {"", "x", "2(x", "2(x0)", "2(3)", "-1", "2(x1000000)"}) {
    EXPECT_FALSE(ExpandSlurmCounts(bad).ok()) << bad;
  }
}

// What slurmd gives the task of `srun -N2 --ntasks-per-node=1` on psrt-n2.
Env StepOnSecondNode() {
  return {{"SLURM_JOB_ID", "7"},
          {"SLURM_STEP_ID", "0"},
          {"SLURM_JOB_NODELIST", "psrt-n[1-2]"},
          {"SLURM_STEP_NODELIST", "psrt-n[1-2]"},
          {"SLURM_STEP_NUM_NODES", "2"},
          {"SLURM_STEP_TASKS_PER_NODE", "1(x2)"},
          {"SLURM_NODEID", "1"},
          {"SLURMD_NODENAME", "psrt-n2"}};
}

TEST(ClusterFromSlurm, StepGivesHostsAndThisNode) {
  Env env = StepOnSecondNode();
  env["SLURM_GPUS_ON_NODE"] = "8";
  absl::StatusOr<ClusterSpec> spec = ResolveCluster("", "", Getenv(env));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->source, "Slurm");
  EXPECT_THAT(spec->hosts, ElementsAre("psrt-n1", "psrt-n2"));
  EXPECT_EQ(spec->current, 1);
  EXPECT_EQ(spec->gpus_per_host, 8);
}

TEST(ClusterFromSlurm, NodeIdWhenNoNodeName) {
  Env env = StepOnSecondNode();
  env.erase("SLURMD_NODENAME");
  env["SLURM_NODEID"] = "0";
  absl::StatusOr<ClusterSpec> spec = ClusterFromSlurm(Getenv(env));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->current, 0);
  env["SLURM_NODEID"] = "2";
  EXPECT_THAT(ClusterFromSlurm(Getenv(env)).status().message(), HasSubstr("SLURM_NODEID: '2'"));
}

TEST(ClusterFromSlurm, ExplicitSourcesComeFirst) {
  Env env = StepOnSecondNode();
  env["SM_HOSTS"] = R"(["algo-1"])";
  env["SM_CURRENT_HOST"] = "algo-1";
  absl::StatusOr<ClusterSpec> spec = ResolveCluster("", "", Getenv(env));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->source, "SM_HOSTS");
  spec = ResolveCluster("a,b", "b", Getenv(env));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->source, "--hosts");
}

TEST(ClusterFromSlurm, RefusesSeveralTasksPerNode) {
  Env env = StepOnSecondNode();
  env["SLURM_STEP_TASKS_PER_NODE"] = "1,4";
  absl::StatusOr<ClusterSpec> spec = ClusterFromSlurm(Getenv(env));
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(spec.status().message(), HasSubstr("runs 4 tasks on node psrt-n2"));
  EXPECT_THAT(spec.status().message(), HasSubstr("srun --ntasks-per-node=1"));
  // One node, several tasks: as many jobs of one node each.
  env = {{"SLURM_JOB_ID", "7"},
         {"SLURM_STEP_ID", "0"},
         {"SLURM_STEP_NODELIST", "n1"},
         {"SLURM_STEP_TASKS_PER_NODE", "2"},
         {"SLURMD_NODENAME", "n1"}};
  EXPECT_THAT(ClusterFromSlurm(Getenv(env)).status().message(), HasSubstr("runs 2 tasks"));
}

TEST(ClusterFromSlurm, RefusesBatchScriptOfSeveralNodes) {
  const Env env = {{"SLURM_JOB_ID", "9"},
                   {"SLURM_JOB_NODELIST", "gpu-[01-04,07]"},
                   {"SLURM_JOB_NUM_NODES", "5"},
                   {"SLURMD_NODENAME", "gpu-01"}};
  absl::StatusOr<ClusterSpec> spec = ResolveCluster("", "", Getenv(env));
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(spec.status().message(), HasSubstr("outside a step of Slurm job 9"));
  EXPECT_THAT(spec.status().message(), HasSubstr("on one of its 5 nodes"));
}

TEST(ClusterFromSlurm, BatchScriptOfOneNodeIsThatNode) {
  const Env env = {{"SLURM_JOB_ID", "9"},
                   {"SLURM_JOB_NODELIST", "gpu-07"},
                   {"SLURMD_NODENAME", "gpu-07"},
                   {"SLURM_GPUS_ON_NODE", "4"}};
  absl::StatusOr<ClusterSpec> spec = ClusterFromSlurm(Getenv(env));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_THAT(spec->hosts, ElementsAre("gpu-07"));
  EXPECT_EQ(spec->gpus_per_host, 4);
}

TEST(ClusterFromSlurm, RefusesInconsistentVariables) {
  Env env = StepOnSecondNode();
  env["SLURM_STEP_NUM_NODES"] = "3";
  EXPECT_THAT(ClusterFromSlurm(Getenv(env)).status().message(),
              HasSubstr("SLURM_STEP_NUM_NODES: says 3 nodes but SLURM_STEP_NODELIST names 2"));
  env = StepOnSecondNode();
  env["SLURMD_NODENAME"] = "other";
  EXPECT_THAT(ClusterFromSlurm(Getenv(env)).status().message(),
              HasSubstr("node 'other' is not in the node list psrt-n[1-2]"));
  env = StepOnSecondNode();
  env["SLURM_STEP_NODELIST"] = "psrt-n[2-1]";
  EXPECT_THAT(ClusterFromSlurm(Getenv(env)).status().message(),
              HasSubstr("SLURM_STEP_NODELIST: psrt-n[2-1]: range '2-1' is reversed"));
  env = StepOnSecondNode();
  env.erase("SLURM_STEP_NODELIST");
  EXPECT_THAT(ClusterFromSlurm(Getenv(env)).status().message(),
              HasSubstr("SLURM_STEP_NODELIST is not"));
  env = StepOnSecondNode();
  env["SLURM_GPUS_ON_NODE"] = "many";
  EXPECT_THAT(ClusterFromSlurm(Getenv(env)).status().message(), HasSubstr("SLURM_GPUS_ON_NODE"));
}

}  // namespace
}  // namespace psrt
