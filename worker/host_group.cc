#include "worker/host_group.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/key_map.h"
#include "common/logging.h"
#ifdef PSRT_HAVE_CUDA
#include "kernels/cuda_kernels.h"
#endif

namespace psrt {

// The directory: a header, then an open-addressed table of the variables'
// regions keyed by their names' hash. An entry is claimed (state kClaimed)
// by the process that makes the region, which fills it in and then marks it
// kReady, or kFailed when it could not.
struct HostGroup::Directory {
  static constexpr uint32_t kMagic = 0x70737267;
  static constexpr int kEntries = 8192;
  enum State : uint32_t { kEmpty = 0, kClaimed = 1, kReady = 2, kFailed = 3 };
  struct Header {
    uint32_t magic;
    int32_t size;
    uint32_t doorbell;  // the futex: incremented on every change
    uint32_t sleepers;  // waiting on it
    int32_t ranks[kMaxLocal];
  };
  struct Entry {
    uint32_t state;
    int32_t maker;  // the local rank that claimed it
    uint64_t hash;
    int64_t n, parts, dim;  // dim > 0: a table's
    char region[72];
    char name[152];  // a prefix of longer names (the hash tells them apart)
  };
  static constexpr size_t kHeaderBytes = 4096;
  static constexpr size_t kBytes = kHeaderBytes + kEntries * sizeof(Entry);
  static_assert(sizeof(Header) <= kHeaderBytes);

