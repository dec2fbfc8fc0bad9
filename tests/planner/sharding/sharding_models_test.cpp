// The sharding analysis on the test models as rannc-plan imports them: the
// Megatron pattern per transformer layer, found without looking at names.
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "planner/driver/tooling.h"
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
  EXPECT_EQ(f.sum, 2 * 2 + 1);    // one all-reduce per row-parallel product, one for the lookup
  EXPECT_EQ(f.copy, 2 * 2 + 1);   // one per block input, one for the output layer
  EXPECT_EQ(f.gather, 0);         // the loss takes the vocabulary-cut logits
  EXPECT_EQ(f.embedding, 1);
  EXPECT_EQ(f.loss, 1);
  EXPECT_EQ(f.a.cut_sizes, (std::vector<int64_t>{4, 64, 100, 256}));
  EXPECT_EQ(f.a.degrees(8), (std::vector<int>{1, 2, 4}));
  EXPECT_GT(headCuts(g, f.a, {4}), 0);
  // The token table is cut by vocabulary; the position table (16 x 64) stays whole.
  EXPECT_EQ(f.a.values[g.parameters[0]].axis, 0);
  EXPECT_TRUE(f.a.values[g.parameters[1]].replicated());
  checkLocal(g, f.a, 2);
  checkLocal(g, f.a, 4);
  EXPECT_FALSE(localGraph(g, f.a, 8).ok());
}

TEST(ShardingModels, BertIsMegatronPerLayer) {
  ir::Graph g = load("bert");
  Found f = found(g);
  EXPECT_EQ(f.row, 2 * 2);
  EXPECT_EQ(f.sum, 2 * 2 + 1); // and the word embedding's
  EXPECT_EQ(f.embedding, 1);   // word embeddings; positions and token types stay whole
  EXPECT_EQ(f.column, 2 * 4 + 1);
  EXPECT_GT(headCuts(g, f.a, {4}), 0);
  checkLocal(g, f.a, 2);
}

TEST(ShardingModels, TiedEmbeddingsAreCutByVocabularyForBothUses) {
  ir::Graph g = load("gpt_tied");
  Found f = found(g);
  EXPECT_EQ(f.column, 2 * 4 + 1);
  EXPECT_EQ(f.row, 2 * 2);
  EXPECT_EQ(f.gather, 0);
  EXPECT_EQ(f.embedding, 1);
  EXPECT_EQ(f.loss, 1);
  int tables = 0;
  for (ir::ValueId p : g.parameters)
    if (g.values[p].shape.size() == 2 && g.values[p].shape[0].offset == 100) {
      EXPECT_EQ(f.a.values[p].axis, 0) << g.values[p].name;
      ++tables;
    }
  EXPECT_EQ(tables, 1); // one table, read by the lookup and the output layer
  checkLocal(g, f.a, 2);
}

/// Every model (RANNC_TEST_SHARDING_MODELS adds more, comma-separated): the
/// analysis is deterministic and every local graph it allows verifies.
TEST(ShardingModels, EveryLocalGraphVerifies) {
  std::vector<std::string> models = {"mlp", "gpt", "bert", "gpt_tied"};
  if (const char *more = std::getenv("RANNC_TEST_SHARDING_MODELS")) {
    std::stringstream list(more);
    for (std::string m; std::getline(list, m, ',');) models.push_back(m);
  }
  for (const std::string &m : models) {
    SCOPED_TRACE(m);
    ir::Graph g = load(m);
    auto a = analyze(g), again = analyze(g);
    ASSERT_TRUE(a.ok() && again.ok());
    std::ostringstream one, two;
    a->print(g, one);
    again->print(g, two);
    EXPECT_EQ(one.str(), two.str());
    for (int t : a->degrees(8)) checkLocal(g, *a, t);
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
  EXPECT_NE(text.find("(Gather): vocab-parallel embedding; param %tok_emb.weight axis 0"), std::string::npos) << text;
  EXPECT_NE(text.find("(SoftmaxCrossEntropyLoss): vocab-parallel loss"), std::string::npos) << text;
  EXPECT_EQ(text.find("gather(%"), std::string::npos) << text;
}

/// rannc-plan import --tensor-parallel N: the analysis, then the degrees.
TEST(ShardingModels, ImportPrintsTheValidDegrees) {
  ir::Graph g = load("gpt");
  std::ostringstream os;
  ASSERT_TRUE(planner::printTensorParallel(g, 8, os).ok());
  const std::string text = os.str();
  EXPECT_NE(text.find("row-parallel"), std::string::npos) << text;
  EXPECT_NE(text.find("tensor-parallel degrees up to 8: 1 2 4\n"), std::string::npos) << text;
  EXPECT_NE(text.find("degree 8 does not divide every cut size; the largest valid one is 4"), std::string::npos);
  std::ostringstream four;
  ASSERT_TRUE(planner::printTensorParallel(g, 4, four).ok());
  EXPECT_EQ(four.str().find("does not divide"), std::string::npos);
}

} // namespace
} // namespace rannc::sharding
