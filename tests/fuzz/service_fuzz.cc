// The parameter server as a client reaches it: raw bytes to every method of
// a real psrt-server's gRPC service (PsService over loopback TCP, with its
// interceptor), with the job's token, without one, or with another job's.
// Oracles, beyond "no crash":
// - without the job's token every call is UNAUTHENTICATED, whatever its
//   bytes: nothing about a request is answered before the token is checked;
// - every error text fits what gRPC delivers (kMaxErrorBytes);
// - every call answers by its deadline (2 s), plus a margin.
// The store behind it lives across inputs (the server is started once).

#include <grpc/grpc.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/grpc_util.h"
#include "common/metrics.h"
#include "psrt/v1/ps.pb.h"
#include "server/ps_service.h"
#include "server/store.h"
#include "tests/fuzz/calls.h"

namespace psrt::fuzz {
namespace {

constexpr char kToken[] = "fuzz-job-token";

struct Method {
  const char* path;
  const google::protobuf::Message* prototype;
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
      {"/psrt.v1.ParameterServer/AttachSharedMemory", &v1::AttachSharedMemoryRequest::default_instance()},
      {"/psrt.v1.ParameterServer/Replicate", &v1::ReplicateRequest::default_instance()},
      {"/psrt.v1.ParameterServer/Seed", &v1::SeedRequest::default_instance()}};
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
  s->stub = std::make_unique<grpc::GenericStub>(MakeChannel("127.0.0.1:" + std::to_string(s->serving.port)));
  return s;
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

extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size, unsigned seed) {
  return MutateCalls(data, size, max_size, seed, Prototypes());
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Server* server = Start();
  const std::vector<Call> calls = DecodeCalls(data, size);
  if (calls.size() > 16) return 0;
  for (const Call& call : calls) {
    const Method& method = Methods()[call.kind % Methods().size()];
    // The kind's high bits choose the token: 0 the job's, 1 none, 2 another.
    const int token = (call.kind / Methods().size()) % 3;
    grpc::ClientContext ctx;
    PrepareContext(&ctx, token == 0 ? kToken : token == 1 ? "" : "another-job", absl::Seconds(2));
    grpc::Slice slice(call.bytes);
    grpc::ByteBuffer req(&slice, 1), resp;
    grpc::Status status;
    absl::Notification done;
    const absl::Time start = absl::Now();
    server->stub->UnaryCall(&ctx, method.path, grpc::StubOptions(), &req, &resp, [&](grpc::Status s) {
      status = std::move(s);
      done.Notify();
    });
    if (!done.WaitForNotificationWithTimeout(absl::Seconds(10))) std::abort();  // a hang
    if (absl::Now() - start > absl::Seconds(4)) std::abort();  // answered long past its deadline
    if (token != 0 && status.error_code() != grpc::StatusCode::UNAUTHENTICATED) std::abort();  // token not first
    if (status.error_message().size() > kMaxErrorBytes) std::abort();  // an error gRPC may not deliver
  }
  return 0;
}
