// The optimizer side of rannc-exec: torch::optim optimizers built from the
// flags, LambdaLR-style learning-rate schedules and global-norm gradient
// clipping, each computing exactly what PyTorch computes (docs/training.md).
// Communication stays in the trainer: these functions see one rank's tensors.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "executor/runtime/grads.h"
#include "executor/train/trainer.h"
#include "planner/support/status.h"

namespace rannc::train {

/// Checks the optimizer, schedule, clipping, accumulation and epoch options
/// together: ranges, and flags that do not apply to the chosen optimizer or
/// schedule (an ignored flag is an error, not a silent default).
Status checkOptimizationOptions(const TrainOptions &opts);

/// torch::optim::SGD, Adam or AdamW over `params`, with PyTorch's defaults for
/// every hyper-parameter `opts` leaves unset (AdamW: weight decay 0.01).
std::unique_ptr<torch::optim::Optimizer> makeOptimizer(const TrainOptions &opts, std::vector<torch::Tensor> params);

/// The factor f(step) of torch.optim.lr_scheduler.LambdaLR: the learning rate
/// of optimizer step `step` (from 0) of `total_steps` is lr * f(step).
/// Note [lr schedule] in optim.cpp has the formulas.
double lrFactor(const TrainOptions &opts, int64_t step, int64_t total_steps);

/// Sets the learning rate of every parameter group.
void setLearningRate(torch::optim::Optimizer &optimizer, double lr);

/// torch.nn.utils.clip_grad_norm_'s factor: min(1, max_norm / (total_norm + 1e-6)).
double clipFactor(double total_norm, double max_norm);

/// Multiplies every defined gradient of `params` by `factor` in place.
void scaleGradients(const std::vector<torch::Tensor> &params, double factor);

/// Optimizer steps for `epochs` passes over `samples` samples when one step
/// takes `samples_per_step`: ceil(epochs * samples / samples_per_step).
int64_t stepsForEpochs(int64_t epochs, int64_t samples, int64_t samples_per_step);

} // namespace rannc::train
