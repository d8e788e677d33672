#include "server/replicator.h"

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/grpc_util.h"
#include "common/logging.h"

namespace psrt {
namespace {

// One Replicate call's deadline, over either path.
constexpr absl::Duration kCallTimeout = absl::Seconds(5);

}  // namespace

Replicator::Replicator(int self, std::string token, absl::Duration give_up, bool data_channels,
                       bool registered_copies, Store* store)
    : self_(self),
      token_(std::move(token)),
      give_up_(give_up),
      data_channels_(data_channels),
      registered_copies_(registered_copies),
      store_(store) {}

Replicator::~Replicator() {
  for (std::thread& t : seeders_) t.join();
}

std::shared_ptr<v1::ParameterServer::Stub> Replicator::StubLocked(int server) {
  if (server < 0 || server >= static_cast<int>(stubs_.size())) return nullptr;
  if (stubs_[server] == nullptr && !addresses_[server].empty()) {
    stubs_[server] = v1::ParameterServer::NewStub(MakeChannel(addresses_[server]));
  }
  return stubs_[server];
}

void Replicator::Update(const v1::ShardMap& map) {
  std::vector<int> promote;
  std::vector<std::pair<int, int>> release;  // owner, its new server
  std::vector<std::pair<int, int>> seed;     // owner, new copy holder
  std::vector<int> drop;                     // owners whose copies here go
  {
    absl::MutexLock lock(&mu_);
    const int n = map.server_addresses_size();
    const bool first = replica_at_.empty();
    addresses_.resize(n);
    stubs_.resize(n);
    links_.resize(n);
    for (int i = 0; i < n; ++i) {
      if (map.server_addresses(i) != addresses_[i] || links_[i] == nullptr) {
        addresses_[i] = map.server_addresses(i);
        stubs_[i] = nullptr;  // made again on first use
        links_[i] = std::make_shared<Link>(addresses_[i]);
      }
    }
    replica_at_.resize(n, -1);
    replica_since_.resize(n, 0);
    auto served_by = [&](int i) { return i < map.served_by_size() ? map.served_by(i) : i; };
    for (int i = 0; i < map.replica_at_size() && i < n; ++i) {
      const int at = map.replica_at(i);
      const int64_t since = i < map.replica_since_size() ? map.replica_since(i) : 0;
      const bool mine = served_by(i) == self_;
      if (at == replica_at_[i] && since == replica_since_[i]) continue;
      // (Not where the copy was here: it is what this server serves now.)
      if (mine && at < 0 && !first && replica_at_[i] != self_)
        LogWarning("the keys of server ", i, " served here have no copy any more");
      // A copy holder named anew for keys served here (not the start where
      // every worker registers its keys with both): copy them there first.
      if (mine && at >= 0 && !(first && registered_copies_)) seed.emplace_back(i, at);
      // Copies kept here that another server keeps now.
      if (!mine && !first && replica_at_[i] == self_ && at != self_) drop.push_back(i);
      replica_at_[i] = at;
      replica_since_[i] = since;
    }
    for (int i = 0; i < n; ++i) {
      // Keys it serves now from copies: another server's, or (a server that
      // joined, or a spare that took over its old keys back) its own.
      if (served_by(i) == self_ && served_.insert(i).second) promote.push_back(i);
      // Keys another server serves from now on (-1: for a moment none):
      // they move to where the copy was built.
      if (served_by(i) != self_ && served_.erase(i) > 0) {
        release.emplace_back(i, served_by(i) >= 0 ? served_by(i) : replica_at_[i]);
      }
    }
    for (const auto& [owner, at] : seed) seeding_.insert(owner);
  }
  for (const auto& [owner, to] : release) {
    store_->Release(owner, to,
                    [&, to = to](const v1::SeedRequest& req) { return SeedTo(to, req); });
  }
  for (int i : promote) store_->Promote(i);
  for (int i : drop) store_->DropCopies(i);
  for (const auto& [owner, at] : seed) {
    LogInfo("building the copy of server ", owner, "'s keys on server ", at);
    seeders_.emplace_back([this, owner = owner, at = at] {
      store_->SeedCopies(owner, [&](const v1::SeedRequest& req) { return SeedTo(at, req); });
      {
        absl::MutexLock lock(&mu_);
        seeding_.erase(owner);
      }
      if (on_built_) on_built_();
    });
  }
}

absl::Status Replicator::SeedNew(int owner, const std::function<void(v1::SeedRequest*)>& fill) {
  if (registered_copies_) return absl::OkStatus();
  int at;
  bool seeding;
  CopyHolder(owner, &at, &seeding);
  if (at < 0 || at == self_) return absl::OkStatus();
  v1::SeedRequest req;
  fill(&req);
  return SeedTo(at, req);
}

absl::Status Replicator::SeedTo(int at, const v1::SeedRequest& req) {
  std::shared_ptr<v1::ParameterServer::Stub> stub;
  {
    absl::MutexLock lock(&mu_);
    stub = StubLocked(at);
  }
  if (stub == nullptr)
    return absl::UnavailableError(absl::StrCat("server ", at, " has no address"));
  grpc::ClientContext ctx;
  PrepareContext(&ctx, token_, absl::Seconds(30));
  v1::SeedResponse resp;
  return FromGrpc(stub->Seed(&ctx, req, &resp));
}

bool Replicator::HasCopies() {
  absl::MutexLock lock(&mu_);
  for (int owner = 0; owner < static_cast<int>(replica_at_.size()); ++owner) {
    const int at = replica_at_[owner];
    if (at == self_ && served_.count(owner) == 0) return true;            // kept here
    if (at >= 0 && at != self_ && served_.count(owner) > 0) return true;  // kept elsewhere
  }
  return false;
}

std::vector<int> Replicator::CopiesBuilding() {
  absl::MutexLock lock(&mu_);
  return {seeding_.begin(), seeding_.end()};
}

std::shared_ptr<v1::ParameterServer::Stub> Replicator::CopyHolder(int owner, int* at,
                                                                  bool* seeding) {
  absl::MutexLock lock(&mu_);
  *at = owner < static_cast<int>(replica_at_.size()) ? replica_at_[owner] : -2;
  *seeding = seeding_.count(owner) > 0;
  return *at == -1 || *at == self_ ? nullptr : StubLocked(*at);
}

std::shared_ptr<DataChannel> Replicator::ChannelTo(int at, v1::ParameterServer::Stub* stub) {
  if (!data_channels_) return nullptr;
  std::shared_ptr<Link> link;
  {
    absl::MutexLock lock(&mu_);
    link = links_[at];
  }
  absl::MutexLock lock(&link->mu);
  if (link->channel != nullptr && !link->channel->broken()) return link->channel;
  link->channel.reset();
  if (!link->why_not.empty()) return nullptr;
  v1::DataChannelRequest req;
  req.set_from_server(true);
  absl::StatusOr<std::shared_ptr<DataChannel>> opened =
      OpenDataChannel(stub, link->address, req, token_, kCallTimeout, &link->port);
  if (opened.status().code() == absl::StatusCode::kUnavailable) return nullptr;  // by gRPC
  if (!opened.ok()) {
    link->why_not = std::string(opened.status().message());
    if (link->port > 0) {  // not under mutual TLS, where that is the rule
      LogWarning("updates to the copies on server ", at, " go by gRPC: ", link->why_not);
    }
    return nullptr;
  }
  link->channel = *std::move(opened);
  if (!link->announced) {
    LogInfo("updates to the copies on server ", at, " go over its data channel");
    link->announced = true;
  }
  return link->channel;
}

Store::Forwarded Replicator::Forward(int owner, const std::string& variable, uint32_t partition,
                                     int64_t version, const float* grad, int64_t n,
                                     const Store::Origin& origin) {
  const int key_owner = owner < 0 ? self_ : owner;
  int at;
  bool seeding;
  std::shared_ptr<v1::ParameterServer::Stub> stub = CopyHolder(key_owner, &at, &seeding);
  if (at == -1 || at == self_) return nullptr;  // no copy: the update stays here alone
  struct Call {
    v1::ReplicateRequest req;
    v1::ReplicateResponse resp;
    grpc::ByteBuffer answer;  // the data channel's (empty)
    grpc::ClientContext ctx;
    grpc::Status status;
    absl::Notification done;
    absl::Time start;
  };
  auto call = std::make_shared<Call>();
  v1::ReplicateRequest& req = call->req;
  req.set_variable(variable);
  req.set_partition(partition);
  req.set_version(version);
  req.set_no_gradient(grad == nullptr);  // a sync step without a gradient
  if (origin.worker >= 0) {
    req.set_from_push(true);
    req.set_worker(origin.worker);
    req.set_push_id(origin.push_id);
    req.set_clock(origin.clock);
  }
  call->start = absl::Now();
  const size_t bytes = static_cast<size_t>(n) * sizeof(float);
  std::shared_ptr<DataChannel> channel = stub != nullptr ? ChannelTo(at, stub.get()) : nullptr;
  if (channel != nullptr) {
    // Written from `grad` before Call returns, while the caller applies the
    // update here only after: the socket's buffer takes the first part at
    // once, and the copy holder reads and applies while this server does.
    grpc::Slice slice(grad != nullptr ? static_cast<const void*>(grad) : "", bytes,
                      grpc::Slice::STATIC_SLICE);
    channel->Call(
        FrameKind::kReplicate, grpc::ByteBuffer(&slice, 1), kCallTimeout, &call->answer,
        [call](grpc::Status s) {
          call->status = std::move(s);
          call->done.Notify();
        },
        req.SerializeAsString());
  } else if (stub == nullptr) {
    call->status = grpc::Status(grpc::StatusCode::UNAVAILABLE, "no address yet");
    call->done.Notify();
  } else {
    if (grad != nullptr) req.set_gradient(reinterpret_cast<const char*>(grad), bytes);
    // A blocking call on a thread of its own: the caller may be one of
    // gRPC's callback threads, which an asynchronous call's completion
    // could need while the caller waits for it.
    senders_.Schedule([this, call, stub] {
      PrepareContext(&call->ctx, token_, kCallTimeout);
      call->status = stub->Replicate(&call->ctx, call->req, &call->resp);
      call->done.Notify();
    });
  }
  return [this, call, key_owner, grad, bytes] {
    // The call's own deadline bounds this, once a sender has taken it.
    if (!call->done.WaitForNotificationWithTimeout(give_up_ + absl::Seconds(10))) {
      return absl::UnavailableError(
          "the update was never sent to the copy (the server is stopping)");
    }
    if (!call->status.ok() && grad != nullptr && call->req.gradient().empty()) {
      // Retries go by gRPC, with the gradient in the request.
      call->req.set_gradient(reinterpret_cast<const char*>(grad), bytes);
    }
    return Settle(key_owner, call->req, call->status, call->start);
  };
}

absl::Status Replicator::Settle(int owner, const v1::ReplicateRequest& req, grpc::Status last,
                                absl::Time start) {
  while (true) {
    if (last.ok()) return absl::OkStatus();
    int at;
    bool seeding;
    std::shared_ptr<v1::ParameterServer::Stub> stub = CopyHolder(owner, &at, &seeding);
    if (at == -1 || at == self_) return absl::OkStatus();  // the copy went meanwhile
    // A key not copied yet gets its state, this update included, when it is.
    if (seeding && last.error_code() == grpc::StatusCode::NOT_FOUND) return absl::OkStatus();
    if (last.error_code() != grpc::StatusCode::UNAVAILABLE &&
        last.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) {
      return FromGrpc(last);
    }
    // Not known yet (before every server registered), or unreachable: wait
    // for it, or for the coordinator to say it is gone.
    if (absl::Now() - start > give_up_) {
      absl::MutexLock lock(&mu_);
      replica_at_[owner] = -1;
      return absl::UnavailableError(
          absl::StrCat("the copy of server ", owner, "'s keys did not answer for ",
                       absl::FormatDuration(give_up_), ": ", last.error_message(),
                       "; those keys have no copy from here on"));
    }
    absl::SleepFor(absl::Milliseconds(20));
    if (stub == nullptr) {
      last = grpc::Status(grpc::StatusCode::UNAVAILABLE, "no address yet");
      continue;
    }
    grpc::ClientContext ctx;
    PrepareContext(&ctx, token_, kCallTimeout);
    v1::ReplicateResponse resp;
    last = stub->Replicate(&ctx, req, &resp);
  }
}

}  // namespace psrt
