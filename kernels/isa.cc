#include "kernels/isa.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>

namespace psrt {
namespace {

#if defined(__x86_64__)
// F16C from CPUID leaf 1 (ECX bit 29): clang before 18 does not know the
// "f16c" name of __builtin_cpu_supports.
bool HasF16c() {
  unsigned eax, ebx, ecx, edx;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & (1u << 29)) != 0;
}
#endif

Isa ProbeCpu() {
#if defined(__x86_64__) && defined(__GNUC__)
  // libgcc's cpuinfo also checks XGETBV, so AVX/AVX-512 count only when the
  // OS saves their registers.
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") &&
                    __builtin_cpu_supports("fma") &&
                    HasF16c();
  if (!avx2) return Isa::kScalar;
  const bool avx512 = __builtin_cpu_supports("avx512f") &&
                      __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl");
  return avx512 ? Isa::kAvx512 : Isa::kAvx2;
#else
  return Isa::kScalar;
#endif
}

Isa ApplyEnvCap(Isa cpu) {
  const char* env = std::getenv("PSRT_KERNELS_ISA");
  if (env == nullptr || *env == '\0') return cpu;
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (std::strcmp(env, IsaName(isa)) == 0) return isa < cpu ? isa : cpu;
  }
  // kernels/ has no logging dependency; this is a one-time configuration
  // mistake, so stderr is enough.
  std::fprintf(stderr,
               "psrt: ignoring PSRT_KERNELS_ISA=%s (accepted: scalar, avx2, "
               "avx512); using %s\n",
               env, IsaName(cpu));
  return cpu;
}

}  // namespace

const char* IsaName(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return "scalar";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512:
      return "avx512";
  }
  return "unknown";
}

Isa CpuIsa() {
  static const Isa cpu = ProbeCpu();
  return cpu;
}

Isa DetectIsa() {
  static const Isa active = ApplyEnvCap(CpuIsa());
  return active;
}

bool IsaSupported(Isa isa) { return isa <= CpuIsa(); }

}  // namespace psrt
