// The "goal" baseline for kernels_bench's Adam: the update written as a plain
// C++ loop and left to the compiler. Built on its own with
// -O3 -march=native -fno-math-errno (benchmarks/CMakeLists.txt), so GCC
// vectorises it for this machine's widest ISA, sqrt included, and may fuse
// multiply-adds. No Eigen, no templates, no headers with inline functions:
// nothing from this object can replace a baseline copy elsewhere in the
// binary (the ODR hazard of -march flags); hence GCC builtins rather than
// <cmath>'s inline std::pow/std::sqrt.

#include <cstddef>

namespace psrt {
namespace bench {

// One Adam step (torch's formulas, without weight decay) over n elements.
void PlainAdamStep(float* __restrict param, const float* __restrict grad,
                   float* __restrict exp_avg, float* __restrict exp_avg_sq,
                   size_t n, float lr, float beta1, float beta2, float eps,
                   int step) {
  const float bias_correction1 =
      1.0f - __builtin_powf(beta1, static_cast<float>(step));
  const float bias_correction2 =
      1.0f - __builtin_powf(beta2, static_cast<float>(step));
  const float step_size = lr / bias_correction1;
  const float bc2_sqrt = __builtin_sqrtf(bias_correction2);
  for (size_t i = 0; i < n; ++i) {
    const float g = grad[i];
    const float m = beta1 * exp_avg[i] + (1.0f - beta1) * g;
    const float v = beta2 * exp_avg_sq[i] + (1.0f - beta2) * g * g;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    param[i] -= step_size * m / (__builtin_sqrtf(v) / bc2_sqrt + eps);
  }
}

}  // namespace bench
}  // namespace psrt
