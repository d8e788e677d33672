// Helpers shared by the .cu files of psrt_kernels_cuda (not a public header).

#ifndef PSRT_KERNELS_CUDA_CUDA_UTIL_H_
#define PSRT_KERNELS_CUDA_CUDA_UTIL_H_

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/cuda_kernels.h"

namespace psrt {
namespace cuda_internal {

constexpr int kThreads = 256;

// Enough blocks to cover `n` one element per thread, capped: the kernels use
// grid-stride loops, so a cap only makes each thread do more.
inline unsigned int Blocks(size_t n, size_t cap = 65535) {
  const size_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned int>(std::max<size_t>(1, std::min(blocks, cap)));
}

// Names the operation and the CUDA error.
inline absl::Status CudaStatus(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorName(e), ": ",
                                          cudaGetErrorString(e)));
}

// FAILED_PRECONDITION (with the reason) when there is no usable device, so a
// call on a machine without a GPU fails cleanly before touching the runtime.
inline absl::Status CheckAvailable(const char* what) {
  if (CudaAvailable()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat(what, ": CUDA unavailable: ", CudaUnavailableReason()));
}

// After a launch: configuration errors show up in cudaGetLastError.
inline absl::Status LaunchStatus(const char* what) {
  return CudaStatus(cudaGetLastError(), what);
}

}  // namespace cuda_internal
}  // namespace psrt

#endif  // PSRT_KERNELS_CUDA_CUDA_UTIL_H_
