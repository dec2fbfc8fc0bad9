// The stage DP against exhaustive search and the baselines, on hand-built and
// random problems. Every step time is re-derived with evaluate().
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <random>
#include <sstream>

#include "planner/partition/evaluate.h"
#include "planner/partition/solve.h"

namespace rannc::partition {
namespace {

/// A block taking f s forward and 2f s backward per sample, no fixed cost.
Block block(double f, double params, double act = 0) {
  Block b;
  b.fwd.per_sample_s = f;
  b.bwd.per_sample_s = 2 * f;
  b.param_bytes = params;
  b.activation_bytes_per_sample = act;
  return b;
}

/// Plenty of memory, free and instant links: only compute matters.
Problem computeOnly(std::vector<Block> blocks, int devices, int64_t batch) {
  Problem p;
  p.blocks = std::move(blocks);
  p.cut_bytes_per_sample.assign(p.blocks.size() + 1, 0);
  p.batch_size = batch;
  p.devices.count = devices;
  p.devices.per_node = devices;
  p.devices.memory_bytes = 1e12;
  p.devices.intra_node = {1e30, 0};
  p.devices.inter_node = {1e30, 0};
  return p;
}

double relDiff(double a, double b) { return std::fabs(a - b) / std::max({std::fabs(a), std::fabs(b), 1e-300}); }

std::string str(const Solution &s) {
  std::ostringstream os;
  s.print(os);
  return os.str();
}

TEST(SolveDP, TwoStagePipelineOnHandExample) {
  // Blocks cost 1, 1, 2 (fwd+bwd = 3, 3, 6 per sample); 2 devices, batch 4,
  // params zero so all-reduce is free; 1F1B; pinned to 2 stages x 1 replica.
  // Cut [0,2)|[2,3): slots 6b and 6b with b = 4/M per micro-batch:
  //   T = 2 * 6b + (M-1) * 6b = (M+1) * 6 * 4/M; M=4: 5*6 = 30; M=2: 3*12 = 36; M=1: 2*24 = 48.
  // Cut [0,1)|[1,3): slots 3b, 9b: T = 12b + (M-1)*9b; M=4: 12+27 = 39. So 30 wins.
  Problem p = computeOnly({block(1, 0), block(1, 0), block(2, 0)}, 2, 4);
  p.constraints.stages = 2;
  p.constraints.replicas = {1};
  p.constraints.schedule = Schedule::OneFOneB;
  auto r = solveDP(p);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(str(r->solution), "1f1b M=4 [0,2)x1 [2,3)x1");
  EXPECT_DOUBLE_EQ(r->step_time_s, 30);
  EXPECT_DOUBLE_EQ(evaluate(p, r->solution).step_time_s, 30);
}

TEST(SolveDP, PrefersDataParallelismWhenAllReduceIsFree) {
  // One block of 1+2 s per sample, 4 devices, batch 8, no parameters: 4
  // replicas of one stage with M=1 take 3 * 8/4 = 6 s, the ideal 24 / 4.
  Problem p = computeOnly({block(1, 0)}, 4, 8);
  auto r = solveDP(p);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_DOUBLE_EQ(r->step_time_s, 6);
  EXPECT_EQ(str(r->solution), "1f1b M=1 [0,1)x4");
}

TEST(SolveDP, RecomputesOnlyTheStageThatDoesNotFit) {
  // Two blocks, two devices, batch 2, M pinned to 2, 1F1B, 2 stages pinned.
  // Memory 100 B. Stage 0 (params 10, act 50/sample) keeps min(2, 2) = 2
  // micro-batches of b = 1: 2*10 + 2*1*50 = 120 > 100, so it must recompute:
  // 20 + 2*1*0 (no input bytes) + 1*50 = 70 <= 100. Stage 1 (params 10, act
  // 30) keeps 1: 20 + 30 = 50 and needs no recomputation.
  Problem p = computeOnly({block(1, 10, 50), block(1, 10, 30)}, 2, 2);
  p.devices.memory_bytes = 100;
  p.constraints.stages = 2;
  p.constraints.microbatches = 2;
  p.constraints.schedule = Schedule::OneFOneB;
  auto r = solveDP(p);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(str(r->solution), "1f1b M=2 [0,1)x1r [1,2)x1");
  // Stage 0 slots: 1 + (2+1) = 4; stage 1: 1 + 2 = 3. T = 7 + 1 * 4 = 11.
  EXPECT_DOUBLE_EQ(r->step_time_s, 11);
  p.allow_recompute = false;
  auto none = solveDP(p);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.error().message.find("needs"), std::string::npos) << none.error().message;
}

TEST(SolveDP, InterleavedChunksKeepTheRecomputationTheirRankNeeds) {
  // The blocks above as 2 chunks on 1 pipeline rank (interleaved-1f1b,
  // v = 2), M = 2 of b = 1, a device of 160 B. The rank's order is F(0,c0)
  // F(0,c1) B(0,c1) F(1,c0) B(0,c0) F(1,c1) B(1,c1) B(1,c0): chunk 0 holds 2
  // micro-batches, chunk 1 one. The 2-stage 1F1B layout on 160/2 = 80 B a
  // device, where stage 0 keeps 2 and must recompute (20 + 2*50 > 80, 20 +
  // 50 fits), is what folds (Note [interleaved layouts]). On the rank's order
  // (Note [a rank's chunks' memory]) the fold holds at most 2 + 2 parameter
  // and gradient bytes of 10, and chunk 0's two micro-batches when F(1,c0)
  // runs (chunk 1's first has gone at B(0,c1)): 40 + 2*50 = 140 fits, so the
  // fold drops the recomputation (the chunks' sum said 20 + 100 + 20 + 30 =
  // 170, and kept it).
  Problem p = computeOnly({block(1, 10, 50), block(1, 10, 30)}, 1, 2);
  p.devices.memory_bytes = 160;
  p.constraints.stages = 1;
  p.constraints.virtual_stages = 2;
  p.constraints.microbatches = 2;
  p.constraints.schedule = Schedule::Interleaved1F1B;
  auto r = solveDP(p);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(str(r->solution), "interleaved-1f1b v=2 M=2 [0,1)x1 [1,2)x1");
  // One device runs everything: 2 micro-batches x (chunk 0: 1 + 2, chunk 1: 1 + 2) = 12.
  EXPECT_DOUBLE_EQ(r->step_time_s, 12);
  const Evaluation ev = evaluate(p, r->solution);
  EXPECT_TRUE(ev.feasible());
  EXPECT_DOUBLE_EQ(ev.peak_memory_bytes, 140);
  // --recompute on: both chunks, each rebuilding its micro-batch only while
  // it runs: 40 + 50 (chunk 0's backward, nothing else kept: no inputs).
  p.force_recompute = true;
  auto all = solveDP(p);
  ASSERT_TRUE(all.ok()) << all.error().message;
  EXPECT_EQ(str(all->solution), "interleaved-1f1b v=2 M=2 [0,1)x1r [1,2)x1r");
  EXPECT_DOUBLE_EQ(evaluate(p, all->solution).peak_memory_bytes, 90);
  // 139 B: the layout on 69.5 B a device does not fit even recomputing (20 + 50).
  p.force_recompute = false;
  p.devices.memory_bytes = 139;
  EXPECT_FALSE(solveDP(p).ok());
}

TEST(StageMemory, ShardedAdamStepCanBeThePeak) {
  // Adam's sharded step allocates two temporaries of the block it updates
  // (Note [partition cost model]): P = 100, r = 2, no activations: 100 + 100
  // + 200/2 + 2 x 100/2 = 400, what the unsharded 100 + 100 + 200 needs.
  StageMemoryInputs in;
  in.param_bytes = 100;
  in.optimizer_bytes = 200;
  in.replicas = 2;
  EXPECT_DOUBLE_EQ(stageMemory(in, false, true).step, 100);
  EXPECT_DOUBLE_EQ(stageMemory(in, false, true).total(), 400);
  EXPECT_DOUBLE_EQ(stageMemory(in, false, false).total(), 400);
  // SGD with momentum (state = P) updates in place: no step term.
  in.optimizer_bytes = 100;
  EXPECT_DOUBLE_EQ(stageMemory(in, false, true).total(), 250);
}

TEST(SolveDP, ShardsTheOptimizerStateOnlyWhereMemoryNeedsIt) {
  // One block of 100 parameter bytes and 100 activation bytes a sample with
  // Adam on 2 replicas, 1 sample each: unsharded it needs 100 + 100 + 200 +
  // 100 = 500 B a device, sharded 100 + 100 + 200/2 + max(100, the step's
  // 2 x 100/2) = 400 B.
  Problem p = computeOnly({block(1, 100, 100)}, 2, 2);
  p.optimizer_bytes_per_param_byte = 2;
  p.constraints.replicas = {2};
  p.devices.memory_bytes = 450;
  auto r = solveDP(p);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(str(r->solution), "1f1b M=1 [0,1)x2z");
  const Evaluation ev = evaluate(p, r->solution);
  ASSERT_EQ(ev.stages.size(), 1u);
  EXPECT_DOUBLE_EQ(ev.stages[0].memory.optimizer, 100);
  EXPECT_DOUBLE_EQ(ev.stages[0].memory.step, 100);
  EXPECT_DOUBLE_EQ(ev.stages[0].zero_saves_bytes, 100);
  EXPECT_DOUBLE_EQ(ev.peak_memory_bytes, 400);
  // Sharding costs no time: the step is that of the unsharded plan.
  EXPECT_DOUBLE_EQ(r->step_time_s, 3);
  auto ex = solveExhaustive(p);
  ASSERT_TRUE(ex.ok());
  EXPECT_DOUBLE_EQ(ex->step_time_s, r->step_time_s);

  p.devices.memory_bytes = 550; // fits whole: no sharding unless forced
  EXPECT_EQ(str(solveDP(p)->solution), "1f1b M=1 [0,1)x2");
  p.force_zero = true;
  EXPECT_EQ(str(solveDP(p)->solution), "1f1b M=1 [0,1)x2z");

  p.devices.memory_bytes = 450; // --zero 0: nothing fits
  p.force_zero = p.allow_zero = false;
  auto none = solveDP(p);
  ASSERT_FALSE(none.ok());
  // A single replica cannot shard: evaluate() says so.
  Solution one = r->solution;
  one.stages[0].replicas = 1;
  p.allow_zero = true;
  p.constraints.replicas.clear();
  const Evaluation bad = evaluate(p, one);
  ASSERT_FALSE(bad.feasible());
  EXPECT_NE(bad.violations.front().find("single replica"), std::string::npos) << bad.violations.front();
}

// Note [tied parameters]: a stage holding both readers of a tied table holds it once.
TEST(Evaluate, CountsATiedParameterOncePerStage) {
  Problem p = computeOnly({block(1, 100), block(1, 50), block(1, 100)}, 2, 2);
  p.tied.push_back({{0, 2}, 80, 0});
  ASSERT_TRUE(validate(p).ok()) << validate(p).message();
  const Evaluation one = evaluate(p, Solution{{{0, 3, 1}}, 1});
  EXPECT_DOUBLE_EQ(one.stages[0].param_bytes, 250 - 80);
  const Evaluation two = evaluate(p, Solution{{{0, 2, 1}, {2, 3, 1}}, 1});
  EXPECT_DOUBLE_EQ(two.stages[0].param_bytes, 150);
  EXPECT_DOUBLE_EQ(two.stages[1].param_bytes, 100);
  // Cut by tensor parallelism, each device holds half of it, once.
  p.tp_degrees = {1, 2};
  p.tied[0].split_bytes = 80;
  p.blocks[0].tp.param_bytes = p.blocks[2].tp.param_bytes = 80;
  ASSERT_TRUE(validate(p).ok()) << validate(p).message();
  EXPECT_DOUBLE_EQ(evaluate(p, Solution{{{0, 3, 1, false, false, 2}}, 1}).stages[0].param_bytes, 250 - 80 - 40);
  p.tied[0].blocks = {2};
  EXPECT_FALSE(validate(p).ok());
}

// Note [values passing over], Note [received layout]: 6 B/sample made in
// block 0 and read next in block 2 pass over a stage of block 1, which holds
// neither them nor their gradient; a stage beginning at cut 1 keeps 3 B/sample
// more for receiving views contiguous.
TEST(Evaluate, StageHoldsNeitherValuesPassingOverNorTheirGradients) {
  Problem p = computeOnly({block(1, 0, 10), block(1, 0, 10), block(1, 0, 10)}, 3, 1);
  for (Block &b : p.blocks) b.working_bytes_per_sample = 5;
  p.blocks[1].working_bytes_per_sample += 6; // the passing value's gradient (planner/driver/lower.cpp)
  p.cut_bytes_per_sample = {0, 8 + 6, 4 + 6, 0};
  p.pass_over.push_back({0, 2, 6});
  p.received_layout_cut_bytes_per_sample = {0, 3, 0, 0};
  ASSERT_TRUE(validate(p).ok()) << validate(p).message();
  const Evaluation ev = evaluate(p, Solution{{{0, 1, 1}, {1, 2, 1}, {2, 3, 1}}, 1});
  EXPECT_DOUBLE_EQ(ev.stages[1].memory.activations, 8 + 10 + 3); // cut[1] - 6 + act + L_1, one micro-batch
  EXPECT_DOUBLE_EQ(ev.stages[1].memory.working, 5);
  EXPECT_DOUBLE_EQ(ev.stages[2].memory.activations, 10 + 10); // reads it: the whole cut[2]
  EXPECT_DOUBLE_EQ(ev.stages[0].memory.activations, 10);
  // Spans coarsen onto whole blocks: block 1 merged into either neighbour leaves no stage between.
  p.pass_over.push_back({0, 1, 1});
  EXPECT_FALSE(validate(p).ok());
}

// Note [a rank's chunks' memory]: 2 pipeline ranks of 2 chunks, M = 2. Rank
// 0 runs F0 F0 F1 F1 B1 B1 B0 B0 (chunk 0 is stage 0, chunk 1 stage 2); with
// 10 B a micro-batch in each chunk and working bytes 100 (chunk 0) and 1
// (chunk 1) its peak is chunk 0's backward with its two micro-batches,
// 2 x 10 + 100 = 120, where the chunks' sum says 2 x 10 + 100 + 2 x 10 + 1.
/// Four chunks of 7 B parameters, 10 B a micro-batch (2 in flight), 1 B working.
std::vector<StageCost> equalChunks() {
  std::vector<StageCost> stages(4);
  for (StageCost &c : stages) {
    c.inflight = 2;
    c.memory.params = 7;
    c.memory.activations = 20;
    c.memory.working = 1;
  }
  return stages;
}

TEST(Evaluate, RankMemoryFollowsTheRanksOrder) {
  std::vector<StageCost> stages = equalChunks();
  stages[0].memory.working = 100;
  EXPECT_DOUBLE_EQ(rankMemory(stages, 0, 2, 2, 2, Schedule::Interleaved1F1B), 2 * 7 + 120);
  EXPECT_LT(rankMemory(stages, 0, 2, 2, 2, Schedule::Interleaved1F1B),
            stages[0].memory.total() + stages[2].memory.total());
}

// Note [awaited gradient sends]: rank 1 of the same case runs F0@1 F1@1 F0@3
// B0@3 F1@3 B1@3 B0@1 B1@1 and holds stage 3's micro-batch-0 gradient
// through F1@3 (gradient_waits_test): with 50 B of it, that forward is its
// peak, 1 + 2 x 10 (stage 1) + 10 (stage 3) + 50; without it the rank's
// peak is 1 + 2 x 10 + 10.
TEST(Evaluate, RankMemoryCountsTheGradientsItHasNotAwaited) {
  std::vector<StageCost> stages = equalChunks();
  EXPECT_DOUBLE_EQ(rankMemory(stages, 1, 2, 2, 2, Schedule::Interleaved1F1B), 2 * 7 + 1 + 2 * 10 + 10);
  stages[3].sent_gradient_bytes = 50;
  EXPECT_DOUBLE_EQ(rankMemory(stages, 1, 2, 2, 2, Schedule::Interleaved1F1B), 2 * 7 + 1 + 2 * 10 + 10 + 50);
}

TEST(SolveDP, InfeasibleProblemNamesTheSmallestStage) {
  // A block of 100 parameter bytes with Adam needs 100+100+200 = 400 B even
  // alone; a device holds 1000 * (1 - 0.75) = 250 B. (--zero 0: sharded over
  // 4 replicas it would need 100+100+50 = 250 B.)
  Problem p = computeOnly({block(1, 100), block(1, 1)}, 4, 8);
  p.optimizer_bytes_per_param_byte = 2;
  p.allow_zero = false;
  p.devices.memory_bytes = 1000;
  p.devices.memory_margin = 0.75;
  for (Strategy s : {Strategy::Auto, Strategy::Uniform}) {
    auto r = solve(p, s);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.error().message.find("250 B"), std::string::npos) << r.error().message;
  }
  auto r = solveDP(p);
  EXPECT_NE(r.error().message.find("block 0 alone"), std::string::npos) << r.error().message;
  EXPECT_NE(r.error().message.find("needs 400 B"), std::string::npos) << r.error().message;
  EXPECT_FALSE(solveExhaustive(p).ok());
}

