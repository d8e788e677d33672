// Tests of kernels/convert.h, kernels/isa.h and the per-ISA optimizer kernels.
//
// The scalar conversions are checked against independent references (an
// ldexp decode of all 65536 fp16 values, a nearest-neighbour search for
// rounding); every SIMD path is then compared bit for bit with the scalar
// path. Paths the CPU lacks are skipped (GTEST_SKIP), not passed.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/convert.h"
#include "kernels/isa.h"
#include "kernels/optimizer.h"
#include "kernels/optimizer_internal.h"

namespace psrt {
namespace {

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

bool IsHalfNan(uint16_t h) { return (h & 0x7C00) == 0x7C00 && (h & 0x3FF); }
bool IsBf16Nan(uint16_t b) { return (b & 0x7F80) == 0x7F80 && (b & 0x7F); }

std::string Hex(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

// --- ISA selection
// -------------------------------------------------------------

TEST(Isa, NamesAndLevels) {
  EXPECT_STREQ(IsaName(Isa::kScalar), "scalar");
  EXPECT_STREQ(IsaName(Isa::kAvx2), "avx2");
  EXPECT_STREQ(IsaName(Isa::kAvx512), "avx512");
  EXPECT_LE(DetectIsa(), CpuIsa());
  EXPECT_TRUE(IsaSupported(Isa::kScalar));
  EXPECT_TRUE(IsaSupported(CpuIsa()));
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    EXPECT_EQ(ConvertKernelsFor(isa).isa, isa) << IsaName(isa);
    EXPECT_EQ(kernels_internal::OptimizerKernelsFor(isa).isa, isa)
        << IsaName(isa);
  }
  std::printf("[          ] kernels: CPU supports %s, running %s\n",
              IsaName(CpuIsa()), IsaName(DetectIsa()));
}

// Child side of the test below: set the variable, then check the level and
// that a public kernel still works.
[[noreturn]] void CheckIsaFromEnvAndExit(const char* value, Isa want) {
  setenv("PSRT_KERNELS_ISA", value, 1);
  const float x[3] = {1.0f, -2.5f, 0.5f};
  std::exit(DetectIsa() == want && MaxAbs(x, 3) == 2.5f ? 0 : 1);
}

// PSRT_KERNELS_ISA is read once per process, so each value is tried in a
// fresh child process ("threadsafe" death tests re-execute the binary).
TEST(IsaDeathTest, EnvironmentLowersTheLevel) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  struct Case {
    const char* value;
    Isa want;
    const char* stderr_regex;
  };
  const Case cases[] = {
      {"scalar", Isa::kScalar, ""},
      {"avx2", std::min(Isa::kAvx2, CpuIsa()), ""},
      {"avx512", CpuIsa(), ""},  // never above what the CPU has
      {"bogus", CpuIsa(), "ignoring PSRT_KERNELS_ISA=bogus"},
  };
  for (const Case& c : cases) {
    EXPECT_EXIT(CheckIsaFromEnvAndExit(c.value, c.want),
                ::testing::ExitedWithCode(0), c.stderr_regex)
        << c.value;
  }
}

// --- fp16, scalar reference
// ----------------------------------------------------

// Independent decode of an fp16 bit pattern (finite values only).
double DecodeHalf(uint16_t h) {
  const int sign = (h & 0x8000) ? -1 : 1;
  const int e = (h >> 10) & 0x1F;
  const int m = h & 0x3FF;
  if (e == 0) return sign * std::ldexp(static_cast<double>(m), -24);
  return sign * std::ldexp(1.0 + m / 1024.0, e - 15);
}

TEST(Fp16, ExhaustiveRoundTrip) {
  int checked = 0;
  for (uint32_t i = 0; i <= 0xFFFF; ++i) {
    const uint16_t h = static_cast<uint16_t>(i);
    const float f = HalfToFloat(h);
    const uint16_t back = FloatToHalf(f);
    const bool negative = (h & 0x8000) != 0;
    if (IsHalfNan(h)) {
      // NaN: sign and payload kept, made quiet (0x200 is fp16's quiet bit).
      ASSERT_TRUE(std::isnan(f)) << Hex(h);
      ASSERT_EQ(std::signbit(f), negative) << Hex(h);
      ASSERT_EQ(Bits(f) & 0x400000u, 0x400000u) << Hex(h) << " not quiet";
      ASSERT_EQ(back, h | 0x200) << Hex(h);
    } else if ((h & 0x7FFF) == 0x7C00) {
      ASSERT_TRUE(std::isinf(f)) << Hex(h);
      ASSERT_EQ(std::signbit(f), negative) << Hex(h);
      ASSERT_EQ(back, h);
    } else {
      ASSERT_EQ(static_cast<double>(f), DecodeHalf(h)) << Hex(h);
      ASSERT_EQ(std::signbit(f), negative) << Hex(h);  // -0 stays -0
      ASSERT_EQ(back, h) << Hex(h);
    }
    ++checked;
  }
  EXPECT_EQ(checked, 65536);
}

// Nearest fp16 by search over the 31744 positive finite values (whose bit
// patterns 0x0000..0x7BFF increase with the value), ties to the even pattern.
uint16_t ReferenceHalf(float x) {
  static const std::vector<double> values = [] {
    std::vector<double> v;
    for (uint32_t h = 0; h <= 0x7BFF; ++h) v.push_back(DecodeHalf(h));
    return v;
  }();
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  if (std::isnan(x)) return sign | 0x7E00 | ((Bits(x) >> 13) & 0x3FF);
  const double a = std::fabs(static_cast<double>(x));
  if (a >= 65520.0) return sign | 0x7C00;  // halfway to 2^16 or beyond: Inf
  if (a > 65504.0) return sign | 0x7BFF;   // nearer the largest finite
  const size_t hi = std::lower_bound(values.begin(), values.end(), a) -
                    values.begin();  // values[hi] >= a
  if (values[hi] == a) return sign | static_cast<uint16_t>(hi);
  const size_t lo = hi - 1;
  const double dlo = a - values[lo], dhi = values[hi] - a;
  const size_t pick = dlo < dhi ? lo : dhi < dlo ? hi : (lo % 2 == 0 ? lo : hi);
  return sign | static_cast<uint16_t>(pick);
}

// All 2^32 patterns take ~30 s; a prime stride samples ~8M of them across
// every exponent. (The full sweep, scalar vs F16C, was run once by hand: 0
// mismatches.)
TEST(Fp16, SampledFloatsMatchNearestEvenReference) {
  int bad = 0;
  for (uint64_t u = 0; u <= 0xFFFFFFFFull; u += 521) {
    const float x = FromBits(static_cast<uint32_t>(u));
    const uint16_t got = FloatToHalf(x), want = ReferenceHalf(x);
    if (got != want && ++bad <= 5) {
      ADD_FAILURE() << Hex(static_cast<uint32_t>(u)) << " -> " << Hex(got)
                    << ", want " << Hex(want);
    }
  }
  EXPECT_EQ(bad, 0);
}

TEST(Fp16, RoundToNearestEvenTies) {
  // Around 1.0 the fp16 spacing is 2^-10.
  EXPECT_EQ(FloatToHalf(1.0f + 0x1p-11f), 0x3C00);      // tie -> even (down)
  EXPECT_EQ(FloatToHalf(1.0f + 3 * 0x1p-11f), 0x3C02);  // tie -> even (up)
  EXPECT_EQ(FloatToHalf(1.0f + 0x1p-11f + 0x1p-23f), 0x3C01);  // above tie
  EXPECT_EQ(FloatToHalf(1.0f + 3 * 0x1p-11f - 0x1p-23f), 0x3C01);
  EXPECT_EQ(FloatToHalf(-(1.0f + 0x1p-11f)), 0xBC00);
  // A carry out of the mantissa bumps the exponent: 2 - 2^-12 -> 2.0.
  EXPECT_EQ(FloatToHalf(2.0f - 0x1p-12f), 0x4000);
  // Subnormal ties (spacing 2^-24).
  EXPECT_EQ(FloatToHalf(0x1p-25f), 0x0000);      // 0.5 ulp -> 0 (even)
  EXPECT_EQ(FloatToHalf(3 * 0x1p-25f), 0x0002);  // 1.5 ulp -> 2 (even)
  EXPECT_EQ(FloatToHalf(0x1p-25f + 0x1p-40f), 0x0001);
  // Largest subnormal + half an ulp ties up into the smallest normal.
  EXPECT_EQ(FloatToHalf(1023.5f * 0x1p-24f), 0x0400);
}

TEST(Fp16, OverflowToInf) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7BFF);    // largest finite
  EXPECT_EQ(FloatToHalf(65519.996f), 0x7BFF);  // just below the midpoint
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7C00);    // midpoint rounds to Inf
  EXPECT_EQ(FloatToHalf(-65520.0f), 0xFC00);
  EXPECT_EQ(FloatToHalf(1e6f), 0x7C00);
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::max()), 0x7C00);
  EXPECT_EQ(FloatToHalf(inf), 0x7C00);
  EXPECT_EQ(FloatToHalf(-inf), 0xFC00);
  EXPECT_EQ(HalfToFloat(0x7C00), inf);
  EXPECT_EQ(HalfToFloat(0xFC00), -inf);
}

