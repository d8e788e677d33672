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
// the processes. Each part of an operation ends its Op like a request does.

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

}  // namespace

void Dispatcher::InTurn(uint64_t ticket, std::function<void()> launch) {
  // Under the lock, so that two turns never run out of order; a launch only
  // queues requests (and sends the first ones), and takes no lock of this.
  absl::MutexLock lock(&turns_mu);
  turns[ticket] = std::move(launch);
  while (!turns.empty() && turns.begin()->first == next_turn) {
    std::function<void()> next = std::move(turns.begin()->second);
    turns.erase(turns.begin());
    ++next_turn;
    next();
  }
}

Dispatcher::Handle Dispatcher::StartGrouped(std::vector<TensorRef> tensors, int64_t version,
                                            bool pull) {
  const char* kind = pull ? "PUSH_PULL" : "PUSH";
  auto refs = std::make_shared<const std::vector<TensorRef>>(std::move(tensors));
  const int me = group->local_rank();
  auto mine = std::make_shared<Pieces>();
  auto theirs = std::make_shared<Pieces>();
  for (const TensorRef& t : *refs) {
    absl::StatusOr<Variable> var = Find(t.name);
    if (!var.ok()) return ops.New(0, var.status(), kind).first;
    HostGroup::Slots* slots = group->Find(t.name);
    if (var->dim > 0) {
      return ops
          .New(0,
               absl::InvalidArgumentError(absl::StrCat("'", t.name, "' is a table: push its rows")),
               kind)
          .first;
    }
    if (slots == nullptr) {
      return ops
          .New(0,
               absl::InternalError(
                   absl::StrCat("variable '", t.name, "' has no region in the host group")),
               kind)
          .first;
    }
    if (pull && t.out == nullptr) {
      return ops
          .New(0,
               absl::InvalidArgumentError(
                   absl::StrCat("tensor '", t.name, "' has no output buffer")),
               kind)
          .first;
    }
    if ((t.grad != nullptr && OnDevice(t.grad)) || (pull && OnDevice(t.out))) slots->PinForDevice();
    for (const Partition& p : var->parts) {
      (slots->owner(p.index) == me ? mine : theirs)->push_back({&t, p, slots});
    }
  }
  const int parts = (theirs->empty() ? 0 : pull ? 2 : 1) + (mine->empty() ? 0 : 1);
  auto [handle, op] = ops.New(parts, absl::OkStatus(), kind);
  const int64_t step = version + 1;  // as the control words hold it
  const absl::Time deadline = absl::Now() + options.rpc_timeout;
  auto who = [this](int local) {
    return absl::StrCat("local rank ", local, " (rank ", group->rank_of(local), ")");
  };

  // Runs `work` once `ready` holds: here when it holds already and the
  // pieces are small, else on the pool (copies and sums of big tensors
  // leave the caller's thread, as encoding does: pushes overlap backward).
  auto run_or_wait = [this, deadline](const Pieces& pieces, std::function<bool()> ready,
                                      std::function<std::string()> missing,
                                      std::function<void(const absl::Status&)> work) {
    int64_t bytes = 0;
    for (const Piece& p : pieces) bytes += p.part.num_elements * 4;
    if (ready()) {
      if (bytes < kPoolBytes) return work(absl::OkStatus());
      return pool->Schedule([work] { work(absl::OkStatus()); });
    }
    group->When(std::move(ready), std::move(missing), deadline,
                [this, work](const absl::Status& s) { pool->Schedule([work, s] { work(s); }); });
  };
  // A step's gradient of a partition goes into this process's slot once its
  // owner summed the step before out of it.
  if (!theirs->empty()) {
    run_or_wait(
        *theirs,
        [theirs, me] {
          for (const Piece& p : *theirs) {
            if (p.slots->summed(p.part.index) < p.slots->handed(p.part.index, me)) return false;
          }
          return true;
        },
        [theirs, me, who, step] {
          for (const Piece& p : *theirs) {
            if (p.slots->summed(p.part.index) < p.slots->handed(p.part.index, me)) {
              return absl::StrCat(who(p.slots->owner(p.part.index)), " did not sum step ", step - 2,
                                  " of '", p.key(),
                                  "', so this process could not hand over its gradient of step ",
                                  step - 1);
            }
          }
          return std::string();
        },
        [this, theirs, refs, me, step, op = op](const absl::Status& status) {
          absl::Status s = status;
          for (const Piece& p : *theirs) {
            if (!s.ok()) break;
            const int64_t at = p.part.offset;
            if (p.tensor->grad == nullptr) {
              p.slots->set_empty(p.part.index, me, step);  // no gradient this step
            } else {
              s = CopyFloats(p.tensor->grad + at, p.slots->grad(me) + at, p.part.num_elements);
            }
            if (s.ok()) p.slots->set_handed(p.part.index, me, step);
          }
          if (s.ok()) group->Ring();
          OpTracker::Done(op.get(), s);
        });
  }
  // The weights of step+1 come back once the owner published them.
  if (!theirs->empty() && pull) {
    run_or_wait(
        *theirs,
        [theirs, step] {
          for (const Piece& p : *theirs) {
            if (p.slots->published(p.part.index) < step + 1) return false;
          }
          return true;
        },
        [theirs, who, step] {
          for (const Piece& p : *theirs) {
            if (p.slots->published(p.part.index) < step + 1) {
              return absl::StrCat(who(p.slots->owner(p.part.index)),
                                  " did not hand back the weights of '", p.key(), "' of step ",
                                  step);
            }
          }
          return std::string();
        },
        [this, theirs, refs, op = op, who](const absl::Status& status) {
          absl::Status s = status;
          for (const Piece& p : *theirs) {
            if (!s.ok()) break;
            const int64_t at = p.part.offset;
            const int64_t published = p.slots->published(p.part.index);
            s = CopyFloats(p.slots->weights(published - 1) + at, p.tensor->out + at,
                           p.part.num_elements);
            // That buffer is written again for the version after next,
            // whose step needs this process's next hand-over: seeing it
            // change means a process ran ahead of the group.
            if (s.ok() && p.slots->published(p.part.index) > published + 1) {
              s = absl::AbortedError(
                  absl::StrCat("the weights of '", p.key(), "' changed while being copied: ",
                               who(p.slots->owner(p.part.index)), " is more than a step ahead"));
            }
            if (s.ok()) {
              absl::MutexLock lock(&mu);
              auto it = variables.find(p.tensor->name);
              if (it != variables.end()) it->second.pulled_versions[p.part.index] = published - 1;
            }
          }
          OpTracker::Done(op.get(), s);
        });
  }
  if (mine->empty()) return handle;
  const uint64_t ticket = launch_tickets.fetch_add(1);

  // Owned partitions: every other process's gradient, and this process's
  // push of the step before ended (its request reads the slot it sums into).
  auto missing_hand_over = [this, mine, me](int64_t step) -> std::pair<const Piece*, int> {
    for (const Piece& p : *mine) {
      for (int r = 0; r < group->size(); ++r) {
        if (r != me && p.slots->handed(p.part.index, r) < step) return {&p, r};
      }
      if (p.slots->sent(p.part.index) < p.slots->summed(p.part.index)) return {&p, me};
    }
    return {nullptr, -1};
  };
  run_or_wait(
      *mine, [missing_hand_over, step] { return missing_hand_over(step).first == nullptr; },
      [missing_hand_over, step, me, who] {
        auto [p, r] = missing_hand_over(step);
        if (p == nullptr) return std::string();
        if (r == me) {
          return absl::StrCat("this process's push of '", p->key(), "' of step ", step - 2,
                              " did not end");
        }
        return absl::StrCat(who(r), " did not hand over its gradient of '", p->key(), "' of step ",
                            step - 1);
      },
      [this, mine, refs, me, step, version, pull, op = op, who,
       ticket](const absl::Status& status) {
        absl::Status s = status;
        // The tensors no process of the host had a gradient of this step.
        absl::flat_hash_set<std::string> empty_tensors;
        // Sum in local-rank order, this process's gradient in its place.
        for (const Piece& p : *mine) {
          if (!s.ok()) break;
          const int64_t at = p.part.offset, n = p.part.num_elements;
          float* sum = p.slots->grad(me) + at;
          for (int r = 0; r < group->size() && s.ok(); ++r) {
            if (p.slots->handed(p.part.index, r) > step) {
              s = absl::FailedPreconditionError(absl::StrCat(
                  who(r), " handed over '", p.key(), "' of step ",
                  p.slots->handed(p.part.index, r) - 1, " while this process sums step ", step - 1,
                  ": the host's processes push different steps"));
            }
          }
          if (!s.ok()) break;
          // The processes with a gradient of this step; none: the host's
          // push says so.
          std::vector<int> given;
          for (int r = 0; r < group->size(); ++r) {
            if (r == me ? p.tensor->grad != nullptr : p.slots->empty(p.part.index, r) != step)
              given.push_back(r);
          }
          if (given.empty()) empty_tensors.insert(p.tensor->name);
          for (size_t g = 0; g < given.size() && s.ok(); ++g) {
            const int r = given[g];
            if (g == 0) {
              if (r == me) {
                s = CopyFloats(p.tensor->grad + at, sum, n);
              } else {
                std::memcpy(sum, p.slots->grad(r) + at, n * 4);
              }
              continue;
            }
            const float* x = p.slots->grad(r) + at;
            if (r == me) {
              if (OnDevice(p.tensor->grad)) {
                // A GPU's gradient comes to the host once, into a buffer
                // this thread keeps (fresh pages would cost a first touch).
                thread_local std::vector<float> own;
                if (own.size() < static_cast<size_t>(n)) own.resize(n);
                if (s = CopyFloats(p.tensor->grad + at, own.data(), n); !s.ok()) break;
                x = own.data();
              } else {
                x = p.tensor->grad + at;
              }
            }
            Add(x, sum, n);
          }
          if (s.ok()) p.slots->set_summed(p.part.index, step);
        }
        if (!s.ok()) return InTurn(ticket, [op, s] { OpTracker::Done(op.get(), s); });
        group->Ring();
        // One push for the host, of the partitions summed here, in the
        // order of the operations (see InTurn).
        InTurn(ticket, [this, mine, refs, me, step, version, pull, op,
                        empty_tensors = std::move(empty_tensors)] {
          absl::flat_hash_map<std::string, std::vector<const Piece*>> by_name;
          std::vector<TensorRef> sums;
          for (const Piece& p : *mine) {
            auto& list = by_name[p.tensor->name];
            if (list.empty()) {
              const bool empty = empty_tensors.contains(p.tensor->name);
              sums.push_back({p.tensor->name, empty ? nullptr : p.slots->grad(me),
                              pull ? p.slots->weights(version + 1) : nullptr});
            }
            list.push_back(&p);
          }
          std::vector<int64_t> limits(num_servers);
          for (int sv = 0; sv < num_servers; ++sv) limits[sv] = RequestBytes(sv);
          absl::StatusOr<std::vector<Shard>> shards = SplitTensors(
              sums,
              [&](const std::string& name) -> absl::StatusOr<Variable> {
                absl::StatusOr<Variable> var = Find(name);
                if (!var.ok()) return var;
                var->parts.clear();
                for (const Piece* p : by_name[name]) var->parts.push_back(p->part);
                return var;
              },
              limits, true, pull, false);
          if (!shards.ok()) return OpTracker::Done(op.get(), shards.status());
          auto owned =
              std::make_shared<absl::flat_hash_map<std::string, std::vector<const Piece*>>>(
                  std::move(by_name));
          OpTracker::Add(op.get(), static_cast<int>(shards->size()));
          Launch(*std::move(shards), op, version, true, pull, [&](Request* r) {
            r->also_for = group->others();
            r->finished = [this, r, owned, mine, refs, step, pull](const absl::Status& s) {
              absl::Status result = s;
              for (const Shard::Item& it : r->shard.items) {
                for (const Piece* p : owned->at(it.variable)) {
                  if (p->part.index != it.part.index) continue;
                  const uint32_t i = p->part.index;
                  const int64_t at = p->part.offset;
                  if (s.ok() && pull) {
                    // The weights this process pulled for all; its own copy too.
                    absl::Status c = CopyFloats(p->slots->weights(step) + at, p->tensor->out + at,
                                                p->part.num_elements);
                    if (c.ok()) p->slots->set_published(i, step + 1);
                    if (result.ok()) result = c;
                  }
                  p->slots->set_sent(i, step);
                }
              }
              group->Ring();
              return result;
            };
          });
          OpTracker::Done(op.get(), absl::OkStatus());
        });
      });
  return handle;
}

}  // namespace psrt
