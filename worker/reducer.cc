#include "worker/reducer.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace psrt {

namespace {

constexpr char kTensorSuffix[] = "@reduce";
constexpr char kGroupSuffix[] = "@given";

}  // namespace

absl::Status Reducer::Check(absl::Span<const ReduceRef> tensors, ReduceOp op) const {
  if (!client_->sync()) {
    return absl::FailedPreconditionError(
        "a reduction over the workers is a sync step's; this job's mode has none (each "
        "worker's push is applied alone)");
  }
  if (tensors.empty()) return absl::InvalidArgumentError("a reduction needs at least one tensor");
  absl::flat_hash_set<std::string> names;
  for (const ReduceRef& t : tensors) {
    if (t.name.empty() || t.size <= 0 || t.out == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("reduction of '", t.name,
                                                     "': a tensor needs a name, a size > 0 (got ",
                                                     t.size, ") and an output buffer"));
    }
    if (!names.insert(t.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", t.name, "' appears twice in one reduction"));
    }
  }
  if (op == ReduceOp::kSum && client_->averages()) {
    // The servers' mean times the workers is the sum only if every worker
    // pushed.
    if (absl::Status s = client_->EveryWorkerEachStep(); !s.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("a sum over the workers needs every worker each step: ", s.message()));
    }
  }
  return absl::OkStatus();
}

absl::Status Reducer::Register(const std::string& key, int64_t size, Compression compression) {
  if (steps_.contains(key)) return absl::OkStatus();
  std::vector<float> value(size, 0.0f);
  if (absl::Status s = client_->RegisterVariable(key, {size}, value.data(),
                                                 DefaultOptimizer(OptimizerKind::kAssign, 0.0),
                                                 compression, Compression::kNone);
      !s.ok()) {
    return s;
  }
  absl::StatusOr<int64_t> version = client_->PulledVersion(key);
  if (!version.ok()) return version.status();
  steps_[key] = *version;
  return absl::OkStatus();
}

// The flags key of a set of tensors: its first name, and a hash of all
// (FNV-1a, the same in every process) where there are several, so that any
// set the workers reduce together has one.
std::string GroupKey(absl::Span<const ReduceRef> tensors) {
  if (tensors.size() == 1) return tensors[0].name + kGroupSuffix;
  uint64_t h = 14695981039346656037ull;
  for (const ReduceRef& t : tensors) {
    for (const char c : t.name + '\0') h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  }
  return absl::StrCat(tensors[0].name, kGroupSuffix, "/", tensors.size(), "/", absl::Hex(h));
}

absl::Status Reducer::Reduce(absl::Span<ReduceRef> tensors, ReduceOp op, Compression compression,
                             int* factor) {
  if (absl::Status s = Check(tensors, op); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  const size_t n = tensors.size();
  std::vector<std::string> keys;
  keys.reserve(n + 1);
  for (const ReduceRef& t : tensors) {
    keys.push_back(t.name + kTensorSuffix);
    if (absl::Status s = Register(keys.back(), t.size, compression); !s.ok()) return s;
  }
  keys.push_back(GroupKey(tensors));
  if (absl::Status s = Register(keys.back(), static_cast<int64_t>(n) + 1, Compression::kNone);
      !s.ok()) {
    return s;
  }

  // The set's flags: which tensors this worker has, and a 1 whose aggregate
  // on summing servers is the number of workers that pushed.
  flags_in_.assign(n + 1, 1.0f);
  flags_out_.assign(n + 1, 0.0f);
  // Keys reduced in other sets before may be at other versions: one
  // push-pull per version, all in flight at once.
  std::map<int64_t, std::vector<TensorRef>> by_version;
  for (size_t i = 0; i < n; ++i) {
    flags_in_[i] = tensors[i].in != nullptr ? 1.0f : 0.0f;
    by_version[steps_[keys[i]]].push_back({keys[i], tensors[i].in, tensors[i].out});
  }
  by_version[steps_[keys[n]]].push_back({keys[n], flags_in_.data(), flags_out_.data()});
  std::vector<Client::Handle> handles;
  for (auto& [version, refs] : by_version) {
    handles.push_back(client_->PushPull(std::move(refs), version));
  }
  absl::Status status;
  for (Client::Handle h : handles) status.Update(client_->Wait(h));
  if (!status.ok()) return status;
  for (const std::string& key : keys) {
    absl::StatusOr<int64_t> next = client_->PulledVersion(key);
    if (!next.ok()) return next.status();
    steps_[key] = *next;
  }

  const bool averages = client_->averages();
  const float pushers = std::round(flags_out_[n]);
  if (!averages && pushers < 1) {
    return absl::InternalError(absl::StrCat("the reduction group of '", tensors[0].name,
                                            "' came back with no worker's push in it"));
  }
  if (factor != nullptr) *factor = averages ? 1 : static_cast<int>(pushers);
  for (size_t i = 0; i < n; ++i) {
    ReduceRef& t = tensors[i];
    t.given = flags_out_[i] > 0;
    float* out = t.out;
    if (!t.given) {
      // The key kept its last value (a step without gradients).
      std::fill(out, out + t.size, 0.0f);
    } else if (!averages && op == ReduceOp::kMean) {
      for (int64_t j = 0; j < t.size; ++j) out[j] /= pushers;
    } else if (averages && op == ReduceOp::kSum) {
      const float workers = static_cast<float>(client_->num_workers());
      for (int64_t j = 0; j < t.size; ++j) out[j] *= workers;
    }
  }
  return absl::OkStatus();
}

absl::Status Reducer::CheckSame(const std::string& what, uint32_t digest) {
  if (absl::Status s = client_->EveryWorkerEachStep(); !s.ok()) return s;
  // Every worker's digest in its own slots, as two 16-bit halves: the
  // servers' mean of one worker's value and zeros comes back exact after
  // rounding (a float32 holds 24 bits).
  const int workers = client_->num_workers();
  const int rank = client_->rank();
  std::vector<float> mine(2 * workers, 0.0f), all(2 * workers, 0.0f);
  mine[2 * rank] = static_cast<float>(digest >> 16);
  mine[2 * rank + 1] = static_cast<float>(digest & 0xffff);
  ReduceRef ref{"psrt.check." + what, 2 * workers, mine.data(), all.data()};
  if (absl::Status s = Reduce(absl::MakeSpan(&ref, 1), ReduceOp::kSum); !s.ok()) return s;
  auto digest_of = [&](int w) {
    return (static_cast<uint32_t>(std::lround(all[2 * w])) << 16) |
           static_cast<uint32_t>(std::lround(all[2 * w + 1]));
  };
  std::vector<int> differ;
  for (int w = 1; w < workers; ++w) {
    if (digest_of(w) != digest_of(0)) differ.push_back(w);
  }
  if (differ.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "worker", differ.size() > 1 ? "s " : " ", absl::StrJoin(differ, ", "), " hold",
      differ.size() > 1 ? " " : "s ", "other ", what, " than worker 0 (digests ",
      absl::Hex(digest_of(differ[0])), " and ", absl::Hex(digest_of(0)),
      "): the workers no longer train one model. Something changed them outside psrt's step "
      "(a load, an edit of .data, a seed-dependent layer), or their steps differed"));
}

}  // namespace psrt
