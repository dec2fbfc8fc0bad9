// BatchNorm with its batch statistics summed over a stage's replicas, for
// plans with batchnorm: exact (Note [batch statistics] in
// planner/plan/batch_statistics.cpp; Note [synchronised batch statistics] in
// kernels/sync_batch_norm.cpp).
#pragma once

#include <torch/torch.h>

#include <vector>

#include "executor/comm/comm.h"
#include "planner/ir/ir.h"

namespace rannc::runtime {

// Note [batch statistics scope]
// Which replicas a BatchNorm sums over is thread state, as autocast and grad
// mode are (Note [one interpreter]: those are the caller's, set around the
// call): the trainer opens a BatchStatisticsScope for the stage's replicas
// around its steps, and runOp, on that thread, runs every node that computes
// batch statistics with runSyncBatchNorm. The shape finder, the profiler and
// conformance never open one, so they run the node's own kernel. Backward
// needs no scope: each all-reduce keeps its group in its autograd node.

/// While alive, nodes that compute batch statistics on this thread sum them
/// over `replicas` (null, or a group of one: each normalises its own samples).
class BatchStatisticsScope {
public:
  explicit BatchStatisticsScope(comm::Communicator *replicas);
  ~BatchStatisticsScope();
  BatchStatisticsScope(const BatchStatisticsScope &) = delete;
  BatchStatisticsScope &operator=(const BatchStatisticsScope &) = delete;

private:
  comm::Communicator *previous_;
};

/// The replicas of this thread's innermost open scope with more than one
/// rank, or null (Note [batch statistics scope]).
comm::Communicator *batchStatisticsGroup();

/// Runs a node that computes batch statistics (ir::computesBatchStatistics)
/// with each channel's statistics over the samples of every rank of `group`,
/// as SyncBatchNorm does, returning what the node's own kernel returns
/// (Note [synchronised batch statistics] in kernels/sync_batch_norm.cpp).
std::vector<torch::Tensor> runSyncBatchNorm(const ir::Node &node, const std::vector<torch::Tensor> &inputs,
                                            int64_t opset, comm::Communicator &group);

/// The operator arguments of an ATen node, rebuilt from its inputs and
/// attributes (Note [aten argument encoding] in planner/ir/aten_args.h).
std::vector<c10::IValue> atenArguments(const ir::Node &node, const std::vector<torch::Tensor> &inputs);

} // namespace rannc::runtime
