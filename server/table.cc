#include "server/table.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/key_map.h"
#include "common/optimizer_proto.h"
#include "kernels/row_optimizer.h"

namespace psrt {

// Largest row accepted: 64 Ki float32.
constexpr int64_t kMaxDim = 1 << 16;

absl::Status ValidateTableSpec(const v1::KeySpec& spec) {
  const v1::TableSpec& t = spec.table();
  auto bad = [&](auto&&... what) {
    return absl::InvalidArgumentError(absl::StrCat("table '", spec.variable(), "': ", what...));
  };
  if (t.dim() <= 0 || t.dim() > kMaxDim) return bad("dim ", t.dim(), " is not in 1..", kMaxDim);
  if (t.vocab() < 0) return bad("vocab ", t.vocab(), " is negative (0: an open hash table)");
  if (!(t.init_std() >= 0) || !std::isfinite(t.init_std())) {
    return bad("init_std ", t.init_std(), " is not a finite number >= 0");
  }
  if (t.max_rows() < 0) return bad("max_rows ", t.max_rows(), " is negative (0: no cap)");
  if (t.evict_after_steps() < 0 || t.evict_min_count() < 0) {
    return bad("evict_after_steps and evict_min_count are >= 0 (0: off)");
  }
  if (t.evict_min_count() > 0 && t.evict_after_steps() == 0) {
    return bad("evict_min_count needs evict_after_steps (the steps a new row has to reach it)");
  }
  if (t.vocab() > 0 && t.evict_after_steps() > 0) {
    return bad("a fixed vocabulary is not evicted; eviction is for open hash tables (vocab 0)");
  }
  if (t.num_shards() <= 0 || spec.partition() >= static_cast<uint32_t>(t.num_shards())) {
    return bad("part ", spec.partition(), " of ", t.num_shards(), " servers does not exist");
  }
  if (spec.shape_size() != 2 || spec.shape(0) != t.vocab() || spec.shape(1) != t.dim()) {
    return bad("shape is [vocab, dim] = [", t.vocab(), ", ", t.dim(), "]");
  }
  if (!spec.init().empty() || spec.offset() != 0 || spec.num_elements() != 0) {
    return bad("a table's rows start from its seed: no initial value, offset or num_elements");
  }
  absl::StatusOr<OptimizerConfig> opt = OptimizerFromProto(spec.optimizer());
  if (!opt.ok()) return bad(opt.status().message());
  if (absl::Status s = ValidateRowOptimizer(*opt); !s.ok()) return bad(s.message());
  return absl::OkStatus();
}

Table::Table(std::string name, const v1::TableSpec& spec, const OptimizerConfig& optimizer,
             int shard)
    : name_(std::move(name)),
      spec_(spec),
      optimizer_(optimizer),
      shard_(shard),
      dim_(spec.dim()),
      slots_(RowSlots(optimizer)),
      slot_ptrs_(slots_.size()) {}

absl::StatusOr<int64_t> Table::CheckIds(absl::Span<const int64_t> ids) const {
  absl::flat_hash_map<int64_t, int32_t> seen;
  seen.reserve(ids.size());
  int64_t missing = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int64_t id = ids[i];
    if (spec_.vocab() > 0 && (id < 0 || id >= spec_.vocab())) {
      return absl::InvalidArgumentError(absl::StrCat("table '", name_, "': id ", id,
                                                     " is out of range; its vocabulary is [0, ",
                                                     spec_.vocab(), ")"));
    }
    if (RowShard(id, spec_.num_shards()) != shard_) {
      return absl::InvalidArgumentError(
          absl::StrCat("table '", name_, "': id ", id, " belongs to server ",
                       RowShard(id, spec_.num_shards()), ", not to this one (", shard_, ")"));
    }
    auto [it, inserted] = seen.emplace(id, static_cast<int32_t>(i));
    if (!inserted) {
      return absl::InvalidArgumentError(
          absl::StrCat("table '", name_, "': id ", id, " appears twice (at ", it->second, " and ",
                       i, "); a request names each id once (sum its gradients first)"));
    }
    if (!index_.contains(id)) ++missing;
  }
  if (spec_.max_rows() > 0 && rows() + missing > spec_.max_rows()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "table '", name_, "' holds ", rows(), " rows on server ", shard_, "; ", missing,
        " new ones would pass its max_rows (", spec_.max_rows(), ")",
        spec_.evict_after_steps() > 0 ? "" : "; set evict_after_steps, or raise max_rows"));
  }
  return missing;
}

