#include "kernels/optimizer.h"

// Eigen's EIGEN_FAST_MATH float sqrt (rsqrt plus one Newton step) is off by
// 1-2 bits and flushes subnormal inputs to zero, while torch uses an exactly
// rounded sqrt. Keep every translation unit that includes Eigen on the same
// setting (best: define EIGEN_FAST_MATH=0 for the whole target) so the
// inline packet functions do not differ between objects.
#ifndef EIGEN_FAST_MATH
#define EIGEN_FAST_MATH 0
#endif
#if EIGEN_FAST_MATH
#error "psrt optimizer kernels need EIGEN_FAST_MATH=0 to match torch's sqrt"
#endif

#include <algorithm>
#include <cassert>
#include <cmath>

#include "Eigen/Core"
#include "absl/strings/str_cat.h"
#include "kernels/isa.h"
#include "kernels/optimizer_internal.h"
#include "kernels/row_optimizer.h"

namespace psrt {
namespace {

using ArrayMap = Eigen::Map<Eigen::ArrayXf>;
using ConstArrayMap = Eigen::Map<const Eigen::ArrayXf>;

// Elements per block. Each update runs several Eigen expressions; doing them
// block by block keeps the block's param/grad/slots (<= 5 arrays * 2 KiB) in
// L1, so main memory is streamed once per update.
constexpr size_t kBlock = 512;

// NaN fails every comparison, so write checks as !(ok) to reject it.
absl::Status CheckAtLeast(const char* field, double value, double lo) {
  if (!(value >= lo)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Invalid ", field, " value: ", value, " (must be >= ", lo, ")"));
  }
  return absl::OkStatus();
}

absl::Status CheckGreater(const char* field, double value, double lo) {
  if (!(value > lo)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Invalid ", field, " value: ", value, " (must be > ", lo, ")"));
  }
  return absl::OkStatus();
}

// |value| < 3.4e38 (FLT_MAX): it stays finite as the float32 the kernels use.
absl::Status CheckFloat32(const char* field, double value) {
  if (!std::isfinite(static_cast<float>(value))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Invalid ", field, " value: ", value,
        " (not finite as float32, the precision updates run in: |value| < 3.4e38)"));
  }
  return absl::OkStatus();
}

