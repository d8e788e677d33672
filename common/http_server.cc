// Copyright 2024 The psrt Authors.

#include "common/http_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace psrt {
namespace {

using Clock = std::chrono::steady_clock;

// A client that vanished mid-response must not kill the daemon with SIGPIPE.
#ifdef MSG_NOSIGNAL
constexpr int kSendFlags = MSG_NOSIGNAL;
#else
constexpr int kSendFlags = 0;
#endif

constexpr size_t kMaxHeaderBytes = 64 * 1024;
constexpr auto kRequestTimeout = std::chrono::seconds(5);
constexpr auto kResponseTimeout = std::chrono::seconds(5);
// After responding we half-close and read until the client closes, so that
// unread request bytes don't make close() send a RST that could destroy the
// response before the client reads it. Bounded so a client can't stall us.
constexpr auto kLingerTimeout = std::chrono::seconds(1);
constexpr size_t kMaxLingerBytes = 1 << 20;
constexpr int kListenBacklog = 64;

constexpr char kMetricsContentType[] =
    "text/plain; version=0.0.4; charset=utf-8";
constexpr char kErrorContentType[] = "text/plain; charset=utf-8";

std::string FormatAddress(const std::string& host, int port) {
  if (host.empty()) return absl::StrCat("*:", port);
  if (host.find(':') != std::string::npos) {
    return absl::StrCat("[", host, "]:", port);
  }
  return absl::StrCat(host, ":", port);
}

// absl::ErrnoToStatus maps e.g. EADDRNOTAVAIL to ALREADY_EXISTS, which
// misleads callers; for a listener, "can't get this address now" is what
// every failure but a privilege problem means.
absl::Status SocketError(int err, absl::string_view what) {
  const std::string message = absl::StrCat(what, ": ", std::strerror(err));
  return err == EACCES || err == EPERM ? absl::PermissionDeniedError(message)
                                       : absl::UnavailableError(message);
}

void CloseFd(int fd) {
  if (fd >= 0) close(fd);
}

bool SetNonBlockingCloexec(int fd) {
  const int flags = fcntl(fd, F_GETFL, 0);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) return false;
  const int fd_flags = fcntl(fd, F_GETFD, 0);
  return fd_flags >= 0 && fcntl(fd, F_SETFD, fd_flags | FD_CLOEXEC) == 0;
}

enum class WaitResult { kReady, kTimeout, kStopped, kError };

// Waits until `fd` has `events`, the deadline passes, or the wake pipe fires.
// Polling the wake pipe everywhere is what lets the destructor interrupt a
// stalled client immediately instead of waiting out its timeout.
WaitResult WaitFor(int fd, short events, int wake_fd,
                   Clock::time_point deadline) {
  while (true) {
    const auto remaining =
        std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
    if (remaining.count() <= 0) return WaitResult::kTimeout;
    pollfd fds[2] = {{fd, events, 0}, {wake_fd, POLLIN, 0}};
    const int rc = poll(fds, 2, static_cast<int>(remaining.count()));
    if (rc < 0) {
      if (errno == EINTR) continue;
      return WaitResult::kError;
    }
    if (fds[1].revents != 0) return WaitResult::kStopped;
    // Errors and hangups count as ready: the next recv/send reports them.
    if (fds[0].revents != 0) return WaitResult::kReady;
  }
}

// Sends all of `data` or gives up at the deadline / on stop / on error.
bool SendAll(int fd, absl::string_view data, int wake_fd,
             Clock::time_point deadline) {
  while (!data.empty()) {
    const ssize_t n = send(fd, data.data(), data.size(), kSendFlags);
    if (n > 0) {
      data.remove_prefix(static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (WaitFor(fd, POLLOUT, wake_fd, deadline) != WaitResult::kReady) {
        return false;
      }
      continue;
    }
    return false;
  }
  return true;
}

std::string MakeResponse(int code, absl::string_view reason,
                         absl::string_view content_type, absl::string_view body,
                         bool include_body,
                         absl::string_view extra_headers = "") {
  std::string response = absl::StrCat(
      "HTTP/1.1 ", code, " ", reason, "\r\nContent-Type: ", content_type,
      "\r\nContent-Length: ", body.size(), "\r\n", extra_headers,
      "Connection: close\r\n\r\n");
  if (include_body) response.append(body.data(), body.size());
  return response;
}

std::string ErrorResponse(int code, absl::string_view reason,
                          absl::string_view extra_headers = "") {
  return MakeResponse(code, reason, kErrorContentType,
                      absl::StrCat(code, " ", reason, "\n"),
                      /*include_body=*/true, extra_headers);
}

std::string BadRequest() { return ErrorResponse(400, "Bad Request"); }

// RFC 9110 token characters, which is what a method must consist of.
bool IsToken(absl::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    const bool ok =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
        (c >= '0' && c <= '9') ||
        absl::string_view("!#$%&'*+-.^_`|~").find(c) != absl::string_view::npos;
    if (!ok) return false;
  }
  return true;
}

