#include "common/optimizer_proto.h"

namespace psrt {

v1::OptimizerConfig OptimizerToProto(const OptimizerConfig& c) {
  v1::OptimizerConfig p;
  p.set_name(OptimizerName(c.kind));
  p.set_lr(c.lr);
  p.set_momentum(c.momentum);
  p.set_dampening(c.dampening);
  p.set_nesterov(c.nesterov);
  p.set_weight_decay(c.weight_decay);
  p.set_beta1(c.beta1);
  p.set_beta2(c.beta2);
  p.set_eps(c.eps);
  p.set_lr_decay(c.lr_decay);
  p.set_initial_accumulator_value(c.initial_accumulator_value);
  p.set_l1(c.l1);
  p.set_l2(c.l2);
  p.set_ftrl_beta(c.ftrl_beta);
  return p;
}

absl::StatusOr<OptimizerConfig> OptimizerFromProto(const v1::OptimizerConfig& p) {
  absl::StatusOr<OptimizerKind> kind = ParseOptimizerKind(p.name());
  if (!kind.ok()) return kind.status();
  OptimizerConfig c;
  c.kind = *kind;
  c.lr = p.lr();
  c.momentum = p.momentum();
  c.dampening = p.dampening();
  c.nesterov = p.nesterov();
  c.weight_decay = p.weight_decay();
  c.beta1 = p.beta1();
  c.beta2 = p.beta2();
  c.eps = p.eps();
  c.lr_decay = p.lr_decay();
  c.initial_accumulator_value = p.initial_accumulator_value();
  c.l1 = p.l1();
  c.l2 = p.l2();
  c.ftrl_beta = p.ftrl_beta();
  if (absl::Status s = ValidateOptimizerConfig(c); !s.ok()) return s;
  return c;
}

}  // namespace psrt