TEST(SolveDP, RejectsInvalidProblems) {
  Problem p = computeOnly({block(1, 0)}, 2, 4);
  p.cut_bytes_per_sample.pop_back();
  auto r = solveDP(p);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("cut_bytes_per_sample has 1 entries"), std::string::npos) << r.error().message;
  p = computeOnly({block(1, 0)}, 2, 4);
  p.constraints.stages = 3;
  EXPECT_FALSE(solveDP(p).ok());
  p = computeOnly({block(1, 0), block(1, 0)}, 2, 4);
  p.constraints.replicas = {3};
  p.constraints.power_of_two_replicas = true;
  r = solveDP(p);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("powers of two"), std::string::npos);
}

TEST(SolveDP, QuantizesStageWidthsBeyondItsStateBudget) {
  // Note [device quantum]: over the state budget the DP searches stage widths
  // in multiples of a quantum, and bounds what every width could give.
  std::vector<Block> blocks;
  for (int i = 0; i < 20; ++i) blocks.push_back(block(1 + i % 3, 0));
  Problem p = computeOnly(blocks, 64, 64);
  p.devices.per_node = 8;
  p.devices.intra_node = {1e3, 1e-4};
  p.devices.inter_node = {1e2, 1e-3};
  for (Block &b : p.blocks) b.param_bytes = 10;
  auto exact = solveDP(p);
  ASSERT_TRUE(exact.ok()) << exact.error().message;
  EXPECT_EQ(exact->stats.device_quantum, 1);
  EXPECT_EQ(exact->stats.lower_bound_s, exact->step_time_s);
  DPOptions small;
  small.max_states = 10000; // 21 classes x 21 block counts x 65 device counts = 28665 at quantum 1
  auto r = solveDP(p, small);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->stats.device_quantum, 4);
  for (const Stage &s : r->solution.stages) EXPECT_EQ(s.replicas % 4, 0) << str(r->solution);
  EXPECT_LT(relDiff(evaluate(p, r->solution).step_time_s, r->step_time_s), 1e-9);
  EXPECT_GE(r->step_time_s, exact->step_time_s * (1 - 1e-9));
  EXPECT_GT(r->stats.lower_bound_s, 0);
  EXPECT_LE(r->stats.lower_bound_s, exact->step_time_s * (1 + 1e-9));

  // Beyond what any quantum brings within memory, the caller must coarsen (the
  // driver does): 401 blocks x 100001 device counts x 2 classes = 80 M states.
  Problem huge = computeOnly(std::vector<Block>(400, block(1, 0)), 100000, 100000);
  huge.devices.per_node = 8;
  DPOptions every_width;
  every_width.device_quantum = 1;
  auto refused = solveDP(huge, every_width);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("coarsen the problem to fewer blocks"), std::string::npos)
      << refused.error().message;
}

