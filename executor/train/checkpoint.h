// Checkpoints of a training run and the ONNX export of its weights
// (docs/training.md "Checkpoints, resume and export"). The trainer calls these
// hooks; the folder format itself is torch-free (executor/checkpoint/).
//
// What a checkpoint holds, and why resuming is exact: each stage's parameters,
// buffers and optimizer state stored by name (so any plan of the same model
// can load them), the step, the data position, each rank's torch generator
// and, under fp16, the loss scaler's state. Everything else a step depends on
// is a function of the step: the sample order (a permutation per epoch seeded
// by --seed + epoch), the synthetic data (seeded by sample position) and the
// lr schedule.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "executor/checkpoint/checkpoint_dir.h"
#include "executor/comm/comm.h"
#include "executor/runtime/stage.h"
#include "executor/train/loss_scale.h"
#include "executor/train/tensor_parallel.h"
#include "executor/train/trainer.h"
#include "plan.pb.h"
#include "planner/support/status.h"

namespace rannc::train {

/// Makes an optimizer of the run's kind and options over `params`; used to
/// (de)serialize one parameter's state with torch::optim's own save/load.
using OptimizerFactory = std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<torch::Tensor>)>;

/// What the checkpoint hooks need to know about this rank's run.
struct CheckpointContext {
  const TrainOptions &opts;
  comm::Communicator &comm;
  const proto::Plan &plan;
  const ir::Graph &graph;
  const runtime::StageRunner &runner; ///< its parameters are loaded and saved in place
  int stage = 0, replica = 0;
  torch::optim::Optimizer &optimizer;
  OptimizerFactory make_optimizer;
  int64_t dataset_samples = 0;  ///< samples in --data (0: synthetic)
  int64_t samples_per_step = 0; ///< global batch x accumulation steps
  LossScaler *loss_scaler = nullptr; ///< fp16 plans only; saved, and restored on --resume
  /// Tensor parallelism (Note [tensor parallel ranks]): the stage's group
  /// (null: none), this rank's place in it and each sharded parameter's axis
  /// by name. Checkpoints and exports hold whole tensors, so any plan resumes them.
  comm::Communicator *tp_group = nullptr;
  TensorParallelPlace tp = {};
  std::map<std::string, int> axes = {};
};

class Checkpointer {
public:
  explicit Checkpointer(CheckpointContext ctx);

  /// Collective, before the first step: checks the checkpoint and export
  /// options and, with --resume, loads the newest complete checkpoint into the
  /// parameters, the optimizer and the generator, and trims the log (rank 0)
  /// to the steps before it. Returns the first step to run. Errors are agreed
  /// on: every rank fails, only the first failing rank's message is non-empty.
  Expected<int64_t> start(std::ostream &log);
  /// Samples consumed before step `step` of this run (its data position).
  int64_t samplesBefore(int64_t step) const { return data_offset_ + step * ctx_.samples_per_step; }
  /// True when a checkpoint is due after `completed` of `total` steps: every
  /// --checkpoint-every steps, and after the last one.
  bool due(int64_t completed, int64_t total) const;
  /// Collective: writes the checkpoint of `completed` steps (Note [checkpoint
  /// atomicity]). Throws on failure, which stops the job.
  void save(int64_t completed, std::ostream &log);
  /// Collective: rank 0 writes --export-onnx (the ONNX model with the trained
  /// weights of every stage) and --export-state (a state dict torch.load reads).
  Status exportTrained(std::ostream &log);
  /// Another stage this rank runs (an interleaved plan's chunk, Note
  /// [interleaved 1F1B]), with the optimizer of its parameters: saved,
  /// loaded and exported with the rank's own (Note [interleaved checkpoints]).
  void addStage(const runtime::StageRunner &runner, const ir::Graph &graph, torch::optim::Optimizer &optimizer);

private:
  Status load(std::ostream &log);
  /// Continues the checkpoint's fp16 loss scaling, where both have it.
  void restoreLossScale(const checkpoint::Manifest &m, std::ostream &log);
  /// The axis parameter `name` is cut along on this stage, -1: whole.
  int axisOf(const std::string &name) const;
  /// `t`, a slice along `axis` of a parameter (or of its optimizer state),
  /// joined whole over the group (collective over it); `axis` -1: `t`.
  torch::Tensor whole(const torch::Tensor &t, int axis) const;

  CheckpointContext ctx_;
  std::vector<std::pair<std::string, torch::Tensor>> params_;  ///< this rank's stages', by name
  std::vector<torch::optim::Optimizer *> optimizers_;           ///< params_[i]'s: its stage's optimizer
  std::vector<std::pair<std::string, torch::Tensor>> buffers_; ///< this rank's stages' (this replica's), by name
  std::string model_path_;
  /// Rank 0, with checkpoints and --data: each data file's size and SHA-256,
  /// recorded in the manifest and compared on --resume.
  std::vector<checkpoint::FileEntry> data_files_;
  int64_t start_step_ = 0;
  int64_t data_offset_ = 0;
};

/// Rewrites the JSONL log at `path` keeping the records of steps before
/// `step` (and dropping a line cut short by a kill); a missing log is fine.
Status trimLog(const std::string &path, int64_t step);

/// The trained `weights` of `model` as a state dict PyTorch's torch.load
/// reads (torch.save's zip format), written atomically, with the keys the
/// module's own state_dict has (a torch.export model's non-persistent buffers
/// left out): --export-state, and `rannc-exec export` of a TorchScript or
/// torch.export model's checkpoint.
Status writeStateDict(const std::string &model, std::map<std::string, ir::Tensor> weights, const std::string &path);

} // namespace rannc::train
