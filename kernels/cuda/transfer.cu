// Moving a training process's tensors between its GPU and the host
// (kernels/cuda_kernels.h): plain copies, and gradients compressed on the
// device before the device-to-host copy.

#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cuda/cuda_util.h"
#include "kernels/cuda_kernels.h"

namespace psrt {
namespace {

using cuda_internal::CheckAvailable;
using cuda_internal::CudaStatus;

// A device buffer per thread, grown as needed and reused: allocating device
// memory per message would cost far more than the conversion.
struct Staging {
  void* data = nullptr;
  size_t bytes = 0;
  float* max_abs = nullptr;
  ~Staging() {
    if (data != nullptr) cudaFree(data);
    if (max_abs != nullptr) cudaFree(max_abs);
  }
  absl::Status Reserve(size_t want) {
    if (max_abs == nullptr) {
      if (absl::Status s = CudaStatus(cudaMalloc(&max_abs, sizeof(float)), "cudaMalloc"); !s.ok()) return s;
    }
    if (want <= bytes) return absl::OkStatus();
    if (data != nullptr) cudaFree(data);
    data = nullptr;
    bytes = 0;
    if (absl::Status s = CudaStatus(cudaMalloc(&data, want), "cudaMalloc"); !s.ok()) return s;
    bytes = want;
    return absl::OkStatus();
  }
};

thread_local Staging staging;

}  // namespace

bool IsDevicePointer(const void* p) {
  if (p == nullptr || !CudaAvailable()) return false;
  cudaPointerAttributes attributes;
  if (cudaPointerGetAttributes(&attributes, p) != cudaSuccess) {
    cudaGetLastError();  // clear it: an unknown pointer is host memory
    return false;
  }
  return attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged;
}

absl::Status CudaCopyToHost(const void* d_src, void* h_dst, size_t bytes) {
  if (absl::Status s = CheckAvailable("CudaCopyToHost"); !s.ok()) return s;
  return CudaStatus(cudaMemcpy(h_dst, d_src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy to host");
}

absl::Status CudaCopyToDevice(const void* h_src, void* d_dst, size_t bytes) {
  if (absl::Status s = CheckAvailable("CudaCopyToDevice"); !s.ok()) return s;
  return CudaStatus(cudaMemcpy(d_dst, h_src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy to device");
}

absl::Status CudaPinHost(void* h, size_t bytes) {
  if (absl::Status s = CheckAvailable("CudaPinHost"); !s.ok()) return s;
  return CudaStatus(cudaHostRegister(h, bytes, cudaHostRegisterPortable), "cudaHostRegister");
}

void CudaUnpinHost(void* h) {
  if (cudaHostUnregister(h) != cudaSuccess) cudaGetLastError();  // clear it: nothing to undo
}

absl::StatusOr<CudaEncoded> CudaEncodeToHost(const float* d_in, size_t n, bool fp16,
                                             float (*choose_scale)(float), uint16_t* h_out) {
  if (absl::Status s = CheckAvailable("CudaEncodeToHost"); !s.ok()) return s;
  if (absl::Status s = staging.Reserve(n * sizeof(uint16_t)); !s.ok()) return s;
  CudaEncoded out;
  float max_abs = 0;
  if (absl::Status s = CudaMaxAbs(d_in, n, staging.max_abs, nullptr); !s.ok()) return s;
  if (absl::Status s = CudaStatus(cudaMemcpy(&max_abs, staging.max_abs, sizeof(float), cudaMemcpyDeviceToHost),
                                  "cudaMemcpy of the largest magnitude");
      !s.ok()) {
    return s;
  }
  out.nonfinite = !std::isfinite(max_abs);
  auto* d_out = static_cast<uint16_t*>(staging.data);
  out.scale = fp16 ? choose_scale(max_abs) : 1;
  const absl::Status s = !fp16            ? CudaFp32ToBf16(d_in, d_out, n, nullptr)
                         : out.scale == 1 ? CudaFp32ToFp16(d_in, d_out, n, nullptr)
                                          : CudaFp32ToFp16Scaled(d_in, out.scale, d_out, n, nullptr);
  if (!s.ok()) return s;
  if (absl::Status c = CudaCopyToHost(d_out, h_out, n * sizeof(uint16_t)); !c.ok()) return c;
  return out;
}

}  // namespace psrt
