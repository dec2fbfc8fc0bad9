// Tensor parallelism from lowering to the plan file: a hand-made sharding
// analysis of a small graph (Megatron's pairing: a column-cut product, an
// element-wise op on the slices, a row-cut product whose partial sum one
// all-reduce makes whole) lowered into Block::Split numbers, planned,
// written, shown and checked, and a hand edit of the degree re-validated.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <sstream>

#include "planner/driver/lower.h"
#include "planner/driver/planner.h"
#include "planner/driver/tooling.h"
#include "planner/plan/plan.h"
#include "planner/plan/sharding_record.h"
#include "planner/plan/show.h"
#include "tests/planner/driver/test_cluster.h"

namespace rannc::planner {
namespace {

using ir::Dim;
using ir::DType;
using ir::ValueKind;

/// x[B,256] -> mm1 (w1 [256,512] cut by columns) -> relu1 -> mm2 (w2
/// [512,512] cut by rows: a partial sum) -> relu2 (after the all-reduce) ->
/// mm3 (w3 [512,16], whole) -> squared error with y. Three units, one per
/// MatMul: [mm1, relu1], [mm2, relu2], [mm3, sub, square, mean].
ir::Graph mlp() {
  ir::Graph g;
  g.name = "mlp";
  g.opset = 17;
  auto value = [&](const std::string &name, DType t, ir::Shape s, ValueKind k = ValueKind::Intermediate) {
    return g.addValue({name, t, std::move(s), true, k});
  };
  const ir::Shape hidden{Dim::batch(), Dim::fixed(512)}, out{Dim::batch(), Dim::fixed(16)};
  const ir::ValueId x = value("x", DType::F32, {Dim::batch(), Dim::fixed(256)}, ValueKind::Input);
  const ir::ValueId y = value("y", DType::F32, out, ValueKind::Input);
  const ir::ValueId w1 = value("w1", DType::F32, {Dim::fixed(256), Dim::fixed(512)}, ValueKind::Parameter);
  const ir::ValueId w2 = value("w2", DType::F32, {Dim::fixed(512), Dim::fixed(512)}, ValueKind::Parameter);
  const ir::ValueId w3 = value("w3", DType::F32, {Dim::fixed(512), Dim::fixed(16)}, ValueKind::Parameter);
  g.inputs = {x, y};
  g.parameters = {w1, w2, w3};
  const ir::ValueId h1 = value("h1", DType::F32, hidden), a1 = value("a1", DType::F32, hidden);
  const ir::ValueId h2 = value("h2", DType::F32, hidden), a2 = value("a2", DType::F32, hidden);
  const ir::ValueId h3 = value("h3", DType::F32, out), d = value("d", DType::F32, out);
  const ir::ValueId sq = value("sq", DType::F32, out), loss = value("loss", DType::F32, {});
  g.addNode({"mm1", "MatMul", "", {x, w1}, {h1}, {}});
  g.addNode({"relu1", "Relu", "", {h1}, {a1}, {}});
  g.addNode({"mm2", "MatMul", "", {a1, w2}, {h2}, {}});
  g.addNode({"relu2", "Relu", "", {h2}, {a2}, {}});
  g.addNode({"mm3", "MatMul", "", {a2, w3}, {h3}, {}});
  g.addNode({"sub", "Sub", "", {h3, y}, {d}, {}});
  g.addNode({"square", "Mul", "", {d, d}, {sq}, {}});
  g.addNode({"mean", "ReduceMean", "", {sq}, {loss}, {{"keepdims", int64_t{0}}}});
  g.loss = loss;
  return g;
}

/// What the sharding analysis finds on mlp(): the 512-wide hidden layer cut.
sharding::Analysis mlpSharding(const ir::Graph &g) {
  sharding::Analysis a;
  a.values.assign(g.values.size(), {});
  a.values[g.findValue("w1")] = {1, false};
  a.values[g.findValue("h1")] = {1, false};
  a.values[g.findValue("a1")] = {1, false};
  a.values[g.findValue("w2")] = {0, false};
  a.values[g.findValue("h2")] = {-1, true};
  a.node_split = {true, true, true, false, false, false, false, false};
  a.collectives.push_back({sharding::CollectiveKind::CopyToGroup, g.findValue("x"), -1, {0}});
  a.collectives.push_back({sharding::CollectiveKind::SumOverGroup, g.findValue("h2"), -1, {3}});
  a.cut_sizes = {512};
  return a;
}

/// One node of 4 devices.
cluster::ClusterSpec quad() { return testCluster(4); }

PlanOptions options() {
  PlanOptions o;
  o.model = "mlp.onnx";
  o.batch_size = 8;
  o.microbatches = 1;
  o.profile = "analytic";
  return o;
}

Expected<proto::Plan> planMlp(const PlanOptions &o, bool with_analysis) {
  const ir::Graph g = mlp();
  const sharding::Analysis a = mlpSharding(g);
  auto costs = cost::analyticCosts(g, cost::formUnits(g), quad().device, costBatchSizes(o));
  return planGraph(g, costs, quad(), o, std::string(64, 'a'), nullptr, with_analysis ? &a : nullptr);
}

// Note [what a queued W keeps]: mm2 alone reads a1 (512 floats a sample,
// made in unit 0) for its weight gradient, which unit 1's W bytes count
// beside h2's gradient (2,048 B each). A stage beginning at unit 1 receives
// a1 and holds it once, as its input: the cut takes it off. Likewise a2 at
// unit 2 (beside h3's 64 B gradient); x, a data input, crosses no cut.
TEST(WeightGradientLowering, AReceivedInputOneRootReadsIsHeldOnce) {
  const ir::Graph g = mlp();
  PlanOptions o = options();
  auto costs = cost::analyticCosts(g, cost::formUnits(g), quad().device, costBatchSizes(o));
  auto p = lowerToProblem(g, costs, quad(), o);
  ASSERT_TRUE(p.ok()) << p.error().message;
  ASSERT_EQ(p->blocks.size(), 3u);
  EXPECT_DOUBLE_EQ(p->blocks[1].wgrad_bytes_per_sample, 2048 + 2048);
  EXPECT_DOUBLE_EQ(p->blocks[2].wgrad_bytes_per_sample, 64 + 2048);
  EXPECT_DOUBLE_EQ(p->wgradReadCutAt(0), 0);
  EXPECT_DOUBLE_EQ(p->wgradReadCutAt(1), -2048);
  EXPECT_DOUBLE_EQ(p->wgradReadCutAt(2), -2048);
}

TEST(TensorParallelLowering, BlocksGetTheirSplitPartsAndCuts) {
  const ir::Graph g = mlp();
  ASSERT_EQ(g.verify(), "");
  const sharding::Analysis a = mlpSharding(g);
  PlanOptions o = options();
  auto costs = cost::analyticCosts(g, cost::formUnits(g), quad().device, costBatchSizes(o));
  ASSERT_EQ(costs.units.size(), 3u);
  auto p = lowerToProblem(g, costs, quad(), o, &a);
  ASSERT_TRUE(p.ok()) << p.error().message;
  EXPECT_EQ(p->tp_degrees, (std::vector<int>{1, 2, 4})); // 512 divides by each, a node has 4
  // Sharded parameters: w1 (256x512 floats) in unit 0, w2 (512x512) in unit 1, none in unit 2.
  EXPECT_DOUBLE_EQ(p->blocks[0].tp.param_bytes, 256 * 512 * 4);
  EXPECT_DOUBLE_EQ(p->blocks[1].tp.param_bytes, 512 * 512 * 4);
  EXPECT_DOUBLE_EQ(p->blocks[2].tp.param_bytes, 0);
  // Unit 0 runs only split nodes: all its compute divides; unit 1 has the whole relu2.
  EXPECT_DOUBLE_EQ(p->blocks[0].tp.fwd.per_sample_s, p->blocks[0].fwd.per_sample_s);
  EXPECT_GT(p->blocks[1].tp.fwd.per_sample_s, 0);
  EXPECT_LT(p->blocks[1].tp.fwd.per_sample_s, p->blocks[1].fwd.per_sample_s);
  EXPECT_EQ(p->blocks[2].tp.fwd.per_sample_s, 0);
  // Collectives: x (1 KiB a sample) copied into unit 0, h2 (2 KiB) summed in
  // unit 1; each all-reduce once a step, half charged to each pass.
  EXPECT_DOUBLE_EQ(p->blocks[0].tp.collective_bytes_per_sample, 256 * 4 / 2.0);
  EXPECT_DOUBLE_EQ(p->blocks[1].tp.collective_bytes_per_sample, 512 * 4 / 2.0);
  EXPECT_DOUBLE_EQ(p->blocks[0].tp.collectives, 0.5);
  // a1 (cut) crosses into unit 1; a2 (whole) into unit 2.
  EXPECT_EQ(p->cut_whole, (std::vector<bool>{true, false, true, true}));

  // Without the analysis nothing is split, and the problem is the old one.
  auto plain = lowerToProblem(g, costs, quad(), o);
  ASSERT_TRUE(plain.ok());
  EXPECT_TRUE(plain->tp_degrees.empty());
  EXPECT_TRUE(plain->cut_whole.empty());
  // A pinned degree the sizes or the node do not allow is refused by name.
  o.tensor_parallel = {3};
  auto three = lowerToProblem(g, costs, quad(), o, &a);
  ASSERT_FALSE(three.ok());
  EXPECT_EQ(three.error().message,
            "--tensor-parallel 3: it does not divide the model's split sizes (allowed: 1, 2, 4)");
  o.tensor_parallel = {8};
  EXPECT_EQ(lowerToProblem(g, costs, quad(), o, &a).error().message,
            "--tensor-parallel 8: a node has only 4 devices (allowed: 1, 2, 4)");
  o.tensor_parallel = {2};
  EXPECT_EQ(lowerToProblem(g, costs, quad(), o).error().message,
            "--tensor-parallel 2: nothing in the model can be split across devices (allowed: 1)");
}

/// x[B,16] -> mm (w [16,64] cut by columns: logits cut by classes) ->
/// SoftmaxCrossEntropyLoss with labels[B]: a vocabulary-parallel loss, one unit.
TEST(TensorParallelLowering, VocabularyParallelLossChargesItsAllReduces) {
  ir::Graph g;
  g.name = "head";
  g.opset = 17;
  auto value = [&](const std::string &name, DType t, ir::Shape s, ValueKind k = ValueKind::Intermediate) {
    return g.addValue({name, t, std::move(s), true, k});
  };
  const ir::ValueId x = value("x", DType::F32, {Dim::batch(), Dim::fixed(16)}, ValueKind::Input);
  const ir::ValueId y = value("y", DType::I64, {Dim::batch()}, ValueKind::Input);
  const ir::ValueId w = value("w", DType::F32, {Dim::fixed(16), Dim::fixed(64)}, ValueKind::Parameter);
  const ir::ValueId logits = value("logits", DType::F32, {Dim::batch(), Dim::fixed(64)});
  const ir::ValueId loss = value("loss", DType::F32, {});
  g.inputs = {x, y};
  g.parameters = {w};
  g.addNode({"mm", "MatMul", "", {x, w}, {logits}, {}});
  g.addNode({"ce", "SoftmaxCrossEntropyLoss", "", {logits, y}, {loss}, {{"reduction", std::string("mean")}}});
  g.loss = loss;
  ASSERT_EQ(g.verify(), "");
  sharding::Analysis a;
  a.values.assign(g.values.size(), {});
  a.values[w] = {1, false};
  a.values[logits] = {1, false};
  a.node_split = {true, true};
  a.collectives.push_back({sharding::CollectiveKind::CopyToGroup, x, -1, {0}});
  a.cut_sizes = {64};
  PlanOptions o = options();
  auto costs = cost::analyticCosts(g, cost::formUnits(g), quad().device, costBatchSizes(o));
  ASSERT_EQ(costs.units.size(), 1u);
  auto p = lowerToProblem(g, costs, quad(), o, &a);
  ASSERT_TRUE(p.ok()) << p.error().message;
  // x's copy (16 floats a sample), and the loss's three float32 all-reduces
  // of one value per row (one row a sample here), each half to each pass.
  EXPECT_DOUBLE_EQ(p->blocks[0].tp.collective_bytes_per_sample, 16 * 4 / 2.0 + 3 * 4 / 2.0);
  EXPECT_DOUBLE_EQ(p->blocks[0].tp.collectives, 0.5 + 1.5);
}

TEST(TensorParallelPlan, DegreeOnePlansStayByteIdentical) {
  PlanOptions o = options();
  o.tensor_parallel = {1};
  auto with = planMlp(o, true);
  o.tensor_parallel.clear();
  auto without = planMlp(o, false);
  ASSERT_TRUE(with.ok() && without.ok());
  EXPECT_EQ(with->SerializeAsString(), without->SerializeAsString());
  EXPECT_FALSE(with->graph().has_sharding());
}

TEST(TensorParallelPlan, PlanShowCheckAndAHandEdit) {
  PlanOptions o = options();
  o.tensor_parallel = {2};
  o.stages = 1;
  o.replicas = {2};
  auto plan = planMlp(o, true);
  ASSERT_TRUE(plan.ok()) << plan.error().message;
  ASSERT_EQ(plan->stages_size(), 1);
  const proto::Stage &st = plan->stages(0);
  EXPECT_EQ(st.tensor_parallel(), 2);
  EXPECT_EQ(std::vector<int>(st.ranks().begin(), st.ranks().end()), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(plan->format_version(), 3u); // only plans that use it
  ASSERT_TRUE(plan->graph().has_sharding());
  EXPECT_EQ(plan->graph().sharding().split_ops_size(), 3);
  EXPECT_EQ(plan->graph().values(2).name(), "w1");
  EXPECT_EQ(plan->graph().values(2).shard_axis(), 1);
  EXPECT_FALSE(plan->graph().values(4).has_shard_axis()); // w3: whole
  EXPECT_TRUE(plan->graph().ops(2).outputs(0).partial()); // h2

  // The text form reads back to the same message, and the sharding to the same analysis.
  const std::string path = ::testing::TempDir() + "tp_plan.pbtxt";
  ASSERT_TRUE(plan::writePlan(*plan, path).ok());
  auto back = plan::readPlan(path);
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(back->SerializeAsString(), plan->SerializeAsString());
  auto g = plan::graphFromProto(back->graph());
  ASSERT_TRUE(g.ok());
  auto a = plan::shardingFromProto(back->graph(), *g);
  ASSERT_TRUE(a.ok()) << a.error().message;
  const sharding::Analysis want = mlpSharding(*g);
  EXPECT_EQ(a->values, want.values);
  EXPECT_EQ(a->node_split, want.node_split);
  EXPECT_EQ(a->cut_sizes, want.cut_sizes);
  ASSERT_EQ(a->collectives.size(), 2u);
  EXPECT_EQ(a->collectives[1].kind, sharding::CollectiveKind::SumOverGroup);
  EXPECT_EQ(a->collectives[1].readers, std::vector<ir::NodeId>{3});

  // show --json: each stage's degree and every rank.
  std::ostringstream json;
  plan::printPlanJson(*plan, json);
  const auto j = nlohmann::json::parse(json.str());
  EXPECT_EQ(j["world_size"], 4);
  EXPECT_EQ(j["stages"][0]["tensor_parallel"], 2);
  EXPECT_EQ(j["stages"][0]["replicas"], 2);
  EXPECT_EQ(j["stages"][0]["ranks"], nlohmann::json::array({0, 1, 2, 3}));
  std::ostringstream table;
  plan::printPlanTable(*plan, table);
  EXPECT_NE(table.str().find("tensor-parallel: stage 0 splits its layers over 2 groups of 2 ranks (0-1, 2-3): 3 of "
                             "its 8 ops run on slices, 2 collectives"),
            std::string::npos)
      << table.str();

  // check: the unedited plan is valid and re-estimated to its own figures.
  auto run = [&](const proto::Plan &p) {
    CheckOptions c;
    c.plan = ::testing::TempDir() + "tp_check.pbtxt";
    c.allow_model_outside_plan = true; // the model is not in the temporary folder
    EXPECT_TRUE(plan::writePlan(p, c.plan).ok());
    std::ostringstream out, log;
    Status s = runCheck(c, out, log);
    return std::make_pair(s.ok(), out.str());
  };
  auto [ok, out] = run(*plan);
  EXPECT_TRUE(ok) << out;
  EXPECT_NE(out.find("step time"), std::string::npos) << out;
  EXPECT_EQ(out.find("plan said"), std::string::npos) << "an unedited plan re-estimates to its own figures:\n" << out;

  // A person sets the degree to 4 (one group of 4): valid, re-estimated.
  proto::Plan four = *plan;
  four.mutable_stages(0)->set_tensor_parallel(4);
  std::tie(ok, out) = run(four);
  EXPECT_TRUE(ok) << out;
  EXPECT_NE(out.find("plan said"), std::string::npos) << "a new degree gives new figures:\n" << out;
  // Degree 3 does not divide the split sizes (nor the 4 ranks).
  proto::Plan three = *plan;
  three.mutable_stages(0)->set_tensor_parallel(3);
  std::tie(ok, out) = run(three);
  EXPECT_FALSE(ok);
  EXPECT_NE(out.find("stages[0].ranks: 4 ranks are not replicas x tensor_parallel 3"), std::string::npos) << out;
  three.mutable_stages(0)->mutable_ranks()->RemoveLast();
  std::tie(ok, out) = run(three);
  EXPECT_FALSE(ok);
  EXPECT_NE(out.find("has tensor-parallel degree 3, not one the model allows (1, 2, 4)"), std::string::npos) << out;
  // A plan whose graph records no sharding is checked against its graph's own analysis.
  proto::Plan bare = *plan;
  bare.mutable_graph()->clear_sharding();
  std::tie(ok, out) = run(bare);
  EXPECT_TRUE(ok) << out;
  EXPECT_NE(out.find("valid: 1 stage on 4 ranks"), std::string::npos) << out;
}

TEST(TensorParallelPlan, AutoSearchesTheDegreeAndEvaluateAgrees) {
  PlanOptions o = options();
  auto plan = planMlp(o, true);
  ASSERT_TRUE(plan.ok()) << plan.error().message;
  int devices = 0;
  for (const auto &s : plan->stages()) {
    EXPECT_EQ(s.ranks_size() % plan::tensorParallel(s), 0);
    devices += s.ranks_size();
  }
  EXPECT_LE(devices, 4);
  EXPECT_EQ(plan->graph().has_sharding(),
            std::any_of(plan->stages().begin(), plan->stages().end(),
                        [](const proto::Stage &s) { return s.tensor_parallel() > 1; }));
}

} // namespace
} // namespace rannc::planner
