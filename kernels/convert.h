// Float conversions for compressed push/pull payloads (DESIGN.md,
// Compression): fp32 <-> fp16 (IEEE binary16) and fp32 <-> bf16, scaling on
// the way out, accumulation into fp32 on the way in, and the max |x| that
// picks a scale.
//
// Rounding is IEEE round-to-nearest-even; +-Inf is kept; an fp32 too large for
// fp16 (>= 65520) becomes +-Inf, as IEEE overflow does; subnormals on both
// sides are converted exactly (no flush to zero, whatever MXCSR says for the
// integer paths). NaN stays NaN: the result is a quiet NaN with the input's
// sign and the top bits of its payload (what x86's F16C instructions do), so
// fp16 -> fp32 -> fp16 is the identity except that a signalling NaN comes
// back quiet. bf16 -> fp32 is exact (a 16-bit shift), NaN bits included.
//
// Every function here gives bit-identical results on every ISA (scalar, AVX2,
// AVX-512): the vector paths do the same IEEE float operations in the same
// order, without FMA contraction (psrt_kernels builds with -ffp-contract=off),
// so a result does not depend on which server's CPU computed it. (One
// exception: when arithmetic meets two NaNs, as in accumulating a NaN into a
// NaN, which payload survives is the compiler's operand order; NaN stays NaN.)
//
// The array functions take any alignment; `n == 0` does nothing (pointers may
// then be null); input and output must not overlap.

#ifndef PSRT_KERNELS_CONVERT_H_
#define PSRT_KERNELS_CONVERT_H_

#include <cstddef>
#include <cstdint>

#include "kernels/isa.h"

namespace psrt {

// One value, on the scalar path (the reference every vector path matches).
uint16_t FloatToHalf(float x);
float HalfToFloat(uint16_t h);
uint16_t FloatToBf16(float x);
float Bf16ToFloat(uint16_t b);

// out[i] = convert(in[i]).
void Fp32ToFp16(const float* in, uint16_t* out, size_t n);
void Fp16ToFp32(const uint16_t* in, float* out, size_t n);
void Fp32ToBf16(const float* in, uint16_t* out, size_t n);
void Bf16ToFp32(const uint16_t* in, float* out, size_t n);

// out[i] = convert(in[i] * scale): the product is rounded to fp32 first, then
// converted. For loss/gradient scaling before compression; MaxAbs gives the
// range to pick `scale` from.
void Fp32ToFp16Scaled(const float* in, float scale, uint16_t* out, size_t n);
void Fp32ToBf16Scaled(const float* in, float scale, uint16_t* out, size_t n);

// acc[i] += scale * float(in[i]) in one pass: the product is rounded to fp32,
// then added (two roundings; no FMA, so every ISA agrees). For summing
// compressed gradients into an fp32 buffer; scale = 1 / world_size averages.
void AccumulateFp16(const uint16_t* in, float scale, float* acc, size_t n);
void AccumulateBf16(const uint16_t* in, float scale, float* acc, size_t n);

// max |x[i]|, with NaN winning: NaN if any element is NaN, else +Inf if any is
// +-Inf, else the largest magnitude; 0 for n == 0. (Which NaN comes back is
// the same on every ISA, but do not rely on its payload.)
float MaxAbs(const float* x, size_t n);
// Whether no element is NaN or +-Inf (same pass as MaxAbs).
bool AllFinite(const float* x, size_t n);

// The kernels of one ISA, for tests and benchmarks that compare paths. The
// functions above use ConvertKernelsFor(DetectIsa()). Calling into a table
// whose ISA the CPU lacks dies with SIGILL: check IsaSupported(isa) first.
struct ConvertKernels {
  Isa isa;
  void (*fp32_to_fp16)(const float* in, uint16_t* out, size_t n);
  void (*fp16_to_fp32)(const uint16_t* in, float* out, size_t n);
  void (*fp32_to_bf16)(const float* in, uint16_t* out, size_t n);
  void (*bf16_to_fp32)(const uint16_t* in, float* out, size_t n);
  void (*fp32_to_fp16_scaled)(const float* in, float scale, uint16_t* out,
                              size_t n);
  void (*fp32_to_bf16_scaled)(const float* in, float scale, uint16_t* out,
                              size_t n);
  void (*accumulate_fp16)(const uint16_t* in, float scale, float* acc,
                          size_t n);
  void (*accumulate_bf16)(const uint16_t* in, float scale, float* acc,
                          size_t n);
  float (*max_abs)(const float* x, size_t n);
};
const ConvertKernels& ConvertKernelsFor(Isa isa);

}  // namespace psrt

#endif  // PSRT_KERNELS_CONVERT_H_
