// ONNX Softmax, LogSoftmax and Hardmax, with the 2-D coercion of opsets
// before 13.
// Note [kernel conventions] in op_context.h holds for every kernel here.
#include <vector>

#include "executor/runtime/kernels/helpers.h"
#include "executor/runtime/kernels/registry.h"

namespace rannc::runtime::kernels {
namespace {

/// Opsets 1-12 coerce the input to 2-D at `axis` (default 1) and normalise each
/// row; 13+ normalise along the one axis `axis` (default -1).
Outputs softmaxLike(const OpCtx &c, bool log) {
  const auto &x = c.in(0);
  auto apply = [&](const torch::Tensor &t, int64_t dim) {
    return log ? torch::log_softmax(t, dim) : torch::softmax(t, dim);
  };
  if (c.opset() >= 13) return {apply(x, normAxis(c, c.attrInt("axis", -1), x.dim()))};
  int64_t axis = normBoundary(c, c.attrInt("axis", 1), x.dim());
  int64_t outer = product(x.sizes().slice(0, axis));
  int64_t inner = product(x.sizes().slice(axis));
  return {apply(x.reshape({outer, inner}), 1).reshape(x.sizes())};
}
Outputs opSoftmax(const OpCtx &c) { return softmaxLike(c, false); }
Outputs opLogSoftmax(const OpCtx &c) { return softmaxLike(c, true); }

Outputs opHardmax(const OpCtx &c) {
  const auto &x = c.in(0);
  // One at the first maximum along the axis (coerced to 2-D before opset 13).
  auto oneHot = [](const torch::Tensor &t, int64_t dim) {
    return torch::zeros_like(t).scatter(dim, torch::argmax(t, dim, true), 1.0);
  };
  if (c.opset() >= 13) return {oneHot(x, normAxis(c, c.attrInt("axis", -1), x.dim()))};
  int64_t axis = normBoundary(c, c.attrInt("axis", 1), x.dim());
  int64_t outer = product(x.sizes().slice(0, axis)), inner = product(x.sizes().slice(axis));
  return {oneHot(x.reshape({outer, inner}), 1).reshape(x.sizes())};
}

} // namespace

std::vector<KernelDef> softmaxKernels() {
  return {
      {"Hardmax", 1, 1, opHardmax},
      {"LogSoftmax", 1, 1, opLogSoftmax},
      {"Softmax", 1, 1, opSoftmax},
  };
}

} // namespace rannc::runtime::kernels
