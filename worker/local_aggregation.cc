// Local aggregation (docs/runtime.md): a sync push of dense variables by one
// process of a host group (worker/host_group.h). For each partition:
//
//   - a process that does not own it copies its gradient into its slot once
//     the owner summed the step before (HandOver), and with a pull copies
//     the weights back once the owner published them (HandBack);
//   - its owner waits for every other process's gradient, sums the slots
//     with its own into its slot, pushes that once for all of them
//     (PushRequest.also_for: the servers count one push from each), pulls
//     into the weight buffer of the step's parity and publishes it (Own).
//
// The control words order each slot's writes and reads, so no lock spans
// the processes. Each of these is a stage of the dispatcher's pipeline
// (Dispatcher::GroupStage): a part of the operation, ended as a request's is.

#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "worker/dispatcher.h"
#ifdef PSRT_HAVE_CUDA
#include "kernels/cuda_kernels.h"
#endif

namespace psrt {
namespace {

// One partition of a tensor in a grouped operation.
struct Piece {
  const TensorRef* tensor;
  Partition part;
  HostGroup::Slots* slots;
  std::string key() const { return KeyName(tensor->name, part.index); }
};
using Pieces = std::vector<Piece>;

// Copies n floats between host memory and memory that may be a GPU's.
absl::Status CopyFloats(const float* src, float* dst, int64_t n) {
  if (n == 0) return absl::OkStatus();
#ifdef PSRT_HAVE_CUDA
  if (IsDevicePointer(src)) return CudaCopyToHost(src, dst, n * 4);
  if (IsDevicePointer(dst)) return CudaCopyToDevice(src, dst, n * 4);
#endif
  std::memcpy(dst, src, n * 4);
  return absl::OkStatus();
}

bool OnDevice(const float* p) {
#ifdef PSRT_HAVE_CUDA
  return IsDevicePointer(p);
#else
  (void)p;
  return false;
#endif
}

// acc += x (vectorized by the compiler: the buffers do not overlap). A
// partition is at most partition_bytes, so each pass stays in cache.
void Add(const float* __restrict x, float* __restrict acc, int64_t n) {
  for (int64_t i = 0; i < n; ++i) acc[i] += x[i];
}

// One grouped push: its pieces, this process's to push and those it hands
// over, and what its stages share. Each stage's functions hold it.
struct GroupedPush {
  Dispatcher* d = nullptr;
  std::vector<TensorRef> refs;  // the pieces point into it
  Pieces mine, theirs;
  std::shared_ptr<Op> op;
  int me = 0;
  int64_t version = 0, step = 0;  // step: version + 1, as the control words hold it
  bool pull = false;
  absl::Time deadline;
  uint64_t ticket = 0;  // with pieces of its own: its turn to launch (Dispatcher::turns)
  HostGroup& group() const { return *d->group; }
};
using Grouped = std::shared_ptr<GroupedPush>;

// Whether pieces are small enough to copy or sum on the caller's thread.
bool Small(const Pieces& pieces) {
  int64_t bytes = 0;
  for (const Piece& p : pieces) bytes += p.part.num_elements * 4;
  return bytes < Dispatcher::kPoolBytes;
}

// Splits g's tensors into the pieces this process owns and the others; an
// error where a tensor cannot be pushed in the group.
absl::Status Collect(GroupedPush* g) {
  for (const TensorRef& t : g->refs) {
    absl::StatusOr<Variable> var = g->d->Find(t.name);
    if (!var.ok()) return var.status();
    HostGroup::Slots* slots = g->group().Find(t.name);
    if (var->dim > 0) {
      return absl::InvalidArgumentError(absl::StrCat("'", t.name, "' is a table: push its rows"));
    }
    if (slots == nullptr) {
      return absl::InternalError(
          absl::StrCat("variable '", t.name, "' has no region in the host group"));
    }
    if (g->pull && t.out == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name, "' has no output buffer"));
    }
    if ((t.grad != nullptr && OnDevice(t.grad)) || (g->pull && OnDevice(t.out))) {
      slots->PinForDevice();
    }
    for (const Partition& p : var->parts) {
      (slots->owner(p.index) == g->me ? g->mine : g->theirs).push_back({&t, p, slots});
    }
  }
  return absl::OkStatus();
}

