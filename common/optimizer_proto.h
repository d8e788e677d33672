#ifndef PSRT_COMMON_OPTIMIZER_PROTO_H_
#define PSRT_COMMON_OPTIMIZER_PROTO_H_

#include "absl/status/statusor.h"
#include "kernels/optimizer.h"
#include "psrt/v1/ps.pb.h"

namespace psrt {

// Optimizer settings as workers send them and servers read them.
v1::OptimizerConfig OptimizerToProto(const OptimizerConfig& c);
// INVALID_ARGUMENT for an unknown name or a setting out of range.
absl::StatusOr<OptimizerConfig> OptimizerFromProto(const v1::OptimizerConfig& p);

}  // namespace psrt

#endif  // PSRT_COMMON_OPTIMIZER_PROTO_H_
