// ONNX normalisations: batch, instance, layer, local response and
// mean-variance normalisation.
// Note [kernel conventions] in op_context.h holds for every kernel here.
#include <vector>

#include "executor/runtime/kernels/helpers.h"
#include "executor/runtime/kernels/registry.h"

namespace rannc::runtime::kernels {
namespace {

/// Note [BatchNormalization in training]
/// In training mode (opset 14+: training_mode=1; opsets 6-13: when the
/// optional outputs are requested, or is_test=0 before opset 7) Y uses the
/// batch's mean and biased variance, and the optional outputs are the updated
/// running statistics, per the ONNX formula
///   running_mean = input_mean * momentum + batch_mean * (1 - momentum)
///   running_var  = input_var  * momentum + batch_var  * (1 - momentum)
/// with the biased batch variance. PyTorch's own module updates running_var
/// with the unbiased one (times n/(n-1), n = samples x spatial positions), so
/// after training rannc's running_var is slightly smaller than PyTorch's;
/// running_mean agrees, and so do training-mode losses, which use the batch
/// statistics only. They are returned detached; the stage copies them into the
/// running-statistics buffers after the node runs (Note [buffers] in ir.h).
/// Opsets 9-13 add saved_mean and saved_var outputs: the batch statistics.
Outputs opBatchNormalization(const OpCtx &c) {
  const auto &x = c.in(0), &scale = c.in(1), &bias = c.in(2), &mean = c.in(3), &var = c.in(4);
  if (x.dim() < 2) c.fail("input must be [N, C, ...]");
  double eps = exportedDouble(c.attrFloat("epsilon", 1e-5)), momentum = c.attrFloat("momentum", 0.9);
  bool training;
  if (c.opset() >= 14)
    training = c.attrInt("training_mode", 0) != 0;
  else if (c.opset() < 7 && c.hasAttr("is_test"))
    training = c.attrInt("is_test", 0) == 0 && c.numOutputs() > 1;
  else
    training = c.numOutputs() > 1;
  bool spatial = c.opset() >= 9 || c.attrInt("spatial", 1) != 0;
  if (!spatial) {
    // Opsets 6-8 spatial=0: statistics per activation ([C, D1, ...] params).
    if (training) c.fail("spatial=0 is supported in inference mode only");
    auto u = [](const torch::Tensor &t) { return t.unsqueeze(0); };
    return {(x - u(mean)) / torch::sqrt(u(var) + eps) * u(scale) + u(bias)};
  }
  if (!training) return {torch::batch_norm(x, scale, bias, mean, var, false, 0.0, eps, false)};

  torch::Tensor y = torch::batch_norm(x, scale, bias, {}, {}, true, 0.0, eps, false);
  std::vector<int64_t> dims = {0};
  for (int64_t d = 2; d < x.dim(); ++d) dims.push_back(d);
  torch::Tensor xd = x.detach();
  torch::Tensor batch_mean = xd.mean(dims);
  torch::Tensor batch_var = xd.var(dims, /*unbiased=*/false);
  torch::Tensor run_mean = mean.detach() * momentum + batch_mean.to(mean.scalar_type()) * (1 - momentum);
  torch::Tensor run_var = var.detach() * momentum + batch_var.to(var.scalar_type()) * (1 - momentum);
  return {y, run_mean, run_var, batch_mean, batch_var};
}

Outputs opInstanceNormalization(const OpCtx &c) {
  const auto &x = c.in(0);
  if (x.dim() < 3) c.fail("input must be [N, C, spatial...]");
  return {torch::instance_norm(x, c.in(1), c.in(2), {}, {}, true, 0.0, c.attrFloat("epsilon", 1e-5),
                               false)};
}

Outputs opLRN(const OpCtx &c) {
  const auto &x = c.in(0);
  if (x.dim() < 3) c.fail("input must be [N, C, spatial...]");
  int64_t size = c.attrInt("size");
  if (size <= 0) c.fail("size must be positive");
  double alpha = c.attrFloat("alpha", 1e-4), beta = c.attrFloat("beta", 0.75),
         bias = c.attrFloat("bias", 1.0);
  // Sum of squares over channels [c - floor((size-1)/2), c + ceil((size-1)/2)].
  int64_t before = (size - 1) / 2, after = size - 1 - before;
  std::vector<int64_t> pad(size_t(2 * (x.dim() - 2)), 0);
  pad.push_back(before);
  pad.push_back(after);
  torch::Tensor sq = torch::constant_pad_nd(x * x, pad, 0);
  torch::Tensor sum = sq.unfold(1, size, 1).sum(-1);
  return {x / torch::pow(bias + (alpha / double(size)) * sum, beta)};
}

Outputs opMeanVarianceNormalization(const OpCtx &c) {
  const auto &x = c.in(0);
  std::vector<int64_t> axes =
      normAxes(c, c.attrInts("axes").value_or(std::vector<int64_t>{0, 2, 3}), x.dim());
  torch::Tensor mean = x.mean(axes, true);
  torch::Tensor var = (x * x).mean(axes, true) - mean * mean;
  return {(x - mean) / (torch::sqrt(var) + 1e-9)};
}

Outputs opLayerNormalization(const OpCtx &c) {
  const auto &x = c.in(0);
  const auto &scale = c.in(1);
  auto bias = c.opt(2);
  int64_t axis = normAxis(c, c.attrInt("axis", -1), x.dim());
  double eps = c.attrFloat("epsilon", 1e-5);
  c10::IntArrayRef normalized = x.sizes().slice(axis);
  bool plain_params =
      scale.sizes() == normalized && scale.scalar_type() == x.scalar_type() &&
      (!bias || (bias->sizes() == normalized && bias->scalar_type() == x.scalar_type()));
  // The fused kernel saves memory, but autograd ignores gradients arriving at
  // its mean/rstd results, so it is used only when Mean/InvStdDev are unused.
  if (!c.wants(1) && !c.wants(2) && plain_params)
    return {torch::layer_norm(x, normalized, scale, bias, eps)};

  // stash_type 1 (the default): statistics in float32 for 16-bit inputs.
  bool stash_f32 = c.attrInt("stash_type", 1) == 1 &&
                   (x.scalar_type() == torch::kHalf || x.scalar_type() == torch::kBFloat16);
  torch::Tensor xs = stash_f32 ? x.to(torch::kFloat) : x;
  std::vector<int64_t> dims;
  for (int64_t d = axis; d < x.dim(); ++d) dims.push_back(d);
  torch::Tensor mean = xs.mean(dims, /*keepdim=*/true);
  torch::Tensor centered = xs - mean;
  torch::Tensor inv_std = torch::rsqrt(centered.pow(2).mean(dims, true) + eps);
  torch::Tensor y = (centered * inv_std).to(x.scalar_type()) * scale;
  if (bias) y = y + *bias;
  return {y, mean, inv_std};
}

} // namespace

std::vector<KernelDef> normalizationKernels() {
  return {
      {"BatchNormalization", 5, 5, opBatchNormalization},
      {"InstanceNormalization", 3, 3, opInstanceNormalization},
      {"LRN", 1, 1, opLRN},
      {"LayerNormalization", 2, 3, opLayerNormalization},
      {"MeanVarianceNormalization", 1, 1, opMeanVarianceNormalization},
  };
}

} // namespace rannc::runtime::kernels
