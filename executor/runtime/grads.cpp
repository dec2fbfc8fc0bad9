#include "executor/runtime/grads.h"

namespace rannc::runtime {

double gradSquaredNorm(const std::vector<torch::Tensor> &params) {
  double sum = 0;
  for (const auto &p : params)
    if (p.grad().defined()) {
      const double n = p.grad().detach().norm().item<double>();
      sum += n * n;
    }
  return sum;
}

void zeroGradients(const std::vector<torch::Tensor> &params) {
  torch::NoGradGuard no_grad;
  for (const auto &p : params)
    if (p.grad().defined()) p.grad().zero_();
}

} // namespace rannc::runtime
