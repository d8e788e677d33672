// The parameter server as a client reaches it: raw bytes to every method of
// a real psrt-server's gRPC service (PsService over loopback TCP, with its
// interceptor), with the job's token, without one, or with another job's;
// the same bytes as pushes and pulls over its data channel (DataServer,
// common/data_channel.h); and raw bytes to the data port after a hello.
// Oracles, beyond "no crash":
// - without the job's token every call is UNAUTHENTICATED, whatever its
//   bytes: nothing about a request is answered before the token is checked;
// - every error text fits what gRPC delivers (kMaxErrorBytes);
// - every call answers by its deadline (2 s), plus a margin;
// - a well-framed request never breaks the data channel, whatever its body;
// - raw bytes on the data port are answered or the connection is closed,
//   by the deadline.
// The store behind it lives across inputs (the server is started once).

#include <arpa/inet.h>
#include <grpc/grpc.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/functional/bind_front.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/data_channel.h"
#include "common/grpc_util.h"
#include "common/metrics.h"
#include "psrt/v1/ps.pb.h"
#include "server/data_server.h"
#include "server/ps_service.h"
#include "server/store.h"
#include "tests/fuzz/calls.h"

namespace psrt::fuzz {
namespace {

constexpr char kToken[] = "fuzz-job-token";

struct Method {
  const char* path;  // gRPC's; or "data:" for the data channel, "raw:" for the data port
  const google::protobuf::Message* prototype;
  FrameKind kind = FrameKind::kPush;  // the data channel's
};

const std::vector<Method>& Methods() {
  static const auto* m = new std::vector<Method>{
      {"/psrt.v1.ParameterServer/RegisterKeys", &v1::RegisterKeysRequest::default_instance()},
      {"/psrt.v1.ParameterServer/Push", &v1::PushRequest::default_instance()},
      {"/psrt.v1.ParameterServer/Pull", &v1::PullRequest::default_instance()},
      {"/psrt.v1.ParameterServer/PushPull", &v1::PushPullRequest::default_instance()},
      {"/psrt.v1.ParameterServer/SetLearningRate", &v1::SetLearningRateRequest::default_instance()},
      {"/psrt.v1.ParameterServer/Stats", &v1::StatsRequest::default_instance()},
      {"/psrt.v1.ParameterServer/SaveShard", &v1::SaveShardRequest::default_instance()},
      {"/psrt.v1.ParameterServer/AttachSharedMemory",
       &v1::AttachSharedMemoryRequest::default_instance()},
      {"/psrt.v1.ParameterServer/Replicate", &v1::ReplicateRequest::default_instance()},
      {"/psrt.v1.ParameterServer/Seed", &v1::SeedRequest::default_instance()},
      {"data:Push", &v1::PushRequest::default_instance(), FrameKind::kPush},
      {"data:Pull", &v1::PullRequest::default_instance(), FrameKind::kPull},
      {"data:PushPull", &v1::PushPullRequest::default_instance(), FrameKind::kPushPull},
      // A server's update to a copy: the request as the frame's text, its
      // gradient (where the bytes parse as one) as the payload.
      {"data:Replicate", &v1::ReplicateRequest::default_instance(), FrameKind::kReplicate},
      {"raw:", &v1::PushRequest::default_instance()}};
  return *m;
}

const std::vector<const google::protobuf::Message*>& Prototypes() {
  static const auto* p = [] {
    auto* out = new std::vector<const google::protobuf::Message*>;
    for (const Method& m : Methods()) out->push_back(m.prototype);
    return out;
  }();
  return *p;
}

// One server for the whole run: a sync job of two workers whose store holds
// a small dense variable.
struct Server {
  Metrics metrics{"psrt_server"};
  std::unique_ptr<Store> store;
  std::unique_ptr<PsService> service;
  ServingServer serving;
  std::unique_ptr<grpc::GenericStub> stub;
  std::unique_ptr<DataServer> data;
  std::shared_ptr<DataChannel> channel;
};

Server* Start() {
  auto* s = new Server;
  StoreOptions options;
  options.num_workers = 2;
  options.max_key_bytes = 1 << 16;
  options.max_bytes = 16 << 20;
  options.apply_threads = 1;
  options.max_pull_wait = absl::Milliseconds(200);
  s->store = std::make_unique<Store>(options, &s->metrics);
  v1::RegisterKeysRequest req;
  v1::KeySpec* w = req.add_keys();
  w->set_variable("w");
  w->set_dtype(v1::DTYPE_FLOAT32);
  w->add_shape(16);
  w->set_num_elements(16);
  w->mutable_optimizer()->set_name("sgd");
  w->mutable_optimizer()->set_lr(0.1);
  w->set_init(std::string(16 * 4, '\0'));
  if (!s->store->RegisterKeys(req).ok()) std::abort();
  s->service = std::make_unique<PsService>(s->store.get(), &s->metrics, kToken, 8);
  absl::StatusOr<ServingServer> serving = StartServer("127.0.0.1", 0, s->service.get(), kToken);
  if (!serving.ok()) std::abort();
  s->serving = std::move(*serving);
  s->stub = std::make_unique<grpc::GenericStub>(
      MakeChannel("127.0.0.1:" + std::to_string(s->serving.port)));
  PsService* service = s->service.get();
  absl::StatusOr<std::unique_ptr<DataServer>> data =
      DataServer::Start("127.0.0.1", 0, kToken, absl::bind_front(&PsService::ServeData, service));
  if (!data.ok()) std::abort();
  s->data = *std::move(data);
  absl::StatusOr<std::shared_ptr<DataChannel>> channel =
      DataChannel::Connect("127.0.0.1", s->data->port(), kToken, absl::Seconds(10));
  if (!channel.ok()) std::abort();
  s->channel = *std::move(channel);
  return s;
}

// Sends a hello and then `bytes` on a new connection to the data port, and
// reads until the server closes it or `timeout` passes; aborts on a hang.
void RawToDataPort(int port, const std::string& bytes, absl::Duration timeout) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) std::abort();
  timeval tv{0, 100 * 1000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  FrameHeader hello;
  hello.kind = FrameKind::kHello;
  hello.text_bytes = sizeof(kToken) - 1;
  const absl::Time deadline = absl::Now() + timeout;
  if (!WriteFrame(fd, hello, kToken, nullptr, deadline).ok()) std::abort();
  // The server may close the connection before taking everything: fine.
  // Then no more: the server answers what it read and closes.
  send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
  shutdown(fd, SHUT_WR);
  char buf[4096];
  while (absl::Now() < deadline) {
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) break;
  }
  close(fd);
}

}  // namespace
}  // namespace psrt::fuzz