int32_t Table::FindOrMake(int64_t id, int64_t step) {
  auto [it, inserted] = index_.try_emplace(id, 0);
  if (!inserted) return it->second;
  int32_t r;
  if (!free_.empty()) {
    r = free_.back();
    free_.pop_back();
  } else {
    r = static_cast<int32_t>(ids_.size());
    ids_.push_back(0);
    last_seen_.push_back(0);
    made_at_.push_back(0);
    pushes_.push_back(0);
    values_.resize(values_.size() + dim_);
    for (auto& s : slots_) s.resize(values_.size());
  }
  it->second = r;
  ids_[r] = id;
  last_seen_[r] = made_at_[r] = step;
  pushes_[r] = 0;
  InitRow(spec_.seed(), id, spec_.init_std(), &values_[r * dim_], dim_);
  for (size_t i = 0; i < slots_.size(); ++i) slot_ptrs_[i] = &slots_[i][r * dim_];
  InitRowSlots(optimizer_, slot_ptrs_.data(), dim_);
  return r;
}

void Table::Drop(int64_t id) {
  auto it = index_.find(id);
  if (it == index_.end()) return;
  free_.push_back(it->second);
  index_.erase(it);
}

void Table::Gather(absl::Span<const int64_t> ids, int64_t step, float* out) {
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t r = FindOrMake(ids[i], step);
    last_seen_[r] = step;
    std::memcpy(out + i * dim_, &values_[r * dim_], dim_ * 4);
  }
}

void Table::Assign(absl::Span<const int64_t> ids, const float* values) {
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t r = FindOrMake(ids[i], 0);
    std::memcpy(&values_[r * dim_], values + i * dim_, dim_ * 4);
    for (size_t s = 0; s < slots_.size(); ++s) slot_ptrs_[s] = &slots_[s][r * dim_];
    InitRowSlots(optimizer_, slot_ptrs_.data(), dim_);
  }
}

void Table::Accumulate(absl::Span<const int64_t> ids, const float* grads) {
  for (size_t i = 0; i < ids.size(); ++i) {
    auto [it, inserted] = acc_index_.try_emplace(ids[i], static_cast<int32_t>(acc_ids_.size()));
    const float* g = grads + i * dim_;
    if (inserted) {
      acc_ids_.push_back(ids[i]);
      acc_.insert(acc_.end(), g, g + dim_);
      continue;
    }
    float* sum = &acc_[it->second * dim_];
    for (int64_t j = 0; j < dim_; ++j) sum[j] += g[j];
  }
}

void Table::SetAccumulated(absl::Span<const int64_t> ids, absl::Span<const float> sums) {
  ClearAccumulated();
  acc_ids_.assign(ids.begin(), ids.end());
  acc_.assign(sums.begin(), sums.end());
  for (size_t i = 0; i < acc_ids_.size(); ++i) acc_index_[acc_ids_[i]] = static_cast<int32_t>(i);
}

void Table::ClearAccumulated() {
  acc_index_.clear();
  acc_ids_.clear();
  acc_.clear();
}

void Table::Apply(absl::Span<const int64_t> ids, const float* grads, float scale, double lr,
                  int64_t step) {
  std::vector<float> scaled;
  if (scale != 1) scaled.resize(dim_);
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t r = FindOrMake(ids[i], step);
    last_seen_[r] = step;
    ++pushes_[r];
    const float* g = grads + i * dim_;
    if (scale != 1) {
      for (int64_t j = 0; j < dim_; ++j) scaled[j] = g[j] * scale;
      g = scaled.data();
    }
    for (size_t s = 0; s < slots_.size(); ++s) slot_ptrs_[s] = &slots_[s][r * dim_];
    ApplyRowUpdate(optimizer_, lr, step, &values_[r * dim_], g, slot_ptrs_.data(), dim_);
  }
}

