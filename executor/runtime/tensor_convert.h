// Conversion between the IR's raw tensors and LibTorch tensors: not an op, but
// what the kernels (Constant), weights and checkpoints share.
#pragma once

#include <torch/torch.h>

#include "planner/ir/ir.h"

namespace rannc::runtime {

/// Converts between the IR's raw tensors and LibTorch tensors (copies).
torch::Tensor toTorch(const ir::Tensor &t);
ir::Tensor fromTorch(const torch::Tensor &t);
/// The LibTorch element type of an IR dtype (throws for Undefined).
torch::ScalarType toScalarType(ir::DType t);
/// The IR dtype of a LibTorch element type; Undefined where the IR has none.
ir::DType fromScalarType(torch::ScalarType t);

} // namespace rannc::runtime
