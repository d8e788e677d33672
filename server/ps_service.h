#ifndef PSRT_SERVER_PS_SERVICE_H_
#define PSRT_SERVER_PS_SERVICE_H_

#include <string>

#include "common/metrics.h"
#include "psrt/v1/ps.grpc.pb.h"
#include "server/checkpoint_io.h"
#include "server/store.h"

namespace psrt {

// The gRPC face of a Store: checks the job token, turns errors into gRPC
// statuses, and counts what it refuses.
class PsService final : public v1::ParameterServer::Service {
 public:
  PsService(Store* store, Metrics* metrics, std::string token);

  grpc::Status RegisterKeys(grpc::ServerContext* ctx, const v1::RegisterKeysRequest* req,
                            v1::RegisterKeysResponse* resp) override;
  grpc::Status Push(grpc::ServerContext* ctx, const v1::PushRequest* req,
                    v1::PushResponse* resp) override;
  grpc::Status Pull(grpc::ServerContext* ctx, const v1::PullRequest* req,
                    v1::PullResponse* resp) override;
  grpc::Status PushPull(grpc::ServerContext* ctx, const v1::PushPullRequest* req,
                        v1::PushPullResponse* resp) override;
  grpc::Status SetLearningRate(grpc::ServerContext* ctx, const v1::SetLearningRateRequest* req,
                               v1::SetLearningRateResponse* resp) override;
  grpc::Status Stats(grpc::ServerContext* ctx, const v1::StatsRequest* req,
                     v1::StatsResponse* resp) override;
  grpc::Status SaveShard(grpc::ServerContext* ctx, const v1::SaveShardRequest* req,
                         v1::SaveShardResponse* resp) override;

  ShardSaver* saver() { return &saver_; }

 private:
  grpc::Status Finish(const absl::Status& s);

  Store* store_;
  Metrics* metrics_;
  const std::string token_;
  Counter* rejected_;
  ShardSaver saver_;
};

}  // namespace psrt

#endif  // PSRT_SERVER_PS_SERVICE_H_
