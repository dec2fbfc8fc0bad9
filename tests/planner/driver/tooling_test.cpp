// The plan as an artifact: show, convert, check, simulate, dot and diff
// (planner/driver/tooling.h, planner/plan/*). Golden files live in
// tests/golden/tools/; regenerate them with RANNC_UPDATE_GOLDEN=1 after an
// intended change and review the diff.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <regex>
#include <sstream>

#include "planner/driver/planner.h"
#include "planner/driver/tooling.h"
#include "planner/plan/diff.h"
#include "planner/plan/dot.h"
#include "planner/plan/model_ref.h"
#include "planner/plan/plan.h"
#include "planner/plan/show.h"
#include "planner/support/files.h"
#include "tests/planner/driver/test_cluster.h"

namespace rannc::planner {
namespace {

using ir::Dim;
using ir::DType;
using ir::ValueKind;

const std::string kGolden = std::string(RANNC_SOURCE_DIR) + "/tests/golden/tools/";

std::string gptPath() {
  const char *dir = std::getenv("RANNC_TEST_MODELS");
  return std::string(dir ? dir : "models") + "/gpt/model.onnx";
}

std::string tmp(const std::string &name) { return ::testing::TempDir() + "plan_tools_" + name; }

/// Compares `actual` with the golden file, or rewrites it under RANNC_UPDATE_GOLDEN=1.
void expectGolden(const std::string &name, const std::string &actual) {
  const std::string path = kGolden + name;
  if (std::getenv("RANNC_UPDATE_GOLDEN")) {
    ASSERT_TRUE(writeFileAtomic(path, actual).ok()) << path;
    return;
  }
  auto want = readFile(path);
  ASSERT_TRUE(want.ok()) << want.error().message << " (run with RANNC_UPDATE_GOLDEN=1 to create it)";
  EXPECT_EQ(actual, *want) << "golden file " << path << " differs; RANNC_UPDATE_GOLDEN=1 rewrites it";
}

/// A fixed small training graph (10 ops, three units):
///   h1 = x·w1 [B,256]x[256,512]; a1 = relu; shp = Shape(a1)
///   h2 = a1·w2 [512,512]; a2 = relu; r = Reshape(a2, shp)
///   h3 = r·w3 [512,16]; d = h3 - y; loss = mean(d*d)
/// The Shape output is an integer value, recomputed by any stage that needs it.
ir::Graph tinyGraph() {
  ir::Graph g;
  g.name = "tiny";
  g.opset = 17;
  auto value = [&](const std::string &name, DType t, ir::Shape s, ValueKind k = ValueKind::Intermediate) {
    return g.addValue({name, t, std::move(s), true, k});
  };
  const ir::ValueId x = value("x", DType::F32, {Dim::batch(), Dim::fixed(256)}, ValueKind::Input);
  const ir::ValueId y = value("y", DType::F32, {Dim::batch(), Dim::fixed(16)}, ValueKind::Input);
  const ir::ValueId w1 = value("w1", DType::F32, {Dim::fixed(256), Dim::fixed(512)}, ValueKind::Parameter);
  const ir::ValueId w2 = value("w2", DType::F32, {Dim::fixed(512), Dim::fixed(512)}, ValueKind::Parameter);
  const ir::ValueId w3 = value("w3", DType::F32, {Dim::fixed(512), Dim::fixed(16)}, ValueKind::Parameter);
  g.inputs = {x, y};
  g.parameters = {w1, w2, w3};
  const ir::Shape hidden{Dim::batch(), Dim::fixed(512)};
  const ir::ValueId h1 = value("h1", DType::F32, hidden), a1 = value("a1", DType::F32, hidden);
  const ir::ValueId shp = value("shp", DType::I64, {Dim::fixed(2)});
  const ir::ValueId h2 = value("h2", DType::F32, hidden), a2 = value("a2", DType::F32, hidden);
  const ir::ValueId r = value("r", DType::F32, hidden);
  const ir::ValueId h3 = value("h3", DType::F32, {Dim::batch(), Dim::fixed(16)});
  const ir::ValueId d = value("d", DType::F32, {Dim::batch(), Dim::fixed(16)});
  const ir::ValueId sq = value("sq", DType::F32, {Dim::batch(), Dim::fixed(16)});
  const ir::ValueId loss = value("loss", DType::F32, {});
  g.addNode({"mm1", "MatMul", "", {x, w1}, {h1}, {}});
  g.addNode({"relu1", "Relu", "", {h1}, {a1}, {}});
  g.addNode({"shape", "Shape", "", {a1}, {shp}, {}});
  g.addNode({"mm2", "MatMul", "", {a1, w2}, {h2}, {}});
  g.addNode({"relu2", "Relu", "", {h2}, {a2}, {}});
  g.addNode({"reshape", "Reshape", "", {a2, shp}, {r}, {}});
  g.addNode({"mm3", "MatMul", "", {r, w3}, {h3}, {}});
  g.addNode({"sub", "Sub", "", {h3, y}, {d}, {}});
  g.addNode({"square", "Mul", "", {d, d}, {sq}, {}});
  g.addNode({"mean", "ReduceMean", "", {sq}, {loss}, {{"keepdims", int64_t{0}}}});
  g.loss = loss;
  return g;
}


/// The tiny graph planned for 2 ranks: 2 stages, batch 8 in 2 micro-batches, GPipe.
proto::Plan tinyPlan() {
  const ir::Graph g = tinyGraph();
  EXPECT_EQ(g.verify(), "");
  PlanOptions o;
  o.model = "tiny.onnx";
  o.gpus = 2;
  o.batch_size = 8;
  o.microbatches = 2;
  o.stages = 2;
  o.replicas = {1};
  o.schedule = pipeline::Schedule::GPipe;
  o.profile = "analytic";
  const cluster::ClusterSpec cluster = testCluster();
  auto costs = cost::analyticCosts(g, cost::formUnits(g), cluster.device, costBatchSizes(o));
  auto plan = planGraph(g, costs, cluster, o, std::string(64, 'a'));
  EXPECT_TRUE(plan.ok()) << plan.error().message;
  return plan.ok() ? *plan : proto::Plan();
}

/// The GPT planned by the driver. Most tests here are about a plan file of
/// one stage per rank, so 1F1B is pinned; unset, the automatic search
/// interleaves it (4 chunks on each of 2 ranks, Note [automatic schedule]).
proto::Plan gptPlan(int gpus, int stages, std::vector<int> replicas = {1}, int microbatches = 2,
                    std::optional<pipeline::Schedule> schedule = pipeline::Schedule::OneFOneB) {
  PlanOptions o;
  o.schedule = schedule;
  o.model = gptPath();
  o.gpus = gpus;
  o.batch_size = 8;
  o.microbatches = microbatches;
  o.stages = stages;
  o.replicas = std::move(replicas);
  o.profile = "analytic";
  std::ostringstream log;
  auto p = makePlan(o, log);
  EXPECT_TRUE(p.ok()) << p.error().message;
  return p.ok() ? *p : proto::Plan();
}

std::string joined(const std::vector<std::string> &v) {
  std::string s;
  for (const auto &x : v) s += x + "\n";
  return s;
}

/// Runs `check` on `plan` written to a temporary .pbtxt; returns ok and the output.
/// Options that trust the plan's model path: the test plans name models
/// outside the temporary folder they are checked in (Note [plan model path]).
CheckOptions trusting() {
  CheckOptions o;
  o.allow_model_outside_plan = true;
  return o;
}

std::pair<bool, std::string> check(const proto::Plan &plan, CheckOptions o = trusting()) {
  o.plan = tmp("check.pbtxt");
  EXPECT_TRUE(plan::writePlan(plan, o.plan).ok());
  std::ostringstream out, log;
  Status st = runCheck(o, out, log);
  return {st.ok(), out.str() + (st.ok() ? "" : st.message() + "\n")};
}

// ---------------------------------------------------------------- show

// Note [block count], Note [device quantum]: a deep model on 512 devices
// (beyond 256: the driver's smaller budget) plans without any request to
// coarsen, and where the DP restricted the stage widths its plan says how far
// from the best it can be.
TEST(PlanGraph, PlansThousandsOfDevicesAndStatesItsBound) {
  ir::Graph g;
  g.name = "deep";
  g.opset = 17;
  auto value = [&](const std::string &name, ir::Shape s, ValueKind k = ValueKind::Intermediate) {
    return g.addValue({name, DType::F32, std::move(s), true, k});
  };
  // Layers of 4 MiB of weights on 64 MiB devices: a stage holds a few (the
  // DP's work grows with the longest stage that fits, as on large models).
  const ir::Shape hidden{Dim::batch(), Dim::fixed(1024)};
  ir::ValueId x = value("x", hidden, ValueKind::Input);
  g.inputs = {x};
  for (int i = 0; i < 32; ++i) {
    const ir::ValueId w = value("w" + std::to_string(i), {Dim::fixed(1024), Dim::fixed(1024)}, ValueKind::Parameter);
    g.parameters.push_back(w);
    const ir::ValueId h = value("h" + std::to_string(i), hidden), a = value("a" + std::to_string(i), hidden);
    g.addNode({"mm" + std::to_string(i), "MatMul", "", {x, w}, {h}, {}});
    g.addNode({"relu" + std::to_string(i), "Relu", "", {h}, {a}, {}});
    x = a;
  }
  const ir::ValueId loss = value("loss", {});
  g.addNode({"mean", "ReduceMean", "", {x}, {loss}, {{"keepdims", int64_t{0}}}});
  g.loss = loss;
  ASSERT_EQ(g.verify(), "");
  cluster::ClusterSpec cluster = testCluster();
  cluster.num_nodes = 64;
  cluster.devices_per_node = 8;
  PlanOptions o;
  o.model = "deep.onnx";
  o.gpus = cluster.worldSize();
  o.batch_size = 512;
  o.profile = "analytic";
  auto costs = cost::analyticCosts(g, cost::formUnits(g), cluster.device, costBatchSizes(o));
  std::ostringstream log;
  auto plan = planGraph(g, costs, cluster, o, std::string(64, 'a'), &log);
  ASSERT_TRUE(plan.ok()) << plan.error().message;
  EXPECT_GT(plan::worldSize(*plan), 1);
  const std::string &planner = plan->planner();
  EXPECT_EQ(planner.rfind("auto (analytic costs", 0), 0u) << planner;
  std::smatch m;
  if (std::regex_search(planner, m, std::regex("stage widths in multiples of (\\d+): within ([0-9.]+)% of any plan"))) {
    EXPECT_GT(std::stoi(m[1]), 1) << planner;
    EXPECT_LT(std::stod(m[2]), 100) << planner;
  }
  EXPECT_NE(log.str().find("rannc-plan: searched"), std::string::npos) << log.str();
}

TEST(Show, TableGolden) {
  std::ostringstream os;
  plan::printPlanTable(tinyPlan(), os);
  expectGolden("show_tiny.txt", os.str());
}

TEST(Show, JsonKeepsTheSpecKeysAndAddsTheDerivedOnes) {
  const proto::Plan p = tinyPlan();
  std::ostringstream os;
  plan::printPlanJson(p, os);
  auto j = nlohmann::json::parse(os.str());
  for (const char *k : {"world_size", "num_stages", "global_batch_size", "microbatches", "schedule",
                        "predicted_step_time_s", "stages", "samples_per_s", "bubble_fraction", "microbatch_size"})
    EXPECT_TRUE(j.contains(k)) << k;
  EXPECT_DOUBLE_EQ(j["samples_per_s"].get<double>(), 8 / p.estimates().step_time_s());
  EXPECT_GT(j["bubble_fraction"].get<double>(), 0.0);
  EXPECT_LT(j["bubble_fraction"].get<double>(), 1.0);
  ASSERT_EQ(j["stages"].size(), 2u);
  for (const auto &s : j["stages"]) {
    for (const char *k : {"id", "ranks", "num_ops", "param_bytes", "peak_memory_bytes", "memory_capacity_bytes",
                          "fwd_time_s", "bwd_time_s", "first_op", "last_op", "grad_bytes", "optimizer_bytes",
                          "activation_bytes", "working_bytes", "buffer_bytes", "busy_time_s", "utilisation"})
      EXPECT_TRUE(s.contains(k)) << k;
    EXPECT_GT(s["utilisation"].get<double>(), 0.0);
    EXPECT_LE(s["utilisation"].get<double>(), 1.0);
  }
  EXPECT_EQ(j["stages"][0]["first_op"], "mm1");
  EXPECT_EQ(j["stages"][1]["last_op"], "mean");
}

TEST(Show, JsonOfARealPlanHasTheKeysScriptsUse) {
  proto::Plan p = gptPlan(2, 2);
  std::ostringstream os;
  plan::printPlanJson(p, os);
  auto j = nlohmann::json::parse(os.str());
  for (const char *k : {"world_size", "num_stages", "global_batch_size", "microbatches", "schedule",
                        "predicted_step_time_s", "stages"})
    EXPECT_TRUE(j.contains(k)) << k;
  EXPECT_EQ(j["world_size"], 2);
  EXPECT_EQ(j["schedule"], "1f1b"); // the partitioner's choice: never slower than GPipe
  for (const auto &s : j["stages"])
    for (const char *k : {"id", "ranks", "num_ops", "param_bytes", "peak_memory_bytes", "memory_capacity_bytes",
                          "fwd_time_s", "bwd_time_s"})
      EXPECT_TRUE(s.contains(k)) << k;
  // Every parameter is counted in exactly one stage here (no sharing).
  int64_t params = 0;
  for (const auto &s : j["stages"]) params += s["num_params"].get<int64_t>();
  EXPECT_EQ(params, 114020);
}

TEST(Show, BubbleIsTheTextbookFractionForEqualStages) {
  // S = 4 equal stages, M = 4: GPipe idles (S-1)/(M+S-1) = 3/7 of the pipeline phase.
  proto::Plan p;
  p.set_microbatches(4);
  p.set_schedule(proto::GPIPE);
  for (int s = 0; s < 4; ++s) {
    auto *e = p.add_stages()->mutable_estimates();
    e->set_fwd_time_s(1);
    e->set_bwd_time_s(2);
  }
  EXPECT_NEAR(plan::pipelineBubbleFraction(p), 3.0 / 7.0, 1e-12);
  p.set_schedule(proto::ONE_F_ONE_B); // the same closed form for equal stages
  EXPECT_NEAR(plan::pipelineBubbleFraction(p), 3.0 / 7.0, 1e-12);
  p.mutable_stages(0)->mutable_estimates()->set_bwd_time_s(5); // a bottleneck stage: 1F1B
  // Σ(F+G) = 6+3+3+3 = 15, (M-1)·max = 3·6 = 18, pipe = 33; busy = 4·15 = 60; 1 - 60/(4·33) = 6/11.
  EXPECT_NEAR(plan::pipelineBubbleFraction(p), 6.0 / 11.0, 1e-12);
}

// ---------------------------------------------------------------- convert

TEST(Convert, PbToPbtxtToJsonToPbIsIdentical) {
  for (const proto::Plan &p : {tinyPlan(), gptPlan(2, 2)}) {
    ASSERT_TRUE(plan::writePlan(p, tmp("a.pb")).ok());
    std::ostringstream log;
    ASSERT_TRUE(runConvert(tmp("a.pb"), tmp("b.pbtxt"), log).ok());
    ASSERT_TRUE(runConvert(tmp("b.pbtxt"), tmp("c.json"), log).ok());
    ASSERT_TRUE(runConvert(tmp("c.json"), tmp("d.pb"), log).ok());
    EXPECT_EQ(*readFile(tmp("a.pb")), *readFile(tmp("d.pb")));
    // And the text forms are the encoder's own bytes.
    EXPECT_EQ(*readFile(tmp("b.pbtxt")), *plan::encodePlan(p, ".pbtxt"));
    EXPECT_EQ(*readFile(tmp("c.json")), *plan::encodePlan(p, ".json"));
  }
}

TEST(Convert, ErrorsNameTheFile) {
  std::ostringstream log;
  Status st = runConvert(tmp("missing.pb"), tmp("x.pbtxt"), log);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("missing.pb: cannot open"), std::string::npos) << st.message();
  ASSERT_TRUE(plan::writePlan(tinyPlan(), tmp("a.pb")).ok());
  st = runConvert(tmp("a.pb"), tmp("x.txt"), log);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("x.txt: unknown plan extension '.txt'"), std::string::npos) << st.message();
}

