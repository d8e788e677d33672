#include "kernels/row_optimizer.h"

#include <cassert>
#include <cmath>
#include <cstdint>

#include "absl/strings/str_cat.h"

namespace psrt {
namespace {

// splitmix64's increment (2^64 / golden ratio).
constexpr uint64_t kGamma = 0x9e3779b97f4a7c15ULL;

// splitmix64's output function (Stafford's Mix13). A bijection on 64 bits, so
// distinct ids never share a mix; the constants are part of the row -> server
// and row -> initial value maps, which must not change between builds.
uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// A uniform double in (0, 1] from the top 53 bits: never 0, so log() is finite.
double Uniform(uint64_t bits) { return static_cast<double>((bits >> 11) + 1) * 0x1.0p-53; }

absl::Status NotRowWise(const char* field, double value, const char* why) {
  return absl::InvalidArgumentError(
      absl::StrCat(field, " is not row-wise (got ", value, "): ", why));
}

// torch adds a sparse tensor scaled by alpha != 1 into a dense one with BLAS
// axpy (MKL), which rounds alpha * x + y once on any CPU with FMA; std::fma
// reproduces it (the RowOptimizerFrameworkBits tests hold torch's bits).
float Axpy(float alpha, float x, float y) { return std::fma(alpha, x, y); }

// param.add_(sparse_grad, alpha=-lr).
void SgdRow(float neg_lr, float* row, const float* grad, int64_t dim) {
  for (int64_t j = 0; j < dim; ++j) row[j] = Axpy(neg_lr, grad[j], row[j]);
}

// torch's _single_tensor_adagrad, sparse branch: sum.add_(g.pow(2)); std =
// sum.sqrt_().add_(eps); param.add_(g / std, alpha=-clr). The quotient is taken
// before the scaling, unlike the dense addcdiv.
void AdaGradRow(float neg_clr, float eps, float* row, const float* grad, float* sum, int64_t dim) {
  for (int64_t j = 0; j < dim; ++j) {
    const float g = grad[j];
    sum[j] = sum[j] + g * g;
    const float std_value = std::sqrt(sum[j]) + eps;
    row[j] = Axpy(neg_clr, g / std_value, row[j]);
  }
}

// torch's sparse_adam: the moments move by (new - old) * (1 - beta) rather
// than by lerp. torch's numer = update + old is the same float sum as the new
// exp_avg (addition commutes exactly), likewise denom's exp_avg_sq. The step
// is scaled before it is added (alpha = 1), so nothing is fused there.
void AdamRow(float one_minus_beta1, float one_minus_beta2, float eps, float neg_step_size,
             float* row, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t dim) {
  for (int64_t j = 0; j < dim; ++j) {
    const float g = grad[j];
    const float m = exp_avg[j] + (g - exp_avg[j]) * one_minus_beta1;
    const float v = exp_avg_sq[j] + (g * g - exp_avg_sq[j]) * one_minus_beta2;
    exp_avg[j] = m;
    exp_avg_sq[j] = v;
    const float denom = std::sqrt(v) + eps;
    row[j] = row[j] + neg_step_size * (m / denom);
  }
}

// FTRL-Proximal as TensorFlow's ApplyFtrl functor (core/kernels/training_ops.cc,
// the lr_power == -0.5 branch, which ResourceApplyFtrl runs), in float32 like
// TF on a float variable, operation for operation:
//   new_n  = n + g * g
//   z      = z + (g - ((sqrt(new_n) - sqrt(n)) / lr) * w)
//   w      = |z| > l1 ? (l1 * sign(z) - z) / (sqrt(new_n) / lr + 2 * l2) : 0
//   n      = new_n
// Keras 2's and tf.compat.v1's Ftrl pass l2 + beta / (2 * lr), computed on
// float32 tensors, as the op's l2, so the denominator is
// (beta + sqrt(new_n)) / lr + 2 * l2 up to rounding. (Keras 3 spells the same
// formula with its own ops, pow(n, 0.5) for sqrt(n), and rounds differently.) The dense form's
// select is used rather than SparseApplyFtrl's clamp, which returns the same value but 0 / 0 = NaN
// where n and l2 + beta are all 0.
void FtrlRow(float lr, float l1, float two_l2, float* row, const float* grad, float* accum,
             float* linear, int64_t dim) {
  for (int64_t j = 0; j < dim; ++j) {
    const float g = grad[j];
    const float n = accum[j];
    const float new_n = n + g * g;
    const float sqrt_new_n = std::sqrt(new_n);
    const float sigma = (sqrt_new_n - std::sqrt(n)) / lr;
    const float z = linear[j] + (g - sigma * row[j]);
    // |z| > l1 >= 0 makes z != 0, so sign(z) * l1 is +-l1 exactly.
    const float x = (z > 0.0f ? l1 : -l1) - z;
    const float y = sqrt_new_n / lr + two_l2;
    row[j] = std::abs(z) > l1 ? x / y : 0.0f;
    linear[j] = z;
    accum[j] = new_n;
  }
}

}  // namespace

absl::Status ValidateRowOptimizer(const OptimizerConfig& c) {
  constexpr const char* kNoDecay =
      "decay would have to reach every row on every step, and torch's sparse paths refuse it "
      "as well";
  switch (c.kind) {
    case OptimizerKind::kSgd:
      if (!(c.momentum == 0.0)) {
        return NotRowWise("momentum", c.momentum, "use adagrad or adam for tables");
      }
      if (c.nesterov) {
        return absl::InvalidArgumentError(
            "nesterov is not row-wise: it needs momentum; use adagrad or adam for tables");
      }
      if (!(c.weight_decay == 0.0)) return NotRowWise("weight_decay", c.weight_decay, kNoDecay);
      break;
    case OptimizerKind::kAdaGrad:
      if (!(c.weight_decay == 0.0)) return NotRowWise("weight_decay", c.weight_decay, kNoDecay);
      break;
    case OptimizerKind::kAdam:
      if (!(c.weight_decay == 0.0)) return NotRowWise("weight_decay", c.weight_decay, kNoDecay);
      // torch's SparseAdam constructor checks; eps > 0 also keeps 0 / 0 out
      // of a row whose gradient has been 0 so far.
      if (!(c.lr > 0.0)) {
        return absl::InvalidArgumentError(
            absl::StrCat("Invalid lr value: ", c.lr, " (must be > 0 for adam on tables)"));
      }
      if (!(c.eps > 0.0)) {
        return absl::InvalidArgumentError(
            absl::StrCat("Invalid eps value: ", c.eps, " (must be > 0 for adam on tables)"));
      }
      break;
    case OptimizerKind::kAdamW:
      return absl::InvalidArgumentError(
          "kind adamw is not row-wise: its decoupled weight decay would have to reach every "
          "row on every step; use adam (torch's SparseAdam) for tables");
    case OptimizerKind::kFtrl:
      break;
    case OptimizerKind::kAssign:
    case OptimizerKind::kHold:
      return absl::InvalidArgumentError(
          absl::StrCat("kind ", OptimizerName(c.kind),
                       " is for dense keys; tables take sgd, adagrad, adam or ftrl"));
  }
  // Also reports an unknown kind.
  return ValidateOptimizerConfig(c);
}

int RowSlots(const OptimizerConfig& c) {
  switch (c.kind) {
    case OptimizerKind::kSgd:
      return 0;
    case OptimizerKind::kAdaGrad:
      return 1;
    case OptimizerKind::kAdam:
    case OptimizerKind::kFtrl:
      return 2;
    case OptimizerKind::kAdamW:
    case OptimizerKind::kAssign:
    case OptimizerKind::kHold:
      return 0;
  }
  return 0;
}

void InitRowSlots(const OptimizerConfig& c, float* const* slots, int64_t dim) {
  const int num_slots = RowSlots(c);
  const bool accumulates = c.kind == OptimizerKind::kAdaGrad || c.kind == OptimizerKind::kFtrl;
  for (int s = 0; s < num_slots; ++s) {
    const float fill =
        accumulates && s == 0 ? static_cast<float>(c.initial_accumulator_value) : 0.0f;
    for (int64_t j = 0; j < dim; ++j) slots[s][j] = fill;
  }
}

void ApplyRowUpdate(const OptimizerConfig& c, double lr, int64_t step, float* row,
                    const float* grad, float* const* slots, int64_t dim) {
  assert(step >= 1);
  if (dim <= 0) return;
  // The scalars are Python floats (doubles) in torch and TF's Python layer;
  // they become float32 where they meet the tensors.
  switch (c.kind) {
    case OptimizerKind::kSgd:
      SgdRow(static_cast<float>(-lr), row, grad, dim);
      return;
    case OptimizerKind::kAdaGrad: {
      const double clr = lr / (1.0 + static_cast<double>(step - 1) * c.lr_decay);
      AdaGradRow(static_cast<float>(-clr), static_cast<float>(c.eps), row, grad, slots[0], dim);
      return;
    }
    case OptimizerKind::kAdam: {
      const double t = static_cast<double>(step);
      const double bias_correction1 = 1.0 - std::pow(c.beta1, t);
      const double bias_correction2 = 1.0 - std::pow(c.beta2, t);
      const double step_size = lr * std::sqrt(bias_correction2) / bias_correction1;
      AdamRow(static_cast<float>(1.0 - c.beta1), static_cast<float>(1.0 - c.beta2),
              static_cast<float>(c.eps), static_cast<float>(-step_size), row, grad, slots[0],
              slots[1], dim);
      return;
    }
    case OptimizerKind::kFtrl: {
      // TF's Python side folds beta into l2 in float32; the kernel doubles it.
      const float lr_f = static_cast<float>(lr);
      const float l2 = static_cast<float>(c.l2) + static_cast<float>(c.ftrl_beta) / (2.0f * lr_f);
      FtrlRow(lr_f, static_cast<float>(c.l1), 2.0f * l2, row, grad, slots[0], slots[1], dim);
      return;
    }
    case OptimizerKind::kAdamW:
    case OptimizerKind::kAssign:
    case OptimizerKind::kHold:
      return;  // Refused by ValidateRowOptimizer.
  }
}

void InitRow(uint64_t seed, int64_t id, double stddev, float* row, int64_t dim) {
  // Draw k of row `id` is splitmix64's k-th output from a state keyed by
  // (seed, id): Mix64(key + (k + 1) * kGamma). For one seed, distinct ids get
  // distinct keys (Mix64 and ^ are bijections). Pair p of the row takes draws
  // 2p and 2p + 1 through Box-Muller: j = 2p gets the cosine, 2p + 1 the sine.
  const uint64_t key = Mix64(Mix64(seed + kGamma) ^ static_cast<uint64_t>(id));
  constexpr double kTwoPi = 6.283185307179586476925286766559;
  for (int64_t p = 0; 2 * p < dim; ++p) {
    const uint64_t k = 2 * static_cast<uint64_t>(p);
    const double u1 = Uniform(Mix64(key + (k + 1) * kGamma));
    const double u2 = Uniform(Mix64(key + (k + 2) * kGamma));
    const double r = std::sqrt(-2.0 * std::log(u1));
    const double theta = kTwoPi * u2;
    row[2 * p] = static_cast<float>(stddev * (r * std::cos(theta)));
    if (2 * p + 1 < dim) row[2 * p + 1] = static_cast<float>(stddev * (r * std::sin(theta)));
  }
}

int RowShard(int64_t id, int num_servers) {
  assert(num_servers >= 1);
  if (num_servers <= 1) return 0;
  return static_cast<int>(Mix64(static_cast<uint64_t>(id)) % static_cast<uint64_t>(num_servers));
}

}  // namespace psrt
