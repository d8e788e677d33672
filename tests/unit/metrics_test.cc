// Copyright 2024 The psrt Authors.

#include "common/metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/http_server.h"
#include "gtest/gtest.h"

namespace psrt {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

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
  EXPECT_EQ(metrics.GetCounter("ops_total", "")->value(),
            int64_t{kThreads} * (kIterations + 5));
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
  Histogram h(
      {2, 0.5, 1, 1, std::numeric_limits<double>::infinity(), std::nan("")});
  EXPECT_EQ(h.bounds(), (std::vector<double>{0.5, 1, 2}));
  EXPECT_EQ(h.bucket_counts().size(), 4u);
}

TEST(HistogramTest, CountsPerBucket) {
  Histogram h({0.5, 1, 2});
  h.Observe(0.5);  // Bounds are inclusive ("le").
  h.Observe(0.75);
  h.Observe(1);
  h.Observe(-3);
  h.Observe(10);
  EXPECT_EQ(h.bucket_counts(), (std::vector<int64_t>{2, 2, 0, 1}));
  EXPECT_EQ(h.count(), 5);
  EXPECT_DOUBLE_EQ(h.sum(), 9.25);
  h.Observe(std::nan(""));
  EXPECT_EQ(h.bucket_counts(), (std::vector<int64_t>{2, 2, 0, 2}));
  EXPECT_TRUE(std::isnan(h.sum()));
}

