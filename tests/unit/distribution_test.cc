#include "common/distribution.h"

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace psrt {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr char kAllPsKeys[] =
    "enabled, mode, staleness, backup_workers, compression, pull_compression, transport, "
    "servers_per_host, max_servers, server_port_base, workers_per_host, local_aggregation, "
    "partition_bytes, "
    "gradient_aggregation, on_worker_failure, restart_workers, "
    "replicas, nonfinite, on_failure, max_recoveries, host_wait_s, heartbeat_timeout_s, "
    "barrier_timeout_s, restore, checkpoint, elastic, limits";

PsOptions ParseOk(const std::string& json) {
  absl::StatusOr<PsOptions> result = ParseDistribution(json);
  EXPECT_TRUE(result.ok()) << json << " -> " << result.status();
  return result.ok() ? *result : PsOptions();
}

// Returns the error message, after checking it is an InvalidArgument error.
std::string ParseError(const std::string& json) {
  absl::StatusOr<PsOptions> result = ParseDistribution(json);
  EXPECT_FALSE(result.ok()) << json << " unexpectedly parsed";
  if (result.ok()) return "";
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument)
      << result.status();
  return std::string(result.status().message());
}

std::string Ps(const std::string& body) {
  return "{\"parameter_server\": {" + body + "}}";
}

void ExpectDefaults(const PsOptions& o) {
  EXPECT_EQ(o.mode, "sync");
  EXPECT_EQ(o.staleness, 0);
  EXPECT_EQ(o.backup_workers, 0);
  EXPECT_EQ(o.compression, "none");
  EXPECT_EQ(o.pull_compression, "none");
  EXPECT_EQ(o.transport, "auto");
  EXPECT_EQ(o.servers_per_host, 1);
  EXPECT_EQ(o.workers_per_host, 1);
  EXPECT_EQ(o.partition_bytes, 256 << 10);
  EXPECT_EQ(o.gradient_aggregation, "mean");
  EXPECT_EQ(o.on_worker_failure, "fail");
  EXPECT_EQ(o.restart_workers, 0);
  EXPECT_EQ(o.on_failure, "fail");
  EXPECT_EQ(o.nonfinite, "skip");
  EXPECT_EQ(o.max_recoveries, 3);
  EXPECT_DOUBLE_EQ(o.host_wait_s, 60);
  EXPECT_DOUBLE_EQ(o.heartbeat_timeout_s, 10);
  EXPECT_DOUBLE_EQ(o.barrier_timeout_s, 60);
  EXPECT_EQ(o.restore, "");
  EXPECT_EQ(o.checkpoint.uri, "");
  EXPECT_EQ(o.checkpoint.every_steps, 0);
  EXPECT_DOUBLE_EQ(o.checkpoint.every_seconds, 0);
  EXPECT_EQ(o.checkpoint.keep, 0);
}

TEST(ParseDistributionTest, EmptyObjectIsDisabledWithDefaults) {
  const PsOptions o = ParseOk("{}");
  EXPECT_FALSE(o.enabled);
  ExpectDefaults(o);
}

TEST(ParseDistributionTest, EnabledTrueKeepsDefaults) {
  const PsOptions o = ParseOk(R"({"parameter_server": {"enabled": true}})");
  EXPECT_TRUE(o.enabled);
  ExpectDefaults(o);
}

TEST(ParseDistributionTest, EnabledFalse) {
  const PsOptions o = ParseOk(R"({"parameter_server": {"enabled": false}})");
  EXPECT_FALSE(o.enabled);
  ExpectDefaults(o);
}

TEST(ParseDistributionTest, MissingEnabledMeansDisabledAsInSageMaker) {
  EXPECT_FALSE(ParseOk(R"({"parameter_server": {}})").enabled);
  EXPECT_FALSE(ParseOk(Ps(R"("mode": "async")")).enabled);
}

TEST(ParseDistributionTest, WhitespaceAroundJsonIsFine) {
  EXPECT_TRUE(
      ParseOk(" \n{ \"parameter_server\" : { \"enabled\" : true } }\n ")
          .enabled);
}

