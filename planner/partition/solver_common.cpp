#include "planner/partition/solver_common.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <string>

#include "planner/partition/evaluate.h"

namespace rannc::partition::detail {

std::vector<Schedule> schedulesToSearch(const Problem &p) {
  if (p.constraints.schedule) return {*p.constraints.schedule};
  // A split backward is run only when pinned (Note [zero bubble H1]), and so
  // are interleaved chunks (Note [interleaved layouts] in dp.cpp): the DP does not search them.
  std::vector<Schedule> out;
  for (Schedule s : pipeline::kSchedules)
    if (!pipeline::splitsBackward(s) && !pipeline::interleaves(s)) out.push_back(s);
  return out;
}

std::vector<int> stageCountsToSearch(const Problem &p) {
  const Constraints &c = p.constraints;
  if (c.replicas.size() > 1) return {static_cast<int>(c.replicas.size())};
  if (c.tensor_parallel.size() > 1) return {static_cast<int>(c.tensor_parallel.size())};
  if (c.stages > 0) return {c.stages};
  std::vector<int> out;
  for (int s = 1; s <= std::min(p.numBlocks(), p.devices.count); ++s) out.push_back(s);
  return out;
}

std::vector<int> deviceQuanta(const Problem &p, int only) {
  const Constraints &c = p.constraints;
  // Note [device quantum]: a pinned stage's width, its replicas times its
  // pinned degree (1 where the degree is the search's: then any degree keeps
  // a width of q replicas a multiple of q), must be a multiple of q.
  auto usable = [&](int q) {
    if (c.power_of_two_replicas && (q & (q - 1)) != 0) return false;
    const size_t n = c.replicas.empty() ? 0 : std::max(c.replicas.size(), c.tensor_parallel.size());
    for (size_t i = 0; i < n; ++i) {
      const int r = c.replicas[std::min(i, c.replicas.size() - 1)];
      const int t = c.tensor_parallel.empty() ? 1 : c.tensor_parallel[std::min(i, c.tensor_parallel.size() - 1)];
      if ((r * t) % q != 0) return false;
    }
    return true;
  };
  if (only > 0) return {usable(only) ? only : 1};
  std::vector<int> out;
  const int node = std::max(1, p.devices.per_node);
  for (int q = 1; q < node && q <= p.devices.count; q *= 2)
    if (usable(q)) out.push_back(q);
  for (int q = node; q <= p.devices.count; q *= 2)
    if (usable(q)) out.push_back(q);
  if (out.empty()) out.push_back(1);
  return out;
}

Error noFeasiblePlan(const Problem &p) {
  // The least memory any stage containing block j can need: j alone (with a
  // tensor-parallel degree above 1, widened to the nearest whole cuts, Note
  // [tensor parallel stages]), as the last stage (fewest micro-batches in
  // flight), over every searched micro-batch count, replica count,
  // tensor-parallel degree and recomputation choice.
  const double cap = p.devices.capacity();
  double worst_need = -1;
  int worst_block = 0;
  Stage worst_stage;
  int worst_m = 1;
  for (int j = 0; j < p.numBlocks(); ++j) {
    double need = std::numeric_limits<double>::infinity();
    Stage best;
    int best_m = 1;
    for (int m : microbatchCandidates(p))
      for (Schedule sched : schedulesToSearch(p))
        for (int r : replicaCandidates(p, m))
          for (int tp : tpCandidates(p))
          for (int choice = 0; choice < 4; ++choice) {
            const bool rec = choice & 1, zero = choice & 2;
            if (!p.recomputeAllowed(rec) || !p.zeroAllowed(zero, r)) continue;
            Stage st{j, j + 1, r, rec, zero, tp};
            if (tp > 1) { // a tensor-parallel stage borders whole cuts only
              while (st.block_begin > 0 && !p.cutWhole(st.block_begin)) --st.block_begin;
              while (st.block_end < p.numBlocks() && !p.cutWhole(st.block_end)) ++st.block_end;
            }
            if (!tensorParallelProblem(p, st, 0).empty()) continue;
            double mem = evaluateStage(p, st, 0, 1, 0, m, sched).memory.total();
            if (mem < need) {
              need = mem;
              best = st;
              best_m = m;
            }
          }
    if (need > worst_need) {
      worst_need = need;
      worst_block = j;
      worst_stage = best;
      worst_m = best_m;
    }
  }
  auto stageBlocks = [&](int j) {
    if (worst_stage.block_end - worst_stage.block_begin <= 1) return "block " + std::to_string(j) + " alone";
    return "blocks " + std::to_string(worst_stage.block_begin) + ".." + std::to_string(worst_stage.block_end - 1) +
           ", the fewest around block " + std::to_string(j) + " between whole cuts";
  };
  const std::string devices = std::to_string(p.devices.count) + " devices of " + formatBytes(p.devices.memory_bytes);
  char margin[32];
  std::snprintf(margin, sizeof margin, "%g", p.devices.memory_margin);
  if (worst_need > cap)
    return Error{"no plan fits in memory: the smallest stage (" + stageBlocks(worst_block) + ", " +
                 std::to_string(worst_stage.replicas) + " replicas, " +
                 (worst_stage.tensor_parallel > 1 ? "tensor-parallel " + std::to_string(worst_stage.tensor_parallel) + ", " : "") +
                 std::to_string(worst_m) + " micro-batches" +
                 (worst_stage.recompute ? ", recomputing" : "") + (worst_stage.zero ? ", sharding the optimizer state" : "") + ") needs " + formatBytes(worst_need) +
                 " but a device holds " + formatBytes(cap) + " (" + formatBytes(p.devices.memory_bytes) + " x (1 - " +
                 margin + ")" + (p.devices.reserve_bytes > 0 ? " - " + formatBytes(p.devices.reserve_bytes) + " runtime reserve" : "") + ")"};
  return Error{"no plan fits on " + devices + " with these constraints: every block fits in a stage of its own (the "
               "largest smallest stage, block " + std::to_string(worst_block) + ", needs " + formatBytes(worst_need) +
               " of " + formatBytes(cap) + ") but not enough stages fit on the devices together"};
}

} // namespace rannc::partition::detail
