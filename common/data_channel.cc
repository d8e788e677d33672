#include "common/data_channel.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/buffer_pool.h"
#include "common/grpc_util.h"
#include "common/net.h"

namespace psrt {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "frames are little-endian");

absl::Status Errno(absl::string_view what) {
  return absl::UnavailableError(absl::StrCat(what, ": ", std::strerror(errno)));
}

void DestroyBuffer(void* user_data) { static_cast<Buffer*>(user_data)->Unref(); }

}  // namespace

void TuneDataSocket(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  timeval tv{0, 100 * 1000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

void FrameHeader::Write(char out[kBytes]) const {
  std::memset(out, 0, kBytes);
  std::memcpy(out, &kMagic, 4);
  out[4] = static_cast<char>(kind);
  std::memcpy(out + 8, &code, 4);
  std::memcpy(out + 12, &text_bytes, 4);
  std::memcpy(out + 16, &call, 8);
  std::memcpy(out + 24, &payload_bytes, 8);
}

absl::StatusOr<FrameHeader> FrameHeader::Read(const char in[kBytes], uint64_t max_payload) {
  uint32_t magic;
  std::memcpy(&magic, in, 4);
  if (magic != kMagic || in[5] != 0 || in[6] != 0 || in[7] != 0) {
    return absl::InvalidArgumentError("bytes that are no psrt data-channel frame");
  }
  const uint8_t kind = static_cast<uint8_t>(in[4]);
  if (kind < static_cast<uint8_t>(FrameKind::kHello) ||
      kind > static_cast<uint8_t>(FrameKind::kReplicate)) {
    return absl::InvalidArgumentError(absl::StrCat("a frame of unknown kind ", kind));
  }
  FrameHeader h;
  h.kind = static_cast<FrameKind>(kind);
  std::memcpy(&h.code, in + 8, 4);
  std::memcpy(&h.text_bytes, in + 12, 4);
  std::memcpy(&h.call, in + 16, 8);
  std::memcpy(&h.payload_bytes, in + 24, 8);
  if (h.text_bytes > kMaxText) {
    return absl::InvalidArgumentError(
        absl::StrCat("a frame with ", h.text_bytes, " bytes of text; the most is ", kMaxText));
  }
  if (h.payload_bytes > max_payload) {
    return absl::InvalidArgumentError(
        absl::StrCat("a frame of ", h.payload_bytes, " bytes; the most is ", max_payload));
  }
  return h;
}

absl::Status WriteFrame(int fd, const FrameHeader& header, absl::string_view text,
                        const grpc::ByteBuffer* payload, absl::Time deadline) {
  char head[FrameHeader::kBytes];
  header.Write(head);
  std::vector<grpc::Slice> slices;
  if (payload != nullptr && payload->Valid() && !payload->Dump(&slices).ok()) {
    return absl::InternalError("cannot read the message to send");
  }
  std::vector<iovec> iov;
  iov.reserve(slices.size() + 2);
  iov.push_back({head, sizeof(head)});
  if (!text.empty()) iov.push_back({const_cast<char*>(text.data()), text.size()});
  for (const grpc::Slice& s : slices) {
    if (s.size() > 0) iov.push_back({const_cast<uint8_t*>(s.begin()), s.size()});
  }
  size_t first = 0;
  while (first < iov.size()) {
    msghdr msg{};
    msg.msg_iov = iov.data() + first;
    msg.msg_iovlen = std::min<size_t>(iov.size() - first, IOV_MAX);
    const ssize_t n = sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if ((errno == EAGAIN || errno == EWOULDBLOCK) && absl::Now() < deadline) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        return absl::DeadlineExceededError("the peer took no bytes before the deadline");
      }
      return Errno("send");
    }
    size_t left = static_cast<size_t>(n);
    while (left > 0 && first < iov.size()) {
      if (left >= iov[first].iov_len) {
        left -= iov[first].iov_len;
        ++first;
      } else {
        iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + left;
        iov[first].iov_len -= left;
        left = 0;
      }
    }
    while (first < iov.size() && iov[first].iov_len == 0) ++first;
  }
  return absl::OkStatus();
}

