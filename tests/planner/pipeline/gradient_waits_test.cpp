// Which gradient sends a rank awaits (Note [awaited gradient sends]): a
// hand-replayed case, the schedules whose hand rules the replay must agree
// with, and what the memory model is told stays in flight.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "planner/pipeline/gradient_waits.h"

namespace rannc::pipeline {
namespace {

std::vector<std::vector<Pass>> orders(Schedule s, int ranks, int virtual_stages, int microbatches) {
  std::vector<std::vector<Pass>> out;
  for (int r = 0; r < ranks; ++r) out.push_back(rankOrder(s, r, ranks, virtual_stages, microbatches));
  return out;
}

std::string str(const std::vector<SentGradient> &gs) {
  std::string out;
  for (const SentGradient &g : gs) out += "s" + std::to_string(g.stage) + "m" + std::to_string(g.microbatch) + " ";
  return out;
}

TEST(AwaitedGradients, InterleavedTwoByTwoByHand) {
  // 2 ranks, 2 chunks, M = 2; F takes 1, B 2. Rank 0 runs stages 0 and 2,
  // rank 1 stages 1 and 3:
  //   rank 0: F0@0 [0,1) F1@0 [1,2) F0@2 [2,3) F1@2 [3,4) B0@2 [6,8) B1@2 [9,11) B0@0 [11,13) B1@0 [13,15)
  //   rank 1: F0@1 [1,2) F1@1 [2,3) F0@3 [3,4) B0@3 [4,6) F1@3 [6,7) B1@3 [7,9) B0@1 [9,11) B1@1 [11,13)
  // Stage 2's gradient of micro-batch 0 (sent at 8) is taken in when stage 1
  // starts B0 at 9, when rank 0 starts B1@2: awaited there; and so on.
  auto waits = awaitedGradients(orders(Schedule::Interleaved1F1B, 2, 2, 2));
  ASSERT_TRUE(waits.ok());
  const auto &r0 = (*waits)[0], &r1 = (*waits)[1];
  ASSERT_EQ(r0.size(), 8u);
  ASSERT_EQ(r1.size(), 8u);
  EXPECT_EQ(str(r0[5]), "s2m0 ");
  EXPECT_EQ(str(r0[6]), "s2m1 ");
  EXPECT_EQ(str(r1[5]), "s3m0 ");
  EXPECT_EQ(str(r1[6]), "s3m1 ");
  EXPECT_EQ(str(r1[7]), "s1m0 ");
  for (int i : {0, 1, 2, 3, 4, 7}) EXPECT_TRUE(r0[i].empty()) << i;
  for (int i : {0, 1, 2, 3, 4}) EXPECT_TRUE(r1[i].empty()) << i;
  // Rank 1 holds stage 3's micro-batch-0 gradient through F1@3, nothing else
  // of it between passes; stage 1's last one is awaited at the step's end.
  const auto held = inFlightGradients(Schedule::Interleaved1F1B, 2, 2, 2)[1];
  ASSERT_EQ(held.size(), 8u);
  for (size_t i = 0; i < held.size(); ++i)
    EXPECT_EQ(held[i], (std::vector<int>{0, i == 4 ? 1 : 0})) << i;
}

TEST(AwaitedGradients, OneChunkSchedulesAwaitEverySentGradientBeforeTheNextBackward) {
  // 1F1B and ZB-H1 wait for every send before a backward (Note [send
  // buffers]); ZB-H2 for every gradient (Note [zero bubble H2]): the replay
  // finds each of those waits free of cycles, and awaits all of them.
  for (Schedule s : {Schedule::OneFOneB, Schedule::ZBH1, Schedule::ZBH2})
    for (int stages = 2; stages <= 6; ++stages)
      for (int mb = 1; mb <= 12; ++mb) {
        auto all = orders(s, stages, 1, mb);
        auto waits = awaitedGradients(all);
        ASSERT_TRUE(waits.ok());
        for (int r = 1; r < stages; ++r) {
          int sent = 0;
          for (size_t i = 0; i < all[r].size(); ++i) {
            const Pass &p = all[r][i];
            if (p.forward || p.weight) continue;
            EXPECT_EQ(int((*waits)[r][i].size()), sent)
                << scheduleName(s) << " stage " << r << " of " << stages << ", M " << mb << ", pass " << i;
            sent = 1;
          }
        }
      }
}

TEST(AwaitedGradients, InterleavedHoldsAtMostTheRanksGroupInFlight) {
  // A rank holds a gradient it has sent until the producer's rank reaches
  // that backward: under interleaving, up to a group of micro-batches, never
  // more than the ranks (counted for every rank of these cases).
  for (int ranks = 2; ranks <= 4; ++ranks)
    for (int chunks = 2; chunks <= 3; ++chunks)
      for (int mb = ranks; mb <= 3 * ranks; mb += ranks)
        for (int r = 0; r < ranks; ++r) {
          const auto held = inFlightGradients(Schedule::Interleaved1F1B, ranks, chunks, mb)[r];
          int most = 0;
          for (const auto &at : held)
            for (int c = 0; c < chunks; ++c) {
              EXPECT_GE(at[c], 0);
              most = std::max(most, at[c]);
            }
          EXPECT_LE(most, ranks) << ranks << " ranks, " << chunks << " chunks, M " << mb << ", rank " << r;
        }
  // Rank 0 of 4 sends stage 4's gradients to stage 3 on rank 3, which runs
  // its group's stage-7 backwards first (B0@3 after B3@7): rank 0's chunk 1
  // holds two at once, where rank 1's stage 5, sending to stage 4 on the
  // rank next to it, holds one.
  auto most = [](int rank, int chunk) {
    int n = 0;
    const auto held = inFlightGradients(Schedule::Interleaved1F1B, 4, 2, 8);
    for (const auto &at : held[rank]) n = std::max(n, at[chunk]);
    return n;
  };
  EXPECT_EQ(most(0, 1), 2);
  EXPECT_EQ(most(1, 1), 1);
}

TEST(AwaitedGradients, OrdersThatDeadlockAreAnError) {
  // Stage 0 wants micro-batch 0's backward before stage 1 has had its forward.
  const std::vector<std::vector<Pass>> stuck = {{Pass{false, 0}, Pass{true, 0}}, {Pass{true, 0}, Pass{false, 0}}};
  auto waits = awaitedGradients(stuck);
  ASSERT_FALSE(waits.ok());
  EXPECT_NE(waits.error().message.find("deadlock"), std::string::npos) << waits.error().message;
}

TEST(AwaitedGradients, FarProducersTakeTheGradientInLater) {
  // 3 stages, 1F1B, M = 2; stage 2 also receives from stage 0 (a skip
  // connection): its gradients are awaited only once stage 0 has started
  // that micro-batch's backward, later than stage 1 does.
  auto all = orders(Schedule::OneFOneB, 3, 1, 2);
  auto chain = awaitedGradients(all), skip = awaitedGradients(all, {{}, {0}, {0, 1}});
  ASSERT_TRUE(chain.ok());
  ASSERT_TRUE(skip.ok());
  // Stage 2: F0 B0 F1 B1; before B1 the chain awaits m0, the skip does not:
  // stage 0 starts B0 only after stage 1 has finished it.
  EXPECT_EQ(str((*chain)[2][3]), "s2m0 ");
  EXPECT_EQ(str((*skip)[2][3]), "");
}

} // namespace
} // namespace rannc::pipeline
