// CUDA versions of kernels/convert.h and the optimizer update, on device
// pointers, so workers can compress gradients on the GPU before the
// device-to-host copy (DESIGN.md, Compression).
//
// Built (library psrt_kernels_cuda) only where nvcc is found; dependents then
// see PSRT_HAVE_CUDA=1. This header needs no CUDA headers. Every function
// enqueues its work on `stream` (nullptr: the legacy default stream) and
// returns without waiting; errors from the launch (or from a missing device)
// come back as a non-OK status, never as a crash, and name the CUDA error.
//
// The results match the CPU kernels bit for bit: the same rounding (IEEE
// round-to-nearest-even, subnormals kept), the same NaN bits for the plain
// conversions, and arithmetic in the same order without FMA contraction
// (__fmul_rn/__fadd_rn). One exception: where a result comes from arithmetic
// on a NaN (scaled conversion, accumulation, optimizer), the GPU returns its
// canonical NaN, so only the NaN-ness matches, not the payload.

#ifndef PSRT_KERNELS_CUDA_KERNELS_H_
#define PSRT_KERNELS_CUDA_KERNELS_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/optimizer.h"

// The CUDA runtime's own declaration (driver_types.h), repeated so callers
// need no CUDA headers; a repeated identical typedef is valid C++.
struct CUstream_st;
typedef struct CUstream_st* cudaStream_t;

namespace psrt {

// Whether a CUDA device can be used: false (no crash, no exception) when
// cudaGetDeviceCount fails, e.g. with cudaErrorInsufficientDriver on a machine
// without a GPU driver, or when it reports no device. Probed once.
bool CudaAvailable();
// Why CudaAvailable() is false ("" when it is true), for logs and test skips.
const char* CudaUnavailableReason();

// d_out[i] = convert(d_in[i]); the same rounding as Fp32ToFp16 etc.
absl::Status CudaFp32ToFp16(const float* d_in, uint16_t* d_out, size_t n,
                            cudaStream_t stream);
absl::Status CudaFp16ToFp32(const uint16_t* d_in, float* d_out, size_t n,
                            cudaStream_t stream);
absl::Status CudaFp32ToBf16(const float* d_in, uint16_t* d_out, size_t n,
                            cudaStream_t stream);
absl::Status CudaBf16ToFp32(const uint16_t* d_in, float* d_out, size_t n,
                            cudaStream_t stream);

// d_out[i] = convert(d_in[i] * scale), the product rounded to fp32 first.
absl::Status CudaFp32ToFp16Scaled(const float* d_in, float scale,
                                  uint16_t* d_out, size_t n,
                                  cudaStream_t stream);
absl::Status CudaFp32ToBf16Scaled(const float* d_in, float scale,
                                  uint16_t* d_out, size_t n,
                                  cudaStream_t stream);

// d_acc[i] += scale * float(d_in[i]) (product rounded, then added).
absl::Status CudaAccumulateFp16(const uint16_t* d_in, float scale, float* d_acc,
                                size_t n, cudaStream_t stream);
absl::Status CudaAccumulateBf16(const uint16_t* d_in, float scale, float* d_acc,
                                size_t n, cudaStream_t stream);

// *d_result = MaxAbs(d_x, n) (NaN if any element is NaN, 0 for n == 0),
// written to device memory so no host synchronisation is needed.
absl::Status CudaMaxAbs(const float* d_x, size_t n, float* d_result,
                        cudaStream_t stream);

// ApplyUpdate on device arrays: `d_slots` is a host array of NumSlots(c)
// device pointers. Same formulas and rounding as the CPU kernels.
absl::Status CudaApplyUpdate(const OptimizerConfig& c, double lr, int64_t step,
                             float* d_param, const float* d_grad,
                             float* const* d_slots, size_t n,
                             cudaStream_t stream);

// --- moving tensors between a training process's GPU and the host ----------

// Whether `p` points into CUDA device memory (false without a usable GPU).
bool IsDevicePointer(const void* p);
absl::Status CudaCopyToHost(const void* d_src, void* h_dst, size_t bytes);
absl::Status CudaCopyToDevice(const void* h_src, void* d_dst, size_t bytes);
// Page-locks host memory (cudaHostRegister, portable to every device), so
// that copies between it and a GPU go by DMA without a staging copy; shared
// memory may be registered by each process that maps it. Unpin before the
// memory is unmapped.
absl::Status CudaPinHost(void* h, size_t bytes);
void CudaUnpinHost(void* h);

// Encodes `n` float32 values in device memory into `h_out` (n uint16) as fp16
// or bf16, converting on the device so that only half the bytes cross to the
// host. For fp16 the block's largest magnitude, found on the device, picks a
// scale through `choose_scale` (common/compression.h's Fp16Scale); bf16 uses
// 1. Synchronous; a device staging buffer per thread is kept for reuse.
struct CudaEncoded {
  float scale = 1;
  bool nonfinite = false;
};
absl::StatusOr<CudaEncoded> CudaEncodeToHost(const float* d_in, size_t n, bool fp16,
                                             float (*choose_scale)(float), uint16_t* h_out);

}  // namespace psrt

#endif  // PSRT_KERNELS_CUDA_KERNELS_H_
