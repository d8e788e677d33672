#include "server/key_value.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/backoff.h"
#include "common/compression.h"
#include "common/key_map.h"
#include "server/table.h"

namespace psrt {

namespace {

// A table's part is tried again for up to this long while its receiver is
// unreachable.
constexpr absl::Duration kHandoverRetryFor = absl::Seconds(30);

std::string ShapeText(const google::protobuf::RepeatedField<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// A seed of a table's part that does not fit its form or the part here.
absl::Status TablePartRefused(const std::string& name, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("hand-over of table part '", name, "': ", why));
}

// A dense key: `n` weights, the optimizer's slots beside them, and (sync) the
// step's sum.
class DenseValue final : public KeyValue, public KeptCopy {
 public:
  DenseValue(std::string name, int64_t n, bool sync) : name_(std::move(name)), n_(n), sync_(sync) {}

  absl::Status CheckPush(absl::Span<const int64_t> ids, int64_t bytes, int bytes_per_value,
                         v1::DType dtype) const override {
    if (absl::Status s = NoIds("push to", ids); !s.ok()) return s;
    if (bytes != n_ * bytes_per_value) {
      return absl::InvalidArgumentError(
          absl::StrCat("push to key '", name_, "' has ", bytes, " bytes; the key holds ", n_, " ",
                       DTypeName(dtype), " (", n_ * bytes_per_value, " bytes)"));
    }
    return absl::OkStatus();
  }
  absl::Status CheckPull(absl::Span<const int64_t> ids) const override {
    return NoIds("pull of", ids);
  }
  int64_t Size(absl::Span<const int64_t>) const override { return n_; }

  int64_t bytes() const override {
    size_t values = weights_.size() + accum_.size();
    for (const auto& s : slots_) values += s.size();
    return static_cast<int64_t>(values) * 4;
  }
  void Init(const OptimizerConfig& optimizer) override {
    optimizer_ = optimizer;
    weights_.resize(n_);
    const size_t num_slots = static_cast<size_t>(NumSlots(optimizer));
    if (slots_.size() != num_slots) slots_.assign(num_slots, std::vector<float>(n_));
    slot_ptrs_.clear();
    for (auto& s : slots_) slot_ptrs_.push_back(s.data());
    if (sync_) accum_.assign(n_, 0.f);
  }
  bool StartsFrom(absl::string_view init) const override { return !init.empty(); }
  void Start(absl::string_view init) override {
    std::memcpy(weights_.data(), init.data(), n_ * 4);
    InitSlots(optimizer_, slot_ptrs_.data(), n_);
    skipped_ = 0;
  }
  absl::Status Restore(const OptimizerConfig& optimizer, KeyRecord* r) override {
    if (NumSlots(optimizer) != static_cast<int>(r->slots.size()) ||
        static_cast<int64_t>(r->weights.size()) != n_) {
      return absl::DataLossError(absl::StrCat(
          "key '", name_, "' does not fit its optimizer ", OptimizerName(optimizer.kind), " (",
          r->slots.size(), " slots, ", r->weights.size(), " weights for ", n_, " elements)"));
    }
    // step_counters: the steps skipped for want of a gradient (none: none).
    const int64_t skipped = r->step_counters.empty() ? 0 : r->step_counters[0];
    if (r->step_counters.size() > 1 || skipped < 0 || skipped > r->version) {
      return absl::DataLossError(absl::StrCat(
          "key '", name_, "' has step counters that do not fit ", "its version ", r->version));
    }
    skipped_ = skipped;
    weights_ = std::move(r->weights);
    slots_ = std::move(r->slots);
    Init(optimizer);  // keeps them
    return absl::OkStatus();
  }
  void Free() override {
    std::vector<float>().swap(weights_);
    std::vector<float>().swap(accum_);
    slots_.clear();
    slot_ptrs_.clear();
  }

