#include <gtest/gtest.h>

#include <sstream>

#include "planner/ir/ir.h"

namespace rannc::ir {
namespace {

/// y = MatMul(x, w); loss = ReduceMean(y)
Graph tinyGraph() {
  Graph g;
  g.opset = 17;
  ValueId x = g.addValue({"x", DType::F32, {Dim::batch(), Dim::fixed(4)}, true, ValueKind::Input});
  ValueId w = g.addValue({"w", DType::F32, {Dim::fixed(4), Dim::fixed(2)}, true, ValueKind::Parameter});
  g.inputs = {x};
  g.parameters = {w};
  ValueId y = g.addValue({"y", DType::F32, {Dim::batch(), Dim::fixed(2)}, true});
  ValueId l = g.addValue({"loss", DType::F32, {}, true});
  g.addNode({"mm", "MatMul", "", {x, w}, {y}, {}});
  g.addNode({"mean", "ReduceMean", "", {y}, {l}, {{"keepdims", int64_t{0}}}});
  g.loss = l;
  return g;
}

TEST(Dim, AffineInBatch) {
  Dim d = Dim::batch(16, 1); // 16*B+1
  EXPECT_EQ(d.at(4), 65);
  EXPECT_FALSE(d.isFixed());
  EXPECT_EQ(shapeString({Dim::batch(), Dim::fixed(3), d, Dim::unknown(), Dim::batch(1, -2)}), "[B,3,16*B+1,?,B-2]");
  EXPECT_EQ(numelAt({Dim::batch(), Dim::fixed(3)}, 5), 15);
  EXPECT_EQ(numelAt({Dim::batch(), Dim::unknown()}, 5), 0);
}

TEST(DType, NamesRoundTrip) {
  for (DType t : {DType::F32, DType::F64, DType::F16, DType::BF16, DType::I64, DType::I32, DType::Bool}) {
    auto back = parseDType(dtypeName(t));
    ASSERT_TRUE(back.has_value());
    EXPECT_EQ(*back, t);
  }
  EXPECT_FALSE(parseDType("float").has_value());
  EXPECT_EQ(dtypeSize(DType::I64), 8);
  EXPECT_TRUE(isFloating(DType::BF16));
  EXPECT_FALSE(isFloating(DType::I32));
}

TEST(Graph, VerifyAcceptsTopologicalGraph) {
  Graph g = tinyGraph();
  EXPECT_EQ(g.verify(), "");
  EXPECT_EQ(g.findValue("y"), 2);
  EXPECT_EQ(g.values[2].producer, 0);
  auto users = g.users();
  EXPECT_EQ(users[2], std::vector<NodeId>{1});
}

TEST(Graph, VerifyRejectsOutOfOrderNodes) {
  Graph g = tinyGraph();
  std::swap(g.nodes[0], g.nodes[1]);
  EXPECT_NE(g.verify().find("before it is produced"), std::string::npos) << g.verify();
}

TEST(Graph, VerifyRejectsMissingLoss) {
  Graph g = tinyGraph();
  g.loss = kNoValue;
  EXPECT_EQ(g.verify(), "graph has no loss output");
}

TEST(Graph, PrintIsReadableAndDeterministic) {
  std::ostringstream os;
  tinyGraph().print(os);
  EXPECT_EQ(os.str(), "graph main (opset 17)\n"
                      "input %x : f32[B,4]\n"
                      "param %w : f32[4,2]\n"
                      "  %y:f32[B,2] = MatMul(%x, %w)  # mm\n"
                      "  %loss:f32[] = ReduceMean(%y) {keepdims=0}  # mean\n"
                      "loss %loss\n");
}

TEST(Graph, SinkParameterOpsMovesWeightOpsToTheirConsumer) {
  // wt = Transpose(w) is exported first but only the second MatMul reads it.
  Graph g;
  ValueId x = g.addValue({"x", DType::F32, {Dim::batch(), Dim::fixed(2)}, true, ValueKind::Input});
  ValueId w = g.addValue({"w", DType::F32, {Dim::fixed(2), Dim::fixed(2)}, true, ValueKind::Parameter});
  g.inputs = {x};
  g.parameters = {w};
  ValueId wt = g.addValue({"wt", DType::F32, {}, false});
  ValueId h = g.addValue({"h", DType::F32, {}, false});
  ValueId y = g.addValue({"y", DType::F32, {}, false});
  ValueId l = g.addValue({"loss", DType::F32, {}, false});
  g.addNode({"t", "Transpose", "", {w}, {wt}, {}});
  g.addNode({"relu", "Relu", "", {x}, {h}, {}});
  g.addNode({"mm", "MatMul", "", {h, wt}, {y}, {}});
  g.addNode({"mean", "ReduceMean", "", {y}, {l}, {}});
  g.loss = l;
  sinkParameterOps(g);
  std::vector<std::string> names;
  for (const Node &n : g.nodes) names.push_back(n.name);
  EXPECT_EQ(names, (std::vector<std::string>{"relu", "t", "mm", "mean"}));
  EXPECT_EQ(g.values[wt].producer, 1);
  EXPECT_EQ(g.verify(), "");
}

} // namespace
} // namespace rannc::ir
