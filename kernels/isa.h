// Which instruction-set level the CPU kernels run at.
//
// Every kernel in kernels/ is compiled for the baseline x86-64 ISA plus
// per-function `target` variants (AVX2, AVX-512) in the same object files; the
// public entry points pick one at run time, so one binary runs on any x86-64
// and uses the best the processor offers.

#ifndef PSRT_KERNELS_ISA_H_
#define PSRT_KERNELS_ISA_H_

namespace psrt {

// Ordered: a higher level may use everything below it.
enum class Isa {
  kScalar = 0,  // Baseline x86-64 (SSE2), or any other architecture.
  kAvx2 = 1,    // AVX2 + FMA + F16C.
  kAvx512 = 2,  // AVX-512 F + BW + VL (on top of kAvx2).
};

// "scalar", "avx2" or "avx512" (the names PSRT_KERNELS_ISA accepts);
// "unknown" for out-of-range values.
const char* IsaName(Isa isa);

// The highest level the processor and the OS (saved vector state) support,
// ignoring PSRT_KERNELS_ISA.
Isa CpuIsa();

// The level the public kernels use: CpuIsa(), lowered to the level named by
// the environment variable PSRT_KERNELS_ISA (scalar|avx2|avx512) when that is
// lower. A higher or unknown value cannot raise it; an unknown one is reported
// once on stderr and ignored. Read once, on first use.
Isa DetectIsa();

// Whether kernels of level `isa` can run on this processor (isa <= CpuIsa()).
// Calling a variant the CPU lacks dies with SIGILL, so tests and benchmarks
// that pick a variant explicitly check this first.
bool IsaSupported(Isa isa);

}  // namespace psrt

#endif  // PSRT_KERNELS_ISA_H_
