#include "kernels/convert.h"

#include <cstring>

#include "kernels/isa.h"

#if defined(__x86_64__) && defined(__GNUC__)
#define PSRT_KERNELS_X86 1
#include <immintrin.h>
#endif

// This file is compiled for the baseline ISA. The AVX2 and AVX-512 kernels are
// separate functions carrying __attribute__((target(...))), so only they use
// those instructions, and every inline function shared with the rest of the
// program (std::, this file's scalar helpers) is emitted for the baseline: no
// out-of-line copy built for AVX-512 can be picked by the linker and crash an
// older CPU (the hazard of compiling one TU with -mavx512f).

namespace psrt {
namespace {

// --- scalar reference (integer bit manipulation, independent of MXCSR) -------

inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

inline float BitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline uint16_t HalfFromFloatBits(uint32_t x) {
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t ax = x & 0x7FFFFFFFu;
  if (ax > 0x7F800000u) {
    // NaN: quiet bit set, top 10 payload bits kept (as F16C does).
    return static_cast<uint16_t>(sign | 0x7E00u | ((ax >> 13) & 0x3FFu));
  }
  // +-Inf, and every finite value >= 65520: halfway between 65504 (the
  // largest fp16) and 2^16 or above rounds up past the largest, i.e. to Inf.
  if (ax >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);
  if (ax >= 0x38800000u) {
    // Normal in fp16 (>= 2^-14): rebias the exponent (127 -> 15), then round
    // away the low 13 mantissa bits to nearest even. A carry out of the
    // mantissa correctly bumps the exponent.
    const uint32_t r = ax - 0x38000000u;
    return static_cast<uint16_t>(sign |
                                 ((r + 0xFFFu + ((r >> 13) & 1u)) >> 13));
  }
  // fp16 subnormal or zero: the result counts units of 2^-24.
  const uint32_t e = ax >> 23;
  // Below 2^-25 (half the smallest subnormal) everything rounds to zero;
  // fp32 subnormals (e == 0) are far below.
  if (e < 102) return static_cast<uint16_t>(sign);
  const uint32_t m = (ax & 0x7FFFFFu) | 0x800000u;  // implicit bit
  const uint32_t shift = 126 - e;                   // 14..24
  uint32_t q = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (q & 1u))) ++q;  // may reach 0x400: normal
  return static_cast<uint16_t>(sign | q);
}

