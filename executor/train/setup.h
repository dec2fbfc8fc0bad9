// Start-up of a rank: the plan, its stage, its device, its data and weights,
// everything checked before the first step (executor/train/trainer.h).
#pragma once

#include <torch/torch.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "executor/comm/comm.h"
#include "executor/data/npy.h"
#include "executor/train/tensor_parallel.h"
#include "executor/train/trainer.h"
#include "plan.pb.h"
#include "planner/ir/ir.h"
#include "planner/support/status.h"

namespace rannc::train {

/// Everything a rank needs before the first step.
struct Setup {
  proto::Plan plan;
  ir::Graph graph;
  int stage = -1;
  std::vector<std::pair<int, int>> ranges;
  /// The replicas of each stage, in replica order: their ranks, or with
  /// tensor parallelism their groups' leaders (Note [tensor parallel ranks]).
  std::vector<std::vector<int>> stage_ranks;
  int replica = 0;                           ///< this rank's index among its stage's replicas
  std::vector<int> tensor_parallel;          ///< each stage's tensor-parallel degree (1: none)
  TensorParallelPlace tp;                    ///< this rank's place in its stage's groups
  ParameterAxes param_axes;                  ///< this stage's sharded parameters (params holds their slices)
  std::map<ir::ValueId, data::NpyArray> data; ///< every data input (validated on every rank)
  int64_t samples = 0;
  std::map<ir::ValueId, torch::Tensor> params, constants, buffers;
  torch::Device device = torch::kCPU; ///< where the stage's tensors live
  std::string gpu_why;                ///< why that GPU (Note [choosing a GPU])
  /// The CUDA device index of `device` (-1: CPU).
  int gpu() const { return device.is_cuda() ? int(device.index()) : -1; }
};

/// Whether `a` fits graph input `id` (dtype, rank, fixed dimensions); `path` names it in the error.
Status checkDataShape(const ir::Graph &g, ir::ValueId id, const data::NpyArray &a, const std::string &path);

/// The model file a run reads: --model, or the plan's model.path resolved
/// against the plan's folder (Note [plan model path]); the error names the plan.
Expected<std::string> trainModelPath(const TrainOptions &opts, const proto::Plan &plan);

/// Reads and checks the plan, the model, the data and this rank's weights
/// (under an interleaved plan, those of its first chunk, the stage the rank
/// runs first: Note [interleaved 1F1B] in planner/pipeline/schedule.h).
Expected<Setup> prepare(const TrainOptions &opts, const comm::Communicator &comm);

/// The Setup of another chunk `stage` of the rank `first` is the first chunk
/// of: the same layout and device, that stage's weights, no data (the first
/// chunk's Setup reads it for all).
Expected<Setup> chunkSetup(const TrainOptions &opts, const Setup &first, int stage);

} // namespace rannc::train
