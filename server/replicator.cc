#include "server/replicator.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_util.h"
#include "common/logging.h"

namespace psrt {

Replicator::Replicator(int self, int backup, std::string token, absl::Duration give_up)
    : self_(self), backup_(backup), token_(std::move(token)), give_up_(give_up) {}

void Replicator::Update(const v1::ShardMap& map, Store* store) {
  std::vector<int> promote;
  {
    absl::MutexLock lock(&mu_);
    if (backup_ < map.server_addresses_size() && map.server_addresses(backup_) != address_) {
      address_ = map.server_addresses(backup_);
      stub_ = v1::ParameterServer::NewStub(MakeChannel(address_));
    }
    for (int i = 0; i < map.served_by_size(); ++i) {
      if (i == backup_ && map.served_by(i) != backup_ && !gone_) {
        gone_ = true;
        LogWarning("server ", backup_, " was lost: the keys served here have no replica any more");
      }
      if (i != self_ && map.served_by(i) == self_ && promoted_.insert(i).second) promote.push_back(i);
    }
  }
  for (int i : promote) store->Promote(i);
}

absl::Status Replicator::Forward(const std::string& variable, uint32_t partition, int64_t version,
                                 const float* grad, int64_t n, const Store::Origin& origin) {
  v1::ReplicateRequest req;
  req.set_variable(variable);
  req.set_partition(partition);
  req.set_version(version);
  if (origin.worker >= 0) {
    req.set_from_push(true);
    req.set_worker(origin.worker);
    req.set_push_id(origin.push_id);
    req.set_clock(origin.clock);
  }
  req.set_gradient(reinterpret_cast<const char*>(grad), n * sizeof(float));
  const absl::Time start = absl::Now();
  grpc::Status last;
  while (true) {
    v1::ParameterServer::Stub* stub;
    {
      absl::MutexLock lock(&mu_);
      if (gone_) return absl::OkStatus();  // the update stays here alone
      stub = stub_.get();
    }
    if (stub != nullptr) {
      grpc::ClientContext ctx;
      PrepareContext(&ctx, token_, absl::Seconds(5));
      v1::ReplicateResponse resp;
      last = stub->Replicate(&ctx, req, &resp);
      if (last.ok()) return absl::OkStatus();
      if (last.error_code() != grpc::StatusCode::UNAVAILABLE &&
          last.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) {
        return FromGrpc(last);
      }
    }
    // Not known yet (before every server registered), or unreachable: wait
    // for it, or for the coordinator to say it is gone.
    if (absl::Now() - start > give_up_) {
      absl::MutexLock lock(&mu_);
      gone_ = true;
      return absl::UnavailableError(absl::StrCat("backup server ", backup_, " did not answer for ",
                                                 absl::FormatDuration(give_up_), ": ", last.error_message(),
                                                 "; its replicas are stale from here on"));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
}

}  // namespace psrt