bool HasControlOrSpace(absl::string_view s) {
  for (char c : s) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (u <= 0x20 || u == 0x7f) return true;
  }
  return false;
}

// Position just past the blank line that ends the headers, or npos. Bare LF
// line endings are accepted, as RFC 9112 allows.
size_t FindHeaderEnd(absl::string_view data, size_t search_from) {
  const size_t crlf = data.find("\r\n\r\n", search_from);
  const size_t lf = data.find("\n\n", search_from);
  if (crlf == absl::string_view::npos && lf == absl::string_view::npos) {
    return absl::string_view::npos;
  }
  if (lf == absl::string_view::npos ||
      (crlf != absl::string_view::npos && crlf < lf)) {
    return crlf + 4;
  }
  return lf + 2;
}

}  // namespace

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(
    const std::string& host, int port, std::string path, Handler handler) {
  const std::string address = FormatAddress(host, port);
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("HttpServer: invalid port in ", address));
  }
  if (path.empty() || path[0] != '/') {
    return absl::InvalidArgumentError(absl::StrCat(
        "HttpServer: path must start with '/', got \"", path, "\""));
  }
  if (!handler) {
    return absl::InvalidArgumentError("HttpServer: handler is empty");
  }

  addrinfo hints;
  std::memset(&hints, 0, sizeof(hints));
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* results = nullptr;
  const std::string port_string = std::to_string(port);
  const int gai = getaddrinfo(host.empty() ? nullptr : host.c_str(),
                              port_string.c_str(), &hints, &results);
  if (gai != 0) {
    const std::string message = absl::StrCat(
        "HttpServer: cannot resolve ", address, ": ",
        gai == EAI_SYSTEM ? std::strerror(errno) : gai_strerror(gai));
    return gai == EAI_AGAIN ? absl::UnavailableError(message)
                            : absl::InvalidArgumentError(message);
  }

  // Take the first address that binds; e.g. "localhost" may yield both ::1
  // and 127.0.0.1 and either serves a local scraper.
  int listen_fd = -1;
  int last_errno = 0;
  const char* last_step = "bind";
  for (addrinfo* ai = results; ai != nullptr; ai = ai->ai_next) {
    const int fd = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
    if (fd < 0) {
      last_errno = errno;
      last_step = "socket";
      continue;
    }
    // Lets a restarted daemon rebind while old connections sit in TIME_WAIT.
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
      last_errno = errno;
      last_step = "bind";
      close(fd);
      continue;
    }
    if (listen(fd, kListenBacklog) != 0) {
      last_errno = errno;
      last_step = "listen";
      close(fd);
      continue;
    }
    if (!SetNonBlockingCloexec(fd)) {
      last_errno = errno;
      last_step = "fcntl";
      close(fd);
      continue;
    }
    listen_fd = fd;
    break;
  }
  freeaddrinfo(results);
  if (listen_fd < 0) {
    return SocketError(last_errno,
                       absl::StrCat("HttpServer: ", last_step, " ", address));
  }

  sockaddr_storage bound;
  socklen_t bound_len = sizeof(bound);
  if (getsockname(listen_fd, reinterpret_cast<sockaddr*>(&bound), &bound_len) !=
      0) {
    const int err = errno;
    close(listen_fd);
    return SocketError(err, absl::StrCat("HttpServer: getsockname ", address));
  }
  const int bound_port =
      bound.ss_family == AF_INET6
          ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
          : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);

  int wake[2];
  if (pipe(wake) != 0) {
    const int err = errno;
    close(listen_fd);
    return SocketError(err, absl::StrCat("HttpServer: pipe for ", address));
  }
  if (!SetNonBlockingCloexec(wake[0]) || !SetNonBlockingCloexec(wake[1])) {
    const int err = errno;
    close(listen_fd);
    close(wake[0]);
    close(wake[1]);
    return SocketError(err,
                       absl::StrCat("HttpServer: fcntl pipe for ", address));
  }

  std::unique_ptr<HttpServer> server(new HttpServer(listen_fd, wake[0], wake[1],
                                                    bound_port, std::move(path),
                                                    std::move(handler)));
  server->thread_ = std::thread(&HttpServer::Run, server.get());
  return server;
}

HttpServer::HttpServer(int listen_fd, int wake_read_fd, int wake_write_fd,
                       int port, std::string path, Handler handler)
    : listen_fd_(listen_fd),
      wake_read_fd_(wake_read_fd),
      wake_write_fd_(wake_write_fd),
      port_(port),
      path_(std::move(path)),
      handler_(std::move(handler)) {}

HttpServer::~HttpServer() {
  stopping_.store(true);
  // The pipe is never drained, so once written every later poll() in the
  // server thread returns at once.
  const char byte = 1;
  while (write(wake_write_fd_, &byte, 1) < 0 && errno == EINTR) {
  }
  shutdown(listen_fd_, SHUT_RDWR);
  if (thread_.joinable()) thread_.join();
  CloseFd(listen_fd_);
  CloseFd(wake_read_fd_);
  CloseFd(wake_write_fd_);
}

