// AVX2 and AVX-512 versions of the optimizer kernels in optimizer.cc.
//
// Each is one fused pass: per vector, load param/grad/slots, do the whole
// update in registers, store. They repeat the Eigen expressions of
// optimizer.cc operation for operation and in the same order, with separate
// multiply and add (this file, like all of psrt_kernels, builds with
// -ffp-contract=off), exact sqrt and division, so their results are
// bit-identical to the baseline kernels'. FMA would buy nothing here: the
// update is bound by memory bandwidth, not arithmetic.
//
// No Eigen in this file, and the file itself is compiled for the baseline
// ISA: only the functions marked with a `target` attribute use AVX, so no
// shared inline code is emitted with AVX-512 instructions (see convert.cc).

#include <cstddef>

#include "kernels/isa.h"
#include "kernels/optimizer_internal.h"

#if defined(__x86_64__) && defined(__GNUC__)
#define PSRT_KERNELS_X86 1
#include <immintrin.h>
#endif

namespace psrt {
namespace kernels_internal {

#if PSRT_KERNELS_X86
namespace {

// --- AVX2
// ---------------------------------------------------------------------- 8
// lanes; the ragged end goes through the same code with masked loads and stores
// (masked-off lanes are not touched in memory).

#define PSRT_AVX2 __attribute__((target("avx2,fma,f16c")))

PSRT_AVX2 inline __m256i Avx2TailMask(size_t remaining) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(remaining)),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// Loads and stores for a full vector (kMasked = false) or the tail.
template <bool kMasked>
PSRT_AVX2 inline __m256 Avx2Load(const float* p, __m256i mask) {
  return kMasked ? _mm256_maskload_ps(p, mask) : _mm256_loadu_ps(p);
}

template <bool kMasked>
PSRT_AVX2 inline void Avx2Store(float* p, __m256i mask, __m256 v) {
  if (kMasked) {
    _mm256_maskstore_ps(p, mask, v);
  } else {
    _mm256_storeu_ps(p, v);
  }
}

// grad + wd * param, skipped at wd == 0 like DecayedGrad.
PSRT_AVX2 inline __m256 Avx2DecayedGrad(float wd, __m256 g, __m256 p) {
  if (wd == 0.0f) return g;
  return _mm256_add_ps(g, _mm256_mul_ps(_mm256_set1_ps(wd), p));
}

template <bool kMasked>
PSRT_AVX2 inline void Avx2SgdStep(const SgdParams& s, float* param,
                                  const float* grad, float* buf_slot,
                                  __m256i mask) {
  const __m256 neg_lr = _mm256_set1_ps(s.neg_lr);
  __m256 p = Avx2Load<kMasked>(param, mask);
  const __m256 g = Avx2DecayedGrad(s.wd, Avx2Load<kMasked>(grad, mask), p);
  if (!s.has_momentum) {
    Avx2Store<kMasked>(param, mask, _mm256_add_ps(p, _mm256_mul_ps(neg_lr, g)));
    return;
  }
  const __m256 momentum = _mm256_set1_ps(s.momentum);
  __m256 buf;
  if (s.first_step) {
    buf = g;
  } else {
    buf = _mm256_add_ps(
        _mm256_mul_ps(Avx2Load<kMasked>(buf_slot, mask), momentum),
        _mm256_mul_ps(_mm256_set1_ps(s.keep), g));
  }
  Avx2Store<kMasked>(buf_slot, mask, buf);
  const __m256 dir =
      s.nesterov ? _mm256_add_ps(g, _mm256_mul_ps(momentum, buf)) : buf;
  p = _mm256_add_ps(p, _mm256_mul_ps(neg_lr, dir));
  Avx2Store<kMasked>(param, mask, p);
}

template <bool kMasked>
PSRT_AVX2 inline void Avx2AdamStep(const AdamParams& s, float* param,
                                   const float* grad, float* exp_avg,
                                   float* exp_avg_sq, __m256i mask) {
  __m256 p = Avx2Load<kMasked>(param, mask);
  if (s.apply_decay) p = _mm256_mul_ps(p, _mm256_set1_ps(s.decay));
  const __m256 g = Avx2DecayedGrad(s.wd, Avx2Load<kMasked>(grad, mask), p);
  __m256 m = Avx2Load<kMasked>(exp_avg, mask);
  if (s.small_w) {
    m = _mm256_add_ps(m,
                      _mm256_mul_ps(_mm256_set1_ps(s.w), _mm256_sub_ps(g, m)));
  } else {
    m = _mm256_sub_ps(
        g, _mm256_mul_ps(_mm256_sub_ps(g, m), _mm256_set1_ps(s.one_minus_w)));
  }
  __m256 v = Avx2Load<kMasked>(exp_avg_sq, mask);
  v = _mm256_add_ps(
      _mm256_mul_ps(v, _mm256_set1_ps(s.beta2)),
      _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(s.one_minus_beta2), g), g));
  const __m256 denom = _mm256_add_ps(
      _mm256_div_ps(_mm256_sqrt_ps(v), _mm256_set1_ps(s.bc2_sqrt)),
      _mm256_set1_ps(s.eps));
  p = _mm256_add_ps(
      p,
      _mm256_div_ps(_mm256_mul_ps(_mm256_set1_ps(s.neg_step_size), m), denom));
  Avx2Store<kMasked>(exp_avg, mask, m);
  Avx2Store<kMasked>(exp_avg_sq, mask, v);
  Avx2Store<kMasked>(param, mask, p);
}

