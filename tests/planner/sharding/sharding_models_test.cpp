// The sharding analysis on the test models as rannc-plan imports them: the
// Megatron pattern per transformer layer, found without looking at names.
#include <gtest/gtest.h>

#include <cstdlib>
#include <iostream>
#include <sstream>

#include "executor/frontend/common.h"
#include "planner/import/model_format.h"
#include "planner/ir/op_set.h"
#include "planner/sharding/sharding.h"

namespace rannc::sharding {
namespace {

ir::Graph load(const std::string &model, const std::string &file = "model.onnx") {
  const char *dir = std::getenv("RANNC_TEST_MODELS");
  const std::string path = std::string(dir ? dir : "models") + "/" + model + "/" + file;
  auto g = import::importModel(path);
  EXPECT_TRUE(g.ok()) << g.error().message;
  if (!g.ok()) return ir::Graph();
  auto filled = import::completeShapesByRunning(*g, path, int64_t(1) << 30);
  EXPECT_TRUE(filled.ok()) << filled.error().message;
  return *g;
}

struct Found {
  Analysis a;
  int column = 0, row = 0, copy = 0, sum = 0, gather = 0;
};

Found found(const ir::Graph &g) {
  Found f;
  auto a = analyze(g);
  EXPECT_TRUE(a.ok()) << a.error().message;
  if (!a.ok()) return f;
  f.a = *a;
  for (ir::NodeId n = 0; n < static_cast<ir::NodeId>(g.nodes.size()); ++n) {
    std::string_view role = nodeRole(g, f.a, n);
    f.column += role == "column-parallel";
    f.row += role == "row-parallel";
  }
  for (const Collective &c : f.a.collectives) {
    f.copy += c.kind == CollectiveKind::CopyToGroup;
    f.sum += c.kind == CollectiveKind::SumOverGroup;
    f.gather += c.kind == CollectiveKind::GatherAxis;
  }
  if (std::getenv("RANNC_TEST_VERBOSE")) f.a.print(g, std::cout);
  return f;
}

/// Every 4-D cut value (attention's [batch, heads, ...] tensors) is cut along a
/// size in `heads`; returns how many there are.
int headCuts(const ir::Graph &g, const Analysis &a, const std::vector<int64_t> &heads) {
  int n = 0;
  for (ir::ValueId v = 0; v < static_cast<ir::ValueId>(g.values.size()); ++v) {
    if (a.values[v].axis < 0 || g.values[v].shape.size() != 4) continue;
    const int64_t size = g.values[v].shape[a.values[v].axis].offset;
    EXPECT_NE(std::find(heads.begin(), heads.end(), size), heads.end()) << g.values[v].name;
    ++n;
  }
  return n;
}

/// The local graph at `degree` verifies, holds 1/degree of every cut
/// parameter, and one rannc-domain node per collective.
void checkLocal(const ir::Graph &g, const Analysis &a, int degree) {
  auto local = localGraph(g, a, degree);
  ASSERT_TRUE(local.ok()) << local.error().message;
  EXPECT_EQ(local->verify(), "");
  for (ir::ValueId p : g.parameters) {
    const int64_t whole = ir::numelAt(g.values[p].shape, 1), here = ir::numelAt(local->values[p].shape, 1);
    EXPECT_EQ(here * (a.values[p].axis >= 0 ? degree : 1), whole) << g.values[p].name;
  }
  size_t rannc = 0;
  for (const ir::Node &n : local->nodes) rannc += ir::isRannc(n);
  EXPECT_EQ(rannc, a.collectives.size());
}

TEST(ShardingModels, GptIsMegatronPerLayer) {
  // 2 layers, 4 heads of 16, feed-forward 256, vocabulary 100.
  ir::Graph g = load("gpt");
  Found f = found(g);
  EXPECT_EQ(f.column, 2 * 4 + 1); // q, k, v, fc1 per layer; the output layer
  EXPECT_EQ(f.row, 2 * 2);        // attention's out-projection, fc2
  EXPECT_EQ(f.sum, 2 * 2);        // one all-reduce per row-parallel product
  EXPECT_EQ(f.copy, 2 * 2 + 1);   // one per block input, one for the output layer
  EXPECT_EQ(f.gather, 1);         // the vocabulary-cut logits before the loss
  EXPECT_EQ(f.a.cut_sizes, (std::vector<int64_t>{4, 64, 100, 256}));
  EXPECT_EQ(f.a.degrees(8), (std::vector<int>{1, 2, 4}));
  EXPECT_GT(headCuts(g, f.a, {4}), 0);
  // Embeddings stay whole (a vocabulary-cut lookup needs each device's row offset).
  EXPECT_TRUE(f.a.values[g.parameters[0]].replicated());
  checkLocal(g, f.a, 2);
  checkLocal(g, f.a, 4);
  EXPECT_FALSE(localGraph(g, f.a, 8).ok());
}

TEST(ShardingModels, BertIsMegatronPerLayer) {
  ir::Graph g = load("bert");
  Found f = found(g);
  EXPECT_EQ(f.row, 2 * 2);
  EXPECT_EQ(f.sum, 2 * 2);
  EXPECT_EQ(f.column, 2 * 4 + 1);
  EXPECT_GT(headCuts(g, f.a, {4}), 0);
  checkLocal(g, f.a, 2);
}

TEST(ShardingModels, TiedEmbeddingsKeepTheOutputLayerWhole) {
  ir::Graph g = load("gpt_tied");
  Found f = found(g);
  EXPECT_EQ(f.column, 2 * 4);
  EXPECT_EQ(f.row, 2 * 2);
  EXPECT_EQ(f.gather, 0);
  for (ir::ValueId p : g.parameters)
    if (g.values[p].shape.size() == 2 && g.values[p].shape[0].offset == 100) EXPECT_TRUE(f.a.values[p].replicated());
  checkLocal(g, f.a, 2);
}

TEST(ShardingModels, LlamaCutsQueryAndKeyValueHeads) {
  // 2 layers, hidden 32, 4 query heads and 2 key/value heads of 8, SwiGLU 64.
  for (const char *file : {"model.onnx", "model_dynamo.onnx"}) {
    SCOPED_TRACE(file);
    ir::Graph g = load("hf_llama", file);
    Found f = found(g);
    EXPECT_EQ(f.column, 2 * 5 + 1); // q, k, v, gate, up; the output layer
    EXPECT_EQ(f.row, 2 * 2);        // o, down
    EXPECT_EQ(f.sum, 2 * 2);
    // Both head counts are cut sizes: a degree must divide the key/value heads too.
    EXPECT_NE(std::find(f.a.cut_sizes.begin(), f.a.cut_sizes.end(), 4), f.a.cut_sizes.end());
    EXPECT_NE(std::find(f.a.cut_sizes.begin(), f.a.cut_sizes.end(), 2), f.a.cut_sizes.end());
    EXPECT_EQ(f.a.degrees(8), (std::vector<int>{1, 2}));
    EXPECT_GT(headCuts(g, f.a, {2, 4}), 0);
    checkLocal(g, f.a, 2);
  }
}

TEST(ShardingModels, PrintNamesTheRolesAndCollectives) {
  ir::Graph g = load("gpt");
  auto a = analyze(g);
  ASSERT_TRUE(a.ok());
  std::ostringstream os;
  a->print(g, os);
  const std::string text = os.str();
  EXPECT_NE(text.find("cut sizes 4 64 100 256"), std::string::npos) << text;
  EXPECT_NE(text.find("column-parallel; copy("), std::string::npos) << text;
  EXPECT_NE(text.find("row-parallel"), std::string::npos) << text;
  EXPECT_NE(text.find("sum(%"), std::string::npos) << text;
  EXPECT_NE(text.find("gather(%"), std::string::npos) << text;
}

} // namespace
} // namespace rannc::sharding
