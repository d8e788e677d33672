// Copyright 2024 The psrt Authors.
//
// What a job shows of itself: /metrics of real daemons as Prometheus scrapes
// them, the Grafana dashboard's queries against those metrics, and the
// timeline (PSRT_TIMELINE) a job's workers write.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_util.h"
#include "nlohmann/json.hpp"
#include "tests/integration/job_util.h"
#include "tests/integration/scrape.h"
#include "tests/integration/test_cluster.h"
#include "worker/client.h"
#include "worker/timeline.h"

namespace psrt {
namespace {

using Json = nlohmann::json;

#ifndef PSRT_SOURCE_DIR
#define PSRT_SOURCE_DIR "."
#endif

// A one-server, one-worker sync job with its /metrics on known ports and a
// checkpoint destination (so the coordinator has its checkpoint metrics);
// the test is the worker (writing a timeline to `timeline` if not empty).
struct Job {
  std::unique_ptr<testing::TestCluster> cluster;
  std::unique_ptr<Client> client;
  std::string coordinator_metrics, server_metrics;  // URLs
};

Job StartJob(const std::string& timeline = "") {
  Job job;
  const int coordinator_port = PickFreePort(), server_port = PickFreePort();
  testing::ClusterOptions o;
  o.distribution = absl::StrCat(
      R"({"parameter_server": {"enabled": true, "mode": "sync", "checkpoint": {"uri": "file://)",
      TempDir(), R"("}}})");
  o.test_workers = 0;
  o.coordinator_flags = {absl::StrCat("--metrics-port=", coordinator_port)};
  o.server_flags = {absl::StrCat("--metrics-port=", server_port)};
  absl::StatusOr<std::unique_ptr<testing::TestCluster>> cluster = testing::TestCluster::Start(o);
  EXPECT_TRUE(cluster.ok()) << cluster.status();
  if (!cluster.ok()) return job;
  job.cluster = *std::move(cluster);
  ClientOptions c;
  c.coordinator = job.cluster->coordinator_address();
  c.token = job.cluster->token();
  c.rank = 0;
  c.host = "127.0.0.1";
  c.rpc_timeout = absl::Seconds(60);
  c.timeline = timeline;
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(c);
  EXPECT_TRUE(client.ok()) << client.status();
  if (client.ok()) job.client = *std::move(client);
  job.coordinator_metrics = absl::StrCat("http://127.0.0.1:", coordinator_port, "/metrics");
  job.server_metrics = absl::StrCat("http://127.0.0.1:", server_port, "/metrics");
  return job;
}

std::map<std::string, double> ScrapeSamples(const std::string& url) {
  const ScrapeResult r = Scrape(url);
  EXPECT_EQ(r.status, 200) << url << ": " << r.error;
  return ParseSamples(r.body);
}

TEST(MetricsTest, ServerMetricsCountRealPushesExactly) {
  Job job = StartJob();
  ASSERT_NE(job.client, nullptr);
  constexpr int64_t kN = 1000;  // one key
  constexpr int kSteps = 5;
  std::vector<float> w(kN, 0.f), g(kN, 1.f);
  ASSERT_TRUE(
      job.client->RegisterVariable("w", {kN}, w.data(), DefaultOptimizer(OptimizerKind::kSgd, 0.1))
          .ok());

  std::map<std::string, double> before = ScrapeSamples(job.server_metrics);
  for (int step = 0; step < kSteps; ++step) {
    ASSERT_TRUE(job.client->Wait(job.client->PushPull({{"w", g.data(), w.data()}}, step)).ok());
  }
  std::map<std::string, double> after = ScrapeSamples(job.server_metrics);
  const std::map<std::string, double> expected_increase = {
      {"psrt_server_push_requests_total", kSteps},
      {"psrt_server_key_pushes_total", kSteps},
      {"psrt_server_bytes_in_total", kSteps * kN * 4.0},
      {"psrt_server_updates_total", kSteps},
      {"psrt_server_update_seconds_count", kSteps},
      {"psrt_server_key_pulls_total", kSteps},
      {"psrt_server_bytes_out_total", kSteps * kN * 4.0},
      {"psrt_server_pull_wait_seconds_count", kSteps},
  };
  for (const auto& [name, increase] : expected_increase) {
    ASSERT_TRUE(before.count(name) && after.count(name)) << name << " missing from a scrape";
    EXPECT_EQ(after[name] - before[name], increase) << name;
  }
  EXPECT_EQ(after["psrt_server_rejected_requests_total"], 0);

  // The coordinator hears each step with the worker's next heartbeat.
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  std::map<std::string, double> coordinator;
  do {
    coordinator = ScrapeSamples(job.coordinator_metrics);
    if (coordinator["psrt_coordinator_step"] == kSteps - 1) break;
    absl::SleepFor(absl::Milliseconds(100));
  } while (absl::Now() < deadline);
  EXPECT_EQ(coordinator["psrt_coordinator_step"], kSteps - 1);
  EXPECT_EQ(coordinator["psrt_coordinator_steps_total"], kSteps - 1);
  EXPECT_EQ(coordinator["psrt_coordinator_active_workers"], 1);
}

