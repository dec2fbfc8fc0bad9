// The sharding analysis on the test models as rannc-plan imports them: the
// Megatron pattern per transformer layer, found without looking at names.
#include <gtest/gtest.h>

#include <sstream>

#include "planner/sharding/sharding.h"
#include "tests/planner/sharding/model_helpers.h"

namespace rannc::sharding {
namespace {

ir::Graph load(const std::string &model) { return loadModel(model, "model.onnx"); }

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
  for (ir::ValueId p : g.parameters) {
    if (g.values[p].shape.size() == 2 && g.values[p].shape[0].offset == 100) {
      EXPECT_TRUE(f.a.values[p].replicated()) << g.values[p].name;
    }
  }
  checkLocal(g, f.a, 2);
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
