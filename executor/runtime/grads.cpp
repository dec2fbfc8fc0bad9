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

} // namespace rannc::runtime
