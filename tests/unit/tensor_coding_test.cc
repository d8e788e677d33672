// The data path's wire module: what it writes is what protobuf reads and
// the other way round, at odd sizes, in every dtype, whatever slices a
// message arrives in; values go out without a copy and come in with one.
#include "common/tensor_coding.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/compression.h"
#include "psrt/v1/ps.pb.h"

namespace psrt {
namespace {

std::string Flatten(const grpc::ByteBuffer& bb) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(bb.Dump(&slices).ok());
  std::string out;
  for (const grpc::Slice& s : slices)
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

// `bytes` as a byte buffer cut into slices at the given sizes (the rest in
// one last slice), as gRPC hands over a message read in pieces.
grpc::ByteBuffer Sliced(const std::string& bytes, const std::vector<size_t>& cuts) {
  std::vector<grpc::Slice> slices;
  size_t at = 0;
  for (size_t n : cuts) {
    n = std::min(n, bytes.size() - at);
    slices.emplace_back(bytes.data() + at, n);
    at += n;
  }
  slices.emplace_back(bytes.data() + at, bytes.size() - at);
  return grpc::ByteBuffer(slices.data(), slices.size());
}

// Random cuts of 1..17 bytes: values and varints split everywhere.
std::vector<size_t> RandomCuts(size_t total, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<size_t> cuts;
  for (size_t at = 0; at < total;) {
    const size_t n = 1 + rng() % 17;
    cuts.push_back(n);
    at += n;
  }
  return cuts;
}

std::vector<float> Values(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0, 3);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

const v1::DType kDTypes[] = {v1::DTYPE_FLOAT32, v1::DTYPE_FLOAT16, v1::DTYPE_BFLOAT16};
const int64_t kSizes[] = {1, 3, 7, 1023, 4097, 65537};

TEST(TensorCodingTest, PushRoundTripsThroughProtobufAtOddSizesInEveryDType) {
  for (v1::DType dtype : kDTypes) {
    for (int64_t n : kSizes) {
      SCOPED_TRACE(testing::Message() << "dtype " << dtype << ", " << n << " values");
      const std::vector<float> a = Values(n, 1), b = Values(n + 2, 2);
      std::string ea, eb;
      const EncodeInfo ia = EncodeValues(a.data(), n, dtype, &ea);
      EncodeValues(b.data(), n + 2, dtype, &eb);
      std::vector<OutKey> keys(2);
      keys[0].variable = "layer.weight";
      keys[0].partition = 7;
      keys[0].version = 41;
      keys[0].dtype = dtype;
      keys[0].scale = ia.scale == 1 ? 0 : ia.scale;
      keys[0].pull_dtype = v1::DTYPE_BFLOAT16;
      keys[0].data = ea.data();
      keys[0].size = static_cast<int64_t>(ea.size());
      keys[1].variable = "b";
      keys[1].version = -1;  // protobuf's ten-byte varint
      keys[1].dtype = dtype;
      keys[1].nonfinite = true;
      keys[1].data = eb.data();
      keys[1].size = static_cast<int64_t>(eb.size());
      const std::string wire = Flatten(EncodePushRequest(3, 1ull << 60, keys));

      // Protobuf reads what we wrote...
      v1::PushRequest pb;
      ASSERT_TRUE(pb.ParseFromString(wire));
      EXPECT_EQ(pb.worker_rank(), 3);
      EXPECT_EQ(pb.push_id(), 1ull << 60);
      ASSERT_EQ(pb.keys_size(), 2);
      EXPECT_EQ(pb.keys(0).variable(), "layer.weight");
      EXPECT_EQ(pb.keys(0).partition(), 7u);
      EXPECT_EQ(pb.keys(0).version(), 41);
      EXPECT_EQ(pb.keys(0).dtype(), dtype);
      EXPECT_EQ(pb.keys(0).scale(), keys[0].scale);
      EXPECT_EQ(pb.keys(0).pull_dtype(), v1::DTYPE_BFLOAT16);
      EXPECT_EQ(pb.keys(0).data(), ea);
      EXPECT_EQ(pb.keys(1).version(), -1);
      EXPECT_TRUE(pb.keys(1).nonfinite());
      EXPECT_EQ(pb.keys(1).data(), eb);
      // ...with the same bytes protobuf itself would write, but for field
      // order (data goes last, after the small fields).
      EXPECT_EQ(wire.size(), pb.ByteSizeLong());

      // ...and we read what protobuf wrote, cut into slices anywhere.
      const std::string theirs = pb.SerializeAsString();
      WireMessage got;
      ASSERT_TRUE(ParsePushRequest(Sliced(theirs, RandomCuts(theirs.size(), n)), &got).ok());
      EXPECT_EQ(got.worker_rank, 3);
      EXPECT_EQ(got.push_id, 1ull << 60);
      ASSERT_EQ(got.keys.size(), 2u);
      EXPECT_EQ(got.keys[0].variable, "layer.weight");
      EXPECT_EQ(got.keys[0].partition, 7u);
      EXPECT_EQ(got.keys[0].version, 41);
      EXPECT_EQ(got.keys[0].dtype, dtype);
      EXPECT_EQ(got.keys[0].pull_dtype, v1::DTYPE_BFLOAT16);
      EXPECT_EQ(got.keys[0].scale, keys[0].scale);
      EXPECT_EQ(got.keys[1].version, -1);
      EXPECT_TRUE(got.keys[1].nonfinite);
      EXPECT_EQ(got.keys[0].data.ToString(), ea);
      EXPECT_EQ(got.keys[1].data.ToString(), eb);

      // Decoded piece by piece, the values are those of a contiguous decode.
      std::vector<float> want(n), have(n);
      DecodeValues(ea, dtype, keys[0].scale, want.data(), n, false);
      DecodePayload(got.keys[0].data, dtype, got.keys[0].scale, have.data(), false);
      EXPECT_EQ(std::memcmp(want.data(), have.data(), n * 4), 0);
      // And summed into an accumulation buffer the same way.
      DecodeValues(ea, dtype, keys[0].scale, want.data(), n, true);
      DecodePayload(got.keys[0].data, dtype, got.keys[0].scale, have.data(), true);
      EXPECT_EQ(std::memcmp(want.data(), have.data(), n * 4), 0);
    }
  }
}

TEST(TensorCodingTest, PullPushPullAndResponsesMatchProtobuf) {
  const std::vector<float> w = Values(1001, 3);
  std::vector<OutKey> keys(2);
  keys[0].variable = "w";
  keys[0].partition = 1;
  keys[0].version = 9;
  keys[0].dtype = v1::DTYPE_FLOAT16;
  keys[1].variable = "v";
  keys[1].version = 0;

  v1::PullRequest pull;
  ASSERT_TRUE(pull.ParseFromString(Flatten(EncodePullRequest(5, keys))));
  EXPECT_EQ(pull.worker_rank(), 5);
  ASSERT_EQ(pull.keys_size(), 2);
  EXPECT_EQ(pull.keys(0).variable(), "w");
  EXPECT_EQ(pull.keys(0).dtype(), v1::DTYPE_FLOAT16);
  EXPECT_TRUE(pull.keys(0).data().empty());
  WireMessage got;
  const std::string pull_bytes = pull.SerializeAsString();
  ASSERT_TRUE(ParsePullRequest(Sliced(pull_bytes, {1, 2, 3}), &got).ok());
  EXPECT_EQ(got.worker_rank, 5);
  ASSERT_EQ(got.keys.size(), 2u);
  EXPECT_EQ(got.keys[1].variable, "v");
  EXPECT_TRUE(got.keys[0].data.empty());

  keys[0].data = reinterpret_cast<const char*>(w.data());
  keys[0].size = 1001 * 4;
  keys[0].dtype = v1::DTYPE_FLOAT32;
  v1::PushPullRequest pp;
  ASSERT_TRUE(pp.ParseFromString(Flatten(EncodePushPullRequest(1, 77, keys))));
  EXPECT_EQ(pp.push().worker_rank(), 1);
  EXPECT_EQ(pp.push().push_id(), 77u);
  ASSERT_EQ(pp.push().keys_size(), 2);
  EXPECT_EQ(pp.push().keys(0).data(), std::string(keys[0].data, keys[0].size));
  const std::string pp_bytes = pp.SerializeAsString();
  ASSERT_TRUE(ParsePushPullRequest(Sliced(pp_bytes, RandomCuts(pp_bytes.size(), 9)), &got).ok());
  EXPECT_EQ(got.worker_rank, 1);
  EXPECT_EQ(got.push_id, 77u);
  ASSERT_EQ(got.keys.size(), 2u);
  EXPECT_EQ(got.keys[0].data.ToString(), pp.push().keys(0).data());

  v1::PullResponse resp;
  ASSERT_TRUE(resp.ParseFromString(Flatten(EncodeKeysResponse(keys))));
  ASSERT_EQ(resp.keys_size(), 2);
  EXPECT_EQ(resp.keys(0).version(), 9);
  EXPECT_EQ(resp.keys(0).data(), pp.push().keys(0).data());
  const std::string resp_bytes = resp.SerializeAsString();
  ASSERT_TRUE(ParseKeysResponse(Sliced(resp_bytes, RandomCuts(resp_bytes.size(), 4)), &got).ok());
  ASSERT_EQ(got.keys.size(), 2u);
  EXPECT_EQ(got.keys[0].version, 9);
  std::vector<float> back(1001);
  DecodePayload(got.keys[0].data, v1::DTYPE_FLOAT32, 0, back.data(), false);
  EXPECT_EQ(back, w);
}

// A table's ids travel as packed sfixed64 (the caller's int64s, borrowed):
// protobuf reads what we write, we read what protobuf writes, packed or
// not, whatever slices they come in; a run of bytes that is not whole
// int64s is refused as protobuf refuses it.
TEST(TensorCodingTest, TableIdsMatchProtobuf) {
  const std::vector<int64_t> ids = {0, -1, 7, int64_t{1} << 62, INT64_MIN, 123456789};
  const std::vector<float> rows = Values(static_cast<int64_t>(ids.size()) * 3, 5);
  OutKey key;
  key.variable = "table";
  key.partition = 1;
  key.dtype = v1::DTYPE_FLOAT32;
  key.data = reinterpret_cast<const char*>(rows.data());
  key.size = static_cast<int64_t>(rows.size()) * 4;
  key.ids = ids.data();
  key.num_ids = static_cast<int64_t>(ids.size());
  v1::PushRequest pb;
  ASSERT_TRUE(pb.ParseFromString(Flatten(EncodePushRequest(0, 1, {key}))));
  ASSERT_EQ(pb.keys_size(), 1);
  EXPECT_EQ(std::vector<int64_t>(pb.keys(0).ids().begin(), pb.keys(0).ids().end()), ids);
  EXPECT_EQ(pb.keys(0).data(), std::string(key.data, key.size));
  const std::string bytes = pb.SerializeAsString();
  EXPECT_EQ(Flatten(EncodePushRequest(0, 1, {key})).size(), bytes.size());
  WireMessage got;
  ASSERT_TRUE(ParsePushRequest(Sliced(bytes, RandomCuts(bytes.size(), 11)), &got).ok());
  EXPECT_EQ(got.keys[0].ids, ids);
  // Unpacked (each id its own fixed64 field), as protobuf also accepts.
  std::string unpacked;
  for (int64_t id : ids) {
    unpacked += '\x51';  // field 10, wire type 1
    unpacked.append(reinterpret_cast<const char*>(&id), 8);
  }
  v1::PullRequest pull;
  pull.add_keys()->set_variable("table");
  std::string pull_bytes = pull.SerializeAsString();
  pull_bytes[1] = static_cast<char>(pull_bytes[1] + unpacked.size());  // the key's length
  pull_bytes += unpacked;
  ASSERT_TRUE(pull.ParseFromString(pull_bytes));
  ASSERT_EQ(pull.keys(0).ids_size(), static_cast<int>(ids.size()));
  ASSERT_TRUE(ParsePullRequest(Sliced(pull_bytes, {3}), &got).ok());
  EXPECT_EQ(got.keys[0].ids, ids);
  // 7 bytes of ids: not whole int64s.
  const std::string broken = std::string("\x12\x09\x52\x07", 4) + std::string(7, '\0');
  EXPECT_FALSE(v1::PullRequest().ParseFromString(broken));
  EXPECT_EQ(ParsePullRequest(Sliced(broken, {}), &got).code(), absl::StatusCode::kInvalidArgument);
}

// Fields a newer peer adds are skipped, as protobuf does.
TEST(TensorCodingTest, AlsoForMatchesProtobufPackedAndNot) {
  const std::vector<float> w = Values(5, 3);
  OutKey key;
  key.variable = "w";
  key.data = reinterpret_cast<const char*>(w.data());
  key.size = 5 * 4;
  key.dtype = v1::DTYPE_FLOAT32;
  const std::vector<int32_t> also_for = {0, 2, 7};
  v1::PushRequest pb;
  ASSERT_TRUE(pb.ParseFromString(Flatten(EncodePushRequest(3, 9, {key}, also_for))));
  EXPECT_EQ(std::vector<int32_t>(pb.also_for().begin(), pb.also_for().end()), also_for);
  // Protobuf writes it packed; ours is unpacked: both parse.
  const std::string packed = pb.SerializeAsString();
  WireMessage got;
  ASSERT_TRUE(ParsePushRequest(Sliced(packed, RandomCuts(packed.size(), 4)), &got).ok());
  EXPECT_EQ(got.also_for, also_for);
  EXPECT_EQ(got.worker_rank, 3);
  EXPECT_FALSE(got.assign_rows);
  ASSERT_TRUE(
      ParsePushRequest(EncodePushRequest(3, 9, {key}, {}, /*assign_rows=*/true), &got).ok());
  EXPECT_TRUE(got.assign_rows);
  ASSERT_TRUE(pb.ParseFromString(Flatten(EncodePushRequest(3, 9, {key}, {}, true))));
  EXPECT_TRUE(pb.assign_rows());
  ASSERT_TRUE(ParsePushRequest(EncodePushRequest(3, 9, {key}), &got).ok());
  EXPECT_TRUE(got.also_for.empty());  // a reused message starts empty
  EXPECT_FALSE(got.assign_rows);
  v1::PushPullRequest pp;
  ASSERT_TRUE(pp.ParseFromString(Flatten(EncodePushPullRequest(3, 9, {key}, also_for))));
  EXPECT_EQ(pp.push().also_for_size(), 3);
  const std::string pp_bytes = pp.SerializeAsString();
  ASSERT_TRUE(ParsePushPullRequest(Sliced(pp_bytes, {3}), &got).ok());
  EXPECT_EQ(got.also_for, also_for);
  // A pull has no such field: field 4 is skipped there.
  ASSERT_TRUE(ParsePullRequest(Sliced(packed, {}), &got).ok());
  EXPECT_TRUE(got.also_for.empty());
  // A packed run cut inside a value is refused, as protobuf refuses it.
  const std::string cut = std::string("\x22\x02\x05\x80", 4);
  EXPECT_FALSE(pb.ParseFromString(cut));
  EXPECT_EQ(ParsePushRequest(Sliced(cut, {}), &got).code(), absl::StatusCode::kInvalidArgument);
}

TEST(TensorCodingTest, UnknownFieldsAreSkipped) {
  v1::PushRequest pb;
  pb.set_worker_rank(2);
  v1::KeyData* k = pb.add_keys();
  k->set_variable("w");
  k->set_data(std::string(8, '\1'));
  std::string bytes = pb.SerializeAsString();
  // Field 99 as a varint, a fixed64 and a length-delimited one, at the top.
  bytes += std::string("\x98\x06\x05", 3);
  bytes += std::string("\x99\x06", 2) + std::string(8, 'x');
  bytes += std::string("\x9a\x06\x03", 3) + "abc";
  ASSERT_TRUE(v1::PushRequest().ParseFromString(bytes));
  WireMessage got;
  ASSERT_TRUE(ParsePushRequest(Sliced(bytes, {5}), &got).ok());
  EXPECT_EQ(got.worker_rank, 2);
  ASSERT_EQ(got.keys.size(), 1u);
  EXPECT_EQ(got.keys[0].data.size(), 8);
}

// Every truncation of a valid message is refused exactly when protobuf
// refuses it, with INVALID_ARGUMENT naming the message type.
TEST(TensorCodingTest, TruncatedMessagesAreRefusedAsProtobufRefusesThem) {
  v1::PushRequest pb;
  pb.set_worker_rank(1);
  pb.set_push_id(300);
  for (int i = 0; i < 2; ++i) {
    v1::KeyData* k = pb.add_keys();
    k->set_variable(i == 0 ? "alpha" : "beta");
    k->set_partition(i);
    k->set_version(1000);
    k->set_dtype(v1::DTYPE_FLOAT16);
    k->set_scale(0.5f);
    k->set_data(std::string(6, static_cast<char>(i)));
  }
  const std::string bytes = pb.SerializeAsString();
  for (size_t len = 0; len < bytes.size(); ++len) {
    SCOPED_TRACE(testing::Message() << "first " << len << " bytes");
    const std::string cut = bytes.substr(0, len);
    const bool protobuf_ok = v1::PushRequest().ParseFromString(cut);
    WireMessage got;
    const absl::Status s = ParsePushRequest(Sliced(cut, {len / 2}), &got);
    EXPECT_EQ(s.ok(), protobuf_ok) << s;
    if (!s.ok()) {
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
      EXPECT_NE(s.message().find("psrt.v1.PushRequest"), std::string::npos) << s;
    }
  }
  WireMessage got;
  EXPECT_EQ(ParsePushRequest(Sliced(std::string("\x1a\xff\xff\xff\xff\x0f", 6), {}), &got).code(),
            absl::StatusCode::kInvalidArgument);  // a length past the end
  EXPECT_EQ(ParsePushRequest(Sliced(std::string("\x0b", 1), {}), &got).code(),
            absl::StatusCode::kInvalidArgument);  // a group: no psrt.v1 message
                                                  // has one
}

// Float32 values go out as a slice of the caller's memory; pooled ones keep
// their block until gRPC lets go of the message, then it is reused.
TEST(TensorCodingTest, ValuesGoOutWithoutACopy) {
  const std::vector<float> grad = Values(4096, 5);
  BufferPool pool;
  {
    std::vector<OutKey> keys(2);
    keys[0].variable = "g";
    keys[0].dtype = v1::DTYPE_FLOAT32;
    keys[0].data = reinterpret_cast<const char*>(grad.data());
    keys[0].size = 4096 * 4;
    keys[1].variable = "h";
    keys[1].dtype = v1::DTYPE_FLOAT16;
    keys[1].owner = pool.Get(4096 * 2);
    keys[1].data = keys[1].owner.data();
    keys[1].size = 4096 * 2;
    EncodeValues(grad.data(), 4096, v1::DTYPE_FLOAT16, keys[1].owner.data());
    grpc::ByteBuffer bb = EncodePushRequest(0, 1, keys);
    const char* pooled = keys[1].data;
    keys.clear();  // only the message holds the pooled block now
    std::vector<grpc::Slice> slices;
    ASSERT_TRUE(bb.Dump(&slices).ok());
    bool borrowed = false;
    for (const grpc::Slice& s : slices) {
      borrowed |=
          s.begin() == reinterpret_cast<const uint8_t*>(grad.data()) && s.size() == 4096 * 4;
    }
    EXPECT_TRUE(borrowed) << "the float32 gradient was copied into the message";
    EXPECT_NE(pool.Get(4096 * 2).data(), pooled) << "the message's block came back while in use";
    EXPECT_EQ(pool.blocks_made(), 2);
  }
  for (int i = 0; i < 100; ++i) pool.Get(4096 * 2);
  EXPECT_EQ(pool.blocks_made(), 2) << "blocks are made anew instead of reused";
}

}  // namespace
}  // namespace psrt
