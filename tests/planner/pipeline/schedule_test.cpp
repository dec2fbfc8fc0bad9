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
  for (const Pass &p : order) s += (p.forward ? "F" : p.weight ? "W" : "B") + std::to_string(p.microbatch) + " ";
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
  EXPECT_STREQ(scheduleName(Schedule::ZBH1), "zb-h1");
  EXPECT_STREQ(scheduleName(Schedule::ZBH2), "zb-h2");
  EXPECT_STREQ(scheduleName(Schedule::Interleaved1F1B), "interleaved-1f1b");
  auto bad = parseSchedule("1F1B");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().message, "must be gpipe, 1f1b, zb-h1, zb-h2 or interleaved-1f1b (got '1F1B')");
  EXPECT_FALSE(parseSchedule("").ok());
}

TEST(Schedule, ChoicesJoinEveryName) {
  EXPECT_EQ(scheduleChoices(), "gpipe, 1f1b, zb-h1, zb-h2 or interleaved-1f1b");
  EXPECT_EQ(scheduleChoices([](Schedule s) { return s == Schedule::GPipe ? "G" : "O"; }), "G, O, O, O or O");
}

TEST(StageOrder, GPipeAndOneFOneB) {
  EXPECT_EQ(str(stageOrder(Schedule::GPipe, 1, 3, 3)), "F0 F1 F2 B2 B1 B0 ");
  // Stage 0 of 4 warms up with 3 forwards; the last stage alternates at once.
  EXPECT_EQ(str(stageOrder(Schedule::OneFOneB, 0, 4, 6)), "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5 ");
  EXPECT_EQ(str(stageOrder(Schedule::OneFOneB, 3, 4, 3)), "F0 B0 F1 B1 F2 B2 ");
  EXPECT_EQ(str(stageOrder(Schedule::OneFOneB, 0, 4, 2)), "F0 F1 B0 B1 ");
}

TEST(StageOrder, ZeroBubbleH1DelaysEachStagesWeightsByItsIndex) {
  // Note [zero bubble H1]: 1F1B's F/B order; stage s's W lags its B by s.
  EXPECT_EQ(str(stageOrder(Schedule::ZBH1, 0, 2, 4)), "F0 F1 B0 W0 F2 B1 W1 F3 B2 W2 B3 W3 ");
  EXPECT_EQ(str(stageOrder(Schedule::ZBH1, 1, 2, 4)), "F0 B0 F1 B1 W0 F2 B2 W1 F3 B3 W2 W3 ");
  EXPECT_EQ(str(stageOrder(Schedule::ZBH1, 3, 4, 5)), "F0 B0 F1 B1 F2 B2 F3 B3 W0 F4 B4 W1 W2 W3 W4 ");
  EXPECT_EQ(str(stageOrder(Schedule::ZBH1, 1, 4, 2)), "F0 F1 B0 B1 W0 W1 ");
  EXPECT_TRUE(splitsBackward(Schedule::ZBH1));
  EXPECT_FALSE(splitsBackward(Schedule::OneFOneB));
  EXPECT_FALSE(splitsBackward(Schedule::GPipe));
}

