// Note [one op table] (planner/ir/op_set.h): the op set is the one list of
// ONNX ops; the kernel registry, the FLOP rules and the autocast classes must
// name ops from it only, and every op in it must have a kernel.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "executor/runtime/ops.h"
#include "planner/cost/flops.h"
#include "planner/cost/precision.h"
#include "planner/ir/op_set.h"

namespace rannc {
namespace {

std::vector<std::string> opSetTypes() {
  std::vector<std::string> names;
  for (const auto &op : ir::supportedOps()) names.emplace_back(op.type);
  return names;
}

/// The names in `named` that the op set lacks.
std::vector<std::string> notInOpSet(const std::vector<std::string> &named) {
  std::vector<std::string> missing;
  for (const std::string &op : named)
    if (!ir::findOp(op)) missing.push_back(op);
  return missing;
}

TEST(OpTable, OpSetIsSortedAndFindsItsOps) {
  const std::vector<std::string> names = opSetTypes();
  EXPECT_TRUE(std::is_sorted(names.begin(), names.end()));
  EXPECT_EQ(std::adjacent_find(names.begin(), names.end()), names.end());
  ASSERT_NE(ir::findOp("Trilu"), nullptr);
  EXPECT_EQ(ir::findOp("Trilu")->min_opset, 14);
  // The import's fusion writes LayerNormalization into graphs of any opset (Note [pattern fusion]).
  ASSERT_NE(ir::findOp("LayerNormalization"), nullptr);
  EXPECT_EQ(ir::findOp("LayerNormalization")->min_opset, 1);
  EXPECT_NE(ir::findOp("Conv"), nullptr);
  EXPECT_EQ(ir::findOp("Frobnicate"), nullptr);
}

TEST(OpTable, EveryOpHasOneKernelAndEveryKernelAnOp) {
  // Both directions: a kernel for an op the importer refuses, or an op the
  // importer accepts without a kernel, makes the lists differ.
  EXPECT_EQ(runtime::kernelOpTypes(), opSetTypes());
}

TEST(OpTable, FlopRulesNameOnlyOpsOfTheOpSet) {
  const std::vector<std::string> ruled = cost::onnxOpsWithFlopRules();
  EXPECT_EQ(notInOpSet(ruled), std::vector<std::string>{});
  // The list is real: the matrix products and shape ops have rules.
  for (const char *op : {"MatMul", "Gemm", "Conv", "Shape", "Reshape"})
    EXPECT_NE(std::find(ruled.begin(), ruled.end(), op), ruled.end()) << op;
}

TEST(OpTable, AutocastClassesNameOnlyOpsOfTheOpSet) {
  const std::vector<std::string> classed = cost::onnxOpsWithAutocastClass();
  EXPECT_EQ(notInOpSet(classed), std::vector<std::string>{});
  for (const char *op : {"MatMul", "SoftmaxCrossEntropyLoss", "LayerNormalization", "Add"})
    EXPECT_NE(std::find(classed.begin(), classed.end(), op), classed.end()) << op;
}

TEST(OpTable, AtenNodesAreThoseOfTheAtenDomain) {
  // The front ends give ATen and prim nodes the domain "aten"; ONNX nodes
  // keep theirs ("" or "ai.onnx").
  ir::Node aten{"linear_0", "aten::linear", std::string(ir::kAtenDomain), {}, {}, {}};
  ir::Node prim{"ListConstruct_1", "prim::ListConstruct", std::string(ir::kAtenDomain), {}, {}, {}};
  ir::Node onnx{"mm", "MatMul", "", {}, {}, {}};
  ir::Node onnx_named{"mm", "MatMul", "ai.onnx", {}, {}, {}};
  EXPECT_TRUE(ir::isAten(aten));
  EXPECT_TRUE(ir::isAten(prim));
  EXPECT_FALSE(ir::isAten(onnx));
  EXPECT_FALSE(ir::isAten(onnx_named));
}

} // namespace
} // namespace rannc
