#include "executor/train/optim.h"

#include <cmath>
#include <sstream>
#include <string>

namespace rannc::train {
namespace {

std::string num(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

} // namespace

Status checkOptimizationOptions(const TrainOptions &o) {
  if (!(o.lr > 0) || !std::isfinite(o.lr)) return Error{"--lr " + num(o.lr) + ": must be a positive number"};
  const std::string for_opt = " does not apply to --optimizer " + optimizerName(o.optimizer);
  if (o.optimizer != OptimizerKind::Sgd) {
    if (o.momentum) return Error{"--momentum" + for_opt + " (sgd only; Adam's are --betas)"};
    if (o.dampening) return Error{"--dampening" + for_opt + " (sgd only)"};
    if (o.nesterov) return Error{"--nesterov" + for_opt + " (sgd only)"};
  } else {
    if (o.betas) return Error{"--betas" + for_opt + " (adam and adamw only)"};
    if (o.eps) return Error{"--eps" + for_opt + " (adam and adamw only)"};
  }
  if (o.momentum && !(*o.momentum >= 0 && std::isfinite(*o.momentum)))
    return Error{"--momentum " + num(*o.momentum) + ": must be >= 0"};
  if (o.dampening && !(*o.dampening >= 0 && std::isfinite(*o.dampening)))
    return Error{"--dampening " + num(*o.dampening) + ": must be >= 0"};
  // PyTorch's own rule (torch.optim.SGD raises the same).
  if (o.nesterov && (o.momentum.value_or(0) <= 0 || o.dampening.value_or(0) != 0))
    return Error{"--nesterov needs a --momentum above 0 and zero --dampening"};
  if (o.weight_decay && !(*o.weight_decay >= 0 && std::isfinite(*o.weight_decay)))
    return Error{"--weight-decay " + num(*o.weight_decay) + ": must be >= 0"};
  if (o.eps && !(*o.eps >= 0 && std::isfinite(*o.eps))) return Error{"--eps " + num(*o.eps) + ": must be >= 0"};
  if (o.betas)
    for (double b : {o.betas->first, o.betas->second})
      if (!(b >= 0 && b < 1))
        return Error{"--betas " + num(o.betas->first) + "," + num(o.betas->second) + ": each must be in [0, 1)"};

  if (o.lr_schedule != "constant" && o.lr_schedule != "cosine" && o.lr_schedule != "linear")
    return Error{"--lr-schedule " + o.lr_schedule + ": unknown (constant, cosine or linear)"};
  if (o.warmup_steps < 0) return Error{"--warmup-steps " + std::to_string(o.warmup_steps) + ": must be >= 0"};
  if (o.min_lr) {
    if (o.lr_schedule == "constant")
      return Error{"--min-lr applies to the cosine and linear schedules, not --lr-schedule constant"};
    if (!(*o.min_lr >= 0 && *o.min_lr <= o.lr))
      return Error{"--min-lr " + num(*o.min_lr) + ": must be in [0, --lr " + num(o.lr) + "]"};
  }
  if (!(o.clip_grad_norm >= 0 && std::isfinite(o.clip_grad_norm)))
    return Error{"--clip-grad-norm " + num(o.clip_grad_norm) + ": must be > 0 (0: no clipping)"};
  if (o.accumulation_steps < 1)
    return Error{"--accumulation-steps " + std::to_string(o.accumulation_steps) + ": must be >= 1"};
  if (o.epochs < 0) return Error{"--epochs " + std::to_string(o.epochs) + ": must be >= 1"};
  if (o.epochs > 0 && o.synthetic)
    return Error{"--epochs needs --data (synthetic data has no sample count); pass --steps instead"};
  return Status::success();
}

std::unique_ptr<torch::optim::Optimizer> makeOptimizer(const TrainOptions &o, std::vector<torch::Tensor> params) {
  if (o.optimizer == OptimizerKind::Sgd) {
    torch::optim::SGDOptions sgd(o.lr);
    sgd.momentum(o.momentum.value_or(0)).dampening(o.dampening.value_or(0)).nesterov(o.nesterov);
    sgd.weight_decay(o.weight_decay.value_or(0));
    return std::make_unique<torch::optim::SGD>(std::move(params), sgd);
  }
  // Adam and AdamW take the same options; only their defaults for weight
  // decay differ (0 and 0.01, as in PyTorch), so start from each one's own.
  auto fill = [&](auto options) {
    options.lr(o.lr);
    if (o.betas) options.betas(std::make_tuple(o.betas->first, o.betas->second));
    if (o.eps) options.eps(*o.eps);
    if (o.weight_decay) options.weight_decay(*o.weight_decay);
    return options;
  };
  if (o.optimizer == OptimizerKind::AdamW)
    return std::make_unique<torch::optim::AdamW>(std::move(params), fill(torch::optim::AdamWOptions()));
  return std::make_unique<torch::optim::Adam>(std::move(params), fill(torch::optim::AdamOptions()));
}

// Note [lr schedule]
// As torch.optim.lr_scheduler.LambdaLR, with the factor f of the usual
// warm-up schedules (Hugging Face's get_{constant,linear,cosine}_schedule_
// with_warmup), for step k = 0, 1, ..., T-1 of T optimizer steps, W warm-up
// steps and r = min_lr / lr:
//   k < W:     f = k / W                      (so step 0 runs at lr 0)
//   constant:  f = 1
//   linear:    f = r + (1 - r) * max(0, (T - k) / max(1, T - W))
//   cosine:    f = r + (1 - r) * (1 + cos(pi * p)) / 2,  p = (k - W) / max(1, T - W)
// The decay reaches min_lr at k = T, one step after the last one taken, as in
// PyTorch. The schedule depends on k alone, so a skipped step (non-finite
// gradients with --on-nonfinite skip) still moves it on, as a scheduler.step()
// after every iteration does.
double lrFactor(const TrainOptions &o, int64_t step, int64_t total_steps) {
  const double k = double(step), T = double(total_steps), W = double(o.warmup_steps);
  if (step < o.warmup_steps) return k / W;
  if (o.lr_schedule == "constant") return 1.0;
  const double r = o.min_lr.value_or(0.0) / o.lr;
  const double span = std::max(1.0, T - W);
  if (o.lr_schedule == "linear") return r + (1 - r) * std::max(0.0, (T - k) / span);
  const double p = (k - W) / span;
  return r + (1 - r) * 0.5 * (1.0 + std::cos(M_PI * p));
}

void setLearningRate(torch::optim::Optimizer &optimizer, double lr) {
  for (auto &group : optimizer.param_groups()) group.options().set_lr(lr);
}

double clipFactor(double total_norm, double max_norm) { return std::min(1.0, max_norm / (total_norm + 1e-6)); }

void scaleGradients(const std::vector<torch::Tensor> &params, double factor) {
  torch::NoGradGuard no_grad;
  for (const auto &p : params)
    if (p.grad().defined()) p.grad().mul_(factor);
}

int64_t stepsForEpochs(int64_t epochs, int64_t samples, int64_t samples_per_step) {
  return (epochs * samples + samples_per_step - 1) / samples_per_step;
}

} // namespace rannc::train