// ---------------------------------------------------------------- format version

// Note [plan format versions]: a plan is written with the oldest version that
// holds its fields, so a plan using none of version 2's stays readable by
// older rannc, and each version-2 field alone lifts it to 2.
TEST(FormatVersion, FollowsTheFieldsAPlanUses) {
  const proto::Plan base = tinyPlan();
  EXPECT_EQ(base.format_version(), 1u);
  EXPECT_TRUE(plan::versionedFields(base).empty());
  const std::vector<std::pair<std::function<void(proto::Plan &)>, std::string>> edits = {
      {[](proto::Plan &p) { p.set_precision("bf16"); }, "precision: bf16"},
      {[](proto::Plan &p) { p.set_precision("fp16"); }, "precision: fp16"},
      {[](proto::Plan &p) { p.mutable_stages(1)->set_zero(1); }, "stages[1].zero: 1"},
      {[](proto::Plan &p) { p.mutable_stages(0)->set_recompute(true); }, "stages[0].recompute: true"},
      {[](proto::Plan &p) {
         p.mutable_graph()->mutable_ops(1)->mutable_outputs(0)->set_batch_blocks(-1);
         p.mutable_graph()->mutable_ops(4)->mutable_outputs(0)->set_batch_blocks(2);
       },
       "graph.ops[1].outputs[0].batch_blocks: -1 (and 1 more op outputs)"},
  };
  for (const auto &[edit, field] : edits) {
    proto::Plan p = base;
    edit(p);
    EXPECT_EQ(plan::requiredFormatVersion(p), 2u) << field;
    const auto fields = plan::versionedFields(p);
    ASSERT_EQ(fields.size(), 1u) << field;
    EXPECT_EQ(fields[0].field, field);
  }
  proto::Plan fp32 = base;
  fp32.set_precision("fp32"); // what an older reader runs anyway
  EXPECT_EQ(plan::requiredFormatVersion(fp32), 1u);
}