inline uint32_t FloatBitsFromHalf(uint16_t h) {
  const uint32_t sign = (static_cast<uint32_t>(h) & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1Fu;
  const uint32_t m = h & 0x3FFu;
  if (e == 0x1F) {
    // Inf stays Inf; NaN keeps its payload and comes back quiet (F16C too).
    return sign | 0x7F800000u | (m != 0 ? 0x400000u | (m << 13) : 0u);
  }
  if (e != 0) return sign | ((e + 112u) << 23) | (m << 13);
  if (m == 0) return sign;
  // Subnormal m * 2^-24: normalise so the leading 1 lands on bit 10.
  const uint32_t shift = static_cast<uint32_t>(__builtin_clz(m)) - 21u;
  return sign | ((113u - shift) << 23) | (((m << shift) & 0x3FFu) << 13);
}

inline uint16_t Bf16FromFloatBits(uint32_t x) {
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) {
    // NaN: truncating could clear every payload bit and make it Inf; keep the
    // top payload bits and set the quiet bit instead.
    return static_cast<uint16_t>((x >> 16) | 0x40u);
  }
  // Round to nearest even on the low 16 bits; finite values near FLT_MAX
  // carry into the exponent and become Inf, as IEEE rounding says.
  return static_cast<uint16_t>((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

inline float HalfToFloatInline(uint16_t h) {
  return BitsFloat(FloatBitsFromHalf(h));
}

inline float Bf16ToFloatInline(uint16_t b) {
  return BitsFloat(static_cast<uint32_t>(b) << 16);
}

void Fp32ToFp16Scalar(const float* in, uint16_t* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = HalfFromFloatBits(FloatBits(in[i]));
}

void Fp16ToFp32Scalar(const uint16_t* in, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = HalfToFloatInline(in[i]);
}

void Fp32ToBf16Scalar(const float* in, uint16_t* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = Bf16FromFloatBits(FloatBits(in[i]));
}

void Bf16ToFp32Scalar(const uint16_t* in, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = Bf16ToFloatInline(in[i]);
}

void Fp32ToFp16ScaledScalar(const float* in, float scale, uint16_t* out,
                            size_t n) {
  for (size_t i = 0; i < n; ++i) {
    out[i] = HalfFromFloatBits(FloatBits(in[i] * scale));
  }
}

void Fp32ToBf16ScaledScalar(const float* in, float scale, uint16_t* out,
                            size_t n) {
  for (size_t i = 0; i < n; ++i) {
    out[i] = Bf16FromFloatBits(FloatBits(in[i] * scale));
  }
}

void AccumulateFp16Scalar(const uint16_t* in, float scale, float* acc,
                          size_t n) {
  for (size_t i = 0; i < n; ++i) acc[i] += scale * HalfToFloatInline(in[i]);
}

void AccumulateBf16Scalar(const uint16_t* in, float scale, float* acc,
                          size_t n) {
  for (size_t i = 0; i < n; ++i) acc[i] += scale * Bf16ToFloatInline(in[i]);
}

// |x| as bits orders like an unsigned (and, below 2^31, signed) integer, and
// every NaN sorts above Inf: an integer max is a NaN-propagating max |x| that
// returns the same bits on every ISA.
float MaxAbsScalar(const float* x, size_t n) {
  uint32_t m = 0;
  for (size_t i = 0; i < n; ++i) {
    const uint32_t a = FloatBits(x[i]) & 0x7FFFFFFFu;
    m = a > m ? a : m;
  }
  return BitsFloat(m);
}

constexpr ConvertKernels kScalarKernels = {
    Isa::kScalar,           Fp32ToFp16Scalar,     Fp16ToFp32Scalar,
    Fp32ToBf16Scalar,       Bf16ToFp32Scalar,     Fp32ToFp16ScaledScalar,
    Fp32ToBf16ScaledScalar, AccumulateFp16Scalar, AccumulateBf16Scalar,
    MaxAbsScalar,
};

#if PSRT_KERNELS_X86

// --- AVX2 + F16C
// --------------------------------------------------------------- 8 floats per
// vector; the last n % 8 elements go through the scalar code above, which gives
// the same bits. The scaled variants are templates on kScaled so the unscaled
// ones skip the multiply: besides its cost, x * 1 flushes subnormals when a
// framework has set MXCSR's DAZ/FTZ bits, which the plain conversions must not
// do.

#define PSRT_AVX2 __attribute__((target("avx2,fma,f16c")))

PSRT_AVX2 inline __m128i Avx2HalfFromFloat(__m256 v) {
  return _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT);
}

// 8 bf16 in the low 16 bits of each 32-bit lane (Bf16FromFloatBits, vector).
PSRT_AVX2 inline __m256i Avx2Bf16FromFloat(__m256 v) {
  const __m256i x = _mm256_castps_si256(v);
  const __m256i hi = _mm256_srli_epi32(x, 16);
  const __m256i lsb = _mm256_and_si256(hi, _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(
      _mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7FFF)), lsb),
      16);
  const __m256i quiet_nan = _mm256_or_si256(hi, _mm256_set1_epi32(0x40));
  const __m256i is_nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  return _mm256_blendv_epi8(rounded, quiet_nan, is_nan);
}

template <bool kScaled>
PSRT_AVX2 void Fp32ToFp16Avx2Impl(const float* in, float scale, uint16_t* out,
                                  size_t n) {
  const __m256 s = _mm256_set1_ps(scale);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256 a = _mm256_loadu_ps(in + i);
    __m256 b = _mm256_loadu_ps(in + i + 8);
    if (kScaled) {
      a = _mm256_mul_ps(a, s);
      b = _mm256_mul_ps(b, s);
    }
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), Avx2HalfFromFloat(a));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i + 8),
                     Avx2HalfFromFloat(b));
  }
  for (; i + 8 <= n; i += 8) {
    __m256 a = _mm256_loadu_ps(in + i);
    if (kScaled) a = _mm256_mul_ps(a, s);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), Avx2HalfFromFloat(a));
  }
  for (; i < n; ++i) {
    out[i] = HalfFromFloatBits(FloatBits(kScaled ? in[i] * scale : in[i]));
  }
}

