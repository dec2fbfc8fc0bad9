// Coarsening units into blocks for the stage DP.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "planner/partition/coarsen.h"
#include "planner/partition/evaluate.h"
#include "planner/partition/solve.h"

namespace rannc::partition {
namespace {

/// n units of 1 s forward per sample, no parameters, with the given inner cut bytes.
Problem units(const std::vector<double> &inner_cuts) {
  Problem p;
  const int n = static_cast<int>(inner_cuts.size()) + 1;
  for (int i = 0; i < n; ++i) {
    Block b;
    b.fwd.per_sample_s = 1;
    p.blocks.push_back(b);
  }
  p.cut_bytes_per_sample.push_back(0);
  for (double c : inner_cuts) p.cut_bytes_per_sample.push_back(c);
  p.cut_bytes_per_sample.push_back(0);
  p.devices.memory_bytes = 1e9;
  p.devices.intra_node = p.devices.inter_node = {1e9, 0};
  return p;
}

TEST(Coarsen, KeepsFewUnitsAsTheyAre) {
  auto c = coarsen(units({5, 5}), CoarsenOptions{4});
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->unit_begin, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(c->problem.numBlocks(), 3);
}

TEST(Coarsen, CutsWhereLittleCrossesWithinTheImbalanceLimit) {
  // Six equal units into 2 blocks. Cutting at 3 (9 bytes) is balanced: cost
  // 9/9 = 1 + deviations 0. Cutting at 2 (1 byte): 1/9 + (2/3-1)^2 + (4/3-1)^2
  // = 1/9 + 1/9 + 1/9 = 0.33 < 1, and 4 units <= 1.5 x 3 fits the limit.
  const std::vector<double> cuts{9, 1, 9, 9, 9};
  auto loose = coarsen(units(cuts), CoarsenOptions{2, 1, 1.5});
  ASSERT_TRUE(loose.ok());
  EXPECT_EQ(loose->unit_begin, (std::vector<int>{0, 2, 6}));
  // With at most 1.2 x 3 = 3.6 per block only the balanced cut is allowed.
  auto tight = coarsen(units(cuts), CoarsenOptions{2, 1, 1.2});
  ASSERT_TRUE(tight.ok());
  EXPECT_EQ(tight->unit_begin, (std::vector<int>{0, 3, 6}));
  // Three blocks: the balanced split 0,2,4,6 uses the cheap cut at 2 and pays
  // 1/9 + 9/9 = 1.11; moving the other cut only unbalances (0,2,5,6: 1.11 + 1/4 + 1/4).
  auto three = coarsen(units(cuts), CoarsenOptions{3, 1, 1.5});
  EXPECT_EQ(three->unit_begin, (std::vector<int>{0, 2, 4, 6}));
}

TEST(Coarsen, NeverCutsWhereForbidden) {
  const double no = std::numeric_limits<double>::infinity();
  auto c = coarsen(units({no, 1, no, no, 1}), CoarsenOptions{3});
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->unit_begin, (std::vector<int>{0, 2, 5, 6}));
  for (double x : c->problem.cut_bytes_per_sample) EXPECT_TRUE(std::isfinite(x));
  // Only two allowed cuts: at most three blocks whatever K says.
  auto many = coarsen(units({no, 1, no, no, 1}), CoarsenOptions{5});
  EXPECT_EQ(many->problem.numBlocks(), 3);
}

TEST(Coarsen, MergesNumbers) {
  Problem p = units({4, 3});
  p.blocks[0].param_bytes = 10, p.blocks[1].param_bytes = 20;
  p.blocks[0].activation_bytes_per_sample = 1, p.blocks[1].activation_bytes_per_sample = 2;
  p.blocks[0].working_bytes_per_sample = 7, p.blocks[1].working_bytes_per_sample = 5;
  p.blocks[1].bwd = {0.5, 2};
  auto c = coarsen(p, CoarsenOptions{1});
  ASSERT_TRUE(c.ok());
  ASSERT_EQ(c->problem.numBlocks(), 1);
  const Block &b = c->problem.blocks[0];
  EXPECT_EQ(b.fwd.per_sample_s, 3);
  EXPECT_EQ(b.bwd.fixed_s, 0.5);
  EXPECT_EQ(b.bwd.per_sample_s, 2);
  EXPECT_EQ(b.param_bytes, 30);
  EXPECT_EQ(b.activation_bytes_per_sample, 3);
  EXPECT_EQ(b.working_bytes_per_sample, 7); // max, not sum: one op runs at a time
  EXPECT_EQ(c->problem.cut_bytes_per_sample, (std::vector<double>{0, 0}));
}

TEST(Coarsen, RejectsBadInput) {
  EXPECT_FALSE(coarsen(units({1}), CoarsenOptions{0}).ok());
  Problem p = units({1});
  p.cut_bytes_per_sample.pop_back();
  auto c = coarsen(p);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.error().message.find("coarsen: invalid partition problem"), std::string::npos) << c.error().message;
}