// A hand edit that turns zero on but leaves format_version: 1 is refused by
// check (and so by rannc-exec, which runs the same structural checks), with
// the field and the version it needs; convert writes the version it needs.
TEST(FormatVersion, CheckRefusesAnOldVersionAndConvertRaisesIt) {
  proto::Plan edited = tinyPlan();
  edited.mutable_stages(1)->add_ranks(2);
  edited.mutable_stages(1)->set_zero(1);
  edited.mutable_cluster()->set_devices_per_node(3);
  ASSERT_EQ(edited.format_version(), 1u);
  // Written as a hand edit would leave it: the encoder's bytes, version 1.
  ASSERT_TRUE(writeFileAtomic(tmp("v1_zero.pbtxt"), *plan::encodePlan(edited, ".pbtxt")).ok());
  CheckOptions o;
  o.plan = tmp("v1_zero.pbtxt");
  std::ostringstream out, log;
  EXPECT_FALSE(runCheck(o, out, log).ok());
  EXPECT_NE(out.str().find("error: stages[1].zero: 1 needs format_version 2, the plan says 1 (a rannc that reads "
                           "only version 1 would keep the whole optimizer state on every replica, beyond the "
                           "planned memory); set format_version: 2, or let rannc-plan convert write it"),
            std::string::npos)
      << out.str();
  EXPECT_FALSE(plan::structuralProblems(edited).empty());

  for (const char *ext : {".pb", ".json", ".pbtxt"}) {
    const std::string converted = tmp(std::string("v2_zero") + ext);
    ASSERT_TRUE(runConvert(tmp("v1_zero.pbtxt"), converted, log).ok());
    auto back = plan::readPlan(converted);
    ASSERT_TRUE(back.ok()) << back.error().message;
    EXPECT_EQ(back->format_version(), 2u) << ext;
    EXPECT_TRUE(plan::structuralProblems(*back).empty()) << joined(plan::structuralProblems(*back));
  }
  std::ostringstream out2;
  o.plan = tmp("v2_zero.pbtxt");
  EXPECT_TRUE(runCheck(o, out2, log).ok()) << out2.str();

  // A plan without version-2 fields converts as version 1, bytes unchanged;
  // the writer never lowers a version a plan states.
  ASSERT_TRUE(plan::writePlan(tinyPlan(), tmp("v1.pb")).ok());
  ASSERT_TRUE(runConvert(tmp("v1.pb"), tmp("v1.pbtxt"), log).ok());
  EXPECT_EQ(*readFile(tmp("v1.pbtxt")), *plan::encodePlan(tinyPlan(), ".pbtxt"));
  EXPECT_NE(readFile(tmp("v1.pbtxt"))->find("format_version: 1\n"), std::string::npos);
  proto::Plan stated = tinyPlan();
  stated.set_format_version(2);
  ASSERT_TRUE(plan::writePlan(stated, tmp("stated.pb")).ok());
  EXPECT_EQ(plan::readPlan(tmp("stated.pb"))->format_version(), 2u);
}

