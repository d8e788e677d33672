// Row-wise updates for sparse tables: only the rows a push names change.
// Semantics follow torch.optim's sparse paths so that a table trained through
// psrt matches nn.Embedding(sparse=True) trained locally.
//
// Each kernel performs torch's float32 operations in torch's order (scalars
// such as the bias corrections in double, as Python computes them, cast to
// float where they meet the tensor); on x86-64 they reproduce torch 2.15's and
// TensorFlow 2.21's bits (tests/unit/row_optimizer_test.cc). The one fused
// multiply-add is torch's: adding a sparse tensor with alpha != 1 (sgd,
// adagrad) runs BLAS axpy, which rounds alpha * x + y once on CPUs with FMA.
// psrt_kernels builds with -ffp-contract=off, so nothing else is fused.

#ifndef PSRT_KERNELS_ROW_OPTIMIZER_H_
#define PSRT_KERNELS_ROW_OPTIMIZER_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/optimizer.h"

namespace psrt {

// Accepts sgd (no momentum, no weight decay, no nesterov), adagrad (no
// weight_decay), adam (torch's SparseAdam, the lazy form: lr > 0, eps > 0, no
// weight_decay; adamw refused) and ftrl, then runs ValidateOptimizerConfig.
// INVALID_ARGUMENT names the field and says why.
absl::Status ValidateRowOptimizer(const OptimizerConfig& c);

// Float slots per row element: sgd 0, adagrad 1 (sum), adam 2 (exp_avg,
// exp_avg_sq), ftrl 2 (n, z). 0 for configs ValidateRowOptimizer refuses.
int RowSlots(const OptimizerConfig& c);

// Fills one new row's slots (RowSlots(c) arrays of `dim` floats): adagrad's
// sum and ftrl's n with initial_accumulator_value, everything else with 0.
void InitRowSlots(const OptimizerConfig& c, float* const* slots, int64_t dim);

// One row. `step` is the table's 1-based update count (torch's state['step']
// of the embedding's weight: it counts optimizer steps, not the row's own
// updates), used for Adam's bias correction and Adagrad's lr_decay. `lr`
// overrides c.lr (a run-time schedule). `c` must pass ValidateRowOptimizer:
// the fields it refuses are not read, and a refused kind leaves the row alone.
// `row` must not alias `grad` or a slot.
//
//   sgd:     row = fma(-lr, g, row)
//   adagrad: clr = lr / (1 + (step - 1) * lr_decay); sum += g * g;
//            row = fma(-clr, g / (sqrt(sum) + eps), row)
//   adam:    m += (g - m) * (1 - beta1); v += (g * g - v) * (1 - beta2);
//            step_size = lr * sqrt(1 - beta2^step) / (1 - beta1^step);
//            row += -step_size * (m / (sqrt(v) + eps))
//   ftrl:    TensorFlow's ApplyFtrl with lr_power = -0.5 and Keras's beta
//            folded into l2 (see row_optimizer.cc).
void ApplyRowUpdate(const OptimizerConfig& c, double lr, int64_t step, float* row,
                    const float* grad, float* const* slots, int64_t dim);

// A new row's values, a pure function of (seed, id, j): N(0, stddev^2) from a
// counter-based generator (splitmix64 + Box-Muller), so any server makes the
// same row.
void InitRow(uint64_t seed, int64_t id, double stddev, float* row, int64_t dim);

// The server (0..num_servers-1) holding row `id` of every table: a 64-bit mix
// of the id (splitmix64 finalizer) modulo num_servers; stable across builds.
// num_servers must be >= 1.
int RowShard(int64_t id, int num_servers);

}  // namespace psrt

#endif  // PSRT_KERNELS_ROW_OPTIMIZER_H_
