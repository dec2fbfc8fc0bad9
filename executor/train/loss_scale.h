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
/// A checkpoint saves the scaler's State (as GradScaler.state_dict does) and
/// --resume restores it, so a resumed run skips the steps an uninterrupted
/// one would (docs/training.md "Checkpoints, resume and export").
class LossScaler {
public:
  struct Options {
    double init_scale = 65536.0;
    double growth_factor = 2.0;
    double backoff_factor = 0.5;
    int growth_interval = 2000;
  };
  /// What the scaler carries from step to step: the rules, the scale and the
  /// good steps since the last change (GradScaler's _growth_tracker).
  struct State {
    Options options;
    double scale = 0;
    int growth_tracker = 0;
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

  State state() const { return {o_, scale_, good_steps_}; }
  /// Continues from a saved state (checkpoint resume).
  void restore(const State &s) {
    o_ = s.options;
    scale_ = s.scale;
    good_steps_ = s.growth_tracker;
  }

private:
  Options o_;
  double scale_;
  int good_steps_ = 0;
};

} // namespace rannc::train