// ---------------------------------------------------------------- check

TEST(Check, AnUneditedAnalyticPlanReproducesItsOwnEstimates) {
  // Pure pipeline, and 2 stages x 2 replicas (all-reduce, per-replica
  // batches); the automatic choice, chunks interleaved on 2 ranks.
  const proto::Plan interleaved = gptPlan(2, 2, {1}, 2, std::nullopt);
  EXPECT_GT(interleaved.virtual_stages(), 1) << "the automatic search no longer interleaves this GPT: pick another";
  for (const proto::Plan &p : {gptPlan(2, 2), gptPlan(4, 2, {2}), tinyPlan(), interleaved}) {
    ASSERT_GT(p.stages_size(), 0);
    auto m = rebuildPlanModel(p, {});
    ASSERT_TRUE(m.ok()) << m.error().message;
    proto::Plan refreshed = p;
    refreshEstimates(refreshed, *m);
    for (int s = 0; s < p.stages_size(); ++s) {
      const auto &a = p.stages(s).estimates(), &b = refreshed.stages(s).estimates();
      EXPECT_DOUBLE_EQ(a.fwd_time_s(), b.fwd_time_s()) << s;
      EXPECT_DOUBLE_EQ(a.bwd_time_s(), b.bwd_time_s()) << s;
      EXPECT_DOUBLE_EQ(a.allreduce_time_s(), b.allreduce_time_s()) << s;
      EXPECT_EQ(a.peak_memory_bytes(), b.peak_memory_bytes()) << s;
      EXPECT_EQ(a.activation_bytes(), b.activation_bytes()) << s;
      EXPECT_EQ(a.memory_capacity_bytes(), b.memory_capacity_bytes()) << s;
      EXPECT_EQ(a.num_params(), b.num_params()) << s;
    }
    EXPECT_DOUBLE_EQ(p.estimates().step_time_s(), refreshed.estimates().step_time_s());
    EXPECT_EQ(*plan::encodePlan(p, ".pb"), *plan::encodePlan(refreshed, ".pb"));
  }
}

