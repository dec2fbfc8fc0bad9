// The trainer's tensor-parallel parts (Note [tensor parallel ranks] in
// executor/train/tensor_parallel.h): the layout of a stage's ranks, the local
// graph's op ranges, sharing from a group's leader and, under mpirun with t
// ranks (one group), ParameterUpdate's step on the sharded MLP of
// tests/executor/tp_mlp.h against the unsharded MLP trained on each rank:
// the same gradient norm, clipping and parameters after every step.
#include <gtest/gtest.h>

#include <memory>
#include <sstream>

#include "executor/comm/comm.h"
#include "executor/runtime/collectives.h"
#include "executor/train/optim.h"
#include "executor/train/parameter_update.h"
#include "executor/train/scatter_gather.h"
#include "executor/train/tensor_parallel.h"
#include "executor/train/zero.h"
#include "tests/executor/tp_mlp.h"

namespace rannc::train {
namespace {

using tptest::Mlp;

using tptest::world;

// Note [scatter/gather in the executor]: the t slices, joined in position
// order, are the flattened value and then zeros, for any size.
TEST(ScatterGather, SlicesJoinToTheValueWhateverItsSize) {
  for (const std::vector<int64_t> &shape : {std::vector<int64_t>{}, {1}, {7}, {5, 3}, {2, 4, 6}})
    for (int t : {2, 3, 4}) {
      const torch::Tensor v = torch::randn(shape);
      const int64_t n = v.numel(), chunk = (n + t - 1) / t;
      std::vector<torch::Tensor> slices;
      for (int p = 0; p < t; ++p) {
        slices.push_back(flatSlice(v, p, t));
        ASSERT_EQ(slices.back().sizes(), torch::IntArrayRef({chunk})) << "t " << t << " position " << p;
      }
      const torch::Tensor joined = torch::cat(slices);
      EXPECT_TRUE(torch::equal(joined.narrow(0, 0, n).reshape(shape), v)) << "t " << t;
      EXPECT_TRUE(torch::equal(joined.narrow(0, n, t * chunk - n), torch::zeros({t * chunk - n}))) << "t " << t;
    }
}

TEST(TensorParallelRanks, GroupsAreConsecutiveRunsOfTheDegree) {
  const std::vector<int> ranks{4, 5, 6, 7, 8, 9}; // a stage of 3 replicas x TP 2 from rank 4
  EXPECT_EQ(groupLeaders(ranks, 2), (std::vector<int>{4, 6, 8}));
  EXPECT_EQ(groupLeaders(ranks, 1), ranks);
  const TensorParallelPlace p = placeOf(ranks, 2, 7);
  EXPECT_EQ(p.replica, 1);
  EXPECT_EQ(p.position, 1);
  EXPECT_FALSE(p.leader());
  EXPECT_TRUE(placeOf(ranks, 2, 8).leader());
  EXPECT_EQ(placeOf(ranks, 3, 8).replica, 1);
  EXPECT_EQ(placeOf(ranks, 3, 8).position, 1);
  EXPECT_THROW(groupLeaders(ranks, 4), std::invalid_argument);
  EXPECT_THROW(placeOf(ranks, 2, 3), std::invalid_argument);
}

TEST(TensorParallelRanks, InsertedCollectivesJoinTheStageOfTheirReader) {
  Mlp whole(0, 0), local(2, 1);
  // whole: MatMul h, Add, Tanh, MatMul o, Add y, MatMul z, Mul, ReduceMean (8 nodes).
  ASSERT_EQ(whole.g.nodes.size(), 8u);
  ASSERT_EQ(local.g.nodes.size(), 12u);
  // Stages [0,4) and [4,8): the sum before `y` and the copy before `z` go to stage 1.
  const auto ranges = localRanges(whole.g, local.g, {{0, 4}, {4, 8}});
  EXPECT_EQ(ranges, (std::vector<std::pair<int, int>>{{0, 5}, {5, 12}}));
  EXPECT_EQ(local.g.nodes[5].op_type, "TensorParallelSum");
  EXPECT_EQ(localRanges(whole.g, whole.g, {{0, 3}, {3, 8}}), (std::vector<std::pair<int, int>>{{0, 3}, {3, 8}}));
  EXPECT_THROW(localRanges(local.g, whole.g, {{0, 8}}), std::invalid_argument) << "the graphs swapped";
}

TEST(TensorParallelRanks, EveryDeviceGetsTheLeadersTensors) {
  comm::Communicator &group = world();
  std::vector<torch::Tensor> ts{group.rank() == 0 ? torch::arange(6, torch::kFloat).view({2, 3}) : torch::Tensor(),
                                torch::Tensor(),
                                group.rank() == 0 ? torch::full({4}, 2.5, torch::kDouble) : torch::ones({9})};
  shareFromLeader(group, ts, torch::kCPU);
  ASSERT_TRUE(ts[0].defined());
  EXPECT_TRUE(torch::equal(ts[0], torch::arange(6, torch::kFloat).view({2, 3})));
  EXPECT_FALSE(ts[1].defined());
  EXPECT_EQ(ts[2].scalar_type(), torch::kDouble);
  EXPECT_TRUE(torch::equal(ts[2], torch::full({4}, 2.5, torch::kDouble)));
}

TEST(TensorParallelRanks, OptimizerStateCutAndJoinedBack) {
  torch::optim::AdamParamState s;
  s.step(3);
  s.exp_avg(torch::arange(8, torch::kFloat).view({2, 4}));
  s.exp_avg_sq(torch::ones({2, 4}));
  auto cut = mapOptimizerState(s, [](const torch::Tensor &t) { return runtime::shardOf(t, 1, 1, 2); });
  const auto &a = dynamic_cast<const torch::optim::AdamParamState &>(*cut);
  EXPECT_EQ(a.step(), 3);
  EXPECT_TRUE(torch::equal(a.exp_avg(), torch::tensor({2.f, 3.f, 6.f, 7.f}).view({2, 2})));
  EXPECT_FALSE(a.max_exp_avg_sq().defined());
}

/// Ten steps of `opts` on the sharded MLP with ParameterUpdate against the
/// unsharded one on this rank, clipping at a norm the first steps exceed.
void trainAgainstUnsharded(TrainOptions opts) {
  comm::Communicator &comm = world();
  const int t = comm.size(), me = comm.rank();
  Mlp whole(0, 0), local(t, 1);
  std::map<ir::ValueId, torch::Tensor> full, mine;
  tptest::mlpParameters(whole, me, t, full, mine);
  Setup s;
  auto *stage = s.plan.add_stages();
  for (int r = 0; r < t; ++r) stage->add_ranks(r);
  s.graph = local.g;
  s.ranges = {{0, int(local.g.nodes.size())}};
  s.stage = 0;
  s.tp = placeOf({stage->ranks().begin(), stage->ranks().end()}, t, me);
  s.tensor_parallel = {t};
  for (ir::ValueId p : whole.g.parameters)
    if (tptest::cutAxis(whole, p) >= 0) s.param_axes[p] = int(tptest::cutAxis(whole, p));
  runtime::StageRunner run = local.runner(mine);
  run.setTensorParallel(&comm);
  runtime::StageRunner ref = whole.runner(full);
  auto replicas = comm.split(me, me); // one replica: no data-parallel sums
  ParameterUpdate update(opts, comm, *replicas, s, run, std::nullopt,
                         [](std::unique_ptr<comm::Communicator> c) { return c; });
  auto ref_optimizer = makeOptimizer(opts, ref.parameters());
  int clipped = 0;
  std::ostringstream log;
  for (int step = 0; step < 10; ++step) {
    const torch::Tensor x = torch::randn({4, tptest::kD});
    run.forward(0, {{local.x, x}});
    ref.forward(0, {{whole.x, x}});
    run.backward(0, {}, 1.0);
    ref.backward(0, {}, 1.0);
    run.release(0);
    ref.release(0);
    update.reduce();
    StepRecord rec;
    rec.step = step;
    rec.lr = opts.lr;
    ASSERT_TRUE(update.step(rec, log).ok());
    double squared = 0;
    for (const auto &p : ref.parameters()) squared += p.grad().pow(2).sum().item<double>();
    const double norm = std::sqrt(squared);
    EXPECT_NEAR(rec.grad_norm, norm, 1e-5 * norm) << "step " << step;
    if (clipFactor(norm, opts.clip_grad_norm) < 1) ++clipped;
    scaleGradients(ref.parameters(), clipFactor(norm, opts.clip_grad_norm));
    ref_optimizer->step();
    ref_optimizer->zero_grad();
    for (ir::ValueId p : whole.g.parameters) {
      const int64_t axis = tptest::cutAxis(whole, p);
      const torch::Tensor want = axis < 0 ? full[p].detach() : runtime::shardOf(full[p].detach(), axis, me, t);
      EXPECT_TRUE(torch::allclose(run.parameter(p), want, 1e-5, 1e-6))
          << whole.g.values[p].name << " after step " << step << " on rank " << me << ": max diff "
          << (run.parameter(p) - want).abs().max().item<double>();
    }
  }
  EXPECT_GT(clipped, 0) << "the test should clip some steps";
}

TEST(TensorParallelTraining, SgdWithMomentumAndClipping) {
  TrainOptions opts;
  opts.lr = 0.05;
  opts.momentum = 0.9;
  opts.clip_grad_norm = 1.0;
  trainAgainstUnsharded(opts);
}

TEST(TensorParallelTraining, AdamWithClipping) {
  TrainOptions opts;
  opts.optimizer = OptimizerKind::Adam;
  opts.lr = 0.01;
  opts.clip_grad_norm = 1.0;
  trainAgainstUnsharded(opts);
}

} // namespace
} // namespace rannc::train
