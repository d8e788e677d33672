// Internals of kernels/optimizer.h shared by the per-ISA CPU kernels, the
// CUDA kernels (kernels/cuda/optimizer.cu) and the tests that compare them.
// Not for other callers: use ApplyUpdate.
//
// ApplyUpdate turns (config, lr, step) into the float scalars below once, on
// the host and in double where torch does, then runs one fused pass over the
// arrays. Every variant performs the same IEEE float operations in the same
// order (no FMA contraction: psrt_kernels builds with -ffp-contract=off and
// the CUDA code uses __fmul_rn/__fadd_rn), so all of them, Eigen's baseline
// included, return bit-identical results.

#ifndef PSRT_KERNELS_OPTIMIZER_INTERNAL_H_
#define PSRT_KERNELS_OPTIMIZER_INTERNAL_H_

#include <cstddef>
#include <cstdint>

#include "kernels/isa.h"
#include "kernels/optimizer.h"

namespace psrt {
namespace kernels_internal {

// Per element, with g = grad + wd * param when wd != 0 (torch skips the add
// at 0, so an Inf param does not turn the gradient into NaN):
//   no momentum:  param += neg_lr * g
//   first step:   buf = g                      (torch clones grad; no
//   dampening) later steps:  buf = buf * momentum + keep * g then param +=
//   neg_lr * (nesterov ? g + momentum * buf : buf)
struct SgdParams {
  float neg_lr;
  float wd;
  float momentum;
  float keep;  // 1 - dampening
  bool has_momentum;
  bool nesterov;
  bool first_step;
};

// Per element (AdamW decays param first, Adam folds wd into g):
//   if (apply_decay) param *= decay
//   g = grad (+ wd * param when wd != 0)
//   exp_avg = small_w ? exp_avg + w * (g - exp_avg)          (torch's lerp)
//                     : g - (g - exp_avg) * one_minus_w
//   exp_avg_sq = exp_avg_sq * beta2 + (one_minus_beta2 * g) * g
//   param += (neg_step_size * exp_avg) / (sqrt(exp_avg_sq) / bc2_sqrt + eps)
struct AdamParams {
  float neg_step_size;  // -lr / (1 - beta1^step)
  float bc2_sqrt;       // sqrt(1 - beta2^step)
  float eps;
  float beta2;
  float one_minus_beta2;
  float w;  // 1 - beta1
  float one_minus_w;
  float wd;     // L2 (Adam); 0 for AdamW
  float decay;  // 1 - lr * weight_decay (AdamW)
  bool small_w;
  bool apply_decay;
};

// Per element: g = grad (+ wd * param); sum += g * g;
//   param += (neg_clr * g) / (sqrt(sum) + eps)
struct AdaGradParams {
  float neg_clr;  // -lr / (1 + (step - 1) * lr_decay)
  float wd;
  float eps;
};

SgdParams MakeSgdParams(const OptimizerConfig& c, double lr, int64_t step);
AdamParams MakeAdamParams(const OptimizerConfig& c, double lr, int64_t step);
AdaGradParams MakeAdaGradParams(const OptimizerConfig& c, double lr,
                                int64_t step);

// One ISA's kernels. `buf` may be null when !has_momentum.
struct OptimizerKernels {
  Isa isa;
  void (*sgd)(const SgdParams& p, float* param, const float* grad, float* buf,
              size_t n);
  void (*adam)(const AdamParams& p, float* param, const float* grad,
               float* exp_avg, float* exp_avg_sq, size_t n);
  void (*adagrad)(const AdaGradParams& p, float* param, const float* grad,
                  float* sum, size_t n);
};

// kScalar is the Eigen code (baseline ISA); kAvx2/kAvx512 are intrinsics.
// Check IsaSupported(isa) before calling into a table.
const OptimizerKernels& OptimizerKernelsFor(Isa isa);

// ApplyUpdate on the kernels of `isa` instead of DetectIsa()'s.
void ApplyUpdateWithIsa(Isa isa, const OptimizerConfig& c, double lr,
                        int64_t step, float* param, const float* grad,
                        float* const* slots, size_t n);

// Defined in optimizer_simd.cc (null tables off x86).
const OptimizerKernels* Avx2OptimizerKernels();
const OptimizerKernels* Avx512OptimizerKernels();

}  // namespace kernels_internal
}  // namespace psrt

#endif  // PSRT_KERNELS_OPTIMIZER_INTERNAL_H_
