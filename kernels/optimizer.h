// Server-side optimizer math for one dense float32 partition.
//
// The formulas follow torch.optim's single-tensor CPU path (maximize=False,
// amsgrad=False) operation for operation, so a model trained through the
// parameter server tracks one trained locally with PyTorch.

#ifndef PSRT_KERNELS_OPTIMIZER_H_
#define PSRT_KERNELS_OPTIMIZER_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace psrt {

enum class OptimizerKind {
  kSgd = 0,
  kAdam = 1,
  kAdamW = 2,
  kAdaGrad = 3,
  kFtrl = 4,
  // The step's aggregated gradient becomes the value (no learning rate, no
  // slots): a plain key-value store (MXNet's kvstore without an optimizer)
  // and the servers' mean of a tensor (gradients averaged into .grad, the
  // running statistics of BatchNorm).
  kAssign = 5,
  // Rank 0 sets the value whole, for the step it names: the workers' own
  // weights and optimizer state where the optimizer runs on the workers
  // (worker/worker_state.h). Copied as assign is, but the key's version is
  // that step, so a checkpoint waits for it as for the servers' weights.
  kHold = 6,
};

struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::kSgd;
  double lr = 0.01;
  double momentum = 0.0;   // SGD
  double dampening = 0.0;  // SGD
  bool nesterov = false;   // SGD
  double weight_decay = 0.0;
  // Adam/AdamW. AdaGrad also reads eps; torch's AdaGrad default is 1e-10, so
  // the caller sets it explicitly.
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double lr_decay = 0.0;                   // AdaGrad
  double initial_accumulator_value = 0.0;  // AdaGrad, FTRL
  // FTRL-Proximal as tf.keras.optimizers.Ftrl with learning_rate_power = -0.5
  // and no l2_shrinkage; ftrl_beta is Keras's `beta`.
  double l1 = 0.0, l2 = 0.0, ftrl_beta = 0.0;
};

// Checks the fields used by `c.kind` the way torch.optim's constructors do
// (lr >= 0, 0 <= beta < 1, eps >= 0, Nesterov needs momentum > 0 and zero
// dampening, ...). NaN is rejected too. The message names the field and the
// bad value. Beyond torch's rules, every hyperparameter (used by `c.kind` or
// not) must be finite as float32 (the precision updates run in), eps > 0 for Adam and for AdaGrad
// with an accumulator starting at 0 (else an element whose gradients were
// all 0 becomes 0/0), and so must the first update's scalars
// (ValidateLearningRate).
absl::Status ValidateOptimizerConfig(const OptimizerConfig& c);
// A learning rate for `c` (set at run time): >= 0 (FTRL > 0), finite as
// float32, and the first update's step size (lr over Adam's bias
// correction, FTRL's 1/lr) finite in float32 too.
absl::Status ValidateLearningRate(const OptimizerConfig& c, double lr);

// Number of per-element float slots this optimizer keeps: SGD 1 if
// momentum > 0 else 0; Adam/AdamW 2 (exp_avg, exp_avg_sq); AdaGrad 1 (sum);
// FTRL 2 (accumulator n, linear z); assign 0.
int NumSlots(const OptimizerConfig& c);

// Fills fresh slots: AdaGrad's sum and FTRL's accumulator with
// initial_accumulator_value, everything else with 0. `slots` holds
// NumSlots(c) arrays of `n` floats.
void InitSlots(const OptimizerConfig& c, float* const* slots, size_t n);

// Applies one update to `param` in place.
//
// `step` is the 1-based count of this update for the partition; it drives
// bias correction, AdaGrad's lr decay, and SGD's first-step momentum buffer
// (torch sets buf = grad on the first step, ignoring dampening). `grad` is the
// already aggregated gradient. `lr` overrides c.lr so the learning rate can be
// scheduled at run time. `param` must not alias `grad` or any slot.
//
// Runs the kernel for DetectIsa() (kernels/isa.h): AVX-512, AVX2 or the Eigen
// baseline, whose results are bit-identical (kernels/optimizer_internal.h).
// FTRL has one scalar kernel for every ISA: ApplyRowUpdate
// (kernels/row_optimizer.h) over all `n` elements. FTRL needs lr > 0.
void ApplyUpdate(const OptimizerConfig& c, double lr, int64_t step,
                 float* param, const float* grad, float* const* slots,
                 size_t n);

// "sgd", "adam", "adamw", "adagrad", "ftrl" or "assign" ("unknown" for
// out-of-range values).
const char* OptimizerName(OptimizerKind k);
// The inverse of OptimizerName; INVALID_ARGUMENT lists the accepted names.
absl::StatusOr<OptimizerKind> ParseOptimizerKind(absl::string_view name);

}  // namespace psrt

#endif  // PSRT_KERNELS_OPTIMIZER_H_
