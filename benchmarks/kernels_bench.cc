// Micro-benchmarks of the CPU kernels (Google Benchmark), one thread.
//
// Conversions and accumulation run on buffers of 64 KiB (in L2) and 64 MiB
// (main memory) of fp32 data, i.e. 16 Ki and 16 Mi elements, once per ISA the
// CPU supports, next to two baselines in the same run:
//   Memcpy/<bytes>          memcpy of the fp32 buffer: the memory-bound ceiling
//                           (items = the same element count);
//   */f16c_loop             a plain _mm256_cvtps_ph / _mm256_cvtph_ps loop, 8
//                           at a time: the goal for the fp16 conversions.
// Adam runs one step over 100M parameters (1.6 GB of param, grad and two
// slots) through ApplyUpdate and the Eigen baseline, against a plain loop
// compiled with -O3 -march=native -fno-math-errno (kernels_bench_plain.cc).
//
// items_per_second counts elements; bytes_per_second counts bytes read plus
// bytes written. Buffers are allocated once, filled (so every page is
// touched) before any timing, and reused.

#include <benchmark/benchmark.h>
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>

#include "kernels/convert.h"
#include "kernels/isa.h"
#include "kernels/optimizer.h"
#include "kernels/optimizer_internal.h"

namespace psrt {
namespace bench {

void PlainAdamStep(float* __restrict param, const float* __restrict grad,
                   float* __restrict exp_avg, float* __restrict exp_avg_sq,
                   size_t n, float lr, float beta1, float beta2, float eps,
                   int step);

namespace {

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

template <typename T>
using Buffer = std::unique_ptr<T[], FreeDeleter>;

// 64-byte aligned (a cache line, an AVX-512 vector), filled by the caller.
template <typename T>
Buffer<T> Allocate(size_t n) {
  const size_t bytes = (n * sizeof(T) + 63) / 64 * 64;
  return Buffer<T>(static_cast<T*>(std::aligned_alloc(64, bytes)));
}

// Everything one size needs, built and touched once.
struct ConvertBuffers {
  size_t n;
  Buffer<float> src;   // fp32 input, values in fp16 range
  Buffer<float> dst;   // fp32 output / memcpy destination
  Buffer<float> acc;   // accumulator
  Buffer<uint16_t> h;  // fp16 / bf16 data
};

ConvertBuffers& BuffersFor(size_t n) {
  static auto* cache = new std::map<size_t, std::unique_ptr<ConvertBuffers>>;
  auto& slot = (*cache)[n];
  if (!slot) {
    slot = std::make_unique<ConvertBuffers>();
    slot->n = n;
    slot->src = Allocate<float>(n);
    slot->dst = Allocate<float>(n);
    slot->acc = Allocate<float>(n);
    slot->h = Allocate<uint16_t>(n);
    for (size_t i = 0; i < n; ++i) {
      slot->src[i] = std::sin(static_cast<float>(i)) * 100.0f;
      slot->dst[i] = 0.0f;
      slot->acc[i] = 1.0f;
    }
    Fp32ToFp16(slot->src.get(), slot->h.get(), n);
  }
  return *slot;
}

size_t ElementsFor(const benchmark::State& state) {
  return static_cast<size_t>(state.range(0)) / sizeof(float);
}

void Report(benchmark::State& state, size_t n, size_t bytes_per_element) {
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * n));
  state.SetBytesProcessed(
      static_cast<int64_t>(state.iterations() * n * bytes_per_element));
}

// --- baselines
// -----------------------------------------------------------------

void BM_Memcpy(benchmark::State& state) {
  ConvertBuffers& b = BuffersFor(ElementsFor(state));
  for (auto _ : state) {
    std::memcpy(b.dst.get(), b.src.get(), b.n * sizeof(float));
    benchmark::ClobberMemory();
  }
  Report(state, b.n, 2 * sizeof(float));
}

__attribute__((target("avx2,f16c"))) void F16cFromFloat(const float* in,
                                                        uint16_t* out,
                                                        size_t n) {
  for (size_t i = 0; i + 8 <= n; i += 8) {
    _mm_storeu_si128(
        reinterpret_cast<__m128i*>(out + i),
        _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT));
  }
}