using namespace psrt;        // NOLINT
using namespace psrt::fuzz;  // NOLINT

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  grpc_init();
  fuzz::QuietLogs();
  return 0;
}

extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size,
                                          unsigned seed) {
  return MutateCalls(data, size, max_size, seed, Prototypes());
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Server* server = Start();
  const std::vector<Call> calls = DecodeCalls(data, size);
  if (calls.size() > 16) return 0;
  for (const Call& call : calls) {
    const Method& method = Methods()[call.kind % Methods().size()];
    if (std::string(method.path) == "raw:") {
      // Unanswered frames wait at most until their own deadline there.
      RawToDataPort(server->data->port(), call.bytes, absl::Seconds(3));
      continue;
    }
    if (std::string(method.path).rfind("data:", 0) == 0) {
      std::string text, payload = call.bytes;
      if (method.kind == FrameKind::kReplicate) {
        v1::ReplicateRequest r;
        if (r.ParseFromString(call.bytes)) {
          payload = r.gradient();
          r.clear_gradient();
          text = r.SerializeAsString();
        } else {
          text = call.bytes.substr(0, FrameHeader::kMaxText);
          payload.clear();
        }
      }
      grpc::Slice slice(payload);
      grpc::ByteBuffer req(&slice, 1), resp;
      grpc::Status status;
      absl::Notification done;
      const absl::Time start = absl::Now();
      server->channel->Call(
          method.kind, req, absl::Seconds(2), &resp,
          [&](grpc::Status s) {
            status = std::move(s);
            done.Notify();
          },
          text);
      if (!done.WaitForNotificationWithTimeout(absl::Seconds(10))) std::abort();  // a hang
      if (absl::Now() - start > absl::Seconds(4)) std::abort();  // long past its deadline
      if (server->channel->broken()) std::abort();  // a well-framed request broke the channel
      if (status.error_message().size() > kMaxErrorBytes) std::abort();
      continue;
    }
    // The kind's high bits choose the token: 0 the job's, 1 none, 2 another.
    const int token = (call.kind / Methods().size()) % 3;
    grpc::ClientContext ctx;
    PrepareContext(&ctx, token == 0 ? kToken : token == 1 ? "" : "another-job", absl::Seconds(2));
    grpc::Slice slice(call.bytes);
    grpc::ByteBuffer req(&slice, 1), resp;
    grpc::Status status;
    absl::Notification done;
    const absl::Time start = absl::Now();
    server->stub->UnaryCall(&ctx, method.path, grpc::StubOptions(), &req, &resp,
                            [&](grpc::Status s) {
                              status = std::move(s);
                              done.Notify();
                            });
    if (!done.WaitForNotificationWithTimeout(absl::Seconds(10))) std::abort();  // a hang
    if (absl::Now() - start > absl::Seconds(4)) std::abort();  // answered long past its deadline
    if (token != 0 && status.error_code() != grpc::StatusCode::UNAUTHENTICATED)
      std::abort();  // token not first
    if (status.error_message().size() > kMaxErrorBytes)
      std::abort();  // an error gRPC may not deliver
  }
  return 0;
}