TEST(SolveDP, ZeroBubbleH1PinnedSearchesItsOwnLayouts) {
  // Note [split backward DP]: pinned, ZB-H1 is searched with its own memory
  // and closed form. Blocks 1, 1, 2 with W half of each backward; 2 stages x
  // 1, M = 4 (b = 1): [0,2)|[2,3) has slots F+G = 6 and 6, W = 2 and 2:
  // 12 - 2 x 2 + 3 x 6 = 26 (1F1B: 30).
  std::vector<Block> blocks{block(1, 0), block(1, 0), block(2, 0)};
  for (Block &b : blocks) b.wgrad = {0, b.bwd.per_sample_s / 2};
  Problem p = computeOnly(blocks, 2, 4);
  p.constraints.stages = 2;
  p.constraints.replicas = {1};
  p.constraints.microbatches = 4;
  p.constraints.schedule = Schedule::ZBH1;
  auto r = solveDP(p);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(str(r->solution), "zb-h1 M=4 [0,2)x1 [2,3)x1");
  EXPECT_DOUBLE_EQ(r->step_time_s, 26);
  EXPECT_DOUBLE_EQ(evaluate(p, r->solution).step_time_s, 26);
  // Exhaustive search over ZB-H1 plans finds the same.
  auto ex = solveExhaustive(p);
  ASSERT_TRUE(ex.ok()) << ex.error().message;
  EXPECT_DOUBLE_EQ(ex->step_time_s, r->step_time_s);

  // Memory (b = 1, nothing else held): activations 10, 10, 1 bytes a
  // sample, block 1's W queue 10 (Note [what a queued W keeps]: a queued
  // micro-batch holds that alone). On 39 bytes [0,2)|[2,3) does not fit:
  // stage 0 holds 2 x 20 (right after a B the micro-batch joining the queue
  // drops from 20 to 10, so the queue adds nothing there). [0,1)|[1,3) holds
  // 2 x 10 = 20 and, on stage 1, the micro-batch in B, 11, beside one queued,
  // 10: 21 (right after that B both are queued: 20): it fits. Its time:
  // slots 3 and 9 (W 1 and 3): 12 - 2 x 1 + 3 x 9 = 37.
  const double act[] = {10, 10, 1}, queue[] = {0, 10, 0};
  for (size_t i = 0; i < blocks.size(); ++i)
    blocks[i].activation_bytes_per_sample = act[i], blocks[i].wgrad_bytes_per_sample = queue[i];
  Problem tight = computeOnly(blocks, 2, 4);
  tight.constraints = p.constraints;
  tight.devices.memory_bytes = 39;
  tight.allow_recompute = false; // below: with it
  auto t = solveDP(tight);
  ASSERT_TRUE(t.ok()) << t.error().message;
  EXPECT_EQ(str(t->solution), "zb-h1 M=4 [0,1)x1 [1,3)x1");
  EXPECT_DOUBLE_EQ(t->step_time_s, 37);
  EXPECT_TRUE(evaluate(tight, t->solution).feasible());
  auto tight_ex = solveExhaustive(tight);
  ASSERT_TRUE(tight_ex.ok()) << tight_ex.error().message;
  EXPECT_DOUBLE_EQ(tight_ex->step_time_s, 37);
  // On 20 bytes no 2-stage layout fits under ZB-H1 (1F1B's [0,1)|[1,3)
  // would: its last stage holds one micro-batch, 11): an error, as
  // exhaustive search says.
  tight.devices.memory_bytes = 20;
  auto none = solveDP(tight);
  ASSERT_FALSE(none.ok());
  EXPECT_FALSE(solveExhaustive(tight).ok());
  // With recomputation (Note [recomputing split backward]) stage 0 of
  // [0,2)|[2,3) holds one rebuilt micro-batch, 20, and a stash of inputs of
  // 0 bytes; its G becomes 2 + 4: 14 - min(6, 2 x 2) + 3 x 8 = 34, on 20
  // bytes as on 39.
  tight.allow_recompute = true;
  for (double bytes : {39.0, 20.0}) {
    tight.devices.memory_bytes = bytes;
    auto rebuilt = solveDP(tight);
    ASSERT_TRUE(rebuilt.ok()) << rebuilt.error().message;
    EXPECT_EQ(str(rebuilt->solution), "zb-h1 M=4 [0,2)x1r [2,3)x1");
    EXPECT_DOUBLE_EQ(rebuilt->step_time_s, 34);
    auto rebuilt_ex = solveExhaustive(tight);
    ASSERT_TRUE(rebuilt_ex.ok()) << rebuilt_ex.error().message;
    EXPECT_DOUBLE_EQ(rebuilt_ex->step_time_s, 34);
  }
  // Recomputation (Note [recomputing split backward]): B rebuilds the
  // forward, W is unchanged. [0,2)|[2,3): F 2 and 2, G = 2 + 4 = 6 each, W
  // 2 each; 16 - min(6, 2 x 2) + 3 x 8 = 36. [0,1)|[1,3): F 1, 3, G 3, 9, W
  // 1, 3: 16 - min(3, 2) + 3 x 12 = 50.
  Problem rec = p;
  rec.force_recompute = true;
  auto recomputed = solveDP(rec);
  ASSERT_TRUE(recomputed.ok()) << recomputed.error().message;
  ASSERT_EQ(recomputed->solution.numStages(), 2);
  EXPECT_EQ(recomputed->solution.stages[0].block_end, 2);
  EXPECT_TRUE(recomputed->solution.stages[0].recompute && recomputed->solution.stages[1].recompute);
  EXPECT_DOUBLE_EQ(recomputed->step_time_s, 36);
  EXPECT_DOUBLE_EQ(evaluate(rec, recomputed->solution).step_time_s, 36);
  auto rec_ex = solveExhaustive(rec);
  ASSERT_TRUE(rec_ex.ok()) << rec_ex.error().message;
  EXPECT_DOUBLE_EQ(rec_ex->step_time_s, 36);
  // Tensor parallelism (Note [split backward of a tensor-parallel stage]):
  // every number splits, so at degree 2 F, B and W halve (no collective
  // bytes): [0,2)|[2,3) has F 1, G 2, W 1 each: 6 - min(2, 2 x 1) + 3 x 3 = 13.
  Problem tp = computeOnly(blocks, 4, 4);
  tp.constraints = p.constraints;
  tp.constraints.tensor_parallel = {2};
  tp.tp_degrees = {1, 2};
  for (Block &b : tp.blocks) b.tp.fwd = b.fwd, b.tp.bwd = b.bwd;
  auto parallel = solveDP(tp);
  ASSERT_TRUE(parallel.ok()) << parallel.error().message;
  EXPECT_EQ(parallel->solution.stages[0].tensor_parallel, 2);
  EXPECT_DOUBLE_EQ(parallel->step_time_s, 13);
  EXPECT_DOUBLE_EQ(evaluate(tp, parallel->solution).stages[0].weightSlot(), 1);
  auto tp_ex = solveExhaustive(tp);
  ASSERT_TRUE(tp_ex.ok()) << tp_ex.error().message;
  EXPECT_DOUBLE_EQ(tp_ex->step_time_s, 13);
}