template <bool kScaled>
PSRT_AVX2 void Fp32ToBf16Avx2Impl(const float* in, float scale, uint16_t* out,
                                  size_t n) {
  const __m256 s = _mm256_set1_ps(scale);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256 a = _mm256_loadu_ps(in + i);
    __m256 b = _mm256_loadu_ps(in + i + 8);
    if (kScaled) {
      a = _mm256_mul_ps(a, s);
      b = _mm256_mul_ps(b, s);
    }
    // packus interleaves 128-bit halves (a0-3 b0-3 a4-7 b4-7); the permute
    // puts them back in order. Lanes hold 0..0xFFFF, so nothing saturates.
    const __m256i packed =
        _mm256_packus_epi32(Avx2Bf16FromFloat(a), Avx2Bf16FromFloat(b));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i),
                        _mm256_permute4x64_epi64(packed, 0xD8));
  }
  for (; i + 8 <= n; i += 8) {
    __m256 a = _mm256_loadu_ps(in + i);
    if (kScaled) a = _mm256_mul_ps(a, s);
    const __m256i bits = Avx2Bf16FromFloat(a);
    const __m256i packed =
        _mm256_permute4x64_epi64(_mm256_packus_epi32(bits, bits), 0xD8);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     _mm256_castsi256_si128(packed));
  }
  for (; i < n; ++i) {
    out[i] = Bf16FromFloatBits(FloatBits(kScaled ? in[i] * scale : in[i]));
  }
}

PSRT_AVX2 void Fp32ToFp16Avx2(const float* in, uint16_t* out, size_t n) {
  Fp32ToFp16Avx2Impl<false>(in, 1.0f, out, n);
}

PSRT_AVX2 void Fp32ToFp16ScaledAvx2(const float* in, float scale, uint16_t* out,
                                    size_t n) {
  Fp32ToFp16Avx2Impl<true>(in, scale, out, n);
}

PSRT_AVX2 void Fp32ToBf16Avx2(const float* in, uint16_t* out, size_t n) {
  Fp32ToBf16Avx2Impl<false>(in, 1.0f, out, n);
}

PSRT_AVX2 void Fp32ToBf16ScaledAvx2(const float* in, float scale, uint16_t* out,
                                    size_t n) {
  Fp32ToBf16Avx2Impl<true>(in, scale, out, n);
}

PSRT_AVX2 inline __m256 Avx2LoadHalf(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

PSRT_AVX2 inline __m256 Avx2LoadBf16(const uint16_t* p) {
  const __m256i wide = _mm256_cvtepu16_epi32(
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

PSRT_AVX2 void Fp16ToFp32Avx2(const uint16_t* in, float* out, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm256_storeu_ps(out + i, Avx2LoadHalf(in + i));
    _mm256_storeu_ps(out + i + 8, Avx2LoadHalf(in + i + 8));
  }
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, Avx2LoadHalf(in + i));
  for (; i < n; ++i) out[i] = HalfToFloatInline(in[i]);
}

PSRT_AVX2 void Bf16ToFp32Avx2(const uint16_t* in, float* out, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm256_storeu_ps(out + i, Avx2LoadBf16(in + i));
    _mm256_storeu_ps(out + i + 8, Avx2LoadBf16(in + i + 8));
  }
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, Avx2LoadBf16(in + i));
  for (; i < n; ++i) out[i] = Bf16ToFloatInline(in[i]);
}

PSRT_AVX2 void AccumulateFp16Avx2(const uint16_t* in, float scale, float* acc,
                                  size_t n) {
  const __m256 s = _mm256_set1_ps(scale);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 prod = _mm256_mul_ps(s, Avx2LoadHalf(in + i));
    _mm256_storeu_ps(acc + i, _mm256_add_ps(_mm256_loadu_ps(acc + i), prod));
  }
  for (; i < n; ++i) acc[i] += scale * HalfToFloatInline(in[i]);
}

PSRT_AVX2 void AccumulateBf16Avx2(const uint16_t* in, float scale, float* acc,
                                  size_t n) {
  const __m256 s = _mm256_set1_ps(scale);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 prod = _mm256_mul_ps(s, Avx2LoadBf16(in + i));
    _mm256_storeu_ps(acc + i, _mm256_add_ps(_mm256_loadu_ps(acc + i), prod));
  }
  for (; i < n; ++i) acc[i] += scale * Bf16ToFloatInline(in[i]);
}

