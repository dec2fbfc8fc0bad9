// Which nodes normalise with their batch's statistics (Note [batch
// statistics] in planner/plan/batch_statistics.cpp): the planner restricts
// their micro-batches, `show` warns, the executor synchronises them.
#pragma once

#include "planner/ir/ir.h"

namespace rannc::ir {

/// True for a node that normalises with its batch's statistics: ONNX
/// BatchNormalization in training mode, or an ATen batch norm whose
/// `training` argument is not a constant false.
bool computesBatchStatistics(const Node &n);

/// True when some node of `g` computes batch statistics.
bool hasBatchStatistics(const Graph &g);

/// The channels node `n` of `g` normalises (its input's axis 1); 0 when unknown.
int64_t batchNormChannels(const Graph &g, const Node &n);

} // namespace rannc::ir
