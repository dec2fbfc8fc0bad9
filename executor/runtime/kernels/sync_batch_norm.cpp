// BatchNorm with its batch statistics summed over a stage's replicas: what
// rannc-exec runs for plans with batchnorm: exact (Note [batch statistics] in
// planner/plan/batch_statistics.cpp).
//
// Note [synchronised batch statistics]
// As torch.nn.SyncBatchNorm: each replica sums, per channel, its samples and
// their count, the sums are all-reduced and give the whole batch's mean; then
// the squared deviations from that mean are summed and all-reduced into the
// batch's (biased) variance. The normalisation is written in ATen ops that
// autograd differentiates, and the all-reduce is an autograd Function whose
// backward all-reduces the gradient (the gradient of a sum over replicas, each
// replica's loss reading it), so every replica's backward gets the terms the
// other replicas' samples contribute, as on one device. Every replica runs the
// same graph in the same order, so the collectives match up forward and
// backward (Note [tensor parallel collectives] argues the same). The running
// statistics follow the node's own convention from the batch's statistics:
// ONNX's (momentum weighs the old value, biased variance) for
// BatchNormalization, PyTorch's (momentum weighs the batch, unbiased variance
// n/(n-1) with n the whole batch's count) for the ATen ops, which update them
// in place (aten::batch_norm, native_batch_norm, _native_batch_norm_legit) or
// return them (_native_batch_norm_legit_functional). Two passes over the data
// (mean, then deviations) round as PyTorch's CPU kernel does, not as the
// one-pass sum of squares would.
#include "executor/runtime/batch_statistics.h"
#include "executor/runtime/collectives.h"
#include "executor/runtime/kernels/helpers.h"
#include "executor/runtime/kernels/op_context.h"
#include "executor/runtime/ops.h"
#include "planner/ir/batch_norm.h"
#include "planner/ir/op_set.h"

