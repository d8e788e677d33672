#ifndef PSRT_WORKER_SERVER_LINKS_H_
#define PSRT_WORKER_SERVER_LINKS_H_

// A training process's connections to the job's servers: which server
// serves each server index's keys now (its route, from the coordinator's
// shard map: "replicas", "max_servers"), each server's address, its gRPC
// stubs (one for control calls, and connections_per_server for the data
// path, each its own TCP connection), its data channels
// (common/data_channel.h) where it has them, and how often it came back at
// a new address. Thread-safe.

#include <grpcpp/generic/generic_stub.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/data_channel.h"
#include "psrt/v1/coordinator.pb.h"
#include "psrt/v1/ps.grpc.pb.h"

namespace psrt {

class ServerLinks {
 public:
  struct Options {
    int rank = 0;  // the training process's
    std::string token;
    int connections = 1;  // per server, for the data path
    absl::Duration rpc_timeout = absl::Seconds(30);
    // Data channels beside gRPC (false: "transport": "grpc", or mutual TLS).
    bool data_channels = true;
  };
  // Links to the servers of `map`: those with an address are connected
  // (a server that joins later has none yet), and routes follow the map.
  ServerLinks(Options options, const v1::ShardMap& map);
  // Closes the data channels: calls on them end at once (CANCELLED).
  void Close();

  int size() const { return num_servers_; }
  // The server that serves server s's keys now.
  int Route(int s) const { return routes_[s].load(std::memory_order_acquire); }
  // One owner per server serving those `holds` names: a server serves
  // other servers' keys too ("replicas", "max_servers") and is asked once.
  std::vector<int> OnePerServer(const std::vector<char>& holds) const;
  // The control stub of the server serving s's keys.
  std::shared_ptr<v1::ParameterServer::Stub> Stub(int s) const;
  std::string Address(int s) const;
  // How often server s came back at a new address: a request encoded for
  // one process (its shared-memory spans) is encoded again for the next.
  int Moves(int s) const { return moved_[s].load(); }
  // Routes first (nothing goes to a server's new process, which serves none
  // of its old keys, by its old route), then new addresses.
  void FollowShardMap(const v1::ShardMap& map);

  // The data path's connections to server s, taken in turn: a gRPC stub,
  // and the data channel to use instead where there is one. Null when the
  // server moved to a new process since `moves` was read.
  std::shared_ptr<grpc::GenericStub> DataStub(int s, int moves, std::shared_ptr<DataChannel>* channel);
  // Opens every server's data channels at the start, and says in one line
  // which servers they reach.
  void OpenDataChannels();
  // Whether calls to server s go over its data channel (else by gRPC).
  bool HasDataChannel(int s);

 private:
  // One server's data channels, one per connection. Lock order:
  // channels_mu_, then a link's mu.
  struct DataLink {
    absl::Mutex mu;
    std::string address ABSL_GUARDED_BY(mu);
    std::shared_ptr<v1::ParameterServer::Stub> control ABSL_GUARDED_BY(mu);
    int port ABSL_GUARDED_BY(mu) = -1;        // -1: not asked yet; 0: none
    std::string why_not ABSL_GUARDED_BY(mu);  // set: gRPC only, for this reason
    std::vector<std::shared_ptr<DataChannel>> channels ABSL_GUARDED_BY(mu);
  };

  // Channels to `address` for server s.
  void Connect(int s, const std::string& address) ABSL_EXCLUSIVE_LOCKS_REQUIRED(channels_mu_);
  // Server s's data channel number c, connected on first use and again
  // after it broke; null where the server has none or it cannot be reached
  // (then gRPC carries the call: same messages, same answers).
  std::shared_ptr<DataChannel> Channel(int s, size_t c);

  const Options options_;
  const int num_servers_;
  std::unique_ptr<std::atomic<int>[]> routes_;
  std::unique_ptr<std::atomic<int>[]> moved_;
  std::unique_ptr<std::atomic<uint64_t>[]> next_connection_;
  // Replaced when a server comes back at another address; a call holds the
  // stub it started with.
  mutable absl::Mutex channels_mu_;
  std::vector<std::string> addresses_ ABSL_GUARDED_BY(channels_mu_);
  std::vector<std::shared_ptr<v1::ParameterServer::Stub>> stubs_ ABSL_GUARDED_BY(channels_mu_);
  std::vector<std::vector<std::shared_ptr<grpc::GenericStub>>> data_stubs_
      ABSL_GUARDED_BY(channels_mu_);
  std::vector<std::unique_ptr<DataLink>> links_;  // empty: no data channels
};

}  // namespace psrt

#endif  // PSRT_WORKER_SERVER_LINKS_H_
