// Where a plan's layout changes BatchNorm's batch statistics (Note [batch
// statistics]); `show` and `check` print it.
//
// Note [batch statistics]
// A BatchNorm in training mode normalises over the samples it sees: on one
// device, the whole batch of B. A stage in m micro-batches on r replicas sees
// B / (m * r) at a time, so its normalisation, its gradients and its running
// statistics differ from single-device training (8-29% of the loss on a
// ResNet in 8 steps): the plan trains another model. rannc-exec does that
// today (each replica keeps its own statistics, as DDP with
// broadcast_buffers=False), so the tools say so for every such stage.
#include <algorithm>
#include <string>
#include <vector>

#include "planner/plan/plan.h"

namespace rannc::plan {
namespace {

/// True for a BatchNorm op that computes batch statistics (training mode).
bool trainingBatchNorm(const proto::Op &op) {
  auto attr = [&op](const std::string &name) -> const proto::Attribute * {
    for (const auto &a : op.attrs())
      if (a.name() == name) return &a;
    return nullptr;
  };
  if (op.type() == "BatchNormalization") { // ONNX: training_mode, or the running statistics as outputs
    const auto *t = attr("training_mode");
    return (t && t->i() != 0) || op.outputs_size() > 1;
  }
  // ATen: (input, weight, bias, running_mean, running_var, training, ...).
  if (op.type() == "aten::batch_norm" || op.type() == "aten::native_batch_norm" ||
      op.type() == "aten::_native_batch_norm_legit" || op.type() == "aten::_native_batch_norm_legit_functional" ||
      op.type() == "aten::instance_norm") {
    const auto *kind = attr("t5");
    const auto *v = attr("v5");
    return !(kind && kind->s() == "c:bool" && v && v->i() == 0);
  }
  return false;
}

} // namespace

std::vector<std::string> batchStatisticsNotes(const proto::Plan &plan) {
  std::vector<std::string> notes;
  const int64_t B = plan.global_batch_size(), m = std::max(1, plan.microbatches());
  for (const auto &s : plan.stages()) {
    const int r = stageReplicas(s);
    if (m * r == 1) continue;
    int count = 0;
    std::string first;
    for (int i = s.op_begin(); i < s.op_end() && i < plan.graph().ops_size(); ++i)
      if (trainingBatchNorm(plan.graph().ops(i))) {
        if (count++ == 0) first = plan.graph().ops(i).name();
      }
    if (count == 0) continue;
    notes.push_back("stage " + std::to_string(s.id()) + ": " + std::to_string(count) + " BatchNorm op(s) (first '" +
                    first + "') compute batch statistics over " + std::to_string(B / (m * r)) + " sample(s) at a time (" +
                    std::to_string(m) + " micro-batch(es) x " + std::to_string(r) + " replica(s)), not over the batch of " +
                    std::to_string(B) + " as one device does: training differs from single-device training "
                    "(plan with --microbatches 1 and one replica for that stage to keep it exact)");
  }
  return notes;
}

} // namespace rannc::plan
