#ifndef PSRT_WORKER_HOST_GROUP_H_
#define PSRT_WORKER_HOST_GROUP_H_

// The training processes of one job on one host, summing their gradients
// before they cross the network (docs/runtime.md, "Local aggregation").
//
// psrt-worker makes a small shared-memory directory for each generation of
// the job and names it in PSRT_HOST_GROUP. Each dense variable gets a region
// of its own, made by the first local process that registers it and found by
// the others through the directory: per partition a few control words, one
// gradient slot per local process and two weight buffers (one per step
// parity). A table's region has the control words of its parts (one per
// server) and, per local process, the name of a segment of that process's
// own holding its rows of a step, which it makes anew when they outgrow it.
// Partition p of variable v belongs to local rank (hash(v) + p) % L. Which
// process does what with these (hand over, sum, push, hand back) is the
// dispatcher's (worker/local_aggregation.cc, worker/local_row_sums.cc);
// this holds the memory, the control words and the waits.
//
// A futex in the directory wakes the group's waiters whenever a control word
// changes. Every wait has a deadline, and its error names what it waited
// for; a wait also ends when the job fails (`stop`).

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/call_once.h"
#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/shared_memory.h"

namespace psrt {

class HostGroup {
 public:
  // The most training processes a group holds.
  static constexpr int kMaxLocal = 64;

  // psrt-worker's part: the directory of a group whose local rank i is the
  // job's rank ranks[i] (2..kMaxLocal of them).
  static absl::StatusOr<std::unique_ptr<SharedRegion>> MakeDirectory(const std::vector<int>& ranks);

  // Joins the group of directory `name` as `local_rank`, whose job rank is
  // `rank` (checked against the directory). `stop` is asked while waiting:
  // an error ends every wait with it (the job failed).
  static absl::StatusOr<std::unique_ptr<HostGroup>> Join(const std::string& name, int local_rank,
                                                         int rank,
                                                         std::function<absl::Status()> stop);
  // Ends the waits still pending with CANCELLED (their `then` runs) and
  // stops the group's thread. Idempotent; the destructor closes too.
  void Close();
  ~HostGroup();
  HostGroup(const HostGroup&) = delete;
  HostGroup& operator=(const HostGroup&) = delete;

  int size() const { return size_; }
  int local_rank() const { return local_rank_; }
  int rank_of(int local) const { return ranks_[local]; }
  // "local rank L (rank R)": a process of the group, as errors name it.
  std::string Who(int local) const;
  // The job ranks of the other processes: what an owner's push counts for
  // besides its own (PushRequest.also_for).
  const std::vector<int32_t>& others() const { return others_; }

  // A variable's shared region. Control words hold a step plus one (0: none
  // yet), so a fresh region needs no initialising.
  class Slots {
   public:
    int owner(uint32_t part) const { return static_cast<int>((hash_ + part) % size_); }
    // Local rank r's gradient slot: the whole variable's layout.
    float* grad(int r) const { return data_ + r * stride_; }
    // The weights of `version` (two buffers, by parity).
    float* weights(int64_t version) const { return data_ + (size_ + (version & 1)) * stride_; }
    // Per partition: the step+1 local rank r handed over last; the step+1
    // its owner summed last, and sent last (its request ended); the
    // version+1 of the weights its owner published last.
    int64_t handed(uint32_t part, int r) const { return Load(&Control(part)[kHanded + r]); }
    int64_t summed(uint32_t part) const { return Load(&Control(part)[kSummed]); }
    int64_t sent(uint32_t part) const { return Load(&Control(part)[kSent]); }
    int64_t published(uint32_t part) const { return Load(&Control(part)[kPublished]); }
    void set_handed(uint32_t part, int r, int64_t v) { Store(&Control(part)[kHanded + r], v); }
    void set_summed(uint32_t part, int64_t v) { Store(&Control(part)[kSummed], v); }
    void set_sent(uint32_t part, int64_t v) { Store(&Control(part)[kSent], v); }
    void set_published(uint32_t part, int64_t v) { Store(&Control(part)[kPublished], v); }
    // The step+1 of local rank r's last hand-over without a gradient (the
    // tensor took no part in its loss): its slot then holds nothing of it.
    // Written before the hand-over's word.
    int64_t empty(uint32_t part, int r) const { return Load(&Control(part)[kEmpty + r]); }
    void set_empty(uint32_t part, int r, int64_t v) { Store(&Control(part)[kEmpty + r], v); }

    // Page-locks this process's mapping of the gradient slots and weight
    // buffers, once, the first time a GPU's tensors meet them: device
    // copies to and from them then go by DMA, one copy each way. Where that
    // fails (no GPU, a locked-memory limit) they stay pageable: slower, as
    // right. A no-op in a build without CUDA.
    void PinForDevice();
    ~Slots();

    // Tables: local rank r's segment of at least `bytes`, made anew (and
    // named for the others) when the one it has is smaller; r writes there
    // only while no owner reads it (every part it hands over summed).
    absl::StatusOr<char*> RowsToWrite(int r, int64_t bytes);
    // Tables: local rank r's segment as it named it last, and its bytes.
    absl::StatusOr<std::pair<const char*, int64_t>> RowsOf(int r);

