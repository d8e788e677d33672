#include "server/placement.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/key_map.h"

namespace psrt {

void Placement::LayOut(int num_servers, int started, int replicas, int servers_per_host) {
  moves_.clear();
  served_by_.assign(num_servers, -1);
  const bool copies = replicas > 0 || started > 0;  // a move's copy, too
  replica_at_.assign(copies ? num_servers : 0, -1);
  replica_since_.assign(replica_at_.size(), 0);
  for (int i = 0; i < num_servers; ++i) {
    served_by_[i] = InitialServer(i, started);
    if (replicas > 0 && started == 0)
      replica_at_[i] = BackupServer(i, num_servers, servers_per_host);
  }
  ++epoch_;
}

void Placement::Fill(v1::ShardMap* map) const {
  map->set_epoch(epoch_);
  for (int s : served_by_) map->add_served_by(s);
  for (int s : replica_at_) map->add_replica_at(s);
  for (int64_t e : replica_since_) map->add_replica_since(e);
}

std::vector<int> Placement::OwnersServedBy(int server) const {
  std::vector<int> owners;
  for (int o = 0; o < static_cast<int>(served_by_.size()); ++o) {
    if (served_by_[o] == server) owners.push_back(o);
  }
  return owners;
}

bool Placement::CopyBuilt(const Server& serving, int owner) const {
  return serving.shard_epoch >= replica_since_[owner] &&
         std::find(serving.copies_building.begin(), serving.copies_building.end(), owner) ==
             serving.copies_building.end();
}

std::vector<int> Placement::CopiesBuilt(int index, const Server& serving) const {
  std::vector<int> owners;
  for (int o = 0; o < static_cast<int>(replica_at_.size()); ++o) {
    if (served_by_[o] == index && replica_at_[o] >= 0 && CopyBuilt(serving, o)) owners.push_back(o);
  }
  return owners;
}

std::optional<std::vector<int>> Placement::FailOver(int lost, const Servers& servers) {
  const std::vector<int> owners = OwnersServedBy(lost);
  for (int o : owners) {
    const int at = CopyAt(o);
    // A copy still being built is no copy to serve from.
    if (at < 0 || at == lost || !servers[at].live || !CopyBuilt(servers[lost], o))
      return std::nullopt;
  }
  for (int o : owners) {
    served_by_[o] = replica_at_[o];
    replica_at_[o] = -1;  // until a new copy is built
  }
  DropCopiesAt(lost);
  ++epoch_;
  return owners;
}

std::vector<int> Placement::KeepMissingCopies(int spare) {
  std::vector<int> owners;
  ++epoch_;
  for (int o = 0; o < static_cast<int>(replica_at_.size()); ++o) {
    if (replica_at_[o] < 0 && served_by_[o] != spare) {
      replica_at_[o] = spare;
      replica_since_[o] = epoch_;
      owners.push_back(o);
    }
  }
  return owners;
}

void Placement::DropCopiesAt(int index) {
  for (int& at : replica_at_) {
    if (at == index) at = -1;
  }
}

std::vector<std::pair<int, int>> Placement::AssignCopies(const Servers& servers) {
  std::vector<std::pair<int, int>> named;
  for (int o = 0; o < static_cast<int>(replica_at_.size()); ++o) {
    const int by = served_by_[o];
    if (by < 0 || replica_at_[o] >= 0) continue;
    int best = -1, best_count = 0;
    bool best_apart = false;
    for (int i = 0; i < static_cast<int>(servers.size()); ++i) {
      if (i == by || !servers[i].live || servers[i].leaving) continue;
      const bool apart = servers[i].host != servers[by].host;
      const int count = static_cast<int>(std::count(replica_at_.begin(), replica_at_.end(), i));
      if (best < 0 || (apart && !best_apart) || (apart == best_apart && count < best_count)) {
        best = i, best_count = count, best_apart = apart;
      }
    }
    if (best < 0) continue;
    if (named.empty()) ++epoch_;
    replica_at_[o] = best;
    replica_since_[o] = epoch_;
    named.emplace_back(o, best);
  }
  return named;
}

void Placement::Join(int index) {
  Move m;
  m.owner = index;
  m.to = index;
  moves_.push_back(m);
}

std::vector<int> Placement::Remove(int index) {
  const std::vector<int> owners = OwnersServedBy(index);
  for (int o : owners) {
    Move m;
    m.owner = o;
    moves_.push_back(m);
  }
  return owners;
}

Placement::Progress Placement::GiveUp(const std::string& error) {
  Progress p{Progress::kGivenUp, moves_.front(), error};
  moves_.pop_front();
  // The removals under way stop (RemoveServer says why); joins go on.
  moves_.erase(std::remove_if(moves_.begin(), moves_.end(), [](const Move& m) { return m.to < 0; }),
               moves_.end());
  return p;
}

Placement::Progress Placement::Advance(const Servers& servers, absl::Time now,
                                       absl::Duration limit) {
  if (moves_.empty()) return {};
  Move& m = moves_.front();
  const int n = static_cast<int>(servers.size());
  auto live = [&](int i) { return i >= 0 && i < n && servers[i].live; };
  if (m.phase == Move::kWaiting) {
    m.from = served_by_[m.owner];
    if (m.to < 0) {
      // The live server serving the fewest owners, not leaving.
      int best = -1, best_count = 0;
      for (int i = 0; i < n; ++i) {
        if (!servers[i].live || servers[i].leaving) continue;
        const int count = static_cast<int>(std::count(served_by_.begin(), served_by_.end(), i));
        if (best < 0 || count < best_count) best = i, best_count = count;
      }
      m.to = best;
    }
    if (m.to < 0 || m.from == m.to || !live(m.from) || !live(m.to)) {
      return GiveUp(absl::StrCat("server ", m.owner, "'s keys cannot move from server ", m.from,
                                 " to server ", m.to, ": one of them is not there"));
    }
    ++epoch_;
    replica_at_[m.owner] = m.to;
    replica_since_[m.owner] = epoch_;
    m.epoch = epoch_;
    m.phase = Move::kCopying;
    m.since = now;
    return {Progress::kStarted, m, ""};
  }
  const Server& from = servers[m.from];
  if (m.phase == Move::kCopying) {
    const bool built = CopyBuilt(from, m.owner);
    if (!built && now - m.since > limit) {
      // Nothing has changed hands: the old server goes on serving them.
      ++epoch_;
      replica_at_[m.owner] = -1;
      replica_since_[m.owner] = epoch_;
      return GiveUp(absl::StrCat("server ", m.owner, "'s keys were not copied to server ", m.to,
                                 " within ", absl::FormatDuration(limit), "; they stay on server ",
                                 m.from));
    }
    if (!built) return {};
    ++epoch_;
    served_by_[m.owner] = -1;
    m.epoch = epoch_;
    m.phase = Move::kLetGo;
    return {};
  }
  if (m.phase == Move::kLetGo) {
    // Once the old server has let them go, the new one serves them.
    if (from.shard_epoch < m.epoch) return {};
    ++epoch_;
    served_by_[m.owner] = m.to;
    replica_at_[m.owner] = -1;
    replica_since_[m.owner] = epoch_;
    m.epoch = epoch_;
    m.phase = Move::kTakeOver;
    return {};
  }
  // kTakeOver: the new server serves them (so a checkpoint finds them there).
  if (servers[m.to].shard_epoch < m.epoch) return {};
  Progress p{Progress::kEnded, m, ""};
  moves_.pop_front();
  return p;
}

}  // namespace psrt
