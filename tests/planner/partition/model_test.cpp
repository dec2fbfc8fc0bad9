// The cost model (evaluate) on a hand-computed case, and the discrete-event
// simulator against evaluate()'s closed form.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <sstream>

#include "planner/partition/evaluate.h"
#include "planner/partition/simulate.h"

namespace rannc::partition {
namespace {

/// Three blocks on 4 devices, 2 per node; every term of the model is non-zero.
Problem handProblem() {
  Problem p;
  auto blk = [](Affine f, Affine b, double params, double act, double work) {
    Block x;
    x.fwd = f, x.bwd = b, x.param_bytes = params, x.activation_bytes_per_sample = act,
    x.working_bytes_per_sample = work;
    return x;
  };
  p.blocks = {blk({0.1, 0.01}, {0.2, 0.02}, 1000, 10, 5), blk({0, 0.02}, {0, 0.04}, 2000, 20, 8),
              blk({0.05, 0}, {0.1, 0}, 500, 4, 2)};
  p.cut_bytes_per_sample = {6, 3, 7, 0};
  p.batch_size = 16;
  p.devices.count = 4;
  p.devices.per_node = 2;
  p.devices.memory_bytes = 100000;
  p.devices.intra_node = {1000, 0.001};
  p.devices.inter_node = {100, 0.01};
  p.optimizer_bytes_per_param_byte = 2;
  return p;
}

/// Stage 0 = blocks [0,2) on ranks 0-1 (node 0), recomputing; stage 1 = block 2 on rank 2 (node 1).
Solution handSolution(Schedule sched) {
  Solution s;
  s.stages = {Stage{0, 2, 2, true}, Stage{2, 3, 1, false}};
  s.microbatches = 4;
  s.schedule = sched;
  return s;
}

TEST(Evaluate, HandComputedTimeAndMemory) {
  Problem p = handProblem();
  Evaluation ev = evaluate(p, handSolution(Schedule::OneFOneB));
  ASSERT_TRUE(ev.feasible()) << ev.violations.front();
  ASSERT_EQ(ev.stages.size(), 2u);
  const StageCost &s0 = ev.stages[0], &s1 = ev.stages[1];
  // b = ceil(16 / (4 * 2)) = 2 on stage 0, ceil(16 / 4) = 4 on stage 1.
  EXPECT_EQ(s0.samples, 2);
  EXPECT_EQ(s1.samples, 4);
  // Stage 0: fwd (0.1 + 0.01*2) + 0.02*2 = 0.16; bwd (0.2 + 0.04) + 0.08 = 0.32; recompute 0.16.
  EXPECT_NEAR(s0.fwd_s, 0.16, 1e-12);
  EXPECT_NEAR(s0.bwd_s, 0.32, 1e-12);
  EXPECT_NEAR(s0.recompute_s, 0.16, 1e-12);
  // Output gradients come from rank 2 (node 1): inter-node, 0.01 + 7*2/100 = 0.15.
  EXPECT_FALSE(s0.send_intra_node);
  EXPECT_NEAR(s0.recv_gradients_s, 0.15, 1e-12);
  EXPECT_EQ(s0.recv_activations_s, 0);
  // All-reduce inside node 0: 2*(1/2)*3000/1000 + 2*1*0.001 = 3.002.
  EXPECT_TRUE(s0.allreduce_intra_node);
  EXPECT_NEAR(s0.allreduce_s, 3.002, 1e-12);
  // Stage 1 receives from rank 1 (node 0): 0.01 + 7*4/100 = 0.29; fwd 0.05, bwd 0.1.
  EXPECT_FALSE(s1.recv_intra_node);
  EXPECT_NEAR(s1.recv_activations_s, 0.29, 1e-12);
  EXPECT_EQ(s1.recv_gradients_s, 0);
  EXPECT_EQ(s1.allreduce_s, 0);
  // Slots: F0 = 0.16, G0 = 0.15+0.16+0.32 = 0.63; F1 = 0.34, G1 = 0.1.
  // 1F1B: (0.79 + 0.44) + 3 * 0.79 + 3.002 = 1.23 + 2.37 + 3.002 = 6.602.
  EXPECT_NEAR(ev.fill_drain_s, 1.23, 1e-12);
  EXPECT_NEAR(ev.steady_s, 2.37, 1e-12);
  EXPECT_NEAR(ev.allreduce_s, 3.002, 1e-12);
  EXPECT_NEAR(ev.step_time_s, 6.602, 1e-12);
  EXPECT_EQ(ev.bottleneck_stage, 0);
  // Memory, stage 0: 3000 + 3000 + 2*3000 = 12000 static; one micro-batch
  // rebuilt (2*30 = 60, its sent values among them); the stash keeps 1F1B's
  // min(4, 2) = 2 micro-batches of inputs (2*2*6 = 24; Note [recomputing
  // stage's peak]); working 2*max(5,8) = 16; no model buffers, and transfers
  // hold nothing of their own. 12000+60+24+16 = 12100.
  EXPECT_EQ(s0.inflight, 2);
  EXPECT_EQ(s0.memory.optimizer, 6000);
  EXPECT_EQ(s0.memory.activations, 60);
  EXPECT_EQ(s0.memory.stash, 24);
  EXPECT_EQ(s0.memory.working, 16);
  EXPECT_EQ(s0.memory.buffers, 0);
  EXPECT_EQ(s0.memory.total(), 12100);
  // Recomputation saves what keeping every value would cost: 2*2*(6+30) = 144, less 60+24.
  EXPECT_EQ(s0.recompute_saves_bytes, 144 - 84);
  // Stage 1: 500+500+1000 = 2000; keeps 1: 4*(7+4) = 44; working 4*2 = 8 -> 2052.
  EXPECT_EQ(s1.inflight, 1);
  EXPECT_EQ(s1.memory.stash, 0);
  EXPECT_EQ(s1.memory.total(), 2052);
  EXPECT_EQ(ev.peak_memory_bytes, 12100);

  // GPipe keeps all 4 micro-batches: stage 1 activations 4*4*11 = 176, and
  // T = (0.16+0.34) + (0.63+0.1) + 3*(0.34+0.63) + 3.002 = 0.5+0.73+2.91+3.002 = 7.142.
  Evaluation g = evaluate(p, handSolution(Schedule::GPipe));
  EXPECT_EQ(g.stages[1].memory.activations, 176);
  EXPECT_EQ(g.stages[0].memory.activations, 60);
  EXPECT_EQ(g.stages[0].memory.stash, 4 * 2 * 6);
  EXPECT_NEAR(g.step_time_s, 7.142, 1e-12);
}

TEST(Evaluate, ChargesSynchronisedBatchStatisticsOverReplicas) {
  // --batchnorm exact (Note [partition cost model]): block 0 all-reduces 20 B
  // in 2 collectives a pass, block 1 30 B in 4, block 2 10 B in 2.
  Problem p = handProblem();
  p.blocks[0].stat_sync_bytes = 20, p.blocks[0].stat_sync_collectives = 2;
  p.blocks[1].stat_sync_bytes = 30, p.blocks[1].stat_sync_collectives = 4;
  p.blocks[2].stat_sync_bytes = 10, p.blocks[2].stat_sync_collectives = 2;
  const Evaluation ev = evaluate(p, handSolution(Schedule::OneFOneB));
  ASSERT_TRUE(ev.feasible()) << ev.violations.front();
  const StageCost &s0 = ev.stages[0], &s1 = ev.stages[1];
  // Stage 0, 2 replicas in node 0: 2*(1/2)*50/1000 + 6 collectives * 2*1 * 0.001 = 0.05 + 0.012.
  EXPECT_NEAR(s0.stat_sync_s, 0.062, 1e-12);
  // In both slots and in the recomputed forward: F0 = 0.16 + 0.062, G0 = 0.15 + (0.16+0.062) + 0.32 + 0.062.
  EXPECT_NEAR(s0.forwardSlot(), 0.222, 1e-12);
  EXPECT_NEAR(s0.recompute_s, 0.222, 1e-12);
  EXPECT_NEAR(s0.backwardSlot(), 0.754, 1e-12);
  // Stage 1 has one replica: its statistics need no all-reduce.
  EXPECT_EQ(s1.stat_sync_s, 0);
  // 1F1B: (0.976 + 0.44) + 3 * 0.976 + 3.002 = 7.346, 0.744 above the unsynchronised 6.602.
  EXPECT_NEAR(ev.step_time_s, 7.346, 1e-12);
}

TEST(Evaluate, ReportsEveryViolation) {
  Problem p = handProblem();
  p.devices.memory_bytes = 12099; // one byte short for stage 0
  p.allow_recompute = false;
  Evaluation ev = evaluate(p, handSolution(Schedule::OneFOneB));
  EXPECT_TRUE(ev.well_formed);
  ASSERT_EQ(ev.violations.size(), 2u);
  EXPECT_EQ(ev.violations[0], "stage 0 recomputes but recomputation is not allowed");
  EXPECT_NE(ev.violations[1].find("stage 0 needs 11.82 KiB"), std::string::npos) << ev.violations[1];
  EXPECT_NE(ev.violations[1].find("but a device holds 11.82 KiB"), std::string::npos) << ev.violations[1];

  Solution bad = handSolution(Schedule::OneFOneB);
  bad.stages[1].block_begin = 1; // overlaps stage 0
  bad.stages[1].replicas = 3;    // 2 + 3 > 4 devices
  bad.microbatches = 17;
  ev = evaluate(handProblem(), bad);
  EXPECT_FALSE(ev.well_formed);
  EXPECT_TRUE(std::isinf(ev.step_time_s));
  EXPECT_EQ(ev.violations.size(), 3u);

  Solution many = handSolution(Schedule::OneFOneB);
  many.microbatches = 16;
  many.stages[0].replicas = 2; // one sample per micro-batch, two replicas
  ev = evaluate(handProblem(), many);
  ASSERT_EQ(ev.violations.size(), 1u);
  EXPECT_EQ(ev.violations[0], "stage 0 has 2 replicas but a micro-batch has only 1 samples");
}

TEST(Evaluate, RingAllReduceAcrossNodesUsesEveryDevicesNetworkShare) {
  // Note [ring all-reduce bandwidth]: 8 devices to a node, NVLink 300, one
  // device's network share 25 (GB/s, say).
  Devices d;
  d.count = 64;
  d.per_node = 8;
  d.intra_node = {300, 0};
  d.inter_node = {25, 0};
  EXPECT_EQ(d.allReduceBandwidth(0, 8), 300);   // one node: NVLink
  EXPECT_EQ(d.allReduceBandwidth(8, 4), 300);
  EXPECT_EQ(d.allReduceBandwidth(0, 32), 200);  // whole nodes: 8 interfaces per node
  EXPECT_EQ(d.allReduceBandwidth(4, 8), 100);   // 4 + 4: the fewest in a node sets it
  EXPECT_EQ(d.allReduceBandwidth(6, 10), 50);   // 2 + 8
  EXPECT_EQ(d.allReduceBandwidth(3, 4, 8), 25); // one device per node (tensor-parallel groups of 8)
  EXPECT_EQ(d.allReduceBandwidth(0, 8, 2), 100);
  d.inter_node = {50, 0};
  EXPECT_EQ(d.allReduceBandwidth(0, 16), 300); // never faster than the ring's NVLink hops
  // evaluate() charges a stage's data-parallel all-reduce so: 32 replicas of
  // one block over 4 whole nodes, 1000 bytes of parameters.
  Problem p;
  Block blk;
  blk.fwd = {0.1, 0}, blk.bwd = {0.2, 0}, blk.param_bytes = 1000;
  p.blocks = {blk};
  p.cut_bytes_per_sample = {0, 0};
  p.batch_size = 32;
  p.devices = d;
  p.devices.count = 32;
  p.devices.inter_node = {25, 0};
  p.devices.memory_bytes = 1e9;
  Solution s;
  s.stages = {Stage{0, 1, 32, false}};
  s.microbatches = 1;
  const Evaluation ev = evaluate(p, s);
  ASSERT_EQ(ev.stages.size(), 1u);
  EXPECT_DOUBLE_EQ(ev.stages[0].allreduce_s, 2.0 * 31 / 32 * 1000 / 200);
}

TEST(Evaluate, RuntimeReserveComesOffTheCapacity) {
  // Stage 0 of the hand solution needs 12100 bytes (HandComputedTimeAndMemory).
  // 20000 x (1 - 0.25) = 15000 fits it; less a 3000-byte runtime reserve,
  // 12000 does not: the reserve lowers the capacity, not the stage's total.
  Problem p = handProblem();
  p.devices.memory_bytes = 20000;
  p.devices.memory_margin = 0.25;
  Evaluation ev = evaluate(p, handSolution(Schedule::OneFOneB));
  EXPECT_TRUE(ev.feasible());
  EXPECT_DOUBLE_EQ(ev.capacity_bytes, 15000);
  p.devices.reserve_bytes = 3000;
  ev = evaluate(p, handSolution(Schedule::OneFOneB));
  EXPECT_DOUBLE_EQ(ev.capacity_bytes, 12000);
  EXPECT_DOUBLE_EQ(ev.peak_memory_bytes, 12100);
  ASSERT_EQ(ev.violations.size(), 1u);
  EXPECT_NE(ev.violations[0].find("stage 0 needs"), std::string::npos) << ev.violations[0];
  // 12100 + 3000 = 15100 <= 20000 x (1 - 0.24) = 15200: feasible again.
  p.devices.memory_margin = 0.24;
  EXPECT_TRUE(evaluate(p, handSolution(Schedule::OneFOneB)).feasible());
  // A reserve that leaves nothing is a malformed problem.
  p.devices.reserve_bytes = 20000;
  Status st = validate(p);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("leaves no device memory for tensors"), std::string::npos) << st.message();
}

TEST(Simulate, HandExampleTimeline) {
  Problem p = handProblem();
  auto g = simulate(p, handSolution(Schedule::GPipe));
  ASSERT_TRUE(g.ok()) << g.error().message;
  EXPECT_NEAR(g->step_time_s, 7.142, 1e-12); // GPipe: exactly the closed form
  auto o = simulate(p, handSolution(Schedule::OneFOneB));
  ASSERT_TRUE(o.ok());
  // Stage 0 (slot 0.79) is the bottleneck and first: 1F1B runs it back to
  // back after one 0.34+0.10 round trip... the replay can only be faster
  // than the closed form here.
  EXPECT_LE(o->step_time_s, 6.602 + 1e-12);
  // Ranks 0 and 1 replicate stage 0; rank 3 is idle; rank 2 never recomputes.
  std::map<int, int> per_rank;
  for (const TimelineEvent &e : o->timeline) ++per_rank[e.rank];
  EXPECT_EQ(per_rank.count(3), 0u);
  EXPECT_EQ(per_rank[0], per_rank[1]);
  // Stage 0: 4 fwd + 4 (recv_grad + recompute + bwd) + 1 all-reduce = 17 events; stage 1: 4*2 + 4 = 12.
  EXPECT_EQ(per_rank[0], 17);
  EXPECT_EQ(per_rank[2], 12);
  std::ostringstream os;
  o->print(os);
  EXPECT_NE(os.str().find("rank 0 stage 0 allreduce mb -1"), std::string::npos);
}

/// A random well-formed solution of a random problem.
std::pair<Problem, Solution> randomCase(std::mt19937 &rng, bool uniform) {
  auto uni = [&](double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(rng); };
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  Problem p;
  const int S = pick(1, 6);
  const int n = uniform ? S : pick(S, 12);
  const Block same{{uni(0, 0.1), uni(0.01, 1)}, {uni(0, 0.1), uni(0.01, 2)}, 100, 1, 1};
  for (int i = 0; i < n; ++i) {
    Block b = same;
    if (!uniform) {
      b.fwd = {uni(0, 0.1), uni(0.01, 1)};
      b.bwd = {uni(0, 0.2), b.fwd.per_sample_s * uni(1, 3)};
      b.param_bytes = pick(0, 1000);
    }
    p.blocks.push_back(b);
  }
  for (int i = 0; i <= n; ++i) p.cut_bytes_per_sample.push_back(uniform ? 0 : pick(0, 50));
  p.batch_size = 24;
  p.devices.count = S * 3;
  p.devices.per_node = pick(1, 4);
  p.devices.memory_bytes = 1e12;
  p.devices.intra_node = {uni(100, 1000), uniform ? 0 : uni(0, 0.01)};
  p.devices.inter_node = uniform ? p.devices.intra_node : Link{uni(10, 100), uni(0, 0.05)};
  Solution s;
  static const int ms[] = {1, 2, 3, 4, 6, 8, 12, 24};
  s.microbatches = ms[pick(0, 7)];
  s.schedule = pick(0, 1) ? Schedule::GPipe : Schedule::OneFOneB;
  std::vector<int> cuts{0, n};
  while (static_cast<int>(cuts.size()) < S + 1) {
    int c = pick(1, n - 1);
    if (std::find(cuts.begin(), cuts.end(), c) == cuts.end()) cuts.push_back(c);
  }
  std::sort(cuts.begin(), cuts.end());
  const int r = uniform ? pick(1, 3) : 0;
  for (int i = 0; i < S; ++i)
    s.stages.push_back(Stage{cuts[i], cuts[i + 1], uniform ? r : pick(1, 3), !uniform && pick(0, 3) == 0});
  return {p, s};
}

TEST(Simulate, GPipeReplayEqualsTheClosedForm) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 300; ++trial) {
    auto [p, s] = randomCase(rng, false);
    s.schedule = Schedule::GPipe;
    auto sim = simulate(p, s);
    ASSERT_TRUE(sim.ok()) << sim.error().message;
    const double closed = evaluate(p, s).step_time_s;
    EXPECT_NEAR(sim->step_time_s, closed, 1e-9 * closed) << "trial " << trial;
  }
}

