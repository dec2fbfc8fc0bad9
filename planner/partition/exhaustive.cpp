// Exhaustive search over the DP's search space, scored by evaluate() alone:
// the reference the DP is tested against.
#include <chrono>
#include <functional>
#include <limits>

#include "planner/partition/evaluate.h"
#include "planner/partition/solve.h"
#include "planner/partition/solver_common.h"

namespace rannc::partition {

Expected<SolveResult> solveExhaustive(const Problem &p, int64_t max_solutions) {
  const auto start = std::chrono::steady_clock::now();
  if (Status st = validate(p); !st) return Error{st.message()};
  if (p.constraints.virtual_stages > 1) // Note [interleaved layouts] in dp.cpp
    return Error{"only the DP (--strategy auto) lays out interleaved chunks"};
  const int n = p.numBlocks();
  SolveResult result;
  result.step_time_s = std::numeric_limits<double>::infinity();
  bool found = false, too_many = false;
  const std::vector<int> *per_stage = p.constraints.replicas.size() > 1 ? &p.constraints.replicas : nullptr;
  const std::vector<int> *per_stage_tp =
      p.constraints.tensor_parallel.size() > 1 ? &p.constraints.tensor_parallel : nullptr;
  const std::vector<int> degrees = tpCandidates(p);

  for (int m : microbatchCandidates(p)) {
    const std::vector<int> replicas = replicaCandidates(p, m);
    ++result.stats.microbatch_counts;
    for (Schedule sched : detail::schedulesToSearch(p))
      for (int num_stages : detail::stageCountsToSearch(p)) {
        Solution sol;
        sol.microbatches = m;
        sol.schedule = sched;
        // Places stage s from block a on rank `rank` onwards. A stage that
        // cannot fit is skipped right away: no completion could make it fit.
        std::function<void(int, int, int)> place = [&](int s, int a, int rank) {
          if (too_many) return;
          if (s == num_stages) {
            if (++result.stats.solutions > max_solutions) {
              too_many = true;
              return;
            }
            Evaluation ev = evaluate(p, sol);
            if (ev.feasible() && ev.step_time_s < result.step_time_s) {
              result.step_time_s = ev.step_time_s;
              result.solution = sol;
              found = true;
            }
            return;
          }
          const int last_end = s == num_stages - 1 ? n : n - (num_stages - s - 1);
          for (int e = (s == num_stages - 1 ? n : a + 1); e <= last_end; ++e)
            for (int r : replicas)
              for (int tp : degrees) {
                if (per_stage && (*per_stage)[s] != r) continue;
                if (per_stage_tp && (*per_stage_tp)[s] != tp) continue;
                if (rank + r * tp + (num_stages - s - 1) > p.devices.count) continue;
                for (bool rec : {false, true})
                  for (bool zero : {false, true}) {
                    if (!p.recomputeAllowed(rec) || !p.zeroAllowed(zero, r)) continue;
                    Stage st{a, e, r, rec, zero, tp};
                    if (!tensorParallelProblem(p, st, rank).empty()) continue; // evaluate() would refuse it
                    StageCost c = evaluateStage(p, st, s, num_stages, rank, m, sched);
                    if (c.memory.total() > p.devices.capacity()) continue;
                    sol.stages.push_back(st);
                    place(s + 1, e, rank + r * tp);
                    sol.stages.pop_back();
                  }
              }
        };
        place(0, 0, 0);
      }
  }
  result.stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (too_many)
    return Error{"exhaustive search gave up after " + std::to_string(max_solutions) + " solutions; use solveDP"};
  if (!found) return detail::noFeasiblePlan(p);
  return result;
}

} // namespace rannc::partition