TEST(HistogramTest, ConcurrentObservationsAreAllCounted) {
  Histogram h({1, 10});
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
  Histogram* h =
      metrics.GetHistogram("latency_seconds", "Request latency.", {0.1, 1});
  h->Observe(0.0625);
  h->Observe(0.5);
  h->Observe(0.5);
  h->Observe(4);
  EXPECT_EQ(metrics.PrometheusText(),
            R"(# HELP psrt_test_latency_seconds Request latency.
# TYPE psrt_test_latency_seconds histogram
psrt_test_latency_seconds_bucket{le="0.1"} 1
psrt_test_latency_seconds_bucket{le="1"} 3
psrt_test_latency_seconds_bucket{le="+Inf"} 4
psrt_test_latency_seconds_sum 5.0625
psrt_test_latency_seconds_count 4
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

TEST(FormatPrometheusDoubleTest, ShortestRoundTrip) {
  EXPECT_EQ(FormatPrometheusDouble(0), "0");
  EXPECT_EQ(FormatPrometheusDouble(1), "1");
  EXPECT_EQ(FormatPrometheusDouble(0.1), "0.1");
  EXPECT_EQ(FormatPrometheusDouble(0.005), "0.005");
  EXPECT_EQ(FormatPrometheusDouble(-2.5), "-2.5");
  EXPECT_EQ(FormatPrometheusDouble(0.1 + 0.2), "0.30000000000000004");
  EXPECT_EQ(FormatPrometheusDouble(1e21), "1e+21");
  EXPECT_EQ(FormatPrometheusDouble(123456789012.0), "123456789012");
  EXPECT_EQ(FormatPrometheusDouble(std::numeric_limits<double>::infinity()),
            "+Inf");
  EXPECT_EQ(FormatPrometheusDouble(-std::numeric_limits<double>::infinity()),
            "-Inf");
  EXPECT_EQ(FormatPrometheusDouble(std::nan("")), "NaN");
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
// HttpServer, driven by a real socket client.

int ConnectTo(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  // A generous timeout so a server bug fails the test instead of hanging it.
  timeval timeout{15, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

std::string ReadUntilEof(int fd) {
  std::string data;
  char buffer[4096];
  while (true) {
    const ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
    if (n <= 0) break;
    data.append(buffer, static_cast<size_t>(n));
  }
  return data;
}

// Sends `request` verbatim (optionally half-closing) and returns everything
// the server sends back before closing.
std::string Exchange(int port, const std::string& request,
                     bool half_close = false) {
  const int fd = ConnectTo(port);
  if (fd < 0) return "<connect failed>";
  size_t sent = 0;
  while (sent < request.size()) {
    const ssize_t n =
        send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += static_cast<size_t>(n);
  }
  if (half_close) shutdown(fd, SHUT_WR);
  std::string response = ReadUntilEof(fd);
  close(fd);
  return response;
}

struct Response {
  int status = 0;
  std::string headers;
  std::string body;
};

Response Parse(const std::string& raw) {
  Response response;
  const size_t end = raw.find("\r\n\r\n");
  if (raw.size() < 12 || !absl::StartsWith(raw, "HTTP/1.1 ") ||
      end == std::string::npos) {
    response.body = raw;
    return response;
  }
  response.status = std::stoi(raw.substr(9, 3));
  response.headers = raw.substr(0, end + 2);
  response.body = raw.substr(end + 4);
  return response;
}

Response Request(int port, const std::string& method, const std::string& path) {
  return Parse(Exchange(port, absl::StrCat(method, " ", path,
                                           " HTTP/1.1\r\nHost: localhost\r\n"
                                           "User-Agent: psrt-test\r\n\r\n")));
}

std::unique_ptr<HttpServer> StartOrDie(HttpServer::Handler handler,
                                       const std::string& path = "/metrics") {
  auto server = HttpServer::Start("127.0.0.1", 0, path, std::move(handler));
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? std::move(server).value() : nullptr;
}

TEST(HttpServerTest, ServesMetrics) {
  Metrics metrics("psrt_server");
  metrics.GetCounter("pulls_total", "Pulls.")->Add(2);
  auto server = StartOrDie([&metrics] { return metrics.PrometheusText(); });
  ASSERT_NE(server, nullptr);
  ASSERT_GT(server->port(), 0);

  const Response response = Request(server->port(), "GET", "/metrics");
  EXPECT_EQ(response.status, 200);
  EXPECT_TRUE(absl::StrContains(
      response.headers,
      "Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n"))
      << response.headers;
  EXPECT_TRUE(absl::StrContains(
      response.headers,
      absl::StrCat("Content-Length: ", response.body.size(), "\r\n")))
      << response.headers;
  EXPECT_TRUE(absl::StrContains(response.headers, "Connection: close\r\n"));
  EXPECT_EQ(response.body, metrics.PrometheusText());
  EXPECT_TRUE(absl::StrContains(response.body, "psrt_server_pulls_total 2\n"));

  // Query strings (e.g. from scrapers adding parameters) are ignored.
  EXPECT_EQ(Request(server->port(), "GET", "/metrics?x=1").status, 200);
}

TEST(HttpServerTest, HeadHasNoBody) {
  auto server = StartOrDie([] { return std::string("hello\n"); });
  ASSERT_NE(server, nullptr);
  const Response response = Request(server->port(), "HEAD", "/metrics");
  EXPECT_EQ(response.status, 200);
  EXPECT_TRUE(absl::StrContains(response.headers, "Content-Length: 6\r\n"));
  EXPECT_EQ(response.body, "");
}

TEST(HttpServerTest, ErrorStatuses) {
  auto server = StartOrDie([] { return std::string("ok"); });
  ASSERT_NE(server, nullptr);
  const int port = server->port();

  EXPECT_EQ(Request(port, "GET", "/other").status, 404);
  EXPECT_EQ(Request(port, "GET", "/metrics/extra").status, 404);

  const Response post = Request(port, "POST", "/metrics");
  EXPECT_EQ(post.status, 405);
  EXPECT_TRUE(absl::StrContains(post.headers, "Allow: GET, HEAD\r\n"));

  EXPECT_EQ(Parse(Exchange(port, "garbage\r\n\r\n")).status, 400);
  EXPECT_EQ(Parse(Exchange(port, "GET /metrics\r\n\r\n")).status, 400);
  EXPECT_EQ(Parse(Exchange(port, "GET  /metrics HTTP/1.1\r\n\r\n")).status,
            400);
  EXPECT_EQ(Parse(Exchange(port, "GET /metrics FTP/1.1\r\n\r\n")).status, 400);
  EXPECT_EQ(
      Parse(Exchange(port, "GET /metrics HTTP/1.1\r\nno colon here\r\n\r\n"))
          .status,
      400);
  EXPECT_EQ(Parse(Exchange(port, "GET /metrics HTTP/2.0\r\n\r\n")).status, 505);
  // Garbage without a header terminator, then EOF.
  EXPECT_EQ(Parse(Exchange(port, "\x16\x03\x01 binary junk", true)).status,
            400);
  // Headers past the 64 KiB cap are refused, not buffered forever.
  const std::string huge = absl::StrCat(
      "GET /metrics HTTP/1.1\r\nX-Big: ", std::string(70 * 1024, 'a'),
      "\r\n\r\n");
  EXPECT_EQ(Parse(Exchange(port, huge)).status, 431);

  // The server is still healthy after all of that.
  EXPECT_EQ(Request(port, "GET", "/metrics").status, 200);
}

TEST(HttpServerTest, AcceptsBareLfAndAbsoluteForm) {
  auto server = StartOrDie([] { return std::string("ok"); });
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(Parse(Exchange(server->port(), "GET /metrics HTTP/1.0\n\n")).status,
            200);
  EXPECT_EQ(Parse(Exchange(server->port(),
                           "GET http://localhost/metrics HTTP/1.1\r\n\r\n"))
                .status,
            200);
}

TEST(HttpServerTest, LargeBody) {
  const std::string body(4 << 20, 'm');
  auto server = StartOrDie([&body] { return body; });
  ASSERT_NE(server, nullptr);
  const Response response = Request(server->port(), "GET", "/metrics");
  EXPECT_EQ(response.status, 200);
  EXPECT_EQ(response.body.size(), body.size());
  EXPECT_EQ(response.body, body);
}

TEST(HttpServerTest, SurvivesSilentAndVanishingClients) {
  auto server = StartOrDie([] { return std::string("ok"); });
  ASSERT_NE(server, nullptr);
  const int port = server->port();

  // Connects and goes away without a byte.
  const int gone = ConnectTo(port);
  ASSERT_GE(gone, 0);
  close(gone);

  // Connects and then says nothing while holding the connection open. The
  // server serves one connection at a time, so the next request waits for
  // the 5 s request timeout, but must then succeed.
  const int silent = ConnectTo(port);
  ASSERT_GE(silent, 0);
  const Clock::time_point start = Clock::now();
  const Response response = Request(port, "GET", "/metrics");
  EXPECT_EQ(response.status, 200);
  EXPECT_EQ(response.body, "ok");
  EXPECT_LT(SecondsSince(start), 8.0);

  // The server hung up on the silent client without sending anything.
  EXPECT_EQ(ReadUntilEof(silent), "");
  close(silent);
}

TEST(HttpServerTest, ShutsDownPromptlyWhileClientStalls) {
  auto server = StartOrDie([] { return std::string("ok"); });
  ASSERT_NE(server, nullptr);
  // A client stuck halfway through its request keeps the server thread busy.
  const int stalled = ConnectTo(server->port());
  ASSERT_GE(stalled, 0);
  ASSERT_GT(send(stalled, "GET /met", 8, MSG_NOSIGNAL), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));

  const Clock::time_point start = Clock::now();
  server.reset();
  EXPECT_LT(SecondsSince(start), 1.0);
  close(stalled);
}

TEST(HttpServerTest, IdleShutdownIsPrompt) {
  auto server = StartOrDie([] { return std::string("ok"); });
  ASSERT_NE(server, nullptr);
  const int port = server->port();
  const Clock::time_point start = Clock::now();
  server.reset();
  EXPECT_LT(SecondsSince(start), 1.0);
  // Nothing listens any more.
  const int fd = ConnectTo(port);
  EXPECT_LT(fd, 0);
  if (fd >= 0) close(fd);
}

TEST(HttpServerTest, BindFailureNamesAddress) {
  auto first = StartOrDie([] { return std::string("ok"); });
  ASSERT_NE(first, nullptr);
  auto second = HttpServer::Start("127.0.0.1", first->port(), "/metrics",
                                  [] { return std::string("ok"); });
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  const std::string message(second.status().message());
  EXPECT_TRUE(
      absl::StrContains(message, absl::StrCat("127.0.0.1:", first->port())))
      << message;
  EXPECT_TRUE(absl::StrContains(message, std::strerror(EADDRINUSE))) << message;
}

TEST(HttpServerTest, InvalidArguments) {
  auto handler = [] { return std::string("ok"); };
  EXPECT_FALSE(HttpServer::Start("127.0.0.1", 70000, "/metrics", handler).ok());
  EXPECT_FALSE(HttpServer::Start("127.0.0.1", 0, "metrics", handler).ok());
  EXPECT_FALSE(HttpServer::Start("127.0.0.1", 0, "/metrics", nullptr).ok());
  const auto unresolvable =
      HttpServer::Start("not an address", 0, "/metrics", handler);
  ASSERT_FALSE(unresolvable.ok());
  EXPECT_TRUE(
      absl::StrContains(unresolvable.status().message(), "not an address:0"))
      << unresolvable.status();
}

}  // namespace
}  // namespace psrt