TEST(StageOrder, ZeroBubbleH2WarmsUpTwiceAsLongAndDelaysWeightsByTwiceTheIndex) {
  // Note [zero bubble H2]: stage s of S warms up with 2(S-s-1) forwards, its W lags its B by 2s.
  EXPECT_EQ(str(stageOrder(Schedule::ZBH2, 0, 2, 4)), "F0 F1 F2 B0 W0 F3 B1 W1 B2 W2 B3 W3 ");
  EXPECT_EQ(str(stageOrder(Schedule::ZBH2, 1, 2, 4)), "F0 B0 F1 B1 F2 B2 W0 F3 B3 W1 W2 W3 ");
  EXPECT_EQ(str(stageOrder(Schedule::ZBH2, 0, 4, 8)),
            "F0 F1 F2 F3 F4 F5 F6 B0 W0 F7 B1 W1 B2 W2 B3 W3 B4 W4 B5 W5 B6 W6 B7 W7 ");
  EXPECT_EQ(str(stageOrder(Schedule::ZBH2, 3, 4, 8)),
            "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 W0 F7 B7 W1 W2 W3 W4 W5 W6 W7 ");
  // Fewer micro-batches than the warm-up: every forward, then every B with its W.
  EXPECT_EQ(str(stageOrder(Schedule::ZBH2, 0, 4, 3)), "F0 F1 F2 B0 W0 B1 W1 B2 W2 ");
  EXPECT_TRUE(splitsBackward(Schedule::ZBH2));
  // 2S-1 micro-batches held on every stage; the W queue is the lag 2s.
  EXPECT_EQ(microbatchesInFlight(Schedule::ZBH2, 3, 4, 8), 7);
  EXPECT_EQ(microbatchesInFlight(Schedule::ZBH2, 0, 4, 5), 5);
  EXPECT_EQ(weightQueuePeak(Schedule::ZBH2, 2, 4, 8), 4);
  EXPECT_EQ(weightQueuePeak(Schedule::ZBH2, 3, 4, 4), 3);
  // Its warm-up's sends are not awaited before a backward; ZB-H1's are.
  EXPECT_FALSE(waitsForSendsBeforeBackward(Schedule::ZBH2, 1));
  EXPECT_TRUE(waitsForSendsBeforeBackward(Schedule::ZBH1, 1));
  EXPECT_FALSE(waitsForSendsBeforeBackward(Schedule::Interleaved1F1B, 2));
}

TEST(StageOrder, EveryMicrobatchOnceEachWayForwardFirstAndInFlightIsItsPeak) {
  for (Schedule s : kSchedules)
    for (int stages = 1; stages <= 6; ++stages)
      for (int mb = 1; mb <= 8; ++mb)
        for (int stage = 0; stage < stages; ++stage) {
          std::vector<int> fwd(mb, 0), bwd(mb, 0), wgt(mb, 0);
          // In flight until the pass that ends a micro-batch: its backward, or a split one's W.
          int alive = 0, peak = 0, queued = 0, queue_peak = 0;
          for (const Pass &p : stageOrder(s, stage, stages, mb)) {
            ASSERT_TRUE(p.microbatch >= 0 && p.microbatch < mb);
            if (p.forward) {
              ++fwd[p.microbatch];
              peak = std::max(peak, ++alive);
            } else if (p.weight) {
              ASSERT_TRUE(splitsBackward(s));
              EXPECT_EQ(bwd[p.microbatch], 1) << "W before B";
              ++wgt[p.microbatch];
              --alive;
              --queued;
            } else {
              EXPECT_EQ(fwd[p.microbatch], 1) << "backward before forward";
              ++bwd[p.microbatch];
              if (splitsBackward(s)) {
                queue_peak = std::max(queue_peak, queued); // queued while this B runs
                ++queued;
              } else {
                --alive;
              }
            }
          }
          EXPECT_EQ(fwd, std::vector<int>(mb, 1));
          EXPECT_EQ(bwd, std::vector<int>(mb, 1));
          EXPECT_EQ(wgt, std::vector<int>(mb, splitsBackward(s) ? 1 : 0));
          EXPECT_EQ(microbatchesInFlight(s, stage, stages, mb), peak)
              << scheduleName(s) << " stage " << stage << " of " << stages << ", M=" << mb;
          EXPECT_EQ(weightQueuePeak(s, stage, stages, mb), queue_peak)
              << scheduleName(s) << " stage " << stage << " of " << stages << ", M=" << mb;
        }
}

/// "F0.1 B2.0 ": the passes with their chunks.
std::string chunked(const std::vector<Pass> &order) {
  std::string s;
  for (const Pass &p : order)
    s += (p.forward ? "F" : "B") + std::to_string(p.microbatch) + "." + std::to_string(p.chunk) + " ";
  return s;
}