TEST(Fp16, Subnormals) {
  EXPECT_EQ(FloatToHalf(0x1p-24f), 0x0001);  // smallest subnormal
  EXPECT_EQ(FloatToHalf(-0x1p-24f), 0x8001);
  EXPECT_EQ(FloatToHalf(0x1p-15f), 0x0200);
  EXPECT_EQ(FloatToHalf(0x1p-14f), 0x0400);  // smallest normal
  EXPECT_EQ(FloatToHalf(1023 * 0x1p-24f), 0x03FF);
  EXPECT_EQ(FloatToHalf(0x1p-26f), 0x0000);
  EXPECT_EQ(FloatToHalf(-0x1p-26f), 0x8000);  // underflows to -0
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(FloatToHalf(-0.0f), 0x8000);
  EXPECT_EQ(HalfToFloat(0x0001), 0x1p-24f);
  EXPECT_EQ(HalfToFloat(0x03FF), 1023 * 0x1p-24f);
  EXPECT_EQ(HalfToFloat(0x8001), -0x1p-24f);
}

TEST(Fp16, NanStaysNan) {
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::quiet_NaN()), 0x7E00);
  // Signalling NaN whose payload is all below fp16's 10 bits: still NaN.
  EXPECT_EQ(FloatToHalf(FromBits(0x7F800001u)), 0x7E00);
  EXPECT_EQ(FloatToHalf(FromBits(0xFF800001u)), 0xFE00);  // sign kept
  EXPECT_EQ(FloatToHalf(FromBits(0x7FA00000u)), 0x7F00);  // top payload kept
  EXPECT_EQ(Bits(HalfToFloat(0x7C01)), 0x7FC02000u);      // sNaN -> quiet
}

