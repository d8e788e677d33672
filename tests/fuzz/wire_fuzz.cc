// The data path's hand-written protobuf parser (common/tensor_coding.h)
// against protobuf itself, on arbitrary bytes cut into arbitrary slices: it
// must never accept what protobuf refuses, and when both accept they must
// read the same fields.

#include <grpc/grpc.h>
#include <grpcpp/support/byte_buffer.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/tensor_coding.h"
#include "psrt/v1/ps.pb.h"
#include "tests/fuzz/calls.h"

namespace psrt {
namespace {

grpc::ByteBuffer Sliced(const uint8_t* data, size_t size) {
  // Cuts at places the bytes themselves choose: values split everywhere.
  std::vector<grpc::Slice> slices;
  size_t at = 0;
  for (size_t i = 0; at < size && slices.size() < 8; ++i) {
    const size_t n = std::min<size_t>(size - at, 1 + data[(i * 7) % size] % 23);
    slices.emplace_back(data + at, n);
    at += n;
  }
  if (at < size) slices.emplace_back(data + at, size - at);
  return grpc::ByteBuffer(slices.data(), slices.size());
}

// Aborts (the fuzzer's finding) naming the check that failed.
#define Check(same)                                              \
  do {                                                           \
    if (!(same)) {                                               \
      std::fprintf(stderr, "wire_fuzz: %s differs\n", #same);    \
      std::abort();                                              \
    }                                                            \
  } while (0)

void SameKey(const v1::KeyData& pb, const WireKey& w) {
  Check(pb.variable() == w.variable);
  Check(pb.partition() == w.partition);
  Check(pb.version() == w.version);
  Check(pb.dtype() == w.dtype);
  Check(pb.pull_dtype() == w.pull_dtype);
  Check(pb.nonfinite() == w.nonfinite);
  Check(pb.data() == w.data.ToString());
  const float scale = pb.scale();
  Check(std::memcmp(&scale, &w.scale, 4) == 0);
  Check(std::vector<int64_t>(pb.ids().begin(), pb.ids().end()) == w.ids);
  Check(pb.has_shared() == w.has_shared);
  if (w.has_shared) {
    Check(pb.shared().region() == w.shared.region);
    Check(pb.shared().offset() == w.shared.offset);
    Check(pb.shared().size() == w.shared.size);
    Check(pb.shared().capacity() == w.shared.capacity);
  }
}

template <typename Message>
void SameKeys(const Message& pb, const WireMessage& w) {
  Check(static_cast<size_t>(pb.keys_size()) == w.keys.size());
  for (int i = 0; i < pb.keys_size(); ++i) SameKey(pb.keys(i), w.keys[i]);
}

}  // namespace
}  // namespace psrt

using namespace psrt;  // NOLINT

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  grpc_init();
  fuzz::QuietLogs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  WireMessage w;
  {
    v1::PushRequest pb;
    const bool pb_ok = pb.ParseFromArray(data, static_cast<int>(size));
    const bool ok = ParsePushRequest(Sliced(data, size), &w).ok();
    Check(pb_ok || !ok || !"PushRequest: accepted what protobuf refuses");
    if (pb_ok && ok) {
      Check(pb.worker_rank() == w.worker_rank && pb.push_id() == w.push_id);
      Check(std::equal(pb.also_for().begin(), pb.also_for().end(), w.also_for.begin(),
                       w.also_for.end()));
      SameKeys(pb, w);
    }
  }
  {
    v1::PullRequest pb;
    const bool pb_ok = pb.ParseFromArray(data, static_cast<int>(size));
    const bool ok = ParsePullRequest(Sliced(data, size), &w).ok();
    Check(pb_ok || !ok || !"PullRequest: accepted what protobuf refuses");
    if (pb_ok && ok) {
      Check(pb.worker_rank() == w.worker_rank);
      SameKeys(pb, w);
    }
  }
  {
    v1::PushPullRequest pb;
    const bool pb_ok = pb.ParseFromArray(data, static_cast<int>(size));
    const bool ok = ParsePushPullRequest(Sliced(data, size), &w).ok();
    Check(pb_ok || !ok || !"PushPullRequest: accepted what protobuf refuses");
    if (pb_ok && ok) {
      Check(pb.push().worker_rank() == w.worker_rank && pb.push().push_id() == w.push_id);
      Check(std::equal(pb.push().also_for().begin(), pb.push().also_for().end(), w.also_for.begin(),
                       w.also_for.end()));
      SameKeys(pb.push(), w);
    }
  }
  {
    v1::PullResponse pb;
    const bool pb_ok = pb.ParseFromArray(data, static_cast<int>(size));
    const bool ok = ParseKeysResponse(Sliced(data, size), &w).ok();
    Check(pb_ok || !ok || !"PullResponse: accepted what protobuf refuses");
    if (pb_ok && ok) SameKeys(pb, w);
  }
  return 0;
}
