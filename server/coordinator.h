#ifndef PSRT_SERVER_COORDINATOR_H_
#define PSRT_SERVER_COORDINATOR_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "psrt/v1/coordinator.grpc.pb.h"
#include "server/job.h"

namespace psrt {

// psrt.v1.Coordinator over gRPC: checks each call's job token, parses its
// request and hands it to the Job (server/job.h), which does the work.
//
// Every method but Checkpoint and RemoveServer (which wait for the servers)
// is a callback method, answered on gRPC's own threads: a job's processes all
// register and wait in the barrier at once, and a thread per call would cap
// a job at the server's thread limit (docs/deployment.md, "Limits"). They
// take and give bytes, parsed here: gRPC's callback handlers answer a
// request that does not parse with a bare UNIMPLEMENTED, and Barrier's
// answer is serialized once for every caller.
using CoordinatorBase = v1::Coordinator::WithRawCallbackMethod_Register<
    v1::Coordinator::WithRawCallbackMethod_Barrier<v1::Coordinator::WithRawCallbackMethod_Heartbeat<
        v1::Coordinator::WithRawCallbackMethod_ReportExit<
            v1::Coordinator::WithRawCallbackMethod_GetJobStatus<v1::Coordinator::Service>>>>>;

// The calls a Job makes to the servers, over gRPC with the job's token.
class GrpcServerCalls final : public ServerCalls {
 public:
  explicit GrpcServerCalls(std::string token) : token_(std::move(token)) {}
  absl::StatusOr<v1::StatsResponse> Stats(const std::string& address,
                                          absl::Duration timeout) override;

 private:
  const std::string token_;
};

class CoordinatorService final : public CoordinatorBase {
 public:
  // `job` outlives the service.
  CoordinatorService(Job* job, std::string token) : job_(job), token_(std::move(token)) {}

  // Each an XRequest in, an XResponse out.
  grpc::ServerUnaryReactor* Register(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req,
                                     grpc::ByteBuffer* resp) override;
  grpc::ServerUnaryReactor* Barrier(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req,
                                    grpc::ByteBuffer* resp) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req,
                                      grpc::ByteBuffer* resp) override;
  grpc::ServerUnaryReactor* ReportExit(grpc::CallbackServerContext* ctx,
                                       const grpc::ByteBuffer* req,
                                       grpc::ByteBuffer* resp) override;
  grpc::ServerUnaryReactor* GetJobStatus(grpc::CallbackServerContext* ctx,
                                         const grpc::ByteBuffer* req,
                                         grpc::ByteBuffer* resp) override;
  grpc::Status Checkpoint(grpc::ServerContext* ctx, const v1::CheckpointRequest* req,
                          v1::CheckpointResponse* resp) override;
  grpc::Status RemoveServer(grpc::ServerContext* ctx, const v1::RemoveServerRequest* req,
                            v1::RemoveServerResponse* resp) override;

 private:
  Job* const job_;
  const std::string token_;
};

}  // namespace psrt

#endif  // PSRT_SERVER_COORDINATOR_H_
