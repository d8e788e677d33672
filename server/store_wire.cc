// Store: the protobuf forms of push and pull (the gRPC path) over the wire
// forms the data path uses.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/compression.h"
#include "common/key_map.h"
#include "common/logging.h"
#include "common/optimizer_proto.h"
#include "server/store.h"
#include "server/store_internal.h"
#include "server/table.h"

namespace psrt {

namespace {

// A parsed protobuf request as the data path sees it (values by reference).
WireKey ToWire(const v1::KeyData& kd) {
  WireKey k;
  k.variable = kd.variable();
  k.partition = kd.partition();
  k.version = kd.version();
  k.dtype = kd.dtype();
  k.data.Add(kd.data());
  k.scale = kd.scale();
  k.nonfinite = kd.nonfinite();
  k.no_gradient = kd.no_gradient();
  k.pull_dtype = kd.pull_dtype();
  k.ids.assign(kd.ids().begin(), kd.ids().end());
  return k;
}

template <typename Request>
WireMessage ToWire(const Request& req) {
  WireMessage m;
  m.worker_rank = req.worker_rank();
  for (const v1::KeyData& kd : req.keys()) m.keys.push_back(ToWire(kd));
  return m;
}

WireMessage PushToWire(const v1::PushRequest& req) {
  WireMessage m = ToWire(req);
  m.push_id = req.push_id();
  m.also_for.assign(req.also_for().begin(), req.also_for().end());
  m.assign_rows = req.assign_rows();
  return m;
}

void ToProto(const std::vector<OutKey>& keys,
             google::protobuf::RepeatedPtrField<v1::KeyData>* out) {
  for (const OutKey& o : keys) {
    v1::KeyData* kd = out->Add();
    kd->set_variable(std::string(o.variable));
    kd->set_partition(o.partition);
    kd->set_version(o.version);
    kd->set_dtype(o.dtype);
    kd->set_scale(o.scale);
    kd->set_data(o.data, o.size);
  }
}

}  // namespace

absl::Status Store::Push(const v1::PushRequest& req) { return Push(PushToWire(req)); }

absl::Status Store::WaitPull(const std::function<void(PullDone)>& start,
                             google::protobuf::RepeatedPtrField<v1::KeyData>* out) {
  absl::Notification finished;
  absl::Status status;
  std::vector<OutKey> keys;
  start([&](absl::Status s, std::vector<OutKey> k) {
    status = std::move(s);
    keys = std::move(k);
    finished.Notify();
  });
  // Ends by the pull's own deadline (the sweeper fails it then).
  finished.WaitForNotification();
  if (status.ok()) ToProto(keys, out);
  return status;
}

absl::Status Store::Pull(const v1::PullRequest& req, absl::Time deadline, v1::PullResponse* resp,
                         const Cancelled& cancelled) {
  const WireMessage m = ToWire(req);
  return WaitPull([&](PullDone done) { PullAsync(m, deadline, cancelled, std::move(done)); },
                  resp->mutable_keys());
}

absl::Status Store::PushPull(const v1::PushPullRequest& req, absl::Time deadline,
                             v1::PushPullResponse* resp, const Cancelled& cancelled) {
  const WireMessage m = PushToWire(req.push());
  return WaitPull([&](PullDone done) { PushPullAsync(m, deadline, cancelled, std::move(done)); },
                  resp->mutable_keys());
}

}  // namespace psrt