// --- bf16, scalar reference
// ----------------------------------------------------

TEST(Bf16, RoundToNearestEven) {
  EXPECT_EQ(FloatToBf16(1.0f), 0x3F80);
  // Spacing at 1.0 is 2^-7.
  EXPECT_EQ(FloatToBf16(1.0f + 0x1p-8f), 0x3F80);      // tie -> even
  EXPECT_EQ(FloatToBf16(1.0f + 3 * 0x1p-8f), 0x3F82);  // tie -> even
  EXPECT_EQ(FloatToBf16(1.0f + 0x1p-8f + 0x1p-23f), 0x3F81);
  EXPECT_EQ(FloatToBf16(-(1.0f + 3 * 0x1p-8f)), 0xBF82);
  // Subnormals round the same way.
  EXPECT_EQ(FloatToBf16(FromBits(0x00008000u)), 0x0000);
  EXPECT_EQ(FloatToBf16(FromBits(0x00018000u)), 0x0002);
  EXPECT_EQ(FloatToBf16(FromBits(0x00010001u)), 0x0001);
  // Overflow: FLT_MAX is past the last bf16 midpoint, so it becomes Inf.
  EXPECT_EQ(FloatToBf16(std::numeric_limits<float>::max()), 0x7F80);
  EXPECT_EQ(FloatToBf16(FromBits(0x7F7F7FFFu)), 0x7F7F);
  EXPECT_EQ(FloatToBf16(-std::numeric_limits<float>::infinity()), 0xFF80);
  EXPECT_EQ(FloatToBf16(-0.0f), 0x8000);
}

TEST(Bf16, NanStaysNan) {
  EXPECT_EQ(FloatToBf16(std::numeric_limits<float>::quiet_NaN()), 0x7FC0);
  // Rounding would carry these into Inf or truncate the payload to Inf.
  EXPECT_EQ(FloatToBf16(FromBits(0x7F800001u)), 0x7FC0);
  EXPECT_EQ(FloatToBf16(FromBits(0xFF800001u)), 0xFFC0);
  EXPECT_EQ(FloatToBf16(FromBits(0x7FFFFFFFu)), 0x7FFF);
  EXPECT_EQ(FloatToBf16(FromBits(0x7F810000u)), 0x7FC1);
}

