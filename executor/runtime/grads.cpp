#include "executor/runtime/grads.h"

namespace rannc::runtime {

double gradSquaredNorm(const std::vector<torch::Tensor> &params) {
  // Each gradient's norm on its device, then one copy to the host for all of
  // them (not a wait per parameter); squared and added there in parameter
  // order, in double, as before.
  std::vector<torch::Tensor> norms;
  for (const auto &p : params)
    if (p.grad().defined()) norms.push_back(p.grad().detach().norm().to(torch::kDouble));
  if (norms.empty()) return 0;
  const torch::Tensor host = torch::stack(norms).to(torch::kCPU, torch::kDouble);
  const double *n = host.data_ptr<double>();
  double sum = 0;
  for (int64_t i = 0; i < host.numel(); ++i) sum += n[i] * n[i];
  return sum;
}

void zeroGradients(const std::vector<torch::Tensor> &params) {
  torch::NoGradGuard no_grad;
  for (const auto &p : params)
    if (p.grad().defined()) p.grad().zero_();
}

} // namespace rannc::runtime
