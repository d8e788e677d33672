// The CUDA kernels against device memory bandwidth (a device-to-device
// cudaMemcpy of the same bytes), timed with CUDA events. On a machine without
// a usable GPU every benchmark reports why and skips.
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "kernels/cuda_kernels.h"
#include "kernels/optimizer.h"

namespace psrt {
namespace {

// Device buffers allocated once per benchmark and zeroed (touched) up front.
struct DeviceBuffers {
  explicit DeviceBuffers(size_t bytes, int count) {
    for (int i = 0; i < count; ++i) {
      void* p = nullptr;
      if (cudaMalloc(&p, bytes) != cudaSuccess) return;
      cudaMemset(p, 0, bytes);
      buffers.push_back(p);
    }
  }
  ~DeviceBuffers() {
    for (void* p : buffers) cudaFree(p);
  }
  bool ok(int count) const { return static_cast<int>(buffers.size()) == count; }
  std::vector<void*> buffers;
};

// Runs `body` once per iteration and reports the time CUDA events measured.
template <typename Body>
void TimeOnDevice(benchmark::State& state, Body body) {
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  for (auto _ : state) {
    cudaEventRecord(start);
    if (!body()) {
      state.SkipWithError("a CUDA call failed");
      break;
    }
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    state.SetIterationTime(ms / 1e3);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
}

bool NeedGpu(benchmark::State& state) {
  if (CudaAvailable()) return true;
  state.SkipWithError((std::string("no usable GPU: ") + CudaUnavailableReason()).c_str());
  return false;
}

void BM_DeviceMemcpy(benchmark::State& state) {
  if (!NeedGpu(state)) return;
  const size_t n = state.range(0) / 4;
  DeviceBuffers b(n * 4, 2);
  if (!b.ok(2)) return state.SkipWithError("cudaMalloc failed");
  // Same bytes read as fp32->fp16 reads (4n) and a copy of them.
  TimeOnDevice(state, [&] { return cudaMemcpy(b.buffers[1], b.buffers[0], n * 4, cudaMemcpyDeviceToDevice) == cudaSuccess; });
  state.SetItemsProcessed(state.iterations() * n);
}

void BM_CudaFp32ToFp16(benchmark::State& state) {
  if (!NeedGpu(state)) return;
  const size_t n = state.range(0) / 4;
  DeviceBuffers b(n * 4, 2);
  if (!b.ok(2)) return state.SkipWithError("cudaMalloc failed");
  TimeOnDevice(state, [&] {
    return CudaFp32ToFp16(static_cast<float*>(b.buffers[0]), static_cast<uint16_t*>(b.buffers[1]), n, nullptr).ok();
  });
  state.SetItemsProcessed(state.iterations() * n);
}

void BM_CudaAdam(benchmark::State& state) {
  if (!NeedGpu(state)) return;
  const size_t n = state.range(0);
  DeviceBuffers b(n * 4, 4);  // weights, gradient, two moments
  if (!b.ok(4)) return state.SkipWithError("cudaMalloc failed");
  OptimizerConfig c;
  c.kind = OptimizerKind::kAdam;
  c.lr = 1e-3;
  float* slots[2] = {static_cast<float*>(b.buffers[2]), static_cast<float*>(b.buffers[3])};
  int64_t step = 0;
  TimeOnDevice(state, [&] {
    return CudaApplyUpdate(c, c.lr, ++step, static_cast<float*>(b.buffers[0]),
                           static_cast<const float*>(b.buffers[1]), slots, n, nullptr)
        .ok();
  });
  state.SetItemsProcessed(state.iterations() * n);
}

BENCHMARK(BM_DeviceMemcpy)->Arg(64 << 10)->Arg(64 << 20)->UseManualTime();
BENCHMARK(BM_CudaFp32ToFp16)->Arg(64 << 10)->Arg(64 << 20)->UseManualTime();
BENCHMARK(BM_CudaAdam)->Arg(100'000'000)->UseManualTime()->Iterations(20);

}  // namespace
}  // namespace psrt

BENCHMARK_MAIN();
