#ifndef PSRT_COMMON_TENSOR_CODING_H_
#define PSRT_COMMON_TENSOR_CODING_H_

// The data path's wire module, shared by client and server: pushes, pulls
// and their answers as gRPC byte buffers in the psrt.v1 protobuf format,
// written and read without a protobuf message in between.
//
// Writing: the protobuf framing of each psrt.v1.KeyData is written by hand
// into a small header slice, and its values go out as a slice of their own
// that points at the caller's tensor or a pooled buffer (never copied into a
// std::string, then again into the message). Reading: a received message is
// parsed into WireKeys whose `data` are pieces of the received slices, so a
// value is copied once, from the network's buffers into its destination
// (an accumulation buffer, a caller's tensor), converted from fp16/bf16 on
// the way. Any protobuf client or server of proto/psrt/v1 reads and writes
// the same bytes.

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/buffer_pool.h"
#include "psrt/v1/ps.pb.h"

namespace psrt {

// Bytes of a received message that belong to one field: pieces of its
// slices, in order, without a copy.
class Payload {
 public:
  int64_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  const std::vector<absl::string_view>& pieces() const { return pieces_; }
  void Add(absl::string_view piece) {
    if (piece.empty()) return;
    pieces_.push_back(piece);
    size_ += static_cast<int64_t>(piece.size());
  }
  void Clear() {
    pieces_.clear();
    size_ = 0;
  }
  // The bytes in one string (for tests and small fields).
  std::string ToString() const;

 private:
  std::vector<absl::string_view> pieces_;
  int64_t size_ = 0;
};

// Decodes `p` (values of `dtype`, `scale` as in common/compression.h) into
// `out`, or adds them to it, one piece at a time: no gather copy first. A
// value split between two pieces is joined. The caller has checked that
// p.size() is a whole number of values.
void DecodePayload(const Payload& p, v1::DType dtype, float scale, float* out, bool accumulate);

// psrt.v1.SharedSpan: values in a worker's shared-memory region.
struct SharedSpan {
  uint64_t region = 0;
  int64_t offset = 0;
  int64_t size = 0;
  int64_t capacity = 0;
};

// One psrt.v1.KeyData as received; `data` points into the message's slices.
struct WireKey {
  std::string variable;
  uint32_t partition = 0;
  int64_t version = 0;
  v1::DType dtype = v1::DTYPE_UNSPECIFIED;
  Payload data;
  float scale = 0;
  bool nonfinite = false;
  bool no_gradient = false;  // psrt.v1.KeyData.no_gradient
  v1::DType pull_dtype = v1::DTYPE_UNSPECIFIED;
  bool has_shared = false;
  SharedSpan shared;
  // Sparse tables: the rows' ids (psrt.v1.KeyData.ids), copied out of the
  // message (they are small next to the rows).
  std::vector<int64_t> ids;
  // Where shared.offset lies in this process's mapping of the region, once
  // the receiver has checked the span (the server for requests: a push's
  // values, a pull's room for its answer).
  char* shared_at = nullptr;

  // Back to an empty key, keeping the name's and the pieces' storage.
  void Reset() {
    variable.clear();
    data.Clear();
    ids.clear();
    partition = 0;
    version = 0;
    dtype = pull_dtype = v1::DTYPE_UNSPECIFIED;
    scale = 0;
    nonfinite = no_gradient = has_shared = false;
    shared = SharedSpan();
    shared_at = nullptr;
  }
};

// A received PushRequest, PullRequest, PushPullRequest (its push),
// PullResponse or PushPullResponse. It holds references to the received
// slices, so the keys' data stay valid while it lives.
struct WireMessage {
  int32_t worker_rank = 0;
  uint64_t push_id = 0;
  std::vector<int32_t> also_for;  // PushRequest.also_for
  bool assign_rows = false;       // PushRequest.assign_rows
  std::vector<WireKey> keys;
  std::vector<grpc::Slice> slices;
};

// Parse what the named message holds. A buffer that is not a valid message
// of that type is INVALID_ARGUMENT, naming the type and where it broke.
absl::Status ParsePushRequest(const grpc::ByteBuffer& in, WireMessage* out);
absl::Status ParsePullRequest(const grpc::ByteBuffer& in, WireMessage* out);
absl::Status ParsePushPullRequest(const grpc::ByteBuffer& in, WireMessage* out);
// PullResponse and PushPullResponse (the same layout).
absl::Status ParseKeysResponse(const grpc::ByteBuffer& in, WireMessage* out);

// One key to send. Its values are `size` bytes at `data`: borrowed (the
// caller keeps them alive until the call has ended) when `owner` is empty,
// else held by `owner` for as long as gRPC needs them.
struct OutKey {
  absl::string_view variable;
  uint32_t partition = 0;
  int64_t version = 0;
  v1::DType dtype = v1::DTYPE_UNSPECIFIED;
  float scale = 0;
  bool nonfinite = false;
  bool no_gradient = false;  // a push's: psrt.v1.KeyData.no_gradient
  v1::DType pull_dtype = v1::DTYPE_UNSPECIFIED;
  const char* data = nullptr;
  int64_t size = 0;
  BufferRef owner;
  // Sends `shared` instead of the values (which are already in the region:
  // size bytes at offset, or room for an answer).
  bool has_shared = false;
  SharedSpan shared;
  // Sparse tables: the rows' ids, borrowed like `data`.
  const int64_t* ids = nullptr;
  int64_t num_ids = 0;
};

// `also_for`, `assign_rows`: PushRequest's.
grpc::ByteBuffer EncodePushRequest(int32_t worker_rank, uint64_t push_id,
                                   absl::Span<const OutKey> keys,
                                   absl::Span<const int32_t> also_for = {},
                                   bool assign_rows = false);
grpc::ByteBuffer EncodePushPullRequest(int32_t worker_rank, uint64_t push_id,
                                       absl::Span<const OutKey> keys,
                                       absl::Span<const int32_t> also_for = {});
grpc::ByteBuffer EncodePullRequest(int32_t worker_rank, absl::Span<const OutKey> keys);
// A PullResponse or PushPullResponse.
grpc::ByteBuffer EncodeKeysResponse(absl::Span<const OutKey> keys);

}  // namespace psrt

#endif  // PSRT_COMMON_TENSOR_CODING_H_
