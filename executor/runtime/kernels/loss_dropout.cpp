// ONNX losses (NegativeLogLikelihoodLoss, SoftmaxCrossEntropyLoss) and
// Dropout.
// Note [kernel conventions] in op_context.h holds for every kernel here.
#include <limits>
#include <string>

#include "executor/runtime/kernels/helpers.h"
#include "executor/runtime/kernels/registry.h"

namespace rannc::runtime::kernels {
namespace {

at::Reduction::Reduction reductionMode(const OpCtx &c) {
  std::string r = c.attrString("reduction", "mean");
  if (r == "mean") return at::Reduction::Mean;
  if (r == "sum") return at::Reduction::Sum;
  if (r == "none") return at::Reduction::None;
  c.fail("unsupported reduction '" + r + "'");
}

/// ONNX and torch agree on NLL: per-element -w[t] * in[n, t, ...]; mean divides
/// by the summed weights of the elements not ignored.
torch::Tensor nllLoss(const OpCtx &c, const torch::Tensor &log_prob) {
  const auto &target = c.in(1);
  if (!isIntegral(target)) c.fail("target must be an integer tensor");
  if (log_prob.dim() < 2) c.fail("input must have shape [N, C, ...]");
  // Without ignore_index nothing is ignored; no valid class equals INT64_MIN.
  int64_t ignore = c.attrInt("ignore_index", std::numeric_limits<int64_t>::min());
  return torch::nll_loss_nd(log_prob, target.to(torch::kLong), c.opt(2), reductionMode(c), ignore);
}

Outputs opNegativeLogLikelihoodLoss(const OpCtx &c) { return {nllLoss(c, c.in(0))}; }

Outputs opSoftmaxCrossEntropyLoss(const OpCtx &c) {
  torch::Tensor log_prob = torch::log_softmax(c.in(0), 1);
  return {nllLoss(c, log_prob), log_prob};
}

Outputs opDropout(const OpCtx &c) {
  const auto &x = c.in(0);
  if (c.opset() < 12) {
    // Opsets 7-11 (ratio attribute) describe inference only: the identity.
    // The mask is all true (bool from opset 10, the input's type before).
    torch::Tensor mask;
    if (c.wants(1))
      mask = torch::ones_like(x, torch::TensorOptions(c.opset() >= 10 ? torch::kBool : x.scalar_type()));
    return {x, mask};
  }
  double ratio = c.has(1) ? c.in(1).item<double>() : 0.5;
  bool training = c.has(2) && c.in(2).item<bool>();
  if (!training || ratio == 0.0) {
    torch::Tensor mask;
    if (c.wants(1)) mask = torch::ones_like(x, torch::TensorOptions(torch::kBool));
    return {x, mask};
  }
  // Scales kept elements by 1/(1-ratio), as ONNX does. The seed attribute is
  // not honoured: torch's generator is seeded by the trainer.
  auto [y, mask] = torch::native_dropout(x, ratio, true);
  return {y, mask.scalar_type() == torch::kBool ? mask : mask.to(torch::kBool)};
}

} // namespace

std::vector<KernelDef> lossDropoutKernels() {
  return {
      {"Dropout", 1, 3, opDropout},
      {"NegativeLogLikelihoodLoss", 2, 3, opNegativeLogLikelihoodLoss},
      {"SoftmaxCrossEntropyLoss", 2, 3, opSoftmaxCrossEntropyLoss},
  };
}

} // namespace rannc::runtime::kernels
