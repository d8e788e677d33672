// Local aggregation of a table (docs/runtime.md, "Local aggregation"): a
// sync push of rows by one process of a host group (worker/host_group.h).
// Every process pushes every part of a table once a step (docs/sparse.md),
// so a step's pushes of a host go together. For each part (server):
//
//   - a process that does not own it writes its rows there into its own
//     segment once the owners summed its rows of the step before;
//   - its owner waits for every other process's rows, sums them per id with
//     its own, in local-rank order, and pushes the sum once for all of them
//     (PushRequest.also_for). A row many of the host's processes saw
//     crosses the network once.
//
// An owner's sum is its own memory, so a part is free for the next step as
// soon as it is summed.

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
namespace {

// One process's rows of a step in its segment: the number of parts, then
// per part its first row and row count, then every part's ids, then their
// gradients.
struct RowsLayout {
  int64_t parts = 0, rows = 0, dim = 0;
  int64_t ids_at() const { return 8 + parts * 16; }
  int64_t grads_at() const { return (ids_at() + rows * 8 + 63) / 64 * 64; }
  int64_t bytes() const { return grads_at() + rows * dim * 4; }
};

// A part's rows as one process handed them over.
struct PartRows {
  const int64_t* ids = nullptr;
  const float* grads = nullptr;
  int64_t n = 0;
};

// Part `part` of the rows in a segment of `bytes`, checked against its
// bounds: what another process wrote is read, never trusted to be whole.
absl::StatusOr<PartRows> ReadPart(const char* seg, int64_t bytes, int64_t parts, int64_t dim,
                                  uint32_t part) {
  const int64_t* head = reinterpret_cast<const int64_t*>(seg);
  RowsLayout layout{parts, 0, dim};
  if (bytes < layout.ids_at() || head[0] != parts) {
    return absl::InternalError(
        absl::StrCat("a segment of rows has ", head[0], " parts, not ", parts));
  }
  const int64_t first = head[1 + 2 * part], n = head[2 + 2 * part];
  int64_t rows = 0;
  for (int64_t p = 0; p < parts; ++p) rows += head[2 + 2 * p];
  layout.rows = rows;
  if (first < 0 || n < 0 || rows < 0 || first + n > rows || layout.bytes() > bytes) {
    return absl::InternalError("a segment of rows is not whole");
  }
  return PartRows{reinterpret_cast<const int64_t*>(seg + layout.ids_at()) + first,
                  reinterpret_cast<const float*>(seg + layout.grads_at()) + first * dim, n};
}

}  // namespace