// The metric names a PromQL expression reads: identifiers that are neither
// functions, keywords, label names (in {...} or by/without (...)) nor in
// range selectors ([...]).
std::set<std::string> MetricNames(std::string expr) {
  for (const char* pattern : {R"(\[[^\]]*\])", R"(\{[^}]*\})", R"("[^"]*")",
                              R"(\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\))"}) {
    expr = std::regex_replace(expr, std::regex(pattern), " ");
  }
  static const std::set<std::string> kKeywords = {"by",     "without", "and",   "or",
                                                  "unless", "bool",    "offset"};
  std::set<std::string> names;
  const std::regex identifier(R"([A-Za-z_:][A-Za-z0-9_:]*)");
  for (auto it = std::sregex_iterator(expr.begin(), expr.end(), identifier);
       it != std::sregex_iterator(); ++it) {
    const size_t end = it->position() + it->length();
    const size_t next = expr.find_first_not_of(' ', end);
    const bool is_function = next != std::string::npos && expr[next] == '(';
    const bool is_number_exponent = it->position() > 0 && std::isdigit(expr[it->position() - 1]);
    if (is_function || is_number_exponent || kKeywords.count(it->str())) continue;
    names.insert(it->str());
  }
  return names;
}

TEST(MetricsTest, MetricNamesOfPromQl) {
  EXPECT_EQ(
      MetricNames(
          "histogram_quantile(0.99, sum by (le) (rate(a_bucket{job=~\"x\"}[$__rate_interval])))"),
      (std::set<std::string>{"a_bucket"}));
  EXPECT_EQ(MetricNames("sum(rate(a_sum[5m])) / sum without (instance) (rate(b_count[5m])) + 1e3"),
            (std::set<std::string>{"a_sum", "b_count"}));
}

TEST(DashboardTest, EveryQueryReadsMetricsPsrtExports) {
  Job job = StartJob();
  ASSERT_NE(job.client, nullptr);
  // Some traffic, so the scrape is that of a job at work.
  std::vector<float> w(100, 0.f), g(100, 1.f);
  ASSERT_TRUE(
      job.client->RegisterVariable("w", {100}, w.data(), DefaultOptimizer(OptimizerKind::kSgd, 0.1))
          .ok());
  ASSERT_TRUE(job.client->Wait(job.client->PushPull({{"w", g.data(), w.data()}}, 0)).ok());
  std::set<std::string> exported;
  for (const std::string& url : {job.coordinator_metrics, job.server_metrics}) {
    for (const auto& [sample, value] : ScrapeSamples(url))
      exported.insert(sample.substr(0, sample.find('{')));
  }
  ASSERT_TRUE(exported.count("psrt_coordinator_checkpoint_seconds_bucket"))
      << "no checkpoint metrics";

  const std::string path = std::string(PSRT_SOURCE_DIR) + "/deploy/grafana/psrt.json";
  const std::string text = ReadFile(path);
  ASSERT_FALSE(text.empty()) << path;
  const Json dashboard = Json::parse(text);  // throws (and fails the test) unless it is JSON
  std::set<std::string> titles;
  int queries = 0;
  for (const Json& panel : dashboard.at("panels")) {
    titles.insert(panel.at("title").get<std::string>());
    if (!panel.contains("targets")) continue;
    for (const Json& target : panel.at("targets")) {
      const std::string expr = target.at("expr").get<std::string>();
      const std::set<std::string> names = MetricNames(expr);
      EXPECT_FALSE(names.empty()) << panel.at("title") << ": " << expr;
      for (const std::string& name : names) {
        EXPECT_TRUE(exported.count(name)) << panel.at("title") << ": " << name << " (in " << expr
                                          << ") is no metric psrt exports";
        // Every read of a metric keeps to the job the dashboard's selector names.
        EXPECT_FALSE(std::regex_search(expr, std::regex("\\b" + name + R"(\b(?!\{job="\$job"\}))")))
            << panel.at("title") << ": " << name << " is read without {job=\"$job\"} in " << expr;
      }
      ++queries;
    }
  }
  EXPECT_GT(queries, 10);
  std::set<std::string> variables;
  for (const Json& variable : dashboard.at("templating").at("list")) {
    variables.insert(variable.at("name").get<std::string>());
  }
  EXPECT_EQ(variables, (std::set<std::string>{"datasource", "job"}));
  for (const char* title :
       {"Goodput", "Step time", "Staleness", "Pull waits", "Checkpoint duration", "Errors"}) {
    EXPECT_TRUE(titles.count(title)) << "no panel '" << title << "'";
  }
}

