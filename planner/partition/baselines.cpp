// Baseline partitioners, each a fixed rule for the stage boundaries scored by
// evaluate(); `solve` dispatches between them and the DP.
#include <algorithm>
#include <chrono>
#include <limits>

#include "planner/partition/evaluate.h"
#include "planner/partition/linear.h"
#include "planner/partition/solve.h"
#include "planner/partition/solver_common.h"

namespace rannc::partition {
namespace {

/// Stage boundaries for `num_stages` stages under `strategy`, with per-block
/// times taken at `samples` per replica. With `whole_cuts_only` (a pinned
/// tensor-parallel degree above 1), boundaries fall only on whole cuts (Note
/// [tensor parallel stages]): the rule runs over the runs of blocks between them.
Expected<std::vector<int>> boundaries(const Problem &p, Strategy strategy, int num_stages, double samples,
                                      bool whole_cuts_only) {
  const int n = p.numBlocks();
  std::vector<int> starts; // the first block of each run
  for (int i = 0; i < n; ++i)
    if (i == 0 || !whole_cuts_only || p.cutWhole(i)) starts.push_back(i);
  const int runs = static_cast<int>(starts.size());
  starts.push_back(n);
  std::vector<int> b(num_stages + 1);
  if (strategy == Strategy::Uniform) {
    if (runs < num_stages) return Error{"fewer whole cuts than stages"};
    for (int s = 0; s <= num_stages; ++s) b[s] = starts[static_cast<int64_t>(s) * runs / num_stages];
    return b;
  }
  std::vector<double> weight(runs, 0.0);
  for (int u = 0; u < runs; ++u)
    for (int i = starts[u]; i < starts[u + 1]; ++i) {
      const Block &blk = p.blocks[i];
      weight[u] += strategy == Strategy::Parameters ? blk.param_bytes : blk.fwd.at(samples) + blk.bwd.at(samples);
    }
  auto split = balancedSplit(weight, num_stages);
  if (!split) return split.error();
  for (int s = 0; s <= num_stages; ++s) b[s] = starts[(*split)[s]];
  return b;
}

/// The tensor-parallel degree of each stage: pinned, else 1.
std::vector<int> baselineDegrees(const Problem &p, int num_stages) {
  const std::vector<int> &pinned = p.constraints.tensor_parallel;
  if (pinned.size() > 1) return pinned;
  return std::vector<int>(num_stages, pinned.empty() ? 1 : pinned[0]);
}

/// The replica counts of each stage: pinned, or floor(D / sum of the stages'
/// degrees) trimmed to the fewest devices giving the same per-replica
/// micro-batch (so the baseline stays inside the DP's search space).
std::vector<int> baselineReplicas(const Problem &p, const std::vector<int> &degrees, int microbatches) {
  const Constraints &c = p.constraints;
  const int num_stages = static_cast<int>(degrees.size());
  if (c.replicas.size() > 1) return c.replicas;
  if (c.replicas.size() == 1) return std::vector<int>(num_stages, c.replicas[0]);
  int devices_per_replica = 0;
  for (int t : degrees) devices_per_replica += t;
  const int share = std::max(1, p.devices.count / devices_per_replica);
  int r = 1;
  for (int cand : replicaCandidates(p, microbatches))
    if (cand <= share) r = cand;
  return std::vector<int>(num_stages, r);
}

} // namespace

const char *strategyName(Strategy s) {
  switch (s) {
  case Strategy::Auto: return "auto";
  case Strategy::Uniform: return "uniform";
  case Strategy::Parameters: return "parameters";
  case Strategy::Time: return "time";
  }
  return "?";
}

Expected<Strategy> parseStrategy(const std::string &name) {
  for (Strategy s : {Strategy::Auto, Strategy::Uniform, Strategy::Parameters, Strategy::Time})
    if (name == strategyName(s)) return s;
  return Error{"unknown strategy '" + name + "' (expected auto, uniform, parameters or time)"};
}

Expected<SolveResult> solveBaseline(const Problem &p, Strategy strategy) {
  const auto start = std::chrono::steady_clock::now();
  if (Status st = validate(p); !st) return Error{st.message()};
  if (p.constraints.virtual_stages > 1) // Note [interleaved layouts] in dp.cpp
    return Error{"only the DP (--strategy auto) lays out interleaved chunks"};
  const int n = p.numBlocks();
  const Constraints &c = p.constraints;
  const int pinned_degree = c.tensor_parallel.size() == 1 ? c.tensor_parallel[0] : 1;
  const int num_stages = c.replicas.size() > 1          ? static_cast<int>(c.replicas.size())
                         : c.tensor_parallel.size() > 1 ? static_cast<int>(c.tensor_parallel.size())
                         : c.stages > 0                 ? c.stages
                                                        : std::max(1, std::min(n, p.devices.count / pinned_degree));
  const std::vector<int> degrees = baselineDegrees(p, num_stages);
  const bool whole_cuts_only = std::any_of(degrees.begin(), degrees.end(), [](int t) { return t > 1; });
  const Schedule schedule = c.schedule.value_or(Schedule::OneFOneB);

  SolveResult result;
  result.step_time_s = std::numeric_limits<double>::infinity();
  bool found = false;
  std::string first_violation;
  for (int m : microbatchCandidates(p)) {
    ++result.stats.microbatch_counts;
    const std::vector<int> replicas = baselineReplicas(p, degrees, m);
    const int min_r = *std::min_element(replicas.begin(), replicas.end());
    auto bounds = boundaries(p, strategy, num_stages, static_cast<double>(replicaSamples(p.batch_size, m, min_r)),
                             whole_cuts_only);
    if (!bounds) {
      if (whole_cuts_only)
        return Error{std::string("the ") + strategyName(strategy) + " baseline finds no " +
                     std::to_string(num_stages) + " stages bounded by whole cuts for tensor parallelism"};
      return bounds.error();
    }
    Solution sol;
    sol.microbatches = m;
    sol.schedule = schedule;
    for (int s = 0; s < num_stages; ++s)
      sol.stages.push_back(Stage{(*bounds)[s], (*bounds)[s + 1], replicas[s], false, false, degrees[s]});
    // The memory techniques in order of cost: sharding (free in time) before
    // recomputation, each stage sharding only where allowed.
    for (int choice = 0; choice < 4; ++choice) {
      const bool recompute = choice & 2, zero = choice & 1;
      if (!p.recomputeAllowed(recompute)) continue;
      bool allowed = true;
      for (Stage &st : sol.stages) {
        st.recompute = recompute;
        st.zero = zero && st.replicas > 1;
        allowed = allowed && p.zeroAllowed(st.zero, st.replicas);
      }
      if (!allowed) continue;
      Evaluation ev = evaluate(p, sol);
      ++result.stats.solutions;
      if (ev.feasible()) {
        if (ev.step_time_s < result.step_time_s) {
          result.step_time_s = ev.step_time_s;
          result.solution = sol;
          found = true;
        }
        break;
      }
      if (first_violation.empty()) first_violation = ev.violations.front();
    }
  }
  result.stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!found)
    return Error{std::string("the ") + strategyName(strategy) + " baseline finds no plan that fits (" +
                 std::to_string(num_stages) + " stages): " + first_violation};
  return result;
}

Expected<SolveResult> solve(const Problem &p, Strategy strategy) {
  return strategy == Strategy::Auto ? solveDP(p) : solveBaseline(p, strategy);
}

} // namespace rannc::partition
