// Import fusion (Note [pattern fusion] in planner/import/fuse.cpp) on the
// exports of models/fusion_models.py: every pattern is found in the shapes
// each exporter writes, and the fused graph computes the unfused graph's
// loss and every gradient (parameters and input) within the equivalence
// tolerance.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <set>
#include <string>

#include "executor/frontend/common.h"
#include "executor/runtime/interpreter.h"
#include "executor/runtime/tensor_convert.h"
#include "planner/import/fuse.h"
#include "planner/import/onnx_import.h"
#include "planner/ir/fused_ops.h"
#include "planner/support/files.h"

namespace rannc {
namespace {

std::string modelPath(const std::string &name) {
  const char *dir = std::getenv("RANNC_TEST_MODELS");
  return std::string(dir ? dir : "models") + "/fusion/" + name + ".onnx";
}

struct Outcome {
  torch::Tensor loss;
  std::map<std::string, torch::Tensor> grads; ///< by parameter name, and "x"
};

Outcome run(const ir::Graph &g, const std::map<std::string, ir::Tensor> &weights, const torch::Tensor &x) {
  runtime::ValueMap env;
  std::map<std::string, torch::Tensor> leaves;
  for (ir::ValueId p : g.parameters) {
    const std::string &name = g.values[p].name;
    env[p] = leaves[name] = runtime::toTorch(weights.at(name)).clone().requires_grad_(true);
  }
  for (ir::ValueId c : g.constants) env[c] = runtime::toTorch(g.constant_data.at(c));
  env[g.inputs.at(0)] = leaves["x"] = x.clone().requires_grad_(true);
  runtime::runNodes(g, runtime::allNodes(g), env);
  Outcome r;
  r.loss = env.at(g.loss).detach();
  env.at(g.loss).backward();
  for (auto &[name, t] : leaves) r.grads[name] = t.grad();
  return r;
}

int count(const ir::Graph &g, std::string_view op) {
  int n = 0;
  for (const ir::Node &node : g.nodes) n += node.op_type == op;
  return n;
}

/// The nodes of type `op`, with their inputs' writers, for a failure message.
std::string nodesOf(const ir::Graph &g, std::string_view op) {
  std::string out;
  for (const ir::Node &node : g.nodes) {
    if (node.op_type != op) continue;
    out += " " + node.name + "(";
    for (ir::ValueId in : node.inputs)
      out += in == ir::kNoValue || g.values[in].producer < 0 ? g.values[in].name + " "
                                                               : g.nodes[g.values[in].producer].op_type + " ";
    out += ")";
  }
  return out;
}

struct Case {
  const char *model;
  int attention; ///< fused attentions expected
};

class Fusion : public ::testing::TestWithParam<std::tuple<Case, const char *>> {};

TEST_P(Fusion, FindsEveryPatternAndKeepsLossAndGradients) {
  const auto [c, exporter] = GetParam();
  const std::string path = modelPath(std::string(c.model) + "_" + exporter);
  auto bytes = readFile(path);
  ASSERT_TRUE(bytes.ok()) << bytes.error().message;
  auto g = import::importOnnxBytes(*bytes, path);
  ASSERT_TRUE(g.ok()) << g.error().message;
  std::vector<std::string> names;
  for (ir::ValueId p : g->parameters) names.push_back(g->values[p].name);
  auto weights = import::loadModelWeights(path, names);
  ASSERT_TRUE(weights.ok()) << weights.error().message;

  // As rannc-plan does: the shapes ONNX's inference leaves unknown, then fusion.
  ASSERT_TRUE(import::completeShapesByRunning(*g, path, int64_t(1) << 30).ok());
  ir::Graph fused = *g;
  const import::FusionReport report = import::fusePatterns(fused);
  ASSERT_EQ(fused.verify(), "");
  EXPECT_GT(report.removed_ops, 0);
  EXPECT_EQ(count(fused, ir::kScaledDotProductAttention), c.attention);
  // Nothing of a decomposed kernel is left: each softmax was attention's,
  // each Erf, Tanh, Sigmoid or mean a GELU's, SiLU's or norm's (the loss's
  // own mean aside). (A Sqrt may stay: an attention scale computed from a
  // size the import cannot fold stays a Mul on q and k, and the kernel's scale 1.)
  for (const char *op : {"Softmax", "Erf", "Tanh", "Sigmoid"}) EXPECT_EQ(count(fused, op), 0) << op << ":" << nodesOf(fused, op);
  EXPECT_LE(count(fused, "ReduceMean"), 1);
  // Fusion leaves no constant or op output that no op reads (GELU's 0.5 was
  // left: a dead Constant node in the plan), unless the export had it so.
  const auto readers_before = g->users(), readers_after = fused.users();
  std::set<std::string> unread_before;
  for (ir::ValueId v = 0; v < ir::ValueId(g->values.size()); ++v)
    if (readers_before[v].empty()) unread_before.insert(g->values[v].name);
  for (ir::ValueId v = 0; v < ir::ValueId(fused.values.size()); ++v) {
    const ir::ValueKind kind = fused.values[v].kind;
    if (v == fused.loss || (kind != ir::ValueKind::Constant && kind != ir::ValueKind::Intermediate)) continue;
    EXPECT_TRUE(!readers_after[v].empty() || unread_before.count(fused.values[v].name))
        << fused.values[v].name << " is read by no op";
  }
  if (std::string(c.model) == "block") {
    EXPECT_EQ(count(fused, ir::kRMSNormalization), 1);
    EXPECT_EQ(count(fused, ir::kSiLU), 1);
    EXPECT_EQ(count(fused, "LayerNormalization"), 1);
    EXPECT_EQ(count(fused, "Gelu"), 2); // erf and tanh
  }

  torch::manual_seed(1);
  const torch::Tensor x = torch::randn({5, 8, 16}); // another batch size than the export's
  const Outcome a = run(*g, *weights, x), b = run(fused, *weights, x);
  EXPECT_TRUE(torch::allclose(a.loss, b.loss, 1e-4, 1e-6)) << a.loss.item<double>() << " vs " << b.loss.item<double>();
  ASSERT_EQ(a.grads.size(), b.grads.size());
  for (const auto &[name, ga] : a.grads) {
    const torch::Tensor &gb = b.grads.at(name);
    ASSERT_TRUE(ga.defined() && gb.defined()) << name;
    const double err = (ga - gb).abs().max().item<double>(), scale = ga.abs().max().item<double>();
    EXPECT_LE(err, 1e-4 * scale + 1e-7) << name << ": max |difference| " << err << " of " << scale;
  }
}

INSTANTIATE_TEST_SUITE_P(Exports, Fusion,
                         ::testing::Combine(::testing::Values(Case{"block", 1}, Case{"masks", 3}),
                                            ::testing::Values("legacy14", "legacy17", "dynamo", "dynamo_noopt")),
                         [](const auto &info) {
                           return std::string(std::get<0>(info.param).model) + "_" + std::get<1>(info.param);
                         });

} // namespace
} // namespace rannc
