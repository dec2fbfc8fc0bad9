// Sharded optimizer state (ZeRO stage 1) over a stage's replicas.
//
// Note [sharded optimizer state]
// With zero: 1 in the plan, replica j of a stage with r replicas keeps the
// optimizer state of block j of every gradient bucket only, about 1/r of the
// stage's (Note [gradient buckets] in buckets.h: each bucket is padded to a
// multiple of r and its parameters live in one flat buffer). A step:
//   1. the buckets reduce-scatter the gradients during the last backward, so
//      replica j holds the summed gradients of its blocks;
//   2. the global gradient norm sums every replica's blocks (each element of
//      the stage counted once), and clipping scales those blocks;
//   3. the optimizer updates replica j's blocks of the parameters, a flat
//      view each; SGD, Adam and AdamW are elementwise, so updating a block of
//      a flat buffer computes what updating each parameter whole computes;
//   4. the replicas all-gather the updated blocks.
// A stage whose parameters are tied to another stage's (SharedParameters in
// shared_parameters.h) needs whole summed gradients to add the other stage's share:
// it all-reduces instead of step 1 and shards only steps 3 and 4.
// Checkpoints hold the state per parameter, as an unsharded run writes it:
// gatherState() assembles it before a save (collective over the replicas)
// and scatterState() keeps this replica's blocks after a load, so a
// checkpoint written sharded resumes unsharded and back.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <vector>

#include "executor/train/buckets.h"

namespace rannc::train {

/// One parameter's optimizer state (SGD, Adam, AdamW) with `f` applied to
/// each of its tensors (undefined ones stay undefined): a tensor-parallel
/// shard's state gathered whole, or a whole state cut to a shard.
std::unique_ptr<torch::optim::OptimizerParamState>
mapOptimizerState(const torch::optim::OptimizerParamState &s,
                  const std::function<torch::Tensor(const torch::Tensor &)> &f);

class ShardedOptimizer {
public:
  using Factory = std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<torch::Tensor>)>;

  /// `buckets` must be sharded; `make` builds the run's optimizer kind.
  ShardedOptimizer(GradientBuckets &buckets, const Factory &make);

  /// The optimizer over this replica's blocks (for the learning rate).
  torch::optim::Optimizer &inner() { return *inner_; }
  /// This replica's blocks of the parameters, their gradient blocks as
  /// .grad(): the ones it updates, counts in the gradient norm and clips.
  const std::vector<torch::Tensor> &parameters() const { return params_; }
  /// Updates this replica's blocks, then all-gathers every replica's.
  void step();
  /// Collective over the replicas: gives `dense` (an optimizer of the run's
  /// kind over the stage's whole parameters) the whole state, per parameter.
  void gatherState(torch::optim::Optimizer &dense) const;
  /// Takes this replica's blocks of `dense`'s state (all replicas hold the
  /// same), then empties `dense`'s.
  void scatterState(torch::optim::Optimizer &dense);

private:
  GradientBuckets &buckets_;
  std::vector<GradientBuckets::Shard> shards_;
  std::vector<torch::Tensor> params_;
  std::unique_ptr<torch::optim::Optimizer> inner_;
};

} // namespace rannc::train
