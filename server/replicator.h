#ifndef PSRT_SERVER_REPLICATOR_H_
#define PSRT_SERVER_REPLICATOR_H_

#include <memory>
#include <set>
#include <string>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "psrt/v1/coordinator.pb.h"
#include "psrt/v1/ps.grpc.pb.h"
#include "server/store.h"

namespace psrt {

// "replicas": 1, one server's side: sends each update of the keys it serves
// to their copies on its backup server (Store's Forward), and follows the
// coordinator's shard map: the backup's address, the backup's loss (updates
// then stay here), and the servers whose keys it now serves.
class Replicator {
 public:
  // `give_up`: how long an update waits for an unreachable backup before
  // it goes on without it (the coordinator declares a lost server within
  // its heartbeat timeout).
  Replicator(int self, int backup, std::string token, absl::Duration give_up);

  absl::Status Forward(const std::string& variable, uint32_t partition, int64_t version,
                       const float* grad, int64_t n, const Store::Origin& origin);
  void Update(const v1::ShardMap& map, Store* store);

 private:
  const int self_, backup_;
  const std::string token_;
  const absl::Duration give_up_;
  absl::Mutex mu_;
  std::string address_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<v1::ParameterServer::Stub> stub_ ABSL_GUARDED_BY(mu_);
  bool gone_ ABSL_GUARDED_BY(mu_) = false;
  std::set<int> promoted_ ABSL_GUARDED_BY(mu_);
};

}  // namespace psrt

#endif  // PSRT_SERVER_REPLICATOR_H_
