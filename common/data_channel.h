#ifndef PSRT_COMMON_DATA_CHANNEL_H_
#define PSRT_COMMON_DATA_CHANNEL_H_

// The data channel: pushes and pulls over a plain TCP connection beside
// gRPC, as TensorFlow's grpc+verbs puts tensors beside its gRPC control
// plane. A request's body is the same psrt.v1 message gRPC would carry
// (common/tensor_coding.h); only the framing differs: a fixed 32-byte
// header instead of HTTP/2, no flow-control windows, and no thread hand-off
// between the socket and the code that reads it. Sender: one writev from
// the message's slices (the caller's tensor, a pooled buffer). Receiver:
// one read into a pooled buffer, which the parser then reads in place.
//
// A connection starts with a hello frame carrying the job token; the server
// answers it (code 0, or UNAUTHENTICATED and closes). Then each request
// frame names its call, method and time left, and each answer frame its
// call, a gRPC status code, an error text and the answer's body. Answers
// may come in any order. Integers are little-endian.

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/status.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "psrt/v1/ps.grpc.pb.h"

namespace psrt {

// kReplicate: a server's update to the copy of one of its keys on another
// server (server/replicator.h), its ReplicateRequest in the frame's text and
// its float32 gradient as the payload.
enum class FrameKind : uint8_t {
  kHello = 1,
  kPush = 2,
  kPull = 3,
  kPushPull = 4,
  kAnswer = 5,
  kReplicate = 6,
};

struct FrameHeader {
  static constexpr uint32_t kMagic = 0x44525350;  // "PSRD"
  static constexpr size_t kBytes = 32;
  // The longest token or error text a frame carries.
  static constexpr uint32_t kMaxText = 4096;

  FrameKind kind = FrameKind::kAnswer;
  // Requests: milliseconds left before the caller's deadline. Answers: the
  // gRPC status code.
  uint32_t code = 0;
  // Hello: the token; answers: the error text; Replicate: its request.
  uint32_t text_bytes = 0;
  uint64_t call = 0;
  uint64_t payload_bytes = 0;

  void Write(char out[kBytes]) const;
  // INVALID_ARGUMENT, saying what is wrong, for bytes that are no frame
  // header or one past the limits (`max_payload`, kMaxText).
  static absl::StatusOr<FrameHeader> Read(const char in[kBytes], uint64_t max_payload);
};

// Writes the header, then `text`, then the buffer's slices, in as few
// system calls as the kernel takes; the socket has a send timeout, and a
// frame not sent by `deadline` is DEADLINE_EXCEEDED (part of it may have
// gone: the connection is unusable then). Callers
// serialize writes to one socket.
absl::Status WriteFrame(int fd, const FrameHeader& header, absl::string_view text,
                        const grpc::ByteBuffer* payload, absl::Time deadline);
// Sets a data-channel socket up, at either end: no Nagle delay, and reads
// and writes that block at most 100 ms before their caller looks at its
// deadlines (and whether it is stopping) again.
void TuneDataSocket(int fd);
// Reads exactly `n` bytes. `on_idle` (optional) runs each time the socket's
// receive timeout passes with nothing read; returning false gives up.
absl::Status ReadFull(int fd, char* out, size_t n, const std::function<bool()>& on_idle = {});
// Reads `n` payload bytes into a pooled buffer, as a byte buffer that holds it.
absl::StatusOr<grpc::ByteBuffer> ReadPayload(int fd, uint64_t n,
                                             const std::function<bool()>& on_idle = {});

// A worker's connection to one server's data port. Calls may be issued
// from any thread; one thread per channel reads the answers and runs the
// callbacks (small answers there, as gRPC's callback API does). That
// thread holds the channel until Close or a broken connection ends it, so
// a callback may drop the last other reference.
class DataChannel : public std::enable_shared_from_this<DataChannel> {
 public:
  using Done = std::function<void(grpc::Status)>;

  // Connects to host:port (`host` as getaddrinfo takes it: HostOf in
  // common/net.h) and says hello with `token`, within `timeout`.
  // UNAVAILABLE when the port cannot be reached, UNAUTHENTICATED when the
  // server refuses the token.
  static absl::StatusOr<std::shared_ptr<DataChannel>> Connect(const std::string& host, int port,
                                                              const std::string& token,
                                                              absl::Duration timeout);
  ~DataChannel();
  DataChannel(const DataChannel&) = delete;
  DataChannel& operator=(const DataChannel&) = delete;

  // Sends `req` (and `text`, where `method` takes one) as `method`; `req`
  // is not used once Call returns. `done` runs once, maybe before Call
  // returns: OK with the answer in *resp, or the server's error,
  // DEADLINE_EXCEEDED after `timeout`, UNAVAILABLE when the connection broke
  // (then every later call fails at once too), CANCELLED after Close.
  void Call(FrameKind method, const grpc::ByteBuffer& req, absl::Duration timeout,
            grpc::ByteBuffer* resp, Done done, absl::string_view text = {});
  // Ends every call in flight with CANCELLED and refuses new ones; returns
  // at once (the reader runs their callbacks).
  void Close();
  // The connection broke or was closed: new calls fail at once.
  bool broken() const { return broken_.load(std::memory_order_acquire); }
  const std::string& peer() const { return peer_; }

 private:
  DataChannel(int fd, std::string peer);
  struct Pending {
    grpc::ByteBuffer* resp;
    Done done;
    absl::Time deadline;
  };
  void ReadAnswers();
  // Ends the calls past their deadline; false once the channel is closing.
  bool Expire();
  // Marks the channel broken and ends every call in flight with `why`.
  void Break(const grpc::Status& why);

  const int fd_;
  const std::string peer_;
  std::atomic<bool> broken_{false};
  std::atomic<bool> closing_{false};
  absl::Mutex write_mu_;
  absl::Mutex mu_;
  uint64_t next_call_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<uint64_t, Pending> pending_ ABSL_GUARDED_BY(mu_);
  std::thread reader_;
};

// Opens a data channel to the server at `address` (host:port of its gRPC
// face, `control`), first asking `control` for the data port (`req` says
// who asks) unless *port already holds it (0: the server has none). Waits
// at most `timeout` for the answer and 3 s for the connection. UNAVAILABLE:
// `control` did not answer (ask again later); FAILED_PRECONDITION, saying
// why: the server has no data port (mutual TLS) or it cannot be reached, so
// gRPC carries its calls from then on.
absl::StatusOr<std::shared_ptr<DataChannel>> OpenDataChannel(
    v1::ParameterServer::Stub* control, const std::string& address,
    const v1::DataChannelRequest& req, const std::string& token, absl::Duration timeout,
    int* port);

}  // namespace psrt

#endif  // PSRT_COMMON_DATA_CHANNEL_H_