TEST(Check, SplitsUnitsAtEveryStageBoundary) {
  const ir::Graph g = tinyGraph();
  auto units = unitsSplitAt(g, {0, 4, 8});
  std::vector<std::pair<int, int>> got;
  for (auto u : units) got.emplace_back(u.op_begin, u.op_end);
  // The planner's units are [0,3) [3,6) [6,10); 4 and 8 split the last two.
  EXPECT_EQ(got, (std::vector<std::pair<int, int>>{{0, 3}, {3, 4}, {4, 6}, {6, 8}, {8, 10}}));
}

TEST(Check, MovedBoundaryIsValidAndReestimated) {
  proto::Plan p = tinyPlan();
  ASSERT_EQ(p.stages_size(), 2);
  const int cut = p.stages(0).op_end();
  const int moved = cut == 4 ? 5 : 4; // a boundary inside a unit: ops [3, 6) is one
  p.mutable_stages(0)->set_op_end(moved);
  p.mutable_stages(1)->set_op_begin(moved);
  auto [ok, out] = check(p);
  ASSERT_TRUE(ok) << out;
  EXPECT_NE(out.find("valid: 2 stages on 2 ranks"), std::string::npos) << out;
  EXPECT_NE(out.find("plan said"), std::string::npos) << out;
  // The plan's model.path is resolved against the plan's folder (Note [plan model path]).
  const std::string shown =
      std::regex_replace(std::regex_replace(out, std::regex(tmp("check.pbtxt")), "PLAN"), std::regex(::testing::TempDir()), "");
  EXPECT_NE(out.find("note: model: " + ::testing::TempDir() + "tiny.onnx cannot be read, so its SHA-256 was not "
                     "checked"),
            std::string::npos)
      << out;
  expectGolden("check_tiny_moved.txt", shown);

  // --update writes the re-estimated plan; checking it again changes nothing.
  CheckOptions o;
  o.update = true;
  o.output = tmp("updated.pbtxt");
  auto [ok2, out2] = check(p, o);
  ASSERT_TRUE(ok2) << out2;
  auto updated = plan::readPlan(o.output);
  ASSERT_TRUE(updated.ok());
  EXPECT_NE(updated->stages(0).estimates().fwd_time_s(), p.stages(0).estimates().fwd_time_s());
  auto [ok3, out3] = check(*updated);
  ASSERT_TRUE(ok3) << out3;
  EXPECT_EQ(out3.find("plan said"), std::string::npos) << out3;
}

TEST(Check, UpdateNeedsAnOutput) {
  CheckOptions o;
  o.update = true;
  auto [ok, out] = check(tinyPlan(), o);
  EXPECT_FALSE(ok);
  EXPECT_NE(out.find("--update: pass -o OUT"), std::string::npos) << out;
}

