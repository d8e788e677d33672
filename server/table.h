#ifndef PSRT_SERVER_TABLE_H_
#define PSRT_SERVER_TABLE_H_

// One server's part of a sparse table (docs/sparse.md): rows of `dim`
// float32 keyed by int64 ids, made on first use from (seed, id), updated
// row-wise by the table's optimizer, and dropped by eviction. Not
// thread-safe: the store holds the key's lock around every call.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/optimizer.h"
#include "psrt/v1/ps.pb.h"
#include "server/checkpoint/shard_format.h"

namespace psrt {

// Checks a table's spec as a registration sends it: INVALID_ARGUMENT names
// the field and what is accepted.
absl::Status ValidateTableSpec(const v1::KeySpec& spec);

class Table {
 public:
  // Server `shard`'s part of the table `spec` describes.
  Table(std::string name, const v1::TableSpec& spec, const OptimizerConfig& optimizer, int shard);

  int64_t dim() const { return dim_; }
  int64_t rows() const { return static_cast<int64_t>(index_.size()); }
  // Weights and optimizer state of one row, in bytes.
  int64_t row_bytes() const { return dim_ * 4 * (1 + static_cast<int64_t>(slots_.size())); }

  // A request's ids: each in the vocabulary, of this server, once; and
  // room (max_rows) for those that have no row yet. Changes nothing;
  // returns how many rows the request would make.
  absl::StatusOr<int64_t> CheckIds(absl::Span<const int64_t> ids) const;

  // The rows of `ids`, in order, into `out` (ids.size() * dim floats); rows
  // not held yet are made. `step` marks them as seen.
  void Gather(absl::Span<const int64_t> ids, int64_t step, float* out);

  // The rows of `ids` (made if new) take `values`, row after row, with
  // fresh optimizer state: a table that starts from pretrained rows.
  void Assign(absl::Span<const int64_t> ids, const float* values);

  // Sync: adds one worker's push to the step's sums.
  void Accumulate(absl::Span<const int64_t> ids, const float* grads);
  absl::Span<const int64_t> accumulated_ids() const { return acc_ids_; }
  const float* accumulated() const { return acc_.data(); }
  void ClearAccumulated();

  // Applies `scale` * grads to the rows of `ids` (made if new) with the
  // table's optimizer at update `step` (1-based), learning rate `lr`.
  void Apply(absl::Span<const int64_t> ids, const float* grads, float scale, double lr,
             int64_t step);

  // Sync, a step's sums handed over from another server: they replace this
  // table's (ids.size() * dim values in `sums`).
  void SetAccumulated(absl::Span<const int64_t> ids, absl::Span<const float> sums);

  // Drops the rows the eviction settings name, at the steps that are
  // multiples of evict_after_steps / 2 (the same steps wherever the table
  // was restored or moved); returns how many went.
  int64_t MaybeEvict(int64_t step);

  // The rows as a checkpoint holds them (sorted by id), and back. Load adds
  // the record's rows to those held (a move sends them in parts); CheckLoad
  // says whether it would, changing nothing.
  void Save(KeyRecord* r) const;
  absl::Status CheckLoad(const KeyRecord& r) const;
  absl::Status Load(const KeyRecord& r);

 private:
  int32_t FindOrMake(int64_t id, int64_t step);
  void Drop(int64_t id);

  const std::string name_;
  const v1::TableSpec spec_;
  const OptimizerConfig optimizer_;
  const int shard_;
  const int64_t dim_;
  absl::flat_hash_map<int64_t, int32_t> index_;  // id -> row
  std::vector<float> values_;                    // row r at r * dim
  std::vector<std::vector<float>> slots_;        // the optimizer's, laid out as values_
  std::vector<int64_t> ids_;                     // per row
  // Per row: the step it was last pushed or pulled at, the step it was
  // made at, and how many pushes touched it.
  std::vector<int64_t> last_seen_, made_at_, pushes_;
  std::vector<int32_t> free_;  // rows dropped, reused first
  // Sync: this step's gradient sums, row after row, in the order first seen.
  absl::flat_hash_map<int64_t, int32_t> acc_index_;
  std::vector<int64_t> acc_ids_;
  std::vector<float> acc_;
  std::vector<float*> slot_ptrs_;  // scratch for one row's update
};

}  // namespace psrt

#endif  // PSRT_SERVER_TABLE_H_
