#ifndef PSRT_SERVER_PS_SERVICE_H_
#define PSRT_SERVER_PS_SERVICE_H_

#include <atomic>
#include <functional>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "common/data_channel.h"
#include "common/grpc_util.h"
#include "common/metrics.h"
#include "common/shared_memory.h"
#include "psrt/v1/ps.grpc.pb.h"
#include "server/checkpoint_io.h"
#include "server/store.h"

namespace psrt {

// The data path's methods take raw byte buffers (common/tensor_coding.h)
// through gRPC's callback API; the control methods are ordinary ones.
using PsServiceBase =
    v1::ParameterServer::WithRawCallbackMethod_Push<v1::ParameterServer::WithRawCallbackMethod_Pull<
        v1::ParameterServer::WithRawCallbackMethod_PushPull<v1::ParameterServer::Service>>>;

// The gRPC face of a Store: checks the job token, turns errors into gRPC
// statuses, and counts what it refuses. Push, Pull and PushPull are parsed
// straight from the received slices and answered from pooled buffers; a
// pull that waits for a version holds no thread.
class PsService final : public PsServiceBase {
 public:
  // `max_calls_per_worker`: data calls one worker may have in flight here
  // (0: no limit).
  PsService(Store* store, Metrics* metrics, std::string token, int max_calls_per_worker = 0);

  grpc::Status RegisterKeys(grpc::ServerContext* ctx, const v1::RegisterKeysRequest* req,
                            v1::RegisterKeysResponse* resp) override;
  grpc::ServerUnaryReactor* Push(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req,
                                 grpc::ByteBuffer* resp) override;
  grpc::ServerUnaryReactor* Pull(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req,
                                 grpc::ByteBuffer* resp) override;
  grpc::ServerUnaryReactor* PushPull(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req,
                                     grpc::ByteBuffer* resp) override;
  grpc::Status SetLearningRate(grpc::ServerContext* ctx, const v1::SetLearningRateRequest* req,
                               v1::SetLearningRateResponse* resp) override;
  grpc::Status Stats(grpc::ServerContext* ctx, const v1::StatsRequest* req,
                     v1::StatsResponse* resp) override;
  grpc::Status SaveShard(grpc::ServerContext* ctx, const v1::SaveShardRequest* req,
                         v1::SaveShardResponse* resp) override;
  grpc::Status AttachSharedMemory(grpc::ServerContext* ctx,
                                  const v1::AttachSharedMemoryRequest* req,
                                  v1::AttachSharedMemoryResponse* resp) override;
  grpc::Status Replicate(grpc::ServerContext* ctx, const v1::ReplicateRequest* req,
                         v1::ReplicateResponse* resp) override;
  grpc::Status Seed(grpc::ServerContext* ctx, const v1::SeedRequest* req, v1::SeedResponse* resp) override;
  grpc::Status DataChannel(grpc::ServerContext* ctx, const v1::DataChannelRequest* req,
                           v1::DataChannelResponse* resp) override;

  // Push, Pull and PushPull, whatever carried them (gRPC or the data
  // channel, common/data_channel.h): parses `req`, checks it and its shared
  // spans, and hands it to the store; `done` gets the answer, or the error,
  // once: now or when the store calls back. Refusals are counted here.
  // Also Replicate from another server's data channel: its request in
  // `text`, its gradient in `req`.
  using DataDone = std::function<void(const absl::Status&, grpc::ByteBuffer)>;
  void ServeData(FrameKind method, absl::string_view text, const grpc::ByteBuffer& req,
                 absl::Time deadline, std::function<bool()> cancelled, DataDone done);

  // The data channel's port for DataChannel to announce (0: none).
  void set_data_port(int port) { data_port_ = port; }

  ShardSaver* saver() { return &saver_; }

 private:
  // Counts and logs `s` if it refuses the caller's request; returns it.
  absl::Status Refused(const absl::Status& s);
  grpc::Status Finish(const absl::Status& s) { return ToGrpc(Refused(s)); }
  absl::Status ReplicateRefused(const absl::Status& s);  // Refused, quiet for NOT_FOUND
  // A data method over gRPC: the token, then ServeData.
  grpc::ServerUnaryReactor* Serve(grpc::CallbackServerContext* ctx, FrameKind method,
                                  const grpc::ByteBuffer* req, grpc::ByteBuffer* resp);
  // Counts a data call of `worker` in flight; RESOURCE_EXHAUSTED past the
  // limit (for a pull, past the limit less the share kept for pushes).
  // Every OK Enter is matched by one Leave.
  absl::Status Enter(int worker, bool pull);
  void Leave(int worker);
  // A Replicate frame of the data channel: its request in `text`, its
  // float32 gradient as the payload.
  absl::Status ReplicateFrame(absl::string_view text, const grpc::ByteBuffer& gradient);
  // Checks each shared-memory span of `m` against the sender's regions and
  // points the keys at it: a push's values, a pull's room for its answer.
  absl::Status ResolveShared(WireMessage* m);

  Store* store_;
  Metrics* metrics_;
  const std::string token_;
  Counter* rejected_;
  ShardSaver saver_;
  const int max_calls_per_worker_;
  std::atomic<int> data_port_{0};
  std::unique_ptr<std::atomic<int>[]> calls_;  // in flight, per worker rank
  // Workers' shared-memory regions, by id; mapped until the server exits.
  struct Region {
    int32_t rank;
    std::unique_ptr<SharedRegion> memory;
  };
  absl::Mutex regions_mu_;
  absl::flat_hash_map<uint64_t, Region> regions_ ABSL_GUARDED_BY(regions_mu_);
  uint64_t next_region_ ABSL_GUARDED_BY(regions_mu_) = 1;
  // Most regions one server maps (a worker makes one; restarts make more).
  static constexpr size_t kMaxRegions = 4096;
  static constexpr int64_t kMaxSharedBytes = int64_t{1} << 30;
};

}  // namespace psrt

#endif  // PSRT_SERVER_PS_SERVICE_H_