TEST(ParseDistributionTest, EveryKeySet) {
  const PsOptions o = ParseOk(R"({"parameter_server": {
      "enabled": true,
      "mode": "sync",
      "backup_workers": 2,
      "compression": "fp16",
      "pull_compression": "bf16",
      "transport": "tcp",
      "servers_per_host": 3,
      "workers_per_host": 8,
      "partition_bytes": 65536,
      "gradient_aggregation": "sum",
      "on_worker_failure": "continue",
      "restart_workers": 4,
      "heartbeat_timeout_s": 2.5,
      "barrier_timeout_s": 120,
      "restore": "latest",
      "checkpoint": {"uri": "s3://bucket/ckpt", "every_steps": 1000,
                     "every_seconds": 600.5, "keep": 3}
  }})");
  EXPECT_TRUE(o.enabled);
  EXPECT_EQ(o.mode, "sync");
  EXPECT_EQ(o.backup_workers, 2);
  EXPECT_EQ(o.compression, "fp16");
  EXPECT_EQ(o.pull_compression, "bf16");
  EXPECT_EQ(o.transport, "tcp");
  EXPECT_EQ(o.servers_per_host, 3);
  EXPECT_EQ(o.workers_per_host, 8);
  EXPECT_EQ(o.partition_bytes, 65536);
  EXPECT_EQ(o.gradient_aggregation, "sum");
  EXPECT_EQ(o.on_worker_failure, "continue");
  EXPECT_EQ(o.restart_workers, 4);
  EXPECT_DOUBLE_EQ(o.heartbeat_timeout_s, 2.5);
  EXPECT_DOUBLE_EQ(o.barrier_timeout_s, 120);
  EXPECT_EQ(o.restore, "latest");
  EXPECT_EQ(o.checkpoint.uri, "s3://bucket/ckpt");
  EXPECT_EQ(o.checkpoint.every_steps, 1000);
  EXPECT_DOUBLE_EQ(o.checkpoint.every_seconds, 600.5);
  EXPECT_EQ(o.checkpoint.keep, 3);
}

TEST(ParseDistributionTest, SspWithStaleness) {
  const PsOptions o =
      ParseOk(Ps(R"("enabled": true, "mode": "ssp", "staleness": 3)"));
  EXPECT_EQ(o.mode, "ssp");
  EXPECT_EQ(o.staleness, 3);
}

TEST(ParseDistributionTest, AsyncMode) {
  EXPECT_EQ(ParseOk(Ps(R"("mode": "async")")).mode, "async");
}

TEST(ParseDistributionTest, BackupWorkersWithDefaultSyncMode) {
  EXPECT_EQ(ParseOk(Ps(R"("backup_workers": 1)")).backup_workers, 1);
}

TEST(ParseDistributionTest, AllCompressionValues) {
  for (const char* c : {"none", "fp16", "bf16"}) {
    const PsOptions o = ParseOk(Ps(std::string("\"compression\": \"") + c +
                                   "\", \"pull_compression\": \"" + c + "\""));
    EXPECT_EQ(o.compression, c);
    EXPECT_EQ(o.pull_compression, c);
  }
}

TEST(ParseDistributionTest, PartitionBytesBounds) {
  EXPECT_EQ(ParseOk(Ps(R"("partition_bytes": 4096)")).partition_bytes, 4096);
  EXPECT_EQ(ParseOk(Ps(R"("partition_bytes": 67108864)")).partition_bytes,
            67108864);
  EXPECT_THAT(ParseError(Ps(R"("partition_bytes": 4092)")),
              AllOf(HasSubstr("'partition_bytes'"), HasSubstr("4096"),
                    HasSubstr("67108864"), HasSubstr("4092")));
  EXPECT_THAT(ParseError(Ps(R"("partition_bytes": 67108868)")),
              AllOf(HasSubstr("'partition_bytes'"), HasSubstr("67108864")));
  EXPECT_THAT(ParseError(Ps(R"("partition_bytes": 4098)")),
              AllOf(HasSubstr("'partition_bytes'"),
                    HasSubstr("multiple of 4")));
}