TEST(RankOrder, InterleavedIsMegatronsOrder) {
  // p = 2 ranks, v = 2 chunks, M = 4: rank 0 warms up with 2 (p-1) + (v-1) p = 4
  // forwards, groups of p = 2 micro-batches through chunk 0, then chunk 1;
  // backwards start at the last chunk.
  EXPECT_EQ(chunked(rankOrder(Schedule::Interleaved1F1B, 0, 2, 2, 4)),
            "F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 B2.1 B3.1 B2.0 B3.0 ");
  // Rank 1 (the last): (v-1) p = 2 forwards of warm-up.
  EXPECT_EQ(chunked(rankOrder(Schedule::Interleaved1F1B, 1, 2, 2, 4)),
            "F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 F2.1 B2.1 F3.1 B3.1 B2.0 B3.0 ");
  // One chunk: 1F1B's order, and every other schedule's own order.
  for (Schedule s : kSchedules)
    for (int r = 0; r < 3; ++r) EXPECT_EQ(rankOrder(s, r, 3, 1, 5), stageOrder(s, r, 3, 5)) << scheduleName(s);
  EXPECT_EQ(stageOrder(Schedule::Interleaved1F1B, 1, 3, 5), stageOrder(Schedule::OneFOneB, 1, 3, 5));
}

TEST(RankOrder, InterleavedRunsEveryChunkPassOnceAndItsPeaksAreTheClosedForms) {
  for (int p = 1; p <= 5; ++p)
    for (int v = 2; v <= 4; ++v)
      for (int M = p; M <= 4 * p; M += p)
        for (int r = 0; r < p; ++r) {
          const std::string where = "p=" + std::to_string(p) + " v=" + std::to_string(v) + " M=" +
                                    std::to_string(M) + " rank " + std::to_string(r);
          std::vector<std::vector<int>> fwd(v, std::vector<int>(M, 0)), bwd = fwd;
          std::vector<int> alive(v, 0), peak(v, 0);
          int total = 0, total_peak = 0;
          for (const Pass &pass : rankOrder(Schedule::Interleaved1F1B, r, p, v, M)) {
            ASSERT_TRUE(pass.chunk >= 0 && pass.chunk < v && pass.microbatch >= 0 && pass.microbatch < M) << where;
            ASSERT_FALSE(pass.weight);
            const int c = pass.chunk;
            if (pass.forward) {
              ++fwd[c][pass.microbatch];
              peak[c] = std::max(peak[c], ++alive[c]);
              total_peak = std::max(total_peak, ++total);
            } else {
              EXPECT_EQ(fwd[c][pass.microbatch], 1) << where << ": backward before forward";
              ++bwd[c][pass.microbatch];
              --alive[c];
              --total;
            }
          }
          EXPECT_EQ(fwd, std::vector<std::vector<int>>(v, std::vector<int>(M, 1))) << where;
          EXPECT_EQ(bwd, fwd) << where;
          // Megatron's warm-up plus one, in closed form, is the order's peak.
          EXPECT_EQ(rankMicrobatchesInFlight(Schedule::Interleaved1F1B, r, p, v, M), total_peak) << where;
          EXPECT_EQ(total_peak, std::min(v * M, 2 * (p - r - 1) + (v - 1) * p + 1)) << where;
          for (int c = 0; c < v; ++c)
            EXPECT_EQ(microbatchesInFlight(Schedule::Interleaved1F1B, c * p + r, p * v, M, v), peak[c]) << where;
          // Each chunk's own peak summed (what evaluate() charges a rank) bounds the rank's.
          int sum = 0;
          for (int c = 0; c < v; ++c) sum += peak[c];
          EXPECT_GE(sum, total_peak) << where;
        }
}

