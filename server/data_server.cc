#include "server/data_server.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_util.h"
#include "common/logging.h"
#include "common/net.h"

namespace psrt {
namespace {

// A connection must say hello with the token this soon.
constexpr absl::Duration kHelloTimeout = absl::Seconds(10);
// An answer its worker does not take this long closes the connection.
constexpr absl::Duration kAnswerTimeout = absl::Seconds(30);

}  // namespace

struct DataServer::Connection {
  explicit Connection(int fd) : fd(fd) {}
  ~Connection() { close(fd); }

  // Sends call `call`'s answer, unless the connection has ended.
  void Answer(uint64_t call, const absl::Status& s, const grpc::ByteBuffer* body) {
    if (ended.load(std::memory_order_acquire)) return;
    FrameHeader h;
    h.call = call;
    h.code = static_cast<uint32_t>(s.code());
    const std::string text = s.ok() ? "" : BoundErrorText(s.message());
    h.text_bytes = static_cast<uint32_t>(text.size());
    h.payload_bytes = s.ok() && body != nullptr && body->Valid() ? body->Length() : 0;
    absl::MutexLock lock(&write_mu);
    if (!WriteFrame(fd, h, text, s.ok() ? body : nullptr, absl::Now() + kAnswerTimeout).ok()) {
      shutdown(fd, SHUT_RDWR);  // its reader ends it
    }
  }

  const int fd;
  std::atomic<bool> ended{false};  // the reader stopped: the caller is gone
  absl::Mutex write_mu;
};

absl::StatusOr<std::unique_ptr<DataServer>> DataServer::Start(const std::string& bind,
                                                              int listen_port, std::string token,
                                                              Handler handler) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string host = HostOf(bind);
  const std::string service = std::to_string(listen_port);
  if (int e = getaddrinfo(host.c_str(), service.c_str(), &hints, &found); e != 0) {
    return absl::UnavailableError(
        absl::StrCat("the data port cannot listen on ", bind, ": ", gai_strerror(e)));
  }
  int fd = -1;
  std::string why;
  for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    // A fixed port is taken again by the next generation of a recovered job
    // while the last one's connections linger in TIME_WAIT.
    const int one = 1;
    if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (fd >= 0 && (::bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, 128) != 0)) {
      why = std::strerror(errno);
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(found);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat(
        "the data port cannot listen on ", bind,
        listen_port > 0 ? absl::StrCat(" port ", listen_port) : std::string(), ": ", why));
  }
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  const int port =
      ntohs(addr.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port
                                       : reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  return std::unique_ptr<DataServer>(
      new DataServer(fd, port, std::move(token), std::move(handler)));
}

DataServer::DataServer(int listen_fd, int port, std::string token, Handler handler)
    : listen_fd_(listen_fd), port_(port), token_(std::move(token)), handler_(std::move(handler)) {
  acceptor_ = std::thread([this] { Accept(); });
}

DataServer::~DataServer() {
  stopping_.store(true, std::memory_order_release);
  shutdown(listen_fd_, SHUT_RDWR);
  acceptor_.join();
  close(listen_fd_);
  absl::MutexLock lock(&mu_);
  for (auto& [c, thread] : connections_) shutdown(c->fd, SHUT_RDWR);
  for (auto& [c, thread] : connections_) thread.join();
}

void DataServer::Accept() {
  while (!stopping_.load(std::memory_order_acquire)) {
    {
      // The threads of connections that ended.
      absl::MutexLock lock(&mu_);
      for (auto it = connections_.begin(); it != connections_.end();) {
        if (it->first->ended.load(std::memory_order_acquire)) {
          it->second.join();
          it = connections_.erase(it);
        } else {
          ++it;
        }
      }
    }
    pollfd p{listen_fd_, POLLIN, 0};
    if (poll(&p, 1, 1000) <= 0) continue;
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    auto c = std::make_shared<Connection>(fd);
    absl::MutexLock lock(&mu_);
    if (stopping_.load() || connections_.size() >= kMaxConnections) {
      LogWarning("refused a data connection: ", connections_.size(), " are open, the most");
      continue;  // closed as `c` goes
    }
    connections_.emplace_back(c, std::thread([this, c] { Serve(c); }));
  }
}

void DataServer::Serve(const std::shared_ptr<Connection>& c) {
  TuneDataSocket(c->fd);  // to notice stopping_ and the hello's deadline
  const absl::Time hello_by = absl::Now() + kHelloTimeout;
  auto before_hello = [&] { return !stopping_.load() && absl::Now() < hello_by; };
  auto serving = [&] { return !stopping_.load(); };

  char head[FrameHeader::kBytes];
  absl::Status s = ReadFull(c->fd, head, sizeof(head), before_hello);
  absl::StatusOr<FrameHeader> hello = s.ok() ? FrameHeader::Read(head, 0) : s;
  std::string token;
  if (hello.ok() && hello->kind == FrameKind::kHello) {
    token.resize(hello->text_bytes);
    s = ReadFull(c->fd, token.data(), token.size(), before_hello);
  }
  if (s.ok() && hello.ok() && hello->kind == FrameKind::kHello) {
    if (SameToken(token, token_)) {
      c->Answer(0, absl::OkStatus(), nullptr);
    } else {
      c->Answer(0, absl::UnauthenticatedError("this connection's job token is not this job's"),
                nullptr);
      s = absl::UnauthenticatedError("wrong token");
    }
  } else if (s.ok()) {
    s = absl::InvalidArgumentError("no hello");
  }

  std::string text;
  while (s.ok()) {
    s = ReadFull(c->fd, head, sizeof(head), serving);
    absl::StatusOr<FrameHeader> h = s.ok() ? FrameHeader::Read(head, kDefaultMaxMessageBytes) : s;
    if (h.ok() && (h->kind == FrameKind::kHello || h->kind == FrameKind::kAnswer ||
                   (h->text_bytes != 0 && h->kind != FrameKind::kReplicate))) {
      h = absl::InvalidArgumentError("a frame that is no request");
    }
    if (h.ok()) {
      text.resize(h->text_bytes);
      if (absl::Status read = ReadFull(c->fd, text.data(), text.size(), serving); !read.ok()) {
        h = read;
      }
    }
    absl::StatusOr<grpc::ByteBuffer> body =
        h.ok() ? ReadPayload(c->fd, h->payload_bytes, serving) : h.status();
    if (!body.ok()) {
      if (body.status().code() == absl::StatusCode::kInvalidArgument) {
        LogWarning("closed a data connection: ", body.status().message());
      }
      break;
    }
    // Stop a little before the caller's deadline, so that the answer, which
    // says what the call waited for, still arrives (as gRPC's handlers do).
    const absl::Duration left = absl::Milliseconds(h->code);
    const absl::Time deadline = absl::Now() + left - std::min(left / 10, absl::Milliseconds(500));
    const uint64_t call = h->call;
    handler_(
        h->kind, text, *body, deadline, [c] { return c->ended.load(std::memory_order_acquire); },
        [c, call](const absl::Status& st, grpc::ByteBuffer answer) {
          c->Answer(call, st, &answer);
        });
  }
  shutdown(c->fd, SHUT_RDWR);
  c->ended.store(true, std::memory_order_release);
}

}  // namespace psrt
