// The collectives of a tensor-parallel local graph: the nodes of domain
// "rannc" that sharding::localGraph inserts (Note [tensor parallel sharding]
// in planner/sharding/sharding.h), run over the stage's tensor-parallel group
// (OpCtx::group()).
//
// Note [tensor parallel collectives]
// Each is a LibTorch autograd Function whose backward is the collective's
// adjoint, as Megatron-LM writes them:
//   - TensorParallelCopy (Megatron's f): identity forward; the gradient is
//     summed over the group backward (each device's sharded ops give a part
//     of the input's gradient);
//   - TensorParallelSum (g): the partial sums are summed forward; the
//     gradient passes unchanged (every device needs the whole of it);
//   - TensorParallelGather(axis): the slices are joined along `axis`
//     forward; backward keeps this device's slice of the gradient.
// The group is captured when forward runs, so backward (on whatever thread
// autograd runs it) sums over the same communicator. Every device of a group
// runs the same local graph in the same order, so the collectives match up
// forward; autograd's order is a function of the graph, so they match up
// backward too. A gradient autograd never computed (an unused output) is
// undefined on every device alike, and then no collective runs.
#include "executor/runtime/collectives.h"
#include "executor/runtime/kernels/registry.h"
#include "planner/ir/op_set.h"

namespace rannc::runtime::kernels {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

void keepGroup(AutogradContext *ctx, comm::Communicator &group) {
  ctx->saved_data["group"] = int64_t(reinterpret_cast<intptr_t>(&group));
}
comm::Communicator &groupOf(AutogradContext *ctx) {
  return *reinterpret_cast<comm::Communicator *>(intptr_t(ctx->saved_data.at("group").toInt()));
}

struct CopyToGroup : public torch::autograd::Function<CopyToGroup> {
  static torch::Tensor forward(AutogradContext *ctx, const torch::Tensor &x, comm::Communicator *group) {
    keepGroup(ctx, *group);
    return x;
  }
  static variable_list backward(AutogradContext *ctx, variable_list grads) {
    if (!grads[0].defined()) return {torch::Tensor(), torch::Tensor()};
    return {allReduceSum(groupOf(ctx), grads[0]), torch::Tensor()}; // no gradient for the group
  }
};

struct SumOverGroup : public torch::autograd::Function<SumOverGroup> {
  static torch::Tensor forward(AutogradContext *, const torch::Tensor &x, comm::Communicator *group) {
    return allReduceSum(*group, x);
  }
  static variable_list backward(AutogradContext *, variable_list grads) { return {grads[0], torch::Tensor()}; }
};

struct GatherAxis : public torch::autograd::Function<GatherAxis> {
  static torch::Tensor forward(AutogradContext *ctx, const torch::Tensor &x, comm::Communicator *group, int64_t axis) {
    ctx->saved_data["axis"] = axis;
    ctx->saved_data["rank"] = int64_t(group->rank());
    ctx->saved_data["size"] = int64_t(group->size());
    return allGather(*group, x, axis);
  }
  static variable_list backward(AutogradContext *ctx, variable_list grads) {
    if (!grads[0].defined()) return {torch::Tensor(), torch::Tensor(), torch::Tensor()};
    return {shardOf(grads[0], ctx->saved_data.at("axis").toInt(), ctx->saved_data.at("rank").toInt(),
                    ctx->saved_data.at("size").toInt()),
            torch::Tensor(), torch::Tensor()};
  }
};

/// The group the node's collective runs over; a graph that has one outside a
/// tensor-parallel stage is an error.
comm::Communicator &groupFor(const OpCtx &c) {
  if (!c.group()) c.fail("a tensor-parallel collective outside a tensor-parallel stage (no group to run it over)");
  return *c.group();
}

Outputs copyToGroup(const OpCtx &c) { return {CopyToGroup::apply(c.in(0), &groupFor(c))}; }
Outputs sumOverGroup(const OpCtx &c) { return {SumOverGroup::apply(c.in(0), &groupFor(c))}; }
Outputs gatherAxis(const OpCtx &c) {
  const torch::Tensor &x = c.in(0);
  int64_t axis = c.attrInt("axis");
  if (axis < 0) axis += x.dim();
  if (axis < 0 || axis >= x.dim()) c.fail("axis " + std::to_string(c.attrInt("axis")) + " is out of range");
  return {GatherAxis::apply(x, &groupFor(c), axis)};
}

} // namespace

std::vector<KernelDef> tensorParallelKernels() {
  return {
      {ir::kTensorParallelCopy, 1, 1, copyToGroup},
      {ir::kTensorParallelGather, 1, 1, gatherAxis},
      {ir::kTensorParallelSum, 1, 1, sumOverGroup},
  };
}

} // namespace rannc::runtime::kernels
