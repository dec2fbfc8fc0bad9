// What the LibTorch front ends (TorchScript, torch.export) share: weights as
// IR values, and shapes found by running the graph (the formats record no
// symbolic shapes rannc can read); ONNX models use the latter for the shapes
// their own inference leaves unknown.
#pragma once

#include <torch/torch.h>

#include <map>
#include <string>

#include "planner/ir/ir.h"
#include "planner/support/status.h"

namespace rannc::import {

/// The IR value of weight `t` named `name`: its dtype and fixed shape.
ir::Value tensorValue(const std::string &name, const torch::Tensor &t, ir::ValueKind kind);

/// Runs `g` (no gradients, synthetic inputs) at batch sizes 3 and 5 and sets
/// every intermediate value's dtype and shape, each dimension solved for a*B+c
/// (Note [symbolic batch]), and its batch layout (Note [batch layout]); then
/// checks the graph and that the loss is a floating-point scalar. `weights`
/// holds the parameters and buffers by name.
Status findShapesByRunning(ir::Graph &g, const std::map<std::string, torch::Tensor> &weights,
                           const std::string &where);

/// Fills the shapes an ONNX model's own shape inference left unknown (ONNX
/// 1.12 loses some of PyTorch's exports, attention's among them) and the batch
/// layouts no shape tells (Note [batch layout]) by running `g` as
/// findShapesByRunning does, with the weights of `model`, random where it is
/// weightless; values with complete shapes keep theirs. Refuses when the
/// weights exceed `max_weight_bytes`. Returns how many shapes it set.
Expected<int> completeShapesByRunning(ir::Graph &g, const std::string &model, int64_t max_weight_bytes);

} // namespace rannc::import
