#ifndef PSRT_SERVER_PLACEMENT_H_
#define PSRT_SERVER_PLACEMENT_H_

// Where each server index's keys are: which server serves them and which
// keeps their copy ("replicas"), and their moves between servers as servers
// join and leave ("max_servers"). It holds the shard map's content and makes
// the decisions that change it; the coordinator tells it what it knows of
// the servers (Server) and does the logging, the counting and the pausing of
// checkpoints around it. Not thread-safe: the coordinator holds its lock
// around every call.

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "psrt/v1/coordinator.pb.h"

namespace psrt {

class Placement {
 public:
  // A server as the coordinator knows it now.
  struct Server {
    bool live = false;     // registered, not exited, lost or parked
    bool leaving = false;  // RemoveServer is moving its keys away
    std::string host;
    int64_t shard_epoch = 0;           // the map it said it applies
    std::vector<int> copies_building;  // owners, as it last said
  };
  using Servers = std::vector<Server>;  // by server index

  // One owner's keys going from server `from` to server `to`, in phases,
  // each taken once the servers say they apply the map the last one made:
  // B gets a copy (replica_at) built by A, which forwards updates to it
  // from then on; once it is built A lets the keys go (served_by -1); then B
  // serves them; the move ends once B says it does.
  struct Move {
    int owner = 0;
    int from = -1;
    int to = -1;  // -1: the live server serving the fewest owners, at the start
    enum Phase { kWaiting, kCopying, kLetGo, kTakeOver } phase = kWaiting;
    int64_t epoch = 0;  // of the shard map that started the phase
    absl::Time since;
  };
  // What Advance did.
  struct Progress {
    enum Kind { kNone, kStarted, kEnded, kGivenUp } kind = kNone;
    Move move;          // the move it concerns
    std::string error;  // kGivenUp: why
  };

  // `num_servers` indices, the first `started` with a process (0: all of
  // them; "max_servers": the others join later, their keys served meanwhile
  // by InitialServer). With `replicas` on fixed servers each index's copy is
  // on BackupServer from the start (the workers register keys with both);
  // with "max_servers" copies are named once the job runs (AssignCopies).
  // Drops the moves under way.
  void LayOut(int num_servers, int started, int replicas, int servers_per_host);

  int64_t epoch() const { return epoch_; }
  // A change the map shows beyond these (a server's address).
  void Changed() { ++epoch_; }
  void Fill(v1::ShardMap* map) const;  // all but the addresses
  const std::vector<int>& served_by() const { return served_by_; }
  int ServedBy(int owner) const { return served_by_[owner]; }
  int CopyAt(int owner) const { return replica_at_.empty() ? -1 : replica_at_[owner]; }
  std::vector<int> OwnersServedBy(int server) const;

  // Whether `serving` said it built the copy of `owner`'s keys the map
  // names (since replica_since).
  bool CopyBuilt(const Server& serving, int owner) const;
  // The owners whose keys server `index` (as `serving` says) serves with a
  // copy built.
  std::vector<int> CopiesBuilt(int index, const Server& serving) const;

  // Server `lost` is gone: where every owner it served has a copy built on
  // a live server, those serve them now, and the copies `lost` kept are
  // gone; returns the owners that moved. nullopt, changing nothing, where
  // one has none.
  std::optional<std::vector<int>> FailOver(int lost, const Servers& servers);
  // A server back after a failover keeps every copy that is missing (of
  // the owners it does not serve); returns those owners.
  std::vector<int> KeepMissingCopies(int spare);
  // The copies server `index` kept are gone (it left the job).
  void DropCopiesAt(int index);
  // "replicas" with "max_servers": names a copy holder for every owner's
  // keys that have none and a server: a live server other than the one
  // serving them, on another host where there is one, keeping the fewest.
  // Returns (owner, holder) for each named.
  std::vector<std::pair<int, int>> AssignCopies(const Servers& servers);

  bool moving() const { return !moves_.empty(); }
  // Server `index` joins: its own keys move to it.
  void Join(int index);
  // Server `index` leaves: every owner it serves moves to another server;
  // returns those owners.
  std::vector<int> Remove(int index);
  // Takes the move in front a phase further where the servers allow
  // (`limit`: how long a copy may take to build before the move is given
  // up, the keys staying where they were and the removals under way
  // stopping). Call with the checkpoints paused.
  Progress Advance(const Servers& servers, absl::Time now, absl::Duration limit);

 private:
  Progress GiveUp(const std::string& error);

  std::vector<int> served_by_;   // per server index: who serves its keys (-1: nobody, a move)
  std::vector<int> replica_at_;  // per server index: who keeps copies (-1: none); empty: never
  std::vector<int64_t> replica_since_;  // the epoch it was named in
  int64_t epoch_ = 0;
  std::deque<Move> moves_;
};

}  // namespace psrt

#endif  // PSRT_SERVER_PLACEMENT_H_