PSRT_AVX2 float MaxAbsAvx2(const float* x, size_t n) {
  const __m256i abs_mask = _mm256_set1_epi32(0x7FFFFFFF);
  __m256i m0 = _mm256_setzero_si256();
  __m256i m1 = _mm256_setzero_si256();
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i a =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i));
    const __m256i b =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i + 8));
    m0 = _mm256_max_epi32(m0, _mm256_and_si256(a, abs_mask));
    m1 = _mm256_max_epi32(m1, _mm256_and_si256(b, abs_mask));
  }
  for (; i + 8 <= n; i += 8) {
    const __m256i a =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i));
    m0 = _mm256_max_epi32(m0, _mm256_and_si256(a, abs_mask));
  }
  m0 = _mm256_max_epi32(m0, m1);
  __m128i m = _mm_max_epi32(_mm256_castsi256_si128(m0),
                            _mm256_extracti128_si256(m0, 1));
  m = _mm_max_epi32(m, _mm_shuffle_epi32(m, _MM_SHUFFLE(1, 0, 3, 2)));
  m = _mm_max_epi32(m, _mm_shuffle_epi32(m, _MM_SHUFFLE(2, 3, 0, 1)));
  uint32_t best = static_cast<uint32_t>(_mm_cvtsi128_si32(m));
  for (; i < n; ++i) {
    const uint32_t a = FloatBits(x[i]) & 0x7FFFFFFFu;
    best = a > best ? a : best;
  }
  return BitsFloat(best);
}

constexpr ConvertKernels kAvx2Kernels = {
    Isa::kAvx2,           Fp32ToFp16Avx2,     Fp16ToFp32Avx2,
    Fp32ToBf16Avx2,       Bf16ToFp32Avx2,     Fp32ToFp16ScaledAvx2,
    Fp32ToBf16ScaledAvx2, AccumulateFp16Avx2, AccumulateBf16Avx2,
    MaxAbsAvx2,
};

// --- AVX-512 (F + BW + VL) ---------------------------------------------------
// 16 floats per vector; the tail is one masked iteration (BW/VL give the
// 16-bit masked loads and stores), so there is no scalar remainder. bf16 uses
// integer ops, not AVX512_BF16, whose VCVTNEPS2BF16 flushes subnormals.

// GCC 12's AVX-512 headers initialise their "undefined" vectors from
// themselves (`__m512i __Y = __Y;`), which -Wall reports wherever they are
// inlined (GCC PR 105593); the code is correct.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#if !defined(__clang__)  // a GCC-only warning
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#define PSRT_AVX512 \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))

PSRT_AVX512 inline __mmask16 TailMask(size_t remaining) {
  return static_cast<__mmask16>((1u << remaining) - 1u);
}

PSRT_AVX512 inline __m256i Avx512HalfFromFloat(__m512 v) {
  return _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT);
}

// 16 bf16 (Bf16FromFloatBits, vector).
PSRT_AVX512 inline __m256i Avx512Bf16FromFloat(__m512 v) {
  const __m512i x = _mm512_castps_si512(v);
  const __m512i hi = _mm512_srli_epi32(x, 16);
  const __m512i lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_srli_epi32(
      _mm512_add_epi32(_mm512_add_epi32(x, _mm512_set1_epi32(0x7FFF)), lsb),
      16);
  const __m512i quiet_nan = _mm512_or_si512(hi, _mm512_set1_epi32(0x40));
  const __mmask16 is_nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  return _mm512_cvtepi32_epi16(
      _mm512_mask_blend_epi32(is_nan, rounded, quiet_nan));
}

template <bool kScaled>
PSRT_AVX512 void Fp32ToFp16Avx512Impl(const float* in, float scale,
                                      uint16_t* out, size_t n) {
  const __m512 s = _mm512_set1_ps(scale);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 a = _mm512_loadu_ps(in + i);
    if (kScaled) a = _mm512_mul_ps(a, s);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i),
                        Avx512HalfFromFloat(a));
  }
  if (i < n) {
    const __mmask16 k = TailMask(n - i);
    __m512 a = _mm512_maskz_loadu_ps(k, in + i);
    if (kScaled) a = _mm512_mul_ps(a, s);
    _mm256_mask_storeu_epi16(out + i, k, Avx512HalfFromFloat(a));
  }
}

