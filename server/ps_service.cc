#include "server/ps_service.h"

#include "absl/time/clock.h"
#include "common/grpc_util.h"
#include "common/logging.h"
#include "common/tensor_coding.h"

namespace psrt {

PsService::PsService(Store* store, Metrics* metrics, std::string token)
    : store_(store),
      metrics_(metrics),
      token_(std::move(token)),
      saver_(store),
      rejected_(metrics->GetCounter("rejected_requests_total", "Requests refused as invalid")) {}

grpc::Status PsService::Finish(const absl::Status& s) {
  if (!s.ok() && s.code() != absl::StatusCode::kDeadlineExceeded &&
      s.code() != absl::StatusCode::kCancelled && s.code() != absl::StatusCode::kUnavailable) {
    rejected_->Add();
    LogWarning("refused a request: ", s.ToString());
  }
  return ToGrpc(s);
}

// A pull may wait for a version; it stops a little before the caller's
// deadline so that its answer, which says what it waited for, still arrives.
static absl::Time Deadline(const grpc::ServerContextBase* ctx) {
  const absl::Duration left = TimeLeft(ctx, absl::Hours(1));
  return absl::Now() + left - std::min(left / 10, absl::Milliseconds(500));
}

grpc::Status PsService::RegisterKeys(grpc::ServerContext* ctx, const v1::RegisterKeysRequest* req,
                                     v1::RegisterKeysResponse*) {
  if (grpc::Status s = CheckToken(ctx, token_); !s.ok()) return s;
  return Finish(store_->RegisterKeys(*req));
}

// One per thread, reused: parsing a request allocates nothing once warm.
// A request is done with it before its handler returns.
static WireMessage& Scratch() {
  thread_local WireMessage message;
  return message;
}

Store::PullDone PsService::Reply(grpc::ServerUnaryReactor* reactor, grpc::ByteBuffer* resp) {
  return [this, reactor, resp](absl::Status s, std::vector<OutKey> keys) {
    if (s.ok()) *resp = EncodeKeysResponse(keys);
    reactor->Finish(Finish(s));
  };
}

grpc::ServerUnaryReactor* PsService::Push(grpc::CallbackServerContext* ctx,
                                          const grpc::ByteBuffer* req, grpc::ByteBuffer* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  if (grpc::Status s = CheckToken(ctx, token_); !s.ok()) {
    reactor->Finish(s);
    return reactor;
  }
  WireMessage& msg = Scratch();
  absl::Status s = ParsePushRequest(*req, &msg);
  if (s.ok()) s = store_->Push(msg);
  msg.slices.clear();
  *resp = grpc::ByteBuffer(nullptr, 0);  // an empty PushResponse
  reactor->Finish(Finish(s));
  return reactor;
}

grpc::ServerUnaryReactor* PsService::Pull(grpc::CallbackServerContext* ctx,
                                          const grpc::ByteBuffer* req, grpc::ByteBuffer* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  if (grpc::Status s = CheckToken(ctx, token_); !s.ok()) {
    reactor->Finish(s);
    return reactor;
  }
  WireMessage& msg = Scratch();
  if (absl::Status s = ParsePullRequest(*req, &msg); !s.ok()) {
    reactor->Finish(Finish(s));
  } else {
    store_->PullAsync(msg, Deadline(ctx), [ctx] { return ctx->IsCancelled(); }, Reply(reactor, resp));
  }
  msg.slices.clear();
  return reactor;
}

grpc::ServerUnaryReactor* PsService::PushPull(grpc::CallbackServerContext* ctx,
                                              const grpc::ByteBuffer* req, grpc::ByteBuffer* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  if (grpc::Status s = CheckToken(ctx, token_); !s.ok()) {
    reactor->Finish(s);
    return reactor;
  }
  WireMessage& msg = Scratch();
  if (absl::Status s = ParsePushPullRequest(*req, &msg); !s.ok()) {
    reactor->Finish(Finish(s));
  } else {
    store_->PushPullAsync(msg, Deadline(ctx), [ctx] { return ctx->IsCancelled(); },
                          Reply(reactor, resp));
  }
  msg.slices.clear();
  return reactor;
}

grpc::Status PsService::SetLearningRate(grpc::ServerContext* ctx,
                                        const v1::SetLearningRateRequest* req,
                                        v1::SetLearningRateResponse* resp) {
  if (grpc::Status s = CheckToken(ctx, token_); !s.ok()) return s;
  absl::StatusOr<int64_t> n = store_->SetLearningRate(*req);
  if (!n.ok()) return Finish(n.status());
  resp->set_keys_changed(*n);
  return grpc::Status::OK;
}

grpc::Status PsService::Stats(grpc::ServerContext* ctx, const v1::StatsRequest*,
                              v1::StatsResponse* resp) {
  if (grpc::Status s = CheckToken(ctx, token_); !s.ok()) return s;
  resp->set_num_keys(store_->num_keys());
  resp->set_bytes_stored(store_->bytes_stored());
  for (const auto& [name, value] : metrics_->Snapshot()) (*resp->mutable_metrics())[name] = value;
  for (int64_t c : store_->WorkerClocks()) resp->add_worker_clocks(c);
  resp->set_membership_epoch(store_->membership_epoch());
  const auto [lo, hi] = store_->VersionRange();
  resp->set_min_version(lo);
  resp->set_max_version(hi);
  return grpc::Status::OK;
}

grpc::Status PsService::SaveShard(grpc::ServerContext* ctx, const v1::SaveShardRequest* req,
                                  v1::SaveShardResponse* resp) {
  if (grpc::Status s = CheckToken(ctx, token_); !s.ok()) return s;
  absl::Status s = saver_.Save(*req, resp);
  // A step already passed is the coordinator's cue to pick a later one.
  if (s.code() == absl::StatusCode::kFailedPrecondition) return ToGrpc(s);
  return Finish(s);
}

}  // namespace psrt