TEST(Interleaving, WhatItRefuses) {
  EXPECT_EQ(interleavingProblem(Schedule::Interleaved1F1B, 4, 2, 8), "");
  EXPECT_EQ(interleavingProblem(Schedule::OneFOneB, 4, 1, 6), "");
  EXPECT_EQ(interleavingProblem(Schedule::Interleaved1F1B, 4, 2, 6),
            "interleaved-1f1b sends micro-batches through the chunks in groups of the 4 pipeline ranks "
            "(Megatron-LM's schedule): the micro-batch count 6 must be a multiple of 4");
  EXPECT_EQ(interleavingProblem(Schedule::ZBH1, 2, 2, 4),
            "zb-h1 runs one stage per rank: --virtual-stages 2 needs --schedule interleaved-1f1b");
  EXPECT_NE(interleavingProblem(Schedule::Interleaved1F1B, 2, 0, 4), "");
  EXPECT_TRUE(interleaves(Schedule::Interleaved1F1B));
  EXPECT_FALSE(interleaves(Schedule::OneFOneB));
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
  // ZB-H1 with W = (1, 1, 2) of G: 1F1B's 14 less 2 x (1 + 1), the W's of
  // every stage but the last, = 10, plus the same 18: 28.
  const std::vector<StageSlots> split{{1, 2, 1}, {3, 2, 1}, {2, 4, 2}};
  PipelineTime z = pipelineTime(Schedule::ZBH1, split, 4);
  EXPECT_DOUBLE_EQ(z.fill_drain_s, 10);
  EXPECT_DOUBLE_EQ(z.steady_s, 18);
  // Fewer micro-batches than stages: no steady state, 1F1B's form.
  EXPECT_DOUBLE_EQ(pipelineTime(Schedule::ZBH1, split, 2).total(), 14 + 6);
  // Equal stages F = B = W = 1, S = 4, M = 8: M (F+B+W) + (S-1)(F+B-W) = 24 + 3 = 27,
  // where 1F1B takes 24 + 3 x 3 = 33.
  const std::vector<StageSlots> equal(4, StageSlots{1, 2, 1});
  EXPECT_DOUBLE_EQ(pipelineTime(Schedule::ZBH1, equal, 8).total(), 27);
  EXPECT_DOUBLE_EQ(pipelineTime(Schedule::OneFOneB, equal, 8).total(), 33);
  // ZB-H2 there: M (F+B+W) + (S-1) max(F, F+B-2W) = 24 + 3 max(1, 0) = 27, ZB-H1's.
  EXPECT_DOUBLE_EQ(pipelineTime(Schedule::ZBH2, equal, 8).total(), 27);
  // With B = 2 > W = 1 (G = 3): 32 + 3 max(1, 1) = 35, where ZB-H1 takes
  // 32 + 3 (1+2-1) = 38; the last stage's whole slot 4 plus 3 x 1 fills.
  const std::vector<StageSlots> heavy_b(4, StageSlots{1, 3, 1});
  PipelineTime h2 = pipelineTime(Schedule::ZBH2, heavy_b, 8);
  EXPECT_DOUBLE_EQ(h2.fill_drain_s, 4 + 3);
  EXPECT_DOUBLE_EQ(h2.steady_s, 7 * 4);
  EXPECT_DOUBLE_EQ(pipelineTime(Schedule::ZBH1, heavy_b, 8).total(), 38);
  // M = 5 < 2S-1 = 7: the warm-up never fills; ZB-H1's form, 20 + 3 x 2 = 26.
  EXPECT_DOUBLE_EQ(pipelineTime(Schedule::ZBH2, heavy_b, 5).total(), 26);
  // Ties go to the first stage.
  EXPECT_EQ(pipelineTime(Schedule::OneFOneB, {{1, 1}, {0.5, 1.5}}, 2).bottleneck_stage, 0);
  // Interleaved, p = 2 ranks of v = 2 chunks, f = 1, b = 2, M = 4:
  // v M (f+b) + (p-1)(f+b) = 24 + 3 = 27, where 1F1B over the same two ranks
  // (F = 2, B = 4 each) takes 4 x 6 + 1 x 6 = 30: the bubble 6 / 2 = 3.
  const std::vector<StageSlots> chunks(4, StageSlots{1, 2});
  PipelineTime il = pipelineTime(Schedule::Interleaved1F1B, chunks, 4, 2);
  EXPECT_DOUBLE_EQ(il.total(), 27);
  EXPECT_DOUBLE_EQ(pipelineTime(Schedule::OneFOneB, std::vector<StageSlots>(2, StageSlots{2, 4}), 4).total(), 30);
  // Unequal: ranks' T = (1+2) + (2+2) = 7 and (3+2) + (1+1) = 7 (rank 0 first);
  // M T + (sum 14 - T) / v = 4 x 7 + 7 / 2 = 31.5.
  PipelineTime uneven = pipelineTime(Schedule::Interleaved1F1B, {{1, 2}, {3, 2}, {2, 2}, {1, 1}}, 4, 2);
  EXPECT_DOUBLE_EQ(uneven.total(), 31.5);
  EXPECT_EQ(uneven.bottleneck_stage, 0);
}

} // namespace
} // namespace rannc::pipeline
