// The sharding analysis on graphs that need LibTorch to import completely:
// TorchScript archives, and Llama's ONNX exports, whose attention shapes ONNX's
// own inference leaves unknown (rannc-plan runs the graph for them).
#include <gtest/gtest.h>

#include "executor/frontend/common.h"
#include "executor/frontend/torch_import.h"
#include "tests/planner/sharding/model_helpers.h"

namespace rannc::sharding {
namespace {

ir::Graph loadComplete(const std::string &model, const std::string &file) {
  const import::TorchImporters torch = import::torchImporters();
  ir::Graph g = loadModel(model, file, &torch);
  if (file.size() > 5 && file.substr(file.size() - 5) == ".onnx") {
    auto filled = import::completeShapesByRunning(g, modelPath(model, file), int64_t(1) << 30);
    EXPECT_TRUE(filled.ok()) << filled.error().message;
  }
  return g;
}

/// hf_llama: 2 layers, hidden 32, 4 query heads and 2 key/value heads of 8, SwiGLU 64.
void expectLlamaMegatron(const ir::Graph &g) {
  Found f = found(g);
  EXPECT_EQ(f.column, 2 * 5 + 1); // q, k, v, gate, up; the output layer
  EXPECT_EQ(f.row, 2 * 2);        // o, down
  EXPECT_EQ(f.sum, 2 * 2 + 1);    // and the embedding's (Note [vocabulary parallelism])
  EXPECT_EQ(f.embedding, 1);
  EXPECT_EQ(f.loss, 1);
  EXPECT_EQ(f.gather, 0);
  // Both head counts are cut sizes: a degree must divide the key/value heads too.
  EXPECT_NE(std::find(f.a.cut_sizes.begin(), f.a.cut_sizes.end(), 4), f.a.cut_sizes.end());
  EXPECT_NE(std::find(f.a.cut_sizes.begin(), f.a.cut_sizes.end(), 2), f.a.cut_sizes.end());
  EXPECT_EQ(f.a.degrees(8), (std::vector<int>{1, 2}));
  EXPECT_GT(headCuts(g, f.a, {2, 4}), 0);
  checkLocal(g, f.a, 2);
}

TEST(ShardingTorchModels, LlamaCutsQueryAndKeyValueHeads) {
  expectLlamaMegatron(loadComplete("hf_llama", "model.onnx"));
}

/// The dynamo exporter's attention folds the heads into the batch ([B,4,16,8]
/// -> [4*B,16,8] -> transpose -> [B,4,8,16]): the heads stay cut through the
/// fold (Note [batch-folded cuts]), so the layer is Megatron's as the legacy
/// export's is, its lookup and loss vocabulary-parallel.
TEST(ShardingTorchModels, DynamoLlamaCutsHeadsThroughTheBatchFold) {
  ir::Graph g = loadComplete("hf_llama", "model_dynamo.onnx");
  expectLlamaMegatron(g);
  Found f = found(g);
  int folded = 0;
  for (ir::ValueId v = 0; v < static_cast<ir::ValueId>(g.values.size()); ++v)
    folded += f.a.values[v].axis >= 0 && !g.values[v].shape[f.a.values[v].axis].isFixed();
  EXPECT_EQ(folded, 2 * 2); // the folded key and its transpose, per layer
}

TEST(ShardingTorchModels, TorchScriptGptIsMegatronPerLayer) {
  ir::Graph g = loadComplete("gpt", "model.pt");
  Found f = found(g);
  EXPECT_EQ(f.column, 2 * 4 + 1);
  EXPECT_EQ(f.row, 2 * 2);
  EXPECT_EQ(f.sum, 2 * 2 + 1); // and the vocabulary-parallel lookup's
  EXPECT_EQ(f.gather, 0);
  EXPECT_EQ(f.embedding, 1); // aten::embedding of the token table; positions stay whole
  EXPECT_EQ(f.loss, 1);      // aten::cross_entropy_loss
  EXPECT_EQ(f.a.cut_sizes, (std::vector<int64_t>{4, 64, 100, 256}));
  EXPECT_GT(headCuts(g, f.a, {4}), 0);
  checkLocal(g, f.a, 2);
  // The row-parallel linears' biases are added once, after the sum (Note [row-parallel bias]).
  auto local = localGraph(g, f.a, 2);
  ASSERT_TRUE(local.ok());
  int adds_after_sum = 0;
  for (size_t n = 1; n < local->nodes.size(); ++n)
    adds_after_sum += local->nodes[n].op_type == "aten::add" &&
                      local->nodes[n - 1].op_type == ir::kTensorParallelSum &&
                      local->nodes[n].inputs[0] == local->nodes[n - 1].outputs[0] &&
                      local->values[local->nodes[n].inputs[1]].kind == ir::ValueKind::Parameter;
  EXPECT_EQ(adds_after_sum, 2 * 2);
}

TEST(ShardingTorchModels, TorchScriptLlamaCutsQueryAndKeyValueHeads) {
  expectLlamaMegatron(loadComplete("hf_llama", "model.pt"));
}

/// torch.export's nanoGPT: the MLP pairs are cut; the fused query/key/value
/// product is split along its cut axis into q, k and v, which no slice of it
/// holds whole heads of, so attention stays whole.
TEST(ShardingTorchModels, TorchExportNanoGptCutsTheMlpAndKeepsFusedAttentionWhole) {
  ir::Graph g = loadComplete("nanogpt", "model.pt2");
  Found f = found(g);
  EXPECT_EQ(f.column, 2);
  EXPECT_EQ(f.row, 2);
  EXPECT_EQ(f.a.cut_sizes, (std::vector<int64_t>{192}));
  for (ir::ValueId p : g.parameters) {
    if (g.values[p].shape.size() == 2 && g.values[p].shape[0].offset == 144) {
      EXPECT_TRUE(f.a.values[p].replicated()) << g.values[p].name;
    }
  }
  checkLocal(g, f.a, 2);
}

} // namespace
} // namespace rannc::sharding