absl::Status CheckBeta(const char* field, double value) {
  if (!(value >= 0.0 && value < 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Invalid ", field, " value: ", value, " (must be in [0, 1))"));
  }
  return absl::OkStatus();
}

// Gradient with L2 weight decay folded in (torch: grad.add(param,
// alpha=weight_decay)). Returns `grad` untouched when wd == 0, as torch skips
// the add then (0 * inf param would otherwise turn into NaN).
const float* DecayedGrad(float wd, const float* param, const float* grad,
                         size_t len, float* scratch) {
  if (wd == 0.0f) return grad;
  ArrayMap(scratch, len) =
      ConstArrayMap(grad, len) + wd * ConstArrayMap(param, len);
  return scratch;
}

// The baseline (Isa::kScalar) kernels: Eigen, vectorised for SSE2. The AVX2
// and AVX-512 kernels in optimizer_simd.cc repeat these expressions operation
// for operation (Eigen evaluates `a * b + c * d` as (a * b) + (c * d), left
// to right), which is what makes their results bit-identical.
void SgdEigen(const kernels_internal::SgdParams& s, float* param,
              const float* grad, float* buf_slot, size_t n) {
  float scratch[kBlock];
  for (size_t i = 0; i < n; i += kBlock) {
    const size_t len = std::min(kBlock, n - i);
    ArrayMap p(param + i, len);
    ConstArrayMap g(DecayedGrad(s.wd, param + i, grad + i, len, scratch), len);
    if (!s.has_momentum) {
      p += s.neg_lr * g;  // param.add_(grad, alpha=-lr)
      continue;
    }
    ArrayMap buf(buf_slot + i, len);
    if (s.first_step) {
      buf = g;  // torch clones grad on the first step; no dampening.
    } else {
      buf = buf * s.momentum + s.keep * g;
    }
    if (s.nesterov) {
      p += s.neg_lr * (g + s.momentum * buf);
    } else {
      p += s.neg_lr * buf;
    }
  }
}

void AdamEigen(const kernels_internal::AdamParams& s, float* param,
               const float* grad, float* exp_avg, float* exp_avg_sq, size_t n) {
  float scratch[kBlock];
  for (size_t i = 0; i < n; i += kBlock) {
    const size_t len = std::min(kBlock, n - i);
    ArrayMap p(param + i, len);
    ArrayMap m(exp_avg + i, len);
    ArrayMap v(exp_avg_sq + i, len);
    if (s.apply_decay) p *= s.decay;
    ConstArrayMap g(DecayedGrad(s.wd, param + i, grad + i, len, scratch), len);
    if (s.small_w) {
      m = m + s.w * (g - m);
    } else {
      m = g - (g - m) * s.one_minus_w;
    }
    v = v * s.beta2 + s.one_minus_beta2 * g * g;
    p += s.neg_step_size * m / (v.sqrt() / s.bc2_sqrt + s.eps);
  }
}

void AdaGradEigen(const kernels_internal::AdaGradParams& s, float* param,
                  const float* grad, float* sum_slot, size_t n) {
  float scratch[kBlock];
  for (size_t i = 0; i < n; i += kBlock) {
    const size_t len = std::min(kBlock, n - i);
    ArrayMap p(param + i, len);
    ArrayMap sum(sum_slot + i, len);
    ConstArrayMap g(DecayedGrad(s.wd, param + i, grad + i, len, scratch), len);
    sum += g * g;
    p += s.neg_clr * g / (sum.sqrt() + s.eps);
  }
}

constexpr kernels_internal::OptimizerKernels kEigenKernels = {
    Isa::kScalar, SgdEigen, AdamEigen, AdaGradEigen};

}  // namespace

// torch.optim's own checks (NaN fails them too).
static absl::Status CheckTorchRules(const OptimizerConfig& c) {
  absl::Status s;
  switch (c.kind) {
    case OptimizerKind::kSgd:
      s.Update(CheckAtLeast("lr", c.lr, 0.0));
      s.Update(CheckAtLeast("momentum", c.momentum, 0.0));
      s.Update(CheckAtLeast("weight_decay", c.weight_decay, 0.0));
      if (s.ok() && std::isnan(c.dampening)) {
        s = absl::InvalidArgumentError("Invalid dampening value: nan");
      }
      if (s.ok() && c.nesterov && (c.momentum <= 0.0 || c.dampening != 0.0)) {
        s = absl::InvalidArgumentError(absl::StrCat(
            "Nesterov momentum requires momentum > 0 and dampening == 0 (got "
            "momentum=",
            c.momentum, ", dampening=", c.dampening, ")"));
      }
      return s;
    case OptimizerKind::kAdam:
    case OptimizerKind::kAdamW:
      s.Update(CheckAtLeast("lr", c.lr, 0.0));
      s.Update(CheckAtLeast("eps", c.eps, 0.0));
      s.Update(CheckBeta("beta1", c.beta1));
      s.Update(CheckBeta("beta2", c.beta2));
      s.Update(CheckAtLeast("weight_decay", c.weight_decay, 0.0));
      return s;
    case OptimizerKind::kAdaGrad:
      s.Update(CheckAtLeast("lr", c.lr, 0.0));
      s.Update(CheckAtLeast("lr_decay", c.lr_decay, 0.0));
      s.Update(CheckAtLeast("weight_decay", c.weight_decay, 0.0));
      s.Update(CheckAtLeast("initial_accumulator_value",
                            c.initial_accumulator_value, 0.0));
      s.Update(CheckAtLeast("eps", c.eps, 0.0));
      return s;
    case OptimizerKind::kFtrl:
      // Keras's Ftrl checks; lr > 0 because the update divides by it.
      s.Update(CheckGreater("lr", c.lr, 0.0));
      s.Update(CheckAtLeast("initial_accumulator_value",
                            c.initial_accumulator_value, 0.0));
      s.Update(CheckAtLeast("l1", c.l1, 0.0));
      s.Update(CheckAtLeast("l2", c.l2, 0.0));
      s.Update(CheckAtLeast("ftrl_beta", c.ftrl_beta, 0.0));
      return s;
    case OptimizerKind::kAssign:
    case OptimizerKind::kHold:
      return s;  // No hyperparameters.
  }
  return absl::InvalidArgumentError(
      absl::StrCat("Invalid optimizer kind: ", static_cast<int>(c.kind)));
}

