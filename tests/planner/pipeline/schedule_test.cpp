// The pipeline model on its own: names, orders, in-flight counts and the
// closed form on hand-computed cases.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "planner/pipeline/schedule.h"

namespace rannc::pipeline {
namespace {

std::string str(const std::vector<Pass> &order) {
  std::string s;
  for (const Pass &p : order) s += (p.forward ? "F" : "B") + std::to_string(p.microbatch) + " ";
  return s;
}

TEST(Schedule, NamesParseBack) {
  for (Schedule s : kSchedules) {
    auto parsed = parseSchedule(scheduleName(s));
    ASSERT_TRUE(parsed.ok()) << scheduleName(s);
    EXPECT_EQ(*parsed, s);
  }
  EXPECT_STREQ(scheduleName(Schedule::GPipe), "gpipe");
  EXPECT_STREQ(scheduleName(Schedule::OneFOneB), "1f1b");
  auto bad = parseSchedule("1F1B");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().message, "must be gpipe or 1f1b (got '1F1B')");
  EXPECT_FALSE(parseSchedule("").ok());
}

TEST(Schedule, ChoicesJoinEveryName) {
  EXPECT_EQ(scheduleChoices(), "gpipe or 1f1b");
  EXPECT_EQ(scheduleChoices([](Schedule s) { return s == Schedule::GPipe ? "G" : "O"; }), "G or O");
}

TEST(StageOrder, GPipeAndOneFOneB) {
  EXPECT_EQ(str(stageOrder(Schedule::GPipe, 1, 3, 3)), "F0 F1 F2 B2 B1 B0 ");
  // Stage 0 of 4 warms up with 3 forwards; the last stage alternates at once.
  EXPECT_EQ(str(stageOrder(Schedule::OneFOneB, 0, 4, 6)), "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5 ");
  EXPECT_EQ(str(stageOrder(Schedule::OneFOneB, 3, 4, 3)), "F0 B0 F1 B1 F2 B2 ");
  EXPECT_EQ(str(stageOrder(Schedule::OneFOneB, 0, 4, 2)), "F0 F1 B0 B1 ");
}

TEST(StageOrder, EveryMicrobatchOnceEachWayForwardFirstAndInFlightIsItsPeak) {
  for (Schedule s : kSchedules)
    for (int stages = 1; stages <= 6; ++stages)
      for (int mb = 1; mb <= 8; ++mb)
        for (int stage = 0; stage < stages; ++stage) {
          std::vector<int> fwd(mb, 0), bwd(mb, 0);
          int alive = 0, peak = 0;
          for (const Pass &p : stageOrder(s, stage, stages, mb)) {
            ASSERT_TRUE(p.microbatch >= 0 && p.microbatch < mb);
            if (p.forward) {
              ++fwd[p.microbatch];
              peak = std::max(peak, ++alive);
            } else {
              EXPECT_EQ(fwd[p.microbatch], 1) << "backward before forward";
              ++bwd[p.microbatch];
              --alive;
            }
          }
          EXPECT_EQ(fwd, std::vector<int>(mb, 1));
          EXPECT_EQ(bwd, std::vector<int>(mb, 1));
          EXPECT_EQ(microbatchesInFlight(s, stage, stages, mb), peak)
              << scheduleName(s) << " stage " << stage << " of " << stages << ", M=" << mb;
        }
}

TEST(PipelineTime, HandComputed) {
  // F = (1, 3, 2), G = (2, 2, 4), M = 4.
  const std::vector<StageSlots> slots{{1, 2}, {3, 2}, {2, 4}};
  // GPipe: (1+3+2) + (2+2+4) = 14, plus 3 x (max F 3 + max G 4) = 21: 35.
  PipelineTime g = pipelineTime(Schedule::GPipe, slots, 4);
  EXPECT_DOUBLE_EQ(g.fill_drain_s, 14);
  EXPECT_DOUBLE_EQ(g.steady_s, 21);
  EXPECT_DOUBLE_EQ(g.total(), 35);
  // 1F1B: 14, plus 3 x max(F+G) = 3 x 6 = 18: 32; stage 2 is the first with 6.
  PipelineTime o = pipelineTime(Schedule::OneFOneB, slots, 4);
  EXPECT_DOUBLE_EQ(o.fill_drain_s, 14);
  EXPECT_DOUBLE_EQ(o.steady_s, 18);
  EXPECT_EQ(o.bottleneck_stage, 2);
  // One micro-batch: the fill and drain alone, for either schedule.
  EXPECT_DOUBLE_EQ(pipelineTime(Schedule::GPipe, slots, 1).total(), 14);
  EXPECT_DOUBLE_EQ(pipelineTime(Schedule::OneFOneB, slots, 1).total(), 14);
  // Ties go to the first stage.
  EXPECT_EQ(pipelineTime(Schedule::OneFOneB, {{1, 1}, {0.5, 1.5}}, 2).bottleneck_stage, 0);
}

} // namespace
} // namespace rannc::pipeline