TEST(SolveDP, HonoursEveryConstraint) {
  Problem p = computeOnly({block(1, 5), block(2, 5), block(1, 5), block(3, 5)}, 8, 16);
  p.devices.per_node = 4;
  p.constraints.replicas = {2, 1, 4};
  p.constraints.microbatches = 4;
  p.constraints.schedule = Schedule::GPipe;
  auto r = solveDP(p);
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_EQ(r->solution.numStages(), 3);
  EXPECT_EQ(r->solution.stages[0].replicas, 2);
  EXPECT_EQ(r->solution.stages[1].replicas, 1);
  EXPECT_EQ(r->solution.stages[2].replicas, 4);
  EXPECT_EQ(r->solution.microbatches, 4);
  EXPECT_EQ(r->solution.schedule, Schedule::GPipe);

  p.constraints = {};
  p.constraints.power_of_two_replicas = true;
  p.constraints.stages = 2;
  r = solveDP(p);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->solution.numStages(), 2);
  for (const Stage &s : r->solution.stages) EXPECT_EQ(s.replicas & (s.replicas - 1), 0) << s.replicas;
}

TEST(Strategy, ParsesNames) {
  for (Strategy s : {Strategy::Auto, Strategy::Uniform, Strategy::Parameters, Strategy::Time})
    EXPECT_EQ(*parseStrategy(strategyName(s)), s);
  auto bad = parseStrategy("fastest");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("auto, uniform, parameters or time"), std::string::npos);
}