Dispatcher::Handle Dispatcher::StartGroupedRows(const std::string& table, const Variable& var,
                                                HostGroup::Slots* slots,
                                                std::vector<std::shared_ptr<RowSet>> sets,
                                                std::vector<bool> await, int64_t version) {
  const int me = group->local_rank();
  const int64_t dim = var.dim, parts = num_servers;
  std::vector<uint32_t> mine, theirs;
  for (uint32_t p = 0; p < static_cast<uint32_t>(parts); ++p) {
    (slots->owner(p) == me ? mine : theirs).push_back(p);
  }
  auto [handle, op] =
      ops.New((theirs.empty() ? 0 : 1) + (mine.empty() ? 0 : 1), absl::OkStatus(), "PUSH");
  const int64_t step = version + 1;  // as the control words hold it
  const absl::Time deadline = absl::Now() + options.rpc_timeout;
  auto who = [this](int local) {
    return absl::StrCat("local rank ", local, " (rank ", group->rank_of(local), ")");
  };
  auto rows = std::make_shared<std::vector<std::shared_ptr<RowSet>>>(std::move(sets));
  // Runs `work` on the pool once `ready` holds (rows are small next to a
  // dense gradient; the pool keeps the caller's thread free all the same).
  auto when = [this, deadline](std::function<bool()> ready, std::function<std::string()> missing,
                               std::function<void(const absl::Status&)> work) {
    if (ready()) return pool->Schedule([work] { work(absl::OkStatus()); });
    group->When(std::move(ready), std::move(missing), deadline,
                [this, work](const absl::Status& s) { pool->Schedule([work, s] { work(s); }); });
  };

  if (!theirs.empty()) {
    auto unsummed = [slots, theirs, me]() -> int64_t {
      for (uint32_t p : theirs) {
        if (slots->summed(p) < slots->handed(p, me)) return p;
      }
      return -1;
    };
    when([unsummed] { return unsummed() < 0; },
         [unsummed, slots, table, who, step] {
           const int64_t p = unsummed();
           if (p < 0) return std::string();
           return absl::StrCat(who(slots->owner(p)), " did not sum the rows of '",
                               KeyName(table, p), "' of step ", step - 2,
                               ", so this process could not hand over its rows of step ", step - 1);
         },
         [this, slots, theirs, rows, parts, dim, me, step, op = op](const absl::Status& status) {
           absl::Status s = status;
           RowsLayout layout{parts, 0, dim};
           for (uint32_t p : theirs) layout.rows += (*rows)[p]->ids.size();
           absl::StatusOr<char*> seg = s.ok() ? slots->RowsToWrite(me, layout.bytes()) : nullptr;
           if (s.ok()) s = seg.status();
           if (s.ok()) {
             int64_t* head = reinterpret_cast<int64_t*>(*seg);
             int64_t* ids = reinterpret_cast<int64_t*>(*seg + layout.ids_at());
             float* grads = reinterpret_cast<float*>(*seg + layout.grads_at());
             std::memset(head, 0, layout.ids_at());
             head[0] = parts;
             int64_t at = 0;
             for (uint32_t p : theirs) {
               const RowSet& set = *(*rows)[p];
               const int64_t n = static_cast<int64_t>(set.ids.size());
               head[1 + 2 * p] = at;
               head[2 + 2 * p] = n;
               std::memcpy(ids + at, set.ids.data(), n * 8);
               std::memcpy(grads + at * dim, set.grads.data(), n * dim * 4);
               at += n;
             }
             for (uint32_t p : theirs) slots->set_handed(p, me, step);
             group->Ring();
           }
           OpTracker::Done(op.get(), s);
         });
  }
  if (mine.empty()) return handle;
  const uint64_t ticket = launch_tickets.fetch_add(1);
  auto unhanded = [this, slots, mine, me, step]() -> std::pair<int64_t, int> {
    for (uint32_t p : mine) {
      for (int r = 0; r < group->size(); ++r) {
        if (r != me && slots->handed(p, r) < step) return {p, r};
      }
    }
    return {-1, -1};
  };
  when([unhanded] { return unhanded().first < 0; },
       [unhanded, table, who, step] {
         auto [p, r] = unhanded();
         if (p < 0) return std::string();
         return absl::StrCat(who(r), " did not hand over its rows of '", KeyName(table, p),
                             "' of step ", step - 1);
       },
       [this, slots, mine, rows, table, var, await, parts, dim, me, step, version, who, ticket,
        op = op](const absl::Status& status) {
         absl::Status s = status;
         std::vector<Shard> shards;
         // Per part, the sum per id in local-rank order, each process's
         // rows in its order.
         for (uint32_t p : mine) {
           if (!s.ok()) break;
           auto sum = std::make_shared<RowSet>();
           absl::flat_hash_map<int64_t, int64_t> where;
           for (int r = 0; r < group->size() && s.ok(); ++r) {
             PartRows got;
             if (r == me) {
               const RowSet& own = *(*rows)[p];
               got = {own.ids.data(), own.grads.data(), static_cast<int64_t>(own.ids.size())};
             } else if (slots->handed(p, r) > step) {
               s = absl::FailedPreconditionError(absl::StrCat(
                   who(r), " handed over the rows of '", KeyName(table, p), "' of step ",
                   slots->handed(p, r) - 1, " while this process sums step ", step - 1,
                   ": the host's processes push different steps"));
               break;
             } else {
               absl::StatusOr<std::pair<const char*, int64_t>> seg = slots->RowsOf(r);
               absl::StatusOr<PartRows> part =
                   seg.ok() ? ReadPart(seg->first, seg->second, parts, dim, p) : seg.status();
               if (!part.ok()) {
                 s = part.status();
                 break;
               }
               got = *part;
             }
             for (int64_t i = 0; i < got.n; ++i) {
               const float* g = got.grads + i * dim;
               auto [it, fresh] =
                   where.try_emplace(got.ids[i], static_cast<int64_t>(sum->ids.size()));
               if (fresh) {
                 sum->ids.push_back(got.ids[i]);
                 sum->grads.insert(sum->grads.end(), g, g + dim);
               } else {
                 float* acc = sum->grads.data() + it->second * dim;
                 for (int64_t j = 0; j < dim; ++j) acc[j] += g[j];
               }
             }
           }
           if (!s.ok()) break;
           shards.push_back(
               RowsShard(table, var, static_cast<int>(p), std::move(sum), nullptr, await[p]));
         }
         if (!s.ok()) return InTurn(ticket, [op, s] { OpTracker::Done(op.get(), s); });
         // The sums are this process's: the others may hand over the next step.
         for (uint32_t p : mine) slots->set_summed(p, step);
         group->Ring();
         InTurn(ticket, [this, shards = std::move(shards), version, op]() mutable {
           OpTracker::Add(op.get(), static_cast<int>(shards.size()));
           Launch(std::move(shards), op, version, true, false,
                  [this](Request* r) { r->also_for = group->others(); });
           OpTracker::Done(op.get(), absl::OkStatus());
         });
       });
  return handle;
}

}  // namespace psrt
