// Step reporting without MPI: the --log line's keys (SPEC's contract) and
// arithmetic, the ETA format, the phase of each action, tokens per sample.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "executor/train/step_report.h"

namespace rannc::train {
namespace {

/// Two stages: stage 0 on ranks 0 and 1, stage 1 on rank 2.
StepContext twoStages() {
  StepContext c;
  c.ranks_of = {{0, 1}, {2}};
  c.samples_per_step = 32; // K x B
  return c;
}

StepTotals threeRanks() {
  StepTotals t;
  t.loss = 2.5;
  t.peak_memory_bytes = {100, 300, 200};
  t.peak_rss_bytes = {1000, 3000, 2000};
  t.phase_s = {{1.0, 2.0, 0.5, 0.1}, {1.5, 1.0, 0.25, 0.2}, {3.0, 4.0, 0.0, 0.3}};
  return t;
}

StepRecord oneBatch() {
  StepRecord r;
  r.step = 7;
  r.batch_losses = {2.5};
  r.step_time_s = 0.5;
  r.lr = 0.01;
  r.grad_norm = 1.25;
  return r;
}

TEST(StepReport, TheLogLineHasSpecsKeysFirst) {
  const nlohmann::ordered_json j = stepJson(oneBatch(), threeRanks(), twoStages());
  const std::vector<std::string> spec{"step", "loss", "samples_per_s", "step_time_s", "peak_memory_bytes",
                                      "peak_memory_bytes_per_rank"};
  std::vector<std::string> keys;
  for (const auto &[k, v] : j.items()) keys.push_back(k);
  ASSERT_GE(keys.size(), spec.size());
  EXPECT_EQ(std::vector<std::string>(keys.begin(), keys.begin() + long(spec.size())), spec);
  EXPECT_EQ(j["step"], 7);
  EXPECT_EQ(j["loss"], 2.5);
  EXPECT_EQ(j["step_time_s"], 0.5);
  EXPECT_EQ(j["lr"], 0.01);
  EXPECT_EQ(j["grad_norm"], 1.25);
  // One batch, no replica buckets, not skipped: none of the optional keys.
  for (const char *absent : {"tokens_per_s", "batch_losses", "allreduce_buckets_overlapped", "skipped"})
    EXPECT_FALSE(j.contains(absent)) << absent;
}

TEST(StepReport, ThroughputIsTheStepsSamplesOverItsTime) {
  StepContext c = twoStages();
  c.tokens_per_sample = 16;
  const nlohmann::ordered_json j = stepJson(oneBatch(), threeRanks(), c);
  EXPECT_DOUBLE_EQ(j["samples_per_s"].get<double>(), 64.0);  // 32 / 0.5
  EXPECT_DOUBLE_EQ(j["tokens_per_s"].get<double>(), 1024.0); // 32 * 16 / 0.5
}

TEST(StepReport, MemoryIsTheMaximumOverRanksAndListedPerRank) {
  const nlohmann::ordered_json j = stepJson(oneBatch(), threeRanks(), twoStages());
  EXPECT_EQ(j["peak_memory_bytes"], 300);
  EXPECT_EQ(j["peak_memory_bytes_per_rank"], (std::vector<int64_t>{100, 300, 200}));
  EXPECT_EQ(j["peak_rss_bytes"], 3000);
}

TEST(StepReport, StageTimesAreTheSlowestRankOfEachStagePerPhase) {
  const nlohmann::ordered_json j = stepJson(oneBatch(), threeRanks(), twoStages());
  const auto &st = j["stage_times_s"];
  ASSERT_EQ(st.size(), 2u);
  EXPECT_EQ(st[0]["stage"], 0);
  EXPECT_EQ(st[0]["forward_s"], 1.5);  // max(1.0, 1.5) over ranks 0, 1
  EXPECT_EQ(st[0]["backward_s"], 2.0); // max(2.0, 1.0)
  EXPECT_EQ(st[0]["comm_s"], 0.5);
  EXPECT_EQ(st[0]["update_s"], 0.2);
  EXPECT_EQ(st[1]["forward_s"], 3.0); // rank 2 alone
  EXPECT_EQ(st[1]["comm_s"], 0.0);
}

TEST(StepReport, OptionalKeysAppearWhenTheyApply) {
  StepRecord r = oneBatch();
  r.batch_losses = {2.0, 3.0}; // two accumulated batches
  r.skipped = true;
  StepContext c = twoStages();
  c.buckets_overlapped = {{3, 4}};
  const nlohmann::ordered_json j = stepJson(r, threeRanks(), c);
  EXPECT_EQ(j["batch_losses"], (std::vector<double>{2.0, 3.0}));
  EXPECT_EQ(j["allreduce_buckets_overlapped"], (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(j["skipped"], true);
}

TEST(StepReport, EtaForPeople) {
  EXPECT_EQ(formatEta(42), "42s");
  EXPECT_EQ(formatEta(59.6), "1m00s"); // rounded to the second
  EXPECT_EQ(formatEta(185), "3m05s");
  EXPECT_EQ(formatEta(3725), "1h02m"); // 1 h 2 min 5 s
}

TEST(StepReport, ActionsCountInTheirPhase) {
  EXPECT_EQ(phaseOf(schedule::ActionKind::Forward), kForward);
  EXPECT_EQ(phaseOf(schedule::ActionKind::Backward), kBackward);
  EXPECT_EQ(phaseOf(schedule::ActionKind::OptimizerStep), kUpdate);
  for (auto k : {schedule::ActionKind::RecvActivations, schedule::ActionKind::SendActivations,
                 schedule::ActionKind::RecvGradients, schedule::ActionKind::SendGradients,
                 schedule::ActionKind::AllReduce})
    EXPECT_EQ(phaseOf(k), kComm);
}

TEST(StepReport, TokensPerSampleComeFromTheFirstIntegerSequenceInput) {
  ir::Graph g;
  auto input = [&](ir::DType t, ir::Shape s) {
    ir::Value v;
    v.dtype = t;
    v.shape = std::move(s);
    v.shape_known = true;
    v.kind = ir::ValueKind::Input;
    g.inputs.push_back(g.addValue(v));
  };
  input(ir::DType::F32, {ir::Dim::batch(), ir::Dim::fixed(8)}); // features: not tokens
  EXPECT_EQ(tokensPerSample(g), 0);
  input(ir::DType::I64, {ir::Dim::batch()}); // labels [B]: no sequence
  EXPECT_EQ(tokensPerSample(g), 0);
  input(ir::DType::I64, {ir::Dim::batch(), ir::Dim::fixed(16)}); // token ids [B, 16]
  EXPECT_EQ(tokensPerSample(g), 16);
}

} // namespace
} // namespace rannc::train
