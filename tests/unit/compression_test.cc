#include "common/compression.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

namespace psrt {
namespace {

std::vector<float> RoundTrip(const std::vector<float>& in, v1::DType dtype, EncodeInfo* info) {
  std::string bytes;
  *info = EncodeValues(in.data(), in.size(), dtype, &bytes);
  EXPECT_EQ(bytes.size(), in.size() * BytesPerValue(dtype));
  std::vector<float> out(in.size(), -7.f);
  DecodeValues(bytes, dtype, info->scale, out.data(), out.size(), false);
  return out;
}

TEST(CompressionTest, Fp16ScaleIsOneInRangeAndAPowerOfTwoOutside) {
  EXPECT_EQ(Fp16Scale(1.f), 1.f);
  EXPECT_EQ(Fp16Scale(30000.f), 1.f);
  EXPECT_EQ(Fp16Scale(0.f), 1.f);
  EXPECT_EQ(Fp16Scale(std::numeric_limits<float>::infinity()), 1.f);
  EXPECT_EQ(Fp16Scale(std::nanf("")), 1.f);
  EXPECT_EQ(Fp16Scale(1e6f), 0x1p-6f);    // 1e6 in [2^19, 2^20): to [2^13, 2^14)
  EXPECT_EQ(Fp16Scale(1e-6f), 0x1p33f);   // 1e-6 in [2^-20, 2^-19)
  for (float m : {40000.f, 1e10f, 1e-5f, 1e-30f}) {
    const float scaled = m * Fp16Scale(m);
    EXPECT_GE(scaled, 8192.f) << m;
    EXPECT_LT(scaled, 16384.f) << m;
  }
}

TEST(CompressionTest, Fp16KeepsValuesBeyondItsRangeFiniteAndPrecise) {
  // 1e6 overflows fp16 (max 65504) and 1e-9 underflows it: the scale saves
  // both, to fp16's relative precision (2^-11).
  for (float base : {1e6f, 3e4f, 1.f, 1e-9f}) {
    std::vector<float> in = {base, -base / 3, base / 7, 0.f, base * 0.999f};
    EncodeInfo info;
    std::vector<float> out = RoundTrip(in, v1::DTYPE_FLOAT16, &info);
    EXPECT_FALSE(info.nonfinite);
    for (size_t i = 0; i < in.size(); ++i) {
      EXPECT_TRUE(std::isfinite(out[i])) << base;
      EXPECT_NEAR(out[i], in[i], std::abs(in[i]) * 0x1p-11f) << base << " [" << i << "]";
    }
  }
}

TEST(CompressionTest, NonFiniteValuesAreFlaggedAndKept) {
  for (v1::DType dtype : {v1::DTYPE_FLOAT16, v1::DTYPE_BFLOAT16}) {
    std::vector<float> in = {1.f, std::numeric_limits<float>::infinity(), std::nanf(""), -2.f};
    EncodeInfo info;
    std::vector<float> out = RoundTrip(in, dtype, &info);
    EXPECT_TRUE(info.nonfinite);
    EXPECT_EQ(info.scale, 1.f);
    EXPECT_EQ(out[0], 1.f);
    EXPECT_TRUE(std::isinf(out[1]));
    EXPECT_TRUE(std::isnan(out[2]));
    EXPECT_EQ(out[3], -2.f);
  }
}

TEST(CompressionTest, Bf16HasFloat32sRangeAndEightBitsOfPrecision) {
  std::vector<float> in = {1e30f, -1e-30f, 3.14159f, 65504.f * 4};
  EncodeInfo info;
  std::vector<float> out = RoundTrip(in, v1::DTYPE_BFLOAT16, &info);
  EXPECT_EQ(info.scale, 1.f);
  for (size_t i = 0; i < in.size(); ++i) EXPECT_NEAR(out[i], in[i], std::abs(in[i]) * 0x1p-8f) << i;
}

TEST(CompressionTest, DecodeAccumulatesWithTheScale) {
  std::vector<float> in = {1e6f, 2e6f};
  std::string bytes;
  const EncodeInfo info = EncodeValues(in.data(), 2, v1::DTYPE_FLOAT16, &bytes);
  std::vector<float> acc = {1.f, 2.f};
  DecodeValues(bytes, v1::DTYPE_FLOAT16, info.scale, acc.data(), 2, true);
  EXPECT_NEAR(acc[0], 1e6f + 1, 1e6f * 0x1p-11f);
  EXPECT_NEAR(acc[1], 2e6f + 2, 2e6f * 0x1p-11f);
  std::vector<float> f32 = {0.5f, 0.25f};
  std::string raw;
  EncodeValues(f32.data(), 2, v1::DTYPE_FLOAT32, &raw);
  DecodeValues(raw, v1::DTYPE_FLOAT32, 0, acc.data(), 2, true);
  EXPECT_NEAR(acc[0], 1e6f + 1.5f, 1e6f * 0x1p-11f);
}

TEST(CompressionTest, ParseCompression) {
  v1::DType d;
  ASSERT_TRUE(ParseCompression("fp16", &d).ok());
  EXPECT_EQ(d, v1::DTYPE_FLOAT16);
  ASSERT_TRUE(ParseCompression("bf16", &d).ok());
  EXPECT_EQ(d, v1::DTYPE_BFLOAT16);
  ASSERT_TRUE(ParseCompression("none", &d).ok());
  EXPECT_EQ(d, v1::DTYPE_FLOAT32);
  absl::Status s = ParseCompression("int8", &d);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("accepted: none, fp16, bf16"), std::string::npos);
}

}  // namespace
}  // namespace psrt