TEST(Bf16, ExhaustiveRoundTrip) {
  for (uint32_t i = 0; i <= 0xFFFF; ++i) {
    const uint16_t b = static_cast<uint16_t>(i);
    const float f = Bf16ToFloat(b);
    ASSERT_EQ(Bits(f), i << 16);  // exact widening, NaN bits included
    ASSERT_EQ(FloatToBf16(f), IsBf16Nan(b) ? (b | 0x40) : b) << Hex(b);
  }
}

// --- every ISA against scalar
// --------------------------------------------------

// A mix of random bit patterns (NaNs, Infs, subnormals of every kind), values
// over a wide range, exact fp16/bf16 ties, and a list of edge cases.
std::vector<float> TestFloats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<uint32_t> bits;
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<float> exponent(-30.0f, 20.0f);
  const float specials[] = {0.0f,
                            -0.0f,
                            1.0f,
                            -1.0f,
                            65504.0f,
                            65520.0f,
                            -65520.0f,
                            65519.996f,
                            1e30f,
                            -1e30f,
                            1e-30f,
                            0x1p-24f,
                            0x1p-25f,
                            3 * 0x1p-25f,
                            0x1p-14f,
                            std::numeric_limits<float>::max(),
                            -std::numeric_limits<float>::max(),
                            std::numeric_limits<float>::min(),
                            std::numeric_limits<float>::denorm_min(),
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(),
                            FromBits(0x7F800001u),
                            FromBits(0xFFC00001u),
                            FromBits(0x7FA00000u)};
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) {
    switch (rng() % 5) {
      case 0:
        out[i] = FromBits(bits(rng));
        break;
      case 1:
        out[i] = normal(rng) * std::exp2(exponent(rng));
        break;
      case 2:  // fp16 tie: a half's value plus half its ulp (normal range)
        out[i] = FromBits(
            Bits(HalfToFloat(static_cast<uint16_t>((rng() % 0x7800) + 0x400))) +
            0x1000u);
        break;
      case 3:  // bf16 tie
        out[i] = FromBits((bits(rng) & 0xFFFF0000u) | 0x8000u);
        break;
      default:
        out[i] = specials[rng() % (sizeof specials / sizeof specials[0])];
    }
  }
  return out;
}

std::vector<uint16_t> TestHalves(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint16_t> out(n);
  for (auto& h : out) h = static_cast<uint16_t>(rng());
  return out;
}

// Element-wise equality of bit patterns; with `nan_any_payload`, two NaNs
// match whatever their payloads (for results of arithmetic on NaN, whose
// payload x86 takes from whichever operand the compiler put first).
template <typename T>
void ExpectSameBits(const std::vector<T>& got, const std::vector<T>& want,
                    const std::string& what, bool nan_any_payload = false) {
  ASSERT_EQ(got.size(), want.size());
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    uint32_t g, w;
    if constexpr (sizeof(T) == 4) {
      g = Bits(got[i]);
      w = Bits(want[i]);
      if (nan_any_payload && std::isnan(got[i]) && std::isnan(want[i])) {
        continue;
      }
    } else {
      g = got[i];
      w = want[i];
    }
    if (g != w && ++bad <= 5) {
      ADD_FAILURE() << what << "[" << i << "]: got " << Hex(g) << ", want "
                    << Hex(w);
    }
  }
  EXPECT_EQ(bad, 0u) << what;
}

const size_t kLengths[] = {0, 1, 7, 31, 1000003};

class ConvertIsaTest : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    if (!IsaSupported(GetParam())) {
      GTEST_SKIP() << IsaName(GetParam())
                   << " kernels not tested: this CPU's best is "
                   << IsaName(CpuIsa());
    }
  }
  const ConvertKernels& simd() const { return ConvertKernelsFor(GetParam()); }
  const ConvertKernels& scalar() const {
    return ConvertKernelsFor(Isa::kScalar);
  }
};

