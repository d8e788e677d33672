#ifndef PSRT_SERVER_KEY_VALUE_H_
#define PSRT_SERVER_KEY_VALUE_H_

// A key's value on a server: what pushes change, pulls read, checkpoints
// save and moves hand over. Two kinds behind one interface: a dense vector
// (weights, the optimizer's slots, a sync step's sum) and a sparse table's
// part (rows made on first use, server/table.h). What differs by kind is
// decided here, so that the store's paths hold no branch on the kind; what
// one kind alone can do (a kept copy, rows set by id) the store asks for
// through kept_copy() and rows(), null for the other kind.
//
// The shape checks read only the spec and may run on any thread; the rest
// run under the key's lock (Store::Key::mu), as the store calls them.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
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

// What a seed (v1::SeedRequest) brings, as its spec's kind reads it
// (KeyValue::ReadSeed), so that the store takes every kind's the same way.
struct SeedPart {
  // It carries the value (a dense copy's weights and slots, a table's
  // rows), so the key may be new here. False: a dense hand-over to the
  // server that keeps the key's copy, current at the seed's version.
  bool value = true;
  // A table's part that follows this many rows sent before it.
  int64_t rows_before = 0;
  // The value starts again here (a table's first part: a hand-over tried
  // again starts over).
  bool starts_over = false;
  // More parts follow (SeedRequest.more_rows): the key is not served here
  // until the last, which brings the step half done and the clocks.
  bool more = false;
  // A table's rows; none: a dense copy.
  std::optional<KeyRecord> rows;
};

// A dense value's copy, kept on its copy holder ("replicas", or the copies
// a server builds with "max_servers"): written whole into a seed, then kept
// current by the updates the store forwards. A table's part keeps none
// (KeyValue::kept_copy is null): pulls make rows too, so forwarded updates
// could not keep a copy current; it goes whole when its server lets it go.
class KeptCopy {
 public:
  virtual ~KeptCopy() = default;
  // The copy's values and slots (and the optimizer's update count).
  virtual void WriteCopy(v1::SeedRequest* req) const = 0;
};

// A table's rows set by id before its first step (PushRequest.assign_rows).
// A dense value has none (KeyValue::rows is null): rank 0's registration
// sets its value.
class AssignedRows {
 public:
  virtual ~AssignedRows() = default;
  // The rows of `ids` take `values` (float32, row after row), with fresh
  // optimizer state.
  virtual void Assign(absl::Span<const int64_t> ids, const float* values) = 0;
};

class KeyValue {
 public:
  // The value of the key `spec` describes ("name" as the store calls it);
  // `sync`: it gathers sync steps.
  static std::unique_ptr<KeyValue> New(const std::string& name, const v1::KeySpec& spec, bool sync);
  // A new key's spec as worker `rank` registers it, for its kind: a dense
  // key's shape, slice (at most `max_key_bytes`) and initial value (rank 0's
  // alone); a table's settings, and no copy (`replica`: tables keep none).
  static absl::Status CheckSpec(const v1::KeySpec& spec, int32_t rank, bool replica,
                                int64_t max_key_bytes);
  // A seed's form for its spec's kind, before any key is looked at
  // (INVALID_ARGUMENT where it does not fit): a dense copy's sizes, or a
  // table's part (its rows decoded). `optimizer`: the spec's, as parsed.
  static absl::StatusOr<SeedPart> ReadSeed(const std::string& name, const v1::SeedRequest& req,
                                           const absl::StatusOr<OptimizerConfig>& optimizer);
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
  // Whether a registration that sends `init` starts the value: a dense
  // key's needs rank 0's initial value; a table's rows start from its seed.
  virtual bool StartsFrom(absl::string_view init) const = 0;
  // The initial value, with fresh optimizer state: a dense key's `init`
  // bytes; a table's part with no rows (each starts from the seed when
  // first used).
  virtual void Start(absl::string_view init) = 0;
  // A checkpoint's record: refused whole (DATA_LOSS) where it does not fit.
  virtual absl::Status Restore(const OptimizerConfig& optimizer, KeyRecord* record) = 0;
  // Frees what it holds (the key moved away); Init allocates again.
  virtual void Free() = 0;

  // The request's ids fit (in the vocabulary, of this part, once each);
  // returns the bytes the rows it would make take. Changes nothing.
  virtual absl::StatusOr<int64_t> CheckIds(absl::Span<const int64_t> ids) const = 0;
  // Sync: adds one push to the step's sum; the step's `first` push starts a
  // new sum, in place of the last step's.
  virtual void Accumulate(absl::Span<const int64_t> ids, const Payload& data, v1::DType dtype,
                          float scale, bool first, std::vector<float>* scratch) = 0;
  // Sync: the step's sum, to be applied times `scale`.
  virtual Update StepSum(float scale) = 0;
  // Applies an update that makes version `step` (1-based); returns the
  // rows it evicted. An update without values is a sync step no worker had
  // a gradient for (KeyData.no_gradient): a dense value's optimizer then
  // counts one update fewer (Adam's bias correction follows the updates,
  // as torch's per-parameter step does); a table's rows count their own
  // pushes, and none is touched or evicted.
  virtual int64_t Apply(const Update& update, double lr, int64_t step) = 0;
  // Writes the values of `ids` as `dtype` at `to` (Size(ids) of them);
  // returns the encoding's scale. A table makes the rows it lacks, seen at
  // `step`.
  virtual float Write(absl::Span<const int64_t> ids, int64_t step, v1::DType dtype, char* to) = 0;
  // As a checkpoint holds it (buffers in `record` reused).
  virtual void Save(KeyRecord* record) const = 0;

  // ---- Moves and copies ----
  // Sync: a step half done, handed over with the key, and taken.
  virtual void WriteStepSum(v1::SeedRequest* req) const = 0;
  virtual void TakeStepSum(const v1::SeedRequest& req) = 0;
  // Hands the value over to the server that serves the key next: `fill`
  // writes the key's seed (spec, version, clocks; with `last`, the rest of
  // the hand-over), `send` sends it. A dense value goes without its values
  // first (the copy there holds every version published here), with them
  // where that copy is refused; a table's part in parts of at most
  // `part_bytes`, each tried again while its receiver is unreachable. An
  // error says what it costs (DATA_LOSS: the rows are lost there).
  using SeedWriter = std::function<void(v1::SeedRequest* req, bool last)>;
  using SeedSender = std::function<absl::Status(const v1::SeedRequest&)>;
  virtual absl::Status HandOver(const SeedWriter& fill, const SeedSender& send,
                                int64_t part_bytes) const = 0;
  // A seed's part (ReadSeed) this value would take with `optimizer`: OK,
  // or why not (changes nothing). The store checked the key's state first:
  // a part without the value finds the value here at the seed's version, a
  // part after the first finds the parts before it.
  virtual absl::Status CheckSeed(const OptimizerConfig& optimizer, const SeedPart& part,
                                 const v1::SeedRequest& req) const = 0;
  // Takes a part CheckSeed accepted; false: it was taken before (a retry).
  virtual bool TakeSeed(const SeedPart& part, const v1::SeedRequest& req) = 0;

  // ---- What one kind alone does (null for the other) ----
  virtual const KeptCopy* kept_copy() const = 0;
  virtual AssignedRows* rows() = 0;
};

}  // namespace psrt

#endif  // PSRT_SERVER_KEY_VALUE_H_