    // Tables: the host's cache of pulled rows (worker/local_row_pulls.cc),
    // one per step parity. The first process to want a row of a version
    // claims an entry and pulls it; the others wait for it there, or copy
    // it once it is in. An entry of an earlier version is taken over once
    // its row is in (or never will be); a copy that overlapped a take-over
    // is told apart (the entry's word changed, as in a seqlock).
    struct Cached {
      enum Kind { kCopied, kWait, kClaimed, kPull } kind = kPull;
      int64_t* entry = nullptr;  // kWait, kClaimed
      int claimer = -1;          // kWait: the local rank pulling it
    };
    // What the cache holds of `id` at `version` for local rank `me`:
    // copied into `out` (dim floats); being pulled by another; claimed, to
    // pull and Fill; or no room (kPull).
    Cached Look(int64_t version, int64_t id, int me, float* out);
    // Ends `me`'s claim of `entry` with the row (null: none, and whoever
    // waits for it pulls it).
    void Fill(int64_t* entry, int64_t version, int me, const float* row);
    // Whether `entry` is still being pulled by `claimer` for `version`.
    static bool Fetching(const int64_t* entry, int64_t version, int claimer);
    // Copies the row of `id` at `version` out of `entry`; false when it is
    // not there (failed, or taken over).
    bool Copy(int64_t* entry, int64_t version, int64_t id, float* out) const;

   private:
    friend class HostGroup;
    // Where local rank r's rows lie: `gen` changes (last, released) when
    // r makes a new segment.
    struct Segment {
      int64_t gen;
      int64_t bytes;
      char name[80];
    };
    static constexpr int64_t kSegmentsBytes = 8192;
    static_assert(kMaxLocal * sizeof(Segment) <= kSegmentsBytes);
    // A table's cache holds about this much a parity.
    static constexpr int64_t kCacheBytes = 4 << 20;
    static int64_t EntryBytes(int64_t dim) { return 16 + (dim * 4 + 15) / 16 * 16; }
    static int64_t CacheEntries(int64_t dim);
    enum {
      kSummed = 0,
      kSent = 1,
      kPublished = 2,
      kHanded = 3,
      kEmpty = kHanded + kMaxLocal,
      kWords = kEmpty + kMaxLocal
    };
    static int64_t Load(const int64_t* w) { return __atomic_load_n(w, __ATOMIC_ACQUIRE); }
    static void Store(int64_t* w, int64_t v) { __atomic_store_n(w, v, __ATOMIC_RELEASE); }
    int64_t* Control(uint32_t part) const { return control_ + part * kWords; }
    // The control words' bytes (whole pages; a table's segments' names
    // or a variable's slots follow), and the region's.
    static int64_t ControlBytes(int64_t parts);
    static size_t Bytes(int64_t n, int64_t parts, int size, int64_t dim);

    std::unique_ptr<SharedRegion> region_;
    uint64_t hash_ = 0;
    int size_ = 0;
    int64_t stride_ = 0;  // floats between slots
    int64_t* control_ = nullptr;
    float* data_ = nullptr;
    Segment* segments_ = nullptr;  // tables
    int64_t* Entry(int64_t version, uint64_t i) const {
      return reinterpret_cast<int64_t*>(
          cache_ + ((version & 1) * cache_entries_ + static_cast<int64_t>(i)) * entry_bytes_);
    }
    char* cache_ = nullptr;
    int64_t cache_entries_ = 0, entry_bytes_ = 0, dim_ = 0;
    absl::once_flag pin_once_;
    bool pinned_ = false;  // set in pin_once_

    absl::Mutex mu_;
    std::unique_ptr<SharedRegion> written_ ABSL_GUARDED_BY(mu_);
    struct Seen {
      int64_t gen = 0;
      std::unique_ptr<SharedRegion> region;
    };
    std::vector<Seen> seen_ ABSL_GUARDED_BY(mu_);
  };

  // Makes or finds variable `name`'s region (n elements in `parts`
  // partitions); every local process registers it with the same size.
  absl::Status AddVariable(const std::string& name, int64_t n, int64_t parts, absl::Time deadline) {
    return Add(name, n, parts, 0, deadline);
  }
  // Makes or finds table `name`'s region (rows of `dim`, in `parts` parts).
  absl::Status AddTable(const std::string& name, int64_t dim, int64_t parts, absl::Time deadline) {
    return Add(name, 0, parts, dim, deadline);
  }
  // The variable's or table's region; null when it was not added.
  Slots* Find(const std::string& name);

  // Wakes the group's waiters: a control word changed.
  void Ring();

  // Runs `then(OkStatus())` on the group's thread once `ready()` holds;
  // or `then` with DEADLINE_EXCEEDED saying `missing()` once `deadline`
  // passed, with `stop`'s error, or with CANCELLED when the group goes.
  // `ready` and `missing` run on that thread and must be quick.
  void When(std::function<bool()> ready, std::function<std::string()> missing, absl::Time deadline,
            std::function<void(const absl::Status&)> then);

 private:
  struct Directory;
  HostGroup() = default;
  absl::Status Add(const std::string& name, int64_t n, int64_t parts, int64_t dim,
                   absl::Time deadline);
  void Loop();
  uint32_t* doorbell() const;
  uint32_t* sleepers() const;

  std::unique_ptr<SharedRegion> directory_;
  int size_ = 0;
  int local_rank_ = 0;
  std::vector<int> ranks_;
  std::vector<int32_t> others_;
  std::function<absl::Status()> stop_;

  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<Slots>> slots_ ABSL_GUARDED_BY(mu_);
  struct Task {
    std::function<bool()> ready;
    std::function<std::string()> missing;
    absl::Time deadline;
    std::function<void(const absl::Status&)> then;
  };
  std::vector<Task> tasks_ ABSL_GUARDED_BY(mu_);
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace psrt

#endif  // PSRT_WORKER_HOST_GROUP_H_
