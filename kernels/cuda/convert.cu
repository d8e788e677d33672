// CUDA conversions, scaled conversions, accumulation and MaxAbs
// (kernels/cuda_kernels.h), bit-compatible with kernels/convert.cc.

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_util.h"
#include "kernels/cuda_kernels.h"

namespace psrt {
namespace {

using cuda_internal::Blocks;
using cuda_internal::CheckAvailable;
using cuda_internal::kThreads;
using cuda_internal::LaunchStatus;

// --- element conversions
// ------------------------------------------------------

// fp16 through the hardware conversion (IEEE round to nearest even,
// subnormals kept, overflow to Inf), except NaN: the GPU returns its canonical
// NaN, the CPU kernels keep the sign and the top payload bits, quiet. Match
// the CPU.
__device__ __forceinline__ uint16_t DevHalfFromFloat(float x) {
  const uint32_t b = __float_as_uint(x);
  if ((b & 0x7FFFFFFFu) > 0x7F800000u) {
    return static_cast<uint16_t>(((b >> 16) & 0x8000u) | 0x7E00u |
                                 ((b >> 13) & 0x3FFu));
  }
  return __half_as_ushort(__float2half_rn(x));
}

__device__ __forceinline__ float DevHalfToFloat(uint16_t h) {
  if ((h & 0x7C00u) == 0x7C00u && (h & 0x3FFu) != 0) {
    // NaN: payload kept, made quiet (as F16C does).
    return __uint_as_float((static_cast<uint32_t>(h & 0x8000u) << 16) |
                           0x7FC00000u |
                           (static_cast<uint32_t>(h & 0x3FFu) << 13));
  }
  return __half2float(__ushort_as_half(h));
}

// bf16 with the CPU's integer rounding (convert.cc, Bf16FromFloatBits): a few
// integer ops, exact for subnormals, no dependence on the GPU's cvt modes.
__device__ __forceinline__ uint16_t DevBf16FromFloat(float x) {
  const uint32_t b = __float_as_uint(x);
  if ((b & 0x7FFFFFFFu) > 0x7F800000u) {
    return static_cast<uint16_t>((b >> 16) | 0x40u);
  }
  return static_cast<uint16_t>((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16);
}

__device__ __forceinline__ float DevBf16ToFloat(uint16_t b) {
  return __uint_as_float(static_cast<uint32_t>(b) << 16);
}

// --- kernels
// --------------------------------------------------------------------

struct ToHalf {
  __device__ uint16_t operator()(float x) const { return DevHalfFromFloat(x); }
};
struct FromHalf {
  __device__ float operator()(uint16_t h) const { return DevHalfToFloat(h); }
};
struct ToBf16 {
  __device__ uint16_t operator()(float x) const { return DevBf16FromFloat(x); }
};
struct FromBf16 {
  __device__ float operator()(uint16_t b) const { return DevBf16ToFloat(b); }
};
// __fmul_rn: never fused with a later operation, like the CPU's separate
// multiply.
struct ToHalfScaled {
  float scale;
  __device__ uint16_t operator()(float x) const {
    return DevHalfFromFloat(__fmul_rn(x, scale));
  }
};
struct ToBf16Scaled {
  float scale;
  __device__ uint16_t operator()(float x) const {
    return DevBf16FromFloat(__fmul_rn(x, scale));
  }
};

template <typename In, typename Out, typename Op>
__global__ void MapKernel(const In* in, Out* out, size_t n, Op op) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < n; i += stride) {
    out[i] = op(in[i]);
  }
}

// acc += scale * x, product rounded first (CPU: separate mul and add).
template <typename Decode>
__global__ void AccumulateKernel(const uint16_t* in, float scale, float* acc,
                                 size_t n, Decode decode) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < n; i += stride) {
    acc[i] = __fadd_rn(acc[i], __fmul_rn(scale, decode(in[i])));
  }
}

// Integer max over |x| bits, as on the CPU: NaN bits sort above Inf, so NaN
// wins. `result` must hold 0 before the launch.
__global__ void MaxAbsKernel(const float* x, size_t n, unsigned int* result) {
  unsigned int m = 0;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < n; i += stride) {
    m = max(m, __float_as_uint(x[i]) & 0x7FFFFFFFu);
  }
  for (int offset = 16; offset > 0; offset >>= 1) {
    m = max(m, __shfl_down_sync(0xFFFFFFFFu, m, offset));
  }
  __shared__ unsigned int warp_max[kThreads / 32];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  if (lane == 0) warp_max[warp] = m;
  __syncthreads();
  if (warp == 0) {
    m = lane < kThreads / 32 ? warp_max[lane] : 0u;
    for (int offset = 16; offset > 0; offset >>= 1) {
      m = max(m, __shfl_down_sync(0xFFFFFFFFu, m, offset));
    }
    if (lane == 0) atomicMax(result, m);
  }
}

