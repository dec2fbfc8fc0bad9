// The one rule, shared by the planner's cost model and rannc-exec, for when a
// tensor-parallel stage's values cross to another stage scattered over its
// group and all-gathered by the receiving group (Note [scatter/gather
// transfers] in planner/partition/evaluate.cpp; Note [scatter/gather in the
// executor] in executor/train/scatter_gather.h).
#pragma once

#include <string>

namespace rannc::cluster {

/// Whether transfers between tensor-parallel stages scatter/gather on devices
/// of `type` (a plan's Cluster.device.type): on `cuda`, as Megatron-LM does.
inline bool scatterGatherTransfers(const std::string &type) { return type == "cuda"; }

/// Whether a transfer whose ends are charged at ranks `a` and `b` leaves the
/// node, with `per_node` devices a node (the cost model's test, evaluate.cpp).
inline bool acrossNodes(int a, int b, int per_node) { return a / per_node != b / per_node; }

} // namespace rannc::cluster
