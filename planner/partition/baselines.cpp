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
/// times taken at `samples` per replica.
Expected<std::vector<int>> boundaries(const Problem &p, Strategy strategy, int num_stages, double samples) {
  const int n = p.numBlocks();
  if (strategy == Strategy::Uniform) {
    std::vector<int> b(num_stages + 1);
    for (int s = 0; s <= num_stages; ++s) b[s] = static_cast<int>(static_cast<int64_t>(s) * n / num_stages);
    return b;
  }
  std::vector<double> weight(n);
  for (int i = 0; i < n; ++i) {
    const Block &blk = p.blocks[i];
    weight[i] = strategy == Strategy::Parameters ? blk.param_bytes : blk.fwd.at(samples) + blk.bwd.at(samples);
  }
  return balancedSplit(weight, num_stages);
}

/// The replica counts of each stage: pinned, or floor(D / S) trimmed to the
/// fewest devices giving the same per-replica micro-batch (so the baseline
/// stays inside the DP's search space).
std::vector<int> baselineReplicas(const Problem &p, int num_stages, int microbatches) {
  const Constraints &c = p.constraints;
  if (c.replicas.size() > 1) return c.replicas;
  if (c.replicas.size() == 1) return std::vector<int>(num_stages, c.replicas[0]);
  const int share = std::max(1, p.devices.count / num_stages);
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
  const int n = p.numBlocks();
  const Constraints &c = p.constraints;
  const int num_stages = c.replicas.size() > 1 ? static_cast<int>(c.replicas.size())
                         : c.stages > 0        ? c.stages
                                               : std::min(n, p.devices.count);
  const Schedule schedule = c.schedule.value_or(Schedule::OneFOneB);

  SolveResult result;
  result.step_time_s = std::numeric_limits<double>::infinity();
  bool found = false;
  std::string first_violation;
  for (int m : microbatchCandidates(p)) {
    ++result.stats.microbatch_counts;
    const std::vector<int> replicas = baselineReplicas(p, num_stages, m);
    const int min_r = *std::min_element(replicas.begin(), replicas.end());
    auto bounds = boundaries(p, strategy, num_stages, static_cast<double>(replicaSamples(p.batch_size, m, min_r)));
    if (!bounds) return bounds.error();
    Solution sol;
    sol.microbatches = m;
    sol.schedule = schedule;
    for (int s = 0; s < num_stages; ++s)
      sol.stages.push_back(Stage{(*bounds)[s], (*bounds)[s + 1], replicas[s], false});
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
