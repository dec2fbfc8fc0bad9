#include "planner/driver/tooling.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iomanip>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

#include "planner/driver/lower.h"
#include "planner/driver/planner.h"
#include "planner/partition/simulate.h"
#include "planner/plan/diff.h"
#include "planner/plan/dot.h"
#include "planner/plan/plan.h"
#include "planner/plan/show.h"
#include "planner/plan/trace.h"
#include "planner/support/files.h"
#include "planner/plan/model_ref.h"
#include "planner/plan/sharding_record.h"
#include "planner/sharding/sharding.h"

namespace rannc::planner {
namespace {

using plan::formatFixed;

/// "(plan said X, +Y%)", "(unchanged)" or "(plan said 0)".
std::string versus(double now, double before, const std::string &before_text) {
  if (before == 0 && now != 0) return "(plan said 0)";
  if (std::fabs(now - before) <= 1e-9 * std::max(std::fabs(now), std::fabs(before))) return "(unchanged)";
  std::ostringstream os;
  os << "(plan said " << before_text << ", " << std::showpos << std::fixed << std::setprecision(1)
     << (now - before) / before * 100 << "%)";
  return os.str();
}

std::string timeVersus(double now, double before) {
  return plan::timeText(now) + " " + versus(now, before, plan::timeText(before));
}

std::string bytesVersus(double now, double before) {
  return plan::bytesText(now) + " " + versus(now, before, plan::bytesText(before));
}

/// Stage ranges consecutive from op 0 to the last op, each non-empty.
bool rangesSound(const proto::Plan &plan) {
  int expect = 0;
  for (const auto &s : plan.stages()) {
    if (s.op_begin() != expect || s.op_end() <= s.op_begin()) return false;
    expect = s.op_end();
  }
  return plan.stages_size() > 0 && expect == plan.graph().ops_size();
}

/// The margin the plan was made with: 1 - (capacity + runtime reserve) /
/// device memory, rounded (the plan stores the capacity as whole bytes).
double planMargin(const proto::Plan &plan) {
  const double memory = double(plan.cluster().device().memory_bytes());
  if (plan.stages_size() == 0 || memory <= 0 || plan.stages(0).estimates().memory_capacity_bytes() <= 0) return 0.1;
  const double margin = 1 - double(plan.stages(0).estimates().memory_capacity_bytes() +
                                   plan.cluster().device().runtime_reserve_bytes()) /
                                memory;
  return std::clamp(std::round(margin * 1e6) / 1e6, 0.0, 0.95);
}

Expected<cluster::ClusterSpec> clusterOf(const proto::Plan &plan, const ReestimateOptions &opts) {
  cluster::ClusterSpec c;
  if (opts.cluster_file.empty()) {
    c = plan::clusterFromProto(plan.cluster());
  } else {
    auto loaded = cluster::loadClusterFile(opts.cluster_file);
    if (!loaded) return loaded.error();
    c = *loaded;
  }
  if (opts.device_memory) c.device.memory_bytes = *opts.device_memory;
  return c;
}

/// "1 stage", "2 stages".
std::string counted(int64_t n, const std::string &noun) {
  return std::to_string(n) + " " + noun + (n == 1 ? "" : noun.back() == 'h' ? "es" : "s");
}

std::string problemList(const std::vector<std::string> &problems) {
  std::string s;
  for (const auto &p : problems) s += "\n  " + p;
  return s;
}

} // namespace

Expected<proto::Plan> readSoundPlan(const std::string &path) {
  auto plan = plan::readPlan(path);
  if (!plan) return plan.error();
  auto problems = plan::structuralProblems(*plan);
  if (!problems.empty())
    return Error{path + ": invalid plan (rannc-plan check " + path + " lists the problems):" + problemList(problems)};
  return plan;
}

std::vector<cost::Unit> unitsSplitAt(const ir::Graph &g, const std::vector<int> &boundaries) {
  std::set<int> cuts(boundaries.begin(), boundaries.end());
  std::vector<cost::Unit> out;
  for (const cost::Unit &u : cost::formUnits(g)) {
    int begin = u.op_begin;
    for (auto it = cuts.upper_bound(u.op_begin); it != cuts.end() && *it < u.op_end; ++it) {
      out.push_back({begin, *it});
      begin = *it;
    }
    out.push_back({begin, u.op_end});
  }
  return out;
}

// Note [re-estimating a plan]
// `check`, `simulate` and `check --update` re-run the planner's cost model on
// the plan as it is, possibly after a hand edit: the plan's graph (already in
// the planner's op order, so its op indices are the stage ranges' indices) is
// cut into the planner's units, further split at every stage boundary, costed
// analytically at the micro-batch sizes the plan runs (costBatchSizes with the
// plan's M and replica counts, as planning with those pinned would), lowered
// to a Problem exactly as planning does, and the plan's stages evaluated as a
// Solution. For an unedited plan made with analytic costs this reproduces the
// plan's estimates; after an edit it is what the planner would have predicted
// for the edited plan. Saved profiles are not reused: their units need not
// match an edited plan's boundaries. `--profile measure` measures the split
// units on this machine instead (ReestimateOptions::measure): an unedited
// plan made with measured costs gets its memory figures back (memory is
// deterministic; times are measured again), to the last bits of sums the
// planner took over units it had merged, and a plan whose boundaries were
// moved by hand gets the figures the planner would have given it, which is
// how the per-schedule memory tests pin their stage cuts (tests/CMakeLists.txt,
// memory_split_gpt_adam_*).
Expected<PlanModel> rebuildPlanModel(const proto::Plan &plan, const ReestimateOptions &opts) {
  if (!rangesSound(plan)) return Error{"stages: the op ranges must cover the graph in order before re-estimating"};
  if (plan.microbatches() < 1 || plan.global_batch_size() < 1)
    return Error{"microbatches: must be at least 1 before re-estimating"};
  PlanModel m;
  auto graph = plan::graphFromProto(plan.graph());
  if (!graph) return graph.error();
  m.graph = std::move(*graph);
  auto cluster = clusterOf(plan, opts);
  if (!cluster) return cluster.error();
  m.cluster = *cluster;
  m.memory_margin = opts.memory_margin ? *opts.memory_margin : planMargin(plan);

  std::vector<int> boundaries;
  for (const auto &s : plan.stages()) boundaries.push_back(s.op_begin());
  const std::vector<cost::Unit> units = unitsSplitAt(m.graph, boundaries);

  PlanOptions sizes; // the micro-batch sizes to cost at: this plan's
  sizes.batch_size = plan.global_batch_size();
  sizes.microbatches = plan.microbatches();
  for (const auto &s : plan.stages()) sizes.replicas.push_back(std::max(1, plan::stageReplicas(s)));
  const std::string optimizer_name = plan.estimates().optimizer().empty() ? "adam" : plan.estimates().optimizer();
  // A word no optimizer has (a hand edit) keeps no state, as before the enum.
  const auto optimizer = cost::parseOptimizer(optimizer_name);
  // check refuses another precision; until then it counts weight copies, as any non-fp32 one did.
  const auto precision = cost::planPrecision(plan);
  if (opts.measure) {
    const cluster::DeviceKind device =
        m.cluster.device.type == "cpu" ? cluster::DeviceKind::Cpu : cluster::DeviceKind::Cuda;
    auto measured = opts.measure(m.graph, units, costBatchSizes(sizes), device,
                                 optimizer ? *optimizer : cost::Optimizer::Sgd,
                                 precision ? *precision : cost::Precision::BF16);
    if (!measured) return Error{"--profile measure: " + measured.error().message};
    m.costs = std::move(*measured);
  } else {
    m.costs = cost::analyticCosts(m.graph, units, m.cluster.device, costBatchSizes(sizes));
  }
  m.costs.optimizer = optimizer_name;

  PlanOptions lower; // nothing pinned: constraints steer searches, they do not judge a plan
  lower.batch_size = plan.global_batch_size();
  lower.memory_margin = m.memory_margin;
  lower.optimizer = optimizer ? *optimizer : cost::Optimizer::Sgd;
  lower.precision = precision ? *precision : cost::Precision::BF16;
  lower.exact_batchnorm = plan.batchnorm() == "exact"; // its all-reduces cost time (Note [batch statistics])
  // Tensor parallelism: the sharding the plan records (Note [tensor parallel lowering]).
  // A degree set by hand on a plan that records none is checked against the model's own analysis.
  std::optional<sharding::Analysis> tp;
  const bool uses_tp = std::any_of(plan.stages().begin(), plan.stages().end(),
                                   [](const proto::Stage &s) { return plan::tensorParallel(s) > 1; });
  if (plan::hasSharding(plan.graph())) {
    auto recorded = plan::shardingFromProto(plan.graph(), m.graph);
    if (!recorded) return recorded.error();
    tp = std::move(*recorded);
  } else if (uses_tp) {
    auto analysed = sharding::analyze(m.graph);
    if (!analysed) return Error{"stages: tensor_parallel: " + analysed.error().message};
    tp = std::move(*analysed);
  }
  auto problem = lowerToProblem(m.graph, m.costs, m.cluster, lower, tp ? &*tp : nullptr);
  if (!problem) return Error{"cluster: " + problem.error().message};
  m.problem = std::move(*problem);

  std::map<int, int> unit_at; // op index -> the unit starting there
  for (int u = 0; u < int(units.size()); ++u) unit_at[units[u].op_begin] = u;
  unit_at[int(m.graph.nodes.size())] = int(units.size());
  m.solution.microbatches = plan.microbatches();
  // A plan naming no schedule (check lists that) is re-estimated as 1F1B.
  auto schedule = plan::scheduleFromProto(plan.schedule());
  m.solution.schedule = schedule ? *schedule : pipeline::Schedule::OneFOneB;
  m.solution.virtual_stages = plan::virtualStages(plan);
  for (const auto &s : plan.stages())
    m.solution.stages.push_back(
        {unit_at.at(s.op_begin()), unit_at.at(s.op_end()), std::max(1, plan::stageReplicas(s)), s.recompute(),
         s.zero() > 0, plan::tensorParallel(s)});
  m.evaluation = partition::evaluate(m.problem, m.solution);

  double slowest_optimizer = 0;
  for (int s = 0; s < plan.stages_size(); ++s) {
    const proto::Stage &st = plan.stages(s);
    const int64_t params = rangeParameterCount(m.graph, st.op_begin(), st.op_end());
    m.stage_params.push_back(params);
    const int shards = st.zero() > 0 ? std::max(1, plan::stageReplicas(st)) : 1; // a sharded stage updates its share
    const double share = s < int(m.evaluation.stages.size()) ? m.evaluation.stages[s].param_share : 1.0;
    m.stage_optimizer_s.push_back(double(params) * share / shards * m.costs.optimizer_s_per_param);
    slowest_optimizer = std::max(slowest_optimizer, m.stage_optimizer_s.back());
  }
  m.step_time_s = m.evaluation.step_time_s + slowest_optimizer;
  return m;
}

void refreshEstimates(proto::Plan &plan, const PlanModel &m) {
  for (int s = 0; s < plan.stages_size() && s < int(m.evaluation.stages.size()); ++s) {
    const partition::StageCost &c = m.evaluation.stages[s];
    const std::vector<double> &ranks = m.evaluation.rank_peak_memory_bytes;
    fillStageEstimates(c, m.evaluation.capacity_bytes, m.stage_params[s], pipeline::splitsBackward(m.solution.schedule),
                       ranks.empty() ? 0.0 : ranks[size_t(s) % ranks.size()],
                       plan.mutable_stages(s)->mutable_estimates());
  }
  plan.mutable_estimates()->set_step_time_s(m.step_time_s);
  plan.mutable_estimates()->set_optimizer(m.costs.optimizer);
  fillModelFlops(m.graph, plan.mutable_estimates());
  *plan.mutable_cluster() = plan::clusterToProto(m.cluster);
}

Status runConvert(const std::string &input, const std::string &output, std::ostream &log) {
  if (output.empty()) return Error{"no output file: pass -o OUT (.pb, .pbtxt or .json)"};
  auto plan = plan::readPlan(input);
  if (!plan) return plan.error();
  plan::rebaseModelPath(*plan, input, output);
  if (Status st = plan::writePlan(*plan, output); !st) return st;
  log << "rannc-plan: wrote " << output << "\n";
  return Status::success();
}

Status runCheck(const CheckOptions &opts, std::ostream &out, std::ostream &log) {
  if (opts.update && opts.output.empty()) return Error{"--update: pass -o OUT for the updated plan"};
  if (!opts.update && !opts.output.empty()) return Error{"-o: only with --update"};
  auto read = plan::readPlan(opts.plan);
  if (!read) return read.error();
  proto::Plan plan = std::move(*read);
  std::vector<std::string> problems = plan::structuralProblems(plan), notes;
  for (const std::string &note : plan::batchStatisticsNotes(plan)) notes.push_back("batchnorm: " + note);
  auto graph = plan::graphFromProto(plan.graph());
  if (!graph) {
    // Its message names the graph field; report it unless the structural
    // checks already found the graph's problems.
    bool reported = false;
    for (const auto &p : problems) reported = reported || p.rfind("graph", 0) == 0;
    if (!reported) problems.push_back(graph.error().message);
  }

  // The model file, when it can be read.
  Expected<std::string> resolved =
      opts.model.empty()
          ? plan::resolveRecordedModelPath(plan.model().path(), opts.plan, opts.allow_model_outside_plan)
          : Expected<std::string>(opts.model);
  const std::string model = resolved ? *resolved : plan.model().path();
  if (!resolved) {
    problems.push_back(resolved.error().message);
  } else if (openInput(model)) {
    if (Status st = plan::verifyModelFiles(model, plan.model()); !st)
      problems.push_back("model.sha256: " + st.message());
    else
      notes.push_back("model: " + model + " matches model.sha256" +
                      (plan.model().external_data_size() ? " (and its external data)" : ""));
  } else {
    notes.push_back("model: " + model + " cannot be read, so its SHA-256 was not checked (pass --model PATH)");
  }

  auto cluster = clusterOf(plan, opts.reestimate);
  if (!cluster) return cluster.error();
  const std::string cluster_field = opts.reestimate.cluster_file.empty() ? "cluster" : opts.reestimate.cluster_file;
  if (plan::worldSize(plan) > cluster->worldSize())
    problems.push_back(cluster_field + ": the stages use " + std::to_string(plan::worldSize(plan)) +
                       " ranks, the cluster has " + std::to_string(cluster->worldSize()) +
                       " devices (edit cluster.devices_per_node or pass --cluster)");

  // Re-estimate when the stage ranges allow it, so memory problems are listed
  // together with the others.
  std::optional<PlanModel> model_est;
  if (graph && rangesSound(plan)) {
    auto m = rebuildPlanModel(plan, opts.reestimate);
    if (!m)
      problems.push_back(m.error().message);
    else
      model_est = std::move(*m);
  } else {
    notes.push_back("memory and time were not re-estimated: fix the stage ranges and the graph first");
  }
  if (model_est) {
    const partition::Evaluation &ev = model_est->evaluation;
    if (!ev.well_formed) {
      if (plan::worldSize(plan) <= cluster->worldSize())
        for (const auto &v : ev.violations) problems.push_back("stages: " + v);
    } else {
      for (int s = 0; s < int(ev.stages.size()); ++s) // Note [tensor parallel stages]
        if (std::string why = partition::tensorParallelProblem(model_est->problem, model_est->solution.stages[s],
                                                               ev.stages[s].first_rank);
            !why.empty())
          problems.push_back("stages[" + std::to_string(s) + "]: " + why);
      for (int s = 0; s < int(ev.stages.size()); ++s) {
        const partition::StageMemory &mem = ev.stages[s].memory;
        if (mem.total() > ev.capacity_bytes)
          problems.push_back(
              "stages[" + std::to_string(s) + "]: needs " + plan::bytesText(mem.total()) + " per device (" +
              partition::describe(mem, plan::bytesText) + ") but a device holds " + plan::bytesText(ev.capacity_bytes) + " (" +
              plan::bytesText(double(model_est->cluster.device.memory_bytes)) + " less the " +
              formatFixed(model_est->memory_margin * 100, 0) + "% margin" +
              (model_est->cluster.device.runtime_reserve_bytes > 0
                   ? " and the " + plan::bytesText(double(model_est->cluster.device.runtime_reserve_bytes)) +
                         " runtime reserve"
                   : std::string()) +
              "); move ops to another stage, add replicas or micro-batches, or use larger devices");
      }
    }
    // Ranks not handed out in stage order: evaluate assumed they were.
    int next = 0;
    bool in_order = true;
    for (const auto &s : plan.stages())
      for (int r : s.ranks()) in_order = in_order && r == next++;
    if (!in_order)
      notes.push_back("estimates: links assume ranks 0, 1, ... in stage order; this plan orders them differently");
    if (plan.planner().find("analytic") == std::string::npos && !opts.reestimate.measure)
      notes.push_back("estimates: the plan's figures come from '" + plan.planner() +
                      "', the re-estimate from analytic costs: they differ even without an edit");
  }

  for (const auto &n : notes) out << opts.plan << ": note: " << n << "\n";
  if (!problems.empty()) {
    for (const auto &p : problems) out << opts.plan << ": error: " << p << "\n";
    return Error{opts.plan + ": invalid plan: " + std::to_string(problems.size()) +
                 (problems.size() == 1 ? " problem" : " problems") + " (listed on stdout)"};
  }

  const PlanModel &m = *model_est;
  const partition::Evaluation &ev = m.evaluation;
  out << opts.plan << ": valid: " << counted(plan.stages_size(), "stage") << " on "
      << counted(plan::worldSize(plan), "rank") << ", " << counted(plan.microbatches(), "micro-batch") << " of "
      << plan.global_batch_size() / plan.microbatches() << ", " << plan::scheduleName(plan.schedule()) << "\n";
  out << "re-estimated with " << (opts.reestimate.measure ? "measured" : "analytic") << " costs on "
      << m.cluster.worldSize() << " x " << m.cluster.device.name << " ("
      << plan::bytesText(double(m.cluster.device.memory_bytes)) << ", " << plan::bytesText(ev.capacity_bytes)
      << " usable per device):\n";
  for (int s = 0; s < plan.stages_size(); ++s) {
    const auto &old = plan.stages(s).estimates();
    const partition::StageCost &c = ev.stages[s];
    out << "stage " << s << ": forward " << timeVersus(c.forwardSlot(), old.fwd_time_s()) << ", backward "
        << timeVersus(c.backwardSlot(), old.bwd_time_s());
    if (c.allreduce_s > 0 || old.allreduce_time_s() > 0)
      out << ", all-reduce " << timeVersus(c.allreduce_s, old.allreduce_time_s());
    out << "\n";
    out << "stage " << s << ": peak memory " << bytesVersus(c.memory.total(), double(old.peak_memory_bytes())) << " of "
        << plan::bytesText(ev.capacity_bytes) << " [" << partition::describe(c.memory, plan::bytesText) << "]\n";
  }
  const double step = m.step_time_s;
  out << "step time " << timeVersus(step, plan.estimates().step_time_s()) << ", "
      << formatFixed(plan.global_batch_size() / step, 1) << " samples/s\n";
  if (opts.update) {
    refreshEstimates(plan, m);
    plan::rebaseModelPath(plan, opts.plan, opts.output);
    if (Status st = plan::writePlan(plan, opts.output); !st) return st;
    log << "rannc-plan: wrote " << opts.output << " with the re-estimated figures\n";
  }
  return Status::success();
}

Expected<PredictedStep> predictStep(const proto::Plan &plan, const std::string &what, const ReestimateOptions &opts,
                                    bool overlap_allreduce, bool plan_compute) {
  if (auto c = clusterOf(plan, opts); !c) return c.error(); // names the cluster file
  auto m = rebuildPlanModel(plan, opts);
  if (!m) return Error{what + ": " + m.error().message};
  // Each stage's compute scaled to the plan's own forward and backward (a
  // plan made with measured costs), transfers and all-reduce kept analytic.
  // A tensor-parallel stage's split compute is left as it is.
  for (int s = 0; plan_compute && s < m->solution.numStages(); ++s) {
    const auto &est = plan.stages(s).estimates();
    const partition::StageCost &c = m->evaluation.stages[s];
    if (c.tensor_parallel > 1 || c.fwd_s <= 0 || c.bwd_s + c.recompute_s <= 0) continue;
    const double kf = (est.fwd_time_s() - c.recv_activations_s) / c.fwd_s;
    const double kb = (est.bwd_time_s() - c.recv_gradients_s) / (c.bwd_s + c.recompute_s);
    if (!(kf > 0) || !(kb > 0)) continue;
    for (int b = m->solution.stages[s].block_begin; b < m->solution.stages[s].block_end; ++b) {
      partition::Block &block = m->problem.blocks[b];
      for (partition::Affine *a : {&block.fwd, &block.bwd}) {
        const double k = a == &block.fwd ? kf : kb;
        a->fixed_s *= k;
        a->per_sample_s *= k;
      }
    }
  }
  partition::SimulateOptions so;
  so.overlap_allreduce = overlap_allreduce;
  auto sim = partition::simulate(m->problem, m->solution, so);
  if (!sim) return Error{what + ": " + sim.error().message};

  // Per rank: time by kind; then its optimizer step after its last event.
  PredictedStep p;
  const int world = m->solution.devicesUsed();
  std::vector<int> &stage_of_rank = p.stage_of_rank;
  stage_of_rank.assign(world, 0);
  const int ranks = m->solution.pipelineRanks(); // an interleaved rank is named by its first chunk
  for (int s = 0; s < ranks; ++s)
    for (int r = 0; r < m->solution.stages[s].devices(); ++r) stage_of_rank[m->solution.firstRank(s) + r] = s;
  std::vector<std::map<std::string, double>> &by_kind = p.by_kind;
  by_kind.resize(world);
  std::vector<double> last_end(world, 0);
  std::vector<plan::TraceEvent> &events = p.events;
  for (const partition::TimelineEvent &e : sim->timeline) {
    plan::TraceKind kind = plan::TraceKind::Forward; // Note [trace lanes]
    switch (e.kind) {
    case partition::EventKind::RecvActivations: kind = plan::TraceKind::RecvActivations; break;
    case partition::EventKind::Forward: kind = plan::TraceKind::Forward; break;
    case partition::EventKind::RecvGradients: kind = plan::TraceKind::RecvGradients; break;
    case partition::EventKind::Recompute: kind = plan::TraceKind::Recompute; break;
    case partition::EventKind::Backward: kind = plan::TraceKind::Backward; break;
    case partition::EventKind::BackwardWeight: kind = plan::TraceKind::BackwardWeight; break;
    case partition::EventKind::AllReduce: kind = plan::TraceKind::AllReduce; break;
    }
    by_kind[e.rank][plan::traceCategory(kind)] += e.end_s - e.start_s;
    last_end[e.rank] = std::max(last_end[e.rank], e.end_s);
    events.push_back(plan::traceEvent(kind, e.rank, e.stage, e.microbatch, e.start_s, e.end_s - e.start_s));
  }
  double &step = p.step_s;
  for (int r = 0; r < world; ++r) {
    const int s = stage_of_rank[r];
    double t = 0; // every chunk's step (Note [interleaved 1F1B])
    for (int c = s; c < m->solution.numStages(); c += ranks) t += m->stage_optimizer_s[c];
    if (t > 0) events.push_back(plan::traceEvent(plan::TraceKind::Optimizer, r, s, -1, last_end[r], t));
    by_kind[r]["optimizer"] += t;
    step = std::max(step, last_end[r] + t);
  }
  std::stable_sort(events.begin(), events.end(), [](const plan::TraceEvent &a, const plan::TraceEvent &b) {
    return std::tie(a.pid, a.start_s) < std::tie(b.pid, b.start_s);
  });

  for (int r = 0; r < world; ++r) p.process_names[r] = plan::traceProcessName(r, stage_of_rank[r]);
  p.model = std::move(*m);
  return p;
}

Status runSimulate(const SimulateCommandOptions &opts, std::ostream &out, std::ostream &log) {
  auto plan = readSoundPlan(opts.plan);
  if (!plan) return plan.error();
  auto p = predictStep(*plan, opts.plan, opts.reestimate, opts.overlap_allreduce);
  if (!p) return p.error();
  const PlanModel *m = &p->model;
  const int world = int(p->stage_of_rank.size());
  const std::vector<int> &stage_of_rank = p->stage_of_rank;
  const auto &by_kind = p->by_kind;
  const double step = p->step_s;
  out << opts.plan << ": one step of " << counted(m->solution.numStages(), "stage") << " on " << counted(world, "rank")
      << ", " << counted(m->solution.microbatches, "micro-batch") << ", " << plan::scheduleName(plan->schedule())
      << " (analytic costs" << (opts.overlap_allreduce ? ", all-reduce overlapped" : "") << ")\n";
  out << "predicted step time " << plan::timeText(step) << " (" << formatFixed(plan->global_batch_size() / step, 1)
      << " samples/s); closed form " << plan::timeText(m->step_time_s) << ", the plan says "
      << plan::timeText(plan->estimates().step_time_s()) << "\n";
  for (const partition::StageCost &c : m->evaluation.stages) // Note [tensor parallel stages]
    if (c.tensor_parallel > 1)
      out << "ranks " << c.first_rank << ".." << c.first_rank + c.devices() - 1 << ": tensor-parallel "
          << c.tensor_parallel << " in " << counted(c.replicas, "group") << ", "
          << plan::timeText(c.tp_collective_s) << " of collectives in each forward and each backward\n";
  for (const partition::StageCost &c : m->evaluation.stages) // Note [batch statistics]
    if (c.stat_sync_s > 0)
      out << "ranks " << c.first_rank << ".." << c.first_rank + c.devices() - 1 << ": BatchNorm statistics summed over "
          << counted(c.replicas, "replica") << ", " << plan::timeText(c.stat_sync_s)
          << " of all-reduces in each forward and each backward\n";
  out << "\n";
  const plan::TimeUnit unit = plan::timeUnitFor(step);
  out << std::left << std::setw(6) << "rank" << std::setw(7) << "stage" << std::right;
  static const char *kKinds[] = {"forward", "backward", "recv", "recompute", "all-reduce", "optimizer"};
  for (const char *k : kKinds) out << std::setw(12) << k;
  out << std::setw(12) << "idle" << std::setw(8) << "busy"
      << "\n";
  for (int r = 0; r < world; ++r) {
    double busy = 0;
    out << std::left << std::setw(6) << r << std::setw(7) << stage_of_rank[r] << std::right;
    for (const char *k : kKinds) {
      const double t = by_kind[r].count(k) ? by_kind[r].at(k) : 0.0;
      busy += t;
      out << std::setw(12) << plan::timeIn(t, unit);
    }
    out << std::setw(12) << plan::timeIn(step - busy, unit) << std::setw(7)
        << formatFixed(step > 0 ? busy / step * 100 : 0, 1) << "%\n";
  }
  out << "(times in " << unit.name << " per step)\n";

  if (!opts.trace.empty()) {
    std::ostringstream trace;
    plan::writeChromeTrace(p->events, p->process_names, trace);
    if (Status st = writeFileAtomic(opts.trace, trace.str()); !st) return st;
    log << "rannc-plan: wrote " << opts.trace << " (" << p->events.size()
        << " events; open it in ui.perfetto.dev or chrome://tracing)\n";
  }
  return Status::success();
}

Status runDot(const DotCommandOptions &opts, std::ostream &out, std::ostream &log) {
  auto plan = readSoundPlan(opts.plan);
  if (!plan) return plan.error();
  auto graph = plan::graphFromProto(plan->graph());
  if (!graph) return Error{opts.plan + ": " + graph.error().message};
  plan::DotOptions dot;
  if (int(graph->nodes.size()) > opts.max_ops) {
    std::vector<int> boundaries;
    for (const auto &s : plan->stages()) boundaries.push_back(s.op_begin());
    for (const cost::Unit &u : unitsSplitAt(*graph, boundaries)) dot.groups.emplace_back(u.op_begin, u.op_end);
  }
  std::ostringstream text;
  plan::printPlanDot(*plan, *graph, dot, text);
  if (opts.output.empty()) {
    out << text.str();
    return Status::success();
  }
  if (Status st = writeFileAtomic(opts.output, text.str()); !st) return st;
  log << "rannc-plan: wrote " << opts.output << " (" << graph->nodes.size() << " ops"
      << (dot.groups.empty() ? "" : " drawn as " + std::to_string(dot.groups.size()) + " units") << ")\n";
  return Status::success();
}

Status runDiff(const std::string &a, const std::string &b, std::ostream &out) {
  auto pa = plan::readPlan(a);
  if (!pa) return pa.error();
  auto pb = plan::readPlan(b);
  if (!pb) return pb.error();
  out << "--- " << a << "\n+++ " << b << "\n";
  plan::printPlanDiff(*pa, *pb, out);
  return Status::success();
}

Status printTensorParallel(const ir::Graph &g, int max_degree, std::ostream &out) {
  auto a = sharding::analyze(g);
  if (!a) return a.error();
  a->print(g, out);
  const std::vector<int> degrees = a->degrees(max_degree);
  out << "tensor-parallel degrees up to " << max_degree << ':';
  for (int t : degrees) out << ' ' << t;
  out << '\n';
  if (!a->validDegree(max_degree))
    out << "degree " << max_degree << " does not divide every cut size; the largest valid one is " << degrees.back()
        << '\n';
  return Status::success();
}

} // namespace rannc::planner