TEST(Baselines, FollowTheirRules) {
  // Params 1, 1, 1, 9 and times 3, 1, 1, 1 per sample, 2 stages x 1 replica.
  Problem p = computeOnly({block(3, 1), block(1, 1), block(1, 1), block(1, 9)}, 2, 2);
  p.constraints.stages = 2;
  p.constraints.replicas = {1};
  auto uniform = solveBaseline(p, Strategy::Uniform);
  auto params = solveBaseline(p, Strategy::Parameters);
  auto time = solveBaseline(p, Strategy::Time);
  ASSERT_TRUE(uniform.ok() && params.ok() && time.ok());
  EXPECT_EQ(uniform->solution.stages[0].block_end, 2); // 2 blocks each
  EXPECT_EQ(params->solution.stages[0].block_end, 3);  // 1+1+1 | 9
  EXPECT_EQ(time->solution.stages[0].block_end, 1);    // 3 | 1+1+1
  for (const auto *r : {&uniform, &params, &time})
    EXPECT_DOUBLE_EQ((*r)->step_time_s, evaluate(p, (*r)->solution).step_time_s);
}

// ---------------------------------------------------------------------------
// Random small instances: the DP must match exhaustive search exactly.

/// Tensor parallelism on a random problem (Note [tensor parallel stages]):
/// most blocks split part of their numbers (never what they make unsaved),
/// degrees up to a node, some cuts not whole, sometimes a pinned degree.
void addTensorParallelism(Problem &p, std::mt19937 &rng) {
  auto uni = [&](double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(rng); };
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  const int n = p.numBlocks();
  for (int i = 0; i < n; ++i) {
    Block &b = p.blocks[i];
    if (pick(0, 3) == 0) continue;
    const double f = uni(0, 1);
    b.tp.fwd = {b.fwd.fixed_s * f, b.fwd.per_sample_s * f};
    b.tp.bwd = {b.bwd.fixed_s * f, b.bwd.per_sample_s * f};
    b.tp.param_bytes = std::floor(b.param_bytes * uni(0, 1));
    b.tp.working_bytes_per_sample = std::floor(b.working_bytes_per_sample * uni(0, 1));
    b.tp.working_fixed_bytes = std::floor(b.working_fixed_bytes * uni(0, 1));
    const double made = p.unsavedCutAt(i + 1) - p.unsavedCutAt(i) + b.unsaved_freed_bytes_per_sample;
    b.tp.activation_bytes_per_sample = std::floor(std::max(0.0, b.activation_bytes_per_sample - made) * uni(0, 1));
    b.tp.collective_bytes_per_sample = pick(0, 30);
    b.tp.collectives = pick(0, 2);
  }
  for (int t = 1; t <= p.devices.per_node; t *= 2)
    if (t == 1 || pick(0, 3) > 0) p.tp_degrees.push_back(t);
  if (pick(0, 1)) {
    p.cut_whole.assign(n + 1, true);
    for (int i = 1; i < n; ++i) p.cut_whole[i] = pick(0, 2) > 0;
  }
  // Note [scatter/gather transfers] in half of them, chosen without drawing
  // again so that every other instance stays as it was.
  p.devices.scatter_gather = p.tp_degrees.size() % 2 == 0;
  std::vector<int> &pinned = p.constraints.tensor_parallel;
  const int degrees = static_cast<int>(p.tp_degrees.size());
  switch (pick(0, 5)) {
  case 0: pinned = {p.tp_degrees[pick(0, degrees - 1)]}; break;
  case 1: {
    const int stages = p.constraints.replicas.size() > 1 ? static_cast<int>(p.constraints.replicas.size())
                       : p.constraints.stages > 0        ? p.constraints.stages
                                                         : pick(1, std::min(n, p.devices.count));
    for (int s = 0; s < stages; ++s) pinned.push_back(p.tp_degrees[pick(0, degrees - 1)]);
    break;
  }
  default: break;
  }
  if (!validate(p).ok()) pinned.clear(); // the pinned degrees need more devices than there are
}

Problem randomProblem(std::mt19937 &rng, int trial) {
  auto uni = [&](double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(rng); };
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  Problem p;
  const int n = pick(1, 10);
  p.devices.count = pick(1, 8);
  static const int per_node[] = {1, 2, 4, 8};
  p.devices.per_node = per_node[pick(0, 3)];
  static const int batches[] = {1, 2, 3, 4, 6, 8, 12, 16};
  p.batch_size = batches[pick(0, 7)];
  double hardest = 0, total = 0; // what one block alone / all blocks need at one sample
  for (int i = 0; i < n; ++i) {
    Block b;
    b.fwd = {pick(0, 1) ? uni(0, 0.2) : 0.0, uni(0.01, 1)};
    b.bwd = {pick(0, 1) ? uni(0, 0.4) : 0.0, b.fwd.per_sample_s * uni(1, 3)};
    b.param_bytes = pick(0, 100);
    b.activation_bytes_per_sample = pick(0, 60);
    b.working_bytes_per_sample = pick(0, 10);
    p.blocks.push_back(b);
  }
  for (int i = 0; i <= n; ++i) p.cut_bytes_per_sample.push_back(pick(0, 20));
  // Half the instances: an early block's larger backward, which the blocks
  // after it in a stage offset by what they free, and values that autograd
  // saves nowhere, freed where a stage holds their last reader (stageWorking,
  // Note [unsaved values]): each block makes some of its activation bytes
  // unsaved, for a later block to read last.
  if (pick(0, 1)) {
    p.unsaved_cut_bytes_per_sample.assign(n + 1, 0);
    for (int i = 0; i < n; ++i) p.blocks[i].working_bytes_per_sample += pick(0, 1) ? pick(0, 60) : 0;
    for (int i = 0; i + 1 < n; ++i) {
      const int bytes = pick(0, static_cast<int>(p.blocks[i].activation_bytes_per_sample) / 2);
      const int last = pick(i + 1, n - 1);
      for (int j = i + 1; j <= last; ++j) {
        p.unsaved_cut_bytes_per_sample[j] += bytes;
        p.cut_bytes_per_sample[j] += bytes;
      }
      p.blocks[last].unsaved_freed_bytes_per_sample += bytes;
    }
  }
  p.optimizer_bytes_per_param_byte = pick(0, 2);
  for (int i = 0; i < n; ++i) {
    const Block &b = p.blocks[i];
    const double need = b.param_bytes * (2 + p.optimizer_bytes_per_param_byte) + b.activation_bytes_per_sample +
                        b.working_bytes_per_sample + 3 * (p.cut_bytes_per_sample[i] + p.cut_bytes_per_sample[i + 1]);
    hardest = std::max(hardest, need);
    total += need;
  }
  // From a little less than the hardest block or an even share needs
  // (infeasible) to several times that (splits, replicas and recomputation
  // all matter).
  const double base = std::max(hardest, total / p.devices.count);
  p.devices.memory_bytes = std::max(1.0, std::floor(base * std::exp(uni(std::log(0.8), std::log(6.0)))));
  p.devices.memory_margin = pick(0, 3) == 0 ? 0.1 : 0.0;
  p.devices.intra_node = {uni(50, 500), uni(0, 0.01)};
  p.devices.inter_node = {uni(5, 50), uni(0, 0.05)};
  p.allow_recompute = pick(0, 1);
  p.force_recompute = p.allow_recompute && pick(0, 3) == 0; // --recompute on
  p.allow_zero = pick(0, 1);
  p.force_zero = p.allow_zero && pick(0, 3) == 0; // --zero 1
  Constraints &c = p.constraints;
  const int max_stages = std::min(n, p.devices.count);
  switch (trial % 8) {
  case 1: c.stages = pick(1, max_stages); break;
  case 2: c.schedule = Schedule::GPipe; break;
  case 3: c.schedule = Schedule::OneFOneB; c.power_of_two_replicas = true; break;
  case 4: {
    std::vector<int> divisors;
    for (int m = 1; m <= p.batch_size; ++m)
      if (p.batch_size % m == 0) divisors.push_back(m);
    c.microbatches = divisors[pick(0, static_cast<int>(divisors.size()) - 1)];
    break;
  }
  case 5: {
    const int s = pick(1, max_stages);
    int left = p.devices.count - s;
    for (int i = 0; i < s; ++i) {
      const int extra = pick(0, left);
      c.replicas.push_back(1 + extra);
      left -= extra;
    }
    break;
  }
  case 6: c.replicas = {pick(1, 2)}; break;
  case 7: c.max_microbatches = pick(1, 4); break;
  default: break;
  }
  if (trial % 3 == 0) addTensorParallelism(p, rng);
  // Synchronised batch statistics (--batchnorm exact) in a fifth of the
  // instances, chosen without drawing so that every other instance stays as it was.
  if (trial % 5 == 2)
    for (int i = 0; i < n; i += 2) {
      p.blocks[i].stat_sync_bytes = p.blocks[i].param_bytes / 4;
      p.blocks[i].stat_sync_collectives = 2;
    }
  // Note [tied parameters]: a table the first and the last block both read,
  // without drawing again (every other instance stays as it was).
  if (trial % 4 == 2 && n > 1) {
    const Block &first = p.blocks.front(), &last = p.blocks.back();
    p.tied.push_back({{0, n - 1}, std::min(first.param_bytes, last.param_bytes),
                      std::min(first.tp.param_bytes, last.tp.param_bytes)});
  }
  // Note [values passing over] and Note [received layout] in half the
  // instances, from a generator of their own (every other instance stays as
  // it was): values from block `from` read next at `to`, in the cuts between
  // and, as gradients, in the working bytes of the blocks they pass over; and
  // what a stage beginning at a cut keeps for receiving views contiguous.
  if (trial % 2 == 1 && n > 2) {
    std::mt19937 side(static_cast<unsigned>(trial) * 7919u + 17u);
    auto draw = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(side); };
    for (int k = draw(1, 3); k > 0; --k) {
      const int from = draw(0, n - 3), to = draw(from + 2, n - 1), bytes = draw(1, 12);
      p.pass_over.push_back({from, to, double(bytes)});
      for (int i = from + 1; i <= to; ++i) p.cut_bytes_per_sample[i] += bytes;
      for (int u = from + 1; u < to; ++u) p.blocks[u].working_bytes_per_sample += bytes;
    }
    p.received_layout_cut_bytes_per_sample.assign(n + 1, 0.0);
    for (int i = 1; i < n; ++i) p.received_layout_cut_bytes_per_sample[i] = draw(0, 1) ? draw(0, 15) : 0;
  }
  return p;
}

