#include "planner/driver/planner.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <set>

#include "planner/cost/flops.h"
#include "planner/cost/precision.h"
#include "planner/cost/profile_file.h"
#include "planner/import/fuse.h"
#include "planner/import/model_format.h"
#include "planner/ir/batch_norm.h"
#include "planner/ir/weight_gradients.h"
#include "planner/driver/lower.h"
#include "planner/driver/progress.h"
#include "planner/driver/tooling.h"
#include "planner/partition/coarsen.h"
#include "planner/partition/evaluate.h"
#include "planner/partition/solve.h"
#include "planner/plan/model_ref.h"
#include "planner/plan/sharding_record.h"
#include "planner/plan/plan.h"
#include "planner/plan/show.h"
#include "planner/support/files.h"

namespace rannc::planner {
namespace {

// Note [block count]
// The stage DP's states are (kmax+1)(K+1)(D/q+1) for K blocks, kmax <= K
// stage-count classes and stage widths in multiples of q (Note [device
// quantum] in planner/partition/dp.cpp), and it restricts q by itself to stay
// within its budget. Up to 256 devices 256 blocks keep q small (1 on BERT
// 103.6B, 1-2 on GPT 18.4B). Beyond, K shrinks so that the largest
// micro-batch counts stay near the budget at a quantum of one node,
// (K+1)^2 (D/per_node + 1) <= 2^23: 248 blocks on 1024 devices, 200 on 1536,
// 144 on 3072 (GPT 1008B has 128 layers). More blocks there buy little and
// cost a coarser quantum: on GPT 1008B (3072 devices, 8x memory to stand in
// for tensor parallelism) 200 blocks planned 2.7% faster steps than 96 but
// searched widths in multiples of 16, and took 3x as long. For the same
// reason the DP's state budget (DPOptions::max_states) drops from 2^25 to
// 2^23 beyond 256 devices: GPT 76.1B on 1024 devices took 26 s of CPU (2 GB)
// at every width for most micro-batch counts and a 4.4% stated gap, against
// 9 s at quanta of 2-4 and a 14% gap; tensor-parallel degrees multiply the
// work per state.
int blockCount(int devices, int per_node) {
  const double quanta = double(devices) / std::max(1, per_node) + 1;
  int k = 256;
  while (k > 32 && double(k + 1) * (k + 1) * quanta > double(int64_t{1} << 23)) k -= 8;
  return devices <= 256 ? 256 : k;
}

Expected<cost::CostTable> loadCosts(const ir::Graph &g, const std::vector<cost::Unit> &units,
                                    const cluster::ClusterSpec &cluster, const PlanOptions &opts,
                                    const std::string &sha, std::ostream &log) {
  std::string source = opts.profile;
  if (source.empty()) source = cluster.device.type == "cpu" && opts.measure ? "measure" : "analytic";
  auto sizes = costBatchSizes(opts);
  if (source == "analytic") return cost::analyticCosts(g, units, cluster.device, sizes);
  if (source == "measure") {
    if (!opts.measure) return Error{"--profile measure: this build cannot measure"};
    // A GPU cluster is measured on this machine's GPU, taken to be one of its devices.
    const cluster::DeviceKind device = cluster.device.type == "cpu" ? cluster::DeviceKind::Cpu : cluster::DeviceKind::Cuda;
    log << "rannc-plan: measuring " << units.size() << " units on " << cluster::deviceKindName(device)
        << " at micro-batch sizes";
    for (int64_t b : sizes) log << " " << b;
    log << "\n";
    auto table = opts.measure(g, units, sizes, device);
    if (!table && device == cluster::DeviceKind::Cuda)
      return Error{"--profile measure for " + cluster.device.name + ": " + table.error().message +
                   "; measure on a GPU machine with rannc-plan profile --device cuda and pass --profile FILE, or use "
                   "--profile analytic"};
    return table;
  }
  auto table = cost::readProfile(source, {sha, cluster.device.name, opts.threads, cost::precisionName(opts.precision)});
  if (!table) return table.error();
  bool same_units = table->units.size() == units.size();
  for (size_t i = 0; same_units && i < units.size(); ++i)
    same_units = table->units[i].op_begin == units[i].op_begin && table->units[i].op_end == units[i].op_end;
  if (!same_units) return Error{source + ": the profile's units differ from this rannc's; re-run rannc-plan profile"};
  return table;
}

} // namespace

std::vector<int64_t> costBatchSizes(const PlanOptions &opts) {
  // Powers of two up to the batch (the partitioner fits time and memory as
  // linear in the per-replica micro-batch), plus the pinned sizes exactly.
  std::set<int64_t> sizes;
  for (int64_t b = 1; b <= opts.batch_size && sizes.size() < 8; b *= 2) sizes.insert(b);
  if (opts.microbatches > 0) {
    const int64_t b = std::max<int64_t>(1, opts.batch_size / opts.microbatches);
    sizes.insert(b);
    for (int r : opts.replicas) sizes.insert((b + std::max(1, r) - 1) / std::max(1, r));
  }
  return {sizes.begin(), sizes.end()};
}

void fillStageEstimates(const partition::StageCost &c, double capacity_bytes, int64_t num_params, bool split_backward,
                        double rank_peak_bytes, proto::StageEstimates *e) {
  e->set_num_params(num_params);
  e->set_fwd_time_s(c.forwardSlot());
  e->set_bwd_time_s(c.backwardSlot());
  e->set_param_bytes(int64_t(c.memory.params));
  e->set_grad_bytes(int64_t(c.memory.grads));
  e->set_optimizer_bytes(int64_t(c.memory.optimizer));
  e->set_activation_bytes(int64_t(c.memory.activations));
  e->set_buffer_bytes(int64_t(c.memory.buffers));
  e->set_working_bytes(int64_t(c.memory.working));
  e->set_peak_memory_bytes(int64_t(c.memory.total()));
  e->set_memory_capacity_bytes(int64_t(capacity_bytes));
  e->set_allreduce_time_s(c.allreduce_s);
  e->set_recompute_saved_bytes(int64_t(c.recompute_saves_bytes));
  e->set_zero_saved_bytes(int64_t(c.zero_saves_bytes));
  e->set_lowp_weight_bytes(int64_t(c.memory.lowp_weights));
  e->set_recompute_stash_bytes(int64_t(c.memory.stash));
  // Only a split backward's plan says them (Note [zero bubble H1]): other
  // plans stay byte for byte what they were (tests/integration/golden_plans.py).
  if (split_backward) {
    e->set_weight_queue_bytes(int64_t(c.memory.weight_queue));
    e->set_weight_time_s(c.weightSlot());
  }
  if (rank_peak_bytes > 0) e->set_rank_peak_memory_bytes(int64_t(rank_peak_bytes)); // Note [a rank's chunks' memory]
}

void fillModelFlops(const ir::Graph &g, proto::Estimates *e) {
  const cost::GraphFlops f = cost::graphFlops(g, 1);
  e->set_forward_flops_per_sample(f.fwd);
  e->set_training_flops_per_sample(f.fwd + f.bwd);
}

Expected<proto::Plan> planGraph(const ir::Graph &g, const cost::CostTable &costs, const cluster::ClusterSpec &cluster,
                                const PlanOptions &opts, const std::string &model_sha256, std::ostream *log,
                                const sharding::Analysis *analysis) {
  if (opts.batch_size < 1) return Error{"--batch-size must be at least 1"};
  if (opts.microbatches < 0) return Error{"--microbatches must be at least 1"};
  if (opts.microbatches > 0 && opts.batch_size % opts.microbatches != 0)
    return Error{"--microbatches " + std::to_string(opts.microbatches) + " does not divide --batch-size " +
                 std::to_string(opts.batch_size)};
  if (costs.units.empty()) return Error{"the model has no ops"};
  auto strategy = partition::parseStrategy(opts.strategy);
  if (!strategy) return strategy.error();
  auto units = lowerToProblem(g, costs, cluster, opts, analysis);
  if (!units) return units.error();
  // Note [block count]: per-unit blocks up to a few hundred keep the DP exact
  // and fast; beyond that, coarsen (docs/partitioner.md measures the
  // trade-off), fewer blocks on many devices.
  partition::CoarsenOptions co;
  co.max_blocks = blockCount(cluster.worldSize(), cluster.devices_per_node);
  co.samples = std::max(1.0, double(opts.batch_size) / cluster.worldSize());
  auto blocks = partition::coarsen(*units, co);
  if (!blocks) return blocks.error();
  partition::DPOptions dp;
  if (cluster.worldSize() > 256) dp.max_states = int64_t{1} << 23; // Note [block count]
  if (log) dp.progress = [log](const std::string &line) { *log << "rannc-plan: " << line << "\n" << std::flush; };
  dp.doing = opts.doing; // Note [progress lines]
  if (opts.doing)
    opts.doing("searching " + std::to_string(blocks->problem.numBlocks()) + " blocks on " +
               std::to_string(cluster.worldSize()) + " devices");
  auto solved = *strategy == partition::Strategy::Auto ? partition::solveDP(blocks->problem, dp)
                                                       : partition::solve(blocks->problem, *strategy);
  if (!solved) return solved.error();
  // Note [automatic schedule] in planner/partition/dp.cpp: a split backward
  // the executor could not run (a stage whose parameter two ops read, which
  // `check` refuses) is searched again without the split schedules.
  if (!opts.schedule && pipeline::splitsBackward(solved->solution.schedule)) {
    const partition::Solution chosen = partition::expandToUnits(*blocks, solved->solution);
    for (const partition::Stage &stage : chosen.stages) {
      std::vector<ir::NodeId> nodes;
      for (int n = costs.units[stage.block_begin].op_begin; n < costs.units[stage.block_end - 1].op_end; ++n)
        nodes.push_back(n);
      const ir::StageWeightRoots roots = ir::stageWeightRoots(g, nodes);
      if (roots.conflict.empty()) continue;
      blocks->problem.no_split_backward = "its plan's stages would split a backward the executor runs op by op, but " +
                                          roots.conflict + " (tied weights in one stage)";
      solved = partition::solveDP(blocks->problem, dp);
      if (!solved) return solved.error();
      break;
    }
  }
  const partition::SolveStats &st = solved->stats;
  // The DP's loss against every stage width, when it had to restrict them (Note [device quantum]).
  const double gap = st.lower_bound_s > 0 ? solved->step_time_s / st.lower_bound_s - 1 : 0;
  std::string bound;
  if (gap > 1e-9) {
    char text[160];
    std::snprintf(text, sizeof text, ", stage widths in multiples of %d: within %.2f%% of any plan over these blocks",
                  st.device_quantum, 100 * gap);
    bound = text;
  }
  if (log) {
    *log << "rannc-plan: searched " << blocks->problem.numBlocks() << " blocks on " << cluster.worldSize()
         << " devices in " << st.seconds << " s (" << st.microbatch_counts << " micro-batch counts, "
         << st.microbatch_counts_pruned << " skipped by their bound, " << st.allreduce_thresholds << " DP passes, "
         << st.states << " states, " << st.points << " front points" << bound << ")\n";
    for (const partition::ScheduleTried &t : st.schedules) { // Note [automatic schedule] in planner/partition/dp.cpp
      *log << "rannc-plan: schedule " << partition::scheduleName(t.schedule)
           << (t.virtual_stages > 1 ? " v=" + std::to_string(t.virtual_stages) : std::string()) << ": "
           << partition::outcomeName(t.outcome);
      if (t.step_time_s > 0) *log << " (" << t.step_time_s << " s)";
      if (!t.why.empty()) *log << ": " << t.why;
      *log << "\n";
    }
  }
  const partition::Solution plan_units = partition::expandToUnits(*blocks, solved->solution);
  const partition::Evaluation ev = partition::evaluate(*units, plan_units);
  if (!ev.feasible()) {
    std::string msg = "the chosen plan does not fit:";
    for (const auto &v : ev.violations) msg += "\n  " + v;
    return Error{msg};
  }

  proto::Plan plan;
  plan.mutable_model()->set_path(opts.model);
  plan.mutable_model()->set_sha256(model_sha256);
  plan.mutable_model()->set_format(plan::modelFormat(opts.model));
  plan.set_global_batch_size(opts.batch_size);
  plan.set_microbatches(plan_units.microbatches);
  plan.set_schedule(plan::scheduleToProto(plan_units.schedule));
  if (plan_units.virtual_stages > 1) plan.set_virtual_stages(plan_units.virtual_stages); // Note [interleaved 1F1B]
  // Note [automatic schedule] in planner/partition/dp.cpp: 1F1B plans stay as they were.
  if (plan_units.schedule != partition::Schedule::OneFOneB)
    for (const partition::ScheduleTried &t : st.schedules) {
      proto::ScheduleConsidered *sc = plan.add_schedules_considered();
      sc->set_schedule(plan::scheduleToProto(t.schedule));
      if (t.virtual_stages > 1) sc->set_virtual_stages(t.virtual_stages);
      sc->set_outcome(partition::outcomeName(t.outcome));
      sc->set_step_time_s(t.step_time_s);
      sc->set_why(t.why);
    }
  plan.set_planner(std::string(partition::strategyName(*strategy)) + " (" + costs.source + " costs" + bound + ")");
  if (opts.precision != cost::Precision::FP32) // fp32 plans stay as before
    plan.set_precision(cost::precisionName(opts.precision));
  if (opts.exact_batchnorm && ir::hasBatchStatistics(g)) plan.set_batchnorm("exact"); // Note [batch statistics]
  *plan.mutable_cluster() = plan::clusterToProto(cluster);
  double optimizer = 0;
  for (int s = 0; s < plan_units.numStages(); ++s) {
    const partition::Stage &stage = plan_units.stages[s];
    const partition::StageCost &c = ev.stages[s];
    proto::Stage *st = plan.add_stages();
    st->set_id(s);
    for (int j = 0; j < stage.devices(); ++j) st->add_ranks(plan_units.firstRank(s) + j);
    if (stage.tensor_parallel > 1) st->set_tensor_parallel(stage.tensor_parallel);
    st->set_op_begin(costs.units[stage.block_begin].op_begin);
    st->set_op_end(costs.units[stage.block_end - 1].op_end);
    st->set_recompute(stage.recompute);
    st->set_zero(c.zero ? 1 : 0);
    const int64_t num_params = rangeParameterCount(g, st->op_begin(), st->op_end());
    fillStageEstimates(c, ev.capacity_bytes, num_params, pipeline::splitsBackward(plan_units.schedule),
                       ev.rank_peak_memory_bytes.empty()
                           ? 0.0
                           : ev.rank_peak_memory_bytes[size_t(s) % ev.rank_peak_memory_bytes.size()],
                       st->mutable_estimates());
    // A sharded stage updates only its replica's share of the parameters, a
    // tensor-parallel one its device's shards.
    optimizer = std::max(optimizer, double(num_params) * c.param_share / (c.zero ? c.replicas : 1) *
                                        costs.optimizer_s_per_param);
  }
  // The partitioner's step (pipeline, transfers, all-reduce) plus the slowest
  // stage's optimizer step, which every stage takes after the all-reduce.
  plan.mutable_estimates()->set_step_time_s(ev.step_time_s + optimizer);
  plan.mutable_estimates()->set_optimizer(cost::optimizerName(opts.optimizer));
  fillModelFlops(g, plan.mutable_estimates());
  *plan.mutable_graph() = plan::graphToProto(g);
  const bool uses_tp = std::any_of(plan_units.stages.begin(), plan_units.stages.end(),
                                   [](const partition::Stage &s) { return s.tensor_parallel > 1; });
  if (uses_tp && analysis) plan::recordSharding(g, *analysis, *plan.mutable_graph()); // plans without TP stay as they were
  plan.set_format_version(plan::requiredFormatVersion(plan)); // Note [plan format versions]
  return plan;
}

Expected<cluster::ClusterSpec> clusterFor(const PlanOptions &opts) {
  if (opts.cluster_file.empty()) return cluster::clusterFromPreset(opts.device_type, opts.gpus, opts.device_memory);
  auto c = cluster::loadClusterFile(opts.cluster_file);
  if (c.ok() && opts.device_memory) c->device.memory_bytes = *opts.device_memory;
  return c;
}

namespace {
/// The graph as the planner works on it (weight-only ops sunk to their
/// consumers), its units, and the model file's hash.
struct Imported {
  ir::Graph graph;
  std::vector<cost::Unit> units;
  std::string sha;
  proto::ModelRef ref;
};

/// A model by its kind: a TorchScript archive, a torch.export program or ONNX
/// (its unknown shapes completed where the front ends can, Note [flop counts]
/// and the executor's batch axes need them).
Expected<ir::Graph> importAny(const std::string &model, const std::string &data_dir, const FrontEnds &front_ends,
                              std::ostream &log, import::ImportAudit *audit = nullptr,
                              import::FusionReport *fusion = nullptr) {
  import::ImportAudit own;
  auto graph = import::importModel(model, data_dir, &front_ends.torch, audit ? *audit : own);
  if (!audit) import::logAudit(own, "rannc-plan: " + model + ": ", log);
  if (!graph || import::modelFormat(model) != import::ModelFormat::Onnx) return graph;
  if (front_ends.onnx_shapes) {
    auto completed = front_ends.onnx_shapes(*graph, model);
    if (!completed)
      log << "rannc-plan: warning: " << model << ": " << completed.error().message
          << "; they count as empty and contiguous in the batch\n";
    else if (*completed > 0)
      log << "rannc-plan: " << model << ": ran the graph for the shapes of " << *completed
          << " values ONNX's shape inference left unknown\n";
  }
  // After the shapes: the legacy exporter computes attention's scale from the head size.
  if (front_ends.fuse) { // Note [pattern fusion]
    const import::FusionReport report = import::fusePatterns(*graph);
    if (report.total() > 0) {
      log << "rannc-plan: " << model << ": ";
      import::printFusion(report, log, false);
    }
    if (fusion) *fusion = report;
  }
  return graph;
}

/// Merges the units between which a value the executor cannot split would
/// cross: floating-point values whose samples are mixed along their batch
/// axis (Value::batch_blocks 0, Note [batch layout]). The partitioner then
/// never cuts them; `check` refuses such a cut in a hand edit between stages
/// of different replica counts.
std::vector<cost::Unit> glueUnsplittable(const ir::Graph &g, std::vector<cost::Unit> units) {
  std::vector<int> unit_of(g.nodes.size(), 0);
  for (int u = 0; u < int(units.size()); ++u)
    for (int n = units[u].op_begin; n < units[u].op_end; ++n) unit_of[n] = u;
  std::vector<char> glued(units.size() + 1, 0); // glued[i]: no cut before unit i
  const auto users = g.users();
  for (ir::ValueId v = 0; v < ir::ValueId(g.values.size()); ++v) {
    const ir::Value &val = g.values[v];
    if (val.kind != ir::ValueKind::Intermediate || val.batch_blocks != 0 || !ir::isFloating(val.dtype)) continue;
    for (ir::NodeId reader : users[v])
      for (int i = unit_of[val.producer] + 1; i <= unit_of[reader]; ++i) glued[i] = 1;
  }
  std::vector<cost::Unit> out;
  for (int u = 0; u < int(units.size()); ++u) {
    if (glued[u] && !out.empty()) out.back().op_end = units[u].op_end;
    else out.push_back(units[u]);
  }
  return out;
}

Expected<Imported> importForPlanning(const std::string &model, const std::string &data_dir,
                                     const FrontEnds &front_ends, std::ostream &log) {
  auto graph = importAny(model, data_dir, front_ends, log);
  if (!graph) return graph.error();
  auto ref = plan::describeModel(model, *graph, data_dir.empty() ? "model" : "--data " + data_dir);
  if (!ref) return ref.error();
  ir::sinkParameterOps(*graph);
  auto units = glueUnsplittable(*graph, cost::formUnits(*graph));
  std::string sha = ref->sha256();
  return Imported{std::move(*graph), std::move(units), std::move(sha), std::move(*ref)};
}
} // namespace

Expected<proto::Plan> makePlan(const PlanOptions &opts, std::ostream &log) {
  auto cluster = clusterFor(opts);
  if (!cluster) return cluster.error();
  if (opts.doing) opts.doing("importing " + opts.model); // Note [progress lines]
  auto imported = importForPlanning(opts.model, opts.data_dir, opts.front_ends, log);
  if (!imported) return imported.error();
  auto &graph = imported->graph;
  auto &units = imported->units;
  auto &sha = imported->sha;
  log << "rannc-plan: " << opts.model << ": " << graph.nodes.size() << " ops in " << units.size() << " units, "
      << graph.parameters.size() << " parameters, opset " << graph.opset << "\n";
  cost::assignComputeDTypes(graph, opts.precision, cluster->device.type); // Note [autocast dtypes]
  if (opts.doing) opts.doing("costing " + std::to_string(units.size()) + " units");
  auto costs = loadCosts(graph, units, *cluster, opts, sha, log);
  if (!costs) return costs.error();
  // Tensor parallelism where the model's ops allow it (Note [tensor parallel lowering]).
  if (opts.doing) opts.doing("analysing tensor parallelism");
  auto analysis = sharding::analyze(graph);
  if (!analysis) {
    for (int t : opts.tensor_parallel)
      if (t > 1) return Error{"--tensor-parallel " + std::to_string(t) + ": " + analysis.error().message};
    log << "rannc-plan: warning: no tensor parallelism: " << analysis.error().message << "\n";
  }
  auto plan = planGraph(graph, *costs, *cluster, opts, sha, &log, analysis ? &*analysis : nullptr);
  if (!plan) return plan.error();
  *plan->mutable_model() = imported->ref;
  plan->mutable_model()->set_path(plan::recordedModelPath(opts.model, opts.output)); // Note [plan model path]
  for (const auto &s : plan->stages())
    if (s.estimates().peak_memory_bytes() > s.estimates().memory_capacity_bytes())
      log << "rannc-plan: warning: stage " << s.id() << " is estimated to need " << s.estimates().peak_memory_bytes()
          << " bytes, more than the device's " << s.estimates().memory_capacity_bytes() << "\n";
  return plan;
}

Status runPlan(const PlanOptions &given, std::ostream &out, std::ostream &log) {
  if (given.output.empty()) return Error{"no output file: pass -o PLAN (.pb, .pbtxt or .json)"};
  Heartbeat beat(&log, given.progress_interval_s, "rannc-plan: "); // Note [progress lines]
  PlanOptions opts = given;
  if (given.progress_interval_s > 0)
    opts.doing = [&beat, also = given.doing](const std::string &what) {
      beat.doing(what);
      if (also) also(what);
    };
  auto plan = makePlan(opts, log);
  if (!plan) return plan.error();
  // A plan rannc-plan writes, check and rannc-exec read back: refuse to write
  // one they would refuse (an importer's duplicate value name, say).
  std::vector<std::string> problems = plan::structuralProblems(*plan);
  if (auto graph = plan::graphFromProto(plan->graph()); !graph) problems.push_back(graph.error().message);
  if (!problems.empty()) {
    std::string list;
    for (const auto &p : problems) list += "\n  " + p;
    return Error{"internal error: the plan for " + opts.model + " would not read back, so it was not written:" + list};
  }
  if (Status st = plan::writePlan(*plan, opts.output); !st) return st;
  log << "rannc-plan: wrote " << opts.output << " (" << plan->stages_size() << " stage(s) on "
      << plan::worldSize(*plan) << " rank(s), " << plan->microbatches() << " micro-batch(es), "
      << plan::scheduleName(plan->schedule()) << ", predicted step " << plan->estimates().step_time_s() * 1e3
      << " ms)\n";
  const int devices = plan::clusterFromProto(plan->cluster()).worldSize();
  if (plan::worldSize(*plan) < devices)
    log << "rannc-plan: the fastest plan uses " << plan::worldSize(*plan) << " of the " << devices
        << " devices: run it with mpirun -np " << plan::worldSize(*plan) << "\n";
  return Status::success();
}

Status runProfile(const ProfileCommandOptions &opts, const MeasureFn &measure, std::ostream &log) {
  if (opts.output.empty()) return Error{"no output file: pass -o PROFILE"};
  std::string device_type = opts.device_type;
  if (opts.device == cluster::DeviceKind::Cpu) {
    if (device_type.empty()) device_type = "cpu";
    if (device_type != "cpu")
      return Error{"--device cpu measures this machine's CPU; '" + device_type +
                   "' is not here (measure a GPU with --device cuda)"};
  } else if (device_type.empty() || device_type == "cpu") {
    return Error{"--device cuda: name the device that plans made from this profile are for with --device-type "
                 "NAME (a preset such as h100-80g, or a cluster file's device name)"};
  }
  auto imported = importForPlanning(opts.model, opts.data_dir, opts.front_ends, log);
  if (!imported) return imported.error();
  auto &graph = imported->graph;
  auto &units = imported->units;
  auto &sha = imported->sha;
  log << "rannc-plan: profiling " << units.size() << " units of " << opts.model << "\n";
  auto table = measure(graph, units, opts.batch_sizes, opts.device);
  if (!table) return table.error();
  const cost::ProfileKey key{sha, device_type, opts.threads, cost::precisionName(opts.precision)};
  if (Status st = cost::writeProfile(*table, key, opts.output); !st) return st;
  log << "rannc-plan: wrote " << opts.output
      << (table->device_name.empty() ? "" : " (measured on " + table->device_name + ")") << "\n";
  return Status::success();
}

Status runShow(const std::string &plan_path, bool json, std::ostream &out) {
  auto plan = plan::readPlan(plan_path);
  if (!plan) return plan.error();
  if (json) plan::printPlanJson(*plan, out);
  else plan::printPlanTable(*plan, out);
  return Status::success();
}

Status runImport(const std::string &model_path, const std::string &data_dir, const FrontEnds &front_ends,
                 std::ostream &out, std::ostream &log, int tensor_parallel) {
  import::ImportAudit audit;
  import::FusionReport fusion;
  auto graph = importAny(model_path, data_dir, front_ends, log, &audit, &fusion);
  if (!graph) return graph.error();
  graph->print(out);
  import::printAudit(audit, out);
  if (import::modelFormat(model_path) == import::ModelFormat::Onnx)
    front_ends.fuse ? import::printFusion(fusion, out) : void(out << "fusion: off (--no-fuse)\n");
  return tensor_parallel > 0 ? printTensorParallel(*graph, tensor_parallel, out) : Status::success();
}

} // namespace rannc::planner
