// A table's requests (docs/sparse.md): its rows split by the server each
// lives on (request_codec's SplitRows), one server's part a Shard of one
// item (RowsShard), pushed, pulled or assigned through the dispatcher's
// stages; in a host group, handed to local aggregation's
// (local_row_sums.cc, local_row_pulls.cc).

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "kernels/row_optimizer.h"
#include "worker/dispatcher.h"
#include "worker/request_codec.h"

namespace psrt {

Dispatcher::Handle Dispatcher::StartRows(const std::string& table, const int64_t* ids, int64_t n,
                                         const float* grads, float* out, int64_t version,
                                         bool push) {
  absl::StatusOr<Variable> var = Find(table);
  if (!var.ok()) return ops.New(0, var.status()).first;
  if (var->dim == 0) {
    return ops
        .New(0, absl::InvalidArgumentError(absl::StrCat("variable '", table, "' is not a table")))
        .first;
  }
  if (n < 0 || (n > 0 && (ids == nullptr || (push ? grads == nullptr : out == nullptr)))) {
    return ops
        .New(0, absl::InvalidArgumentError(
                    absl::StrCat("table '", table, "': ", n, " ids without their buffers")))
        .first;
  }
  // In a host group (sync, local aggregation), the host's processes share a
  // table's pulls and sum its pushes.
  HostGroup::Slots* slots = nullptr;
  if (group != nullptr && (slots = group->Find(table)) == nullptr) {
    return ops
        .New(0, absl::InternalError(
                    absl::StrCat("table '", table, "' has no region in the host group")))
        .first;
  }
  if (!push && slots != nullptr) return StartGroupedPull(table, *var, slots, ids, n, out, version);
  const int64_t dim = var->dim;
  std::vector<std::shared_ptr<RowSet>> sets =
      SplitRows(ids, nullptr, n, push ? grads : nullptr, dim, num_servers);
  std::vector<bool> await(num_servers, false);
  if (push && config.mode() == "sync") {
    absl::MutexLock lock(&mu);
    auto found = variables.find(table);
    for (int s = 0; s < num_servers; ++s) {
      await[s] = found == variables.end() ||
                 s >= static_cast<int>(found->second.pulled_versions.size()) ||
                 found->second.pulled_versions[s] < version;
    }
  }
  if (push && slots != nullptr) {
    return StartGroupedRows(table, *var, slots, std::move(sets), await, version);
  }
  std::vector<Shard> shards;
  for (int s = 0; s < num_servers; ++s) {
    if (!push && sets[s]->ids.empty()) continue;  // nothing to get there
    shards.push_back(RowsShard(table, *var, s, sets[s], out, await[s]));
  }
  return Start(std::move(shards), version, push, !push);
}

Dispatcher::Handle Dispatcher::StartAssignRows(const std::string& table, const int64_t* ids,
                                               int64_t n, const float* values) {
  absl::StatusOr<Variable> var = Find(table);
  if (var.ok() && var->dim == 0) {
    var = absl::InvalidArgumentError(absl::StrCat("variable '", table, "' is not a table"));
  }
  if (var.ok() && (n < 0 || (n > 0 && (ids == nullptr || values == nullptr)))) {
    var = absl::InvalidArgumentError(
        absl::StrCat("table '", table, "': ", n, " ids without their rows"));
  }
  if (!var.ok()) return ops.New(0, var.status(), "PUSH").first;
  const int64_t dim = var->dim;
  const int64_t most = std::max<int64_t>(1, kRequestBytes / (dim * 4));  // rows a request
  std::vector<std::shared_ptr<RowSet>> open(num_servers);
  std::vector<Shard> shards;
  auto close = [&](int s) {
    shards.push_back(RowsShard(table, *var, s, std::move(open[s]), nullptr, false));
    shards.back().items.front().push_dtype = v1::DTYPE_FLOAT32;  // values travel exactly
  };
  for (int64_t i = 0; i < n; ++i) {
    const int s = RowShard(ids[i], num_servers);
    if (open[s] == nullptr) open[s] = std::make_shared<RowSet>();
    open[s]->ids.push_back(ids[i]);
    open[s]->grads.insert(open[s]->grads.end(), values + i * dim, values + (i + 1) * dim);
    if (static_cast<int64_t>(open[s]->ids.size()) == most) close(s);
  }
  for (int s = 0; s < num_servers; ++s) {
    if (open[s] != nullptr) close(s);
  }
  auto [handle, op] = ops.New(static_cast<int>(shards.size()), absl::OkStatus(), "PUSH");
  Launch(std::move(shards), op, 0, true, false, [](Request* r) { r->assign_rows = true; });
  return handle;
}

Shard Dispatcher::RowsShard(const std::string& table, const Variable& var, int server,
                            std::shared_ptr<RowSet> set, float* out, bool await) {
  Shard shard;
  shard.server = server;
  Shard::Item& it = shard.items.emplace_back();
  it.variable = table;
  it.part.index = static_cast<uint32_t>(server);
  it.part.server = server;
  it.part.num_elements = static_cast<int64_t>(set->ids.size()) * var.dim;
  shard.bytes = it.part.num_elements * 4;
  it.grad = set->grads.data();
  it.out = out;
  it.push_dtype = var.push_dtype;
  it.pull_dtype = var.pull_dtype;
  it.rows = std::move(set);
  it.dim = var.dim;
  shard.await_step = await;
  return shard;
}

}  // namespace psrt
