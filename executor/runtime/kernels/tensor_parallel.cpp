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

// Note [vocabulary parallelism] (planner/sharding/vocab.cpp): the device's
// first row (or class) is its position in the group times its local count.

/// The lookup of `ids` in this device's rows of a table cut by rows: zero for
/// the ids other devices hold (a partial sum; SumOverGroup follows). Plain
/// LibTorch ops, so autograd gives the table its gradient on the rows looked up.
Outputs vocabEmbedding(const OpCtx &c) {
  comm::Communicator &group = groupFor(c);
  const torch::Tensor &table = c.in(0);
  torch::Tensor ids = c.in(1).to(torch::kLong);
  if (table.dim() != 2) c.fail("the table must be 2-D, not " + std::to_string(table.dim()) + "-D");
  const int64_t rows = table.size(0), first = rows * group.rank();
  ids = torch::where(ids < 0, ids + rows * group.size(), ids) - first; // ONNX Gather counts negative ids from the end
  const torch::Tensor mine = ids.ge(0).logical_and(ids.lt(rows));
  const torch::Tensor out = torch::embedding(table, ids.masked_fill(mine.logical_not(), 0));
  return {out.masked_fill(mine.logical_not().unsqueeze(-1), 0)};
}

/// Megatron's vocabulary-parallel cross entropy over class axis 1 of logits
/// cut by classes: the whole loss on every device; the gradient of the
/// local logits is local (softmax minus one-hot on this device's classes).
struct VocabCrossEntropy : public torch::autograd::Function<VocabCrossEntropy> {
  static torch::Tensor forward(AutogradContext *ctx, const torch::Tensor &logits, const torch::Tensor &target,
                               comm::Communicator *group, int64_t ignore_index, bool ignore, int64_t reduction) {
    const torch::Tensor x = logits.to(torch::kFloat);
    const int64_t classes = x.size(1), first = classes * group->rank();
    const torch::Tensor shifted = x - allReduceMax(*group, std::get<0>(x.max(1, true)));
    const torch::Tensor exp = shifted.exp();
    const torch::Tensor sum = allReduceSum(*group, exp.sum(1, true));
    const torch::Tensor t = target.to(torch::kLong);
    const torch::Tensor valid = ignore ? t.ne(ignore_index) : torch::ones_like(t, torch::kBool);
    const torch::Tensor local = t - first;
    const torch::Tensor mine = valid.logical_and(local.ge(0)).logical_and(local.lt(classes));
    const torch::Tensor index = local.masked_fill(mine.logical_not(), 0).unsqueeze(1);
    const torch::Tensor picked = allReduceSum(*group, shifted.gather(1, index).squeeze(1).masked_fill(mine.logical_not(), 0));
    const torch::Tensor loss = (sum.squeeze(1).log() - picked).masked_fill(valid.logical_not(), 0);
    const torch::Tensor count = valid.sum().to(torch::kFloat);
    ctx->save_for_backward({exp / sum, index, mine, valid, count});
    ctx->saved_data["reduction"] = reduction;
    ctx->saved_data["dtype"] = int64_t(logits.scalar_type());
    torch::Tensor out = reduction == 0 ? loss : reduction == 2 ? loss.sum() : loss.sum() / count;
    return out.to(logits.scalar_type());
  }
  static variable_list backward(AutogradContext *ctx, variable_list grads) {
    variable_list none(6);
    if (!grads[0].defined()) return none;
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor &softmax = saved[0], &index = saved[1], &mine = saved[2], &valid = saved[3];
    const int64_t reduction = ctx->saved_data.at("reduction").toInt();
    torch::Tensor g = grads[0].to(torch::kFloat);
    if (reduction == 1) g = g / saved[4];
    g = (g * valid.to(torch::kFloat)).unsqueeze(1); // per sample, broadcast over the classes
    torch::Tensor dx = softmax.clone();
    dx.scatter_add_(1, index, -mine.to(torch::kFloat).unsqueeze(1));
    none[0] = (dx * g).to(c10::ScalarType(ctx->saved_data.at("dtype").toInt()));
    return none;
  }
};

Outputs vocabCrossEntropy(const OpCtx &c) {
  const torch::Tensor &logits = c.in(0), &target = c.in(1);
  if (logits.dim() < 2 || target.dim() != logits.dim() - 1)
    c.fail("logits of rank >= 2 and a target of one rank less are needed");
  const std::string red = c.attrString("reduction", "mean");
  const int64_t reduction = red == "none" ? 0 : red == "mean" ? 1 : red == "sum" ? 2 : -1;
  if (reduction < 0) c.fail("reduction '" + red + "' is not none, mean or sum");
  return {VocabCrossEntropy::apply(logits, target, &groupFor(c), c.attrInt("ignore_index", 0),
                                   c.hasAttr("ignore_index"), reduction)};
}

} // namespace

std::vector<KernelDef> tensorParallelKernels() {
  return {
      {ir::kTensorParallelCopy, 1, 1, copyToGroup},
      {ir::kTensorParallelCrossEntropy, 2, 2, vocabCrossEntropy},
      {ir::kTensorParallelEmbedding, 2, 2, vocabEmbedding},
      {ir::kTensorParallelGather, 1, 1, gatherAxis},
      {ir::kTensorParallelSum, 1, 1, sumOverGroup},
  };
}

} // namespace rannc::runtime::kernels