template <typename In, typename Out, typename Op>
absl::Status Map(const char* what, const In* in, Out* out, size_t n, Op op,
                 cudaStream_t stream) {
  if (n == 0) return absl::OkStatus();
  absl::Status s = CheckAvailable(what);
  if (!s.ok()) return s;
  MapKernel<<<Blocks(n), kThreads, 0, stream>>>(in, out, n, op);
  return LaunchStatus(what);
}

template <typename Decode>
absl::Status Accumulate(const char* what, const uint16_t* in, float scale,
                        float* acc, size_t n, Decode decode,
                        cudaStream_t stream) {
  if (n == 0) return absl::OkStatus();
  absl::Status s = CheckAvailable(what);
  if (!s.ok()) return s;
  AccumulateKernel<<<Blocks(n), kThreads, 0, stream>>>(in, scale, acc, n,
                                                       decode);
  return LaunchStatus(what);
}

struct Probe {
  bool available;
  std::string reason;
};

Probe RunProbe() {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    cudaGetLastError();  // clear it so later calls do not report it again
    return {false,
            absl::StrCat("cudaGetDeviceCount failed: ", cudaGetErrorName(e),
                         ": ", cudaGetErrorString(e))};
  }
  if (count == 0) return {false, "no CUDA device"};
  return {true, ""};
}

const Probe& GetProbe() {
  static const Probe probe = RunProbe();
  return probe;
}

}  // namespace

bool CudaAvailable() { return GetProbe().available; }

const char* CudaUnavailableReason() { return GetProbe().reason.c_str(); }

absl::Status CudaFp32ToFp16(const float* d_in, uint16_t* d_out, size_t n,
                            cudaStream_t stream) {
  return Map("CudaFp32ToFp16", d_in, d_out, n, ToHalf{}, stream);
}

absl::Status CudaFp16ToFp32(const uint16_t* d_in, float* d_out, size_t n,
                            cudaStream_t stream) {
  return Map("CudaFp16ToFp32", d_in, d_out, n, FromHalf{}, stream);
}

absl::Status CudaFp32ToBf16(const float* d_in, uint16_t* d_out, size_t n,
                            cudaStream_t stream) {
  return Map("CudaFp32ToBf16", d_in, d_out, n, ToBf16{}, stream);
}

absl::Status CudaBf16ToFp32(const uint16_t* d_in, float* d_out, size_t n,
                            cudaStream_t stream) {
  return Map("CudaBf16ToFp32", d_in, d_out, n, FromBf16{}, stream);
}

absl::Status CudaFp32ToFp16Scaled(const float* d_in, float scale,
                                  uint16_t* d_out, size_t n,
                                  cudaStream_t stream) {
  return Map("CudaFp32ToFp16Scaled", d_in, d_out, n, ToHalfScaled{scale},
             stream);
}

absl::Status CudaFp32ToBf16Scaled(const float* d_in, float scale,
                                  uint16_t* d_out, size_t n,
                                  cudaStream_t stream) {
  return Map("CudaFp32ToBf16Scaled", d_in, d_out, n, ToBf16Scaled{scale},
             stream);
}

absl::Status CudaAccumulateFp16(const uint16_t* d_in, float scale, float* d_acc,
                                size_t n, cudaStream_t stream) {
  return Accumulate("CudaAccumulateFp16", d_in, scale, d_acc, n, FromHalf{},
                    stream);
}

absl::Status CudaAccumulateBf16(const uint16_t* d_in, float scale, float* d_acc,
                                size_t n, cudaStream_t stream) {
  return Accumulate("CudaAccumulateBf16", d_in, scale, d_acc, n, FromBf16{},
                    stream);
}

absl::Status CudaMaxAbs(const float* d_x, size_t n, float* d_result,
                        cudaStream_t stream) {
  constexpr const char* kWhat = "CudaMaxAbs";
  absl::Status s = CheckAvailable(kWhat);
  if (!s.ok()) return s;
  const absl::Status zeroed = cuda_internal::CudaStatus(
      cudaMemsetAsync(d_result, 0, sizeof(float), stream), kWhat);
  if (!zeroed.ok() || n == 0) return zeroed;
  // Few blocks: each ends in one atomicMax on the result.
  MaxAbsKernel<<<Blocks(n, 1024), kThreads, 0, stream>>>(
      d_x, n, reinterpret_cast<unsigned int*>(d_result));
  return LaunchStatus(kWhat);
}

}  // namespace psrt