// Offsets 0 and 3 elements: unaligned starts too.
TEST_P(ConvertIsaTest, Fp32ToHalfAndBf16MatchScalar) {
  for (size_t n : kLengths) {
    for (size_t offset : {0, 3}) {
      const std::vector<float> in = TestFloats(n + offset, 11 + n);
      const float* src = in.data() + offset;
      std::vector<uint16_t> want(n), got(n, 0xDEAD);
      const std::string at =
          "n=" + std::to_string(n) + "+" + std::to_string(offset) + " ";
      scalar().fp32_to_fp16(src, want.data(), n);
      simd().fp32_to_fp16(src, got.data(), n);
      ExpectSameBits(got, want, at + "fp32_to_fp16");
      for (size_t i = 0; i < std::min<size_t>(n, 1000); ++i) {
        ASSERT_EQ(want[i], FloatToHalf(src[i])) << i;
      }
      scalar().fp32_to_bf16(src, want.data(), n);
      simd().fp32_to_bf16(src, got.data(), n);
      ExpectSameBits(got, want, at + "fp32_to_bf16");
      for (size_t i = 0; i < std::min<size_t>(n, 1000); ++i) {
        ASSERT_EQ(want[i], FloatToBf16(src[i])) << i;
      }
      for (float scale : {1.0f, 0.5f, 1024.0f, 3.7e-3f, -2.0f}) {
        scalar().fp32_to_fp16_scaled(src, scale, want.data(), n);
        simd().fp32_to_fp16_scaled(src, scale, got.data(), n);
        ExpectSameBits(got, want, at + "fp32_to_fp16_scaled");
        for (size_t i = 0; i < std::min<size_t>(n, 1000); ++i) {
          ASSERT_EQ(want[i], FloatToHalf(src[i] * scale)) << i;
        }
        scalar().fp32_to_bf16_scaled(src, scale, want.data(), n);
        simd().fp32_to_bf16_scaled(src, scale, got.data(), n);
        ExpectSameBits(got, want, at + "fp32_to_bf16_scaled");
      }
    }
  }
}

TEST_P(ConvertIsaTest, HalfAndBf16ToFp32MatchScalar) {
  for (size_t n : kLengths) {
    for (size_t offset : {0, 3}) {
      const std::vector<uint16_t> in = TestHalves(n + offset, 5 + n);
      const uint16_t* src = in.data() + offset;
      std::vector<float> want(n), got(n, -1.0f);
      const std::string at = "n=" + std::to_string(n) + " ";
      scalar().fp16_to_fp32(src, want.data(), n);
      simd().fp16_to_fp32(src, got.data(), n);
      ExpectSameBits(got, want, at + "fp16_to_fp32");
      scalar().bf16_to_fp32(src, want.data(), n);
      simd().bf16_to_fp32(src, got.data(), n);
      ExpectSameBits(got, want, at + "bf16_to_fp32");
    }
  }
}

// Every fp16 pattern through the vector path, in one array.
TEST_P(ConvertIsaTest, AllHalvesRoundTrip) {
  std::vector<uint16_t> all(65536), back(65536);
  for (uint32_t i = 0; i <= 0xFFFF; ++i) all[i] = static_cast<uint16_t>(i);
  std::vector<float> f(65536), want_f(65536);
  simd().fp16_to_fp32(all.data(), f.data(), all.size());
  scalar().fp16_to_fp32(all.data(), want_f.data(), all.size());
  ExpectSameBits(f, want_f, "fp16_to_fp32");
  simd().fp32_to_fp16(f.data(), back.data(), f.size());
  for (uint32_t i = 0; i <= 0xFFFF; ++i) {
    ASSERT_EQ(back[i], IsHalfNan(all[i]) ? (all[i] | 0x200) : all[i]) << Hex(i);
  }
}

TEST_P(ConvertIsaTest, AccumulateMatchesScalar) {
  for (size_t n : kLengths) {
    const std::vector<uint16_t> in = TestHalves(n, 21 + n);
    const std::vector<float> acc0 = TestFloats(n, 31 + n);
    for (float scale : {1.0f, 0.25f, -3.0f, 1e-3f}) {
      std::vector<float> want = acc0, got = acc0;
      const std::string at =
          "n=" + std::to_string(n) + " scale=" + std::to_string(scale) + " ";
      scalar().accumulate_fp16(in.data(), scale, want.data(), n);
      simd().accumulate_fp16(in.data(), scale, got.data(), n);
      ExpectSameBits(got, want, at + "accumulate_fp16", true);
      for (size_t i = 0; i < std::min<size_t>(n, 1000); ++i) {
        // volatile: keep the compiler from fusing the reference into an FMA.
        volatile float prod = scale * HalfToFloat(in[i]);
        const float expect = acc0[i] + prod;
        if (!std::isnan(expect)) ASSERT_EQ(Bits(want[i]), Bits(expect)) << i;
      }
      want = acc0;
      got = acc0;
      scalar().accumulate_bf16(in.data(), scale, want.data(), n);
      simd().accumulate_bf16(in.data(), scale, got.data(), n);
      ExpectSameBits(got, want, at + "accumulate_bf16", true);
    }
  }
}

