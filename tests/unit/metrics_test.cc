// Copyright 2024 The psrt Authors.

#include "common/metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/metrics_server.h"
#include "gtest/gtest.h"
#include "tests/integration/scrape.h"

namespace psrt {
namespace {

// ---------------------------------------------------------------------------
// Metrics

TEST(CounterTest, ConcurrentAddsSumExactly) {
  Metrics metrics("psrt_test");
  constexpr int kThreads = 8;
  constexpr int kIterations = 100000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&metrics] {
      // Registration races with other threads' registration and updates.
      Counter* counter = metrics.GetCounter("ops_total", "Operations.");
      for (int i = 0; i < kIterations; ++i) counter->Add();
      counter->Add(5);
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(metrics.GetCounter("ops_total", "")->value(), int64_t{kThreads} * (kIterations + 5));
}

TEST(MetricsTest, SameNameReturnsSameObject) {
  Metrics metrics("p");
  Counter* c = metrics.GetCounter("c", "help");
  EXPECT_EQ(metrics.GetCounter("c", "other help"), c);
  Gauge* g = metrics.GetGauge("g", "help");
  EXPECT_EQ(metrics.GetGauge("g", "help"), g);
  Histogram* h = metrics.GetHistogram("h", "help", {1, 2});
  EXPECT_EQ(metrics.GetHistogram("h", "help", {2, 1}), h);
  EXPECT_NE(static_cast<void*>(c), static_cast<void*>(g));
}

TEST(HistogramTest, BoundsAreNormalized) {
  Metrics metrics("p");
  Histogram* h = metrics.GetHistogram(
      "h", "", {2, 0.5, 1, 1, std::numeric_limits<double>::infinity(), std::nan("")});
  EXPECT_EQ(h->bounds(), (std::vector<double>{0.5, 1, 2}));
  EXPECT_EQ(h->bucket_counts().size(), 4u);
}

TEST(HistogramTest, CountsPerBucket) {
  Metrics metrics("p");
  Histogram& h = *metrics.GetHistogram("h", "", {0.5, 1, 2});
  h.Observe(0.5);  // Bounds are inclusive ("le").
  h.Observe(0.75);
  h.Observe(1);
  h.Observe(-3);
  h.Observe(10);
  EXPECT_EQ(h.bucket_counts(), (std::vector<int64_t>{2, 2, 0, 1}));
  EXPECT_EQ(h.count(), 5);
  EXPECT_DOUBLE_EQ(h.sum(), 9.25);
  h.Observe(std::nan(""));  // +Inf, not the first bucket
  EXPECT_EQ(h.bucket_counts(), (std::vector<int64_t>{2, 2, 0, 2}));
  EXPECT_TRUE(std::isnan(h.sum()));
}

TEST(HistogramTest, ConcurrentObservationsAreAllCounted) {
  Metrics metrics("p");
  Histogram& h = *metrics.GetHistogram("h", "", {1, 10});
  constexpr int kThreads = 4;
  constexpr int kIterations = 50000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&h] {
      for (int i = 0; i < kIterations; ++i) h.Observe(i % 2 == 0 ? 0.5 : 4.0);
    });
  }
  for (std::thread& thread : threads) thread.join();
  constexpr int64_t kHalf = int64_t{kThreads} * kIterations / 2;
  EXPECT_EQ(h.bucket_counts(), (std::vector<int64_t>{kHalf, kHalf, 0}));
  EXPECT_EQ(h.count(), 2 * kHalf);
  EXPECT_DOUBLE_EQ(h.sum(), kHalf * 4.5);  // Exactly representable steps.
}

TEST(HistogramTest, TextBucketsAreCumulative) {
  Metrics metrics("");
  Histogram* h = metrics.GetHistogram("lat", "Latency.", {1, 2, 3});
  h->Observe(0.5);
  h->Observe(2.5);
  h->Observe(2.5);
  h->Observe(7);
  const std::string text = metrics.PrometheusText();
  EXPECT_TRUE(absl::StrContains(text, "lat_bucket{le=\"1\"} 1\n")) << text;
  EXPECT_TRUE(absl::StrContains(text, "lat_bucket{le=\"2\"} 1\n")) << text;
  EXPECT_TRUE(absl::StrContains(text, "lat_bucket{le=\"3\"} 3\n")) << text;
  EXPECT_TRUE(absl::StrContains(text, "lat_bucket{le=\"+Inf\"} 4\n")) << text;
  EXPECT_TRUE(absl::StrContains(text, "lat_count 4\n")) << text;
  EXPECT_TRUE(absl::StrContains(text, "lat_sum 12.5\n")) << text;
}

TEST(MetricsTest, ExactPrometheusText) {
  Metrics metrics("psrt_test");
  // Registered out of order to check the output is sorted by name.
  metrics.GetCounter("requests_total", "Requests served.")->Add(3);
  metrics.GetGauge("queue_depth", "Items waiting;\nback\\slash.")->Set(2.5);
  Histogram* h = metrics.GetHistogram("latency_seconds", "Request latency.", {0.1, 1});
  h->Observe(0.0625);
  h->Observe(0.5);
  h->Observe(0.5);
  h->Observe(4);
  EXPECT_EQ(metrics.PrometheusText(),
            R"(# HELP psrt_test_latency_seconds Request latency.
# TYPE psrt_test_latency_seconds histogram
psrt_test_latency_seconds_count 4
psrt_test_latency_seconds_sum 5.0625
psrt_test_latency_seconds_bucket{le="0.1"} 1
psrt_test_latency_seconds_bucket{le="1"} 3
psrt_test_latency_seconds_bucket{le="+Inf"} 4
# HELP psrt_test_queue_depth Items waiting;\nback\\slash.
# TYPE psrt_test_queue_depth gauge
psrt_test_queue_depth 2.5
# HELP psrt_test_requests_total Requests served.
# TYPE psrt_test_requests_total counter
psrt_test_requests_total 3
)");
}

