// A stage's starting tensors: parameters and buffers loaded from the model
// file, or deterministic initial values for the ones a weightless model lacks
// (Note [weightless models] in planner/import/onnx_weights.cpp).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "executor/schedule/schedule.h"
#include "planner/ir/ir.h"
#include "planner/support/status.h"

namespace rannc::runtime {

/// Note [initial weights]
/// `rannc-exec --init-weights SEED` gives every parameter and buffer whose
/// contents the model file lacks a value that depends only on SEED, the
/// value's name and shape and the ops that read it — never on the plan, so
/// every layout (stages, replicas, micro-batches) trains the same model:
///   - BatchNormalization running mean (input 3): 0; running variance (input 4): 1;
///   - the scale (input 1) of BatchNormalization, LayerNormalization,
///     InstanceNormalization: 1; their bias (input 2): 0;
///   - every other tensor of rank 0 or 1 (biases): 0;
///   - tensors of rank 2 or more (weight matrices, embeddings, convolution
///     kernels): normal(0, 0.02), the BERT/GPT initializer, drawn from
///     LibTorch's CPU generator seeded with splitmix64(SEED ^ FNV-1a(name)).
/// Float tensors are drawn in float32 and converted to the value's dtype;
/// integer and boolean ones (num_batches_tracked, position ids) are 0.
std::map<ir::ValueId, torch::Tensor> initialTensors(const ir::Graph &g, const std::vector<ir::ValueId> &values,
                                                    uint64_t seed);

/// The tensors a stage starts from.
struct StageWeights {
  std::map<ir::ValueId, torch::Tensor> params;  ///< leaves that require grad
  std::map<ir::ValueId, torch::Tensor> buffers; ///< no grad
};

/// Loads `program`'s parameters and buffers from `model`. Contents the file
/// lacks are an error naming them, unless `init_seed` is set: then they get
/// their initial values (Note [initial weights]); the others are loaded.
Expected<StageWeights> loadStageWeights(const ir::Graph &g, const schedule::StageProgram &program,
                                        const std::string &model, std::optional<uint64_t> init_seed);

} // namespace rannc::runtime
