#include "server/coordinator.h"

#include "absl/time/clock.h"
#include "common/grpc_util.h"
#include "psrt/v1/ps.grpc.pb.h"

namespace psrt {
namespace {

// A callback method's answer, now.
grpc::ServerUnaryReactor* Answer(grpc::CallbackServerContext* ctx, const grpc::Status& s) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(s);
  return reactor;
}

// A raw method's request, parsed as the sync methods' are
// (common/request_traits.h: INVALID_ARGUMENT naming the type).
grpc::Status Decode(const grpc::ByteBuffer& bytes, grpc::protobuf::MessageLite* msg) {
  grpc::ByteBuffer copy(bytes);  // Deserialize consumes its buffer
  return grpc::SerializationTraits<grpc::protobuf::MessageLite>::Deserialize(&copy, msg);
}

grpc::Status Encode(const grpc::protobuf::MessageLite& msg, grpc::ByteBuffer* bytes) {
  bool own = false;
  return grpc::SerializationTraits<grpc::protobuf::MessageLite>::Serialize(msg, bytes, &own);
}

// A raw unary method: checks the token, parses its Request, runs `serve`,
// sends its Response.
template <typename Request, typename Response, typename Serve>
grpc::ServerUnaryReactor* Unary(grpc::CallbackServerContext* ctx, const std::string& token,
                                const grpc::ByteBuffer* in, grpc::ByteBuffer* out, Serve serve) {
  Request req;
  Response resp;
  grpc::Status s = CheckToken(ctx, token);
  if (s.ok()) s = Decode(*in, &req);
  if (s.ok()) s = ToGrpc(serve(req, &resp));
  if (s.ok()) s = Encode(resp, out);
  return Answer(ctx, s);
}

// The caller's deadline, at most `cap` away, on the job's clock.
absl::Time Deadline(const Job& job, const grpc::ServerContextBase* ctx, absl::Duration cap) {
  return job.Now() + TimeLeft(ctx, cap);
}

// The longest a blocking call waits, whatever its caller's deadline.
constexpr absl::Duration kLongestWait = absl::Minutes(10);

}  // namespace

grpc::ServerUnaryReactor* CoordinatorService::Register(grpc::CallbackServerContext* ctx,
                                                       const grpc::ByteBuffer* in,
                                                       grpc::ByteBuffer* out) {
  return Unary<v1::RegisterRequest, v1::RegisterResponse>(
      ctx, token_, in, out, [&](const v1::RegisterRequest& req, v1::RegisterResponse* resp) {
        return job_->Register(req, resp);
      });
}

grpc::ServerUnaryReactor* CoordinatorService::Barrier(grpc::CallbackServerContext* ctx,
                                                      const grpc::ByteBuffer* in,
                                                      grpc::ByteBuffer* out) {
  if (grpc::Status s = CheckToken(ctx, token_); !s.ok()) return Answer(ctx, s);
  v1::BarrierRequest req;
  if (grpc::Status s = Decode(*in, &req); !s.ok()) return Answer(ctx, s);
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  job_->Barrier(
      req, Deadline(*job_, ctx, absl::InfiniteDuration()), [ctx] { return ctx->IsCancelled(); },
      [reactor, out](const absl::Status& s, std::shared_ptr<const std::string> answer) {
        if (answer != nullptr) {
          grpc::Slice slice(answer->data(), answer->size());
          *out = grpc::ByteBuffer(&slice, 1);
        }
        reactor->Finish(ToGrpc(s));
      });
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::Heartbeat(grpc::CallbackServerContext* ctx,
                                                        const grpc::ByteBuffer* in,
                                                        grpc::ByteBuffer* out) {
  return Unary<v1::HeartbeatRequest, v1::HeartbeatResponse>(
      ctx, token_, in, out, [&](const v1::HeartbeatRequest& req, v1::HeartbeatResponse* resp) {
        return job_->Heartbeat(req, resp);
      });
}

grpc::ServerUnaryReactor* CoordinatorService::ReportExit(grpc::CallbackServerContext* ctx,
                                                         const grpc::ByteBuffer* in,
                                                         grpc::ByteBuffer* out) {
  return Unary<v1::ReportExitRequest, v1::ReportExitResponse>(
      ctx, token_, in, out, [&](const v1::ReportExitRequest& req, v1::ReportExitResponse*) {
        return job_->ReportExit(req);
      });
}

grpc::ServerUnaryReactor* CoordinatorService::GetJobStatus(grpc::CallbackServerContext* ctx,
                                                           const grpc::ByteBuffer* in,
                                                           grpc::ByteBuffer* out) {
  return Unary<v1::JobStatusRequest, v1::JobStatusResponse>(
      ctx, token_, in, out, [&](const v1::JobStatusRequest&, v1::JobStatusResponse* resp) {
        return job_->GetStatus(resp);
      });
}

grpc::Status CoordinatorService::Checkpoint(grpc::ServerContext* ctx, const v1::CheckpointRequest*,
                                            v1::CheckpointResponse* resp) {
  if (grpc::Status s = CheckToken(ctx, token_); !s.ok()) return s;
  return ToGrpc(job_->Checkpoint(Deadline(*job_, ctx, kLongestWait), resp));
}

grpc::Status CoordinatorService::RemoveServer(grpc::ServerContext* ctx,
                                              const v1::RemoveServerRequest* req,
                                              v1::RemoveServerResponse* resp) {
  if (grpc::Status s = CheckToken(ctx, token_); !s.ok()) return s;
  return ToGrpc(job_->RemoveServer(
      *req, Deadline(*job_, ctx, kLongestWait), [ctx] { return ctx->IsCancelled(); }, resp));
}

absl::StatusOr<v1::StatsResponse> GrpcServerCalls::Stats(const std::string& address,
                                                         absl::Duration timeout) {
  auto stub = v1::ParameterServer::NewStub(MakeControlChannel(address));
  grpc::ClientContext ctx;
  PrepareContext(&ctx, token_, timeout);
  v1::StatsResponse stats;
  if (grpc::Status s = stub->Stats(&ctx, v1::StatsRequest(), &stats); !s.ok()) return FromGrpc(s);
  return stats;
}

}  // namespace psrt