// Note [plan model path]: recorded relative to the plan, read back inside its folder only.
TEST(Check, ModelPathIsRelativeToThePlanAndStaysInItsFolder) {
  EXPECT_EQ(plan::recordedModelPath("/a/models/m.onnx", "/a/plans/p.pb"), "../models/m.onnx");
  EXPECT_EQ(plan::recordedModelPath("/a/m.onnx", "/a/p.pb"), "m.onnx");
  auto here = plan::resolveRecordedModelPath("sub/m.onnx", "/a/p.pb", false);
  ASSERT_TRUE(here.ok()) << here.error().message;
  EXPECT_EQ(*here, "/a/sub/m.onnx");
  for (const std::string escape : {"../models/m.onnx", "/abs/m.onnx"}) {
    auto refused = plan::resolveRecordedModelPath(escape, "/a/p.pb", false);
    ASSERT_FALSE(refused.ok()) << escape;
    EXPECT_NE(refused.error().message.find("a plan may name only a model in its own folder; pass --model PATH, or "
                                           "--allow-model-outside-plan"),
              std::string::npos)
        << refused.error().message;
  }
  auto trusted = plan::resolveRecordedModelPath("../models/m.onnx", "/a/p.pb", true);
  ASSERT_TRUE(trusted.ok());
  EXPECT_EQ(*trusted, "/models/m.onnx");
  // Converting a plan into another folder keeps it naming the same model.
  proto::Plan moved;
  moved.mutable_model()->set_path("m.onnx");
  plan::rebaseModelPath(moved, "/a/p.pb", "/a/out/q.pbtxt");
  EXPECT_EQ(moved.model().path(), "../m.onnx");
  // check reports the escape as a problem unless told to trust the plan.
  proto::Plan p = tinyPlan();
  p.mutable_model()->set_path("../elsewhere/tiny.onnx");
  auto [ok, out] = check(p, CheckOptions{});
  EXPECT_FALSE(ok);
  EXPECT_NE(out.find("model.path '../elsewhere/tiny.onnx' leaves"), std::string::npos) << out;
}

TEST(Check, ModelHashIsCompared) {
  proto::Plan p = gptPlan(2, 2);
  auto [ok, out] = check(p);
  ASSERT_TRUE(ok) << out;
  EXPECT_NE(out.find("matches model.sha256"), std::string::npos) << out;
  // Another file in place of the model.
  ASSERT_TRUE(writeFileAtomic(tmp("other.onnx"), "not the model").ok());
  CheckOptions o;
  o.model = tmp("other.onnx");
  auto [bad, out2] = check(p, o);
  EXPECT_FALSE(bad);
  EXPECT_NE(out2.find("error: model.sha256: " + tmp("other.onnx") + ": the model file changed"), std::string::npos)
      << out2;
  EXPECT_NE(out2.find("changed since planning"), std::string::npos) << out2;
}

/// Each broken edit fails with its own message, naming the field.
struct BrokenEdit {
  std::string what;
  std::function<void(proto::Plan &)> edit;
  std::string message;
};

/// Swaps the first op that reads its predecessor's output with that predecessor.
void swapDependentOps(proto::Plan &p) {
  auto *ops = p.mutable_graph()->mutable_ops();
  for (int i = 1; i < ops->size(); ++i)
    for (const auto &in : ops->Get(i).inputs())
      for (const auto &out : ops->Get(i - 1).outputs())
        if (!in.empty() && in == out.name()) {
          ops->SwapElements(i - 1, i);
          return;
        }
}

TEST(Check, EveryBrokenEditFailsWithItsOwnMessage) {
  const proto::Plan good = gptPlan(2, 2);
  const int cut = good.stages(0).op_end();
  const std::vector<BrokenEdit> edits = {
      {"op in two stages", [&](proto::Plan &p) { p.mutable_stages(1)->set_op_begin(cut - 3); },
       "stages[1].op_begin: is " + std::to_string(cut - 3) + ", expected " + std::to_string(cut) +
           " (ops in two stages, 0 and 1: ["},
      {"op in no stage", [&](proto::Plan &p) { p.mutable_stages(0)->set_op_end(cut - 2); },
       "stages[1].op_begin: is " + std::to_string(cut) + ", expected " + std::to_string(cut - 2) +
           " (ops in no stage: ["},
      {"op after the last stage", [&](proto::Plan &p) { p.mutable_stages(1)->set_op_end(p.graph().ops_size() - 1); },
       "stages[1].op_end: is"},
      {"rank missing", [&](proto::Plan &p) { p.mutable_stages(1)->set_ranks(0, 2); },
       "stages[*].ranks: rank 1 in no stage"},
      {"rank twice", [&](proto::Plan &p) { p.mutable_stages(1)->set_ranks(0, 0); },
       "stages[1].ranks: rank 0 is used by more than one stage"},
      {"stages out of dependency order",
       [&](proto::Plan &p) {
         p.mutable_stages(0)->set_op_begin(cut);
         p.mutable_stages(0)->set_op_end(p.graph().ops_size());
         p.mutable_stages(1)->set_op_begin(0);
         p.mutable_stages(1)->set_op_end(cut);
       },
       "stages[0]: reads"},
      {"micro-batches", [&](proto::Plan &p) { p.set_microbatches(3); },
       "microbatches: 3 does not divide global_batch_size 8"},
      {"replicas without samples",
       [&](proto::Plan &p) {
         p.set_microbatches(8);
         p.mutable_stages(1)->add_ranks(2);
       },
       "stages[1].ranks: 2 replicas for micro-batches of 1 samples leaves a replica without samples"},
      {"old format", [&](proto::Plan &p) { p.set_format_version(0); }, "format_version: 0 is not a version"},
      {"ops out of topological order", swapDependentOps, "(graph.ops must be in topological order)"},
  };
  for (const auto &e : edits) {
    proto::Plan p = good;
    e.edit(p);
    auto [ok, out] = check(p);
    EXPECT_FALSE(ok) << e.what;
    EXPECT_NE(out.find(e.message), std::string::npos) << e.what << ":\n" << out;
    // rannc-exec runs the same structural checks (all but memory and hash).
    EXPECT_FALSE(plan::structuralProblems(p).empty()) << e.what;
  }
}

