// The end of a step: the replica and shared-parameter gradient sums, then
// the agreement on finite gradients, the global norm, clipping, fp16 loss
// scaling and the optimizer step, sharded where the plan says so.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <optional>
#include <ostream>
#include <vector>

#include "executor/comm/comm.h"
#include "executor/runtime/stage.h"
#include "executor/train/buckets.h"
#include "executor/train/loss_scale.h"
#include "executor/train/checkpoint.h"
#include "executor/train/optim.h"
#include "executor/train/setup.h"
#include "executor/train/shared_parameters.h"
#include "executor/train/step_report.h"
#include "executor/train/trainer.h"
#include "executor/train/zero.h"
#include "planner/support/status.h"

namespace rannc::train {

/// The step's reductions and the update, one object per rank: the replica
/// sums (Note [gradient buckets]) and the shared-parameter sums, then the
/// agreement on finite gradients, the global norm, clipping, fp16 loss
/// scaling (Note [loss scaling]) and the optimizer step, sharded where the
/// plan says so (Note [sharded optimizer state]).
class ParameterUpdate {
public:
  /// Collective: splits the communicators of the shared-parameter groups.
  ParameterUpdate(const TrainOptions &opts, comm::Communicator &comm, comm::Communicator &group, const Setup &s,
                  runtime::StageRunner &runner, std::optional<LossScaler> scaler, const GroupMaker &on_device);

  /// The whole stage's optimizer; with sharded state it holds the state only
  /// while a checkpoint is loaded or saved (see the hooks below).
  torch::optim::Optimizer &optimizer() { return *optimizer_; }
  const OptimizerFactory &factory() const { return make_; }
  const GradientBuckets *buckets() const { return buckets_.get(); }
  /// What the loss is multiplied by before backward (1 but under fp16).
  double lossScale() const { return scaler_ ? scaler_->scale() : 1.0; }
  /// The fp16 loss scaler (checkpoints save and restore it); null otherwise.
  LossScaler *lossScaler() { return scaler_ ? &*scaler_ : nullptr; }

  /// Before the step's last backward: its gradients are final.
  void armBuckets() {
    if (buckets_) buckets_->arm();
  }
  /// The AllReduce action: the replica sums, then the shared-parameter sums.
  void reduce() {
    if (buckets_) buckets_->finish();
    shared_.allReduce(replica_);
  }

  /// The OptimizerStep action: fills rec.grad_norm and rec.skipped.
  Status step(StepRecord &rec, std::ostream &log);
  /// The OptimizerStep action of a rank's chunks together, the first's loss
  /// scaler theirs (Note [one step over a rank's chunks]).
  static Status step(const std::vector<ParameterUpdate *> &updates, StepRecord &rec, std::ostream &log);

  /// After a checkpoint was loaded into optimizer(): keep this replica's share.
  void afterLoad() {
    if (sharded_) sharded_->scatterState(*optimizer_);
  }
  /// Collective, around a checkpoint save: optimizer() holds the whole state
  /// per parameter while it is written.
  void beforeSave() {
    if (sharded_) sharded_->gatherState(*optimizer_);
  }
  void afterSave() {
    if (sharded_) optimizer_->state().clear();
  }

private:
  /// Clipping by rec.grad_norm, the learning rate and the optimizer step
  /// (none when rec.skipped), then the gradients zeroed.
  void apply(const StepRecord &rec);

  const TrainOptions &opts_;
  comm::Communicator &comm_;
  int stage_, replica_;
  runtime::StageRunner &runner_;
  std::optional<LossScaler> scaler_;
  OptimizerFactory make_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  SharedParameters shared_;
  std::unique_ptr<GradientBuckets> buckets_;
  std::unique_ptr<ShardedOptimizer> sharded_;
  bool blocks_only_ = false;
  std::vector<torch::Tensor> norm_params_;
};

} // namespace rannc::train
