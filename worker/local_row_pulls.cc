// Local aggregation of a table's pulls (docs/runtime.md, "Local
// aggregation"): the processes of a host group share the rows they pull in
// the table's cache (HostGroup::Slots::Look), so a row that several of
// their batches of a step hold is asked for once.
//
// Pulls of a sync step do not go together as its pushes do (a process may
// pull a table several times a step, or not at all), so there is no
// rendezvous: the first process to want a row of a version claims it and
// pulls it with the rest of its batch; the others wait for it or copy it.
// In sync mode a table's rows at a version are the same for everyone until
// every worker pushed that step, which none of those pulling it has, so a
// cached row is the row the server would answer; an answer of a later
// version is not cached.

#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "worker/dispatcher.h"

namespace psrt {

Dispatcher::Handle Dispatcher::StartGroupedPull(const std::string& table, const Variable& var,
                                                HostGroup::Slots* slots, const int64_t* ids,
                                                int64_t n, float* out, int64_t version) {
  const int me = group->local_rank();
  const int64_t dim = var.dim;
  // Rows pulled here (claimed, for the others too, or not cached), and
  // rows another process is pulling.
  std::vector<int64_t> pulled;
  auto claimed = std::make_shared<absl::flat_hash_map<int64_t, int64_t*>>();  // at -> entry
  struct Wait {
    int64_t at;
    int64_t* entry;
    int claimer;
  };
  auto waits = std::make_shared<std::vector<Wait>>();
  for (int64_t i = 0; i < n; ++i) {
    const HostGroup::Slots::Cached c = slots->Look(version, ids[i], me, out + i * dim);
    if (c.kind == HostGroup::Slots::Cached::kCopied) continue;
    if (c.kind == HostGroup::Slots::Cached::kWait) {
      waits->push_back({i, c.entry, c.claimer});
      continue;
    }
    if (c.kind == HostGroup::Slots::Cached::kClaimed) (*claimed)[i] = c.entry;
    pulled.push_back(i);
  }
  auto [handle, op] =
      ops.New((pulled.empty() ? 0 : 1) + (waits->empty() ? 0 : 1), absl::OkStatus(), "PULL");
  // The requests for rows `which` (positions in ids); `then` (if set) ends
  // each server's part.
  auto pull = [this, table, var, ids, out, version](
                  const std::vector<int64_t>& which,
                  std::function<absl::Status(const RowSet&, const absl::Status&)> then) {
    std::vector<std::shared_ptr<RowSet>> sets =
        SplitRows(ids, which.data(), static_cast<int64_t>(which.size()), nullptr, 0, num_servers);
    Requests next{{}, version, false, true};
    for (int s = 0; s < num_servers; ++s) {
      if (!sets[s]->ids.empty())
        next.shards.push_back(RowsShard(table, var, s, sets[s], out, false));
    }
    if (then) {
      next.adorn = [then](Request* r) {
        std::shared_ptr<const RowSet> rows = r->shard.items.front().rows;
        r->finished = [then, rows](const absl::Status& s) { return then(*rows, s); };
      };
    }
    return next;
  };
  if (!pulled.empty()) {
    // A claimed row goes into the cache if the server answered the step's
    // version; else its entry fails and whoever waits pulls it.
    auto fill = [this, slots, claimed, out, dim, version, me](const RowSet& rows,
                                                              const absl::Status& s) {
      for (int64_t at : rows.at) {
        auto it = claimed->find(at);
        if (it == claimed->end()) continue;
        const bool cached = s.ok() && rows.version == version;
        slots->Fill(it->second, version, me, cached ? out + at * dim : nullptr);
      }
      group->Ring();
      return s;
    };
    Continue(op, pull(pulled, std::move(fill)));
  }
  if (waits->empty()) return handle;
  auto fetching = [waits, version]() -> const Wait* {
    for (const Wait& w : *waits) {
      if (HostGroup::Slots::Fetching(w.entry, version, w.claimer)) return &w;
    }
    return nullptr;
  };
  // Rows whose entry failed or was taken over: pulled here.
  auto again = std::make_shared<std::vector<int64_t>>();
  GroupStage stage;
  stage.op = op;
  stage.deadline = absl::Now() + options.rpc_timeout;
  stage.ready = [fetching] { return fetching() == nullptr; };
  stage.missing = [this, fetching, table, ids, version] {
    const Wait* w = fetching();
    if (w == nullptr) return std::string();
    return absl::StrCat(group->Who(w->claimer), " did not pull the row of id ", ids[w->at],
                        " of table '", table, "' at version ", version, " for its host");
  };
  stage.work = [slots, waits, again, ids, out, dim, version] {
    for (const Wait& w : *waits) {
      if (!slots->Copy(w.entry, version, ids[w.at], out + w.at * dim)) again->push_back(w.at);
    }
    return absl::OkStatus();
  };
  stage.next = [again, pull]() -> absl::StatusOr<Requests> { return pull(*again, nullptr); };
  Await(std::move(stage));
  return handle;
}

}  // namespace psrt
