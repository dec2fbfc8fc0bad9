// Where a plan's layout changes BatchNorm's batch statistics (Note [batch
// statistics]); `show` and `check` print it.
//
// Note [batch statistics]
// A BatchNorm in training mode normalises over the samples it sees: on one
// device, the whole batch of B. A stage in m micro-batches on r replicas sees
// B / (m * r) at a time, so its normalisation, its gradients and its running
// statistics differ from single-device training (8-29% of the loss on a
// ResNet in 8 steps): the plan trains another model. A plan chooses
// (`rannc-plan --batchnorm local|exact`, the plan's `batchnorm` field):
//  - local (the default): each micro-batch on each replica normalises over
//    its own samples, as DDP without SyncBatchNorm and GPipe's micro-batches
//    do; each replica keeps its own running statistics (DDP with
//    broadcast_buffers=False). The planner is free to choose any layout, and
//    `show` and `check` name every stage where this differs from one device.
//  - exact: statistics as on one device. A model whose graph computes batch
//    statistics is planned in one micro-batch (the DP searches only that
//    count): statistics shared across micro-batches would need every
//    micro-batch's forward of a layer before any could go on, which is no
//    pipeline. Across a stage's replicas the executor sums each channel's
//    sum and sum of squared deviations, and the sample count, as
//    SyncBatchNorm does (executor/runtime/kernels/sync_batch_norm.cpp), so
//    every replica normalises and updates its running statistics with the
//    whole batch's. The DP charges those small all-reduces to every
//    replicated stage that holds a BatchNorm (Note [partition cost model]).
#include <algorithm>
#include <string>
#include <vector>

#include "planner/ir/batch_norm.h"
#include "planner/plan/plan.h"

namespace rannc::plan {
namespace {

/// True for an op that computes batch statistics (ir::computesBatchStatistics
/// on the attributes that decide it).
bool trainingBatchNorm(const proto::Op &op) {
  ir::Node n;
  n.op_type = op.type();
  n.domain = op.domain();
  n.outputs.assign(size_t(op.outputs_size()), ir::kNoValue);
  for (const auto &a : op.attrs()) {
    if (a.name() == "training_mode" || a.name() == "v5") n.attrs[a.name()] = a.i();
    if (a.name() == "t5") n.attrs[a.name()] = a.s();
  }
  return ir::computesBatchStatistics(n);
}

/// The stage's first op that computes batch statistics, and how many do.
std::pair<std::string, int> batchNormOps(const proto::Plan &plan, const proto::Stage &s) {
  std::pair<std::string, int> found{"", 0};
  for (int i = s.op_begin(); i < s.op_end() && i < plan.graph().ops_size(); ++i)
    if (trainingBatchNorm(plan.graph().ops(i)) && found.second++ == 0) found.first = plan.graph().ops(i).name();
  return found;
}

} // namespace

std::vector<std::string> batchStatisticsNotes(const proto::Plan &plan) {
  std::vector<std::string> notes;
  const int64_t B = plan.global_batch_size(), m = std::max(1, plan.microbatches());
  const bool exact = plan.batchnorm() == "exact";
  for (const auto &s : plan.stages()) {
    const int r = exact ? 1 : stageReplicas(s); // exact: summed over the replicas
    if (m * r == 1) continue;
    const auto [first, count] = batchNormOps(plan, s);
    if (count == 0) continue;
    notes.push_back("stage " + std::to_string(s.id()) + ": " + std::to_string(count) + " BatchNorm op(s) (first '" +
                    first + "') compute batch statistics over " + std::to_string(B / (m * r)) + " sample(s) at a time (" +
                    std::to_string(m) + " micro-batch(es) x " + std::to_string(stageReplicas(s)) +
                    " replica(s)" + (exact ? ", replicas synchronised" : "") + "), not over the batch of " +
                    std::to_string(B) + " as one device does: training differs from single-device training "
                    "(plan with --batchnorm exact to keep it exact)");
  }
  return notes;
}

std::vector<std::string> batchStatisticsProblems(const proto::Plan &plan) {
  if (plan.batchnorm().empty()) return {};
  if (plan.batchnorm() != "exact") return {"batchnorm: '" + plan.batchnorm() + "' is not exact (or absent: local)"};
  if (plan.microbatches() <= 1) return {};
  for (const auto &s : plan.stages())
    if (const auto [first, count] = batchNormOps(plan, s); count > 0)
      return {"batchnorm: exact needs microbatches: 1, the plan has " + std::to_string(plan.microbatches()) +
              " and stage " + std::to_string(s.id()) + " runs BatchNorm '" + first +
              "' (each micro-batch would normalise over its own samples)"};
  return {};
}

} // namespace rannc::plan
