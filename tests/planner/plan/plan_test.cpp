#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdlib>
#include <sstream>

#include "planner/driver/options.h"
#include "planner/driver/planner.h"
#include "planner/import/model_format.h"
#include "planner/plan/plan.h"
#include "planner/plan/show.h"

namespace rannc::plan {
namespace {

std::string gptPath() {
  const char *dir = std::getenv("RANNC_TEST_MODELS");
  return std::string(dir ? dir : "models") + "/gpt/model.onnx";
}

proto::Plan gptPlan(int gpus, int microbatches = 2, const std::string &device_type = "cpu") {
  planner::PlanOptions o;
  o.model = gptPath();
  o.gpus = gpus;
  o.device_type = device_type;
  o.batch_size = 8;
  o.microbatches = microbatches;
  o.stages = gpus; // pin a pure pipeline: these tests are about the plan file
  o.replicas = {1};
  o.schedule = pipeline::Schedule::OneFOneB; // one stage per rank (the automatic search interleaves this GPT)
  o.profile = "analytic";
  std::ostringstream log;
  auto p = planner::makePlan(o, log);
  EXPECT_TRUE(p.ok()) << p.error().message;
  return p.ok() ? *p : proto::Plan();
}

TEST(Shape, ParseInvertsShapeString) {
  ir::Shape s{ir::Dim::batch(), ir::Dim::fixed(16), ir::Dim::batch(16, 0), ir::Dim::batch(2, -1), ir::Dim::unknown()};
  bool rank_known = false;
  auto back = parseShape(ir::shapeString(s), rank_known);
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_TRUE(rank_known);
  EXPECT_EQ(*back, s);
  ASSERT_TRUE(parseShape("[*]", rank_known).ok());
  EXPECT_FALSE(rank_known);
  EXPECT_FALSE(parseShape("[B,x]", rank_known).ok());
}

TEST(Plan, GraphSurvivesTheProto) {
  auto g = import::importModel(gptPath());
  ASSERT_TRUE(g.ok()) << g.error().message;
  auto back = graphFromProto(graphToProto(*g));
  ASSERT_TRUE(back.ok()) << back.error().message;
  std::ostringstream a, b;
  g->print(a);
  back->print(b);
  EXPECT_EQ(a.str(), b.str());
}

TEST(Plan, EncodingsRoundTripToIdenticalBytes) {
  proto::Plan p = gptPlan(3);
  auto pb = encodePlan(p, ".pb");
  ASSERT_TRUE(pb.ok());
  std::string dir = ::testing::TempDir();
  for (const char *ext : {".pbtxt", ".json"}) {
    ASSERT_TRUE(writePlan(p, dir + "plan" + ext).ok());
    auto read = readPlan(dir + "plan" + ext);
    ASSERT_TRUE(read.ok()) << read.error().message;
    EXPECT_EQ(*encodePlan(*read, ".pb"), *pb) << ext;
  }
  // Planning twice gives the same bytes.
  EXPECT_EQ(*encodePlan(gptPlan(3), ".pb"), *pb);
}

TEST(Plan, StagesCoverEveryOpOnce) {
  proto::Plan p = gptPlan(4);
  ASSERT_EQ(plan::worldSize(p), 4);
  EXPECT_TRUE(structuralProblems(p).empty());
  ASSERT_EQ(p.stages_size(), 4);
  EXPECT_EQ(p.stages(0).op_begin(), 0);
  EXPECT_EQ(p.stages(3).op_end(), p.graph().ops_size());
  for (int s = 1; s < 4; ++s) EXPECT_EQ(p.stages(s).op_begin(), p.stages(s - 1).op_end());
}

TEST(Plan, StructuralProblemsNameTheField) {
  proto::Plan p = gptPlan(2);
  ASSERT_EQ(p.stages_size(), 2);
  p.mutable_stages(1)->set_op_begin(p.stages(0).op_end() + 1); // one op in no stage
  p.mutable_stages(1)->clear_ranks();
  p.mutable_stages(1)->add_ranks(0); // rank 0 twice
  p.set_microbatches(3);             // does not divide 8
  auto problems = structuralProblems(p);
  std::string all;
  for (const auto &s : problems) all += s + "\n";
  EXPECT_NE(all.find("stages[1].op_begin"), std::string::npos) << all;
  EXPECT_NE(all.find("ops in no stage"), std::string::npos) << all;
  EXPECT_NE(all.find("rank 0 is used by more than one stage"), std::string::npos) << all;
  EXPECT_NE(all.find("microbatches: 3 does not divide global_batch_size 8"), std::string::npos) << all;
}

/// The GPT on 2 pipeline ranks under `schedule`, 4 micro-batches, v chunks each.
Expected<proto::Plan> pipelinedGpt(pipeline::Schedule schedule, int virtual_stages) {
  planner::PlanOptions o;
  o.model = gptPath();
  o.gpus = 2;
  o.device_type = "cpu";
  o.batch_size = 8;
  o.microbatches = 4;
  o.stages = 2;
  o.virtual_stages = virtual_stages;
  o.replicas = {1};
  o.schedule = schedule;
  o.profile = "analytic";
  std::ostringstream log;
  return planner::makePlan(o, log);
}

TEST(Plan, InterleavedPlanPutsTwoChunksOnEachRankAndShowsItsBubble) {
  auto il = pipelinedGpt(pipeline::Schedule::Interleaved1F1B, 2);
  ASSERT_TRUE(il.ok()) << il.error().message;
  auto one = pipelinedGpt(pipeline::Schedule::OneFOneB, 1);
  ASSERT_TRUE(one.ok()) << one.error().message;
  EXPECT_TRUE(structuralProblems(*il).empty()) << structuralProblems(*il).front();
  EXPECT_EQ(il->virtual_stages(), 2);
  EXPECT_EQ(il->format_version(), 5u); // Note [plan format versions]
  ASSERT_EQ(il->stages_size(), 4);
  EXPECT_EQ(worldSize(*il), 2);
  for (int s = 0; s < 4; ++s)
    EXPECT_EQ(std::vector<int>(il->stages(s).ranks().begin(), il->stages(s).ranks().end()), std::vector<int>{s % 2});
  std::ostringstream json;
  printPlanJson(*il, json);
  const auto j = nlohmann::json::parse(json.str());
  EXPECT_EQ(j["schedule"], "interleaved-1f1b");
  EXPECT_EQ(j["virtual_stages"], 2);
  EXPECT_EQ(j["pipeline_ranks"], 2);
  EXPECT_EQ(j["world_size"], 2);
  // The bubble shrinks from 1F1B's on the same two ranks (about (p-1)/(M+p-1)
  // = 1/5 there, (p-1)/(vM+p-1) = 1/9 interleaved when the chunks balance).
  EXPECT_LT(pipelineBubbleFraction(*il), pipelineBubbleFraction(*one));
  EXPECT_GT(pipelineBubbleFraction(*il), 0.0);
  // A hand edit that puts a chunk on other ranks, or M that p does not divide, is refused.
  proto::Plan bad = *il;
  bad.mutable_stages(2)->set_ranks(0, 1);
  bad.set_microbatches(1);
  std::string all;
  for (const auto &p : structuralProblems(bad)) all += p + "\n";
  EXPECT_NE(all.find("stages[2].ranks: under virtual_stages 2 stage 2 runs on the ranks of stage 0"),
            std::string::npos) << all;
  EXPECT_NE(all.find("the micro-batch count 1 must be a multiple of 2"), std::string::npos) << all;
  proto::Plan split = *il; // a chunk in groups its rank does not have
  split.mutable_stages(3)->set_tensor_parallel(2);
  all.clear();
  for (const auto &p : structuralProblems(split)) all += p + "\n";
  EXPECT_NE(all.find("stages[3].tensor_parallel: 2, but under virtual_stages 2 stage 3 runs in the groups of stage 1, "
                     "1-way"),
            std::string::npos) << all;
  // What it does not run yet is refused at plan time.
  planner::PlanOptions o;
  o.schedule = pipeline::Schedule::Interleaved1F1B;
  o.stages = 2;
  planner::PlanFlags flags;
  flags.schedule = "interleaved-1f1b";
  o.virtual_stages = 1;
  EXPECT_FALSE(planner::finishPlanOptions(flags, o).ok());
  o.virtual_stages = 2;
  flags.recompute = "on"; // recomputing chunks (Note [interleaved 1F1B])
  EXPECT_TRUE(planner::finishPlanOptions(flags, o).ok());
  flags.zero = "1"; // sharding chunks
  EXPECT_TRUE(planner::finishPlanOptions(flags, o).ok());
  flags.zero = "auto";
  flags.tensor_parallel = "2"; // every chunk 2-way (Note [interleaved layouts])
  EXPECT_TRUE(planner::finishPlanOptions(flags, o).ok());
  flags.tensor_parallel = "2,2,2"; // a degree per chunk: a rank's chunks share its groups
  auto refused = planner::finishPlanOptions(flags, o);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.message(), "--tensor-parallel: under interleaved-1f1b one degree, or one per pipeline rank (2 for "
                               "--stages 2), which its chunks share");
  flags.tensor_parallel = "auto";
  flags.recompute = "auto";
  EXPECT_TRUE(planner::finishPlanOptions(flags, o).ok());
  flags.schedule = "1f1b";
  EXPECT_FALSE(planner::finishPlanOptions(flags, o).ok()); // chunks without the schedule that runs them
}

TEST(Plan, SplitBackwardPlansRecomputeAndTensorParallelStages) {
  // Issue 28: ZB-H1 and ZB-H2 plan recomputing and tensor-parallel stages
  // (Note [recomputing split backward], Note [split backward of a
  // tensor-parallel stage] in planner/partition/evaluate.cpp), and `check`
  // takes them.
  for (pipeline::Schedule schedule : {pipeline::Schedule::ZBH1, pipeline::Schedule::ZBH2})
    for (bool tp : {false, true}) {
      const std::string where = std::string(pipeline::scheduleName(schedule)) + (tp ? " tp 2" : " recompute on");
      planner::PlanOptions o;
      o.model = gptPath();
      o.gpus = tp ? 4 : 2;
      o.device_type = "cpu";
      o.batch_size = 8;
      o.microbatches = 4;
      o.stages = 2;
      o.schedule = schedule;
      o.profile = "analytic";
      if (tp) o.tensor_parallel = {2};
      else o.recompute = planner::Recompute::On;
      std::ostringstream log;
      auto plan = planner::makePlan(o, log);
      ASSERT_TRUE(plan.ok()) << where << ": " << plan.error().message;
      EXPECT_TRUE(structuralProblems(*plan).empty()) << where << ": " << structuralProblems(*plan).front();
      ASSERT_EQ(plan->stages_size(), 2) << where;
      for (const proto::Stage &st : plan->stages()) {
        EXPECT_EQ(st.recompute(), !tp) << where;
        EXPECT_EQ(tensorParallel(st), tp ? 2 : 1) << where;
      }
    }
}

TEST(Plan, ScheduleFieldConvertsBothWays) {
  for (pipeline::Schedule s : pipeline::kSchedules) {
    auto back = scheduleFromProto(scheduleToProto(s));
    ASSERT_TRUE(back.ok()) << pipeline::scheduleName(s);
    EXPECT_EQ(*back, s);
    EXPECT_STREQ(scheduleName(scheduleToProto(s)), pipeline::scheduleName(s));
  }
  EXPECT_EQ(scheduleToProto(pipeline::Schedule::GPipe), proto::GPIPE);
  EXPECT_EQ(scheduleToProto(pipeline::Schedule::OneFOneB), proto::ONE_F_ONE_B);
  auto none = scheduleFromProto(proto::SCHEDULE_UNSPECIFIED);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.error().message, "schedule: must be GPIPE, ONE_F_ONE_B, ZB_H1, ZB_H2 or INTERLEAVED_1F1B");
  EXPECT_STREQ(scheduleName(proto::SCHEDULE_UNSPECIFIED), "unspecified");
  proto::Plan p = gptPlan(2);
  p.set_schedule(proto::SCHEDULE_UNSPECIFIED);
  auto problems = structuralProblems(p);
  EXPECT_NE(std::find(problems.begin(), problems.end(), none.error().message), problems.end());
}