absl::Status ValidateOptimizerConfig(const OptimizerConfig& c) {
  if (absl::Status s = CheckTorchRules(c); !s.ok()) return s;
  if (c.kind == OptimizerKind::kAssign || c.kind == OptimizerKind::kHold) return absl::OkStatus();
  // The kernels compute in float32: a value finite as a double (1e300) or
  // one they divide by that rounds to 0 would make every weight Inf or NaN
  // at the first update.
  // Every field, used by this kind or not: a checkpoint keeps them all.
  struct Field {
    const char* name;
    double value;
  };
  const Field fields[] = {{"momentum", c.momentum},
                          {"dampening", c.dampening},
                          {"weight_decay", c.weight_decay},
                          {"beta1", c.beta1},
                          {"beta2", c.beta2},
                          {"eps", c.eps},
                          {"lr_decay", c.lr_decay},
                          {"initial_accumulator_value", c.initial_accumulator_value},
                          {"l1", c.l1},
                          {"l2", c.l2},
                          {"ftrl_beta", c.ftrl_beta}};
  for (const Field& f : fields) {
    if (absl::Status s = CheckFloat32(f.name, f.value); !s.ok()) return s;
  }
  // Adam divides by sqrt(v) + eps, AdaGrad by sqrt(sum) + eps: with eps 0
  // (and, for AdaGrad, an accumulator starting at 0) an element whose
  // gradients have all been 0 becomes 0/0. Keras's and MXNet's AdaGrad
  // start the accumulator above 0 instead.
  const bool divides_by_zero =
      c.kind == OptimizerKind::kAdaGrad
          ? !(static_cast<float>(c.initial_accumulator_value) > 0.0f)
          : c.kind == OptimizerKind::kAdam || c.kind == OptimizerKind::kAdamW;
  if (divides_by_zero && !(static_cast<float>(c.eps) > 0.0f)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Invalid eps value: ", c.eps, " (must be > 0 in float32",
        c.kind == OptimizerKind::kAdaGrad ? " unless initial_accumulator_value is" : "",
        ": with 0, an element whose gradients have all been 0 becomes 0/0, NaN)"));
  }
  return ValidateLearningRate(c, c.lr);
}