/// Note [automatic schedule]: with the schedule searched, the best of the
/// pinned searches: exhaustive search over 1F1B and GPipe, and pinned to
/// ZB-H1 and to ZB-H2 where they are legal, and the interleaved folds with 2
/// and 4 chunks onto the 1F1B DP's stage count (the fold is not exact pinned
/// either). Ties go to the earlier, as in solveDP.
Expected<SolveResult> bestPinnedSearch(const Problem &p) {
  auto best = solveExhaustive(p);
  if (!best) return best;
  auto consider = [&](Expected<SolveResult> found) {

    if (found.ok() && found->step_time_s < best->step_time_s) best = std::move(*found);
  };
  const bool tp_pinned = std::any_of(p.constraints.tensor_parallel.begin(), p.constraints.tensor_parallel.end(),
                                     [](int t) { return t > 1; });
  if (p.no_split_backward.empty())
    for (Schedule s : {Schedule::ZBH1, Schedule::ZBH2}) {
      Problem q = p;
      q.constraints.schedule = s;
      consider(solveExhaustive(q));
    }
  Problem one = p;
  one.constraints.schedule = Schedule::OneFOneB;
  auto layout = solveDP(one);
  const int ranks = p.constraints.stages > 0 ? p.constraints.stages : layout.ok() ? layout->solution.numStages() : 0;
  if (!tp_pinned && p.tied.empty() && p.no_interleave.empty() && p.constraints.replicas.size() <= 1)
    for (int v : {2, 4})
      if (ranks >= 2 && ranks * v <= p.numBlocks()) {
        Problem q = p;
        q.constraints.schedule = Schedule::Interleaved1F1B;
        q.constraints.virtual_stages = v;
        q.constraints.stages = ranks;
        consider(solveDP(q));
      }
  return best;
}

/// The DP and exhaustive search on `p` (described by `where`) agree, and
/// evaluate() says of the DP's plan what the DP says; the DP's result when
/// there is a plan. With the schedule searched, the DP's choice is the best
/// of the pinned searches (bestPinnedSearch).
std::optional<SolveResult> expectMatchesExhaustive(const Problem &p, const std::string &where) {
  auto dp = solveDP(p);
  auto ex = p.constraints.schedule ? solveExhaustive(p) : bestPinnedSearch(p);
  EXPECT_EQ(dp.ok(), ex.ok()) << where
                              << (dp.ok() ? ex.error().message + "\ndp: " + str(dp->solution) : dp.error().message);
  if (!dp.ok() || !ex.ok()) return std::nullopt;
  const Evaluation ev = evaluate(p, dp->solution);
  EXPECT_TRUE(ev.feasible()) << where << str(dp->solution) << "\n" << ev.violations.front();
  // The DP's claim is what evaluate() says about its plan...
  EXPECT_LT(relDiff(ev.step_time_s, dp->step_time_s), 1e-9) << where << str(dp->solution);
  // ...and nothing in the space is better (floating-point sums in another order).
  EXPECT_LT(relDiff(dp->step_time_s, ex->step_time_s), 1e-9)
      << where << "dp " << str(dp->solution) << " = " << dp->step_time_s << "\nexhaustive " << str(ex->solution)
      << " = " << ex->step_time_s;
  return std::move(*dp);
}

/// Each block's W a random share of its backward, and a random W queue, per sample and per micro-batch (Note
/// [split backward DP]).
void drawWeightGradients(Problem &p, std::mt19937 &rng) {
  auto uni = [&](double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(rng); };
  for (Block &b : p.blocks) {
    b.wgrad = {b.bwd.fixed_s * uni(0, 1), b.bwd.per_sample_s * uni(0, 1)};
    b.wgrad_bytes_per_sample = std::floor(uni(0, 30));
    b.wgrad_param_bytes = std::floor(uni(0, 20));
  }
}

/// Trial `trial`'s random problem with the schedule left to the search (Note
/// [automatic schedule]) and weight gradients drawn.
Problem randomAutoProblem(std::mt19937 &rng, int trial) {
  Problem p = randomProblem(rng, trial);
  p.constraints.schedule.reset();
  p.constraints.virtual_stages = 1;
  drawWeightGradients(p, rng);
  return p;
}

/// Trial `trial`'s problem, checked valid, as a failure message names it.
std::string describeTrial(const Problem &p, int trial) {
  EXPECT_TRUE(validate(p).ok()) << validate(p).message();
  std::ostringstream where;
  where << "trial " << trial << "\n";
  p.print(where);
  return where.str();
}