TEST(Plan, ValuesWithMixedSamplesCrossOnlyBetweenEqualReplicaCounts) {
  proto::Plan p = gptPlan(2);
  ASSERT_EQ(p.stages_size(), 2);
  // Mark every float value stage 1 reads from stage 0 as having its samples
  // mixed (Note [batch layout]), as after a BatchNorm.
  const int cut = p.stages(0).op_end();
  int marked = 0;
  for (int n = 0; n < cut; ++n)
    for (auto &out : *p.mutable_graph()->mutable_ops(n)->mutable_outputs())
      if (out.dtype() == "f32") {
        out.set_batch_blocks(-1);
        ++marked;
      }
  ASSERT_GT(marked, 0);
  p.set_format_version(2); // batch layouts are format version 2 (Note [plan format versions])
  EXPECT_TRUE(structuralProblems(p).empty()); // 1 and 1 replicas: nothing to split
  p.mutable_stages(1)->add_ranks(2);          // now 1 and 2 replicas
  std::string all;
  for (const auto &s : structuralProblems(p)) all += s + "\n";
  EXPECT_NE(all.find("stages[1]: reads '"), std::string::npos) << all;
  EXPECT_NE(all.find("cannot be split between 1 and 2 replicas"), std::string::npos) << all;
}

TEST(Plan, NewerFormatIsRefused) {
  proto::Plan p = gptPlan(1);
  p.set_format_version(kFormatVersion + 1);
  std::string path = ::testing::TempDir() + "future.pb";
  ASSERT_TRUE(writePlan(p, path).ok());
  auto r = readPlan(path);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("newer than this rannc understands"), std::string::npos);
}