  absl::StatusOr<int64_t> CheckIds(absl::Span<const int64_t>) const override { return 0; }
  void Accumulate(absl::Span<const int64_t>, const Payload& data, v1::DType dtype, float scale,
                  bool first, std::vector<float>*) override {
    // Decoded straight into the sum.
    DecodePayload(data, dtype, scale, accum_.data(), !first);
  }
  Update StepSum(float scale) override {
    if (scale != 1) {
      for (float& v : accum_) v *= scale;
    }
    return {{}, accum_.data(), n_, 1};
  }
  int64_t Apply(const Update& u, double lr, int64_t step) override {
    if (u.values == nullptr) {
      ++skipped_;
      return 0;
    }
    ApplyUpdate(optimizer_, lr, step - skipped_, weights_.data(), u.values, slot_ptrs_.data(), n_);
    return 0;
  }
  float Write(absl::Span<const int64_t>, int64_t, v1::DType dtype, char* to) override {
    // The one copy of the weights on the way out, fused with the conversion.
    return EncodeValues(weights_.data(), n_, dtype, to).scale;
  }
  void Save(KeyRecord* r) const override {
    r->num_elements = n_;
    r->step_counters.clear();
    if (skipped_ > 0) r->step_counters.push_back(skipped_);
    r->weights.assign(weights_.begin(), weights_.end());
    r->slots.resize(slots_.size());
    for (size_t i = 0; i < slots_.size(); ++i)
      r->slots[i].assign(slots_[i].begin(), slots_[i].end());
  }

  void WriteStepSum(v1::SeedRequest* req) const override {
    req->set_accum(reinterpret_cast<const char*>(accum_.data()), n_ * 4);
  }
  void TakeStepSum(const v1::SeedRequest& req) override {
    if (!req.accum().empty()) std::memcpy(accum_.data(), req.accum().data(), n_ * 4);
  }
  absl::Status HandOver(const SeedWriter& fill, const SeedSender& send, int64_t) const override {
    v1::SeedRequest req;
    fill(&req, /*last=*/true);
    // The copy there has every version published here (an update is
    // published once it holds it), so the values go along only where it
    // does not.
    absl::Status s = send(req);
    if (absl::IsFailedPrecondition(s)) {
      WriteCopy(&req);
      s = send(req);
    }
    if (s.ok()) return s;
    return absl::Status(s.code(), absl::StrCat(s.message(),
                                               "; a step half done here is done there again "
                                               "from the pushes resent to it"));
  }
  absl::Status CheckSeed(const OptimizerConfig&, const SeedPart& part,
                         const v1::SeedRequest& req) const override {
    if (part.rows) {
      return absl::FailedPreconditionError(absl::StrCat("key '", name_, "' is not a table here"));
    }
    if (req.spec().num_elements() != n_) {
      return absl::FailedPreconditionError(absl::StrCat("key '", name_, "' has another size here"));
    }
    return absl::OkStatus();
  }
  bool TakeSeed(const SeedPart& part, const v1::SeedRequest& req) override {
    // Without the values, the copy here is current already.
    if (part.value) TakeCopy(req);
    return true;
  }
  void WriteCopy(v1::SeedRequest* req) const override {
    req->set_weights(reinterpret_cast<const char*>(weights_.data()), n_ * 4);
    req->set_skipped_steps(skipped_);
    for (const auto& slot : slots_)
      req->add_slots(reinterpret_cast<const char*>(slot.data()), n_ * 4);
  }
  const KeptCopy* kept_copy() const override { return this; }
  AssignedRows* rows() override { return nullptr; }

 private:
  // A copy's values and slots (sizes checked by ReadSeed against the spec).
  void TakeCopy(const v1::SeedRequest& req) {
    std::memcpy(weights_.data(), req.weights().data(), n_ * 4);
    skipped_ = req.skipped_steps();
    for (int i = 0; i < req.slots_size(); ++i)
      std::memcpy(slots_[i].data(), req.slots(i).data(), n_ * 4);
  }
  absl::Status NoIds(const char* what, absl::Span<const int64_t> ids) const {
    if (ids.empty()) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat(what, " key '", name_, "' names ids, but the variable is not a table"));
  }

  const std::string name_;
  const int64_t n_;
  const bool sync_;
  OptimizerConfig optimizer_;
  std::vector<float> weights_;
  std::vector<std::vector<float>> slots_;
  std::vector<float*> slot_ptrs_;
  // Versions made without an update (SkipStep): the optimizer's update
  // count is the version less these.
  int64_t skipped_ = 0;
  std::vector<float> accum_;
};

// A sparse table's part: the rows of this server's ids (server/table.h).
class TableValue final : public KeyValue, public AssignedRows {
 public:
  TableValue(std::string name, const v1::KeySpec& spec)
      : name_(std::move(name)), spec_(spec), dim_(spec.table().dim()) {}

  absl::Status CheckPush(absl::Span<const int64_t> ids, int64_t bytes, int bytes_per_value,
                         v1::DType dtype) const override {
    const int64_t want = static_cast<int64_t>(ids.size()) * dim_ * bytes_per_value;
    if (bytes == want) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(
        "push to table '", spec_.variable(), "' has ", bytes, " bytes for ", ids.size(),
        " ids; rows of dim ", dim_, " in ", DTypeName(dtype), " take ", want));
  }
  absl::Status CheckPull(absl::Span<const int64_t>) const override { return absl::OkStatus(); }
  int64_t Size(absl::Span<const int64_t> ids) const override {
    return static_cast<int64_t>(ids.size()) * dim_;
  }