TEST_P(ConvertIsaTest, MaxAbsMatchesScalar) {
  for (size_t n : kLengths) {
    // Finite data, then the same with one Inf, then with a NaN too, each
    // placed near the end so that a tail path has to find it.
    std::vector<float> x(n);
    std::mt19937 rng(static_cast<uint32_t>(n));
    std::normal_distribution<float> normal(0.0f, 100.0f);
    for (float& v : x) v = normal(rng);
    for (int round = 0; round < 3; ++round) {
      if (n > 0 && round == 1)
        x[n - 1] = -std::numeric_limits<float>::infinity();
      if (n > 0 && round == 2) x[n / 2] = FromBits(0xFFC01234u);
      const float want = scalar().max_abs(x.data(), n);
      const float got = simd().max_abs(x.data(), n);
      EXPECT_EQ(Bits(got), Bits(want)) << "n=" << n << " round " << round;
      float ref = 0.0f;
      bool nan = false;
      for (float v : x) {
        nan |= std::isnan(v);
        ref = std::max(ref, std::fabs(v));
      }
      if (nan) {
        EXPECT_TRUE(std::isnan(want));
      } else {
        EXPECT_EQ(want, ref) << "n=" << n;
      }
    }
  }
  // Random bit patterns: NaNs of every payload, both signs.
  const std::vector<float> any = TestFloats(1000003, 99);
  EXPECT_EQ(Bits(simd().max_abs(any.data(), any.size())),
            Bits(scalar().max_abs(any.data(), any.size())));
}

INSTANTIATE_TEST_SUITE_P(AllIsas, ConvertIsaTest,
                         ::testing::Values(Isa::kScalar, Isa::kAvx2,
                                           Isa::kAvx512),
                         [](const ::testing::TestParamInfo<Isa>& info) {
                           return std::string(IsaName(info.param));
                         });

// --- public entry points
// ---------------------------------------------------------

TEST(MaxAbs, Semantics) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(MaxAbs(nullptr, 0), 0.0f);
  EXPECT_TRUE(AllFinite(nullptr, 0));
  const float a[] = {1.0f, -3.0f, 2.0f};
  EXPECT_EQ(MaxAbs(a, 3), 3.0f);
  EXPECT_TRUE(AllFinite(a, 3));
  const float b[] = {1.0f, -inf, 2.0f};
  EXPECT_EQ(MaxAbs(b, 3), inf);
  EXPECT_FALSE(AllFinite(b, 3));
  const float c[] = {1.0f, nan, -inf};
  EXPECT_TRUE(std::isnan(MaxAbs(c, 3)));
  EXPECT_FALSE(AllFinite(c, 3));
  const float d[] = {-0.0f, std::numeric_limits<float>::denorm_min()};
  EXPECT_EQ(MaxAbs(d, 2), std::numeric_limits<float>::denorm_min());
}

TEST(Convert, PublicFunctionsUseActiveKernels) {
  const std::vector<float> in = TestFloats(1031, 7);
  const ConvertKernels& k = ConvertKernelsFor(DetectIsa());
  std::vector<uint16_t> got(in.size()), want(in.size());
  Fp32ToFp16(in.data(), got.data(), in.size());
  k.fp32_to_fp16(in.data(), want.data(), in.size());
  ExpectSameBits(got, want, "Fp32ToFp16");
  Fp32ToBf16(in.data(), got.data(), in.size());
  k.fp32_to_bf16(in.data(), want.data(), in.size());
  ExpectSameBits(got, want, "Fp32ToBf16");
  Fp32ToFp16Scaled(in.data(), 0.5f, got.data(), in.size());
  k.fp32_to_fp16_scaled(in.data(), 0.5f, want.data(), in.size());
  ExpectSameBits(got, want, "Fp32ToFp16Scaled");
  Fp32ToBf16Scaled(in.data(), 0.5f, got.data(), in.size());
  k.fp32_to_bf16_scaled(in.data(), 0.5f, want.data(), in.size());
  ExpectSameBits(got, want, "Fp32ToBf16Scaled");

  std::vector<float> f_got(in.size()), f_want(in.size());
  Fp16ToFp32(got.data(), f_got.data(), got.size());
  k.fp16_to_fp32(got.data(), f_want.data(), got.size());
  ExpectSameBits(f_got, f_want, "Fp16ToFp32");
  Bf16ToFp32(got.data(), f_got.data(), got.size());
  k.bf16_to_fp32(got.data(), f_want.data(), got.size());
  ExpectSameBits(f_got, f_want, "Bf16ToFp32");

  std::vector<float> acc_got(in.size(), 1.0f), acc_want(in.size(), 1.0f);
  AccumulateFp16(got.data(), 0.25f, acc_got.data(), got.size());
  k.accumulate_fp16(got.data(), 0.25f, acc_want.data(), got.size());
  ExpectSameBits(acc_got, acc_want, "AccumulateFp16", true);
  AccumulateBf16(got.data(), 0.25f, acc_got.data(), got.size());
  k.accumulate_bf16(got.data(), 0.25f, acc_want.data(), got.size());
  ExpectSameBits(acc_got, acc_want, "AccumulateBf16", true);
}