// The first of `pieces` that `waits` holds for; null: none.
template <typename Pred>
const Piece* FirstPiece(const Pieces& pieces, Pred waits) {
  for (const Piece& p : pieces) {
    if (waits(p)) return &p;
  }
  return nullptr;
}

// Hand-over: a step's gradient of a partition goes into this process's
// slot once its owner summed the step before out of it.
void HandOver(const Grouped& g) {
  auto unsummed = [g] {
    return FirstPiece(g->theirs, [&](const Piece& p) {
      return p.slots->summed(p.part.index) < p.slots->handed(p.part.index, g->me);
    });
  };
  Dispatcher::GroupStage stage;
  stage.op = g->op;
  stage.here = Small(g->theirs);
  stage.deadline = g->deadline;
  stage.ready = [unsummed] { return unsummed() == nullptr; };
  stage.missing = [g, unsummed] {
    const Piece* p = unsummed();
    if (p == nullptr) return std::string();
    return absl::StrCat(
        g->group().Who(p->slots->owner(p->part.index)), " did not sum step ", g->step - 2, " of '",
        p->key(), "', so this process could not hand over its gradient of step ", g->step - 1);
  };
  stage.work = [g] {
    for (const Piece& p : g->theirs) {
      const int64_t at = p.part.offset;
      if (p.tensor->grad == nullptr) {
        p.slots->set_empty(p.part.index, g->me, g->step);  // no gradient this step
      } else if (absl::Status s = CopyFloats(p.tensor->grad + at, p.slots->grad(g->me) + at,
                                             p.part.num_elements);
                 !s.ok()) {
        return s;
      }
      p.slots->set_handed(p.part.index, g->me, g->step);
    }
    g->group().Ring();
    return absl::OkStatus();
  };
  g->d->Await(std::move(stage));
}

// Copies the weights of the pieces handed over back from the buffers their
// owners published.
absl::Status CopyBack(const GroupedPush& g) {
  for (const Piece& p : g.theirs) {
    const int64_t at = p.part.offset;
    const int64_t published = p.slots->published(p.part.index);
    absl::Status s =
        CopyFloats(p.slots->weights(published - 1) + at, p.tensor->out + at, p.part.num_elements);
    if (!s.ok()) return s;
    // That buffer is written again for the version after next, whose step
    // needs this process's next hand-over: seeing it change means a
    // process ran ahead of the group.
    if (p.slots->published(p.part.index) > published + 1) {
      return absl::AbortedError(
          absl::StrCat("the weights of '", p.key(), "' changed while being copied: ",
                       g.group().Who(p.slots->owner(p.part.index)), " is more than a step ahead"));
    }
    absl::MutexLock lock(&g.d->mu);
    g.d->RecordPulled(p.tensor->name, p.part.index, published - 1);
  }
  return absl::OkStatus();
}

// Hand-back: the weights of step+1 come back once the owner published them.
void HandBack(const Grouped& g) {
  auto unpublished = [g] {
    return FirstPiece(
        g->theirs, [&](const Piece& p) { return p.slots->published(p.part.index) < g->step + 1; });
  };
  Dispatcher::GroupStage stage;
  stage.op = g->op;
  stage.here = Small(g->theirs);
  stage.deadline = g->deadline;
  stage.ready = [unpublished] { return unpublished() == nullptr; };
  stage.missing = [g, unpublished] {
    const Piece* p = unpublished();
    if (p == nullptr) return std::string();
    return absl::StrCat(g->group().Who(p->slots->owner(p->part.index)),
                        " did not hand back the weights of '", p->key(), "' of step ", g->step);
  };
  stage.work = [g] { return CopyBack(*g); };
  g->d->Await(std::move(stage));
}