absl::Status ReadFull(int fd, char* out, size_t n, const std::function<bool()>& on_idle) {
  size_t got = 0;
  while (got < n) {
    const ssize_t r = recv(fd, out + got, n - got, 0);
    if (r > 0) {
      got += static_cast<size_t>(r);
    } else if (r == 0) {
      return absl::UnavailableError("the connection was closed by the peer");
    } else if (errno == EINTR) {
      continue;
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (on_idle && !on_idle()) return absl::CancelledError("stopped reading");
    } else {
      return Errno("receive");
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<grpc::ByteBuffer> ReadPayload(int fd, uint64_t n,
                                             const std::function<bool()>& on_idle) {
  if (n == 0) return grpc::ByteBuffer(nullptr, 0);
  BufferRef block = BufferPool::Default()->Get(n);
  if (absl::Status s = ReadFull(fd, block.data(), n, on_idle); !s.ok()) return s;
  Buffer* b = block.get();
  b->Ref();  // released by gRPC through DestroyBuffer
  grpc::Slice slice(block.data(), n, &DestroyBuffer, b);
  return grpc::ByteBuffer(&slice, 1);
}

absl::StatusOr<std::shared_ptr<DataChannel>> DataChannel::Connect(const std::string& host, int port,
                                                                  const std::string& token,
                                                                  absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  const std::string peer = absl::StrCat(host, ":", port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (int e = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found); e != 0) {
    return absl::UnavailableError(absl::StrCat("cannot resolve ", host, ": ", gai_strerror(e)));
  }
  int fd = -1;
  absl::Status why = absl::UnavailableError(absl::StrCat("no address for ", host));
  for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) {
      why = Errno("socket");
      continue;
    }
    int r = connect(fd, a->ai_addr, a->ai_addrlen);
    if (r != 0 && errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      const int ms =
          static_cast<int>(std::max<int64_t>(0, absl::ToInt64Milliseconds(deadline - absl::Now())));
      r = poll(&p, 1, ms);
      int err = r == 1 ? 0 : ETIMEDOUT;
      socklen_t len = sizeof(err);
      if (r == 1) getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      errno = err;
      r = err == 0 ? 0 : -1;
    }
    if (r != 0) {
      why = Errno(absl::StrCat("cannot connect to the data port ", peer));
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(found);
  if (fd < 0) return why;
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  TuneDataSocket(fd);

  FrameHeader hello;
  hello.kind = FrameKind::kHello;
  hello.text_bytes = static_cast<uint32_t>(token.size());
  auto in_time = [deadline] { return absl::Now() < deadline; };
  absl::Status s = token.size() > FrameHeader::kMaxText
                       ? absl::InvalidArgumentError("the job token is too long")
                       : WriteFrame(fd, hello, token, nullptr, deadline);
  char head[FrameHeader::kBytes];
  if (s.ok()) s = ReadFull(fd, head, sizeof(head), in_time);
  absl::StatusOr<FrameHeader> answer = s.ok() ? FrameHeader::Read(head, 0) : s;
  std::string text;
  if (answer.ok()) {
    text.resize(answer->text_bytes);
    s = ReadFull(fd, text.data(), text.size(), in_time);
  }
  if (s.ok() && !answer.ok()) s = answer.status();
  if (s.ok() && answer->kind != FrameKind::kAnswer) {
    s = absl::InternalError("the server did not answer the hello");
  }
  if (s.ok() && answer->code != 0) {
    s = FromGrpc(grpc::Status(static_cast<grpc::StatusCode>(answer->code), text));
  }
  if (!s.ok()) {
    close(fd);
    if (s.code() == absl::StatusCode::kUnauthenticated) return s;
    return absl::UnavailableError(
        absl::StrCat("the data port ", peer, " did not take this worker: ", s.message()));
  }
  std::shared_ptr<DataChannel> channel(new DataChannel(fd, peer));
  channel->reader_ = std::thread([self = channel] { self->ReadAnswers(); });
  return channel;
}

DataChannel::DataChannel(int fd, std::string peer) : fd_(fd), peer_(std::move(peer)) {}

DataChannel::~DataChannel() {
  // The reader held the last reference: it is ending, on this thread.
  if (reader_.joinable()) reader_.detach();
  close(fd_);
}

void DataChannel::Close() {
  closing_.store(true, std::memory_order_release);
  shutdown(fd_, SHUT_RDWR);  // wakes the reader, which ends the calls
}

void DataChannel::Call(FrameKind method, const grpc::ByteBuffer& req, absl::Duration timeout,
                       grpc::ByteBuffer* resp, Done done, absl::string_view text) {
  if (broken()) {
    return done(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                             absl::StrCat("the data channel to ", peer_, " is closed")));
  }
  if (text.size() > FrameHeader::kMaxText) {
    return done(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                             absl::StrCat("a request with ", text.size(), " bytes of text; the most is ",
                                          FrameHeader::kMaxText)));
  }
  const absl::Time deadline = absl::Now() + timeout;
  FrameHeader h;
  h.kind = method;
  h.code =
      static_cast<uint32_t>(std::clamp<int64_t>(absl::ToInt64Milliseconds(timeout), 1, UINT32_MAX));
  h.text_bytes = static_cast<uint32_t>(text.size());
  h.payload_bytes = req.Valid() ? req.Length() : 0;
  {
    absl::MutexLock lock(&mu_);
    h.call = next_call_++;
    pending_[h.call] = Pending{resp, std::move(done), deadline};
  }
  absl::Status s;
  {
    absl::MutexLock lock(&write_mu_);
    s = WriteFrame(fd_, h, text, &req, deadline);
  }
  // Part of a frame may have gone: the stream is unusable after any failure.
  if (!s.ok()) {
    Break(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                       absl::StrCat("the data channel to ", peer_, " broke: ", s.message())));
  }
}