TEST(Plan, RuntimeReserveIsInTheCapacityAndShown) {
  // Note [runtime reserve]: a GPU plan's capacity is memory x (1 - margin)
  // less the device's reserve, which the plan carries and show prints.
  proto::Plan p = gptPlan(2, 2, "a100-40g");
  auto preset = cluster::clusterFromPreset("a100-40g", 2);
  ASSERT_TRUE(preset.ok()) << preset.error().message;
  const int64_t reserve = preset->device.runtime_reserve_bytes;
  ASSERT_GT(reserve, 0);
  EXPECT_EQ(p.cluster().device().runtime_reserve_bytes(), reserve);
  EXPECT_EQ(gptPlan(2).cluster().device().runtime_reserve_bytes(), 0); // cpu reserves nothing
  EXPECT_EQ(clusterFromProto(p.cluster()), *preset);
  const double memory = double(p.cluster().device().memory_bytes());
  for (const auto &s : p.stages())
    EXPECT_EQ(s.estimates().memory_capacity_bytes(), int64_t(memory * (1 - 0.1) - double(reserve)));
  std::ostringstream table, json;
  printPlanTable(p, table);
  EXPECT_NE(table.str().find("runtime reserve: " + bytesText(double(reserve))), std::string::npos) << table.str();
  printPlanJson(p, json);
  EXPECT_EQ(nlohmann::json::parse(json.str())["device_runtime_reserve_bytes"].get<int64_t>(), reserve);
}