template <bool kScaled>
PSRT_AVX512 void Fp32ToBf16Avx512Impl(const float* in, float scale,
                                      uint16_t* out, size_t n) {
  const __m512 s = _mm512_set1_ps(scale);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 a = _mm512_loadu_ps(in + i);
    if (kScaled) a = _mm512_mul_ps(a, s);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i),
                        Avx512Bf16FromFloat(a));
  }
  if (i < n) {
    const __mmask16 k = TailMask(n - i);
    __m512 a = _mm512_maskz_loadu_ps(k, in + i);
    if (kScaled) a = _mm512_mul_ps(a, s);
    _mm256_mask_storeu_epi16(out + i, k, Avx512Bf16FromFloat(a));
  }
}

PSRT_AVX512 void Fp32ToFp16Avx512(const float* in, uint16_t* out, size_t n) {
  Fp32ToFp16Avx512Impl<false>(in, 1.0f, out, n);
}

PSRT_AVX512 void Fp32ToFp16ScaledAvx512(const float* in, float scale,
                                        uint16_t* out, size_t n) {
  Fp32ToFp16Avx512Impl<true>(in, scale, out, n);
}

PSRT_AVX512 void Fp32ToBf16Avx512(const float* in, uint16_t* out, size_t n) {
  Fp32ToBf16Avx512Impl<false>(in, 1.0f, out, n);
}

PSRT_AVX512 void Fp32ToBf16ScaledAvx512(const float* in, float scale,
                                        uint16_t* out, size_t n) {
  Fp32ToBf16Avx512Impl<true>(in, scale, out, n);
}

PSRT_AVX512 inline __m512 Avx512HalfToFloat(__m256i h) {
  return _mm512_cvtph_ps(h);
}

PSRT_AVX512 inline __m512 Avx512Bf16ToFloat(__m256i b) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
}

PSRT_AVX512 inline __m256i Avx512Load16(const uint16_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

PSRT_AVX512 void Fp16ToFp32Avx512(const uint16_t* in, float* out, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_ps(out + i, Avx512HalfToFloat(Avx512Load16(in + i)));
  }
  if (i < n) {
    const __mmask16 k = TailMask(n - i);
    _mm512_mask_storeu_ps(
        out + i, k, Avx512HalfToFloat(_mm256_maskz_loadu_epi16(k, in + i)));
  }
}

PSRT_AVX512 void Bf16ToFp32Avx512(const uint16_t* in, float* out, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_ps(out + i, Avx512Bf16ToFloat(Avx512Load16(in + i)));
  }
  if (i < n) {
    const __mmask16 k = TailMask(n - i);
    _mm512_mask_storeu_ps(
        out + i, k, Avx512Bf16ToFloat(_mm256_maskz_loadu_epi16(k, in + i)));
  }
}

PSRT_AVX512 void AccumulateFp16Avx512(const uint16_t* in, float scale,
                                      float* acc, size_t n) {
  const __m512 s = _mm512_set1_ps(scale);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 prod =
        _mm512_mul_ps(s, Avx512HalfToFloat(Avx512Load16(in + i)));
    _mm512_storeu_ps(acc + i, _mm512_add_ps(_mm512_loadu_ps(acc + i), prod));
  }
  if (i < n) {
    const __mmask16 k = TailMask(n - i);
    const __m512 prod = _mm512_mul_ps(
        s, Avx512HalfToFloat(_mm256_maskz_loadu_epi16(k, in + i)));
    _mm512_mask_storeu_ps(
        acc + i, k, _mm512_add_ps(_mm512_maskz_loadu_ps(k, acc + i), prod));
  }
}

PSRT_AVX512 void AccumulateBf16Avx512(const uint16_t* in, float scale,
                                      float* acc, size_t n) {
  const __m512 s = _mm512_set1_ps(scale);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 prod =
        _mm512_mul_ps(s, Avx512Bf16ToFloat(Avx512Load16(in + i)));
    _mm512_storeu_ps(acc + i, _mm512_add_ps(_mm512_loadu_ps(acc + i), prod));
  }
  if (i < n) {
    const __mmask16 k = TailMask(n - i);
    const __m512 prod = _mm512_mul_ps(
        s, Avx512Bf16ToFloat(_mm256_maskz_loadu_epi16(k, in + i)));
    _mm512_mask_storeu_ps(
        acc + i, k, _mm512_add_ps(_mm512_maskz_loadu_ps(k, acc + i), prod));
  }
}