TEST(TimelineTest, FileNamesPerRank) {
  EXPECT_EQ(Timeline::PathForRank("/tmp/t.json", 0), "/tmp/t.json");
  EXPECT_EQ(Timeline::PathForRank("/tmp/t.json", 3), "/tmp/t.rank3.json");
  EXPECT_EQ(Timeline::PathForRank("trace", 1), "trace.rank1");
  EXPECT_EQ(Timeline::PathForRank("/a.b/trace", 2), "/a.b/trace.rank2");
}

// Several MiB of events from several threads: written in chunks as they
// come, one valid array at the end, nothing lost or torn.
TEST(TimelineTest, ManyEventsFromManyThreadsMakeOneValidFile) {
  const std::string path = TempDir() + "/many.json";
  absl::StatusOr<std::unique_ptr<Timeline>> timeline = Timeline::Open(path, 2);
  ASSERT_TRUE(timeline.ok()) << timeline.status();
  EXPECT_EQ((*timeline)->path(), Timeline::PathForRank(path, 2));
  constexpr int kThreads = 4, kEvents = 10000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      (*timeline)->NameTrack(t, absl::StrCat("thread \"", t, "\""));
      for (int i = 0; i < kEvents; ++i) {
        const int64_t start = (*timeline)->NowMicros();
        (*timeline)->Complete("PUSH", t, start, (*timeline)->NowMicros(),
                              absl::StrCat("\"i\":", i, ",\"key\":", JsonString("w#0 \"quoted\"")));
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  ASSERT_TRUE((*timeline)->Close().ok());
  (*timeline)->Complete("PUSH", 0, 0, 1, "");  // after Close: dropped
  const std::string text = ReadFile(Timeline::PathForRank(path, 2));
  EXPECT_GT(text.size(), size_t{2} << 20);
  Json events;
  ASSERT_NO_THROW(events = Json::parse(text));
  std::map<int64_t, int> per_track;
  int names = 0;
  for (const Json& e : events) {
    EXPECT_EQ(e.at("pid"), 2);
    if (e.at("ph") == "M") {
      names += e.at("name") == "thread_name";
      continue;
    }
    EXPECT_GE(e.at("dur").get<int64_t>(), 0);
    EXPECT_EQ(e.at("args").at("key"), "w#0 \"quoted\"");
    ++per_track[e.at("tid").get<int64_t>()];
  }
  EXPECT_EQ(names, kThreads);
  ASSERT_EQ(per_track.size(), static_cast<size_t>(kThreads));
  for (const auto& [tid, n] : per_track) EXPECT_EQ(n, kEvents) << "track " << tid;
}

// A tensor of many requests: more than the 8 a worker keeps in flight to a
// server, so requests wait for a place and take over the streams of those
// that end. A stream's requests never overlap on its track.
TEST(TimelineTest, RequestsTakeTurnsOnTheServersStreams) {
  const std::string path = TempDir() + "/timeline.json";
  Job job = StartJob(path);
  ASSERT_NE(job.client, nullptr);
  constexpr int64_t kN = int64_t{16} << 20;  // 64 MiB of float32: 16 requests of 4 MiB
  std::vector<float> w(kN, 0.f), g(kN, 1.f);
  ASSERT_TRUE(
      job.client->RegisterVariable("w", {kN}, w.data(), DefaultOptimizer(OptimizerKind::kSgd, 0.1))
          .ok());
  ASSERT_TRUE(job.client->Wait(job.client->PushPull({{"w", g.data(), w.data()}}, 0)).ok());
  job.client.reset();  // closes the timeline

  const Json events = Json::parse(ReadFile(path));
  std::map<int64_t, std::vector<std::pair<int64_t, int64_t>>> by_track;  // tid -> (ts, end)
  int requests = 0;
  for (const Json& e : events) {
    if (e.at("ph") != "X" || e.at("name") != "PUSH_PULL") continue;
    ++requests;
    const int64_t ts = e.at("ts").get<int64_t>();
    by_track[e.at("tid").get<int64_t>()].emplace_back(ts, ts + e.at("dur").get<int64_t>());
  }
  EXPECT_GT(requests, 8);
  EXPECT_EQ(by_track.size(), 8u) << "one track per stream of the one server";
  for (auto& [tid, spans] : by_track) {
    std::sort(spans.begin(), spans.end());
    for (size_t i = 1; i < spans.size(); ++i) {
      EXPECT_GE(spans[i].first, spans[i - 1].second) << "requests overlap on track " << tid;
    }
  }
}

TEST(TimelineTest, AJobsWorkersRecordTheirPushesPullsAndWaits) {
  const std::string dir = TempDir();
  constexpr int kSteps = 20;
  Proc run = Proc::Start(
      absl::StrCat("env PSRT_TIMELINE=", dir, "/timeline.json ", kBin, "/psrt-run --local=2 -- ",
                   kBin, "/psrt-example-linreg --steps=", kSteps),
      dir + "/log");
  ASSERT_EQ(run.Wait(absl::Seconds(120), "psrt-run"), 0) << run.Output();

  for (int rank = 0; rank < 2; ++rank) {
    const std::string path = Timeline::PathForRank(dir + "/timeline.json", rank);
    SCOPED_TRACE(path);
    const std::string text = ReadFile(path);
    ASSERT_FALSE(text.empty()) << "no timeline";
    Json events;
    ASSERT_NO_THROW(events = Json::parse(text)) << text.substr(0, 2000);
    ASSERT_TRUE(events.is_array());

    std::map<std::string, int> waits_by_op;
    std::map<uint64_t, int64_t> wait_end;      // PUSH_PULL handle -> end of its WAIT
    std::map<uint64_t, int64_t> requests_end;  // PUSH_PULL handle -> last end of its requests
    bool named = false;
    int pulls = 0;
    for (const Json& e : events) {
      ASSERT_EQ(e.at("pid").get<int>(), rank) << e;
      const std::string ph = e.at("ph").get<std::string>();
      if (ph == "M") {
        if (e.at("name") == "process_name")
          named = e.at("args").at("name") == absl::StrCat("worker ", rank);
        continue;
      }
      ASSERT_EQ(ph, "X") << e;
      const int64_t ts = e.at("ts").get<int64_t>(), dur = e.at("dur").get<int64_t>();
      EXPECT_GT(ts, 0) << e;
      EXPECT_GE(dur, 0) << e;
      const Json& args = e.at("args");
      EXPECT_EQ(args.at("status"), "OK") << e;
      const std::string name = e.at("name").get<std::string>();
      const uint64_t handle = args.at("handle").get<uint64_t>();
      if (name == "WAIT") {
        const std::string op = args.at("op").get<std::string>();
        ++waits_by_op[op];
        if (op == "REGISTER") {
          EXPECT_EQ(args.at("tensors").size(), 1u) << e;
        }
        if (op == "PUSH_PULL") {
          wait_end[handle] = ts + dur;
          EXPECT_EQ(args.at("tensors"), Json::array({"bias", "weight"})) << e;
          EXPECT_EQ(args.at("bytes").get<int64_t>(), (64 + 1) * 4) << e;  // --dim=64 and the bias
        }
        continue;
      }
      ASSERT_TRUE(name == "PUSH_PULL" || name == "PULL") << e;
      EXPECT_FALSE(args.at("keys").empty()) << e;
      EXPECT_GT(args.at("bytes").get<int64_t>(), 0) << e;
      EXPECT_GE(args.at("server").get<int>(), 0) << e;
      if (name == "PULL") {
        ++pulls;
        continue;
      }
      requests_end[handle] = std::max(requests_end[handle], ts + dur);
    }
    EXPECT_TRUE(named) << "no process_name metadata";
    EXPECT_EQ(waits_by_op["PUSH_PULL"], kSteps);
    EXPECT_EQ(waits_by_op["REGISTER"], 2);  // weight and bias
    EXPECT_EQ(waits_by_op["PULL"], 3);      // their first values, and the final weights
    EXPECT_GE(pulls, 3);
    // Every step's requests ended before the wait for them did.
    ASSERT_EQ(requests_end.size(), static_cast<size_t>(kSteps));
    for (const auto& [handle, end] : requests_end) {
      ASSERT_TRUE(wait_end.count(handle)) << "no WAIT for push-pull " << handle;
      EXPECT_LE(end, wait_end[handle]) << "push-pull " << handle;
    }
  }
}

}  // namespace
}  // namespace psrt
