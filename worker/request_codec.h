// What a worker's requests carry, as pure functions: tensors split into
// per-server requests, gradients encoded for the wire, pulled weights and
// rows decoded into the caller's buffers. No links and no locks here:
// Client::Impl (worker/client.cc) sends and tracks what these make.
#ifndef PSRT_WORKER_REQUEST_CODEC_H_
#define PSRT_WORKER_REQUEST_CODEC_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/compression.h"
#include "common/key_map.h"
#include "common/tensor_coding.h"
#include "psrt/v1/ps.pb.h"
#include "worker/client.h"

namespace psrt {

// Requests carry at most kRequestBytes (or one key), so big tensors go out
// as several calls in parallel and no message nears the size limit.
inline constexpr int64_t kRequestBytes = 4 << 20;

// A registered variable as this client knows it.
struct Variable {
  int64_t num_elements = 0;
  int64_t dim = 0;  // > 0: a sparse table with rows of dim
  std::vector<Partition> parts;
  std::vector<int64_t> pulled_versions;  // per partition, from the latest pull
  v1::DType push_dtype = v1::DTYPE_FLOAT32;
  v1::DType pull_dtype = v1::DTYPE_FLOAT32;
};

// One server's share of a table push or pull: its ids in the caller's
// order, where they were in the caller's list, and (push) their gradients
// gathered row after row.
struct RowSet {
  std::vector<int64_t> ids;
  std::vector<int64_t> at;
  std::vector<float> grads;
  // A pull's: the version of the rows the server answered (-1: none yet),
  // set once the answer is in.
  mutable int64_t version = -1;
};

// Part of one server's share of an operation: its keys and their buffers.
struct Shard {
  int server = 0;
  int64_t bytes = 0;
  bool await_step = false;  // see Request::await_step
  struct Item {
    std::string variable;
    Partition part;
    const float* grad = nullptr;  // the whole variable's, pushed
    float* out = nullptr;         // the whole variable's, filled
    v1::DType push_dtype = v1::DTYPE_FLOAT32;
    v1::DType pull_dtype = v1::DTYPE_FLOAT32;
    // A table's rows: `part` spans them, `grad` points at rows->grads and
    // `out` at the caller's rows, which the answer is scattered into.
    std::shared_ptr<const RowSet> rows;
    int64_t dim = 0;
  };
  std::vector<Item> items;
};

// The batch of `batches` (each with .server and .bytes) to which `bytes`
// for `server` go, holding at most `limit` bytes (or one key); `open`
// tracks each server's batch being filled.
template <typename Batch>
Batch& BatchFor(std::vector<Batch>* batches, std::map<int, size_t>* open, int server, int64_t bytes,
                int64_t limit = kRequestBytes) {
  auto it = open->find(server);
  if (it == open->end() || (*batches)[it->second].bytes + bytes > limit) {
    (*open)[server] = batches->size();
    batches->emplace_back().server = server;
  }
  Batch& b = (*batches)[(*open)[server]];
  b.bytes += bytes;
  return b;
}

// Splits tensors into requests per server of at most limits[server] bytes
// each (or one key); `find` gives a tensor's variable. `exact` pulls
// float32 whatever the variable's pull compression.
absl::StatusOr<std::vector<Shard>> SplitTensors(
    const std::vector<TensorRef>& tensors,
    const std::function<absl::StatusOr<Variable>(const std::string&)>& find,
    const std::vector<int64_t>& limits, bool with_grad, bool with_out, bool exact);

// A table's rows split by the server each id's row lives on (RowShard),
// one set for each of `servers`: the rows at positions which[0..n) of `ids`
// (null `which`: all n), each set's ids and positions in that order and,
// with `grads` (rows of dim), their gradients.
std::vector<std::shared_ptr<RowSet>> SplitRows(const int64_t* ids, const int64_t* which, int64_t n,
                                               const float* grads, int64_t dim, int servers);

// Encodes a gradient for the wire into `out`. One in GPU memory is
// converted on the device, so only the compressed bytes cross to the host.
absl::StatusOr<EncodeInfo> EncodeGradient(const float* grad, int64_t n, v1::DType dtype, char* out);

// Whether a float32 gradient can go out from where it lies (host memory).
bool SendInPlace(const float* grad, v1::DType dtype);

// Decodes pulled weights into `out`, on the host or in GPU memory: one copy
// from the received slices, converted on the way.
absl::Status DecodeWeights(const WireKey& kd, float* out, int64_t n);

// The dtype values travel in: the variable's choice, or the job's.
absl::Status WireDType(Compression c, const std::string& job_default, v1::DType* dtype);

// A table's pulled rows come in its ids' order: each goes where the caller
// listed its id. Float32 is copied once, from the received slices.
void ScatterRows(const WireKey& kd, const RowSet& rows, int64_t dim, float* out);

}  // namespace psrt

#endif  // PSRT_WORKER_REQUEST_CODEC_H_