  static Header* header(const SharedRegion& r) { return reinterpret_cast<Header*>(r.data()); }
  static Entry* entry(const SharedRegion& r, uint64_t i) {
    return reinterpret_cast<Entry*>(r.data() + kHeaderBytes) + i % kEntries;
  }
};

namespace {

uint32_t LoadState(const uint32_t* w) { return __atomic_load_n(w, __ATOMIC_ACQUIRE); }

void FutexWait(uint32_t* word, uint32_t seen, absl::Duration timeout) {
  timespec ts = absl::ToTimespec(timeout);
  syscall(SYS_futex, word, FUTEX_WAIT, seen, &ts, nullptr, 0);
}

void FutexWake(uint32_t* word) {
  syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

int64_t RoundUp(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

}  // namespace

int64_t HostGroup::Slots::ControlBytes(int64_t parts) { return RoundUp(parts * kWords * 8, 4096); }

int64_t HostGroup::Slots::CacheEntries(int64_t dim) {
  return std::clamp<int64_t>(kCacheBytes / EntryBytes(dim), 1024, 1 << 20);
}

size_t HostGroup::Slots::Bytes(int64_t n, int64_t parts, int size, int64_t dim) {
  const int64_t table = dim > 0 ? kSegmentsBytes + 2 * CacheEntries(dim) * EntryBytes(dim) : 0;
  return ControlBytes(parts) + table + (size + 2) * RoundUp(n, 16) * 4;
}

void HostGroup::Slots::PinForDevice() {
#ifdef PSRT_HAVE_CUDA
  if (data_ == nullptr) return;  // a table's: rows are copied on the host
  absl::call_once(pin_once_, [this] {
    const size_t bytes = (size_ + 2) * stride_ * 4;
    if (absl::Status s = CudaPinHost(data_, bytes); !s.ok()) {
      LogWarning("the host group's slots stay pageable (GPU copies to and from them are staged): ",
                 s.message());
      return;
    }
    pinned_ = true;
  });
#endif
}

HostGroup::Slots::~Slots() {
#ifdef PSRT_HAVE_CUDA
  if (pinned_) CudaUnpinHost(data_);  // before region_ unmaps it
#endif
}

absl::StatusOr<char*> HostGroup::Slots::RowsToWrite(int r, int64_t bytes) {
  absl::MutexLock lock(&mu_);
  if (written_ != nullptr && static_cast<int64_t>(written_->size()) >= bytes) {
    return written_->data();
  }
  // Twice what is needed: a table's rows a step vary, and a new segment's
  // pages cost a first touch.
  const int64_t want = RoundUp(std::max<int64_t>(2 * bytes, 64 << 10), 4096);
  absl::StatusOr<std::unique_ptr<SharedRegion>> made = SharedRegion::Create(want);
  absl::Status s = made.status();
  if (s.ok()) s = (*made)->Reserve();
  if (!s.ok()) {
    return absl::Status(s.code(), absl::StrCat("a segment of ", want,
                                               " bytes for this process's "
                                               "rows in its host group: ",
                                               s.message()));
  }
  Segment& seg = segments_[r];
  const std::string& name = (*made)->name();
  if (name.size() >= sizeof(seg.name)) {
    return absl::InternalError(absl::StrCat("shared-memory name ", name, " is too long"));
  }
  std::memcpy(seg.name, name.c_str(), name.size() + 1);
  seg.bytes = want;
  __atomic_store_n(&seg.gen, __atomic_load_n(&seg.gen, __ATOMIC_RELAXED) + 1, __ATOMIC_RELEASE);
  written_ = *std::move(made);  // the old one's name goes; its owners' mappings stay
  return written_->data();
}

absl::StatusOr<std::pair<const char*, int64_t>> HostGroup::Slots::RowsOf(int r) {
  absl::MutexLock lock(&mu_);
  Seen& seen = seen_[r];
  const int64_t gen = __atomic_load_n(&segments_[r].gen, __ATOMIC_ACQUIRE);
  if (gen == 0) return absl::InternalError(absl::StrCat("local rank ", r, " has written no rows"));
  if (gen != seen.gen) {
    const Segment& seg = segments_[r];
    const std::string name(seg.name, strnlen(seg.name, sizeof(seg.name)));
    absl::StatusOr<std::unique_ptr<SharedRegion>> region = SharedRegion::Attach(name, seg.bytes);
    if (!region.ok()) {
      return absl::Status(region.status().code(), absl::StrCat("the rows of local rank ", r, ": ",
                                                               region.status().message()));
    }
    seen.region = *std::move(region);
    seen.gen = gen;
  }
  return std::make_pair<const char*, int64_t>(seen.region->data(),
                                              static_cast<int64_t>(seen.region->size()));
}

uint32_t* HostGroup::doorbell() const { return &Directory::header(*directory_)->doorbell; }
uint32_t* HostGroup::sleepers() const { return &Directory::header(*directory_)->sleepers; }

namespace {

// A cache entry's word: the version+1 whose row it holds (bits 8 and up),
// its state (bits 6-7) and the local rank that claimed it (bits 0-5); 0:
// never used. The id follows, then the row.
enum CacheState : int64_t { kClaiming = 0, kFetching = 1, kReady = 2, kFailed = 3 };
static_assert(HostGroup::kMaxLocal <= 64);
int64_t Word(int64_t version, CacheState state, int r) {
  return (version + 1) << 8 | int64_t{state} << 6 | r;
}
int64_t VersionOf(int64_t w) { return (w >> 8) - 1; }
CacheState StateOf(int64_t w) { return static_cast<CacheState>((w >> 6) & 3); }
int64_t LoadId(const int64_t* e) { return __atomic_load_n(e + 1, __ATOMIC_RELAXED); }
float* Row(int64_t* e) { return reinterpret_cast<float*>(e + 2); }

// Entries an id may lie in, from its hash on.
constexpr int kProbes = 8;

uint64_t Mix(uint64_t x) {  // splitmix64's finalizer: the same in every process
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

bool HostGroup::Slots::Copy(int64_t* e, int64_t version, int64_t id, float* out) const {
  const int64_t w = __atomic_load_n(e, __ATOMIC_ACQUIRE);
  if (w == 0 || VersionOf(w) != version || StateOf(w) != kReady || LoadId(e) != id) return false;
  std::memcpy(out, Row(e), dim_ * 4);
  std::atomic_thread_fence(std::memory_order_acquire);
  return __atomic_load_n(e, __ATOMIC_RELAXED) == w;
}

HostGroup::Slots::Cached HostGroup::Slots::Look(int64_t version, int64_t id, int me, float* out) {
  const uint64_t h = Mix(static_cast<uint64_t>(id));
  for (int p = 0; p < kProbes; ++p) {
    int64_t* e = Entry(version, (h + p) % static_cast<uint64_t>(cache_entries_));
    for (int tries = 0; tries < 1000; ++tries) {
      int64_t w = __atomic_load_n(e, __ATOMIC_ACQUIRE);
      if (w != 0 && VersionOf(w) == version) {
        if (StateOf(w) == kClaiming) continue;  // its id comes next
        if (LoadId(e) != id) break;
        if (StateOf(w) == kFetching) return {Cached::kWait, e, static_cast<int>(w & 63)};
        if (StateOf(w) == kFailed) return {};
        if (Copy(e, version, id, out)) return {Cached::kCopied};
        continue;
      }
      // An entry of an earlier version is free once its row is in (or
      // never will be); one being pulled, or of a later version, is not.
      const bool free = w == 0 || (VersionOf(w) < version && StateOf(w) >= kReady);
      if (!free) break;
      if (__atomic_compare_exchange_n(e, &w, Word(version, kClaiming, me), false, __ATOMIC_ACQ_REL,
                                      __ATOMIC_ACQUIRE)) {
        __atomic_store_n(e + 1, id, __ATOMIC_RELAXED);
        __atomic_store_n(e, Word(version, kFetching, me), __ATOMIC_RELEASE);
        return {Cached::kClaimed, e};
      }
    }
  }
  return {};  // no room: pulled without the cache
}

void HostGroup::Slots::Fill(int64_t* e, int64_t version, int me, const float* row) {
  if (row != nullptr) std::memcpy(Row(e), row, dim_ * 4);
  __atomic_store_n(e, Word(version, row != nullptr ? kReady : kFailed, me), __ATOMIC_RELEASE);
}

bool HostGroup::Slots::Fetching(const int64_t* e, int64_t version, int claimer) {
  return __atomic_load_n(e, __ATOMIC_ACQUIRE) == Word(version, kFetching, claimer);
}

absl::StatusOr<std::unique_ptr<SharedRegion>> HostGroup::MakeDirectory(
    const std::vector<int>& ranks) {
  if (ranks.size() < 2 || ranks.size() > static_cast<size_t>(kMaxLocal)) {
    return absl::InvalidArgumentError(
        absl::StrCat("a host group has 2..", kMaxLocal, " training processes; got ", ranks.size()));
  }
  absl::StatusOr<std::unique_ptr<SharedRegion>> r = SharedRegion::Create(Directory::kBytes);
  if (!r.ok()) return r.status();
  if (absl::Status s = (*r)->Reserve(); !s.ok()) return s;
  Directory::Header* h = Directory::header(**r);
  h->size = static_cast<int32_t>(ranks.size());
  for (size_t i = 0; i < ranks.size(); ++i) h->ranks[i] = ranks[i];
  __atomic_store_n(&h->magic, Directory::kMagic, __ATOMIC_RELEASE);
  return r;
}

absl::StatusOr<std::unique_ptr<HostGroup>> HostGroup::Join(const std::string& name, int local_rank,
                                                           int rank,
                                                           std::function<absl::Status()> stop) {
  absl::StatusOr<std::unique_ptr<SharedRegion>> r = SharedRegion::Attach(name, Directory::kBytes);
  if (!r.ok()) {
    return absl::Status(r.status().code(),
                        absl::StrCat("host group (PSRT_HOST_GROUP): ", r.status().message()));
  }
  const Directory::Header* h = Directory::header(**r);
  if (LoadState(&h->magic) != Directory::kMagic || h->size < 2 || h->size > kMaxLocal) {
    return absl::FailedPreconditionError(
        absl::StrCat("host group ", name, " (PSRT_HOST_GROUP) is not one psrt-worker made"));
  }
  if (local_rank < 0 || local_rank >= h->size || h->ranks[local_rank] != rank) {
    return absl::FailedPreconditionError(absl::StrCat(
        "host group ", name, " has ", h->size, " processes, and its local rank ", local_rank,
        " is not rank ", rank, " (PSRT_LOCAL_RANK and PSRT_RANK disagree with psrt-worker's)"));
  }
  std::unique_ptr<HostGroup> g(new HostGroup());
  g->size_ = h->size;
  g->local_rank_ = local_rank;
  g->ranks_.assign(h->ranks, h->ranks + h->size);
  for (int i = 0; i < g->size_; ++i) {
    if (i != local_rank) g->others_.push_back(g->ranks_[i]);
  }
  g->stop_ = std::move(stop);
  g->directory_ = *std::move(r);
  g->thread_ = std::thread([g = g.get()] { g->Loop(); });
  return g;
}

HostGroup::~HostGroup() { Close(); }

void HostGroup::Close() {
  {
    absl::MutexLock lock(&mu_);
    closing_ = true;
  }
  Ring();
  if (thread_.joinable()) thread_.join();
}

absl::Status HostGroup::Add(const std::string& name, int64_t n, int64_t parts, int64_t dim,
                            absl::Time deadline) {
  const uint64_t hash = StableHash(name);
  auto slots = std::make_unique<Slots>();
  slots->hash_ = hash;
  slots->size_ = size_;
  slots->stride_ = RoundUp(n, 16);
  const size_t bytes = Slots::Bytes(n, parts, size_, dim);
  const SharedRegion& dir = *directory_;
  const std::string stored = name.substr(0, sizeof(Directory::Entry::name) - 1);
  for (uint64_t i = 0; i < static_cast<uint64_t>(Directory::kEntries);) {
    const uint32_t seen = __atomic_load_n(doorbell(), __ATOMIC_SEQ_CST);
    Directory::Entry* e = Directory::entry(dir, hash + i);
    uint32_t state = LoadState(&e->state);
    uint32_t empty = Directory::kEmpty;
    if (state == Directory::kEmpty &&
        __atomic_compare_exchange_n(&e->state, &empty, Directory::kClaimed, false, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE)) {
      // Ours to make.
      e->maker = local_rank_;
      e->hash = hash;
      e->n = n;
      e->parts = parts;
      e->dim = dim;
      std::memcpy(e->name, stored.c_str(), stored.size() + 1);
      absl::StatusOr<std::unique_ptr<SharedRegion>> region = SharedRegion::Create(bytes);
      absl::Status s = region.status();
      if (s.ok()) s = (*region)->Reserve();
      if (!s.ok()) {
        __atomic_store_n(&e->state, Directory::kFailed, __ATOMIC_RELEASE);
        Ring();
        return absl::Status(s.code(), absl::StrCat("variable '", name,
                                                   "': its host group's region: ", s.message()));
      }
      std::memcpy(e->region, (*region)->name().c_str(), (*region)->name().size() + 1);
      slots->region_ = *std::move(region);
      __atomic_store_n(&e->state, Directory::kReady, __ATOMIC_RELEASE);
      Ring();
      break;
    }
    if (state == Directory::kEmpty) state = LoadState(&e->state);  // lost the race
    if (state == Directory::kClaimed) {
      // Being made: whose it is shows once it is ready.
      if (absl::Now() > deadline) {
        return absl::DeadlineExceededError(
            absl::StrCat("variable '", name, "': local rank ", e->maker,
                         " did not finish making a region of the host group in time"));
      }
      FutexWait(doorbell(), seen, absl::Milliseconds(20));
      continue;
    }
    if (e->hash != hash || stored != e->name) {
      ++i;
      continue;
    }
    if (state == Directory::kFailed) {
      return absl::UnavailableError(absl::StrCat("variable '", name, "': local rank ", e->maker,
                                                 " could not make its host group's region"));
    }
    if (e->n != n || e->parts != parts || e->dim != dim) {
      auto shape = [](int64_t n, int64_t parts, int64_t dim) {
        return dim > 0 ? absl::StrCat("rows of ", dim, " in ", parts, " parts")
                       : absl::StrCat(n, " elements in ", parts, " parts");
      };
      return absl::FailedPreconditionError(absl::StrCat(
          "variable '", name, "' has ", shape(n, parts, dim), " here but ",
          shape(e->n, e->parts, e->dim), " on local rank ", e->maker, " of this host"));
    }
    absl::StatusOr<std::unique_ptr<SharedRegion>> region = SharedRegion::Attach(e->region, bytes);
    if (!region.ok()) {
      return absl::Status(region.status().code(),
                          absl::StrCat("variable '", name,
                                       "': its host group's region: ", region.status().message()));
    }
    slots->region_ = *std::move(region);
    break;
  }
  if (slots->region_ == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("variable '", name, "': the host group holds at most ", Directory::kEntries,
                     " variables; turn local aggregation off (\"local_aggregation\": false)"));
  }
  char* base = slots->region_->data();
  slots->control_ = reinterpret_cast<int64_t*>(base);
  if (dim > 0) {
    slots->segments_ = reinterpret_cast<Slots::Segment*>(base + Slots::ControlBytes(parts));
    slots->cache_ = base + Slots::ControlBytes(parts) + Slots::kSegmentsBytes;
    slots->cache_entries_ = Slots::CacheEntries(dim);
    slots->entry_bytes_ = Slots::EntryBytes(dim);
    slots->dim_ = dim;
    absl::MutexLock lock(&slots->mu_);
    slots->seen_.resize(size_);
  } else {
    slots->data_ = reinterpret_cast<float*>(base + Slots::ControlBytes(parts));
  }
  absl::MutexLock lock(&mu_);
  slots_[name] = std::move(slots);
  return absl::OkStatus();
}

HostGroup::Slots* HostGroup::Find(const std::string& name) {
  absl::MutexLock lock(&mu_);
  auto it = slots_.find(name);
  return it == slots_.end() ? nullptr : it->second.get();
}

std::string HostGroup::Who(int local) const {
  return absl::StrCat("local rank ", local, " (rank ", rank_of(local), ")");
}

void HostGroup::Ring() {
  __atomic_add_fetch(doorbell(), 1, __ATOMIC_SEQ_CST);
  if (__atomic_load_n(sleepers(), __ATOMIC_SEQ_CST) > 0) FutexWake(doorbell());
}

void HostGroup::When(std::function<bool()> ready, std::function<std::string()> missing,
                     absl::Time deadline, std::function<void(const absl::Status&)> then) {
  {
    absl::MutexLock lock(&mu_);
    tasks_.push_back({std::move(ready), std::move(missing), deadline, std::move(then)});
  }
  Ring();
}

void HostGroup::Loop() {
  absl::Time next_stop_check = absl::InfinitePast();
  while (true) {
    const uint32_t seen = __atomic_load_n(doorbell(), __ATOMIC_SEQ_CST);
    std::vector<std::pair<Task, absl::Status>> done;
    bool closing, idle;
    {
      absl::MutexLock lock(&mu_);
      closing = closing_;
      const absl::Time now = absl::Now();
      absl::Status stop;
      if (closing) {
        stop = absl::CancelledError("the client closed");
      } else if (!tasks_.empty() && now >= next_stop_check) {
        stop = stop_();
        next_stop_check = now + absl::Milliseconds(50);
      }
      std::vector<Task> kept;
      for (Task& t : tasks_) {
        if (stop.ok() && t.ready()) {
          done.emplace_back(std::move(t), absl::OkStatus());
        } else if (!stop.ok()) {
          done.emplace_back(std::move(t), stop);
        } else if (now >= t.deadline) {
          absl::Status s = absl::DeadlineExceededError(t.missing());
          done.emplace_back(std::move(t), std::move(s));
        } else {
          kept.push_back(std::move(t));
        }
      }
      tasks_ = std::move(kept);
      idle = tasks_.empty();
    }
    for (auto& [t, s] : done) t.then(s);
    if (closing) return;
    if (!done.empty()) continue;
    __atomic_add_fetch(sleepers(), 1, __ATOMIC_SEQ_CST);
    FutexWait(doorbell(), seen, idle ? absl::Milliseconds(200) : absl::Milliseconds(20));
    __atomic_sub_fetch(sleepers(), 1, __ATOMIC_SEQ_CST);
  }
}

}  // namespace psrt
