// Where a split backward's W starts (Note [split backward] in
// executor/runtime/stage.cpp): the ops that combine a weight with data.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "planner/ir/ir.h"

namespace rannc::ir {

/// Note [weight gradients in B]
/// A split backward defers to W only the weight gradients that are products
/// as large as the inputs' (x W's, a convolution's) or that build a large
/// dense tensor (an embedding's Gather). The other ops that combine a weight
/// with data, elementwise ones (a bias Add, a scale Mul) and norms (their
/// scale and shift), get their weights' gradients in B, from the backward B
/// runs through them anyway. Split, a LayerNormalization's backward ran its
/// kernel twice (0.97 ms against the whole backward's 0.47 a micro-batch on
/// exec_bench's first stage, by LibTorch's profiler) and the bias sums read
/// a gradient gone cold; moving them into B took B + W from 1.06-1.08x the
/// whole backward to 1.04x (each run against its own forward,
/// docs/partitioner.md).
/// B hands those gradients (parameter-sized) to the micro-batch's W, which
/// accumulates them with the rest, so every gradient still reaches .grad at
/// W; a queued micro-batch holds them until then (Block::wgrad_param_bytes).
bool weightGradientInB(const Node &node);

/// Per node: the parameters whose gradients B computes there (Note [weight
/// gradients in B]), those an op weightGradientInB names reaches through its
/// weight-side inputs; empty for other nodes. stageWeightRoots's `in_b` is
/// their union over a stage's nodes.
std::vector<std::vector<ValueId>> weightGradientsInB(const Graph &g);

/// Per node: > 0 when it is a weight-gradient root, an op that reads a
/// floating value made from parameters alone (a parameter, or a weight-only
/// op's output such as its Transpose) together with a value that depends on
/// the data (of any type: an embedding's token ids), and whose weight
/// gradients B does not compute (weightGradientInB); then the share of its
/// gradient-carrying float inputs made from parameters alone, the part of
/// its backward that W runs (1/2 for x W).
/// A split backward's B stops at these ops' outputs, and W goes from their
/// gradients to the parameters, through nothing that depends on the data.
std::vector<double> weightGradientRoots(const Graph &g);

/// Per node: what a weight-gradient root's W reads besides its output's
/// gradient, the data-side inputs autograd saved for it (x of x W, an
/// embedding's token ids); none for other nodes (Note [what a queued W
/// keeps] in planner/partition/evaluate.cpp).
std::vector<std::vector<ValueId>> weightGradientReads(const Graph &g);

/// The weight-gradient roots among `nodes` (a stage's), each with the
/// parameters it reaches through its weight-side inputs (a parameter itself,
/// or up a chain of weight-only ops); `in_b`, those the ops whose gradients
/// B computes reach (Note [weight gradients in B]); and `conflict`, why W cannot run root
/// by root there: a parameter that two of them reach ("'E' is read by nodes
/// 'a' and 'b'"), which a path through the data side could reach twice, or a
/// weight-only value another stage makes (its gradient would find no root there).
struct StageWeightRoots {
  std::vector<std::pair<NodeId, std::vector<ValueId>>> roots;
  std::vector<ValueId> in_b; ///< ascending
  std::string conflict;      ///< empty: none
};
StageWeightRoots stageWeightRoots(const Graph &g, const std::vector<NodeId> &nodes);

} // namespace rannc::ir