TEST(MetricsTest, EmptyRegistryIsEmptyText) {
  Metrics metrics("psrt_test");
  EXPECT_EQ(metrics.PrometheusText(), "");
  EXPECT_TRUE(metrics.Snapshot().empty());
}

TEST(MetricsTest, Snapshot) {
  Metrics metrics("psrt_worker");
  metrics.GetCounter("steps_total", "Steps.")->Add(7);
  metrics.GetGauge("loss", "Loss.")->Set(-0.25);
  Histogram* h = metrics.GetHistogram("push_seconds", "Push.", {1});
  h->Observe(0.5);
  h->Observe(2);
  const std::map<std::string, double> expected = {
      {"psrt_worker_loss", -0.25},
      {"psrt_worker_push_seconds_count", 2},
      {"psrt_worker_push_seconds_sum", 2.5},
      {"psrt_worker_steps_total", 7},
  };
  EXPECT_EQ(metrics.Snapshot(), expected);
}

TEST(MetricsDeathTest, MisuseAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  Metrics metrics("p");
  metrics.GetCounter("x", "");
  metrics.GetHistogram("h", "", {1});
  EXPECT_DEATH(metrics.GetGauge("x", ""), "already registered as a counter");
  EXPECT_DEATH(metrics.GetHistogram("h", "", {2}), "different bounds");
  EXPECT_DEATH(metrics.GetCounter("bad-name", ""), "invalid metric name");
  EXPECT_DEATH(metrics.GetCounter("9lives", ""), "invalid metric name");
  EXPECT_DEATH(Metrics("bad prefix"), "invalid metric prefix");
}

// ---------------------------------------------------------------------------
// MetricsServer over plain HTTP, scraped as Prometheus does. HTTPS is covered
// with real daemons in tests/integration/tls_test.cc.

std::unique_ptr<MetricsServer> StartOrDie(const Metrics& metrics) {
  absl::StatusOr<std::unique_ptr<MetricsServer>> server =
      MetricsServer::Start("127.0.0.1", 0, metrics, TlsConfig());
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? *std::move(server) : nullptr;
}

TEST(MetricsServerTest, ServesTheRegistryAsItChanges) {
  Metrics metrics("psrt_server");
  Counter* pulls = metrics.GetCounter("pulls_total", "Pulls.");
  pulls->Add(2);
  metrics.GetHistogram("wait_seconds", "Waits.", {0.1, 1})->Observe(0.5);
  std::unique_ptr<MetricsServer> server = StartOrDie(metrics);
  ASSERT_NE(server, nullptr);
  ASSERT_GT(server->port(), 0);
  EXPECT_FALSE(server->tls());
  EXPECT_EQ(server->url(), absl::StrCat("http://127.0.0.1:", server->port(), "/metrics"));

  ScrapeResult first = Scrape(server->url());
  ASSERT_EQ(first.status, 200) << first.error << first.body;
  EXPECT_EQ(SampleValue(first.body, "psrt_server_pulls_total"), 2) << first.body;
  EXPECT_EQ(SampleValue(first.body, "psrt_server_wait_seconds_count"), 1) << first.body;
  EXPECT_EQ(ParseSamples(first.body)["psrt_server_wait_seconds_bucket{le=\"1\"}"], 1) << first.body;

  pulls->Add(5);
  ScrapeResult second = Scrape(server->url());
  ASSERT_EQ(second.status, 200) << second.error;
  EXPECT_EQ(SampleValue(second.body, "psrt_server_pulls_total"), 7) << second.body;

  EXPECT_EQ(Scrape(absl::StrCat("http://127.0.0.1:", server->port(), "/other")).status, 404);
}

TEST(MetricsServerTest, TakenPortNamesTheAddress) {
  Metrics metrics("p");
  std::unique_ptr<MetricsServer> first = StartOrDie(metrics);
  ASSERT_NE(first, nullptr);
  absl::StatusOr<std::unique_ptr<MetricsServer>> second =
      MetricsServer::Start("127.0.0.1", first->port(), metrics, TlsConfig());
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(
      absl::StrContains(second.status().message(), absl::StrCat("127.0.0.1:", first->port())))
      << second.status();
}

TEST(MetricsServerTest, BadAddressesAreRefused) {
  Metrics metrics("p");
  EXPECT_EQ(MetricsServer::Start("127.0.0.1", 70000, metrics, TlsConfig()).status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::StatusOr<std::unique_ptr<MetricsServer>> unresolvable =
      MetricsServer::Start("no such host.invalid", 0, metrics, TlsConfig());
  ASSERT_FALSE(unresolvable.ok());
  EXPECT_TRUE(absl::StrContains(unresolvable.status().message(), "no such host.invalid"))
      << unresolvable.status();
}

// A scraper that connects and says nothing neither blocks other scrapes
// nor keeps the server from stopping.
TEST(MetricsServerTest, SilentClientsDoNotStopIt) {
  Metrics metrics("p");
  metrics.GetCounter("x_total", "")->Add();
  std::unique_ptr<MetricsServer> server = StartOrDie(metrics);
  ASSERT_NE(server, nullptr);
  const int silent = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(server->port()));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(connect(silent, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0)
      << std::strerror(errno);
  ScrapeResult scrape = Scrape(server->url());
  EXPECT_EQ(scrape.status, 200) << scrape.error;
  EXPECT_EQ(SampleValue(scrape.body, "p_x_total"), 1) << scrape.body;
  server.reset();
  close(silent);
}

}  // namespace
}  // namespace psrt