  int64_t bytes() const override { return table_ ? table_->rows() * table_->row_bytes() : 0; }
  void Init(const OptimizerConfig& optimizer) override {
    optimizer_ = optimizer;
    if (!table_) table_ = NewTable(optimizer);
  }
  bool StartsFrom(absl::string_view) const override { return true; }
  void Start(absl::string_view) override { table_ = NewTable(optimizer_); }
  absl::Status Restore(const OptimizerConfig& optimizer, KeyRecord* r) override {
    Free();
    Init(optimizer);
    if (absl::Status s = table_->Load(*r); !s.ok()) return absl::DataLossError(s.message());
    return absl::OkStatus();
  }
  void Free() override { table_.reset(); }

  absl::StatusOr<int64_t> CheckIds(absl::Span<const int64_t> ids) const override {
    absl::StatusOr<int64_t> missing = table_->CheckIds(ids);
    if (!missing.ok()) return missing.status();
    return *missing * table_->row_bytes();
  }
  void Accumulate(absl::Span<const int64_t> ids, const Payload& data, v1::DType dtype, float scale,
                  bool first, std::vector<float>* scratch) override {
    if (first) table_->ClearAccumulated();
    table_->Accumulate(ids, PayloadValues(data, dtype, scale, scratch));
  }
  Update StepSum(float scale) override {
    absl::Span<const int64_t> ids = table_->accumulated_ids();
    return {ids, table_->accumulated(), Size(ids), scale};
  }
  int64_t Apply(const Update& u, double lr, int64_t step) override {
    if (u.values == nullptr) return 0;  // each row counts its own pushes
    table_->Apply(u.ids, u.values, u.scale, lr, step);
    return table_->MaybeEvict(step);
  }
  float Write(absl::Span<const int64_t> ids, int64_t step, v1::DType dtype, char* to) override {
    // float32 rows go straight into the answer; others are gathered first.
    if (dtype == v1::DTYPE_FLOAT32) {
      table_->Gather(ids, step, reinterpret_cast<float*>(to));
      return 0;
    }
    thread_local std::vector<float> rows;
    rows.resize(Size(ids));
    table_->Gather(ids, step, rows.data());
    return EncodeValues(rows.data(), Size(ids), dtype, to).scale;
  }
  void Save(KeyRecord* r) const override { table_->Save(r); }