TEST(ParseDistributionTest, ServerPortBaseLeavesRoomForEveryServerOfAHost) {
  EXPECT_EQ(ParseOk(Ps("")).server_port_base, 0);
  EXPECT_EQ(ParseOk(Ps(R"("server_port_base": 7100)")).server_port_base, 7100);
  // Two servers: gRPC ports 65532 and 65533, data ports 65534 and 65535.
  EXPECT_EQ(ParseOk(Ps(R"("server_port_base": 65532, "servers_per_host": 2)")).server_port_base,
            65532);
  EXPECT_THAT(ParseError(Ps(R"("server_port_base": 65533, "servers_per_host": 2)")),
              AllOf(HasSubstr("'server_port_base' 65533"), HasSubstr("65535")));
  EXPECT_THAT(ParseError(Ps(R"("server_port_base": 70000)")), HasSubstr("'server_port_base'"));
  EXPECT_THAT(ParseError(Ps(R"("server_port_base": -1)")), HasSubstr("'server_port_base'"));
}

TEST(ParseDistributionTest, RecoverNeedsCheckpointsAndSaysWhatIsAccepted) {
  const PsOptions o = ParseOk(Ps(
      R"("on_failure": "recover", "max_recoveries": 5, "host_wait_s": 30,
         "checkpoint": {"uri": "/tmp/x", "every_steps": 50})"));
  EXPECT_EQ(o.on_failure, "recover");
  EXPECT_EQ(o.max_recoveries, 5);
  EXPECT_DOUBLE_EQ(o.host_wait_s, 30);
  EXPECT_THAT(ParseError(Ps(R"("on_failure": "recover")")),
              AllOf(HasSubstr("'on_failure' is 'recover'"),
                    HasSubstr("'checkpoint.uri' is empty")));
  // Replicas alone are enough to recover from (the start, when nothing
  // else is left).
  EXPECT_EQ(ParseOk(Ps(R"("on_failure": "recover", "replicas": 1)")).replicas, 1);
  EXPECT_THAT(ParseError(Ps(R"("replicas": 2)")),
              AllOf(HasSubstr("'replicas'"), HasSubstr("1")));
  // Servers joining and leaving a running job.
  EXPECT_EQ(ParseOk(Ps(R"("max_servers": 8)")).max_servers, 8);
  EXPECT_EQ(ParseOk(Ps("")).max_servers, 0);
  EXPECT_THAT(ParseError(Ps(R"("max_servers": -1)")), HasSubstr("'max_servers'"));
  EXPECT_THAT(ParseError(Ps(R"("max_servers": 5000)")), HasSubstr("'max_servers'"));
  // Servers joining and leaving keep their keys' copies (docs/runtime.md).
  const PsOptions both = ParseOk(Ps(R"("max_servers": 4, "replicas": 1)"));
  EXPECT_EQ(both.max_servers, 4);
  EXPECT_EQ(both.replicas, 1);
  EXPECT_THAT(ParseError(Ps(R"("on_failure": "restart")")),
              AllOf(HasSubstr("'on_failure'"), HasSubstr("fail, recover")));
  EXPECT_THAT(
      ParseError(Ps(R"("on_failure": "recover", "max_recoveries": -1,
                       "checkpoint": {"uri": "/tmp/x"})")),
      AllOf(HasSubstr("'max_recoveries'"), HasSubstr(">= 0")));
  EXPECT_THAT(ParseError(Ps(R"("max_recoveries": 2)")),
              HasSubstr("only apply when 'on_failure' is 'recover'"));
  EXPECT_THAT(
      ParseError(Ps(R"("on_failure": "recover", "host_wait_s": 0,
                       "checkpoint": {"uri": "/tmp/x"})")),
      AllOf(HasSubstr("'host_wait_s'"), HasSubstr("> 0")));
}

TEST(ParseDistributionTest, ElasticTakesMinAndMaxWorkersInSyncMode) {
  const PsOptions o =
      ParseOk(Ps(R"("elastic": {"min_workers": 2, "max_workers": 8})"));
  EXPECT_EQ(o.elastic_min_workers, 2);
  EXPECT_EQ(o.elastic_max_workers, 8);
  EXPECT_EQ(ParseOk(Ps("")).elastic_min_workers, 0);
  EXPECT_THAT(ParseError(Ps(R"("elastic": {"min_workers": 3, "max_workers": 2})")),
              HasSubstr("must be at least 'elastic.min_workers' (3)"));
  EXPECT_THAT(ParseError(Ps(R"("elastic": {"min_workers": 0, "max_workers": 2})")),
              AllOf(HasSubstr("'elastic.min_workers'"), HasSubstr(">= 1")));
  EXPECT_THAT(ParseError(Ps(R"("elastic": {"min_workers": 1})")),
              HasSubstr("needs both 'min_workers' and 'max_workers'"));
  EXPECT_THAT(ParseError(Ps(R"("elastic": {"min": 1, "max_workers": 2})")),
              AllOf(HasSubstr("unknown key 'min'"), HasSubstr("min_workers, max_workers")));
  EXPECT_THAT(ParseError(Ps(R"("elastic": 4)")), HasSubstr("'elastic'"));
  EXPECT_THAT(ParseError(Ps(R"("mode": "async", "elastic": {"min_workers": 1, "max_workers": 2})")),
              HasSubstr("'elastic' applies when 'mode' is 'sync'"));
  EXPECT_THAT(ParseError(Ps(R"("on_worker_failure": "fail", "elastic": {"min_workers": 1, "max_workers": 2})")),
              HasSubstr("remove 'on_worker_failure' and 'backup_workers'"));
}

TEST(ParseDistributionTest, LimitsAreBoundedAndNamed) {
  const PsOptions d = ParseOk(Ps(""));
  EXPECT_EQ(d.limits.max_server_bytes, 0);
  EXPECT_EQ(d.limits.max_calls_per_worker, 64);
  EXPECT_DOUBLE_EQ(d.limits.max_pull_wait_s, 600);
  const PsOptions o = ParseOk(Ps(
      R"("limits": {"max_server_bytes": 8589934592, "max_variables": 10,
                    "max_keys_per_variable": 100, "max_calls_per_worker": 4,
                    "max_pull_wait_s": 30})"));
  EXPECT_EQ(o.limits.max_server_bytes, 8589934592);
  EXPECT_EQ(o.limits.max_variables, 10);
  EXPECT_EQ(o.limits.max_keys_per_variable, 100);
  EXPECT_EQ(o.limits.max_calls_per_worker, 4);
  EXPECT_DOUBLE_EQ(o.limits.max_pull_wait_s, 30);
  EXPECT_THAT(ParseError(Ps(R"("limits": {"max_calls_per_worker": 0})")),
              AllOf(HasSubstr("'limits.max_calls_per_worker'"), HasSubstr(">= 1")));
  EXPECT_THAT(ParseError(Ps(R"("limits": {"max_pull_wait_s": -1})")),
              HasSubstr("'limits.max_pull_wait_s'"));
  EXPECT_THAT(ParseError(Ps(R"("limits": {"max_bytes": 1})")),
              AllOf(HasSubstr("unknown key 'max_bytes'"), HasSubstr("max_server_bytes")));
}

TEST(ParseDistributionTest, SecondsAcceptIntegersAndFractions) {
  const PsOptions o =
      ParseOk(Ps(R"("heartbeat_timeout_s": 1, "barrier_timeout_s": 0.25)"));
  EXPECT_DOUBLE_EQ(o.heartbeat_timeout_s, 1);
  EXPECT_DOUBLE_EQ(o.barrier_timeout_s, 0.25);
}

TEST(ParseDistributionTest, TimeoutsMustBePositive) {
  EXPECT_THAT(ParseError(Ps(R"("heartbeat_timeout_s": 0)")),
              AllOf(HasSubstr("'heartbeat_timeout_s'"), HasSubstr("> 0")));
  EXPECT_THAT(ParseError(Ps(R"("barrier_timeout_s": -1.5)")),
              AllOf(HasSubstr("'barrier_timeout_s'"), HasSubstr("> 0")));
  EXPECT_THAT(ParseError(Ps(R"("heartbeat_timeout_s": "10")")),
              HasSubstr("'heartbeat_timeout_s' must be a number, got string"));
}

TEST(ParseDistributionTest, RestoreForms) {
  const std::string ckpt = R"(, "checkpoint": {"uri": "/ckpt"})";
  EXPECT_EQ(ParseOk(Ps(R"("restore": "latest")" + ckpt)).restore, "latest");
  EXPECT_EQ(ParseOk(Ps(R"("restore": "1200")" + ckpt)).restore, "1200");
  EXPECT_EQ(ParseOk(Ps(R"("restore": 1200)" + ckpt)).restore, "1200");
  EXPECT_EQ(ParseOk(Ps(R"("restore": "s3://b/run1/step-5")")).restore,
            "s3://b/run1/step-5");
  EXPECT_EQ(ParseOk(Ps(R"("restore": "/opt/ml/checkpoints/5")")).restore,
            "/opt/ml/checkpoints/5");
  EXPECT_EQ(ParseOk(Ps(R"("restore": "")")).restore, "");
}

TEST(ParseDistributionTest, RestoreRejectsTyposAndBadTypes) {
  EXPECT_THAT(ParseError(Ps(R"("restore": "latset")")),
              AllOf(HasSubstr("'restore'"), HasSubstr("latest"),
                    HasSubstr("step number"), HasSubstr("'latset'")));
  EXPECT_THAT(ParseError(Ps(R"("restore": -3)")),
              AllOf(HasSubstr("'restore'"), HasSubstr(">= 0")));
  EXPECT_THAT(ParseError(Ps(R"("restore": true)")),
              HasSubstr("'restore' must be a string"));
}

TEST(ParseDistributionTest, RestoreFromCheckpointDirNeedsCheckpointUri) {
  EXPECT_THAT(ParseError(Ps(R"("restore": "latest")")),
              AllOf(HasSubstr("'restore'"), HasSubstr("checkpoint.uri")));
  EXPECT_THAT(ParseError(Ps(R"("restore": 7)")),
              HasSubstr("checkpoint.uri"));
}

TEST(ParseDistributionTest, CheckpointIntervalsNeedUri) {
  EXPECT_THAT(ParseError(Ps(R"("checkpoint": {"every_steps": 10})")),
              AllOf(HasSubstr("checkpoint.every_steps"),
                    HasSubstr("checkpoint.uri")));
  EXPECT_THAT(ParseError(Ps(R"("checkpoint": {"every_seconds": 60})")),
              HasSubstr("checkpoint.uri"));
  // keep alone, or a uri alone, is fine.
  EXPECT_EQ(ParseOk(Ps(R"("checkpoint": {"keep": 2})")).checkpoint.keep, 2);
  EXPECT_EQ(ParseOk(Ps(R"("checkpoint": {"uri": "s3://x"})")).checkpoint.uri,
            "s3://x");
  EXPECT_EQ(ParseOk(Ps(R"("checkpoint": {})")).checkpoint.uri, "");
}

TEST(ParseDistributionTest, LargeEveryStepsFitsInt64) {
  EXPECT_EQ(ParseOk(Ps(R"("checkpoint": {"uri": "/c",
                                          "every_steps": 5000000000})"))
                .checkpoint.every_steps,
            5000000000LL);
}

// ---- Errors ----------------------------------------------------------------

TEST(ParseDistributionErrorTest, InvalidJsonIncludesParserMessage) {
  for (const char* bad : {"", "{", "{\"parameter_server\": }", "nope",
                          "{\"parameter_server\": {\"enabled\": true,}}",
                          "{} trailing"}) {
    EXPECT_THAT(ParseError(bad), AllOf(HasSubstr("invalid --distribution JSON"),
                                       HasSubstr("parse error")))
        << "input: " << bad;
  }
}

TEST(ParseDistributionErrorTest, DuplicateKeyRejected) {
  EXPECT_THAT(
      ParseError(Ps(R"("mode": "sync", "mode": "async")")),
      AllOf(HasSubstr("invalid --distribution JSON"),
            HasSubstr("duplicate key 'mode'")));
}

TEST(ParseDistributionErrorTest, TopLevelNotObject) {
  EXPECT_THAT(ParseError("[]"),
              AllOf(HasSubstr("must be a JSON object"), HasSubstr("array")));
  EXPECT_THAT(ParseError("\"parameter_server\""),
              AllOf(HasSubstr("must be a JSON object"), HasSubstr("string")));
  EXPECT_THAT(ParseError("null"), HasSubstr("must be a JSON object"));
}

TEST(ParseDistributionErrorTest, UnknownTopLevelKey) {
  EXPECT_THAT(ParseError(R"({"mpi": {"enabled": true}})"),
              AllOf(HasSubstr("unknown top-level key 'mpi'"),
                    HasSubstr("accepted keys: parameter_server")));
}

TEST(ParseDistributionErrorTest, ParameterServerNotObject) {
  EXPECT_THAT(ParseError(R"({"parameter_server": true})"),
              AllOf(HasSubstr("'parameter_server' must be an object"),
                    HasSubstr("{\"enabled\": true}"),
                    HasSubstr("got boolean true")));
}

TEST(ParseDistributionErrorTest, UnknownKeyListsAcceptedKeys) {
  EXPECT_THAT(
      ParseError(Ps(R"("enabled": true, "foo": 1)")),
      HasSubstr(std::string("unknown key 'foo' in parameter_server; accepted "
                            "keys: ") +
                kAllPsKeys));
}

TEST(ParseDistributionErrorTest, UnknownKeySuggestsCloseMatch) {
  EXPECT_THAT(ParseError(Ps(R"("stalenes": 1)")),
              AllOf(HasSubstr("unknown key 'stalenes' in parameter_server"),
                    HasSubstr("Did you mean 'staleness'?")));
  EXPECT_THAT(ParseError(Ps(R"("zzzzzzzz": 1)")),
              ::testing::Not(HasSubstr("Did you mean")));
}

TEST(ParseDistributionErrorTest, WrongTypes) {
  struct Case {
    std::string body;
    std::string message;
  };
  const std::vector<Case> cases = {
      {R"("enabled": "true")",
       "'enabled' must be a boolean (true or false), got string \"true\""},
      {R"("enabled": 1)", "'enabled' must be a boolean"},
      {R"("mode": "ssp", "staleness": "2")",
       "'staleness' must be an integer, got string \"2\""},
      {R"("mode": "ssp", "staleness": 2.5)",
       "'staleness' must be an integer, got number 2.5"},
      {R"("backup_workers": null)",
       "'backup_workers' must be an integer, got null"},
      {R"("mode": 1)", "'mode' must be a string, one of sync, async, ssp"},
      {R"("compression": false)",
       "'compression' must be a string, one of none, fp16, bf16"},
      {R"("pull_compression": [])",
       "'pull_compression' must be a string, one of none, fp16, bf16, got "
       "array"},
      {R"("transport": "shm")", "'transport' must be one of auto, tcp, grpc; got 'shm'"},
      {R"("servers_per_host": "1")", "'servers_per_host' must be an integer"},
      {R"("workers_per_host": 1.0)", "'workers_per_host' must be an integer"},
      {R"("partition_bytes": "4MB")", "'partition_bytes' must be an integer"},
      {R"("gradient_aggregation": {})",
       "'gradient_aggregation' must be a string, one of mean, sum"},
      {R"("on_worker_failure": true)",
       "'on_worker_failure' must be a string, one of fail, continue"},
      {R"("restart_workers": "3")", "'restart_workers' must be an integer"},
      {R"("barrier_timeout_s": "60s")", "'barrier_timeout_s' must be a number"},
      {R"("checkpoint": "s3://x")",
       "'checkpoint' must be an object, got string"},
      {R"("checkpoint": {"uri": 5})", "'checkpoint.uri' must be a string"},
      {R"("checkpoint": {"uri": "/c", "every_steps": "10"})",
       "'checkpoint.every_steps' must be an integer"},
      {R"("checkpoint": {"uri": "/c", "every_seconds": "1m"})",
       "'checkpoint.every_seconds' must be a number"},
      {R"("checkpoint": {"keep": 1.5})",
       "'checkpoint.keep' must be an integer"},
  };
  for (const Case& c : cases) {
    EXPECT_THAT(ParseError(Ps(c.body)), HasSubstr(c.message)) << c.body;
  }
}

TEST(ParseDistributionErrorTest, BadEnumValues) {
  EXPECT_THAT(ParseError(Ps(R"("mode": "bsp")")),
              HasSubstr("'mode' must be one of sync, async, ssp; got 'bsp'"));
  EXPECT_THAT(ParseError(Ps(R"("mode": "SYNC")")),
              HasSubstr("'mode' must be one of sync, async, ssp; got 'SYNC'"));
  EXPECT_THAT(
      ParseError(Ps(R"("compression": "int8")")),
      HasSubstr("'compression' must be one of none, fp16, bf16; got 'int8'"));
  EXPECT_THAT(ParseError(Ps(R"("pull_compression": "fp32")")),
              HasSubstr("'pull_compression' must be one of none, fp16, bf16; "
                        "got 'fp32'"));
  EXPECT_THAT(ParseError(Ps(R"("gradient_aggregation": "avg")")),
              HasSubstr("'gradient_aggregation' must be one of mean, sum; got "
                        "'avg'"));
  EXPECT_THAT(ParseError(Ps(R"("on_worker_failure": "ignore")")),
              HasSubstr("'on_worker_failure' must be one of fail, continue; "
                        "got 'ignore'"));
}

TEST(ParseDistributionErrorTest, OutOfRangeIntegers) {
  struct Case {
    std::string body;
    std::string key;
    std::string bound;
  };
  const std::vector<Case> cases = {
      {R"("mode": "ssp", "staleness": -1)", "'staleness'", ">= 0"},
      {R"("backup_workers": -2)", "'backup_workers'", ">= 0"},
      {R"("servers_per_host": 0)", "'servers_per_host'", ">= 1"},
      {R"("workers_per_host": 0)", "'workers_per_host'", ">= 1"},
      {R"("restart_workers": -1)", "'restart_workers'", ">= 0"},
      // Larger than int: must not wrap around.
      {R"("workers_per_host": 3000000000)", "'workers_per_host'",
       "at most 2147483647"},
      {R"("restart_workers": 18446744073709551615)", "'restart_workers'",
       "at most 2147483647"},
      {R"("checkpoint": {"uri": "/c", "every_steps": 18446744073709551615})",
       "'checkpoint.every_steps'", "at most 9223372036854775807"},
      {R"("checkpoint": {"keep": -1})", "'checkpoint.keep'", ">= 0"},
      {R"("checkpoint": {"uri": "/c", "every_steps": -5})",
       "'checkpoint.every_steps'", ">= 0"},
      {R"("checkpoint": {"uri": "/c", "every_seconds": -5})",
       "'checkpoint.every_seconds'", ">= 0"},
  };
  for (const Case& c : cases) {
    EXPECT_THAT(ParseError(Ps(c.body)), AllOf(HasSubstr(c.key),
                                              HasSubstr(c.bound)))
        << c.body;
  }
}

TEST(ParseDistributionErrorTest, StalenessOnlyWithSsp) {
  EXPECT_THAT(ParseError(Ps(R"("mode": "async", "staleness": 2)")),
              AllOf(HasSubstr("'staleness'"), HasSubstr("'ssp'"),
                    HasSubstr("'async'")));
  EXPECT_THAT(ParseError(Ps(R"("staleness": 2)")),
              AllOf(HasSubstr("'staleness'"), HasSubstr("'ssp'"),
                    HasSubstr("'sync' (the default)")));
}

// On by default where it applies, off with the reason elsewhere; asked for
// where it cannot apply, refused naming why.
TEST(ParseDistributionTest, LocalAggregationWhereAHostsPushesCanBeOne) {
  struct Case {
    const char* body;
    const char* off;  // "": on
  };
  const Case cases[] = {
      {R"("workers_per_host": 4)", ""},
      {R"("workers_per_host": 4, "compression": "fp16", "replicas": 1)", ""},
      {R"("workers_per_host": 1)", "one training process per host"},
      {R"("workers_per_host": 4, "local_aggregation": false)", "false"},
      {R"("workers_per_host": 4, "mode": "async")", "async"},
      {R"("workers_per_host": 4, "mode": "ssp", "staleness": 1)", "ssp"},
      {R"("workers_per_host": 4, "backup_workers": 1)", "backup workers"},
      {R"("workers_per_host": 4, "elastic": {"min_workers": 2, "max_workers": 4})", "elastic"},
      {R"("workers_per_host": 4, "on_worker_failure": "continue")", "continue"},
      {R"("workers_per_host": 4, "restart_workers": 2)", "restart"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<PsOptions> o = ParseDistribution(Ps(c.body));
    ASSERT_TRUE(o.ok()) << c.body << ": " << o.status();
    const std::string off = LocalAggregationOff(*o);
    if (*c.off == '\0') {
      EXPECT_EQ(off, "") << c.body;
    } else {
      EXPECT_THAT(off, HasSubstr(c.off)) << c.body;
    }
  }
  EXPECT_THAT(
      ParseError(Ps(R"("workers_per_host": 4, "local_aggregation": true, "mode": "async")")),
      AllOf(HasSubstr("'local_aggregation'"), HasSubstr("async")));
  EXPECT_THAT(
      ParseError(Ps(R"("workers_per_host": 2, "local_aggregation": true, "backup_workers": 1)")),
      AllOf(HasSubstr("'local_aggregation'"), HasSubstr("backup workers")));
  EXPECT_TRUE(ParseDistribution(Ps(R"("workers_per_host": 2, "local_aggregation": true)")).ok());
}

TEST(ParseDistributionErrorTest, BackupWorkersOnlyWithSync) {
  EXPECT_THAT(ParseError(Ps(R"("mode": "async", "backup_workers": 1)")),
              AllOf(HasSubstr("'backup_workers'"), HasSubstr("'sync'"),
                    HasSubstr("'async'")));
  EXPECT_THAT(
      ParseError(Ps(R"("mode": "ssp", "staleness": 1, "backup_workers": 0)")),
      AllOf(HasSubstr("'backup_workers'"), HasSubstr("'ssp'")));
}

TEST(ParseDistributionErrorTest, UnknownCheckpointKey) {
  EXPECT_THAT(
      ParseError(Ps(R"("checkpoint": {"uri": "/c", "every": 10})")),
      HasSubstr("unknown key 'every' in checkpoint; accepted keys: uri, "
                "every_steps, every_seconds, keep"));
}

TEST(ParseDistributionErrorTest, ValidatesEvenWhenDisabled) {
  EXPECT_THAT(ParseError(Ps(R"("enabled": false, "mode": "bsp")")),
              HasSubstr("'mode'"));
}

// ---- Help ------------------------------------------------------------------

TEST(DistributionHelpTest, OneLinePerKeyWithTypeAndDefault) {
  const std::string help = DistributionHelp();
  std::vector<std::string> lines =
      absl::StrSplit(help, '\n', absl::SkipEmpty());
  // parameter_server + 26 keys inside it + 4 checkpoint.* keys.
  ASSERT_EQ(lines.size(), 32u) << help;
  for (const std::string& line : lines) {
    EXPECT_THAT(line, HasSubstr("default")) << line;
  }
  const std::vector<std::string> expected = {"parameter_server",
                                             "enabled",
                                             "mode",
                                             "staleness",
                                             "backup_workers",
                                             "compression",
                                             "pull_compression",
                                             "transport",
                                             "servers_per_host",
                                             "max_servers",
                                             "server_port_base",
                                             "workers_per_host",
                                             "local_aggregation",
                                             "partition_bytes",
                                             "gradient_aggregation",
                                             "on_worker_failure",
                                             "restart_workers",
                                             "replicas",
                                             "nonfinite",
                                             "on_failure",
                                             "max_recoveries",
                                             "host_wait_s",
                                             "heartbeat_timeout_s",
                                             "barrier_timeout_s",
                                             "restore",
                                             "checkpoint",
                                             "elastic",
                                             "limits",
                                             "checkpoint.uri",
                                             "checkpoint.every_steps",
                                             "checkpoint.every_seconds",
                                             "checkpoint.keep"};
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_THAT(lines[i], HasSubstr(expected[i] + " ")) << lines[i];
  }
  EXPECT_THAT(lines[2], AllOf(HasSubstr("string"), HasSubstr("\"sync\""),
                              HasSubstr("ssp")));
  EXPECT_THAT(lines[13], AllOf(HasSubstr("int"), HasSubstr("262144")));
  EXPECT_THAT(lines[12], AllOf(HasSubstr("bool"), HasSubstr("default true")));
  EXPECT_THAT(lines[22], AllOf(HasSubstr("number"), HasSubstr("10")));
}

}  // namespace
}  // namespace psrt