TEST(Simulate, OneFOneBReplayAgainstTheClosedForm) {
  // Exact when every stage has the same slots (or M = 1); otherwise 1F1B's
  // alternation overlaps part of the fill and drain, so the replay is usually
  // faster, and never slower than the same plan under GPipe's exact form.
  std::mt19937 rng(12);
  int below = 0, equal = 0, above = 0;
  double worst_above = 0;
  for (int trial = 0; trial < 600; ++trial) {
    const bool uniform = trial % 3 == 0;
    auto [p, s] = randomCase(rng, uniform);
    s.schedule = Schedule::OneFOneB;
    if (trial % 7 == 0) s.microbatches = 1;
    auto sim = simulate(p, s);
    ASSERT_TRUE(sim.ok());
    const Evaluation ev = evaluate(p, s);
    const double closed = ev.step_time_s;
    Solution as_gpipe = s;
    as_gpipe.schedule = Schedule::GPipe;
    const double gpipe = evaluate(p, as_gpipe).step_time_s;
    if (uniform || s.microbatches == 1) {
      EXPECT_NEAR(sim->step_time_s, closed, 1e-9 * closed) << "trial " << trial;
      continue;
    }
    EXPECT_LE(sim->step_time_s, gpipe * (1 + 1e-9)) << "trial " << trial;
    // Lower bounds any schedule obeys: one micro-batch's round trip, and the busiest device.
    double round_trip = 0, busiest = 0;
    for (const StageCost &c : ev.stages) {
      round_trip += c.forwardSlot() + c.backwardSlot();
      busiest = std::max(busiest, s.microbatches * (c.forwardSlot() + c.backwardSlot()));
    }
    EXPECT_GE(sim->step_time_s, std::max(round_trip, busiest) + ev.allreduce_s - 1e-9) << "trial " << trial;
    const double rel = (sim->step_time_s - closed) / closed;
    if (rel < -1e-9) ++below;
    else if (rel > 1e-9) ++above, worst_above = std::max(worst_above, rel);
    else ++equal;
  }
  std::cout << "1F1B replay vs closed form: below " << below << ", equal " << equal << ", above " << above
            << " (worst +" << worst_above * 100 << "%)\n";
  EXPECT_GT(below, above); // the closed form is mostly conservative...
  EXPECT_LT(worst_above, 0.10); // ...and when not, only slightly optimistic
}

