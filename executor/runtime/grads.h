// The gradient arithmetic of an optimizer step that the trainer runs and the
// profiler times: one implementation, so the measured update is the real one.
#pragma once

#include <torch/torch.h>

#include <vector>

namespace rannc::runtime {

/// Sum over `params` of the squared 2-norm of each defined gradient, the
/// per-tensor norms taken as torch.nn.utils.clip_grad_norm_ takes them. It is
/// not finite exactly when some gradient element is not (float32 squares
/// cannot overflow a double), so it doubles as the finiteness check.
double gradSquaredNorm(const std::vector<torch::Tensor> &params);

/// Zeroes every defined gradient in place: what torch::optim's zero_grad()
/// does, without its detach_(), which a gradient that is a view of an
/// all-reduce bucket (Note [gradient buckets]) does not allow.
void zeroGradients(const std::vector<torch::Tensor> &params);

} // namespace rannc::runtime