/// What the split-backward DP-vs-exhaustive trials reached.
struct SplitReach {
  int feasible = 0, several_stages = 0, queued = 0;
  int recomputing = 0, tensor_parallel = 0; ///< plans with a recomputing / a tensor-parallel stage
  int filled = 0; ///< plans of several stages with M >= 2S-1 (ZB-H2's closed form and credit)
};

/// Note [split backward DP]: 300 random small problems with `schedule`
/// pinned, each block's W a random share of its backward and a random W
/// queue, recomputation and tensor-parallel degrees drawn as for 1F1B; the
/// DP's plan is what exhaustive search finds, and evaluate() agrees with it.
SplitReach expectSplitScheduleMatchesExhaustive(Schedule schedule, unsigned seed) {
  std::mt19937 rng(seed);
  SplitReach reach;
  int &feasible = reach.feasible, &several_stages = reach.several_stages, &queued = reach.queued;
  for (int trial = 0; trial < 300; ++trial) {
    Problem p = randomProblem(rng, trial);
    p.constraints.schedule = schedule;
    p.constraints.power_of_two_replicas = false;
    drawWeightGradients(p, rng);
    const std::string where = describeTrial(p, trial);
    auto dp = expectMatchesExhaustive(p, where);
    if (!dp) continue;
    ++feasible;
    const Evaluation ev = evaluate(p, dp->solution);
    several_stages += dp->solution.stages.size() > 1;
    queued += std::any_of(ev.stages.begin(), ev.stages.end(),
                          [](const StageCost &c) { return c.memory.weight_queue > 0; });
    const int S = static_cast<int>(dp->solution.stages.size());
    reach.filled += S > 1 && dp->solution.microbatches >= 2 * S - 1;
    const std::vector<Stage> &st = dp->solution.stages;
    reach.recomputing += std::any_of(st.begin(), st.end(), [](const Stage &x) { return x.recompute; });
    reach.tensor_parallel += std::any_of(st.begin(), st.end(), [](const Stage &x) { return x.tensor_parallel > 1; });
  }
  std::cout << pipeline::scheduleName(schedule) << ": feasible " << reach.feasible << ", several stages "
            << reach.several_stages << ", queued " << reach.queued << ", recomputing " << reach.recomputing
            << ", tensor-parallel " << reach.tensor_parallel << "\n";
  return reach;
}

TEST(SolveDP, MatchesExhaustiveSearchUnderZeroBubbleH1) {
  const SplitReach reach = expectSplitScheduleMatchesExhaustive(Schedule::ZBH1, 2028);
  // The instances reach what the test is about.
  EXPECT_GT(reach.feasible, 150);
  EXPECT_GT(reach.several_stages, 50);
  EXPECT_GT(reach.queued, 30);
  EXPECT_GT(reach.recomputing, 15); // Note [recomputing split backward]
  EXPECT_GT(reach.tensor_parallel, 5); // Note [split backward of a tensor-parallel stage]
}

TEST(SolveDP, MatchesExhaustiveSearchUnderZeroBubbleH2) {
  // ZB-H2's credit min(G, 3W) and its 2S-1 micro-batches in flight.
  const SplitReach reach = expectSplitScheduleMatchesExhaustive(Schedule::ZBH2, 2029);
  EXPECT_GT(reach.feasible, 150);
  EXPECT_GT(reach.several_stages, 50);
  EXPECT_GT(reach.queued, 30);
  EXPECT_GT(reach.filled, 20);
  EXPECT_GT(reach.recomputing, 15);
  EXPECT_GT(reach.tensor_parallel, 5);
}

TEST(SolveDP, AutoScheduleMatchesBestPinnedSearch) {
  // Note [automatic schedule]: 300 random problems with the schedule searched
  // and every block's W a random share of its backward; the DP's choice is
  // the best of the pinned searches, and each schedule wins somewhere.
  std::mt19937 rng(2030);
  int feasible = 0, split_wins = 0, h2_wins = 0, interleaved_wins = 0, one_wins = 0, bounded = 0;
  int split_rebuilt_or_tp = 0; // split-backward plans with a recomputing or tensor-parallel stage
  for (int trial = 0; trial < 300; ++trial) {
    Problem p = randomAutoProblem(rng, trial);
    const std::string where = describeTrial(p, trial);
    auto dp = expectMatchesExhaustive(p, where);
    if (!dp) continue;
    ++feasible;
    const Schedule chosen = dp->solution.schedule;
    split_wins += pipeline::splitsBackward(chosen);
    split_rebuilt_or_tp += pipeline::splitsBackward(chosen) &&
                           std::any_of(dp->solution.stages.begin(), dp->solution.stages.end(),
                                       [](const Stage &x) { return x.recompute || x.tensor_parallel > 1; });
    h2_wins += chosen == Schedule::ZBH2;
    interleaved_wins += chosen == Schedule::Interleaved1F1B;
    one_wins += chosen == Schedule::OneFOneB;
    ASSERT_EQ(dp->stats.schedules.size(), 5u) << where; // 1F1B, ZB-H1, ZB-H2, interleaved v=2 and v=4
    int chosen_count = 0;
    for (const ScheduleTried &t : dp->stats.schedules) {
      chosen_count += t.outcome == ScheduleTried::Outcome::Chosen;
      bounded += t.outcome == ScheduleTried::Outcome::Bounded;
      if (t.outcome != ScheduleTried::Outcome::Chosen) EXPECT_FALSE(t.why.empty()) << where;
    }
    EXPECT_EQ(chosen_count, 1) << where;
  }
  std::cout << "feasible " << feasible << ", 1f1b " << one_wins << ", split backward " << split_wins << " (zb-h2 "
            << h2_wins << ", recomputing or tensor-parallel " << split_rebuilt_or_tp << "), interleaved "
            << interleaved_wins << ", schedules bounded out " << bounded << "\n";
  EXPECT_GT(feasible, 150);
  EXPECT_GT(one_wins, 20);
  EXPECT_GT(split_wins, 20);
  EXPECT_GT(h2_wins, 5);
  EXPECT_GT(split_rebuilt_or_tp, 10);
  EXPECT_GT(bounded, 20); // the bounds skip searches
}

TEST(SolveDP, AutoScheduleSearchesTheRivalsStageCountWhereTooLarge) {
  // Note [automatic schedule]: with the automatic budget cut to what one
  // stage count of the 1F1B plan's depth costs, a split schedule whose whole
  // search is larger is searched at the rival plan's stage count alone, and
  // says so; there its answer is exhaustive search's at that count.
  std::mt19937 rng(2031);
  int narrowed = 0, narrowed_won = 0;
  for (int trial = 0; trial < 300; ++trial) {
    Problem p = randomAutoProblem(rng, trial);
    const std::string where = describeTrial(p, trial);
    Problem one = p;
    one.constraints.schedule = Schedule::OneFOneB;
    auto layout = solveDP(one);
    if (!layout.ok()) continue;
    const int S1 = layout->solution.numStages();
    DPOptions opts;
    opts.auto_states = int64_t(S1 + 1) * (p.numBlocks() + 1) * (p.devices.count + 1) *
                       static_cast<int64_t>(microbatchCandidates(p).size());
    auto dp = solveDP(p, opts);
    ASSERT_TRUE(dp.ok()) << where << dp.error().message;
    EXPECT_LT(relDiff(evaluate(p, dp->solution).step_time_s, dp->step_time_s), 1e-9) << where;
    for (const ScheduleTried &t : dp->stats.schedules) {
      const size_t at = t.why.find("searched at the ");
      if (!pipeline::splitsBackward(t.schedule) || at == std::string::npos) continue;
      ++narrowed;
      const int stages = std::stoi(t.why.substr(at + 16));
      Problem pinned = p;
      pinned.constraints.schedule = t.schedule;
      pinned.constraints.stages = stages;
      auto ex = solveExhaustive(pinned);
      if (t.outcome == ScheduleTried::Outcome::Chosen) {
        ++narrowed_won;
        ASSERT_TRUE(ex.ok()) << where << ex.error().message;
        EXPECT_EQ(dp->solution.numStages(), stages) << where << str(dp->solution);
        EXPECT_LT(relDiff(dp->step_time_s, ex->step_time_s), 1e-9) << where << "dp " << str(dp->solution)
                                                                   << "exhaustive " << str(ex->solution);
      } else {
        EXPECT_EQ(t.outcome, ScheduleTried::Outcome::TooLarge) << where << t.why;
        if (ex.ok()) {
          EXPECT_GE(ex->step_time_s, dp->step_time_s * (1 - 1e-9)) << where << str(ex->solution);
        }
      }
    }
  }
  std::cout << "narrowed " << narrowed << ", of them chosen " << narrowed_won << "\n";
  EXPECT_GT(narrowed, 20);
  EXPECT_GT(narrowed_won, 5);
}