  void WriteStepSum(v1::SeedRequest* req) const override {
    absl::Span<const int64_t> ids = table_->accumulated_ids();
    req->mutable_accum_ids()->Add(ids.begin(), ids.end());
    req->set_accum(reinterpret_cast<const char*>(table_->accumulated()), Size(ids) * 4);
  }
  void TakeStepSum(const v1::SeedRequest& req) override {
    table_->SetAccumulated(req.accum_ids(),
                           absl::MakeConstSpan(reinterpret_cast<const float*>(req.accum().data()),
                                               req.accum().size() / 4));
  }
  absl::Status HandOver(const SeedWriter& fill, const SeedSender& send,
                        int64_t part_bytes) const override {
    std::vector<KeyRecord> parts = Parts(part_bytes);
    int64_t first = 0;
    for (size_t i = 0; i < parts.size(); ++i) {
      KeyRecord& part = parts[i];
      const bool last = i + 1 == parts.size();
      v1::SeedRequest req;
      fill(&req, last);
      part.version = req.version();
      req.set_handover(true);
      req.set_rows(EncodeShard({part}));
      req.set_rows_before(first);
      req.set_more_rows(!last);
      // Each part may be sent again: the receiver takes it once.
      absl::Status s = send(req);
      Backoff backoff(absl::Now() + kHandoverRetryFor);
      while ((absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s)) && backoff.Wait())
        s = send(req);
      if (!s.ok()) {
        return absl::DataLossError(absl::StrCat(
            s.message(), "; its rows are lost there, and that server refuses its requests"));
      }
      first += static_cast<int64_t>(part.row_ids.size());
    }
    return absl::OkStatus();
  }
  absl::Status CheckSeed(const OptimizerConfig& optimizer, const SeedPart& part,
                         const v1::SeedRequest&) const override {
    if (!part.rows) {
      return absl::FailedPreconditionError(absl::StrCat("key '", name_, "' has another size here"));
    }
    const KeyRecord& rows = *part.rows;
    absl::Status s;
    const int64_t n = static_cast<int64_t>(rows.row_ids.size());
    if (part.rows_before == 0) {
      s = NewTable(optimizer)->CheckLoad(rows);
    } else if (table_->rows() == part.rows_before + n) {
      return absl::OkStatus();  // taken before
    } else if (table_->rows() != part.rows_before) {
      return absl::FailedPreconditionError(absl::StrCat("table part '", name_, "' holds ",
                                                        table_->rows(), " rows here; a part after ",
                                                        part.rows_before, " rows does not follow"));
    } else {
      s = table_->CheckLoad(rows);
    }
    if (absl::IsInvalidArgument(s)) return TablePartRefused(name_, s.message());
    return s;
  }
  bool TakeSeed(const SeedPart& part, const v1::SeedRequest&) override {
    if (part.rows_before > 0 && table_->rows() != part.rows_before) return false;
    (void)table_->Load(*part.rows);  // CheckSeed accepted it
    return true;
  }
  void Assign(absl::Span<const int64_t> ids, const float* values) override {
    table_->Assign(ids, values);
  }
  const KeptCopy* kept_copy() const override { return nullptr; }
  AssignedRows* rows() override { return this; }

 private:
  std::unique_ptr<Table> NewTable(const OptimizerConfig& optimizer) const {
    return std::make_unique<Table>(name_, spec_.table(), optimizer, spec_.partition());
  }
  // The rows in parts of at most `max_bytes` (at least one part, if empty).
  std::vector<KeyRecord> Parts(int64_t max_bytes) const {
    KeyRecord all;
    table_->Save(&all);
    const size_t rows = all.row_ids.size();
    const size_t per_part = std::max<size_t>(1, max_bytes / table_->row_bytes());
    std::vector<KeyRecord> parts;
    size_t first = 0;
    do {
      const size_t end = std::min(rows, first + per_part);
      KeyRecord& part = parts.emplace_back();
      part.variable = spec_.variable();
      part.partition = spec_.partition();
      part.slots.resize(all.slots.size());
      for (size_t r = first; r < end; ++r) AppendRow(all, r, dim_, &part);
      part.num_elements = static_cast<int64_t>(part.weights.size());
      first = end;
    } while (first < rows);
    return parts;
  }

  const std::string name_;
  const v1::KeySpec spec_;
  const int64_t dim_;
  OptimizerConfig optimizer_;
  std::unique_ptr<Table> table_;
};

// A dense key's shape, slice and initial value.
absl::Status CheckDenseSpec(const v1::KeySpec& spec, int32_t rank, int64_t max_key_bytes) {
  const std::string name = KeyName(spec.variable(), spec.partition());
  int64_t total = 1;
  for (int64_t d : spec.shape()) {
    if (d < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "key '", name, "': shape ", ShapeText(spec.shape()), " has a negative dimension"));
    }
    if (d != 0 && total > INT64_MAX / d) {
      return absl::InvalidArgumentError(
          absl::StrCat("key '", name, "': shape ", ShapeText(spec.shape()), " overflows 64 bits"));
    }
    total *= d;
  }
  if (spec.num_elements() > max_key_bytes / 4) {
    return absl::InvalidArgumentError(absl::StrCat(
        "key '", name, "' has ", spec.num_elements(), " elements; a key holds at most ",
        max_key_bytes / 4, " float32 (the job's partition size, ", max_key_bytes, " bytes)"));
  }
  if (spec.num_elements() <= 0 || spec.offset() < 0 ||
      spec.offset() > total - spec.num_elements()) {
    return absl::InvalidArgumentError(
        absl::StrCat("key '", name, "': slice [", spec.offset(), ", +", spec.num_elements(),
                     ") does not fit shape ", ShapeText(spec.shape()), " of ", total, " elements"));
  }
  if (!spec.init().empty()) {
    if (rank != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "key '", name, "': only rank 0 sends initial values; worker ", rank, " sent one"));
    }
    if (static_cast<int64_t>(spec.init().size()) != spec.num_elements() * 4) {
      return absl::InvalidArgumentError(absl::StrCat(
          "key '", name, "': initial value has ", spec.init().size(), " bytes; expected ",
          spec.num_elements() * 4, " (", spec.num_elements(), " float32)"));
    }
  } else if (rank == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("key '", name, "': rank 0 must send the initial value"));
  }
  return absl::OkStatus();
}

