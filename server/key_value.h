#ifndef PSRT_SERVER_KEY_VALUE_H_
#define PSRT_SERVER_KEY_VALUE_H_

// A key's value on a server: what pushes change, pulls read, checkpoints
// save and moves hand over. Two kinds behind one interface, so that the
// store's paths hold no branch on the kind: a dense vector (weights, the
// optimizer's slots, a sync step's sum) and a sparse table's part (rows made
// on first use, server/table.h).
//
// The shape checks read only the spec and may run on any thread; the rest
// run under the key's lock (Store::Key::mu), as the store calls them.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/tensor_coding.h"
#include "kernels/optimizer.h"
#include "psrt/v1/ps.pb.h"
#include "server/checkpoint/shard_format.h"

namespace psrt {

// One update's gradient: `n` values at `values`, for the rows `ids` (a
// table's) or the whole key (a dense one, no ids), applied times `scale`.
struct Update {
  absl::Span<const int64_t> ids;
  const float* values = nullptr;
  int64_t n = 0;
  float scale = 1;
};

// A push's values as float32: where they lie when they are float32 in one
// aligned piece, else decoded into `scratch`.
const float* PayloadValues(const Payload& data, v1::DType dtype, float scale,
                           std::vector<float>* scratch);

class KeyValue {
 public:
  // The value of the key `spec` describes ("name" as the store calls it);
  // `sync`: it gathers sync steps.
  static std::unique_ptr<KeyValue> New(const std::string& name, const v1::KeySpec& spec, bool sync);
  virtual ~KeyValue() = default;

  // Shape, from the spec alone. A push's `bytes` of `dtype` values
  // (bytes_per_value each) for `ids`; a pull's ids.
  virtual absl::Status CheckPush(absl::Span<const int64_t> ids, int64_t bytes, int bytes_per_value,
                                 v1::DType dtype) const = 0;
  virtual absl::Status CheckPull(absl::Span<const int64_t> ids) const = 0;
  // Values that a request for `ids` reads or writes.
  virtual int64_t Size(absl::Span<const int64_t> ids) const = 0;

  // Bytes held: values, optimizer state, step sums.
  virtual int64_t bytes() const = 0;
  // Makes room for the value with `optimizer`, keeping what it holds (a
  // checkpoint's; Free empties it). A new table has no rows.
  virtual void Init(const OptimizerConfig& optimizer) = 0;
  // Rank 0's initial value (a dense key's `init` bytes; a table's rows
  // start from its seed) and fresh optimizer state.
  virtual void Start(absl::string_view init) = 0;
  // A checkpoint's record: refused whole (DATA_LOSS) where it does not fit.
  virtual absl::Status Restore(const OptimizerConfig& optimizer, KeyRecord* record) = 0;
  // Frees what it holds (the key moved away); Init allocates again.
  virtual void Free() = 0;

  // The request's ids fit (in the vocabulary, of this part, once each);
  // returns the bytes the rows it would make take. Changes nothing.
  virtual absl::StatusOr<int64_t> CheckIds(absl::Span<const int64_t> ids) const = 0;
  // Sync: adds one push to the step's sum (the step's first push starts it).
  virtual void Accumulate(absl::Span<const int64_t> ids, const Payload& data, v1::DType dtype,
                          float scale, bool first, std::vector<float>* scratch) = 0;
  // Sync: the step's sum, to be applied times `scale`, and then cleared.
  virtual Update StepSum(float scale) = 0;
  // Tables: the rows of `ids` take `values` (float32, row after row), with
  // fresh optimizer state (PushRequest.assign_rows; Store::AssignRows
  // refuses it for a dense key, whose value rank 0's registration sets).
  virtual void Assign(absl::Span<const int64_t> ids, const float* values) = 0;
  virtual void ClearStepSum() = 0;
  // Applies an update that makes version `step` (1-based); returns the
  // rows it evicted.
  virtual int64_t Apply(const Update& update, double lr, int64_t step) = 0;
  // Sync: version `step` is made without an update, as no worker had a
  // gradient (KeyData.no_gradient). A dense value's optimizer then counts one
  // update fewer (Adam's bias correction follows the updates, as torch's
  // per-parameter step does); a table's rows count their own pushes.
  virtual void SkipStep() = 0;
  // Writes the values of `ids` as `dtype` at `to` (Size(ids) of them);
  // returns the encoding's scale. A table makes the rows it lacks, seen at
  // `step`.
  virtual float Write(absl::Span<const int64_t> ids, int64_t step, v1::DType dtype, char* to) = 0;
  // As a checkpoint holds it (buffers in `record` reused).
  virtual void Save(KeyRecord* record) const = 0;

  // Moves and copies. A dense value is copied whole to the server that
  // backs it up and kept current there by forwarded updates; a table's part
  // goes whole when its server lets it go (pulls make rows too, so
  // forwarding updates could not rebuild it), in parts.
  virtual bool kept_as_copy() const = 0;
  // A dense copy's values and slots, into a seed and out of one (sizes
  // checked by the caller against the spec).
  virtual void WriteCopy(v1::SeedRequest* req) const = 0;
  virtual void TakeCopy(const v1::SeedRequest& req) = 0;
  // A table's rows in parts of at most `max_bytes`.
  virtual std::vector<KeyRecord> Parts(int64_t max_bytes) const = 0;
  // A part that follows `rows_before` rows (0: the first, into a fresh
  // part with `optimizer`): OK if it would be taken, or was already (a
  // retry); changes nothing.
  virtual absl::Status CheckPart(const OptimizerConfig& optimizer, int64_t rows_before,
                                 const KeyRecord& rows) const = 0;
  // Takes a part CheckPart accepted; false: it was taken before.
  virtual bool TakePart(int64_t rows_before, const KeyRecord& rows) = 0;
  // Sync: a step half done, handed over with the key, and taken.
  virtual void WriteStepSum(v1::SeedRequest* req) const = 0;
  virtual void TakeStepSum(const v1::SeedRequest& req) = 0;
};

}  // namespace psrt

#endif  // PSRT_SERVER_KEY_VALUE_H_
