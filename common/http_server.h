// Copyright 2024 The psrt Authors.
//
// A deliberately tiny HTTP/1.1 server for exposing /metrics from psrt
// daemons without pulling in an HTTP library. It serves one path, one request
// per connection, one connection at a time; that is plenty for a Prometheus
// scraper and keeps the failure modes easy to reason about.
//
//   auto server = HttpServer::Start("0.0.0.0", 9100, "/metrics",
//                                   [&] { return metrics.PrometheusText(); });
//   if (!server.ok()) return server.status();

#ifndef PSRT_COMMON_HTTP_SERVER_H_
#define PSRT_COMMON_HTTP_SERVER_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"

namespace psrt {

class HttpServer {
 public:
  // Produces the response body; called on the server thread, so it must be
  // thread-safe with respect to the rest of the program.
  using Handler = std::function<std::string()>;

  // Binds host:port (port 0 picks a free one; an empty host means all
  // interfaces) and starts serving:
  //   GET/HEAD <path> (query string ignored) -> 200 with the handler's body,
  //     Content-Type "text/plain; version=0.0.4; charset=utf-8"
  //   other paths -> 404; other methods on <path> -> 405;
  //   malformed request -> 400; headers over 64 KiB -> 431.
  // Every response carries "Connection: close" and the connection is closed
  // afterwards. A client gets 5 seconds to send its request headers and 5 to
  // take the response, so a stuck client delays others by at most that.
  // Errors (bad arguments, resolution or bind failure) name the address.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(
      const std::string& host, int port, std::string path, Handler handler);

  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Stops accepting, interrupts any request in progress and joins the server
  // thread; returns promptly even if a client is stalled.
  ~HttpServer();

  // The bound port (the chosen one when Start() was given 0).
  int port() const { return port_; }

 private:
  HttpServer(int listen_fd, int wake_read_fd, int wake_write_fd, int port,
             std::string path, Handler handler);

  void Run();
  void ServeConnection(int fd);
  // Returns the full response (status line, headers, body) for `request`,
  // the bytes up to and including the blank line ending the headers.
  std::string Respond(const std::string& request);

  const int listen_fd_;
  // Self-pipe: the destructor writes a byte so every poll() in the server
  // thread wakes up at once, whatever it is blocked on.
  const int wake_read_fd_;
  const int wake_write_fd_;
  const int port_;
  const std::string path_;
  const Handler handler_;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

}  // namespace psrt

#endif  // PSRT_COMMON_HTTP_SERVER_H_
