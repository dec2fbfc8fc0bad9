#include "executor/train/loss_scale.h"

namespace rannc::train {

void LossScaler::unscale(const std::vector<torch::Tensor> &params) const {
  torch::NoGradGuard no_grad;
  const float inv = static_cast<float>(1.0 / scale_);
  for (const auto &p : params)
    if (p.grad().defined()) p.mutable_grad().mul_(inv);
}

void LossScaler::update(bool overflow) {
  if (overflow) {
    scale_ *= o_.backoff_factor;
    good_steps_ = 0;
    return;
  }
  if (++good_steps_ == o_.growth_interval) {
    scale_ *= o_.growth_factor;
    good_steps_ = 0;
  }
}

} // namespace rannc::train
