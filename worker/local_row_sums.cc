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

// One grouped push of a table's rows, and what its stages share. Each
// stage's functions hold it.
struct GroupedRows {
  Dispatcher* d = nullptr;
  std::string table;
  Variable var;
  HostGroup::Slots* slots = nullptr;
  std::vector<std::shared_ptr<RowSet>> rows;  // this process's, per part
  std::vector<bool> await;                    // per part: StartRows's
  std::vector<uint32_t> mine, theirs;         // the parts this process owns, and the others
  std::shared_ptr<Op> op;
  int me = 0;
  int64_t dim = 0, parts = 0, version = 0, step = 0;  // step: as the control words hold it
  absl::Time deadline;
  uint64_t ticket = 0;  // with parts of its own: its turn to launch (Dispatcher::turns)
  HostGroup& group() const { return *d->group; }
};
using Rows = std::shared_ptr<GroupedRows>;

// Writes this process's rows of the parts it does not own into its segment
// and marks them handed over.
absl::Status WriteRows(const GroupedRows& g) {
  RowsLayout layout{g.parts, 0, g.dim};
  for (uint32_t p : g.theirs) layout.rows += g.rows[p]->ids.size();
  absl::StatusOr<char*> seg = g.slots->RowsToWrite(g.me, layout.bytes());
  if (!seg.ok()) return seg.status();
  int64_t* head = reinterpret_cast<int64_t*>(*seg);
  int64_t* ids = reinterpret_cast<int64_t*>(*seg + layout.ids_at());
  float* grads = reinterpret_cast<float*>(*seg + layout.grads_at());
  std::memset(head, 0, layout.ids_at());
  head[0] = g.parts;
  int64_t at = 0;
  for (uint32_t p : g.theirs) {
    const RowSet& set = *g.rows[p];
    const int64_t n = static_cast<int64_t>(set.ids.size());
    head[1 + 2 * p] = at;
    head[2 + 2 * p] = n;
    std::memcpy(ids + at, set.ids.data(), n * 8);
    std::memcpy(grads + at * g.dim, set.grads.data(), n * g.dim * 4);
    at += n;
  }
  for (uint32_t p : g.theirs) g.slots->set_handed(p, g.me, g.step);
  g.group().Ring();
  return absl::OkStatus();
}

// Hand-over: this process's rows of a step go into its segment once the
// owners summed its rows of the step before.
void HandOverRows(const Rows& g) {
  auto unsummed = [g]() -> int64_t {
    for (uint32_t p : g->theirs) {
      if (g->slots->summed(p) < g->slots->handed(p, g->me)) return p;
    }
    return -1;
  };
  // On the pool (rows are small next to a dense gradient; the pool keeps
  // the caller's thread free all the same).
  Dispatcher::GroupStage stage;
  stage.op = g->op;
  stage.deadline = g->deadline;
  stage.ready = [unsummed] { return unsummed() < 0; };
  stage.missing = [g, unsummed] {
    const int64_t p = unsummed();
    if (p < 0) return std::string();
    return absl::StrCat(g->group().Who(g->slots->owner(p)), " did not sum the rows of '",
                        KeyName(g->table, p), "' of step ", g->step - 2,
                        ", so this process could not hand over its rows of step ", g->step - 1);
  };
  stage.work = [g] { return WriteRows(*g); };
  g->d->Await(std::move(stage));
}

