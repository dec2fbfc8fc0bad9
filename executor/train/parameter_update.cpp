#include "executor/train/parameter_update.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "executor/runtime/grads.h"

namespace rannc::train {

ParameterUpdate::ParameterUpdate(const TrainOptions &opts, comm::Communicator &comm, comm::Communicator &group,
                                 const Setup &s, runtime::StageRunner &runner, std::optional<LossScaler> scaler,
                                 const GroupMaker &on_device)
    : opts_(opts), comm_(comm), stage_(s.stage), replica_(s.replica), runner_(runner), scaler_(std::move(scaler)),
      make_([&opts](std::vector<torch::Tensor> ps) { return makeOptimizer(opts, std::move(ps)); }),
      optimizer_(make_(runner.parameters())),
      shared_(s.graph, s.ranges, s.stage, s.tp.position, runner, comm, on_device) {
  if (group.size() > 1) {
    using Mode = GradientBuckets::Mode;
    const bool shard = s.plan.stages(s.stage).zero() > 0;
    // Reduce-scattered blocks mix sharded and replicated parameters, which
    // the norm counts differently (Note [tensor parallel ranks]): a
    // tensor-parallel stage all-reduces and shards only the update.
    const bool whole_sums = !shared_.groups.empty() || s.tp.degree > 1;
    const Mode mode = !shard ? Mode::AllReduce : whole_sums ? Mode::ShardedUpdate : Mode::ReduceScatter;
    buckets_ = std::make_unique<GradientBuckets>(group, runner.parameters(), opts.bucket_bytes, mode);
    if (shard) sharded_ = std::make_unique<ShardedOptimizer>(*buckets_, make_);
  }
  // Reduce-scattered, a replica holds the sums of its own blocks only.
  blocks_only_ = buckets_ && buckets_->mode() == GradientBuckets::Mode::ReduceScatter;
  // The gradient norm counts a shared parameter once: in its first reader
  // stage; a replicated parameter of a tensor-parallel stage once: on the
  // group's leader (Note [tensor parallel ranks]).
  for (ir::ValueId v : runner.program().parameters)
    if (!shared_.counted_elsewhere.count(v) && (s.tp.leader() || s.param_axes.count(v)))
      norm_params_.push_back(runner.parameter(v));
}

Status ParameterUpdate::step(StepRecord &rec, std::ostream &log) { return step({this}, rec, log); }

Status ParameterUpdate::step(const std::vector<ParameterUpdate *> &updates, StepRecord &rec, std::ostream &log) {
  // Note [one step over a rank's chunks]
  // Under an interleaved plan a rank holds several stages (chunks), each with
  // its own replica group and optimizer (Note [interleaved 1F1B] in
  // planner/pipeline/schedule.h). What PyTorch decides once for the whole
  // model is decided once here too: one agreement on finite gradients over
  // every chunk of every rank, one global norm (every chunk's share summed
  // before the collective), hence one clipping factor, and one fp16 loss
  // scale, the first update's, which every chunk's gradients carry (the loss
  // is scaled once, in the stage that computes it). With one update this is
  // the stage's own step.
  ParameterUpdate &first = *updates.front();
  LossScaler *scaler = first.lossScaler();
  comm::Communicator &comm = first.comm_;
  const int rank = comm.rank();
  // All ranks agree on finiteness first, so no stage steps alone. One pass
  // over the gradients gives both a stage's squared norm and its finiteness
  // (runtime::gradSquaredNorm).
  double bad = 0;
  rec.grad_norm = 0;
  for (ParameterUpdate *u : updates) {
    if (scaler) scaler->unscale(u->blocks_only_ ? u->sharded_->parameters() : u->runner_.parameters());
    const double squared = runtime::gradSquaredNorm(u->blocks_only_ ? u->sharded_->parameters() : u->norm_params_);
    if (!std::isfinite(squared)) bad = std::max(bad, double(u->stage_ + 1));
    // The global gradient norm: each stage's (replica-reduced, so equal on
    // every replica) squared norm, counted once per stage via replica 0,
    // and a shared parameter once, in its first reader stage;
    // reduce-scattered, every replica's blocks.
    rec.grad_norm += u->blocks_only_ || u->replica_ == 0 ? squared : 0.0;
  }
  comm.allReduce(&bad, 1, comm::ReduceOp::Max);
  if (scaler) {
    const double was = scaler->scale();
    scaler->update(bad > 0);
    if (bad > 0 && rank == 0)
      log << "rannc-exec: step " << rec.step << ": fp16 gradients overflowed at loss scale " << was
          << "; step skipped, scale now " << scaler->scale() << "\n";
  }
  if (bad > 0 && first.opts_.on_nonfinite == "stop" && !scaler)
    return Error{rank == 0 ? "non-finite gradients at step " + std::to_string(rec.step) + " in stage " +
                                 std::to_string(int(bad) - 1) + " (pass --on-nonfinite skip to skip such steps)"
                           : ""};
  rec.skipped = bad > 0;
  comm.allReduce(&rec.grad_norm, 1, comm::ReduceOp::Sum);
  rec.grad_norm = std::sqrt(rec.grad_norm);
  for (ParameterUpdate *u : updates) u->apply(rec);
  return Status::success();
}

void ParameterUpdate::apply(const StepRecord &rec) {
  if (!rec.skipped && opts_.clip_grad_norm > 0)
    scaleGradients(sharded_ ? sharded_->parameters() : runner_.parameters(),
                   clipFactor(rec.grad_norm, opts_.clip_grad_norm));
  setLearningRate(*optimizer_, rec.lr); // a checkpoint saves its options
  if (sharded_) setLearningRate(sharded_->inner(), rec.lr);
  if (!rec.skipped && sharded_) sharded_->step();
  else if (!rec.skipped) optimizer_->step();
  runtime::zeroGradients(runner_.parameters());
}

} // namespace rannc::train
