#include "server/checkpoint_io.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/failpoint.h"
#include "common/key_map.h"
#include "common/optimizer_proto.h"
#include "kernels/row_optimizer.h"
#include "server/checkpoint/crc32c.h"

namespace psrt {

absl::Status ShardSaver::Save(const v1::SaveShardRequest& req, absl::Time deadline,
                              v1::SaveShardResponse* resp) {
  if (req.root_uri().empty() || req.name().empty()) {
    return absl::InvalidArgumentError("SaveShard needs root_uri and name");
  }
  // Clients choose root_uri: a server writes only where the job keeps its
  // checkpoints, never at a path a token holder names.
  if (root_.empty()) {
    return absl::PermissionDeniedError(
        "this job has no checkpoint.uri, so its servers write no checkpoint");
  }
  if (req.root_uri() != root_) {
    return absl::PermissionDeniedError(absl::StrCat("SaveShard names root_uri '", req.root_uri(),
                                                    "'; this server writes checkpoints only under the job's "
                                                    "checkpoint.uri, '", root_, "'"));
  }
  if (absl::Status s = ValidateObjectPath(req.shard_path()); !s.ok()) return s;
  if (!(req.wait_s() >= 0 && req.wait_s() <= 60)) {
    return absl::InvalidArgumentError(absl::StrCat("wait_s must be in [0, 60]; got ", req.wait_s()));
  }
  const absl::Time until = std::min(deadline, absl::Now() + absl::Seconds(req.wait_s()));
  {
    absl::MutexLock lock(&mu_);
    auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !busy_; };
    if (!mu_.AwaitWithDeadline(absl::Condition(&idle), until)) {
      resp->set_done(false);  // another call is saving: ask again
      resp->set_keys_waiting(store_->num_keys());
      return absl::OkStatus();
    }
    busy_ = true;
  }
  absl::Status s = SaveTurn(req, until, resp);
  absl::MutexLock lock(&mu_);
  busy_ = false;
  return s;
}

absl::Status ShardSaver::SaveTurn(const v1::SaveShardRequest& req, absl::Time until,
                                  v1::SaveShardResponse* resp) {
  const std::string id = absl::StrCat(req.root_uri(), "\n", req.name());
  if (req.final()) store_->EndRegistrations();
  if (written_ == id) {
    *resp = result_;  // asked again: the shard is written
    return absl::OkStatus();
  }
  if (armed_ != id) {
    armed_.clear();
    if (absl::Status s = store_->ArmSnapshot(req.step()); !s.ok()) return s;
    armed_ = id;
  }
  const int64_t waiting = store_->WaitSnapshot(until);
  if (req.wait_only()) {
    resp->set_done(false);
    resp->set_keys_waiting(waiting);
    resp->set_num_keys(store_->num_keys());
    return absl::OkStatus();
  }
  if (waiting > 0 || (!req.allow_empty() && store_->num_keys() == 0)) {
    resp->set_done(false);
    resp->set_keys_waiting(waiting);
    return absl::OkStatus();
  }
  const absl::Time start = absl::Now();
  v1::SaveShardResponse result;
  store_->EncodeSnapshot(&buffer_, &result);
  armed_.clear();  // a failed write copies the keys again on the next call
  // The copies are encoded: the next periodic step can be armed before the
  // (slow) write, which keeps fast steps from passing it meanwhile.
  if (req.step() >= 0) ArmNextPeriodic(req.step());
  if (storage_ == nullptr) {
    absl::StatusOr<std::unique_ptr<Storage>> storage = OpenStorage(root_);
    if (!storage.ok()) return storage.status();
    storage_ = *std::move(storage);
  }
  if (absl::Status s = storage_->Put(req.shard_path(), buffer_); !s.ok()) return s;
  Failpoint("checkpoint.shard_written");
  result.set_done(true);
  v1::ManifestShard* shard = result.mutable_shard();
  shard->set_path(req.shard_path());
  shard->set_bytes(static_cast<int64_t>(buffer_.size()));
  shard->set_crc32c(Crc32c(buffer_));
  shard->set_num_records(result.keys_size());
  result.set_write_s(absl::ToDoubleSeconds(absl::Now() - start));
  result_ = result;
  written_ = id;
  *resp = std::move(result);
  return absl::OkStatus();
}

void ShardSaver::ArmPeriodic(int64_t every_steps, int64_t start_step) {
  every_steps_ = every_steps;  // before serving: no call holds the turn
  ArmNextPeriodic(start_step);
}

void ShardSaver::ArmNextPeriodic(int64_t after) {
  if (every_steps_ <= 0) return;
  const int64_t next = (after / every_steps_ + 1) * every_steps_;
  // Training may already be past it; the coordinator then picks a later step.
  if (store_->ArmSnapshot(next).ok()) armed_ = absl::StrCat(root_, "\n", CheckpointName(next));
}