int64_t Table::MaybeEvict(int64_t step) {
  const int64_t after = spec_.evict_after_steps();
  if (after <= 0 || step % std::max<int64_t>(1, after / 2) != 0) return 0;
  std::vector<int64_t> gone;
  for (const auto& [id, r] : index_) {
    const bool unseen = step - last_seen_[r] >= after;
    const bool rare = spec_.evict_min_count() > 0 && step - made_at_[r] >= after &&
                      pushes_[r] < spec_.evict_min_count();
    if (unseen || rare) gone.push_back(id);
  }
  for (int64_t id : gone) Drop(id);
  return static_cast<int64_t>(gone.size());
}

void Table::Save(KeyRecord* r) const {
  std::vector<std::pair<int64_t, int32_t>> rows(index_.begin(), index_.end());
  std::sort(rows.begin(), rows.end());
  const size_t n = rows.size();
  r->num_elements = static_cast<int64_t>(n) * dim_;
  r->row_ids.resize(n);
  r->row_stats.resize(3 * n);
  r->weights.resize(n * dim_);
  r->slots.resize(slots_.size());
  for (auto& s : r->slots) s.resize(n * dim_);
  for (size_t i = 0; i < n; ++i) {
    const int32_t row = rows[i].second;
    r->row_ids[i] = rows[i].first;
    r->row_stats[3 * i] = last_seen_[row];
    r->row_stats[3 * i + 1] = made_at_[row];
    r->row_stats[3 * i + 2] = pushes_[row];
    std::memcpy(&r->weights[i * dim_], &values_[row * dim_], dim_ * 4);
    for (size_t s = 0; s < slots_.size(); ++s) {
      std::memcpy(&r->slots[s][i * dim_], &slots_[s][row * dim_], dim_ * 4);
    }
  }
}

absl::Status Table::CheckLoad(const KeyRecord& r) const {
  const size_t n = r.row_ids.size();
  if (r.weights.size() != n * dim_ || r.row_stats.size() != 3 * n ||
      r.slots.size() != slots_.size()) {
    return absl::DataLossError(absl::StrCat("table '", name_, "': a checkpoint record of ", n,
                                            " rows holds ", r.weights.size(), " values and ",
                                            r.slots.size(), " optimizer slots; rows have ", dim_,
                                            " values and ", slots_.size(), " slots"));
  }
  for (const auto& s : r.slots) {
    if (s.size() != n * dim_)
      return absl::DataLossError(absl::StrCat("table '", name_, "': a slot has the wrong size"));
  }
  absl::flat_hash_set<int64_t> seen;
  for (const int64_t id : r.row_ids) {
    if (index_.contains(id) || !seen.insert(id).second) {
      return absl::DataLossError(
          absl::StrCat("table '", name_, "': row ", id, " is in the checkpoint twice"));
    }
    if ((spec_.vocab() > 0 && (id < 0 || id >= spec_.vocab())) ||
        RowShard(id, spec_.num_shards()) != shard_) {
      return absl::DataLossError(absl::StrCat("table '", name_, "': row ", id,
                                              " is not one of this part's (server ", shard_, ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status Table::Load(const KeyRecord& r) {
  if (absl::Status s = CheckLoad(r); !s.ok()) return s;
  const size_t n = r.row_ids.size();
  for (size_t i = 0; i < n; ++i) {
    const int64_t id = r.row_ids[i];
    const int32_t row = FindOrMake(id, 0);
    last_seen_[row] = r.row_stats[3 * i];
    made_at_[row] = r.row_stats[3 * i + 1];
    pushes_[row] = r.row_stats[3 * i + 2];
    std::memcpy(&values_[row * dim_], &r.weights[i * dim_], dim_ * 4);
    for (size_t s = 0; s < slots_.size(); ++s) {
      std::memcpy(&slots_[s][row * dim_], &r.slots[s][i * dim_], dim_ * 4);
    }
  }
  return absl::OkStatus();
}

}  // namespace psrt
