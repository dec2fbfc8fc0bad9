// The plan as an artifact: the rannc-plan verbs that read, check, re-estimate,
// simulate, draw, convert and compare plans (docs/plan-format.md). Like
// planner.h, one function per verb; the tool only parses flags.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "plan.pb.h"
#include "planner/cluster/cluster.h"
#include "planner/cluster/device_kind.h"
#include "planner/cost/cost.h"
#include "planner/cost/precision.h"
#include "planner/ir/ir.h"
#include "planner/partition/evaluate.h"
#include "planner/partition/problem.h"
#include "planner/plan/trace.h"
#include "planner/support/status.h"

namespace rannc::planner {

/// What tensor parallelism analyze() finds in `g`, per op, and the valid
/// degrees up to `max_degree` (rannc-plan import --tensor-parallel).
Status printTensorParallel(const ir::Graph &g, int max_degree, std::ostream &out);

/// Measures unit costs on this machine (`rannc-plan ... --profile measure`:
/// the LibTorch profiler, which the tool passes in) for a plan of this
/// optimizer and precision, at these micro-batch sizes, on this device.
using ReestimateMeasureFn = std::function<Expected<cost::CostTable>(
    const ir::Graph &, const std::vector<cost::Unit> &, const std::vector<int64_t> &batch_sizes,
    cluster::DeviceKind device, cost::Optimizer optimizer, cost::Precision precision)>;

/// The hardware a plan is re-estimated for, and with which costs.
struct ReestimateOptions {
  std::string cluster_file;             ///< YAML cluster description; empty: the plan's own cluster
  std::optional<int64_t> device_memory; ///< overrides the device memory
  std::optional<double> memory_margin;  ///< unset: the margin the plan was made with
  /// Set: measured costs of the plan's own units instead of analytic ones
  /// (Note [re-estimating a plan]).
  ReestimateMeasureFn measure;
};

/// A plan's stages lowered back to the partitioner's numbers: analytic (or
/// measured) costs over the planner's units split at every stage boundary (so each stage is a
/// whole number of blocks), the plan's stages as a Solution, and its
/// independent evaluation (Note [re-estimating a plan] in tooling.cpp).
struct PlanModel {
  ir::Graph graph;
  cluster::ClusterSpec cluster;
  double memory_margin = 0;
  cost::CostTable costs;                 ///< per unit, analytic or measured (costs.source)
  partition::Problem problem;            ///< one block per unit
  partition::Solution solution;          ///< the plan's stages, in unit indices
  partition::Evaluation evaluation;      ///< per-stage time and memory, violations
  std::vector<int64_t> stage_params;     ///< parameter elements per stage
  std::vector<double> stage_optimizer_s; ///< optimizer step time per stage
  double step_time_s = 0;                ///< evaluation's step + the slowest optimizer step, as the planner predicts it
};

/// The planner's units of `g` split at `boundaries` (op indices), so that
/// every boundary is a unit boundary.
std::vector<cost::Unit> unitsSplitAt(const ir::Graph &g, const std::vector<int> &boundaries);

/// Rebuilds the partition problem for `plan` (whose stage ranges must be
/// consecutive and cover its graph) and evaluates the plan's stages.
Expected<PlanModel> rebuildPlanModel(const proto::Plan &plan, const ReestimateOptions &opts);

/// Replaces the plan's estimates (every stage's, the step time) with `m`'s,
/// and its cluster with the one they were made for.
void refreshEstimates(proto::Plan &plan, const PlanModel &m);

/// rannc-plan convert IN -o OUT
Status runConvert(const std::string &input, const std::string &output, std::ostream &log);

struct CheckOptions {
  std::string plan;
  std::string model; ///< the model file to hash; empty: the path the plan names
  bool allow_model_outside_plan = false; ///< Note [plan model path]
  ReestimateOptions reestimate;
  bool update = false; ///< write the plan with refreshed estimates to `output`
  std::string output;
};
/// rannc-plan check PLAN: lists every problem on `out` and fails when there
/// is one; on a valid plan prints the re-estimates against the plan's own.
Status runCheck(const CheckOptions &opts, std::ostream &out, std::ostream &log);

struct SimulateCommandOptions {
  std::string plan;
  std::string trace; ///< Chrome-trace / Perfetto JSON to write; empty: none
  ReestimateOptions reestimate;
  bool overlap_allreduce = false;
};
/// Reads a plan and refuses one with structural problems (for the verbs that
/// need a sound plan; `check` lists them instead).
Expected<proto::Plan> readSoundPlan(const std::string &path);

/// One step of a plan as `simulate` predicts it, drawn in the lanes of
/// Note [trace lanes] (planner/plan/trace.h).
struct PredictedStep {
  PlanModel model;
  std::vector<plan::TraceEvent> events;
  std::map<int, std::string> process_names;
  std::vector<int> stage_of_rank;
  std::vector<std::map<std::string, double>> by_kind; ///< per rank: seconds by category
  double step_s = 0;
};
/// Simulates one step of `plan` (`what` names it in errors) with analytic
/// costs, or with `plan_compute` each stage's compute scaled to the plan's own
/// forward and backward estimates (those of the costs it was planned with).
Expected<PredictedStep> predictStep(const proto::Plan &plan, const std::string &what, const ReestimateOptions &opts,
                                    bool overlap_allreduce, bool plan_compute = false);

/// rannc-plan simulate PLAN [--trace T.json]
Status runSimulate(const SimulateCommandOptions &opts, std::ostream &out, std::ostream &log);

struct DotCommandOptions {
  std::string plan;
  std::string output; ///< empty: stdout
  int max_ops = 300;  ///< above this many ops, draw one node per unit
};
/// rannc-plan dot PLAN -o PLAN.dot
Status runDot(const DotCommandOptions &opts, std::ostream &out, std::ostream &log);

/// rannc-plan diff A B (fails only when a plan cannot be read)
Status runDiff(const std::string &a, const std::string &b, std::ostream &out);

} // namespace rannc::planner