Expected<proto::Plan> resnetPlan(bool exact, int microbatches = 0) {
  const char *dir = std::getenv("RANNC_TEST_MODELS");
  planner::PlanOptions o;
  o.model = std::string(dir ? dir : "models") + "/resnet18/model.onnx";
  o.gpus = 4;
  o.batch_size = 8;
  o.stages = 2;
  o.replicas = {2};
  o.microbatches = microbatches;
  o.exact_batchnorm = exact;
  o.profile = "analytic";
  std::ostringstream log;
  return planner::makePlan(o, log);
}

TEST(BatchStatistics, ExactPlansOneMicroBatchAndSaysSo) {
  // Note [batch statistics]: the DP searches one micro-batch count, the plan
  // records the mode (format version 4), and nothing is left to warn about.
  auto exact = resnetPlan(true);
  ASSERT_TRUE(exact.ok()) << exact.error().message;
  EXPECT_EQ(exact->microbatches(), 1);
  EXPECT_EQ(exact->batchnorm(), "exact");
  EXPECT_EQ(requiredFormatVersion(*exact), 4u);
  EXPECT_TRUE(batchStatisticsNotes(*exact).empty());
  EXPECT_TRUE(structuralProblems(*exact).empty());
  std::ostringstream table;
  printPlanTable(*exact, table);
  EXPECT_NE(table.str().find("batchnorm: exact: one micro-batch"), std::string::npos) << table.str();
  EXPECT_EQ(table.str().find("warning: batchnorm"), std::string::npos) << table.str();
  // The same layout without the flag: each replica's 4 samples, one note per stage.
  auto local = resnetPlan(false, 1);
  ASSERT_TRUE(local.ok()) << local.error().message;
  EXPECT_EQ(local->batchnorm(), "");
  // The synchronised statistics' all-reduces cost time (Note [partition cost
  // model]): both stages are replicated and hold BatchNorms, so the exact
  // plan's best step is slower than the best over the same layouts without them.
  EXPECT_GT(exact->estimates().step_time_s(), local->estimates().step_time_s());
  auto notes = batchStatisticsNotes(*local);
  ASSERT_EQ(notes.size(), 2u);
  EXPECT_NE(notes[0].find("over 4 sample(s) at a time"), std::string::npos) << notes[0];
  EXPECT_NE(notes[0].find("--batchnorm exact"), std::string::npos) << notes[0];
  // A model without BatchNorm has nothing to keep exact: the field stays unset.
  planner::PlanOptions o;
  o.model = gptPath();
  o.batch_size = 8;
  o.exact_batchnorm = true;
  o.profile = "analytic";
  std::ostringstream log;
  auto gpt = planner::makePlan(o, log);
  ASSERT_TRUE(gpt.ok()) << gpt.error().message;
  EXPECT_EQ(gpt->batchnorm(), "");
}

TEST(BatchStatistics, ExactRefusesSeveralMicroBatches) {
  auto pinned = resnetPlan(true, 2);
  ASSERT_FALSE(pinned.ok());
  EXPECT_NE(pinned.error().message.find("--batchnorm exact plans BatchNorm models in one micro-batch"),
            std::string::npos)
      << pinned.error().message;
  auto edited = resnetPlan(true);
  ASSERT_TRUE(edited.ok()) << edited.error().message;
  edited->set_microbatches(2); // a hand edit
  auto problems = structuralProblems(*edited);
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_NE(problems[0].find("batchnorm: exact needs microbatches: 1, the plan has 2"), std::string::npos)
      << problems[0];
  edited->set_microbatches(1);
  edited->set_batchnorm("sync");
  problems = structuralProblems(*edited);
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_NE(problems[0].find("batchnorm: 'sync' is not exact"), std::string::npos) << problems[0];
}

} // namespace
} // namespace rannc::plan
