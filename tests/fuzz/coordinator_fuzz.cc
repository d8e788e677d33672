// The coordinator's request handling, fuzzed: a sequence of Register,
// Barrier, Heartbeat, ReportExit, GetJobStatus and Checkpoint requests
// against a real CoordinatorService and Job of a two-host job (sync, "fail" on
// loss, no checkpoints and no replicas, so it never dials the addresses the
// requests name). Structure-aware mutations (calls.h). Every call must
// answer within its bound: a barrier waits at most barrier_timeout_s.

#include <grpcpp/grpcpp.h>

#include <chrono>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <vector>

#include "absl/time/clock.h"
#include "common/distribution.h"
#include "common/metrics.h"
#include "psrt/v1/coordinator.grpc.pb.h"
#include "server/coordinator.h"
#include "tests/fuzz/calls.h"

namespace psrt::fuzz {
namespace {

enum Kind : uint8_t { kRegister, kBarrier, kHeartbeat, kReportExit, kStatus, kCheckpoint };

const std::vector<const google::protobuf::Message*>& Prototypes() {
  static const auto* p = new std::vector<const google::protobuf::Message*>{
      &v1::RegisterRequest::default_instance(),   &v1::BarrierRequest::default_instance(),
      &v1::HeartbeatRequest::default_instance(),  &v1::ReportExitRequest::default_instance(),
      &v1::JobStatusRequest::default_instance(),  &v1::CheckpointRequest::default_instance()};
  return *p;
}

}  // namespace
}  // namespace psrt::fuzz

using namespace psrt;        // NOLINT
using namespace psrt::fuzz;  // NOLINT

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fuzz::QuietLogs();
  return 0;
}

extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size, unsigned seed) {
  return MutateCalls(data, size, max_size, seed, Prototypes());
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<Call> calls = DecodeCalls(data, size);
  if (calls.size() > 64) return 0;
  static const PsOptions* ps = [] {
    absl::StatusOr<PsOptions> o = ParseDistribution(
        R"({"parameter_server":{"enabled":true,"heartbeat_timeout_s":30,"barrier_timeout_s":0.002}})");
    if (!o.ok()) std::abort();
    return new PsOptions(*o);
  }();
  CoordinatorOptions options;
  options.hosts = {"host-a", "host-b"};
  options.ps = *ps;
  Metrics metrics("psrt_coordinator");
  Job job(options, &metrics);
  CoordinatorService service(&job, options.token);
  // Through a real server (in process): the methods are gRPC callbacks.
  grpc::ServerBuilder builder;
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr) std::abort();
  std::unique_ptr<v1::Coordinator::Stub> stub =
      v1::Coordinator::NewStub(server->InProcessChannel(grpc::ChannelArguments()));
  for (const Call& call : calls) {
    std::unique_ptr<google::protobuf::Message> m(Prototypes()[call.kind % Prototypes().size()]->New());
    if (!m->ParseFromString(call.bytes)) continue;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    const absl::Time start = absl::Now();
    switch (call.kind % Prototypes().size()) {
      case kRegister: {
        v1::RegisterResponse resp;
        (void)stub->Register(&ctx, *static_cast<v1::RegisterRequest*>(m.get()), &resp);
        break;
      }
      case kBarrier: {
        v1::BarrierResponse resp;
        (void)stub->Barrier(&ctx, *static_cast<v1::BarrierRequest*>(m.get()), &resp);
        break;
      }
      case kHeartbeat: {
        v1::HeartbeatResponse resp;
        (void)stub->Heartbeat(&ctx, *static_cast<v1::HeartbeatRequest*>(m.get()), &resp);
        break;
      }
      case kReportExit: {
        v1::ReportExitResponse resp;
        (void)stub->ReportExit(&ctx, *static_cast<v1::ReportExitRequest*>(m.get()), &resp);
        break;
      }
      case kStatus: {
        v1::JobStatusResponse resp;
        (void)stub->GetJobStatus(&ctx, *static_cast<v1::JobStatusRequest*>(m.get()), &resp);
        break;
      }
      case kCheckpoint: {
        v1::CheckpointResponse resp;
        (void)stub->Checkpoint(&ctx, *static_cast<v1::CheckpointRequest*>(m.get()), &resp);
        break;
      }
    }
    if (absl::Now() - start > absl::Seconds(5)) std::abort();  // a wait past its bound
  }
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  return 0;
}