// Sums the host's gradients of a piece into this process's slot, in
// local-rank order, this process's gradient in its place; `*none`: no
// process had a gradient of it this step.
absl::Status SumPiece(const GroupedPush& g, const Piece& p, bool* none) {
  const HostGroup& group = g.group();
  const int me = g.me;
  const int64_t at = p.part.offset, n = p.part.num_elements;
  float* sum = p.slots->grad(me) + at;
  for (int r = 0; r < group.size(); ++r) {
    if (p.slots->handed(p.part.index, r) > g.step) {
      return absl::FailedPreconditionError(
          absl::StrCat(group.Who(r), " handed over '", p.key(), "' of step ",
                       p.slots->handed(p.part.index, r) - 1, " while this process sums step ",
                       g.step - 1, ": the host's processes push different steps"));
    }
  }
  // The processes with a gradient of this step; none: the host's push says so.
  std::vector<int> given;
  for (int r = 0; r < group.size(); ++r) {
    if (r == me ? p.tensor->grad != nullptr : p.slots->empty(p.part.index, r) != g.step) {
      given.push_back(r);
    }
  }
  *none = given.empty();
  for (size_t k = 0; k < given.size(); ++k) {
    const int r = given[k];
    if (k == 0) {
      if (r != me) {
        std::memcpy(sum, p.slots->grad(r) + at, n * 4);
      } else if (absl::Status s = CopyFloats(p.tensor->grad + at, sum, n); !s.ok()) {
        return s;
      }
      continue;
    }
    const float* x = p.slots->grad(r) + at;
    if (r == me) {
      if (OnDevice(p.tensor->grad)) {
        // A GPU's gradient comes to the host once, into a buffer this
        // thread keeps (fresh pages would cost a first touch).
        thread_local std::vector<float> own;
        if (own.size() < static_cast<size_t>(n)) own.resize(n);
        if (absl::Status s = CopyFloats(p.tensor->grad + at, own.data(), n); !s.ok()) return s;
        x = own.data();
      } else {
        x = p.tensor->grad + at;
      }
    }
    Add(x, sum, n);
  }
  p.slots->set_summed(p.part.index, g.step);
  return absl::OkStatus();
}

// What an owner's push does once it ended: with a pull, the weights it
// pulled for all are published (and copied into this process's tensor);
// its pieces' slots are free to sum into again.
absl::Status Published(const GroupedPush& g,
                       const absl::flat_hash_map<std::string, std::vector<const Piece*>>& owned,
                       const Dispatcher::Request& r, const absl::Status& s) {
  absl::Status result = s;
  for (const Shard::Item& it : r.shard.items) {
    for (const Piece* p : owned.at(it.variable)) {
      if (p->part.index != it.part.index) continue;
      const uint32_t i = p->part.index;
      const int64_t at = p->part.offset;
      if (s.ok() && g.pull) {
        absl::Status c =
            CopyFloats(p->slots->weights(g.step) + at, p->tensor->out + at, p->part.num_elements);
        if (c.ok()) p->slots->set_published(i, g.step + 1);
        if (result.ok()) result = c;
      }
      p->slots->set_sent(i, g.step);
    }
  }
  g.group().Ring();
  return result;
}

// The push: one for the host, of the partitions summed here (their
// variables' other partitions are other owners'), for all its processes
// (PushRequest.also_for). `empty`: tensors no process had a gradient of.
absl::StatusOr<Dispatcher::Requests> PushSums(const Grouped& g,
                                              const absl::flat_hash_set<std::string>& empty) {
  Dispatcher* d = g->d;
  absl::flat_hash_map<std::string, std::vector<const Piece*>> by_name;
  std::vector<TensorRef> sums;
  for (const Piece& p : g->mine) {
    auto& list = by_name[p.tensor->name];
    if (list.empty()) {
      sums.push_back({p.tensor->name,
                      empty.contains(p.tensor->name) ? nullptr : p.slots->grad(g->me),
                      g->pull ? p.slots->weights(g->version + 1) : nullptr});
    }
    list.push_back(&p);
  }
  std::vector<int64_t> limits(d->num_servers);
  for (int sv = 0; sv < d->num_servers; ++sv) limits[sv] = d->RequestBytes(sv);
  absl::StatusOr<std::vector<Shard>> shards = SplitTensors(
      sums,
      [&](const std::string& name) -> absl::StatusOr<Variable> {
        absl::StatusOr<Variable> var = d->Find(name);
        if (!var.ok()) return var;
        var->parts.clear();
        for (const Piece* p : by_name[name]) var->parts.push_back(p->part);
        return var;
      },
      limits, true, g->pull, false);
  if (!shards.ok()) return shards.status();
  auto owned = std::make_shared<absl::flat_hash_map<std::string, std::vector<const Piece*>>>(
      std::move(by_name));
  Dispatcher::Requests next{*std::move(shards), g->version, true, g->pull};
  next.adorn = [g, owned](Dispatcher::Request* r) {
    r->also_for = g->group().others();
    r->finished = [g, owned, r](const absl::Status& s) { return Published(*g, *owned, *r, s); };
  };
  return next;
}