namespace rannc::runtime {
namespace {

thread_local comm::Communicator *t_replicas = nullptr; // Note [batch statistics scope]

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

/// The sum over the replicas, forward and (of the gradient) backward.
struct SumOverReplicas : public torch::autograd::Function<SumOverReplicas> {
  static torch::Tensor forward(AutogradContext *ctx, const torch::Tensor &x, comm::Communicator *group) {
    ctx->saved_data["group"] = int64_t(reinterpret_cast<intptr_t>(group));
    return allReduceSum(*group, x);
  }
  static variable_list backward(AutogradContext *ctx, variable_list grads) {
    auto *group = reinterpret_cast<comm::Communicator *>(intptr_t(ctx->saved_data.at("group").toInt()));
    if (!grads[0].defined()) return {torch::Tensor(), torch::Tensor()};
    return {allReduceSum(*group, grads[0]), torch::Tensor()};
  }
};

/// The batch's statistics of x ([N, C, ...]) over every replica, and x normalised with them.
struct Normalised {
  torch::Tensor y;      ///< scaled and shifted, in x's dtype
  torch::Tensor mean;   ///< [C], float32 (double for double input)
  torch::Tensor var;    ///< [C], biased
  torch::Tensor invstd; ///< [C]
  double count = 0;     ///< samples x spatial positions over every replica
};

Normalised normalise(const torch::Tensor &x, const torch::Tensor &weight, const torch::Tensor &bias, double eps,
                     comm::Communicator &group) {
  if (x.dim() < 2) throw std::runtime_error("input must be [N, C, ...]");
  const int64_t C = x.size(1);
  std::vector<int64_t> dims = {0}, shape(size_t(x.dim()), 1);
  shape[1] = C;
  for (int64_t d = 2; d < x.dim(); ++d) dims.push_back(d);
  // Statistics in float32 (as autocast runs batch_norm), double stays double.
  const torch::Tensor xf = x.scalar_type() == torch::kDouble ? x : x.to(torch::kFloat);
  const double local = C == 0 ? 0.0 : double(x.numel() / C);
  torch::Tensor sums = SumOverReplicas::apply(
      torch::cat({xf.sum(dims), torch::full({1}, local, xf.options().requires_grad(false))}), &group);
  Normalised out;
  out.count = sums[C].item<double>();
  out.mean = sums.narrow(0, 0, C) / out.count;
  const torch::Tensor centred = xf - out.mean.view(shape);
  out.var = SumOverReplicas::apply(centred.square().sum(dims), &group) / out.count;
  out.invstd = torch::rsqrt(out.var + eps);
  torch::Tensor y = centred * out.invstd.view(shape);
  if (weight.defined()) y = y * weight.view(shape);
  if (bias.defined()) y = y + bias.view(shape);
  out.y = y.to(x.scalar_type());
  return out;
}

/// ONNX BatchNormalization in training mode (Note [BatchNormalization in
/// training] in normalization.cpp): Y, the updated running statistics, and
/// (opsets 9-13) the batch's.
std::vector<torch::Tensor> onnxBatchNorm(const ir::Node &node, const std::vector<torch::Tensor> &inputs,
                                         int64_t opset, comm::Communicator &group) {
  kernels::OpCtx c(node, inputs, opset);
  if (opset < 9 && c.attrInt("spatial", 1) == 0) c.fail("spatial=0 is supported in inference mode only");
  const double eps = kernels::exportedDouble(c.attrFloat("epsilon", 1e-5)), momentum = c.attrFloat("momentum", 0.9);
  const torch::Tensor &mean = c.in(3), &var = c.in(4);
  Normalised n = normalise(c.in(0), c.in(1), c.in(2), eps, group);
  torch::NoGradGuard no_grad;
  torch::Tensor batch_mean = n.mean.detach(), batch_var = n.var.detach();
  return {n.y, mean.detach() * momentum + batch_mean.to(mean.scalar_type()) * (1 - momentum),
          var.detach() * momentum + batch_var.to(var.scalar_type()) * (1 - momentum), batch_mean, batch_var};
}

/// The ATen batch norms: (input, weight?, bias?, running_mean?, running_var?,
/// training, momentum, eps, ...), or _native_batch_norm_legit.no_stats
/// (input, weight?, bias?, training, momentum, eps).
std::vector<torch::Tensor> atenBatchNorm(const ir::Node &node, const std::vector<torch::Tensor> &inputs,
                                         comm::Communicator &group) {
  const std::vector<c10::IValue> args = atenArguments(node, inputs);
  const bool no_stats = args.size() == 6;
  auto tensor = [&](size_t i) { return args.at(i).isNone() ? torch::Tensor() : args.at(i).toTensor(); };
  const size_t flags = no_stats ? 3 : 5;
  if (!args.at(flags).toBool()) return runAtenOp(node, inputs); // inference after all: a graph-computed flag
  torch::Tensor running_mean = no_stats ? torch::Tensor() : tensor(3), running_var = no_stats ? torch::Tensor() : tensor(4);
  const double momentum = args.at(flags + 1).isNone() ? 0.0 : args.at(flags + 1).toDouble();
  Normalised n = normalise(tensor(0), tensor(1), tensor(2), args.at(flags + 2).toDouble(), group);
  torch::Tensor new_mean, new_var;
  if (running_mean.defined() && running_var.defined()) {
    torch::NoGradGuard no_grad;
    const double unbiased = n.count > 1 ? n.count / (n.count - 1) : 1.0;
    new_mean = running_mean * (1 - momentum) + n.mean.detach().to(running_mean.scalar_type()) * momentum;
    new_var = running_var * (1 - momentum) + (n.var.detach() * unbiased).to(running_var.scalar_type()) * momentum;
  }
  if (node.op_type == "aten::_native_batch_norm_legit_functional")
    return {n.y, n.mean, n.invstd, new_mean, new_var};
  if (new_mean.defined()) { // the others update the buffers they were given in place
    torch::NoGradGuard no_grad;
    running_mean.copy_(new_mean);
    running_var.copy_(new_var);
  }
  if (node.op_type == "aten::batch_norm") return {n.y};
  return {n.y, n.mean, n.invstd};
}

} // namespace

BatchStatisticsScope::BatchStatisticsScope(comm::Communicator *replicas) : previous_(t_replicas) {
  t_replicas = replicas && replicas->size() > 1 ? replicas : nullptr;
}
BatchStatisticsScope::~BatchStatisticsScope() { t_replicas = previous_; }

comm::Communicator *batchStatisticsGroup() { return t_replicas; }

std::vector<torch::Tensor> runSyncBatchNorm(const ir::Node &node, const std::vector<torch::Tensor> &inputs,
                                            int64_t opset, comm::Communicator &group) {
  try {
    std::vector<torch::Tensor> out =
        ir::isAten(node) ? atenBatchNorm(node, inputs, group) : onnxBatchNorm(node, inputs, opset, group);
    out.resize(node.outputs.size()); // opset 14+: Y and the running statistics only
    return out;
  } catch (const kernels::OpError &) {
    throw;
  } catch (const std::exception &e) {
    throw std::runtime_error("node '" + node.name + "' (" + node.op_type + ", batch statistics over " +
                             std::to_string(group.size()) + " replicas): " + e.what());
  }
}

} // namespace rannc::runtime
