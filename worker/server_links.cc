#include "worker/server_links.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/grpc_util.h"
#include "common/logging.h"

namespace psrt {

ServerLinks::ServerLinks(Options options, const v1::ShardMap& map)
    : options_(std::move(options)),
      num_servers_(map.server_addresses_size()),
      routes_(std::make_unique<std::atomic<int>[]>(num_servers_)),
      moved_(std::make_unique<std::atomic<int>[]>(num_servers_)),
      next_connection_(std::make_unique<std::atomic<uint64_t>[]>(num_servers_)) {
  for (int s = 0; s < num_servers_; ++s) routes_[s].store(s);
  if (options_.data_channels) {
    for (int s = 0; s < num_servers_; ++s) {
      links_.push_back(std::make_unique<DataLink>());
      absl::MutexLock lock(&links_.back()->mu);
      links_.back()->channels.resize(options_.connections);
    }
  }
  {
    absl::MutexLock lock(&channels_mu_);
    addresses_.resize(num_servers_);
    stubs_.resize(num_servers_);
    data_stubs_.resize(num_servers_);
    // A server that joins later ("max_servers") has no address yet.
    for (int s = 0; s < num_servers_; ++s) {
      if (!map.server_addresses(s).empty()) Connect(s, map.server_addresses(s));
    }
  }
  FollowShardMap(map);
}

void ServerLinks::Close() {
  for (const std::unique_ptr<DataLink>& l : links_) {
    absl::MutexLock lock(&l->mu);
    for (const std::shared_ptr<DataChannel>& c : l->channels)
      if (c != nullptr) c->Close();
  }
}

std::vector<int> ServerLinks::OnePerServer(const std::vector<char>& holds) const {
  std::vector<int> owners;
  std::vector<char> asked(num_servers_, 0);
  for (int s = 0; s < num_servers_; ++s) {
    if (holds[s] && !asked[Route(s)]++) owners.push_back(s);
  }
  return owners;
}

std::shared_ptr<v1::ParameterServer::Stub> ServerLinks::Stub(int s) const {
  absl::MutexLock lock(&channels_mu_);
  return stubs_[Route(s)];
}

std::string ServerLinks::Address(int s) const {
  absl::MutexLock lock(&channels_mu_);
  return addresses_[s];
}

void ServerLinks::Connect(int s, const std::string& address) {
  addresses_[s] = address;
  data_stubs_[s].clear();
  for (int c = 0; c < options_.connections; ++c) {
    std::shared_ptr<grpc::Channel> channel = MakeChannel(address);
    if (c == 0) stubs_[s] = v1::ParameterServer::NewStub(channel);
    data_stubs_[s].push_back(std::make_shared<grpc::GenericStub>(channel));
  }
  if (!links_.empty()) {
    // A new process: its data port is asked again.
    DataLink& l = *links_[s];
    absl::MutexLock lock(&l.mu);
    l.address = address;
    l.control = stubs_[s];
    l.port = -1;
    l.why_not.clear();
    for (std::shared_ptr<DataChannel>& c : l.channels) {
      if (c != nullptr) c->Close();
      c.reset();
    }
  }
}

void ServerLinks::FollowShardMap(const v1::ShardMap& map) {
  for (int s = 0; s < map.served_by_size() && s < num_servers_; ++s) {
    const int to = map.served_by(s);
    if (to < 0 || to >= num_servers_ || to == Route(s)) continue;
    LogInfo("server ", s, "'s keys are served by server ", to, " at ", Address(to), " now");
    routes_[s].store(to, std::memory_order_release);
  }
  // A server started again after its loss listens elsewhere.
  absl::MutexLock lock(&channels_mu_);
  for (int s = 0; s < map.server_addresses_size() && s < num_servers_; ++s) {
    if (map.server_addresses(s).empty() || map.server_addresses(s) == addresses_[s]) continue;
    moved_[s].fetch_add(1);
    Connect(s, map.server_addresses(s));
  }
}

std::shared_ptr<grpc::GenericStub> ServerLinks::DataStub(int s, int moves,
                                                         std::shared_ptr<DataChannel>* channel) {
  size_t c;
  std::shared_ptr<grpc::GenericStub> stub;
  {
    absl::MutexLock lock(&channels_mu_);
    if (moved_[s].load() != moves) return nullptr;
    const std::vector<std::shared_ptr<grpc::GenericStub>>& pool = data_stubs_[s];
    c = next_connection_[s].fetch_add(1, std::memory_order_relaxed) % pool.size();
    stub = pool[c];
  }
  *channel = Channel(s, c);
  return stub;
}

std::shared_ptr<DataChannel> ServerLinks::Channel(int s, size_t c) {
  if (links_.empty()) return nullptr;
  DataLink& l = *links_[s];
  absl::MutexLock lock(&l.mu);
  std::shared_ptr<DataChannel>& ch = l.channels[c];
  if (ch != nullptr && !ch->broken()) return ch;
  ch.reset();
  if (!l.why_not.empty()) return nullptr;
  v1::DataChannelRequest req;
  req.set_worker_rank(options_.rank);
  absl::StatusOr<std::shared_ptr<DataChannel>> opened =
      OpenDataChannel(l.control.get(), l.address, req, options_.token,
                      std::min(options_.rpc_timeout, absl::Seconds(10)), &l.port);
  if (opened.status().code() == absl::StatusCode::kUnavailable) {
    return nullptr;  // this call goes by gRPC, and fails or not there
  }
  if (!opened.ok()) {
    l.why_not = std::string(opened.status().message());
    // Mutual TLS is no surprise: said once for all servers at start.
    if (l.port > 0) {
      LogWarning("worker ", options_.rank, ": server ", s, "'s pushes and pulls go by gRPC: ",
                 l.why_not);
    }
    return nullptr;
  }
  ch = *std::move(opened);
  return ch;
}

void ServerLinks::OpenDataChannels() {
  if (links_.empty()) return;
  std::vector<int> grpc_only;
  std::string why_not;
  for (int s = 0; s < num_servers_; ++s) {
    if (Address(s).empty()) continue;  // joins later
    for (int c = 0; c < options_.connections; ++c) Channel(s, c);
    absl::MutexLock lock(&links_[s]->mu);
    if (links_[s]->channels[0] == nullptr) {
      grpc_only.push_back(s);
      if (why_not.empty()) why_not = links_[s]->why_not;
    }
  }
  if (grpc_only.empty()) {
    LogInfo("worker ", options_.rank, ": pushes and pulls go over data channels to every server");
  } else {
    LogInfo("worker ", options_.rank, ": gRPC carries pushes and pulls to servers ",
            absl::StrJoin(grpc_only, ", "),
            why_not.empty() ? "" : absl::StrCat(" (", why_not, ")"));
  }
}

bool ServerLinks::HasDataChannel(int s) {
  if (links_.empty()) return false;
  absl::MutexLock lock(&links_[s]->mu);
  return links_[s]->why_not.empty();
}

}  // namespace psrt