// A typical compressed round: scale into fp16, accumulate back with 1/scale.
TEST(Convert, CompressAccumulateRoundTripIsClose) {
  std::vector<float> grad(4099);
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1e-3f);
  for (float& g : grad) g = normal(rng);
  const float scale = 1024.0f / MaxAbs(grad.data(), grad.size());
  std::vector<uint16_t> half(grad.size());
  Fp32ToFp16Scaled(grad.data(), scale, half.data(), grad.size());
  std::vector<float> acc(grad.size(), 0.0f);
  AccumulateFp16(half.data(), 1.0f / scale, acc.data(), grad.size());
  for (size_t i = 0; i < grad.size(); ++i) {
    // fp16 keeps 11 significant bits: relative error <= 2^-11, plus the
    // absolute error of values that land in the subnormal range.
    EXPECT_NEAR(acc[i], grad[i], std::fabs(grad[i]) * 0x1p-11f + 1e-9f) << i;
  }
}

// --- optimizer kernels: every ISA against the Eigen baseline
// -------------------

struct OptCase {
  std::string name;
  OptimizerConfig config;
};

std::vector<OptCase> OptCases() {
  std::vector<OptCase> out;
  auto add = [&](std::string name, OptimizerKind kind, auto mutate) {
    OptimizerConfig c;
    c.kind = kind;
    mutate(c);
    out.push_back({std::move(name), c});
  };
  add("SgdPlain", OptimizerKind::kSgd, [](OptimizerConfig&) {});
  add("SgdMomentumDampening", OptimizerKind::kSgd, [](OptimizerConfig& c) {
    c.momentum = 0.9;
    c.dampening = 0.3;
  });
  add("SgdNesterovWeightDecay", OptimizerKind::kSgd, [](OptimizerConfig& c) {
    c.momentum = 0.8;
    c.nesterov = true;
    c.weight_decay = 0.01;
  });
  add("Adam", OptimizerKind::kAdam, [](OptimizerConfig&) {});
  add("AdamWeightDecay", OptimizerKind::kAdam, [](OptimizerConfig& c) {
    c.weight_decay = 0.1;
    c.beta1 = 0.8;
    c.beta2 = 0.99;
    c.eps = 1e-6;
  });
  add("AdamLargeLerpWeight", OptimizerKind::kAdam,
      [](OptimizerConfig& c) { c.beta1 = 0.3; });
  add("AdamW", OptimizerKind::kAdamW,
      [](OptimizerConfig& c) { c.weight_decay = 0.1; });
  add("AdaGrad", OptimizerKind::kAdaGrad, [](OptimizerConfig& c) {
    c.eps = 1e-10;
    c.lr_decay = 0.1;
    c.initial_accumulator_value = 0.5;
    c.weight_decay = 0.01;
  });
  add("AdaGradZeroEps", OptimizerKind::kAdaGrad,
      [](OptimizerConfig& c) { c.eps = 0.0; });
  return out;
}

// Mostly ordinary values, plus NaN, Inf, huge (g * g overflows), tiny (g * g
// subnormal or zero) and zero.
std::vector<float> OptValues(size_t n, uint32_t seed, float sigma) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, sigma);
  const float specials[] = {std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            1e30f,
                            -3e25f,
                            1e-20f,
                            -1e-30f,
                            0.0f,
                            std::numeric_limits<float>::denorm_min()};
  std::vector<float> out(n);
  for (float& v : out) {
    v = rng() % 64 == 0 ? specials[rng() % 9] : normal(rng);
  }
  return out;
}