// The owned pieces: once every other process handed its gradient over, and
// this process's push of the step before ended (its request reads the slot
// it sums into), they are summed and pushed, in the operation's turn.
void Own(const Grouped& g) {
  auto unhanded = [g]() -> std::pair<const Piece*, int> {
    for (const Piece& p : g->mine) {
      for (int r = 0; r < g->group().size(); ++r) {
        if (r != g->me && p.slots->handed(p.part.index, r) < g->step) return {&p, r};
      }
      if (p.slots->sent(p.part.index) < p.slots->summed(p.part.index)) return {&p, g->me};
    }
    return {nullptr, -1};
  };
  Dispatcher::GroupStage stage;
  stage.op = g->op;
  stage.here = Small(g->mine);
  stage.deadline = g->deadline;
  stage.ready = [unhanded] { return unhanded().first == nullptr; };
  stage.missing = [g, unhanded] {
    auto [p, r] = unhanded();
    if (p == nullptr) return std::string();
    if (r == g->me) {
      return absl::StrCat("this process's push of '", p->key(), "' of step ", g->step - 2,
                          " did not end");
    }
    return absl::StrCat(g->group().Who(r), " did not hand over its gradient of '", p->key(),
                        "' of step ", g->step - 1);
  };
  auto empty = std::make_shared<absl::flat_hash_set<std::string>>();  // no process's gradient
  stage.work = [g, empty] {
    for (const Piece& p : g->mine) {
      bool none = false;
      if (absl::Status s = SumPiece(*g, p, &none); !s.ok()) return s;
      if (none) empty->insert(p.tensor->name);
    }
    g->group().Ring();
    return absl::OkStatus();
  };
  stage.next = [g, empty] { return PushSums(g, *empty); };
  // In the order of the operations (see Dispatcher::turns).
  stage.in_turn = true;
  stage.ticket = g->ticket;
  g->d->Await(std::move(stage));
}

}  // namespace

void Dispatcher::Await(GroupStage stage) {
  auto st = std::make_shared<GroupStage>(std::move(stage));
  if (st->ready()) {
    if (st->here) return RunStage(st, absl::OkStatus());
    return pool->Schedule([this, st] { RunStage(st, absl::OkStatus()); });
  }
  group->When(st->ready, st->missing, st->deadline, [this, st](const absl::Status& s) {
    pool->Schedule([this, st, s] { RunStage(st, s); });
  });
}

void Dispatcher::RunStage(const std::shared_ptr<GroupStage>& stage, absl::Status s) {
  if (s.ok()) s = stage->work();
  if (!stage->next) return EndPart(stage->op.get(), s);
  auto go = [this, stage, s] {
    Continue(stage->op, s.ok() ? stage->next() : absl::StatusOr<Requests>(s));
  };
  if (!stage->in_turn) return go();
  turns.Run(stage->ticket, std::move(go));
}

Dispatcher::Handle Dispatcher::StartGrouped(std::vector<TensorRef> tensors, int64_t version,
                                            bool pull) {
  const char* kind = pull ? "PUSH_PULL" : "PUSH";
  auto g = std::make_shared<GroupedPush>();
  g->d = this;
  g->refs = std::move(tensors);
  g->me = group->local_rank();
  g->version = version;
  g->step = version + 1;
  g->pull = pull;
  if (absl::Status s = Collect(g.get()); !s.ok()) return ops.New(0, s, kind).first;
  const int parts = (g->theirs.empty() ? 0 : pull ? 2 : 1) + (g->mine.empty() ? 0 : 1);
  auto [handle, op] = ops.New(parts, absl::OkStatus(), kind);
  g->op = op;
  g->deadline = absl::Now() + options.rpc_timeout;
  if (!g->mine.empty()) g->ticket = turns.Take();
  if (!g->theirs.empty()) HandOver(g);
  if (!g->theirs.empty() && pull) HandBack(g);
  if (!g->mine.empty()) Own(g);
  return handle;
}

}  // namespace psrt
