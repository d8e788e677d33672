#include "server/key_value.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/compression.h"
#include "server/table.h"

namespace psrt {

namespace {

// A dense key: `n` weights, the optimizer's slots beside them, and (sync) the
// step's sum.
class DenseValue final : public KeyValue {
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
  void Assign(absl::Span<const int64_t>, const float*) override {}  // tables only
  Update StepSum(float scale) override {
    if (scale != 1) {
      for (float& v : accum_) v *= scale;
    }
    return {{}, accum_.data(), n_, 1};
  }
  void ClearStepSum() override {}  // the step's first push overwrites it
  int64_t Apply(const Update& u, double lr, int64_t step) override {
    ApplyUpdate(optimizer_, lr, step - skipped_, weights_.data(), u.values, slot_ptrs_.data(), n_);
    return 0;
  }
  void SkipStep() override { ++skipped_; }
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

  bool kept_as_copy() const override { return true; }
  void WriteCopy(v1::SeedRequest* req) const override {
    req->set_weights(reinterpret_cast<const char*>(weights_.data()), n_ * 4);
    req->set_skipped_steps(skipped_);
    for (const auto& slot : slots_)
      req->add_slots(reinterpret_cast<const char*>(slot.data()), n_ * 4);
  }
  void TakeCopy(const v1::SeedRequest& req) override {
    std::memcpy(weights_.data(), req.weights().data(), n_ * 4);
    skipped_ = req.skipped_steps();
    for (int i = 0; i < req.slots_size(); ++i)
      std::memcpy(slots_[i].data(), req.slots(i).data(), n_ * 4);
  }
  std::vector<KeyRecord> Parts(int64_t) const override { return {}; }
  absl::Status CheckPart(const OptimizerConfig&, int64_t, const KeyRecord&) const override {
    return absl::FailedPreconditionError(absl::StrCat("key '", name_, "' is not a table here"));
  }
  bool TakePart(int64_t, const KeyRecord&) override { return false; }
  void WriteStepSum(v1::SeedRequest* req) const override {
    req->set_accum(reinterpret_cast<const char*>(accum_.data()), n_ * 4);
  }
  void TakeStepSum(const v1::SeedRequest& req) override {
    if (!req.accum().empty()) std::memcpy(accum_.data(), req.accum().data(), n_ * 4);
  }

 private:
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
class TableValue final : public KeyValue {
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
    if (!table_)
      table_ = std::make_unique<Table>(name_, spec_.table(), optimizer, spec_.partition());
  }
  void Start(absl::string_view) override {}  // rows start from the table's seed
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
                  bool, std::vector<float>* scratch) override {
    table_->Accumulate(ids, PayloadValues(data, dtype, scale, scratch));
  }
  void Assign(absl::Span<const int64_t> ids, const float* values) override {
    table_->Assign(ids, values);
  }
  Update StepSum(float scale) override {
    absl::Span<const int64_t> ids = table_->accumulated_ids();
    return {ids, table_->accumulated(), Size(ids), scale};
  }
  void ClearStepSum() override { table_->ClearAccumulated(); }
  int64_t Apply(const Update& u, double lr, int64_t step) override {
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
  void SkipStep() override {}  // each row counts its own pushes
  void Save(KeyRecord* r) const override { table_->Save(r); }

  bool kept_as_copy() const override { return false; }
  void WriteCopy(v1::SeedRequest*) const override {}
  void TakeCopy(const v1::SeedRequest&) override {}
  std::vector<KeyRecord> Parts(int64_t max_bytes) const override {
    KeyRecord all;
    table_->Save(&all);
    const size_t rows = all.row_ids.size();
    const size_t per_part = std::max<size_t>(1, max_bytes / table_->row_bytes());
    std::vector<KeyRecord> parts;
    size_t first = 0;
    do {  // at least one part, if empty
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
  absl::Status CheckPart(const OptimizerConfig& optimizer, int64_t rows_before,
                         const KeyRecord& rows) const override {
    const int64_t n = static_cast<int64_t>(rows.row_ids.size());
    if (rows_before == 0) {
      return Table(name_, spec_.table(), optimizer, spec_.partition()).CheckLoad(rows);
    }
    if (table_->rows() == rows_before + n) return absl::OkStatus();  // taken before
    if (table_->rows() != rows_before) {
      return absl::FailedPreconditionError(absl::StrCat("table part '", name_, "' holds ",
                                                        table_->rows(), " rows here; a part after ",
                                                        rows_before, " rows does not follow"));
    }
    return table_->CheckLoad(rows);
  }
  bool TakePart(int64_t rows_before, const KeyRecord& rows) override {
    if (rows_before > 0 && table_->rows() != rows_before) return false;
    (void)table_->Load(rows);  // CheckPart accepted it
    return true;
  }
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

 private:
  const std::string name_;
  const v1::KeySpec spec_;
  const int64_t dim_;
  std::unique_ptr<Table> table_;
};

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

std::unique_ptr<KeyValue> KeyValue::New(const std::string& name, const v1::KeySpec& spec,
                                        bool sync) {
  if (spec.has_table()) return std::make_unique<TableValue>(name, spec);
  return std::make_unique<DenseValue>(name, spec.num_elements(), sync);
}

}  // namespace psrt