template <bool kMasked>
PSRT_AVX2 inline void Avx2AdaGradStep(const AdaGradParams& s, float* param,
                                      const float* grad, float* sum_slot,
                                      __m256i mask) {
  __m256 p = Avx2Load<kMasked>(param, mask);
  const __m256 g = Avx2DecayedGrad(s.wd, Avx2Load<kMasked>(grad, mask), p);
  const __m256 sum =
      _mm256_add_ps(Avx2Load<kMasked>(sum_slot, mask), _mm256_mul_ps(g, g));
  const __m256 denom =
      _mm256_add_ps(_mm256_sqrt_ps(sum), _mm256_set1_ps(s.eps));
  p = _mm256_add_ps(
      p, _mm256_div_ps(_mm256_mul_ps(_mm256_set1_ps(s.neg_clr), g), denom));
  Avx2Store<kMasked>(sum_slot, mask, sum);
  Avx2Store<kMasked>(param, mask, p);
}

PSRT_AVX2 void SgdAvx2(const SgdParams& params, float* param, const float* grad,
                       float* buf, size_t n) {
  const SgdParams s = params;  // a local copy: stores cannot alias it
  const __m256i all = _mm256_set1_epi32(-1);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    Avx2SgdStep<false>(s, param + i, grad + i, buf ? buf + i : nullptr, all);
  }
  if (i < n) {
    Avx2SgdStep<true>(s, param + i, grad + i, buf ? buf + i : nullptr,
                      Avx2TailMask(n - i));
  }
}

PSRT_AVX2 void AdamAvx2(const AdamParams& params, float* param,
                        const float* grad, float* exp_avg, float* exp_avg_sq,
                        size_t n) {
  const AdamParams s = params;  // a local copy: stores cannot alias it
  const __m256i all = _mm256_set1_epi32(-1);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    Avx2AdamStep<false>(s, param + i, grad + i, exp_avg + i, exp_avg_sq + i,
                        all);
  }
  if (i < n) {
    Avx2AdamStep<true>(s, param + i, grad + i, exp_avg + i, exp_avg_sq + i,
                       Avx2TailMask(n - i));
  }
}

PSRT_AVX2 void AdaGradAvx2(const AdaGradParams& params, float* param,
                           const float* grad, float* sum, size_t n) {
  const AdaGradParams s = params;  // a local copy: stores cannot alias it
  const __m256i all = _mm256_set1_epi32(-1);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    Avx2AdaGradStep<false>(s, param + i, grad + i, sum + i, all);
  }
  if (i < n) {
    Avx2AdaGradStep<true>(s, param + i, grad + i, sum + i, Avx2TailMask(n - i));
  }
}

