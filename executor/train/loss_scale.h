// Dynamic loss scaling for fp16 training, as torch.amp.GradScaler does it.
#pragma once

#include <torch/torch.h>

#include <vector>

namespace rannc::train {

/// Note [loss scaling]
/// fp16 has 5 exponent bits: small gradients underflow to zero. Under
/// --precision fp16 the backward starts from the loss times a scale S (2^16 at
/// first), so every gradient, across stages too, carries S; before the
/// optimizer step the parameter gradients are divided by S. A step whose
/// gradients hold an inf or NaN (the scale was too large) is skipped on every
/// rank (the trainer's finiteness check is already agreed by all ranks) and
/// logged, and S halves; after 2000 good steps in a row S doubles. These are
/// GradScaler's defaults and rules (init_scale, growth_factor, backoff_factor,
/// growth_interval), so a PyTorch fp16 run and rannc's skip the same steps.
class LossScaler {
public:
  struct Options {
    double init_scale = 65536.0;
    double growth_factor = 2.0;
    double backoff_factor = 0.5;
    int growth_interval = 2000;
  };
  LossScaler() : LossScaler(Options{}) {}
  explicit LossScaler(Options o) : o_(o), scale_(o.init_scale) {}

  /// The factor backward's root gradient carries now.
  double scale() const { return scale_; }
  /// Divides the gradients of `params` by the scale (in fp32, as GradScaler's
  /// unscale_ multiplies by the fp32 reciprocal).
  void unscale(const std::vector<torch::Tensor> &params) const;
  /// Ends a step: `overflow` (agreed by all ranks: the step was skipped) backs
  /// the scale off; otherwise it counts towards growth.
  void update(bool overflow);

private:
  Options o_;
  double scale_;
  int good_steps_ = 0;
};

} // namespace rannc::train