TEST(SolveDP, MatchesExhaustiveSearchOnRandomInstances) {
  std::mt19937 rng(2024);
  int feasible = 0, infeasible = 0, recomputing = 0, sharding = 0, gpipe = 0, unequal = 0, multi_node = 0;
  int tensor_parallel = 0, tp_replicated = 0, tp_mixed = 0;
  int quantized_loses = 0, bound_tight = 0, synced = 0, tied_together = 0;
  for (int trial = 0; trial < 600; ++trial) {
    Problem p = randomProblem(rng, trial);
    ASSERT_TRUE(validate(p).ok()) << validate(p).message();
    std::ostringstream where;
    where << "trial " << trial << "\n";
    p.print(where);
    auto dp = expectMatchesExhaustive(p, where.str());
    if (!dp) {
      ++infeasible;
      continue;
    }
    ++feasible;
    const Evaluation ev = evaluate(p, dp->solution);
    for (Strategy s : {Strategy::Uniform, Strategy::Parameters, Strategy::Time}) {
      auto base = solveBaseline(p, s);
      if (!base.ok()) continue;
      EXPECT_LE(dp->step_time_s, base->step_time_s * (1 + 1e-9)) << where.str() << strategyName(s);
      EXPECT_LT(relDiff(base->step_time_s, evaluate(p, base->solution).step_time_s), 1e-12);
    }
    const Solution &s = dp->solution;
    gpipe += s.schedule == Schedule::GPipe;
    recomputing += std::any_of(s.stages.begin(), s.stages.end(), [](const Stage &x) { return x.recompute; });
    sharding += std::any_of(s.stages.begin(), s.stages.end(), [](const Stage &x) { return x.zero; });
    // Sharding costs no time, so the DP shards only where memory needs it
    // (or --zero 1 says so): the same plan without it does not fit.
    if (!p.force_zero)
      for (size_t i = 0; i < s.stages.size(); ++i)
        if (s.stages[i].zero) {
          Solution unsharded = s;
          unsharded.stages[i].zero = false;
          EXPECT_FALSE(evaluate(p, unsharded).feasible()) << where.str() << str(s);
        }
    unequal += std::any_of(s.stages.begin(), s.stages.end(),
                           [&](const Stage &x) { return x.replicas != s.stages[0].replicas; });
    multi_node += s.devicesUsed() > p.devices.per_node;
    tied_together += !p.tied.empty() && p.tied[0].bytes > 0 && s.stages[0].block_end == p.numBlocks();
    auto tp = [](const Stage &x) { return x.tensor_parallel > 1; };
    const bool any_tp = std::any_of(s.stages.begin(), s.stages.end(), tp);
    tensor_parallel += any_tp;
    tp_replicated += std::any_of(s.stages.begin(), s.stages.end(), [&](const Stage &x) { return tp(x) && x.replicas > 1; });
    tp_mixed += any_tp && !std::all_of(s.stages.begin(), s.stages.end(), tp);
    synced += std::any_of(ev.stages.begin(), ev.stages.end(), [](const StageCost &c) { return c.stat_sync_s > 0; });
    // Note [device quantum]: stage widths in multiples of 2 give a valid
    // plan no better than the optimum, and the relaxation a bound no worse.
    // Plans of the schedules the automatic search weighs after 1F1B are left
    // out here: the interleaved fold is not exact (Note [interleaved
    // layouts]), and the bound covers the schedule the plan has.
    auto plain = [](Schedule x) { return x == Schedule::GPipe || x == Schedule::OneFOneB; };
    if (p.devices.count < 2 || !plain(s.schedule)) continue;
    DPOptions halves;
    halves.device_quantum = 2;
    auto q = solveDP(p, halves);
    if (!q.ok() || !plain(q->solution.schedule)) continue; // no plan of even widths fits
    EXPECT_TRUE(evaluate(p, q->solution).feasible()) << where.str() << str(q->solution);
    EXPECT_LT(relDiff(evaluate(p, q->solution).step_time_s, q->step_time_s), 1e-9) << where.str();
    EXPECT_GE(q->step_time_s, dp->step_time_s * (1 - 1e-9)) << where.str() << str(q->solution);
    EXPECT_LE(q->stats.lower_bound_s, dp->step_time_s * (1 + 1e-9))
        << where.str() << "bound " << q->stats.lower_bound_s << " above the optimum " << str(dp->solution);
    quantized_loses += q->step_time_s > dp->step_time_s * (1 + 1e-9);
    bound_tight += relDiff(q->stats.lower_bound_s, dp->step_time_s) < 1e-9;
  }
  // The instances exercise what they are meant to.
  EXPECT_GE(feasible, 400);
  EXPECT_GE(infeasible, 60);
  EXPECT_GE(recomputing, 15);
  EXPECT_GE(sharding, 15);
  EXPECT_GE(gpipe, 30);
  EXPECT_GE(unequal, 30);
  EXPECT_GE(multi_node, 50);
  EXPECT_GE(tensor_parallel, 20);
  EXPECT_GE(tp_replicated, 5);
  EXPECT_GE(tp_mixed, 5);
  EXPECT_GE(synced, 20); // the DP planned replicated stages that synchronise batch statistics
  EXPECT_GE(tied_together, 10); // plans where a stage holds both readers of a tied parameter
  EXPECT_GE(quantized_loses, 30); // the restriction matters, so the bound is tested where it must hold
  EXPECT_GE(bound_tight, 100);
  std::cout << "quantum 2: loses on " << quantized_loses << ", bound exact on " << bound_tight << "\n";
  std::cout << "feasible " << feasible << ", infeasible " << infeasible << ", recomputing " << recomputing
            << ", sharding " << sharding
            << ", gpipe " << gpipe << ", unequal replicas " << unequal << ", multi-node " << multi_node
            << ", tensor-parallel " << tensor_parallel << " (replicated " << tp_replicated << ", mixed with degree 1 "
            << tp_mixed << "), synchronised statistics " << synced << ", tied parameter held once "
            << tied_together << "\n";
}

} // namespace
} // namespace rannc::partition
