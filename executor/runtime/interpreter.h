// The one loop that runs an ir::Graph's nodes on LibTorch, shared by
// training (StageRunner), shape finding (frontend/common.cpp) and ONNX
// conformance (conformance.cpp).
#pragma once

#include <torch/torch.h>

#include <exception>
#include <functional>
#include <optional>
#include <unordered_map>
#include <vector>

#include "executor/comm/comm.h"
#include "planner/ir/ir.h"

namespace rannc::runtime {

/// Tensors by value id: what a run reads and what it computes.
using ValueMap = std::unordered_map<ir::ValueId, torch::Tensor>;

// Note [one interpreter]
// Every path that executes a graph goes through runNodes, so the trainer, the
// shape finder and the conformance runner cannot drift apart in how they feed
// a kernel: for each node in order, its inputs come from the environment
// (kNoValue: an undefined tensor, ONNX's omitted optional input), runOp
// computes its outputs, and they enter the environment (outputs named
// kNoValue, or beyond what the kernel returned, are dropped). What differs
// between the callers is small and stays with them, as hooks:
//  - `missing`: where an input the environment lacks comes from. StageRunner
//    keeps its weights apart from the per-micro-batch values and lends them
//    here; the shape finder reads an unknown value as undefined; conformance
//    fails the case.
//  - `ran`: after each node, with what it read and returned, before the
//    outputs are placed. StageRunner moves CPU-made outputs to its device and
//    copies BatchNorm's statistics into its buffers (Note [buffers] in ir.h);
//    conformance tracks which values are random and checks Dropout.
//  - `placed`: after a node's outputs entered the environment. StageRunner
//    drops the values read for the last time (Note [last use]).
//  - `failed`: a kernel's error, for the caller to put in its own terms
//    (conformance turns it into a case failure).
// Grad mode, autocast and random state are the caller's: they are LibTorch
// thread state, set around the call.

/// The optional hooks of runNodes (Note [one interpreter]).
struct NodeHooks {
  /// Input `v` of node `n` that the environment lacks. nullopt, or no hook:
  /// an error naming the node and the input.
  std::function<std::optional<torch::Tensor>(const ir::Node &n, ir::ValueId v)> missing;
  /// Called after node `id` ran on `ins` and returned `outs`, before `outs`
  /// enter the environment: may check them or replace them.
  std::function<void(ir::NodeId id, const std::vector<torch::Tensor> &ins, std::vector<torch::Tensor> &outs)> ran;
  /// Called after the node at `index` of `nodes` has placed its outputs in
  /// `env`: may drop values nothing reads any more.
  std::function<void(size_t index, ValueMap &env)> placed;
  /// Called when node `n`'s kernel throws `e`; may throw an error of its own.
  /// When it returns, or there is no hook, `e` propagates.
  std::function<void(const ir::Node &n, const std::exception &e)> failed;
};

/// Runs `nodes` of `g` in that order with runOp, reading inputs from `env`
/// and writing outputs to it; the tensor-parallel collectives run over
/// `group` (Note [tensor parallel collectives]).
void runNodes(const ir::Graph &g, const std::vector<ir::NodeId> &nodes, ValueMap &env, const NodeHooks &hooks = {},
              comm::Communicator *group = nullptr);

/// Every node of `g`, in graph order.
std::vector<ir::NodeId> allNodes(const ir::Graph &g);

} // namespace rannc::runtime