constexpr OptimizerKernels kAvx2Kernels = {Isa::kAvx2, SgdAvx2, AdamAvx2,
                                           AdaGradAvx2};

// --- AVX-512
// ------------------------------------------------------------------- 16 lanes,
// the same steps; the tail uses AVX-512's mask registers.

// See convert.cc: GCC 12's AVX-512 headers trip -Wuninitialized (PR 105593).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#if !defined(__clang__)  // a GCC-only warning
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#define PSRT_AVX512 \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))

template <bool kMasked>
PSRT_AVX512 inline __m512 Avx512Load(const float* p, __mmask16 k) {
  return kMasked ? _mm512_maskz_loadu_ps(k, p) : _mm512_loadu_ps(p);
}

template <bool kMasked>
PSRT_AVX512 inline void Avx512Store(float* p, __mmask16 k, __m512 v) {
  if (kMasked) {
    _mm512_mask_storeu_ps(p, k, v);
  } else {
    _mm512_storeu_ps(p, v);
  }
}

PSRT_AVX512 inline __m512 Avx512DecayedGrad(float wd, __m512 g, __m512 p) {
  if (wd == 0.0f) return g;
  return _mm512_add_ps(g, _mm512_mul_ps(_mm512_set1_ps(wd), p));
}

template <bool kMasked>
PSRT_AVX512 inline void Avx512SgdStep(const SgdParams& s, float* param,
                                      const float* grad, float* buf_slot,
                                      __mmask16 k) {
  const __m512 neg_lr = _mm512_set1_ps(s.neg_lr);
  __m512 p = Avx512Load<kMasked>(param, k);
  const __m512 g = Avx512DecayedGrad(s.wd, Avx512Load<kMasked>(grad, k), p);
  if (!s.has_momentum) {
    Avx512Store<kMasked>(param, k, _mm512_add_ps(p, _mm512_mul_ps(neg_lr, g)));
    return;
  }
  const __m512 momentum = _mm512_set1_ps(s.momentum);
  __m512 buf;
  if (s.first_step) {
    buf = g;
  } else {
    buf =
        _mm512_add_ps(_mm512_mul_ps(Avx512Load<kMasked>(buf_slot, k), momentum),
                      _mm512_mul_ps(_mm512_set1_ps(s.keep), g));
  }
  Avx512Store<kMasked>(buf_slot, k, buf);
  const __m512 dir =
      s.nesterov ? _mm512_add_ps(g, _mm512_mul_ps(momentum, buf)) : buf;
  p = _mm512_add_ps(p, _mm512_mul_ps(neg_lr, dir));
  Avx512Store<kMasked>(param, k, p);
}

template <bool kMasked>
PSRT_AVX512 inline void Avx512AdamStep(const AdamParams& s, float* param,
                                       const float* grad, float* exp_avg,
                                       float* exp_avg_sq, __mmask16 k) {
  __m512 p = Avx512Load<kMasked>(param, k);
  if (s.apply_decay) p = _mm512_mul_ps(p, _mm512_set1_ps(s.decay));
  const __m512 g = Avx512DecayedGrad(s.wd, Avx512Load<kMasked>(grad, k), p);
  __m512 m = Avx512Load<kMasked>(exp_avg, k);
  if (s.small_w) {
    m = _mm512_add_ps(m,
                      _mm512_mul_ps(_mm512_set1_ps(s.w), _mm512_sub_ps(g, m)));
  } else {
    m = _mm512_sub_ps(
        g, _mm512_mul_ps(_mm512_sub_ps(g, m), _mm512_set1_ps(s.one_minus_w)));
  }
  __m512 v = Avx512Load<kMasked>(exp_avg_sq, k);
  v = _mm512_add_ps(
      _mm512_mul_ps(v, _mm512_set1_ps(s.beta2)),
      _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(s.one_minus_beta2), g), g));
  const __m512 denom = _mm512_add_ps(
      _mm512_div_ps(_mm512_sqrt_ps(v), _mm512_set1_ps(s.bc2_sqrt)),
      _mm512_set1_ps(s.eps));
  p = _mm512_add_ps(
      p,
      _mm512_div_ps(_mm512_mul_ps(_mm512_set1_ps(s.neg_step_size), m), denom));
  Avx512Store<kMasked>(exp_avg, k, m);
  Avx512Store<kMasked>(exp_avg_sq, k, v);
  Avx512Store<kMasked>(param, k, p);
}