void HttpServer::Run() {
  while (!stopping_.load()) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_read_fd_, POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno != EINTR) poll(&fds[1], 1, 100);  // Back off, stay stoppable.
      continue;
    }
    if (fds[1].revents != 0) break;
    const int fd = accept(listen_fd_, nullptr, nullptr);
    if (fd < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK ||
          errno == ECONNABORTED || errno == EPROTO) {
        continue;
      }
      // Out of fds/memory: the connection stays queued and poll() would
      // spin, so back off instead.
      poll(&fds[1], 1, 100);
      continue;
    }
    if (SetNonBlockingCloexec(fd)) ServeConnection(fd);
    close(fd);
  }
}

void HttpServer::ServeConnection(int fd) {
  const Clock::time_point request_deadline = Clock::now() + kRequestTimeout;
  std::string request;
  std::string response;
  char buffer[4096];
  while (response.empty()) {
    const WaitResult wait =
        WaitFor(fd, POLLIN, wake_read_fd_, request_deadline);
    // A client that sends nothing in time just gets closed; there is nobody
    // to tell.
    if (wait != WaitResult::kReady) return;
    const ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      return;
    }
    if (n == 0) {
      // The client half-closed before finishing its headers.
      if (request.empty()) return;
      response = BadRequest();
      break;
    }
    // A terminator may straddle the previous chunk.
    const size_t search_from = request.size() >= 3 ? request.size() - 3 : 0;
    request.append(buffer, static_cast<size_t>(n));
    const size_t header_end = FindHeaderEnd(request, search_from);
    if (header_end != absl::string_view::npos &&
        header_end <= kMaxHeaderBytes) {
      request.resize(header_end);
      response = Respond(request);
    } else if (request.size() >= kMaxHeaderBytes) {
      response = ErrorResponse(431, "Request Header Fields Too Large");
    }
  }

  if (!SendAll(fd, response, wake_read_fd_, Clock::now() + kResponseTimeout)) {
    return;
  }
  shutdown(fd, SHUT_WR);
  const Clock::time_point linger_deadline = Clock::now() + kLingerTimeout;
  size_t drained = 0;
  while (drained < kMaxLingerBytes &&
         WaitFor(fd, POLLIN, wake_read_fd_, linger_deadline) ==
             WaitResult::kReady) {
    const ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      break;
    }
    drained += static_cast<size_t>(n);
  }
}

std::string HttpServer::Respond(const std::string& request) {
  std::vector<absl::string_view> lines =
      absl::StrSplit(absl::string_view(request), '\n');
  for (absl::string_view& line : lines) absl::ConsumeSuffix(&line, "\r");
  // RFC 9112 asks servers to skip empty lines before the request line.
  size_t first = 0;
  while (first < lines.size() && lines[first].empty()) ++first;
  if (first == lines.size()) return BadRequest();

  const std::vector<absl::string_view> parts =
      absl::StrSplit(lines[first], ' ');
  if (parts.size() != 3) return BadRequest();
  const absl::string_view method = parts[0];
  absl::string_view target = parts[1];
  const absl::string_view version = parts[2];
  if (!IsToken(method) || target.empty() || HasControlOrSpace(target)) {
    return BadRequest();
  }
  if (version.size() != 8 || !absl::StartsWith(version, "HTTP/") ||
      version[6] != '.' || !absl::ascii_isdigit(version[5]) ||
      !absl::ascii_isdigit(version[7])) {
    return BadRequest();
  }
  if (version[5] != '1')
    return ErrorResponse(505, "HTTP Version Not Supported");

  // Header fields are ignored, but a line that isn't "name: value" (or is an
  // obsolete folded continuation) means the request is not HTTP.
  for (size_t i = first + 1; i < lines.size(); ++i) {
    const absl::string_view line = lines[i];
    if (line.empty()) break;
    const size_t colon = line.find(':');
    if (colon == absl::string_view::npos || colon == 0 || line[0] == ' ' ||
        line[0] == '\t' || !IsToken(line.substr(0, colon))) {
      return BadRequest();
    }
  }

  // Absolute-form ("http://host/metrics") is legal, if rare, for servers.
  if (!absl::StartsWith(target, "/")) {
    const size_t scheme_end = target.find("://");
    if (scheme_end == absl::string_view::npos) return BadRequest();
    const size_t path_start = target.find('/', scheme_end + 3);
    target = path_start == absl::string_view::npos ? absl::string_view("/")
                                                   : target.substr(path_start);
  }
  target = target.substr(0, target.find_first_of("?#"));

  if (target != path_) return ErrorResponse(404, "Not Found");
  const bool is_head = method == "HEAD";
  if (method != "GET" && !is_head) {
    return ErrorResponse(405, "Method Not Allowed", "Allow: GET, HEAD\r\n");
  }
  return MakeResponse(200, "OK", kMetricsContentType, handler_(),
                      /*include_body=*/!is_head);
}

}  // namespace psrt