TEST(Simulate, TimelineRespectsDependencies) {
  std::mt19937 rng(13);
  for (int trial = 0; trial < 100; ++trial) {
    auto [p, s] = randomCase(rng, false);
    auto sim = simulate(p, s);
    ASSERT_TRUE(sim.ok());
    // Per rank, intervals never overlap; forward of (s, m) starts after the
    // forward of (s-1, m) ended, backward of (s, m) after backward of (s+1, m).
    std::map<std::tuple<int, int, int>, std::pair<double, double>> span; // (stage, mb, fwd?) -> [start, end]
    double last_end = -1;
    int last_rank = -1;
    for (const TimelineEvent &e : sim->timeline) {
      if (e.rank == last_rank) {
        EXPECT_GE(e.start_s, last_end - 1e-12);
      }
      last_rank = e.rank, last_end = e.end_s;
      if (e.kind == EventKind::AllReduce) continue;
      const bool fwd = e.kind == EventKind::RecvActivations || e.kind == EventKind::Forward;
      auto &sp = span.try_emplace({e.stage, e.microbatch, fwd}, e.start_s, e.end_s).first->second;
      sp.first = std::min(sp.first, e.start_s);
      sp.second = std::max(sp.second, e.end_s);
    }
    for (const auto &[key, sp] : span) {
      const auto [st, mb, fwd] = key;
      if (fwd && st > 0) {
        EXPECT_GE(sp.first, span.at({st - 1, mb, true}).second - 1e-12);
      }
      if (!fwd && st + 1 < s.numStages()) {
        EXPECT_GE(sp.first, span.at({st + 1, mb, false}).second - 1e-12);
      }
    }
    // Overlapping all-reduces with the drain can only help.
    auto overlapped = simulate(p, s, SimulateOptions{true});
    EXPECT_LE(overlapped->step_time_s, sim->step_time_s + 1e-12);
  }
}

TEST(Simulate, RejectsMalformedPlans) {
  Solution bad = handSolution(Schedule::GPipe);
  bad.stages.pop_back();
  auto sim = simulate(handProblem(), bad);
  ASSERT_FALSE(sim.ok());
  EXPECT_NE(sim.error().message.find("stages end at block 2, expected 3"), std::string::npos) << sim.error().message;
}

} // namespace
} // namespace rannc::partition
