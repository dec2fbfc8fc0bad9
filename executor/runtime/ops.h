// ONNX operators executed with LibTorch. Every kernel is built from ATen ops
// that autograd differentiates, so a stage's backward pass needs no code here.
#pragma once

#include <torch/torch.h>

#include <string>
#include <vector>

#include "planner/ir/ir.h"

namespace rannc::runtime {

/// Runs `node` on `inputs` (one per node input; an undefined tensor for an
/// omitted optional input) and returns one tensor per node output (undefined
/// for an omitted optional output). `opset` is the graph's default-domain
/// opset. Throws std::runtime_error naming the node and op on bad input.
std::vector<torch::Tensor> runOp(const ir::Node &node, const std::vector<torch::Tensor> &inputs,
                                 int64_t opset);

/// Runs a node of a TorchScript-imported graph (domain "aten": an ATen or prim
/// operator, Note [torchscript lowering]); runOp hands such nodes here.
std::vector<torch::Tensor> runAtenOp(const ir::Node &node, const std::vector<torch::Tensor> &inputs);

/// The op types that have a kernel (sorted), to check against ir::supportedOps().
std::vector<std::string> kernelOpTypes();

/// Converts between the IR's raw tensors and LibTorch tensors (copies).
torch::Tensor toTorch(const ir::Tensor &t);
ir::Tensor fromTorch(const torch::Tensor &t);
torch::ScalarType toScalarType(ir::DType t);
ir::DType fromScalarType(torch::ScalarType t);

} // namespace rannc::runtime