__attribute__((target("avx2,f16c"))) void F16cToFloat(const uint16_t* in,
                                                      float* out, size_t n) {
  for (size_t i = 0; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(
                                  reinterpret_cast<const __m128i*>(in + i))));
  }
}

void BM_F16cLoopFp32ToFp16(benchmark::State& state) {
  ConvertBuffers& b = BuffersFor(ElementsFor(state));
  for (auto _ : state) {
    F16cFromFloat(b.src.get(), b.h.get(), b.n);
    benchmark::ClobberMemory();
  }
  Report(state, b.n, sizeof(float) + sizeof(uint16_t));
}

void BM_F16cLoopFp16ToFp32(benchmark::State& state) {
  ConvertBuffers& b = BuffersFor(ElementsFor(state));
  for (auto _ : state) {
    F16cToFloat(b.h.get(), b.dst.get(), b.n);
    benchmark::ClobberMemory();
  }
  Report(state, b.n, sizeof(float) + sizeof(uint16_t));
}

// --- psrt kernels, per ISA
// -----------------------------------------------------

void BM_Fp32ToFp16(benchmark::State& state, Isa isa) {
  const ConvertKernels& k = ConvertKernelsFor(isa);
  ConvertBuffers& b = BuffersFor(ElementsFor(state));
  for (auto _ : state) {
    k.fp32_to_fp16(b.src.get(), b.h.get(), b.n);
    benchmark::ClobberMemory();
  }
  Report(state, b.n, sizeof(float) + sizeof(uint16_t));
}

void BM_Fp16ToFp32(benchmark::State& state, Isa isa) {
  const ConvertKernels& k = ConvertKernelsFor(isa);
  ConvertBuffers& b = BuffersFor(ElementsFor(state));
  for (auto _ : state) {
    k.fp16_to_fp32(b.h.get(), b.dst.get(), b.n);
    benchmark::ClobberMemory();
  }
  Report(state, b.n, sizeof(float) + sizeof(uint16_t));
}

void BM_Fp32ToBf16(benchmark::State& state, Isa isa) {
  const ConvertKernels& k = ConvertKernelsFor(isa);
  ConvertBuffers& b = BuffersFor(ElementsFor(state));
  for (auto _ : state) {
    k.fp32_to_bf16(b.src.get(), b.h.get(), b.n);
    benchmark::ClobberMemory();
  }
  Report(state, b.n, sizeof(float) + sizeof(uint16_t));
}

// acc += scale * x: reads fp16 and fp32, writes fp32. A tiny scale keeps the
// accumulator from drifting far over the iterations.
void BM_AccumulateFp16(benchmark::State& state, Isa isa) {
  const ConvertKernels& k = ConvertKernelsFor(isa);
  ConvertBuffers& b = BuffersFor(ElementsFor(state));
  for (auto _ : state) {
    k.accumulate_fp16(b.h.get(), 1e-6f, b.acc.get(), b.n);
    benchmark::ClobberMemory();
  }
  Report(state, b.n, sizeof(uint16_t) + 2 * sizeof(float));
}

void BM_AccumulateBf16(benchmark::State& state, Isa isa) {
  const ConvertKernels& k = ConvertKernelsFor(isa);
  ConvertBuffers& b = BuffersFor(ElementsFor(state));
  for (auto _ : state) {
    k.accumulate_bf16(b.h.get(), 1e-6f, b.acc.get(), b.n);
    benchmark::ClobberMemory();
  }
  Report(state, b.n, sizeof(uint16_t) + 2 * sizeof(float));
}

// --- Adam, 100M parameters
// ------------------------------------------------------

constexpr size_t kAdamParams = 100'000'000;

struct AdamBuffers {
  Buffer<float> param, grad, exp_avg, exp_avg_sq;
  int64_t step = 0;
};