TEST(Check, DependencyOrderMessageNamesAnExample) {
  proto::Plan p = gptPlan(2, 2);
  const int cut = p.stages(0).op_end(), n = p.graph().ops_size();
  p.mutable_stages(0)->set_op_begin(cut);
  p.mutable_stages(0)->set_op_end(n);
  p.mutable_stages(1)->set_op_begin(0);
  p.mutable_stages(1)->set_op_end(cut);
  const std::string all = joined(plan::structuralProblems(p));
  EXPECT_NE(all.find("that stage 1 computes later in the pipeline (stages out of dependency order), e.g. op "),
            std::string::npos)
      << all;
  EXPECT_NE(all.find("stages[1]: op range [0, " + std::to_string(cut) + ") comes before stage 0's"), std::string::npos)
      << all;
  // Swapped stages still cover every op once: no gap or overlap is claimed.
  EXPECT_EQ(all.find("no stage"), std::string::npos) << all;
  EXPECT_EQ(all.find("two stages"), std::string::npos) << all;
}

TEST(Check, MemoryOverCapacityIsAProblem) {
  CheckOptions o = trusting();
  o.reestimate.device_memory = 256 * 1024; // 256 KiB: the GPT model's stages need more
  auto [ok, out] = check(gptPlan(2, 2), o);
  EXPECT_FALSE(ok);
  EXPECT_NE(out.find("error: stages[0]: needs "), std::string::npos) << out;
  EXPECT_NE(out.find("but a device holds 230.4 KiB (256.0 KiB less the 10% margin)"), std::string::npos) << out;
}

TEST(Check, TooFewDevicesInTheClusterIsAProblem) {
  proto::Plan p = gptPlan(2, 2);
  p.mutable_stages(1)->add_ranks(2); // 3 ranks on a 2-device cluster
  auto [ok, out] = check(p);
  EXPECT_FALSE(ok);
  EXPECT_NE(out.find("error: cluster: the stages use 3 ranks, the cluster has 2 devices"), std::string::npos) << out;
  p.mutable_cluster()->set_devices_per_node(4); // the hand edit that makes room
  auto [ok2, out2] = check(p);
  EXPECT_TRUE(ok2) << out2;
}

TEST(Check, UnreadablePlansFailWithOneLine) {
  const proto::Plan p = gptPlan(2, 2);
  // Corrupt bytes in a .pb.
  std::string bytes = *plan::encodePlan(p, ".pb");
  for (int i = 0; i < 16; ++i) bytes[i] = '\xff';
  ASSERT_TRUE(writeFileAtomic(tmp("corrupt.pb"), bytes).ok());
  CheckOptions o;
  o.plan = tmp("corrupt.pb");
  std::ostringstream out, log;
  Status st = runCheck(o, out, log);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.message(), tmp("corrupt.pb") + ": not a valid binary plan (protobuf parse failed)");
  // A newer format version.
  proto::Plan future = p;
  future.set_format_version(plan::kFormatVersion + 1);
  ASSERT_TRUE(plan::writePlan(future, tmp("future.pbtxt")).ok());
  o.plan = tmp("future.pbtxt");
  st = runCheck(o, out, log);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("future.pbtxt: format_version: " + std::to_string(plan::kFormatVersion + 1) +
                              " is newer than this rannc understands"),
            std::string::npos)
      << st.message();
  // A typo in the text form names the line.
  std::string text = *plan::encodePlan(p, ".pbtxt");
  text.replace(text.find("microbatches: 2"), 15, "microbatchez: 2");
  ASSERT_TRUE(writeFileAtomic(tmp("typo.pbtxt"), text).ok());
  o.plan = tmp("typo.pbtxt");
  st = runCheck(o, out, log);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("typo.pbtxt:line "), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("microbatchez"), std::string::npos) << st.message();
}

// ---------------------------------------------------------------- simulate

TEST(Simulate, WritesAChromeTrace) {
  for (const proto::Plan &p : {gptPlan(2, 2), gptPlan(4, 2, {2}, 4)}) {
    ASSERT_TRUE(plan::writePlan(p, tmp("sim.pb")).ok());
    SimulateCommandOptions o;
    o.plan = tmp("sim.pb");
    o.trace = tmp("trace.json");
    std::ostringstream out, log;
    Status st = runSimulate(o, out, log);
    ASSERT_TRUE(st.ok()) << st.message();
    EXPECT_NE(out.str().find("predicted step time"), std::string::npos) << out.str();
    auto trace = nlohmann::json::parse(*readFile(o.trace));
    const int world = plan::worldSize(p), M = p.microbatches();
    std::map<int, int> forwards, backwards, allreduces;
    std::map<int, double> end_of;
    for (const auto &e : trace["traceEvents"]) {
      ASSERT_TRUE(e["ph"] == "X" || e["ph"] == "M") << e;
      ASSERT_GE(e["pid"].get<int>(), 0);
      ASSERT_LT(e["pid"].get<int>(), world);
      EXPECT_EQ(e["tid"], 0);
      if (e["ph"] == "M") continue;
      const std::string name = e["name"];
      const int pid = e["pid"];
      const double ts = e["ts"], dur = e["dur"];
      EXPECT_GE(ts + 1e-3, end_of[pid]) << "events of rank " << pid << " overlap at " << name;
      end_of[pid] = ts + dur;
      EXPECT_TRUE(std::regex_match(name, std::regex("(forward|backward|recv) [0-9]+|all-reduce|optimizer"))) << name;
      if (name.rfind("forward", 0) == 0) ++forwards[pid];
      if (name.rfind("backward", 0) == 0) ++backwards[pid];
      if (name == "all-reduce") ++allreduces[pid];
    }
    for (int r = 0; r < world; ++r) {
      EXPECT_EQ(forwards[r], M) << r;
      EXPECT_EQ(backwards[r], M) << r;
      // Replicated stages all-reduce; a stage on one rank has nothing to reduce.
      int replicas = 0;
      for (const auto &s : p.stages())
        for (int x : s.ranks())
          if (x == r) replicas = s.ranks_size();
      EXPECT_EQ(allreduces[r], replicas > 1 ? 1 : 0) << r;
    }
  }
}

