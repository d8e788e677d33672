#ifndef PSRT_SERVER_DATA_SERVER_H_
#define PSRT_SERVER_DATA_SERVER_H_

#include <grpcpp/support/byte_buffer.h>

#include <atomic>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/data_channel.h"

namespace psrt {

// The server's end of the data channel (common/data_channel.h): listens on
// its own port beside gRPC, checks each connection's hello against the job
// token, and hands every request (its text, where its method has one, and
// its payload) to `handler`, which answers through
// `done` once, from any thread. One thread per connection reads requests
// and runs the handler (a pull that waits for a version returns it at
// once); answers are written by whichever thread has them.
class DataServer {
 public:
  // The caller's deadline, less a margin for the answer to travel; whether
  // the caller is gone (its connection closed); and where the answer goes.
  using Done = std::function<void(const absl::Status&, grpc::ByteBuffer)>;
  using Handler = std::function<void(FrameKind method, absl::string_view text,
                                     const grpc::ByteBuffer& request, absl::Time deadline,
                                     std::function<bool()> cancelled, Done done)>;

  // Listens on bind:port (0: a free port). UNAVAILABLE when it cannot.
  static absl::StatusOr<std::unique_ptr<DataServer>> Start(const std::string& bind, int port,
                                                           std::string token, Handler handler);
  // Closes every connection and waits for their threads. Answers still to
  // come (pulls waiting for a version) find their connection closed.
  ~DataServer();
  DataServer(const DataServer&) = delete;
  DataServer& operator=(const DataServer&) = delete;

  int port() const { return port_; }

  // Most connections served at once; later ones are closed at accept.
  static constexpr int kMaxConnections = 1024;

 private:
  struct Connection;
  DataServer(int listen_fd, int port, std::string token, Handler handler);
  void Accept();
  void Serve(const std::shared_ptr<Connection>& c);

  const int listen_fd_;
  const int port_;
  const std::string token_;
  const Handler handler_;
  std::atomic<bool> stopping_{false};
  absl::Mutex mu_;
  // Each connection and the thread that reads it; the acceptor joins the
  // threads of connections that ended.
  std::list<std::pair<std::shared_ptr<Connection>, std::thread>> connections_ ABSL_GUARDED_BY(mu_);
  std::thread acceptor_;
};

}  // namespace psrt

#endif  // PSRT_SERVER_DATA_SERVER_H_