template <bool kMasked>
PSRT_AVX512 inline void Avx512AdaGradStep(const AdaGradParams& s, float* param,
                                          const float* grad, float* sum_slot,
                                          __mmask16 k) {
  __m512 p = Avx512Load<kMasked>(param, k);
  const __m512 g = Avx512DecayedGrad(s.wd, Avx512Load<kMasked>(grad, k), p);
  const __m512 sum =
      _mm512_add_ps(Avx512Load<kMasked>(sum_slot, k), _mm512_mul_ps(g, g));
  const __m512 denom =
      _mm512_add_ps(_mm512_sqrt_ps(sum), _mm512_set1_ps(s.eps));
  p = _mm512_add_ps(
      p, _mm512_div_ps(_mm512_mul_ps(_mm512_set1_ps(s.neg_clr), g), denom));
  Avx512Store<kMasked>(sum_slot, k, sum);
  Avx512Store<kMasked>(param, k, p);
}

PSRT_AVX512 inline __mmask16 Avx512TailMask(size_t remaining) {
  return static_cast<__mmask16>((1u << remaining) - 1u);
}

PSRT_AVX512 void SgdAvx512(const SgdParams& params, float* param,
                           const float* grad, float* buf, size_t n) {
  const SgdParams s = params;  // a local copy: stores cannot alias it
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    Avx512SgdStep<false>(s, param + i, grad + i, buf ? buf + i : nullptr,
                         0xFFFF);
  }
  if (i < n) {
    Avx512SgdStep<true>(s, param + i, grad + i, buf ? buf + i : nullptr,
                        Avx512TailMask(n - i));
  }
}

PSRT_AVX512 void AdamAvx512(const AdamParams& params, float* param,
                            const float* grad, float* exp_avg,
                            float* exp_avg_sq, size_t n) {
  const AdamParams s = params;  // a local copy: stores cannot alias it
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    Avx512AdamStep<false>(s, param + i, grad + i, exp_avg + i, exp_avg_sq + i,
                          0xFFFF);
  }
  if (i < n) {
    Avx512AdamStep<true>(s, param + i, grad + i, exp_avg + i, exp_avg_sq + i,
                         Avx512TailMask(n - i));
  }
}

PSRT_AVX512 void AdaGradAvx512(const AdaGradParams& params, float* param,
                               const float* grad, float* sum, size_t n) {
  const AdaGradParams s = params;  // a local copy: stores cannot alias it
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    Avx512AdaGradStep<false>(s, param + i, grad + i, sum + i, 0xFFFF);
  }
  if (i < n) {
    Avx512AdaGradStep<true>(s, param + i, grad + i, sum + i,
                            Avx512TailMask(n - i));
  }
}

#pragma GCC diagnostic pop

constexpr OptimizerKernels kAvx512Kernels = {Isa::kAvx512, SgdAvx512,
                                             AdamAvx512, AdaGradAvx512};

}  // namespace

const OptimizerKernels* Avx2OptimizerKernels() { return &kAvx2Kernels; }
const OptimizerKernels* Avx512OptimizerKernels() { return &kAvx512Kernels; }

#else  // !PSRT_KERNELS_X86

const OptimizerKernels* Avx2OptimizerKernels() { return nullptr; }
const OptimizerKernels* Avx512OptimizerKernels() { return nullptr; }

#endif  // PSRT_KERNELS_X86

}  // namespace kernels_internal
}  // namespace psrt