// The host's rows of part `p` summed per id, in local-rank order, each
// process's rows in its order.
absl::StatusOr<std::shared_ptr<RowSet>> SumRows(const GroupedRows& g, uint32_t p) {
  const int64_t dim = g.dim;
  auto sum = std::make_shared<RowSet>();
  absl::flat_hash_map<int64_t, int64_t> where;
  for (int r = 0; r < g.group().size(); ++r) {
    PartRows got;
    if (r == g.me) {
      const RowSet& own = *g.rows[p];
      got = {own.ids.data(), own.grads.data(), static_cast<int64_t>(own.ids.size())};
    } else if (g.slots->handed(p, r) > g.step) {
      return absl::FailedPreconditionError(
          absl::StrCat(g.group().Who(r), " handed over the rows of '", KeyName(g.table, p),
                       "' of step ", g.slots->handed(p, r) - 1, " while this process sums step ",
                       g.step - 1, ": the host's processes push different steps"));
    } else {
      absl::StatusOr<std::pair<const char*, int64_t>> seg = g.slots->RowsOf(r);
      absl::StatusOr<PartRows> part =
          seg.ok() ? ReadPart(seg->first, seg->second, g.parts, dim, p) : seg.status();
      if (!part.ok()) return part.status();
      got = *part;
    }
    for (int64_t i = 0; i < got.n; ++i) {
      const float* row = got.grads + i * dim;
      auto [it, fresh] = where.try_emplace(got.ids[i], static_cast<int64_t>(sum->ids.size()));
      if (fresh) {
        sum->ids.push_back(got.ids[i]);
        sum->grads.insert(sum->grads.end(), row, row + dim);
      } else {
        float* acc = sum->grads.data() + it->second * dim;
        for (int64_t j = 0; j < dim; ++j) acc[j] += row[j];
      }
    }
  }
  return sum;
}

// The owned parts: once every other process handed its rows over, they are
// summed and pushed once for all (PushRequest.also_for), in the
// operation's turn.
void OwnRows(const Rows& g) {
  auto unhanded = [g]() -> std::pair<int64_t, int> {
    for (uint32_t p : g->mine) {
      for (int r = 0; r < g->group().size(); ++r) {
        if (r != g->me && g->slots->handed(p, r) < g->step) return {p, r};
      }
    }
    return {-1, -1};
  };
  Dispatcher::GroupStage stage;
  stage.op = g->op;
  stage.deadline = g->deadline;
  stage.ready = [unhanded] { return unhanded().first < 0; };
  stage.missing = [g, unhanded] {
    auto [p, r] = unhanded();
    if (p < 0) return std::string();
    return absl::StrCat(g->group().Who(r), " did not hand over its rows of '", KeyName(g->table, p),
                        "' of step ", g->step - 1);
  };
  auto shards = std::make_shared<std::vector<Shard>>();
  stage.work = [g, shards] {
    for (uint32_t p : g->mine) {
      absl::StatusOr<std::shared_ptr<RowSet>> sum = SumRows(*g, p);
      if (!sum.ok()) return sum.status();
      shards->push_back(Dispatcher::RowsShard(g->table, g->var, static_cast<int>(p),
                                              *std::move(sum), nullptr, g->await[p]));
    }
    // The sums are this process's: the others may hand over the next step.
    for (uint32_t p : g->mine) g->slots->set_summed(p, g->step);
    g->group().Ring();
    return absl::OkStatus();
  };
  stage.next = [g, shards]() -> absl::StatusOr<Dispatcher::Requests> {
    Dispatcher::Requests next{std::move(*shards), g->version, true, false};
    next.adorn = [g](Dispatcher::Request* r) { r->also_for = g->group().others(); };
    return next;
  };
  stage.in_turn = true;
  stage.ticket = g->ticket;
  g->d->Await(std::move(stage));
}

}  // namespace

Dispatcher::Handle Dispatcher::StartGroupedRows(const std::string& table, const Variable& var,
                                                HostGroup::Slots* slots,
                                                std::vector<std::shared_ptr<RowSet>> sets,
                                                std::vector<bool> await, int64_t version) {
  auto g = std::make_shared<GroupedRows>();
  g->d = this;
  g->table = table;
  g->var = var;
  g->slots = slots;
  g->rows = std::move(sets);
  g->await = std::move(await);
  g->me = group->local_rank();
  g->dim = var.dim;
  g->parts = num_servers;
  g->version = version;
  g->step = version + 1;
  for (uint32_t p = 0; p < static_cast<uint32_t>(g->parts); ++p) {
    (slots->owner(p) == g->me ? g->mine : g->theirs).push_back(p);
  }
  auto [handle, op] =
      ops.New((g->theirs.empty() ? 0 : 1) + (g->mine.empty() ? 0 : 1), absl::OkStatus(), "PUSH");
  g->op = op;
  g->deadline = absl::Now() + options.rpc_timeout;
  if (!g->mine.empty()) g->ticket = turns.Take();
  if (!g->theirs.empty()) HandOverRows(g);
  if (!g->mine.empty()) OwnRows(g);
  return handle;
}

}  // namespace psrt