bool DataChannel::Expire() {
  if (closing_.load(std::memory_order_acquire)) return false;
  const absl::Time now = absl::Now();
  std::vector<Done> late;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (it->second.deadline <= now) {
        late.push_back(std::move(it->second.done));
        pending_.erase(it++);
      } else {
        ++it;
      }
    }
  }
  for (Done& d : late) {
    d(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                   absl::StrCat("no answer from ", peer_, " before the call's deadline")));
  }
  return true;
}

void DataChannel::Break(const grpc::Status& why) {
  broken_.store(true, std::memory_order_release);
  shutdown(fd_, SHUT_RDWR);
  absl::flat_hash_map<uint64_t, Pending> calls;
  {
    absl::MutexLock lock(&mu_);
    calls.swap(pending_);
  }
  for (auto& [id, p] : calls) p.done(why);
}

void DataChannel::ReadAnswers() {
  auto on_idle = [this] { return Expire(); };
  grpc::Status why;
  while (true) {
    int wait_ms = 1000;
    {
      absl::MutexLock lock(&mu_);
      const absl::Time now = absl::Now();
      for (const auto& [id, p] : pending_) {
        wait_ms = std::min<int64_t>(
            wait_ms, std::max<int64_t>(0, absl::ToInt64Milliseconds(p.deadline - now) + 1));
      }
    }
    pollfd p{fd_, POLLIN, 0};
    const int r = poll(&p, 1, wait_ms);
    if (closing_.load(std::memory_order_acquire)) {
      why = grpc::Status(grpc::StatusCode::CANCELLED, "the client is closing");
      break;
    }
    if (r <= 0) {
      Expire();
      continue;
    }
    char head[FrameHeader::kBytes];
    absl::Status s = ReadFull(fd_, head, sizeof(head), on_idle);
    absl::StatusOr<FrameHeader> h = s.ok() ? FrameHeader::Read(head, kDefaultMaxMessageBytes) : s;
    if (h.ok() && h->kind != FrameKind::kAnswer) {
      h = absl::InternalError("the server sent a frame that is no answer");
    }
    std::string text;
    if (h.ok()) {
      text.resize(h->text_bytes);
      if (s = ReadFull(fd_, text.data(), text.size(), on_idle); !s.ok()) h = s;
    }
    if (!h.ok()) {
      why = closing_.load() ? grpc::Status(grpc::StatusCode::CANCELLED, "the client is closing")
                            : grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                           absl::StrCat("the data channel to ", peer_,
                                                        " broke: ", h.status().message()));
      break;
    }
    // Read the body even for a call that has already ended (its deadline
    // passed): the next frame starts after it.
    absl::StatusOr<grpc::ByteBuffer> body = ReadPayload(fd_, h->payload_bytes, on_idle);
    if (!body.ok()) {
      why = grpc::Status(
          grpc::StatusCode::UNAVAILABLE,
          absl::StrCat("the data channel to ", peer_, " broke: ", body.status().message()));
      break;
    }
    Pending call;
    {
      absl::MutexLock lock(&mu_);
      auto it = pending_.find(h->call);
      if (it == pending_.end()) continue;
      call = std::move(it->second);
      pending_.erase(it);
    }
    if (h->code != 0) {
      call.done(grpc::Status(static_cast<grpc::StatusCode>(h->code), text));
      continue;
    }
    *call.resp = *std::move(body);
    call.done(grpc::Status::OK);
  }
  Break(why);
}

absl::StatusOr<std::shared_ptr<DataChannel>> OpenDataChannel(
    v1::ParameterServer::Stub* control, const std::string& address,
    const v1::DataChannelRequest& req, const std::string& token, absl::Duration timeout,
    int* port) {
  if (*port < 0) {
    v1::DataChannelResponse resp;
    grpc::ClientContext ctx;
    PrepareContext(&ctx, token, timeout);
    grpc::Status st = control->DataChannel(&ctx, req, &resp);
    if (!st.ok()) return absl::UnavailableError(st.error_message());
    *port = resp.port();
  }
  if (*port <= 0) return absl::FailedPreconditionError("it has no data channel (mutual TLS)");
  // Short: a port a firewall drops would otherwise hold up every start.
  absl::StatusOr<std::shared_ptr<DataChannel>> opened =
      DataChannel::Connect(HostOf(address), *port, token, std::min(timeout, absl::Seconds(3)));
  if (!opened.ok()) return absl::FailedPreconditionError(opened.status().message());
  return opened;
}

}  // namespace psrt