// A dense copy: the weights and slots of its spec's size (not with a
// hand-over to the copy's holder, which has them), the step's sum, no rows.
absl::StatusOr<SeedPart> ReadDenseSeed(const std::string& name, const v1::SeedRequest& req,
                                       const absl::StatusOr<OptimizerConfig>& opt) {
  const int64_t n = req.spec().num_elements();
  SeedPart part;
  part.value = !req.handover() || !req.weights().empty();
  if (!opt.ok() || n <= 0 ||
      (part.value && (static_cast<int64_t>(req.weights().size()) != n * 4 ||
                      req.slots_size() != NumSlots(*opt))) ||
      (!req.accum().empty() && static_cast<int64_t>(req.accum().size()) != n * 4) ||
      !req.rows().empty() || req.accum_ids_size() > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("seed of key '", name, "' does not fit its spec"));
  }
  for (const std::string& slot : req.slots()) {
    if (static_cast<int64_t>(slot.size()) != n * 4)
      return absl::InvalidArgumentError("seed slot of the wrong size");
  }
  return part;
}

// A table's part: always with a hand-over, its rows one record of this part
// in `rows`, the step's sums fitting their rows.
absl::StatusOr<SeedPart> ReadTableSeed(const std::string& name, const v1::SeedRequest& req,
                                       const absl::StatusOr<OptimizerConfig>& opt) {
  const v1::KeySpec& spec = req.spec();
  if (!opt.ok()) return TablePartRefused(name, opt.status().message());
  if (absl::Status s = ValidateTableSpec(spec); !s.ok()) return TablePartRefused(name, s.message());
  if (!req.handover() || req.rows_before() < 0 || !req.weights().empty() || req.slots_size() > 0)
    return TablePartRefused(name, "a table's part comes with a hand-over, its rows in `rows`");
  const int64_t dim = spec.table().dim();
  if (static_cast<int64_t>(req.accum().size()) != req.accum_ids_size() * dim * 4)
    return TablePartRefused(name, "the step's sums do not fit their rows");
  absl::StatusOr<std::vector<KeyRecord>> records = DecodeShard(req.rows(), name);
  if (!records.ok()) return TablePartRefused(name, records.status().message());
  if (records->size() != 1 || (*records)[0].variable != spec.variable() ||
      (*records)[0].partition != spec.partition()) {
    return TablePartRefused(name, "its rows are not one record of this part");
  }
  SeedPart part;
  part.rows_before = req.rows_before();
  part.starts_over = req.rows_before() == 0;
  part.more = req.more_rows();
  part.rows = std::move((*records)[0]);
  return part;
}

}  // namespace

const float* PayloadValues(const Payload& data, v1::DType dtype, float scale,
                           std::vector<float>* scratch) {
  const std::vector<absl::string_view>& pieces = data.pieces();
  if (dtype == v1::DTYPE_FLOAT32 && pieces.size() == 1 &&
      reinterpret_cast<uintptr_t>(pieces[0].data()) % alignof(float) == 0) {
    return reinterpret_cast<const float*>(pieces[0].data());
  }
  scratch->resize(data.size() / BytesPerValue(dtype));
  DecodePayload(data, dtype, scale, scratch->data(), false);
  return scratch->data();
}

// The kind is read from the spec here alone: New, CheckSpec and ReadSeed.

std::unique_ptr<KeyValue> KeyValue::New(const std::string& name, const v1::KeySpec& spec,
                                        bool sync) {
  if (spec.has_table()) return std::make_unique<TableValue>(name, spec);
  return std::make_unique<DenseValue>(name, spec.num_elements(), sync);
}

absl::Status KeyValue::CheckSpec(const v1::KeySpec& spec, int32_t rank, bool replica,
                                 int64_t max_key_bytes) {
  if (spec.has_table()) {
    if (absl::Status s = ValidateTableSpec(spec); !s.ok()) return s;
    if (replica) {
      return absl::InvalidArgumentError(
          absl::StrCat("table '", spec.variable(),
                       "': tables are not replicated (\"replicas\" holds dense variables)"));
    }
    return absl::OkStatus();
  }
  return CheckDenseSpec(spec, rank, max_key_bytes);
}

absl::StatusOr<SeedPart> KeyValue::ReadSeed(const std::string& name, const v1::SeedRequest& req,
                                            const absl::StatusOr<OptimizerConfig>& optimizer) {
  return req.spec().has_table() ? ReadTableSeed(name, req, optimizer)
                                : ReadDenseSeed(name, req, optimizer);
}

}  // namespace psrt