PSRT_AVX512 float MaxAbsAvx512(const float* x, size_t n) {
  const __m512i abs_mask = _mm512_set1_epi32(0x7FFFFFFF);
  __m512i m0 = _mm512_setzero_si512();
  __m512i m1 = _mm512_setzero_si512();
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    m0 = _mm512_max_epi32(
        m0, _mm512_and_si512(_mm512_loadu_si512(x + i), abs_mask));
    m1 = _mm512_max_epi32(
        m1, _mm512_and_si512(_mm512_loadu_si512(x + i + 16), abs_mask));
  }
  for (; i + 16 <= n; i += 16) {
    m0 = _mm512_max_epi32(
        m0, _mm512_and_si512(_mm512_loadu_si512(x + i), abs_mask));
  }
  if (i < n) {
    // Masked-off lanes load as 0, which never wins the max.
    const __m512i tail =
        _mm512_castps_si512(_mm512_maskz_loadu_ps(TailMask(n - i), x + i));
    m1 = _mm512_max_epi32(m1, _mm512_and_si512(tail, abs_mask));
  }
  return BitsFloat(
      static_cast<uint32_t>(_mm512_reduce_max_epi32(_mm512_max_epi32(m0, m1))));
}

constexpr ConvertKernels kAvx512Kernels = {
    Isa::kAvx512,           Fp32ToFp16Avx512,     Fp16ToFp32Avx512,
    Fp32ToBf16Avx512,       Bf16ToFp32Avx512,     Fp32ToFp16ScaledAvx512,
    Fp32ToBf16ScaledAvx512, AccumulateFp16Avx512, AccumulateBf16Avx512,
    MaxAbsAvx512,
};

#pragma GCC diagnostic pop

#endif  // PSRT_KERNELS_X86

// Resolved once; DetectIsa() reads PSRT_KERNELS_ISA on first use.
const ConvertKernels& Active() {
  static const ConvertKernels& kernels = ConvertKernelsFor(DetectIsa());
  return kernels;
}

}  // namespace

const ConvertKernels& ConvertKernelsFor(Isa isa) {
#if PSRT_KERNELS_X86
  switch (isa) {
    case Isa::kScalar:
      return kScalarKernels;
    case Isa::kAvx2:
      return kAvx2Kernels;
    case Isa::kAvx512:
      return kAvx512Kernels;
  }
#endif
  (void)isa;
  return kScalarKernels;
}

uint16_t FloatToHalf(float x) { return HalfFromFloatBits(FloatBits(x)); }
float HalfToFloat(uint16_t h) { return HalfToFloatInline(h); }
uint16_t FloatToBf16(float x) { return Bf16FromFloatBits(FloatBits(x)); }
float Bf16ToFloat(uint16_t b) { return Bf16ToFloatInline(b); }

void Fp32ToFp16(const float* in, uint16_t* out, size_t n) {
  Active().fp32_to_fp16(in, out, n);
}

void Fp16ToFp32(const uint16_t* in, float* out, size_t n) {
  Active().fp16_to_fp32(in, out, n);
}

void Fp32ToBf16(const float* in, uint16_t* out, size_t n) {
  Active().fp32_to_bf16(in, out, n);
}

void Bf16ToFp32(const uint16_t* in, float* out, size_t n) {
  Active().bf16_to_fp32(in, out, n);
}

void Fp32ToFp16Scaled(const float* in, float scale, uint16_t* out, size_t n) {
  Active().fp32_to_fp16_scaled(in, scale, out, n);
}

void Fp32ToBf16Scaled(const float* in, float scale, uint16_t* out, size_t n) {
  Active().fp32_to_bf16_scaled(in, scale, out, n);
}

void AccumulateFp16(const uint16_t* in, float scale, float* acc, size_t n) {
  Active().accumulate_fp16(in, scale, acc, n);
}

void AccumulateBf16(const uint16_t* in, float scale, float* acc, size_t n) {
  Active().accumulate_bf16(in, scale, acc, n);
}

float MaxAbs(const float* x, size_t n) { return Active().max_abs(x, n); }

bool AllFinite(const float* x, size_t n) {
  // MaxAbs is NaN or Inf exactly when some element is; the bit test keeps
  // this free of <cmath> and of -ffinite-math-only surprises.
  return (FloatBits(MaxAbs(x, n)) & 0x7FFFFFFFu) < 0x7F800000u;
}

}  // namespace psrt
