// rannc-exec's training loop: load the plan, this rank's stage, its weights
// and data, then run the schedule step after step and log.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "executor/comm/comm.h"
#include "executor/comm/rehearsal.h"
#include "executor/train/options.h"
#include "planner/cluster/device_kind.h"
#include "planner/support/status.h"

namespace rannc::train {

struct TrainOptions {
  std::string plan;
  std::string model;      ///< overrides the model path the plan names
  bool allow_model_outside_plan = false; ///< Note [plan model path]
  bool wrap_data = false; ///< --data may hold fewer samples than one step reads
  std::string data_dir;
  bool synthetic = false;
  int64_t steps = 10;     ///< optimizer steps (each takes accumulation_steps global batches)
  int64_t epochs = 0;     ///< > 0: train this many passes over --data instead of `steps` (docs/training.md)
  OptimizerKind optimizer = OptimizerKind::Sgd;
  double lr = 0.01;
  // Optimizer hyper-parameters; unset: PyTorch's default (executor/train/optim.h).
  std::optional<double> momentum, dampening, weight_decay, eps; ///< momentum, dampening: sgd; eps: adam(w)
  bool nesterov = false;                                        ///< sgd
  std::optional<std::pair<double, double>> betas;               ///< adam(w)
  std::string lr_schedule = "constant"; ///< constant | cosine | linear, after `warmup_steps` of linear warm-up
  int64_t warmup_steps = 0;
  std::optional<double> min_lr;   ///< where cosine/linear decay ends (default 0)
  double clip_grad_norm = 0;      ///< > 0: clip the global gradient norm (over all stages) to this
  int64_t accumulation_steps = 1; ///< global batches whose gradients one optimizer step applies
  int64_t bucket_bytes = 25 << 20; ///< gradient all-reduce bucket size (Note [gradient buckets])
  Shuffle shuffle = Shuffle::Off;
  uint64_t seed = 0;
  std::string log;        ///< JSONL file written by rank 0; empty: none
  std::string trace;      ///< Chrome trace of every rank's actions, written by rank 0; empty: none
  double timeout_s = 300; ///< a rank that makes no progress this long stops the job (0: never)
  std::string on_nonfinite = "stop"; ///< stop | skip: what a non-finite gradient does
  std::optional<double> loss_scale;  ///< fp16 plans: the initial dynamic loss scale (default 2^16, Note [loss scaling])
  std::optional<cluster::DeviceKind> device; ///< where ranks compute (Note [choosing a GPU]); unset: the plan's
  bool host_staged = false; ///< on GPUs: move tensors through host memory over MPI even where NCCL could
  /// On CPU: run the GPU path's logic against the NCCL stand-in (Note [rehearsal]).
  std::optional<comm::RehearsalOptions> rehearsal;
  bool progress = true;   ///< a line per step on stderr (rank 0)
  // Checkpoints and export (executor/train/checkpoint.h, docs/training.md).
  std::string checkpoint_dir;   ///< checkpoints go to <dir>/step-<N>/ (and after the last step); empty: none
  int64_t checkpoint_every = 0; ///< > 0: also a checkpoint every this many steps
  int keep = 0;                 ///< > 0: delete all but the newest `keep` checkpoints
  bool resume = false;          ///< continue from the newest complete checkpoint in checkpoint_dir
  bool resume_other_data = false; ///< resume though the --data files differ from the checkpoint's
  std::string export_onnx;      ///< at the end, the model with the trained weights goes here
  std::string export_state;     ///< at the end, the trained weights as a state dict (torch.load) go here
  std::vector<std::string> drop_keys; ///< left out of export_state (Note [TorchScript buffers])
  /// Seed for the parameters and buffers the model file has no contents for
  /// (a weightless model; Note [initial weights] in executor/runtime/weights.h);
  /// unset: such a model is an error.
  std::optional<uint64_t> init_weights;
};

/// Trains on every rank of `comm`. Start-up problems (plan, world size, model
/// hash, data) are agreed on by all ranks before the first step: every rank
/// returns an error, and only the first failing rank's message is non-empty.
Status train(const TrainOptions &opts, comm::Communicator &comm, std::ostream &log);

} // namespace rannc::train