absl::Status ValidateLearningRate(const OptimizerConfig& c, double lr) {
  if (c.kind == OptimizerKind::kAssign || c.kind == OptimizerKind::kHold) return absl::OkStatus();
  if (!(lr >= 0.0) || (c.kind == OptimizerKind::kFtrl && !(lr > 0.0))) {
    return absl::InvalidArgumentError(absl::StrCat("Invalid lr value: ", lr, " (must be ",
                                                   c.kind == OptimizerKind::kFtrl ? ">" : ">=", " 0)"));
  }
  if (absl::Status s = CheckFloat32("lr", lr); !s.ok()) return s;
  // The scalars of the first update, the largest ones (bias correction and
  // lr decay only shrink them later), must be finite in float32 too.
  float scalars[3] = {0, 0, 0};
  switch (c.kind) {
    case OptimizerKind::kSgd:
      scalars[0] = kernels_internal::MakeSgdParams(c, lr, 1).neg_lr;
      break;
    case OptimizerKind::kAdam:
    case OptimizerKind::kAdamW: {
      const kernels_internal::AdamParams p = kernels_internal::MakeAdamParams(c, lr, 1);
      scalars[0] = p.neg_step_size;
      scalars[1] = p.decay;
      break;
    }
    case OptimizerKind::kAdaGrad:
      scalars[0] = kernels_internal::MakeAdaGradParams(c, lr, 1).neg_clr;
      break;
    case OptimizerKind::kFtrl:
      scalars[0] = 1.0f / static_cast<float>(lr);  // FtrlRow divides by lr
      break;
    case OptimizerKind::kAssign:
    case OptimizerKind::kHold:
      break;
  }
  for (float v : scalars) {
    if (!std::isfinite(v)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Invalid lr value: ", lr, " (with ", OptimizerName(c.kind),
          "'s other settings its first update's step is ", v,
          ", beyond float32, the precision updates run in)"));
    }
  }
  return absl::OkStatus();
}

int NumSlots(const OptimizerConfig& c) {
  switch (c.kind) {
    case OptimizerKind::kSgd:
      return c.momentum > 0.0 ? 1 : 0;
    case OptimizerKind::kAdam:
    case OptimizerKind::kAdamW:
      return 2;
    case OptimizerKind::kAdaGrad:
      return 1;
    case OptimizerKind::kFtrl:
      return 2;
    case OptimizerKind::kAssign:
    case OptimizerKind::kHold:
      return 0;
  }
  return 0;
}

void InitSlots(const OptimizerConfig& c, float* const* slots, size_t n) {
  // Slot 0 of AdaGrad (sum) and FTRL (n) starts at initial_accumulator_value;
  // every other slot, FTRL's z included, at 0.
  const bool accumulates =
      c.kind == OptimizerKind::kAdaGrad || c.kind == OptimizerKind::kFtrl;
  const int num_slots = NumSlots(c);
  for (int s = 0; s < num_slots; ++s) {
    const float fill = accumulates && s == 0
                           ? static_cast<float>(c.initial_accumulator_value)
                           : 0.0f;
    std::fill(slots[s], slots[s] + n, fill);
  }
}

