// The worker's request codec (worker/request_codec.h): splitting tensors
// into per-server requests, the wire dtype, encoding gradients and decoding
// weights and table rows. Pure functions: no servers.
#include "worker/request_codec.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"

namespace psrt {
namespace {

Partition Part(uint32_t index, int64_t offset, int64_t n, int server) {
  Partition p;
  p.index = index;
  p.offset = offset;
  p.num_elements = n;
  p.server = server;
  return p;
}

// "a": 100 + 100 floats on servers 0 and 1; "b": 300 floats on server 0,
// pulled as fp16.
class SplitTest : public ::testing::Test {
 protected:
  SplitTest() {
    variables_["a"].parts = {Part(0, 0, 100, 0), Part(1, 100, 100, 1)};
    variables_["b"].parts = {Part(0, 0, 300, 0)};
    variables_["b"].pull_dtype = v1::DTYPE_FLOAT16;
  }
  absl::StatusOr<std::vector<Shard>> Split(const std::vector<TensorRef>& tensors,
                                           std::vector<int64_t> limits, bool exact = false) {
    return SplitTensors(
        tensors,
        [this](const std::string& name) -> absl::StatusOr<Variable> {
          auto it = variables_.find(name);
          if (it == variables_.end()) return absl::NotFoundError("no variable '" + name + "'");
          return it->second;
        },
        limits, /*with_grad=*/true, /*with_out=*/true, exact);
  }
  absl::flat_hash_map<std::string, Variable> variables_;
  std::vector<float> a_ = std::vector<float>(200), b_ = std::vector<float>(300);
};

TEST_F(SplitTest, EachServerGetsRequestsOfAtMostItsLimitOrOneKey) {
  absl::StatusOr<std::vector<Shard>> shards =
      Split({{"a", a_.data(), a_.data()}, {"b", b_.data(), b_.data()}}, {1000, 1000});
  ASSERT_TRUE(shards.ok()) << shards.status();
  ASSERT_EQ(shards->size(), 3u);
  // a#0 and a#1 open a request on each server; b#0 (1200 bytes) does not
  // fit beside a#0 (400) and, larger than the limit, goes alone.
  EXPECT_EQ((*shards)[0].server, 0);
  EXPECT_EQ((*shards)[0].bytes, 400);
  ASSERT_EQ((*shards)[0].items.size(), 1u);
  EXPECT_EQ((*shards)[0].items[0].variable, "a");
  EXPECT_EQ((*shards)[0].items[0].grad, a_.data());
  EXPECT_EQ((*shards)[1].server, 1);
  EXPECT_EQ((*shards)[1].items[0].part.offset, 100);
  EXPECT_EQ((*shards)[2].server, 0);
  EXPECT_EQ((*shards)[2].bytes, 1200);
  EXPECT_EQ((*shards)[2].items[0].variable, "b");
  EXPECT_EQ((*shards)[2].items[0].pull_dtype, v1::DTYPE_FLOAT16);
}

TEST_F(SplitTest, KeysShareARequestWithinTheLimit) {
  absl::StatusOr<std::vector<Shard>> shards =
      Split({{"a", a_.data(), a_.data()}, {"b", b_.data(), b_.data()}}, {4 << 20, 4 << 20});
  ASSERT_TRUE(shards.ok()) << shards.status();
  ASSERT_EQ(shards->size(), 2u);
  EXPECT_EQ((*shards)[0].server, 0);
  EXPECT_EQ((*shards)[0].bytes, 1600);
  EXPECT_EQ((*shards)[0].items.size(), 2u);
}

TEST_F(SplitTest, ExactPullsAreFloat32) {
  absl::StatusOr<std::vector<Shard>> shards =
      Split({{"b", b_.data(), b_.data()}}, {4 << 20, 4 << 20}, /*exact=*/true);
  ASSERT_TRUE(shards.ok()) << shards.status();
  EXPECT_EQ((*shards)[0].items[0].pull_dtype, v1::DTYPE_FLOAT32);
}

TEST_F(SplitTest, AnUnknownTensorOrAMissingBufferIsAnError) {
  absl::StatusOr<std::vector<Shard>> unknown = Split({{"c", a_.data(), a_.data()}}, {1000, 1000});
  EXPECT_TRUE(absl::IsNotFound(unknown.status())) << unknown.status();
  absl::StatusOr<std::vector<Shard>> bufferless = Split({{"a", a_.data(), nullptr}}, {1000, 1000});
  EXPECT_TRUE(absl::IsInvalidArgument(bufferless.status())) << bufferless.status();
  EXPECT_NE(bufferless.status().message().find("tensor 'a' has no buffer"), std::string::npos);
  // No gradient buffer: the tensor has no gradient this step (Encode says so).
  absl::StatusOr<std::vector<Shard>> no_gradient = Split({{"a", nullptr, a_.data()}}, {1000, 1000});
  ASSERT_TRUE(no_gradient.ok()) << no_gradient.status();
  EXPECT_EQ((*no_gradient)[0].items[0].grad, nullptr);
}

TEST(WireDTypeTest, AVariablesChoiceOrTheJobs) {
  v1::DType d;
  ASSERT_TRUE(WireDType(Compression::kNone, "fp16", &d).ok());
  EXPECT_EQ(d, v1::DTYPE_FLOAT32);
  ASSERT_TRUE(WireDType(Compression::kBf16, "none", &d).ok());
  EXPECT_EQ(d, v1::DTYPE_BFLOAT16);
  ASSERT_TRUE(WireDType(Compression::kJobDefault, "fp16", &d).ok());
  EXPECT_EQ(d, v1::DTYPE_FLOAT16);
  ASSERT_TRUE(WireDType(Compression::kJobDefault, "", &d).ok());
  EXPECT_EQ(d, v1::DTYPE_FLOAT32);
  EXPECT_FALSE(WireDType(Compression::kJobDefault, "zip", &d).ok());
}

TEST(EncodeDecodeTest, HostGradientsRoundTripInEveryDType) {
  std::vector<float> grad(1000);
  for (size_t i = 0; i < grad.size(); ++i) grad[i] = 0.001f * static_cast<float>(i) - 0.3f;
  EXPECT_TRUE(SendInPlace(grad.data(), v1::DTYPE_FLOAT32));
  EXPECT_FALSE(SendInPlace(grad.data(), v1::DTYPE_FLOAT16));
  for (v1::DType dtype : {v1::DTYPE_FLOAT32, v1::DTYPE_FLOAT16, v1::DTYPE_BFLOAT16}) {
    std::string wire(grad.size() * BytesPerValue(dtype), '\0');
    absl::StatusOr<EncodeInfo> info =
        EncodeGradient(grad.data(), static_cast<int64_t>(grad.size()), dtype, wire.data());
    ASSERT_TRUE(info.ok()) << info.status();
    WireKey kd;
    kd.dtype = dtype;
    kd.scale = info->scale;
    // Two pieces, split inside a value, as received slices may be.
    kd.data.Add(absl::string_view(wire).substr(0, 1001));
    kd.data.Add(absl::string_view(wire).substr(1001));
    std::vector<float> out(grad.size(), -1.0f);
    ASSERT_TRUE(DecodeWeights(kd, out.data(), static_cast<int64_t>(out.size())).ok());
    const float tolerance = dtype == v1::DTYPE_FLOAT32   ? 0.0f
                            : dtype == v1::DTYPE_FLOAT16 ? 1e-3f
                                                         : 4e-3f;
    for (size_t i = 0; i < grad.size(); ++i) {
      ASSERT_NEAR(out[i], grad[i], tolerance) << "dtype " << dtype << ", value " << i;
    }
  }
}

TEST(ScatterRowsTest, RowsGoWhereTheCallerListedTheirIds) {
  // The caller asked for ids {9, 5}; this server holds both and answers in
  // its order {5, 9}: rows land at positions 1 and 0.
  RowSet rows;
  rows.ids = {5, 9};
  rows.at = {1, 0};
  const std::vector<float> answer = {5.0f, 5.5f, 9.0f, 9.5f};  // dim 2
  for (v1::DType dtype : {v1::DTYPE_FLOAT32, v1::DTYPE_FLOAT16}) {
    std::string wire(answer.size() * BytesPerValue(dtype), '\0');
    const EncodeInfo info = EncodeValues(answer.data(), 4, dtype, wire.data());
    WireKey kd;
    kd.dtype = dtype;
    kd.scale = info.scale;
    kd.data.Add(absl::string_view(wire).substr(0, 3));  // a row split across pieces
    kd.data.Add(absl::string_view(wire).substr(3));
    std::vector<float> out(4, 0.0f);
    ScatterRows(kd, rows, 2, out.data());
    EXPECT_EQ(out, (std::vector<float>{9.0f, 9.5f, 5.0f, 5.5f})) << "dtype " << dtype;
  }
}

}  // namespace
}  // namespace psrt