TEST(Coarsen, BlockPlansMapBackToTheSameUnitPlan) {
  std::mt19937 rng(5);
  auto uni = [&](double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(rng); };
  int planned = 0;
  for (int trial = 0; trial < 50; ++trial) {
    Problem p;
    const int n = 20 + static_cast<int>(rng() % 60);
    for (int i = 0; i < n; ++i) {
      Block b;
      b.fwd = {uni(0, 1e-3), uni(1e-3, 1e-2)};
      b.bwd = {uni(0, 2e-3), uni(2e-3, 2e-2)};
      b.param_bytes = std::floor(uni(0, 1e6));
      b.activation_bytes_per_sample = std::floor(uni(0, 1e4));
      b.working_bytes_per_sample = std::floor(uni(0, 1e4));
      p.blocks.push_back(b);
    }
    for (int i = 0; i <= n; ++i) p.cut_bytes_per_sample.push_back(std::floor(uni(0, 1e4)));
    p.batch_size = 64;
    p.devices.count = 8;
    p.devices.per_node = 4;
    p.devices.memory_bytes = 3e7;
    p.devices.intra_node = {1e9, 1e-6};
    p.devices.inter_node = {1e8, 1e-5};
    p.optimizer_bytes_per_param_byte = 2;
    // One schedule: "the DP on the units can only do better" holds for an
    // exact search; the automatic choice bounds and caps the split schedules'
    // searches (Note [automatic schedule] in dp.cpp), on blocks and units alike.
    p.constraints.schedule = Schedule::OneFOneB;
    const int K = 4 + static_cast<int>(rng() % 12);
    auto c = coarsen(p, CoarsenOptions{K, 8});
    ASSERT_TRUE(c.ok()) << c.error().message;
    ASSERT_EQ(c->problem.numBlocks(), K);
    ASSERT_EQ(c->unit_begin.front(), 0);
    ASSERT_EQ(c->unit_begin.back(), n);
    // Balance: every block within 1.5 x the average cost (time share + parameter share), or a single unit.
    double total_time = 0, total_params = 0;
    for (const Block &b : p.blocks) total_time += b.fwd.at(8) + b.bwd.at(8), total_params += b.param_bytes;
    for (int j = 0; j < K; ++j) {
      double cost = 0;
      for (int i = c->unit_begin[j]; i < c->unit_begin[j + 1]; ++i)
        cost += (p.blocks[i].fwd.at(8) + p.blocks[i].bwd.at(8)) / total_time + p.blocks[i].param_bytes / total_params;
      EXPECT_TRUE(cost <= 1.5 * 2 / K * (1 + 1e-9) || c->unit_begin[j + 1] - c->unit_begin[j] == 1) << "block " << j;
    }
    auto plan = solveDP(c->problem);
    if (!plan.ok()) continue;
    ++planned;
    const Solution units_plan = expandToUnits(*c, plan->solution);
    const Evaluation fine = evaluate(p, units_plan);
    EXPECT_TRUE(fine.feasible());
    EXPECT_NEAR(fine.step_time_s, plan->step_time_s, 1e-9 * plan->step_time_s) << "trial " << trial;
    // A block's working bytes bound its units' from above (Note [partition
    // cost model]: the units after one in the same block free theirs before
    // its backward, which the block's one line cannot say), so the block plan
    // may only over-state the memory.
    const double coarse = evaluate(c->problem, plan->solution).peak_memory_bytes;
    EXPECT_LE(fine.peak_memory_bytes, coarse * (1 + 1e-12)) << "trial " << trial;
    // The DP on the units can only do better: every block plan is a unit plan.
    auto on_units = solveDP(p);
    ASSERT_TRUE(on_units.ok());
    EXPECT_LE(on_units->step_time_s, plan->step_time_s * (1 + 1e-9));
  }
  EXPECT_GE(planned, 30);
}

} // namespace
} // namespace rannc::partition
