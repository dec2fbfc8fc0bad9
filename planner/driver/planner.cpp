#include "planner/driver/planner.h"

#include <fstream>
#include <set>

#include "planner/cost/cost.h"
#include "planner/import/onnx_import.h"
#include "planner/partition/linear.h"
#include "planner/plan/plan.h"
#include "planner/plan/show.h"
#include "planner/support/files.h"
#include "planner/support/sha256.h"

namespace rannc::planner {
namespace {

Expected<std::string> fileSha256(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Error{path + ": cannot open"};
  return sha256Hex(in);
}

/// Note [stage memory model]
/// The skeleton's estimate of a stage's memory: parameters, their gradients,
/// optimizer state (by optimizer), the activations every op of the stage
/// writes for each micro-batch (GPipe keeps all micro-batches alive until
/// backward), and buffers for the activations crossing its boundaries (one
/// send and one receive copy). The partitioner work refines this.
void estimateStage(const ir::Graph &g, const std::vector<cost::OpCost> &costs, int begin, int end,
                   const PlanOptions &opts, const cluster::ClusterSpec &cluster, int64_t micro_batch,
                   proto::StageEstimates *e) {
  std::set<ir::ValueId> params;
  int64_t act = 0, cross = 0;
  double fwd = 0, bwd = 0;
  for (int i = begin; i < end; ++i) {
    const ir::Node &n = g.nodes[i];
    for (ir::ValueId in : n.inputs) {
      if (in == ir::kNoValue) continue;
      const ir::Value &v = g.values[in];
      if (v.kind == ir::ValueKind::Parameter) params.insert(in);
      if (v.kind == ir::ValueKind::Intermediate && (v.producer < begin || v.producer >= end) && v.shape_known)
        cross += ir::numelAt(v.shape, micro_batch) * ir::dtypeSize(v.dtype);
    }
    act += costs[i].output_bytes;
    fwd += costs[i].fwd_time_s;
    bwd += costs[i].bwd_time_s;
  }
  int64_t param_bytes = 0, num_params = 0;
  for (ir::ValueId p : params) {
    int64_t n = ir::numelAt(g.values[p].shape, micro_batch);
    num_params += n;
    param_bytes += n * ir::dtypeSize(g.values[p].dtype);
  }
  e->set_num_params(num_params);
  e->set_param_bytes(param_bytes);
  e->set_grad_bytes(param_bytes);
  e->set_optimizer_bytes(static_cast<int64_t>(cost::optimizerStateFactor(opts.optimizer) * double(param_bytes)));
  e->set_activation_bytes(act * opts.microbatches);
  e->set_buffer_bytes(2 * cross);
  e->set_peak_memory_bytes(e->param_bytes() + e->grad_bytes() + e->optimizer_bytes() + e->activation_bytes() +
                           e->buffer_bytes());
  e->set_memory_capacity_bytes(cluster.device.memory_bytes);
  e->set_fwd_time_s(fwd);
  e->set_bwd_time_s(bwd);
}

} // namespace

Expected<proto::Plan> planGraph(const ir::Graph &g, const cluster::ClusterSpec &cluster, const PlanOptions &opts,
                                const std::string &model_sha256) {
  if (opts.batch_size < 1) return Error{"--batch-size must be at least 1"};
  if (opts.microbatches < 1) return Error{"--microbatches must be at least 1"};
  if (opts.batch_size % opts.microbatches != 0)
    return Error{"--microbatches " + std::to_string(opts.microbatches) + " does not divide --batch-size " +
                 std::to_string(opts.batch_size)};
  const int num_stages = cluster.worldSize();
  const int64_t micro_batch = opts.batch_size / opts.microbatches;
  auto costs = cost::estimateOpCosts(g, cluster.device, micro_batch);
  // Cut only where it pays: an op computed from weights alone stays glued to
  // the op after it (its consumer, after sinkParameterOps), so no stage ever
  // ships a transposed weight to the next. The splitter sees the glued runs.
  const std::vector<bool> glued = ir::parameterOnlyNodes(g);
  std::vector<double> weights;
  std::vector<int> run_start;
  for (size_t i = 0; i < costs.size(); ++i) {
    if (i == 0 || !glued[i - 1]) {
      run_start.push_back(static_cast<int>(i));
      weights.push_back(0);
    }
    weights.back() += costs[i].fwd_time_s + costs[i].bwd_time_s;
  }
  auto run_bounds = partition::balancedSplit(weights, num_stages);
  if (!run_bounds)
    return Error{"cannot split the model into " + std::to_string(num_stages) + " stages: " + run_bounds.error().message};
  std::vector<int> bounds;
  for (int b : *run_bounds) bounds.push_back(b < static_cast<int>(run_start.size()) ? run_start[b] : static_cast<int>(costs.size()));

  proto::Plan plan;
  plan.set_format_version(plan::kFormatVersion);
  plan.mutable_model()->set_path(opts.model);
  plan.mutable_model()->set_sha256(model_sha256);
  plan.mutable_model()->set_format("onnx");
  plan.set_global_batch_size(opts.batch_size);
  plan.set_microbatches(opts.microbatches);
  plan.set_schedule(proto::GPIPE);
  plan.set_planner("balanced-ops");
  *plan.mutable_cluster() = plan::clusterToProto(cluster);
  double bottleneck = 0, total = 0;
  for (int s = 0; s < num_stages; ++s) {
    proto::Stage *st = plan.add_stages();
    st->set_id(s);
    st->add_ranks(s);
    st->set_op_begin(bounds[s]);
    st->set_op_end(bounds[s + 1]);
    estimateStage(g, costs, st->op_begin(), st->op_end(), opts, cluster, micro_batch, st->mutable_estimates());
    double t = st->estimates().fwd_time_s() + st->estimates().bwd_time_s();
    bottleneck = std::max(bottleneck, t);
    total += t;
  }
  // GPipe: every micro-batch passes every stage once; after the fill the
  // bottleneck stage sets the pace for the remaining micro-batches.
  plan.mutable_estimates()->set_step_time_s(total + (opts.microbatches - 1) * bottleneck);
  plan.mutable_estimates()->set_optimizer(opts.optimizer);
  *plan.mutable_graph() = plan::graphToProto(g);
  return plan;
}

Expected<proto::Plan> makePlan(const PlanOptions &opts, std::ostream &log) {
  auto cluster = cluster::clusterFromPreset(opts.device_type, opts.gpus, opts.device_memory);
  if (!cluster) return cluster.error();
  auto graph = import::importModel(opts.model);
  if (!graph) return graph.error();
  auto sha = fileSha256(opts.model);
  if (!sha) return sha.error();
  ir::sinkParameterOps(*graph);
  log << "rannc-plan: " << opts.model << ": " << graph->nodes.size() << " ops, " << graph->parameters.size()
      << " parameters, opset " << graph->opset << "\n";
  auto plan = planGraph(*graph, *cluster, opts, *sha);
  if (!plan) return plan.error();
  for (const auto &s : plan->stages())
    if (s.estimates().peak_memory_bytes() > s.estimates().memory_capacity_bytes())
      log << "rannc-plan: warning: stage " << s.id() << " is estimated to need " << s.estimates().peak_memory_bytes()
          << " bytes, more than the device's " << s.estimates().memory_capacity_bytes() << "\n";
  return plan;
}

Status runPlan(const PlanOptions &opts, std::ostream &out, std::ostream &log) {
  if (opts.output.empty()) return Error{"no output file: pass -o PLAN (.pb, .pbtxt or .json)"};
  auto plan = makePlan(opts, log);
  if (!plan) return plan.error();
  if (Status st = plan::writePlan(*plan, opts.output); !st) return st;
  log << "rannc-plan: wrote " << opts.output << " (" << plan->stages_size() << " stages, predicted step "
      << plan->estimates().step_time_s() * 1e3 << " ms)\n";
  return Status::success();
}

Status runShow(const std::string &plan_path, bool json, std::ostream &out) {
  auto plan = plan::readPlan(plan_path);
  if (!plan) return plan.error();
  if (json) plan::printPlanJson(*plan, out);
  else plan::printPlanTable(*plan, out);
  return Status::success();
}

Status runImport(const std::string &model_path, std::ostream &out) {
  auto graph = import::importModel(model_path);
  if (!graph) return graph.error();
  graph->print(out);
  return Status::success();
}

} // namespace rannc::planner