void PrintTo(const OptCase& c, std::ostream* os) { *os << c.name; }

class OptimizerIsaTest
    : public ::testing::TestWithParam<std::tuple<Isa, OptCase>> {
 protected:
  void SetUp() override {
    if (!IsaSupported(std::get<0>(GetParam()))) {
      GTEST_SKIP() << IsaName(std::get<0>(GetParam()))
                   << " kernels not tested: this CPU's best is "
                   << IsaName(CpuIsa());
    }
  }
};

// Tolerance: none. The vector kernels do the baseline's float operations in
// the same order without FMA contraction, so every result is bit-identical;
// only NaN payloads may differ (x86 propagates the first operand's NaN, and
// the operand order of a commutative op is the compiler's choice).
TEST_P(OptimizerIsaTest, FiveStepsBitIdenticalToBaseline) {
  const Isa isa = std::get<0>(GetParam());
  const OptimizerConfig& c = std::get<1>(GetParam()).config;
  // AdaGradZeroEps is refused at registration (its accumulator starts at 0:
  // an element whose gradients were all 0 becomes 0/0), but every kernel
  // must still agree on it.
  if (c.eps != 0.0 || c.initial_accumulator_value > 0) ASSERT_TRUE(ValidateOptimizerConfig(c).ok());
  for (size_t n : kLengths) {
    const int num_slots = NumSlots(c);
    std::vector<float> p_ref = OptValues(n, 1, 1.0f), p_isa = p_ref;
    std::vector<std::vector<float>> s_ref(num_slots, std::vector<float>(n));
    std::vector<std::vector<float>> s_isa = s_ref;
    std::vector<float*> ref_ptrs, isa_ptrs;
    for (int s = 0; s < num_slots; ++s) {
      ref_ptrs.push_back(s_ref[s].data());
      isa_ptrs.push_back(s_isa[s].data());
    }
    InitSlots(c, ref_ptrs.data(), n);
    InitSlots(c, isa_ptrs.data(), n);
    for (int64_t step = 1; step <= 5; ++step) {
      const std::vector<float> grad = OptValues(n, 100 + step, 0.5f);
      const double lr = 0.05 / step;
      kernels_internal::ApplyUpdateWithIsa(Isa::kScalar, c, lr, step,
                                           p_ref.data(), grad.data(),
                                           ref_ptrs.data(), n);
      kernels_internal::ApplyUpdateWithIsa(isa, c, lr, step, p_isa.data(),
                                           grad.data(), isa_ptrs.data(), n);
      const std::string at =
          "n=" + std::to_string(n) + " step " + std::to_string(step) + " ";
      ExpectSameBits(p_isa, p_ref, at + "param", true);
      for (int s = 0; s < num_slots; ++s) {
        ExpectSameBits(s_isa[s], s_ref[s], at + "slot" + std::to_string(s),
                       true);
      }
      if (HasFailure()) return;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllIsas, OptimizerIsaTest,
    ::testing::Combine(::testing::Values(Isa::kScalar, Isa::kAvx2,
                                         Isa::kAvx512),
                       ::testing::ValuesIn(OptCases())),
    [](const ::testing::TestParamInfo<std::tuple<Isa, OptCase>>& info) {
      return std::string(IsaName(std::get<0>(info.param))) + "_" +
             std::get<1>(info.param).name;
    });

// ApplyUpdate is the DetectIsa() kernel.
TEST(OptimizerDispatch, ApplyUpdateUsesDetectedIsa) {
  OptimizerConfig c;
  c.kind = OptimizerKind::kAdam;
  const size_t n = 1031;
  std::vector<float> p1 = OptValues(n, 5, 1.0f), p2 = p1;
  std::vector<float> m1(n, 0.0f), v1(n, 0.0f), m2 = m1, v2 = v1;
  float* s1[] = {m1.data(), v1.data()};
  float* s2[] = {m2.data(), v2.data()};
  const std::vector<float> grad = OptValues(n, 6, 0.5f);
  ApplyUpdate(c, 1e-3, 1, p1.data(), grad.data(), s1, n);
  kernels_internal::ApplyUpdateWithIsa(DetectIsa(), c, 1e-3, 1, p2.data(),
                                       grad.data(), s2, n);
  ExpectSameBits(p1, p2, "param", true);
  ExpectSameBits(m1, m2, "exp_avg", true);
  ExpectSameBits(v1, v2, "exp_avg_sq", true);
}

}  // namespace
}  // namespace psrt
