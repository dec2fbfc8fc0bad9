// Running one IR node with LibTorch. ONNX ops run the kernels of kernels/, one
// file per op family (kernels/registry.cpp holds the table); ATen nodes run
// through LibTorch's operator registry (kernels/aten.cpp). Every kernel is
// built from ATen ops that autograd differentiates, so a stage's backward
// pass needs no code here.
#pragma once

#include <torch/torch.h>

#include <string>
#include <vector>

#include "executor/comm/comm.h"
#include "executor/runtime/tensor_convert.h"
#include "planner/ir/ir.h"

namespace rannc::runtime {

/// Runs `node` on `inputs` (one per node input; an undefined tensor for an
/// omitted optional input) and returns one tensor per node output (undefined
/// for an omitted optional output). `opset` is the graph's default-domain
/// opset; `group`, the stage's tensor-parallel group, is what the "rannc"
/// collectives run over (null outside a tensor-parallel stage). Throws
/// std::runtime_error naming the node and op on bad input.
std::vector<torch::Tensor> runOp(const ir::Node &node, const std::vector<torch::Tensor> &inputs, int64_t opset,
                                 comm::Communicator *group = nullptr);

/// Runs an ATen node (ir::isAten: an ATen or prim operator of a TorchScript or
/// torch.export graph, Note [torchscript lowering]); runOp hands such nodes here.
std::vector<torch::Tensor> runAtenOp(const ir::Node &node, const std::vector<torch::Tensor> &inputs);

/// Registers the model libraries' custom operators rannc runs
/// (Note [library custom ops], kernels/library_ops.cpp) with LibTorch's
/// dispatcher, once; call before looking an operator up by name.
void registerLibraryOps();

/// The op types that have a kernel (sorted), to check against ir::supportedOps().
std::vector<std::string> kernelOpTypes();

} // namespace rannc::runtime