namespace {

// Appends the rows of `rec` (a table's part as some server saved it) whose
// ids map to server `index` of `num_servers` to `dst`.
absl::Status TakeRows(const KeyRecord& rec, int index, int num_servers, KeyRecord* dst) {
  dst->version = std::max(dst->version, rec.version);
  dst->learning_rate = rec.learning_rate;
  const size_t rows = rec.row_ids.size();
  if (rows == 0) return absl::OkStatus();
  const size_t dim = rec.weights.size() / rows;
  if (dim * rows != rec.weights.size() || rec.slots.size() != dst->slots.size()) {
    return absl::DataLossError(absl::StrCat("table '", rec.variable, "' part ", rec.partition, ": ",
                                            rows, " rows do not fit its ", rec.weights.size(),
                                            " values and ", rec.slots.size(), " slots"));
  }
  for (size_t r = 0; r < rows; ++r) {
    if (RowShard(rec.row_ids[r], num_servers) == index) AppendRow(rec, r, dim, dst);
  }
  dst->num_elements = static_cast<int64_t>(dst->weights.size());
  return absl::OkStatus();
}

int64_t Overlap(int64_t a, int64_t an, int64_t b, int64_t bn) {
  return std::max<int64_t>(0, std::min(a + an, b + bn) - std::max(a, b));
}

// The keys one server holds, still without their values.
struct ServerKeys {
  std::vector<Store::RestoredKey> out;
  // Per variable, this server's keys (indices into `out`) in offset order.
  std::map<std::string, std::vector<size_t>> mine;
  // Per sparse table, this server's part (index into `out`): its rows are
  // those of every shard whose ids map here now.
  std::map<std::string, size_t> tables;
};

// Server `index`'s part of table `v`, with no rows yet.
absl::Status AddTablePart(const CheckpointRef& ckpt, const v1::ManifestVariable& v, int index,
                          int num_servers, ServerKeys* keys) {
  absl::StatusOr<OptimizerConfig> opt = OptimizerFromProto(v.optimizer());
  if (!opt.ok()) {
    return absl::DataLossError(absl::StrCat("checkpoint ", ckpt.uri(), ": table '", v.name(),
                                            "': ", opt.status().message()));
  }
  Store::RestoredKey rk;
  rk.spec.set_variable(v.name());
  rk.spec.set_partition(index);
  rk.spec.set_dtype(v.dtype());
  *rk.spec.mutable_shape() = v.shape();
  *rk.spec.mutable_optimizer() = v.optimizer();
  *rk.spec.mutable_table() = v.table();
  rk.spec.mutable_table()->set_num_shards(num_servers);
  rk.state.variable = v.name();
  rk.state.partition = index;
  rk.state.learning_rate = v.optimizer().lr();
  rk.state.slots.resize(RowSlots(*opt));
  keys->tables[v.name()] = keys->out.size();
  keys->out.push_back(std::move(rk));
  return absl::OkStatus();
}

// The keys of dense variable `v` that server `index` holds now, with no
// values yet.
absl::Status AddDenseKeys(const CheckpointRef& ckpt, const v1::ManifestVariable& v, int index,
                          int num_servers, int64_t partition_bytes, ServerKeys* keys) {
  int64_t n = 1;
  for (int64_t d : v.shape()) n *= d;
  absl::StatusOr<std::vector<Partition>> parts =
      PartitionVariable(v.name(), n, 4, partition_bytes, num_servers);
  if (!parts.ok()) return parts.status();
  absl::StatusOr<OptimizerConfig> opt = OptimizerFromProto(v.optimizer());
  if (!opt.ok()) {
    return absl::DataLossError(absl::StrCat("checkpoint ", ckpt.uri(), ": variable '", v.name(),
                                            "': ", opt.status().message()));
  }
  for (const Partition& p : *parts) {
    if (p.server != index) continue;
    Store::RestoredKey rk;
    rk.spec.set_variable(v.name());
    rk.spec.set_partition(p.index);
    rk.spec.set_dtype(v.dtype());
    *rk.spec.mutable_shape() = v.shape();
    rk.spec.set_offset(p.offset);
    rk.spec.set_num_elements(p.num_elements);
    *rk.spec.mutable_optimizer() = v.optimizer();
    rk.state.variable = v.name();
    rk.state.partition = p.index;
    rk.state.offset = p.offset;
    rk.state.num_elements = p.num_elements;
    rk.state.learning_rate = v.optimizer().lr();
    // Buffers come with the first record: moved from one that matches the
    // key exactly (the same layout), else allocated to gather slices.
    rk.state.slots.resize(NumSlots(*opt));
    keys->mine[v.name()].push_back(keys->out.size());
    keys->out.push_back(std::move(rk));
  }
  return absl::OkStatus();
}

// Only the shards holding a slice of this server's keys are read.
std::set<int> ShardsToRead(const v1::Manifest& m, const ServerKeys& keys) {
  std::set<int> shards;
  for (const v1::ManifestKey& k : m.keys()) {
    if (keys.tables.count(k.variable())) shards.insert(k.shard());  // its version, rows or not
    auto mine = keys.mine.find(k.variable());
    if (mine == keys.mine.end()) continue;
    for (size_t i : mine->second) {
      const KeyRecord& r = keys.out[i].state;
      if (Overlap(r.offset, r.num_elements, k.offset(), k.num_elements()) > 0)
        shards.insert(k.shard());
    }
  }
  return shards;
}

// Cuts the slice of dense record `rec` that overlaps key `dst` into it
// (moving its buffers where it is the whole key); returns the values taken.
absl::StatusOr<int64_t> TakeSlice(const CheckpointRef& ckpt, KeyRecord& rec, KeyRecord* dst) {
  const int64_t len = Overlap(dst->offset, dst->num_elements, rec.offset, rec.num_elements);
  if (len == 0) return 0;
  if (rec.slots.size() != dst->slots.size()) {
    return absl::DataLossError(absl::StrCat(
        "checkpoint ", ckpt.uri(), ": key '", KeyName(rec.variable, rec.partition), "' has ",
        rec.slots.size(), " optimizer slots; its optimizer keeps ", dst->slots.size()));
  }
  if (len == dst->num_elements && len == rec.num_elements && dst->weights.empty()) {
    dst->weights = std::move(rec.weights);
    dst->slots = std::move(rec.slots);
  } else {
    const int64_t from = std::max(dst->offset, rec.offset);
    auto copy = [&](const std::vector<float>& src, std::vector<float>* to) {
      to->resize(dst->num_elements);
      std::memcpy(to->data() + (from - dst->offset), src.data() + (from - rec.offset),
                  len * sizeof(float));
    };
    copy(rec.weights, &dst->weights);
    for (size_t s = 0; s < rec.slots.size(); ++s) copy(rec.slots[s], &dst->slots[s]);
  }
  // Keys cut from several records (async) take the most updates.
  dst->version = std::max(dst->version, rec.version);
  dst->learning_rate = rec.learning_rate;
  // A variable's partitions skip the same steps (no gradient).
  dst->step_counters = rec.step_counters;
  return len;
}

// One record of a shard, into the keys it overlaps here: a table's rows
// that map here, or a dense slice (`filled` counts each key's values).
absl::Status TakeRecord(const CheckpointRef& ckpt, KeyRecord& rec, int index, int num_servers,
                        ServerKeys* keys, std::vector<int64_t>* filled) {
  if (auto t = keys->tables.find(rec.variable); t != keys->tables.end()) {
    if (absl::Status s = TakeRows(rec, index, num_servers, &keys->out[t->second].state); !s.ok())
      return absl::DataLossError(absl::StrCat("checkpoint ", ckpt.uri(), ": ", s.message()));
    return absl::OkStatus();
  }
  auto mine = keys->mine.find(rec.variable);
  if (mine == keys->mine.end()) return absl::OkStatus();
  for (size_t i : mine->second) {
    absl::StatusOr<int64_t> len = TakeSlice(ckpt, rec, &keys->out[i].state);
    if (!len.ok()) return len.status();
    (*filled)[i] += *len;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<Store::RestoredKey>> LoadServerKeys(const CheckpointRef& ckpt, int index,
                                                               int num_servers,
                                                               int64_t partition_bytes) {
  const v1::Manifest& m = ckpt.manifest;
  ServerKeys keys;
  for (const v1::ManifestVariable& v : m.variables()) {
    absl::Status s = v.has_table()
                         ? AddTablePart(ckpt, v, index, num_servers, &keys)
                         : AddDenseKeys(ckpt, v, index, num_servers, partition_bytes, &keys);
    if (!s.ok()) return s;
  }
  std::vector<int64_t> filled(keys.out.size(), 0);
  for (int shard : ShardsToRead(m, keys)) {
    absl::StatusOr<std::string> bytes = ReadShard(ckpt.root.get(), m, shard);
    if (!bytes.ok()) return bytes.status();
    absl::StatusOr<std::vector<KeyRecord>> records =
        DecodeShard(*bytes, absl::StrCat(ckpt.root->uri(), "/", m.shards(shard).path()));
    if (!records.ok()) return records.status();
    for (KeyRecord& rec : *records) {
      if (absl::Status s = TakeRecord(ckpt, rec, index, num_servers, &keys, &filled); !s.ok())
        return s;
    }
  }
  for (size_t i = 0; i < keys.out.size(); ++i) {
    const Store::RestoredKey& k = keys.out[i];
    if (k.spec.has_table()) continue;  // any number of rows is whole
    if (filled[i] != k.state.num_elements) {
      return absl::DataLossError(absl::StrCat("checkpoint ", ckpt.uri(), ": the shards hold ",
                                              filled[i], " of the ", k.state.num_elements,
                                              " elements of key '",
                                              KeyName(k.state.variable, k.state.partition), "'"));
    }
  }
  return std::move(keys.out);
}

}  // namespace psrt