// ---------------------------------------------------------------- dot

TEST(Dot, TinyGolden) {
  const proto::Plan p = tinyPlan();
  auto g = plan::graphFromProto(p.graph());
  ASSERT_TRUE(g.ok());
  std::ostringstream os;
  plan::printPlanDot(p, *g, {}, os);
  expectGolden("dot_tiny.dot", os.str());
  // Grouped: one node per unit.
  plan::DotOptions units;
  for (auto u : unitsSplitAt(*g, {p.stages(1).op_begin()})) units.groups.emplace_back(u.op_begin, u.op_end);
  std::ostringstream grouped;
  plan::printPlanDot(p, *g, units, grouped);
  expectGolden("dot_tiny_units.dot", grouped.str());
}

TEST(Dot, LargeGraphsCollapseToUnitsAndGraphvizAcceptsThem) {
  const proto::Plan p = gptPlan(2, 2);
  ASSERT_TRUE(plan::writePlan(p, tmp("dot.pb")).ok());
  for (int max_ops : {1000, 50}) {
    DotCommandOptions o;
    o.plan = tmp("dot.pb");
    o.output = tmp("plan.dot");
    o.max_ops = max_ops;
    std::ostringstream out, log;
    ASSERT_TRUE(runDot(o, out, log).ok());
    const std::string dot = *readFile(o.output);
    EXPECT_NE(dot.find("subgraph cluster_0"), std::string::npos);
    EXPECT_NE(dot.find("label=\"stage 1 (ranks 1)\""), std::string::npos);
    const bool grouped = max_ops < p.graph().ops_size();
    const std::regex node(grouped ? "\n    u[0-9]+ \\[" : "\n    op[0-9]+ \\[");
    const auto nodes = std::distance(std::sregex_iterator(dot.begin(), dot.end(), node), std::sregex_iterator());
    if (grouped)
      EXPECT_LT(nodes, p.graph().ops_size() / 2);
    else
      EXPECT_EQ(nodes, p.graph().ops_size());
    // The cut between the stages carries activations: a red edge with bytes.
    EXPECT_TRUE(
        std::regex_search(dot, std::regex("-> [a-z]+[0-9]+ \\[label=\"[0-9.]+ (B|KiB|MiB)\", color=\"#c03020\"")))
        << dot.substr(0, 2000);
    if (std::system("command -v dot >/dev/null 2>&1") == 0) {
      const std::string cmd = "dot -Tsvg " + o.output + " -o " + tmp("plan.svg") + " 2>" + tmp("dot.err");
      EXPECT_EQ(std::system(cmd.c_str()), 0) << *readFile(tmp("dot.err"));
    }
  }
}

// ---------------------------------------------------------------- diff

TEST(Diff, IdenticalAndEditedGolden) {
  const proto::Plan a = tinyPlan();
  std::ostringstream same;
  EXPECT_TRUE(plan::printPlanDiff(a, a, same));
  EXPECT_EQ(same.str(), "plans are identical\n");

  // The hand edits of docs/plan-format.md: move the boundary, replicate
  // stage 1, four micro-batches; then refresh the estimates.
  proto::Plan b = a;
  const int cut = a.stages(0).op_end() == 6 ? 3 : 6;
  b.mutable_stages(0)->set_op_end(cut);
  b.mutable_stages(1)->set_op_begin(cut);
  b.mutable_stages(1)->add_ranks(2);
  b.mutable_cluster()->set_devices_per_node(3);
  b.set_microbatches(4);
  b.set_schedule(proto::ONE_F_ONE_B);
  auto m = rebuildPlanModel(b, {});
  ASSERT_TRUE(m.ok()) << m.error().message;
  refreshEstimates(b, *m);
  std::ostringstream diff;
  EXPECT_FALSE(plan::printPlanDiff(a, b, diff));
  EXPECT_NE(diff.str().find("microbatches: 2 -> 4"), std::string::npos) << diff.str();
  EXPECT_NE(diff.str().find("stage 1: ranks [1] -> [1, 2] (replicas 1 -> 2)"), std::string::npos) << diff.str();
  expectGolden("diff_tiny.txt", diff.str());

  // Through the verb, across encodings: still identical.
  ASSERT_TRUE(plan::writePlan(a, tmp("diff_a.pb")).ok());
  ASSERT_TRUE(plan::writePlan(a, tmp("diff_a.json")).ok());
  std::ostringstream verb;
  ASSERT_TRUE(runDiff(tmp("diff_a.pb"), tmp("diff_a.json"), verb).ok());
  EXPECT_NE(verb.str().find("plans are identical"), std::string::npos);
  EXPECT_FALSE(runDiff(tmp("diff_a.pb"), tmp("nope.pb"), verb).ok());
}

} // namespace
} // namespace rannc::planner
