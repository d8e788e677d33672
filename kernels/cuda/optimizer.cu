// CudaApplyUpdate (kernels/cuda_kernels.h): the optimizer update of
// kernels/optimizer.cc on device arrays.
//
// The scalars come from the same host code as the CPU kernels
// (kernels_internal::Make*Params), and each kernel repeats the CPU's
// operations in the same order with round-to-nearest intrinsics: nvcc would
// otherwise contract a * b + c into an FMA (--fmad=true is its default) and
// round differently from the CPU. __fdiv_rn and __fsqrt_rn are IEEE exact, as
// on the CPU.

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/cuda_util.h"
#include "kernels/cuda_kernels.h"
#include "kernels/optimizer.h"
#include "kernels/optimizer_internal.h"

namespace psrt {
namespace {

using cuda_internal::Blocks;
using cuda_internal::CheckAvailable;
using cuda_internal::kThreads;
using cuda_internal::LaunchStatus;
using kernels_internal::AdaGradParams;
using kernels_internal::AdamParams;
using kernels_internal::SgdParams;

__device__ __forceinline__ float Add(float a, float b) {
  return __fadd_rn(a, b);
}
__device__ __forceinline__ float Sub(float a, float b) {
  return __fsub_rn(a, b);
}
__device__ __forceinline__ float Mul(float a, float b) {
  return __fmul_rn(a, b);
}
__device__ __forceinline__ float Div(float a, float b) {
  return __fdiv_rn(a, b);
}

// grad + wd * param, skipped at wd == 0 (torch skips the add).
__device__ __forceinline__ float DecayedGrad(float wd, float g, float p) {
  return wd == 0.0f ? g : Add(g, Mul(wd, p));
}

// See kernels_internal::SgdParams for the formulas.
__global__ void SgdKernel(SgdParams s, float* param, const float* grad,
                          float* buf_slot, size_t n) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < n; i += stride) {
    const float p = param[i];
    const float g = DecayedGrad(s.wd, grad[i], p);
    if (!s.has_momentum) {
      param[i] = Add(p, Mul(s.neg_lr, g));
      continue;
    }
    const float buf =
        s.first_step ? g : Add(Mul(buf_slot[i], s.momentum), Mul(s.keep, g));
    buf_slot[i] = buf;
    const float dir = s.nesterov ? Add(g, Mul(s.momentum, buf)) : buf;
    param[i] = Add(p, Mul(s.neg_lr, dir));
  }
}

// See kernels_internal::AdamParams.
__global__ void AdamKernel(AdamParams s, float* param, const float* grad,
                           float* exp_avg, float* exp_avg_sq, size_t n) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < n; i += stride) {
    float p = param[i];
    if (s.apply_decay) p = Mul(p, s.decay);
    const float g = DecayedGrad(s.wd, grad[i], p);
    float m = exp_avg[i];
    m = s.small_w ? Add(m, Mul(s.w, Sub(g, m)))
                  : Sub(g, Mul(Sub(g, m), s.one_minus_w));
    const float v =
        Add(Mul(exp_avg_sq[i], s.beta2), Mul(Mul(s.one_minus_beta2, g), g));
    const float denom = Add(Div(__fsqrt_rn(v), s.bc2_sqrt), s.eps);
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    param[i] = Add(p, Div(Mul(s.neg_step_size, m), denom));
  }
}

// See kernels_internal::AdaGradParams.
__global__ void AdaGradKernel(AdaGradParams s, float* param, const float* grad,
                              float* sum_slot, size_t n) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < n; i += stride) {
    const float p = param[i];
    const float g = DecayedGrad(s.wd, grad[i], p);
    const float sum = Add(sum_slot[i], Mul(g, g));
    sum_slot[i] = sum;
    param[i] = Add(p, Div(Mul(s.neg_clr, g), Add(__fsqrt_rn(sum), s.eps)));
  }
}

}  // namespace

absl::Status CudaApplyUpdate(const OptimizerConfig& c, double lr, int64_t step,
                             float* d_param, const float* d_grad,
                             float* const* d_slots, size_t n,
                             cudaStream_t stream) {
  constexpr const char* kWhat = "CudaApplyUpdate";
  if (step < 1) {
    return absl::InvalidArgumentError("CudaApplyUpdate: step must be >= 1");
  }
  if (n == 0) return absl::OkStatus();
  if (NumSlots(c) > 0 && d_slots == nullptr) {
    return absl::InvalidArgumentError("CudaApplyUpdate: slots missing");
  }
  absl::Status status = CheckAvailable(kWhat);
  if (!status.ok()) return status;
  switch (c.kind) {
    case OptimizerKind::kSgd: {
      const SgdParams s = kernels_internal::MakeSgdParams(c, lr, step);
      SgdKernel<<<Blocks(n), kThreads, 0, stream>>>(
          s, d_param, d_grad, s.has_momentum ? d_slots[0] : nullptr, n);
      break;
    }
    case OptimizerKind::kAdam:
    case OptimizerKind::kAdamW:
      AdamKernel<<<Blocks(n), kThreads, 0, stream>>>(
          kernels_internal::MakeAdamParams(c, lr, step), d_param, d_grad,
          d_slots[0], d_slots[1], n);
      break;
    case OptimizerKind::kAdaGrad:
      AdaGradKernel<<<Blocks(n), kThreads, 0, stream>>>(
          kernels_internal::MakeAdaGradParams(c, lr, step), d_param, d_grad,
          d_slots[0], n);
      break;
    default:
      return absl::InvalidArgumentError("CudaApplyUpdate: unknown optimizer");
  }
  return LaunchStatus(kWhat);
}

}  // namespace psrt
