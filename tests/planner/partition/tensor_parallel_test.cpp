// Tensor-parallel stages in the numeric problem: evaluate()'s figures by hand
// from Note [tensor parallel stages], the placement rules, the baselines with
// a pinned degree. (The DP against exhaustive search with degrees searched:
// solver_test's random instances, a third of them with tensor parallelism.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <sstream>

#include "planner/partition/coarsen.h"
#include "planner/partition/evaluate.h"
#include "planner/partition/solve.h"

namespace rannc::partition {
namespace {

std::string str(const Solution &s) {
  std::ostringstream os;
  s.print(os);
  return os.str();
}

double relDiff(double a, double b) { return std::fabs(a - b) / std::max({std::fabs(a), std::fabs(b), 1e-300}); }

/// One block: fwd 4 s/sample (3 of it split), bwd 8 (6 split), 100 parameter
/// bytes (80 sharded), 50 activation bytes/sample (40 split), working 10
/// B/sample (6 split), 2 collectives of 20 B/sample a pass; one node of 8
/// devices, intra-node 100 B/s + 0.5 s, Adam (optimizer state 2x).
Problem oneBlock() {
  Problem p;
  Block b;
  b.fwd.per_sample_s = 4;
  b.bwd.per_sample_s = 8;
  b.param_bytes = 100;
  b.activation_bytes_per_sample = 50;
  b.working_bytes_per_sample = 10;
  b.tp.fwd.per_sample_s = 3;
  b.tp.bwd.per_sample_s = 6;
  b.tp.param_bytes = 80;
  b.tp.activation_bytes_per_sample = 40;
  b.tp.working_bytes_per_sample = 6;
  b.tp.collective_bytes_per_sample = 20;
  b.tp.collectives = 2;
  p.blocks = {b};
  p.cut_bytes_per_sample = {0, 0};
  p.batch_size = 8;
  p.devices.count = 8;
  p.devices.per_node = 8;
  p.devices.memory_bytes = 1e6;
  p.devices.intra_node = {100, 0.5};
  p.devices.inter_node = {10, 1};
  p.optimizer_bytes_per_param_byte = 2;
  p.tp_degrees = {1, 2, 4, 8};
  return p;
}

TEST(TensorParallel, EvaluateMatchesTheFormulaByHand) {
  // Two replicas of degree 4 on ranks 0..7, M = 1: b = 8 / 2 = 4 samples,
  // keep = 1 - 1/4 = 0.75.
  Problem p = oneBlock();
  Solution sol;
  sol.stages = {Stage{0, 1, 2, false, false, 4}};
  const Evaluation ev = evaluate(p, sol);
  ASSERT_TRUE(ev.feasible()) << ev.violations.front();
  ASSERT_EQ(ev.stages.size(), 1u);
  const StageCost &c = ev.stages[0];
  EXPECT_EQ(sol.devicesUsed(), 8);
  EXPECT_EQ(c.samples, 4);
  EXPECT_DOUBLE_EQ(c.fwd_s, 16 - 0.75 * 12); // 4*4 - 0.75*3*4 = 7
  EXPECT_DOUBLE_EQ(c.bwd_s, 32 - 0.75 * 24); // 14
  // 2 latencies of 0.5 + 2*(3/4) * 20*4 B / 100 B/s = 1 + 1.2 = 2.2
  EXPECT_DOUBLE_EQ(c.tp_collective_s, 2.2);
  EXPECT_DOUBLE_EQ(c.forwardSlot(), 9.2);
  EXPECT_DOUBLE_EQ(c.backwardSlot(), 16.2);
  // Per device 100 - 0.75*80 = 40 parameter bytes; the all-reduce over the 2
  // replicas holding the same shard, inside the node: 2*(1/2)*40/100 + 2*1*0.5 = 1.4.
  EXPECT_DOUBLE_EQ(c.param_bytes, 40);
  EXPECT_DOUBLE_EQ(c.allreduce_s, 1.4);
  EXPECT_DOUBLE_EQ(c.memory.params, 40);
  EXPECT_DOUBLE_EQ(c.memory.grads, 40);
  EXPECT_DOUBLE_EQ(c.memory.optimizer, 80);
  EXPECT_DOUBLE_EQ(c.memory.activations, 4 * (50 - 30)); // k = 1, b = 4
  EXPECT_DOUBLE_EQ(c.memory.working, 4 * (10 - 4.5));
  EXPECT_DOUBLE_EQ(ev.peak_memory_bytes, 40 + 40 + 80 + 80 + 22);
  // One stage, M = 1: F + G + the all-reduce = 9.2 + 16.2 + 1.4.
  EXPECT_DOUBLE_EQ(ev.step_time_s, 26.8);

  // Recomputation repeats the forward with its collectives: 7 + 2.2.
  sol.stages[0].recompute = true;
  EXPECT_DOUBLE_EQ(evaluate(p, sol).stages[0].recompute_s, 9.2);
  // Degree 1 is the plain stage: 8 replicas of b = 1.
  Solution plain;
  plain.stages = {Stage{0, 1, 8}};
  const StageCost d1 = evaluate(p, plain).stages[0];
  EXPECT_DOUBLE_EQ(d1.fwd_s, 4);
  EXPECT_DOUBLE_EQ(d1.tp_collective_s, 0);
  EXPECT_DOUBLE_EQ(d1.param_bytes, 100);
}

TEST(TensorParallel, ScatterGatherAcrossNodes) {
  // Note [scatter/gather transfers]: two stages of degree 4 on two nodes of 4,
  // M = 1 (b = 8), 40 bytes/sample crossing: 320 bytes each way.
  Problem p = oneBlock();
  p.blocks.push_back(p.blocks[0]);
  p.cut_bytes_per_sample = {0, 40, 0};
  p.devices.per_node = 4;
  p.tp_degrees = {1, 2, 4};
  Solution sol;
  sol.stages = {Stage{0, 1, 1, false, false, 4}, Stage{1, 2, 1, false, false, 4}};
  // Sent whole: 1 s + 320 B / 10 B/s.
  EXPECT_DOUBLE_EQ(evaluate(p, sol).stages[1].recv_activations_s, 33);
  // Scattered: 1 + 320 / (4 x 10) over the network, then 0.5 + 3/4 x 320 / 100 gathered inside the node.
  p.devices.scatter_gather = true;
  const Evaluation ev = evaluate(p, sol);
  EXPECT_DOUBLE_EQ(ev.stages[1].recv_activations_s, 11.9);
  EXPECT_DOUBLE_EQ(ev.stages[0].recv_gradients_s, 11.9);
  // Degree 1 sends whole values as before; so does a transfer inside a node.
  Solution plain;
  plain.stages = {Stage{0, 1, 4}, Stage{1, 2, 4}};
  EXPECT_DOUBLE_EQ(evaluate(p, plain).stages[1].recv_activations_s, 1 + 40 * 2 / 10.0);
  EXPECT_DOUBLE_EQ(receiveTime(p.devices, p.devices.intra_node, true, 320, 4), 0.5 + 320 / 100.0);
}

TEST(TensorParallel, EvaluateRefusesInvalidDegreesAndPlacements) {
  Problem p = oneBlock();
  auto violation = [&](const Solution &s) {
    const Evaluation ev = evaluate(p, s);
    return ev.violations.empty() ? std::string() : ev.violations.front();
  };
  Solution sol;
  sol.stages = {Stage{0, 1, 1, false, false, 3}}; // 3 does not divide the cut sizes
  EXPECT_NE(violation(sol).find("not one the model allows"), std::string::npos) << violation(sol);
  p.devices.per_node = 4;
  p.tp_degrees = {1, 2, 4};
  sol.stages = {Stage{0, 1, 1, false, false, 8}};
  EXPECT_NE(violation(sol).find("not one the model allows"), std::string::npos) << violation(sol);
  // Two stages: [0,1) on rank 0..1 (degree 2), [1,2) degree 4 from rank 2
  // straddles the node boundary between ranks 3 and 4.
  p.blocks.push_back(p.blocks[0]);
  p.cut_bytes_per_sample = {0, 0, 0};
  sol.stages = {Stage{0, 1, 1, false, false, 2}, Stage{1, 2, 1, false, false, 4}};
  EXPECT_NE(violation(sol).find("across a node boundary"), std::string::npos) << violation(sol);
  sol.stages = {Stage{0, 1, 1, false, false, 4}, Stage{1, 2, 1, false, false, 4}};
  EXPECT_EQ(violation(sol), "");
  // A cut whose values are split may not border a stage of degree > 1.
  p.cut_whole = {true, false, true};
  EXPECT_NE(violation(sol).find("split or partial"), std::string::npos) << violation(sol);
  sol.stages = {Stage{0, 1, 1}, Stage{1, 2, 1}};
  EXPECT_EQ(violation(sol), "");
  sol.stages = {Stage{0, 2, 1, false, false, 4}};
  EXPECT_EQ(violation(sol), "");
}

TEST(TensorParallel, GroupsInsideNodesMatchesTheLoop) {
  for (int per_node : {1, 2, 3, 4, 6, 8})
    for (int size = 1; size <= 8; ++size)
      for (int first = 0; first < 20; ++first)
        for (int groups = 0; groups <= 6; ++groups) {
          Devices d;
          d.per_node = per_node;
          bool inside = size <= per_node || groups == 0 || size == 1;
          for (int g = 0; g < groups && inside; ++g)
            inside = (first + g * size) / per_node == (first + g * size + size - 1) / per_node;
          EXPECT_EQ(d.groupsInsideNodes(first, groups, size), inside)
              << "per_node " << per_node << " size " << size << " first " << first << " groups " << groups;
        }
}

TEST(TensorParallel, DPSplitsALayerThatDoesNotFitOneDevice) {
  // The block's state needs 100*(2+2) = 400 B whole; a device holds 250. At
  // degree 2 it needs (100 - 40)*4 = 240 + activations 1*(50-20) = 270 > 250;
  // at degree 4: 40*4 + 20 + working (10 - 4.5) = 185.5 fits; at 8: 30*4 + ... fits too.
  Problem p = oneBlock();
  p.batch_size = 1;
  p.devices.memory_bytes = 250;
  auto dp = solveDP(p);
  ASSERT_TRUE(dp.ok()) << dp.error().message;
  ASSERT_EQ(dp->solution.numStages(), 1);
  EXPECT_GE(dp->solution.stages[0].tensor_parallel, 4) << str(dp->solution);
  auto ex = solveExhaustive(p);
  ASSERT_TRUE(ex.ok());
  EXPECT_LT(relDiff(dp->step_time_s, ex->step_time_s), 1e-12);
  EXPECT_DOUBLE_EQ(evaluate(p, dp->solution).step_time_s, dp->step_time_s);
  // Without tensor parallelism nothing fits.
  p.tp_degrees.clear();
  EXPECT_FALSE(solveDP(p).ok());
  // Pinned, every stage takes the degree: --tensor-parallel 2 does not fit, 8 does.
  p.tp_degrees = {1, 2, 4, 8};
  p.constraints.tensor_parallel = {2};
  EXPECT_FALSE(solveDP(p).ok());
  p.constraints.tensor_parallel = {8};
  auto eight = solveDP(p);
  ASSERT_TRUE(eight.ok()) << eight.error().message;
  EXPECT_EQ(str(eight->solution), "1f1b M=1 [0,1)x1t8");
}

TEST(TensorParallel, CoarseningWithAPinnedDegreeCutsOnlyWhereStagesMayBorder) {
  // Nine equal units in layers of three: only the cuts at 3 and 6 are whole.
  // Into two blocks, balance alone cuts at 4 or 5, inside a layer, where no
  // stage of the pinned degree 2 may border, and all nine units in one stage
  // do not fit (Note [whole cuts in coarsening]).
  Problem p = oneBlock();
  p.blocks.assign(9, p.blocks[0]);
  p.cut_bytes_per_sample.assign(10, 1);
  p.cut_whole = {true, false, false, true, false, false, true, false, false, true};
  p.batch_size = 1;
  p.devices.memory_bytes = 1800; // six units at degree 2: 6 x 60 x 4 = 1440 B of state
  p.constraints.tensor_parallel = {2};
  ASSERT_TRUE(solveDP(p).ok());
  auto c = coarsen(p, CoarsenOptions{2});
  ASSERT_TRUE(c.ok()) << c.error().message;
  ASSERT_EQ(c->unit_begin.size(), 3u);
  EXPECT_TRUE(c->unit_begin[1] == 3 || c->unit_begin[1] == 6) << c->unit_begin[1];
  auto dp = solveDP(c->problem);
  ASSERT_TRUE(dp.ok()) << dp.error().message;
  EXPECT_TRUE(evaluate(p, expandToUnits(*c, dp->solution)).feasible());
  // Degree 1 searched too: three whole pieces are more than two blocks, so
  // the blocks still cut only at whole cuts (a degree-2 stage may border each).
  p.constraints.tensor_parallel.clear();
  auto mixed = coarsen(p, CoarsenOptions{2});
  ASSERT_TRUE(mixed.ok());
  EXPECT_TRUE(mixed->unit_begin[1] == 3 || mixed->unit_begin[1] == 6) << mixed->unit_begin[1];
  // Into five blocks: fewer whole pieces (3) than blocks, so both whole cuts
  // are boundaries and the other two boundaries fall inside layers for balance.
  auto five = coarsen(p, CoarsenOptions{5});
  ASSERT_TRUE(five.ok());
  ASSERT_EQ(five->unit_begin.size(), 6u);
  EXPECT_EQ(std::count(five->unit_begin.begin(), five->unit_begin.end(), 3), 1);
  EXPECT_EQ(std::count(five->unit_begin.begin(), five->unit_begin.end(), 6), 1);
  // Only degree 1 searched: balance alone, as before tensor parallelism.
  p.tp_degrees.clear();
  auto plain = coarsen(p, CoarsenOptions{2});
  ASSERT_TRUE(plain.ok());
  EXPECT_TRUE(plain->unit_begin[1] == 4 || plain->unit_begin[1] == 5) << plain->unit_begin[1];
}

TEST(TensorParallel, NoPlanMessageWidensAPinnedStageToWholeCuts) {
  // With degree 2 pinned a stage holding unit 1 spans units 0..2; the error
  // names that stage and its memory, not an infinite need of unit 0 alone.
  Problem p = oneBlock();
  p.blocks.assign(3, p.blocks[0]);
  p.cut_bytes_per_sample.assign(4, 1);
  p.cut_whole = {true, false, false, true};
  p.batch_size = 1;
  p.devices.memory_bytes = 100;
  p.constraints.tensor_parallel = {2};
  auto dp = solveDP(p);
  ASSERT_FALSE(dp.ok());
  EXPECT_NE(dp.error().message.find("blocks 0..2"), std::string::npos) << dp.error().message;
  EXPECT_NE(dp.error().message.find("tensor-parallel 2"), std::string::npos) << dp.error().message;
  EXPECT_EQ(dp.error().message.find("inf "), std::string::npos) << dp.error().message;
}

TEST(TensorParallel, BaselinesKeepAPinnedDegreeAndWholeCuts) {
  // Four equal blocks; only the cut before block 2 is whole. Pinned degree 2
  // on 8 devices of one node: the baselines cut only there.
  Problem p = oneBlock();
  p.blocks.assign(4, p.blocks[0]);
  p.cut_bytes_per_sample.assign(5, 1);
  p.cut_whole = {true, false, true, false, true};
  p.constraints.tensor_parallel = {2};
  p.constraints.stages = 2;
  for (Strategy s : {Strategy::Uniform, Strategy::Parameters, Strategy::Time}) {
    auto base = solveBaseline(p, s);
    ASSERT_TRUE(base.ok()) << strategyName(s) << ": " << base.error().message;
    ASSERT_EQ(base->solution.numStages(), 2);
    EXPECT_EQ(base->solution.stages[0].block_end, 2) << str(base->solution);
    for (const Stage &st : base->solution.stages) EXPECT_EQ(st.tensor_parallel, 2);
    EXPECT_TRUE(evaluate(p, base->solution).feasible());
    auto dp = solveDP(p);
    ASSERT_TRUE(dp.ok());
    EXPECT_LE(dp->step_time_s, base->step_time_s * (1 + 1e-12));
  }
  // Per-stage degrees fix the stage count.
  p.constraints.stages = 0;
  p.constraints.tensor_parallel = {4, 2};
  auto dp = solveDP(p);
  ASSERT_TRUE(dp.ok()) << dp.error().message;
  ASSERT_EQ(dp->solution.numStages(), 2);
  EXPECT_EQ(dp->solution.stages[0].tensor_parallel, 4);
  EXPECT_EQ(dp->solution.stages[1].tensor_parallel, 2);
  auto base = solveBaseline(p, Strategy::Uniform);
  ASSERT_TRUE(base.ok()) << base.error().message;
  EXPECT_EQ(base->solution.stages[0].tensor_parallel, 4);
}

} // namespace
} // namespace rannc::partition
