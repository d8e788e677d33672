#ifndef PSRT_SERVER_REPLICATOR_H_
#define PSRT_SERVER_REPLICATOR_H_

#include <functional>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/data_channel.h"
#include "common/thread_pool.h"
#include "psrt/v1/coordinator.pb.h"
#include "psrt/v1/ps.grpc.pb.h"
#include "server/store.h"

namespace psrt {

// "replicas": 1 and "max_servers", one server's side. It sends each update
// of the keys it serves to their copies (Store's Forward) on the server the
// coordinator's shard map names for their owner, and follows that map: the
// servers whose keys it now serves (Promote), those whose keys it served and
// another serves now (Release), owners whose copies are gone (updates then
// stay here), and new copy holders, to which it copies those keys first, in
// the background (Store::SeedCopies).
class Replicator {
 public:
  // `give_up`: how long an update waits for an unreachable copy holder
  // before going on without it (the coordinator declares a lost server
  // within its heartbeat timeout).
  // `data_channels`: updates go over the copy holders' data channels where
  // they have one (false: the job's "transport" is "grpc").
  // `registered_copies`: the workers register each key with its copy holder
  // too ("replicas" on fixed servers); otherwise ("max_servers") every copy
  // is built here, from the first shard map on, and a key that comes after
  // its copy holder was named is copied there as it is registered (SeedNew).
  Replicator(int self, std::string token, absl::Duration give_up, bool data_channels,
             bool registered_copies, Store* store);
  ~Replicator();

  // Store::Forward: sends the update to the copy holder, over its data
  // channel (common/data_channel.h: the gradient goes from `grad` to the
  // socket, and is applied there from the buffer it arrives in) or, where
  // it has none, by gRPC's Replicate; what it returns waits for the answer,
  // and retries an unreachable copy holder until `give_up`.
  Store::Forwarded Forward(int owner, const std::string& variable, uint32_t partition,
                           int64_t version, const float* grad, int64_t n,
                           const Store::Origin& origin);
  void Update(const v1::ShardMap& map);
  // Store::SeedNew: a key of `owner` registered here just now, to the copy
  // holder of owner's keys if one is named (and the workers do not register
  // it there themselves).
  absl::Status SeedNew(int owner, const std::function<void(v1::SeedRequest*)>& fill);
  // The owners whose keys are being copied to a new holder now.
  std::vector<int> CopiesBuilding();
  // Called once the copies of an owner's keys are built. Set before Update.
  void SetOnCopiesBuilt(std::function<void()> hook) { on_built_ = std::move(hook); }
  // Whether keys served here have a copy elsewhere, or copies are kept here
  // (with "max_servers" and no replicas: a move is under way).
  bool HasCopies();

 private:
  // A copy holder's data channel: opened on first use and again after it
  // broke; none where it has no data port or it could not be reached.
  struct Link {
    explicit Link(std::string address) : address(std::move(address)) {}
    const std::string address;
    absl::Mutex mu;
    int port ABSL_GUARDED_BY(mu) = -1;  // -1: not asked yet
    std::string why_not ABSL_GUARDED_BY(mu);  // set: gRPC only
    std::shared_ptr<DataChannel> channel ABSL_GUARDED_BY(mu);
    bool announced ABSL_GUARDED_BY(mu) = false;  // logged once
  };

  // A Seed call to server `at` (a copy, or a move's hand-over).
  absl::Status SeedTo(int at, const v1::SeedRequest& req);
  std::shared_ptr<v1::ParameterServer::Stub> StubLocked(int server)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Server `at`'s data channel, or null (then gRPC carries the update).
  std::shared_ptr<DataChannel> ChannelTo(int at, v1::ParameterServer::Stub* stub);
  // The copy holder of `owner`'s keys, and whether they are being copied
  // there; at -1 (or this server) there is no copy.
  std::shared_ptr<v1::ParameterServer::Stub> CopyHolder(int owner, int* at, bool* seeding);
  // The end of a Replicate call that got `last`: OK, or the error, or (an
  // unreachable holder) its retries from `start` on.
  absl::Status Settle(int owner, const v1::ReplicateRequest& req, grpc::Status last,
                      absl::Time start);

  const int self_;
  const std::string token_;
  const absl::Duration give_up_;
  const bool data_channels_;
  const bool registered_copies_;
  std::function<void()> on_built_;
  Store* const store_;
  absl::Mutex mu_;
  std::vector<std::string> addresses_ ABSL_GUARDED_BY(mu_);
  // Shared: a call in flight keeps the stub it started with.
  std::vector<std::shared_ptr<v1::ParameterServer::Stub>> stubs_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<Link>> links_ ABSL_GUARDED_BY(mu_);
  std::vector<int> replica_at_ ABSL_GUARDED_BY(mu_);  // per owner; -1: no copy
  std::vector<int64_t> replica_since_ ABSL_GUARDED_BY(mu_);
  std::set<int> served_ ABSL_GUARDED_BY(mu_);   // owners whose keys it serves
  std::set<int> seeding_ ABSL_GUARDED_BY(mu_);  // owners whose copies are being built
  std::vector<std::thread> seeders_;
  // Sends the forwarded updates; last member: joined first, while
  // everything its calls use still exists.
  ThreadPool senders_{8};
};

}  // namespace psrt

#endif  // PSRT_SERVER_REPLICATOR_H_