AdamBuffers& Adam() {
  static AdamBuffers* b = [] {
    auto* a = new AdamBuffers;
    a->param = Allocate<float>(kAdamParams);
    a->grad = Allocate<float>(kAdamParams);
    a->exp_avg = Allocate<float>(kAdamParams);
    a->exp_avg_sq = Allocate<float>(kAdamParams);
    for (size_t i = 0; i < kAdamParams; ++i) {
      a->param[i] = 0.5f;
      a->grad[i] = (i % 7 == 0 ? -1e-3f : 1e-3f) * static_cast<float>(i % 13);
      a->exp_avg[i] = 0.0f;
      a->exp_avg_sq[i] = 0.0f;
    }
    return a;
  }();
  return *b;
}

// Reads param, grad, both slots; writes param and both slots.
constexpr size_t kAdamBytesPerParam = 7 * sizeof(float);

void BM_Adam(benchmark::State& state, Isa isa) {
  AdamBuffers& b = Adam();
  OptimizerConfig c;
  c.kind = OptimizerKind::kAdam;
  float* slots[] = {b.exp_avg.get(), b.exp_avg_sq.get()};
  for (auto _ : state) {
    kernels_internal::ApplyUpdateWithIsa(isa, c, 1e-3, ++b.step, b.param.get(),
                                         b.grad.get(), slots, kAdamParams);
    benchmark::ClobberMemory();
  }
  Report(state, kAdamParams, kAdamBytesPerParam);
}

void BM_AdamPlainNative(benchmark::State& state) {
  AdamBuffers& b = Adam();
  for (auto _ : state) {
    PlainAdamStep(b.param.get(), b.grad.get(), b.exp_avg.get(),
                  b.exp_avg_sq.get(), kAdamParams, 1e-3f, 0.9f, 0.999f, 1e-8f,
                  static_cast<int>(++b.step));
    benchmark::ClobberMemory();
  }
  Report(state, kAdamParams, kAdamBytesPerParam);
}

// --- registration
// ---------------------------------------------------------------

constexpr int64_t kSizes[] = {64 << 10, 64 << 20};  // bytes of fp32

void Sizes(benchmark::internal::Benchmark* b) {
  for (int64_t bytes : kSizes) b->Arg(bytes);
}

int RegisterAll() {
  benchmark::RegisterBenchmark("Memcpy", BM_Memcpy)->Apply(Sizes);
  if (IsaSupported(Isa::kAvx2)) {
    benchmark::RegisterBenchmark("Fp32ToFp16/f16c_loop", BM_F16cLoopFp32ToFp16)
        ->Apply(Sizes);
    benchmark::RegisterBenchmark("Fp16ToFp32/f16c_loop", BM_F16cLoopFp16ToFp32)
        ->Apply(Sizes);
  }
  using Fn = void (*)(benchmark::State&, Isa);
  const std::pair<const char*, Fn> kernels[] = {
      {"Fp32ToFp16", BM_Fp32ToFp16},
      {"Fp16ToFp32", BM_Fp16ToFp32},
      {"Fp32ToBf16", BM_Fp32ToBf16},
      {"AccumulateFp16", BM_AccumulateFp16},
      {"AccumulateBf16", BM_AccumulateBf16},
  };
  for (const auto& [name, fn] : kernels) {
    for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
      if (!IsaSupported(isa)) continue;
      benchmark::RegisterBenchmark(
          (std::string(name) + "/" + IsaName(isa)).c_str(), fn, isa)
          ->Apply(Sizes);
    }
  }
  // One step takes ~0.1-1 s: a few fixed iterations are plenty.
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (!IsaSupported(isa)) continue;
    benchmark::RegisterBenchmark(
        (std::string("Adam100M/") + IsaName(isa)).c_str(), BM_Adam, isa)
        ->Iterations(5)
        ->Unit(benchmark::kMillisecond);
  }
  benchmark::RegisterBenchmark("Adam100M/plain_native", BM_AdamPlainNative)
      ->Iterations(5)
      ->Unit(benchmark::kMillisecond);
  return 0;
}

}  // namespace
}  // namespace bench
}  // namespace psrt

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::AddCustomContext("psrt_cpu_isa", psrt::IsaName(psrt::CpuIsa()));
  benchmark::AddCustomContext("psrt_active_isa",
                              psrt::IsaName(psrt::DetectIsa()));
  psrt::bench::RegisterAll();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