namespace kernels_internal {

SgdParams MakeSgdParams(const OptimizerConfig& c, double lr, int64_t step) {
  SgdParams s;
  s.neg_lr = static_cast<float>(-lr);
  s.wd = static_cast<float>(c.weight_decay);
  // torch tests momentum != 0; validation forbids < 0, and > 0 keeps this in
  // step with NumSlots so an unvalidated config cannot touch a missing slot.
  s.has_momentum = c.momentum > 0.0;
  s.momentum = static_cast<float>(c.momentum);
  s.keep = static_cast<float>(1.0 - c.dampening);
  s.nesterov = c.nesterov;
  s.first_step = step <= 1;
  return s;
}

AdamParams MakeAdamParams(const OptimizerConfig& c, double lr, int64_t step) {
  const bool decoupled = c.kind == OptimizerKind::kAdamW;
  // Python-side scalars are doubles in torch; they become float only when
  // they meet the float tensor.
  const double bias_correction1 =
      1.0 - std::pow(c.beta1, static_cast<double>(step));
  const double bias_correction2 =
      1.0 - std::pow(c.beta2, static_cast<double>(step));
  AdamParams s;
  s.neg_step_size = static_cast<float>(-(lr / bias_correction1));
  s.bc2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
  s.eps = static_cast<float>(c.eps);
  s.beta2 = static_cast<float>(c.beta2);
  s.one_minus_beta2 = static_cast<float>(1.0 - c.beta2);
  // exp_avg.lerp_(grad, 1 - beta1); torch's lerp switches form at |w| = 0.5
  // for accuracy, with the weight and 1 - weight in float.
  s.w = static_cast<float>(1.0 - c.beta1);
  s.small_w = std::abs(s.w) < 0.5f;
  s.one_minus_w = 1.0f - s.w;
  s.wd = decoupled ? 0.0f : static_cast<float>(c.weight_decay);
  s.apply_decay = decoupled && c.weight_decay != 0.0;
  s.decay = static_cast<float>(1.0 - lr * c.weight_decay);
  return s;
}

AdaGradParams MakeAdaGradParams(const OptimizerConfig& c, double lr,
                                int64_t step) {
  const double clr = lr / (1.0 + static_cast<double>(step - 1) * c.lr_decay);
  AdaGradParams s;
  s.neg_clr = static_cast<float>(-clr);
  s.wd = static_cast<float>(c.weight_decay);
  s.eps = static_cast<float>(c.eps);
  return s;
}

const OptimizerKernels& OptimizerKernelsFor(Isa isa) {
  const OptimizerKernels* k = nullptr;
  if (isa == Isa::kAvx512) k = Avx512OptimizerKernels();
  if (isa == Isa::kAvx2) k = Avx2OptimizerKernels();
  return k != nullptr ? *k : kEigenKernels;
}

void ApplyUpdateWithIsa(Isa isa, const OptimizerConfig& c, double lr,
                        int64_t step, float* param, const float* grad,
                        float* const* slots, size_t n) {
  assert(step >= 1);
  if (n == 0) return;
  const OptimizerKernels& k = OptimizerKernelsFor(isa);
  switch (c.kind) {
    case OptimizerKind::kSgd: {
      const SgdParams s = MakeSgdParams(c, lr, step);
      k.sgd(s, param, grad, s.has_momentum ? slots[0] : nullptr, n);
      return;
    }
    case OptimizerKind::kAdam:
    case OptimizerKind::kAdamW:
      k.adam(MakeAdamParams(c, lr, step), param, grad, slots[0], slots[1], n);
      return;
    case OptimizerKind::kAdaGrad:
      k.adagrad(MakeAdaGradParams(c, lr, step), param, grad, slots[0], n);
      return;
    case OptimizerKind::kFtrl:
      // No SIMD variant: the row kernel is elementwise, so one "row" of n
      // elements is the dense update, the same bits on every ISA.
      ApplyRowUpdate(c, lr, step, param, grad, slots, static_cast<int64_t>(n));
      return;
    case OptimizerKind::kAssign:
    case OptimizerKind::kHold:
      std::copy(grad, grad + n, param);
      return;
  }
}

}  // namespace kernels_internal

void ApplyUpdate(const OptimizerConfig& c, double lr, int64_t step,
                 float* param, const float* grad, float* const* slots,
                 size_t n) {
  // DetectIsa() is resolved once (a function-local static).
  kernels_internal::ApplyUpdateWithIsa(DetectIsa(), c, lr, step, param, grad,
                                       slots, n);
}

const char* OptimizerName(OptimizerKind k) {
  switch (k) {
    case OptimizerKind::kSgd:
      return "sgd";
    case OptimizerKind::kAdam:
      return "adam";
    case OptimizerKind::kAdamW:
      return "adamw";
    case OptimizerKind::kAdaGrad:
      return "adagrad";
    case OptimizerKind::kFtrl:
      return "ftrl";
    case OptimizerKind::kAssign:
      return "assign";
    case OptimizerKind::kHold:
      return "hold";
  }
  return "unknown";
}

absl::StatusOr<OptimizerKind> ParseOptimizerKind(absl::string_view name) {
  for (OptimizerKind k :
       {OptimizerKind::kSgd, OptimizerKind::kAdam, OptimizerKind::kAdamW, OptimizerKind::kAdaGrad,
        OptimizerKind::kFtrl, OptimizerKind::kAssign, OptimizerKind::kHold}) {
    if (name == OptimizerName(k)) return k;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown optimizer '", name,
                   "'; accepted: sgd, adam, adamw, adagrad, ftrl, assign"));
}

}  // namespace psrt
