// The propagation rules on small hand-built graphs, one rule or pattern each.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <sstream>

#include "planner/ir/op_set.h"
#include "planner/sharding/propagate.h"
#include "planner/sharding/sharding.h"

namespace rannc::sharding {
namespace {

using ir::Dim;
using ir::DType;
using ir::ValueId;
using ir::ValueKind;

/// A small graph builder: values by name, nodes in order.
struct Builder {
  ir::Graph g;
  Builder() { g.opset = 17; }
  ValueId input(const std::string &name, ir::Shape s, DType t = DType::F32) {
    ValueId v = g.addValue({name, t, std::move(s), true, ValueKind::Input});
    g.inputs.push_back(v);
    return v;
  }
  ValueId param(const std::string &name, ir::Shape s) {
    ValueId v = g.addValue({name, DType::F32, std::move(s), true, ValueKind::Parameter});
    g.parameters.push_back(v);
    return v;
  }
  ValueId ints(const std::string &name, std::vector<int64_t> data) {
    ValueId v = g.addValue({name, DType::I64, {Dim::fixed(static_cast<int64_t>(data.size()))}, true,
                            ValueKind::Constant});
    ir::Tensor t{DType::I64, {static_cast<int64_t>(data.size())}, std::string(data.size() * 8, '\0')};
    std::memcpy(t.data.data(), data.data(), t.data.size());
    g.constants.push_back(v);
    g.constant_data[v] = t;
    return v;
  }
  ValueId op(const std::string &type, std::vector<ValueId> in, ir::Shape out, ir::AttrMap attrs = {},
             DType t = DType::F32) {
    std::string name = type + std::to_string(g.nodes.size());
    ValueId v = g.addValue({name + "_out", t, std::move(out), true});
    g.addNode({name, type, "", std::move(in), {v}, std::move(attrs)});
    return v;
  }
  ValueId matmul(ValueId x, ValueId w, ir::Shape out) { return op("MatMul", {x, w}, std::move(out)); }
  /// An ATen node: `kinds` per argument (Note [aten argument encoding]), `consts` for the "c:" ones.
  ValueId aten(const std::string &name, std::vector<ValueId> in, ir::Shape out, std::vector<std::string> kinds,
               ir::AttrMap consts = {}) {
    ir::AttrMap attrs = std::move(consts);
    attrs["nargs"] = static_cast<int64_t>(kinds.size());
    attrs["overload"] = std::string();
    for (size_t i = 0; i < kinds.size(); ++i) attrs["t" + std::to_string(i)] = kinds[i];
    std::string node = name + std::to_string(g.nodes.size());
    ValueId v = g.addValue({node + "_out", DType::F32, std::move(out), true});
    g.addNode({node, "aten::" + name, "aten", std::move(in), {v}, std::move(attrs)});
    return v;
  }
  void loss(ValueId v) { g.loss = op("ReduceMean", {v}, {}, {{"keepdims", int64_t{0}}}); }
};

Dim B() { return Dim::batch(); }
Dim F(int64_t n) { return Dim::fixed(n); }

Analysis analyzed(const ir::Graph &g) {
  auto a = analyze(g);
  EXPECT_TRUE(a.ok()) << a.error().message;
  return a.ok() ? *a : Analysis{};
}

int count(const Analysis &a, CollectiveKind k) {
  return static_cast<int>(std::count_if(a.collectives.begin(), a.collectives.end(),
                                        [&](const Collective &c) { return c.kind == k; }));
}

/// The constant target shape of the Reshape or Expand that makes `v` in the local graph `l`.
std::vector<int64_t> constantTarget(const ir::Graph &l, ValueId v) {
  const ir::Node &n = l.nodes[l.values[v].producer];
  const ir::Tensor &c = l.constant_data.at(n.inputs[1]);
  std::vector<int64_t> out(c.numel());
  std::memcpy(out.data(), c.data.data(), c.data.size());
  return out;
}

const Collective *find(const Analysis &a, CollectiveKind k, ValueId v) {
  for (const Collective &c : a.collectives)
    if (c.kind == k && c.value == v) return &c;
  return nullptr;
}

/// x * s -> MatMul(W1) -> Relu -> MatMul(W2) (+ b2) -> loss: Megatron's MLP.
struct Mlp {
  Builder b;
  ValueId x, s, xs, w1, h, r, w2, y, b2, yb;
  explicit Mlp(bool bias) {
    x = b.input("x", {B(), F(8)});
    s = b.param("s", {F(8)});
    w1 = b.param("w1", {F(8), F(16)});
    w2 = b.param("w2", {F(16), F(8)});
    b2 = bias ? b.param("b2", {F(8)}) : ir::kNoValue;
    xs = b.op("Mul", {x, s}, {B(), F(8)});
    h = b.matmul(xs, w1, {B(), F(16)});
    r = b.op("Relu", {h}, {B(), F(16)});
    y = b.matmul(r, w2, {B(), F(8)});
    yb = bias ? b.op("Add", {y, b2}, {B(), F(8)}) : y;
    b.loss(yb);
  }
};

TEST(Sharding, MlpIsColumnThenRowParallel) {
  Mlp m(false);
  Analysis a = analyzed(m.b.g);
  EXPECT_EQ(a.values[m.w1], (ValueSharding{1, false}));
  EXPECT_EQ(a.values[m.w2], (ValueSharding{0, false}));
  EXPECT_EQ(a.values[m.h], (ValueSharding{1, false}));
  EXPECT_EQ(a.values[m.r], (ValueSharding{1, false}));
  EXPECT_TRUE(a.values[m.y].partial);
  EXPECT_TRUE(a.values[m.xs].replicated());
  EXPECT_EQ(a.cut_sizes, (std::vector<int64_t>{16}));
  EXPECT_EQ(a.degrees(8), (std::vector<int>{1, 2, 4, 8}));
  EXPECT_FALSE(a.validDegree(3));
  // f on the matrix product's input, g on its partial output.
  const Collective *copy = find(a, CollectiveKind::CopyToGroup, m.xs);
  ASSERT_NE(copy, nullptr);
  EXPECT_EQ(copy->readers, (std::vector<ir::NodeId>{1}));
  const Collective *sum = find(a, CollectiveKind::SumOverGroup, m.y);
  ASSERT_NE(sum, nullptr);
  EXPECT_EQ(a.collectives.size(), 2u);
  EXPECT_EQ(nodeRole(m.b.g, a, 1), "column-parallel");
  EXPECT_EQ(nodeRole(m.b.g, a, 3), "row-parallel");
  EXPECT_EQ(nodeRole(m.b.g, a, 0), "whole");
}

TEST(Sharding, InputsWithoutGradientNeedNoCopy) {
  Builder b;
  ValueId x = b.input("x", {B(), F(8)});
  ValueId w1 = b.param("w1", {F(8), F(16)}), w2 = b.param("w2", {F(16), F(8)});
  ValueId h = b.matmul(x, w1, {B(), F(16)});
  b.loss(b.matmul(h, w2, {B(), F(8)}));
  Analysis a = analyzed(b.g);
  EXPECT_EQ(a.values[w1].axis, 1);
  EXPECT_EQ(count(a, CollectiveKind::CopyToGroup), 0);
  EXPECT_EQ(count(a, CollectiveKind::SumOverGroup), 1);
}

TEST(Sharding, RowParallelBiasIsAddedAfterTheSum) {
  Mlp m(true);
  Analysis a = analyzed(m.b.g);
  EXPECT_TRUE(a.values[m.b2].replicated());
  EXPECT_TRUE(a.values[m.yb].replicated());
  const Collective *sum = find(a, CollectiveKind::SumOverGroup, m.y);
  ASSERT_NE(sum, nullptr);
  EXPECT_EQ(sum->readers, (std::vector<ir::NodeId>{4})); // the bias Add reads the summed value
}

TEST(Sharding, LocalGraphOfTheMlp) {
  Mlp m(true);
  Analysis a = analyzed(m.b.g);
  auto local = localGraph(m.b.g, a, 2);
  ASSERT_TRUE(local.ok()) << local.error().message;
  const ir::Graph &l = *local;
  EXPECT_EQ(l.verify(), "");
  EXPECT_EQ(ir::shapeString(l.values[m.w1].shape), "[8,8]");
  EXPECT_EQ(ir::shapeString(l.values[m.w2].shape), "[8,8]");
  EXPECT_EQ(ir::shapeString(l.values[m.h].shape), "[B,8]");
  EXPECT_EQ(ir::shapeString(l.values[m.b2].shape), "[8]");
  ASSERT_EQ(l.nodes.size(), m.b.g.nodes.size() + 2);
  // Mul, Copy, MatMul, Relu, MatMul, Sum, Add, ReduceMean
  EXPECT_EQ(l.nodes[1].op_type, ir::kTensorParallelCopy);
  EXPECT_EQ(l.nodes[1].domain, ir::kRanncDomain);
  EXPECT_EQ(l.nodes[2].inputs[0], l.nodes[1].outputs[0]);
  EXPECT_EQ(l.nodes[5].op_type, ir::kTensorParallelSum);
  EXPECT_EQ(l.nodes[5].inputs[0], m.y);
  EXPECT_EQ(l.nodes[6].inputs[0], l.nodes[5].outputs[0]);
  EXPECT_FALSE(localGraph(m.b.g, a, 3).ok()); // 3 does not divide 16
  auto same = localGraph(m.b.g, a, 1);
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(same->nodes.size(), m.b.g.nodes.size());
}

/// Softmax over the cut axis, then a norm before the last product: nothing can be cut.
TEST(Sharding, UnknownSemanticsUnderACutStayReplicated) {
  Builder b;
  ValueId x = b.input("x", {B(), F(8)});
  ValueId s = b.param("s", {F(8)});
  ValueId w1 = b.param("w1", {F(8), F(16)}), w2 = b.param("w2", {F(16), F(8)}), w3 = b.param("w3", {F(8), F(1)});
  ValueId xs = b.op("Mul", {x, s}, {B(), F(8)});
  ValueId h = b.matmul(xs, w1, {B(), F(16)});
  ValueId p = b.op("Softmax", {h}, {B(), F(16)}, {{"axis", int64_t{-1}}});
  ValueId y = b.matmul(p, w2, {B(), F(8)});
  ValueId n = b.op("LpNormalization", {y}, {B(), F(8)});
  b.loss(b.matmul(n, w3, {B(), F(1)}));
  Analysis a = analyzed(b.g);
  EXPECT_FALSE(a.any());
  EXPECT_TRUE(a.collectives.empty());
  for (const ValueSharding &v : a.values) EXPECT_TRUE(v.replicated());
  EXPECT_EQ(a.degrees(4), (std::vector<int>{1, 2, 3, 4}));
  std::ostringstream os;
  a.print(b.g, os);
  EXPECT_NE(os.str().find("nothing to cut"), std::string::npos);
}

/// The last product before the loss is cut by columns and gathered whole for the loss.
TEST(Sharding, OutputLayerIsGatheredBeforeTheLoss) {
  Builder b;
  ValueId x = b.input("x", {B(), F(8)});
  ValueId s = b.param("s", {F(8)});
  ValueId w = b.param("w", {F(8), F(32)}), bias = b.param("bias", {F(32)});
  ValueId xs = b.op("Mul", {x, s}, {B(), F(8)});
  ValueId logits = b.op("Add", {b.matmul(xs, w, {B(), F(32)}), bias}, {B(), F(32)});
  ValueId lsm = b.op("LogSoftmax", {logits}, {B(), F(32)}, {{"axis", int64_t{-1}}});
  b.loss(lsm);
  Analysis a = analyzed(b.g);
  EXPECT_EQ(a.values[w].axis, 1);
  EXPECT_EQ(a.values[bias].axis, 0);
  const Collective *gather = find(a, CollectiveKind::GatherAxis, logits);
  ASSERT_NE(gather, nullptr);
  EXPECT_EQ(gather->axis, 1);
  EXPECT_TRUE(a.values[lsm].replicated());
  auto local = localGraph(b.g, a, 4);
  ASSERT_TRUE(local.ok()) << local.error().message;
  const ir::Node &gn = local->nodes[4];
  EXPECT_EQ(gn.op_type, ir::kTensorParallelGather);
  EXPECT_EQ(std::get<int64_t>(gn.attrs.at("axis")), 1);
  EXPECT_EQ(ir::shapeString(local->values[gn.outputs[0]].shape), "[B,32]");
  EXPECT_EQ(ir::shapeString(local->values[logits].shape), "[B,8]");
}

/// A weight that two readers want cut differently stays whole: a table
/// looked up by rows and multiplied as a [rows, cols] matrix by its columns.
TEST(Sharding, WeightWantedCutTwoWaysStaysReplicated) {
  Builder b;
  ValueId ids = b.input("ids", {B(), F(4)}, DType::I64);
  ValueId x = b.input("x", {B(), F(4), F(50)});
  ValueId table = b.param("table", {F(50), F(8)});
  ValueId e = b.op("Gather", {table, ids}, {B(), F(4), F(8)});
  ValueId y = b.matmul(x, table, {B(), F(4), F(8)});
  b.loss(b.op("Add", {e, y}, {B(), F(4), F(8)}));
  Analysis a = analyzed(b.g);
  EXPECT_FALSE(a.any());
  EXPECT_TRUE(a.values[table].replicated());
}

/// Note [vocabulary parallelism]: a lookup in a table of more rows than
/// columns cuts it by rows and gives a partial sum; the local graph looks up
/// with TensorParallelEmbedding, and sums.
TEST(Sharding, EmbeddingIsCutByVocabulary) {
  Builder b;
  ValueId ids = b.input("ids", {B(), F(4)}, DType::I64);
  ValueId table = b.param("table", {F(50), F(8)}), pos = b.param("pos", {F(4), F(8)});
  ValueId e = b.op("Gather", {table, ids}, {B(), F(4), F(8)});
  ValueId p = b.op("Gather", {pos, b.ints("positions", {0, 1, 2, 3})}, {F(4), F(8)});
  b.loss(b.op("Add", {e, p}, {B(), F(4), F(8)}));
  Analysis a = analyzed(b.g);
  EXPECT_EQ(a.values[table].axis, 0);
  EXPECT_TRUE(a.values[e].partial);
  EXPECT_TRUE(a.values[pos].replicated()); // Note [which tables are cut]
  EXPECT_EQ(a.cut_sizes, (std::vector<int64_t>{50}));
  EXPECT_EQ(nodeRole(b.g, a, 0), "vocab-parallel embedding");
  const Collective *sum = find(a, CollectiveKind::SumOverGroup, e);
  ASSERT_NE(sum, nullptr);
  auto local = localGraph(b.g, a, 2);
  ASSERT_TRUE(local.ok()) << local.error().message;
  EXPECT_EQ(local->nodes[0].op_type, ir::kTensorParallelEmbedding);
  EXPECT_TRUE(ir::isRannc(local->nodes[0]));
  EXPECT_EQ(local->nodes[0].inputs, (std::vector<ValueId>{table, ids}));
  EXPECT_EQ(ir::shapeString(local->values[table].shape), "[25,8]");
  EXPECT_EQ(local->nodes[2].op_type, ir::kTensorParallelSum);
  EXPECT_EQ(local->verify(), "");
}

/// x [B,8] -> Mul s -> MatMul w [8,32]: logits of 32 classes, and targets y [B].
struct Classifier {
  Builder b;
  ValueId y, w, logits;
  Classifier() {
    ValueId x = b.input("x", {B(), F(8)});
    y = b.input("y", {B()}, DType::I64);
    ValueId s = b.param("s", {F(8)});
    w = b.param("w", {F(8), F(32)});
    logits = b.matmul(b.op("Mul", {x, s}, {B(), F(8)}), w, {B(), F(32)});
  }
};

/// The output layer's logits stay cut by classes into the loss, which
/// becomes TensorParallelCrossEntropy: nothing is gathered.
TEST(Sharding, CrossEntropyTakesVocabularyCutLogits) {
  Classifier c;
  Builder &b = c.b;
  const ValueId y = c.y, w = c.w, logits = c.logits;
  ValueId loss = b.op("SoftmaxCrossEntropyLoss", {logits, y}, {},
                      {{"reduction", std::string("sum")}, {"ignore_index", int64_t{-1}}});
  b.g.loss = loss;
  Analysis a = analyzed(b.g);
  EXPECT_EQ(a.values[w].axis, 1);
  EXPECT_EQ(a.values[logits].axis, 1);
  EXPECT_TRUE(a.values[loss].replicated());
  EXPECT_EQ(count(a, CollectiveKind::GatherAxis), 0);
  EXPECT_EQ(nodeRole(b.g, a, 2), "vocab-parallel loss");
  auto local = localGraph(b.g, a, 4);
  ASSERT_TRUE(local.ok()) << local.error().message;
  const ir::Node &ce = local->nodes.back();
  EXPECT_EQ(ce.op_type, ir::kTensorParallelCrossEntropy);
  EXPECT_EQ(ce.domain, ir::kRanncDomain);
  EXPECT_EQ(std::get<std::string>(ce.attrs.at("reduction")), "sum");
  EXPECT_EQ(std::get<int64_t>(ce.attrs.at("ignore_index")), -1);
  EXPECT_EQ(ir::shapeString(local->values[logits].shape), "[B,8]");
  // Class weights: the loss cannot be computed on slices, so the logits are gathered.
  Builder cw = b;
  cw.g.nodes.back().inputs.push_back(cw.param("cw", {F(32)}));
  Analysis weighted = analyzed(cw.g);
  EXPECT_EQ(count(weighted, CollectiveKind::GatherAxis), 1);
}

/// LogSoftmax over the classes read only by NegativeLogLikelihoodLoss: the
/// pair is a cross entropy of the cut logits; the log-softmax passes them on.
TEST(Sharding, LogSoftmaxAndNllLossTakeVocabularyCutLogits) {
  Classifier c;
  Builder &b = c.b;
  const ValueId y = c.y, logits = c.logits;
  ValueId lsm = b.op("LogSoftmax", {logits}, {B(), F(32)}, {{"axis", int64_t{1}}});
  b.g.loss = b.op("NegativeLogLikelihoodLoss", {lsm, y}, {}, {{"ignore_index", int64_t{-100}}});
  Analysis a = analyzed(b.g);
  EXPECT_EQ(a.values[lsm].axis, 1);
  EXPECT_EQ(count(a, CollectiveKind::GatherAxis), 0);
  EXPECT_EQ(nodeRole(b.g, a, 2), "vocab-parallel loss (its log-softmax)");
  EXPECT_EQ(nodeRole(b.g, a, 3), "vocab-parallel loss");
  auto local = localGraph(b.g, a, 2);
  ASSERT_TRUE(local.ok()) << local.error().message;
  const ir::Node &id = local->nodes[local->nodes.size() - 2], &ce = local->nodes.back();
  EXPECT_EQ(id.op_type, "Identity");
  EXPECT_EQ(id.inputs, (std::vector<ValueId>{logits}));
  EXPECT_EQ(ce.op_type, ir::kTensorParallelCrossEntropy);
  EXPECT_EQ(ce.inputs[0], lsm);
  EXPECT_EQ(std::get<int64_t>(ce.attrs.at("ignore_index")), -100);
  EXPECT_EQ(local->verify(), "");
  // A second reader of the log-probabilities needs them whole: gathered first.
  Builder two_readers = b;
  two_readers.op("Exp", {lsm}, {B(), F(32)});
  Analysis two = analyzed(two_readers.g);
  EXPECT_EQ(count(two, CollectiveKind::GatherAxis), 1);
  EXPECT_TRUE(two.values[lsm].replicated());
}

/// Tied embeddings: the table is cut by rows for the lookup and for the
/// output layer alike, and the two make one region.
TEST(Sharding, TiedEmbeddingIsCutByVocabularyForBothUses) {
  Builder b;
  ValueId ids = b.input("ids", {B(), F(4)}, DType::I64);
  ValueId y = b.input("y", {B(), F(4)}, DType::I64);
  ValueId table = b.param("table", {F(50), F(8)});
  ValueId s = b.param("s", {F(8)});
  ValueId e = b.op("Gather", {table, ids}, {B(), F(4), F(8)});
  ValueId es = b.op("Mul", {e, s}, {B(), F(4), F(8)});
  ValueId wt = b.op("Transpose", {table}, {F(8), F(50)}, {{"perm", std::vector<int64_t>{1, 0}}});
  ValueId logits = b.matmul(es, wt, {B(), F(4), F(50)});
  ValueId classes = b.op("Transpose", {logits}, {B(), F(50), F(4)}, {{"perm", std::vector<int64_t>{0, 2, 1}}});
  b.g.loss = b.op("SoftmaxCrossEntropyLoss", {classes, y}, {});
  Analysis a = analyzed(b.g);
  EXPECT_EQ(a.values[table].axis, 0);
  EXPECT_EQ(a.values[wt].axis, 1);
  EXPECT_TRUE(a.values[e].partial);
  EXPECT_EQ(a.values[classes].axis, 1);
  EXPECT_EQ(count(a, CollectiveKind::GatherAxis), 0);
  auto local = localGraph(b.g, a, 2);
  ASSERT_TRUE(local.ok()) << local.error().message;
  EXPECT_EQ(ir::shapeString(local->values[table].shape), "[25,8]");
  EXPECT_EQ(local->nodes.back().op_type, ir::kTensorParallelCrossEntropy);
  EXPECT_EQ(local->nodes.back().attrs.count("ignore_index"), 0u); // ONNX's default: none ignored
}

/// Per-head attention with grouped-query key/value heads: q 4 heads, k/v 2, head size 2.
struct Attention {
  Builder b;
  ValueId x, xs, wq, wk, wv, wo, q, k, v, qh, kh, ke, kr, scores, probs, ctx, merged, out;
  Attention() {
    const Dim S = F(3);
    x = b.input("x", {B(), S, F(8)});
    ValueId s = b.param("s", {F(8)});
    wq = b.param("wq", {F(8), F(8)});
    wk = b.param("wk", {F(8), F(4)});
    wv = b.param("wv", {F(8), F(4)});
    wo = b.param("wo", {F(8), F(8)});
    xs = b.op("Mul", {x, s}, {B(), S, F(8)});
    auto perm = [](std::vector<int64_t> p) { return ir::AttrMap{{"perm", p}}; };
    q = b.matmul(xs, wq, {B(), S, F(8)});
    k = b.matmul(xs, wk, {B(), S, F(4)});
    v = b.matmul(xs, wv, {B(), S, F(4)});
    qh = b.op("Transpose", {b.op("Reshape", {q, b.ints("qs", {0, 3, 4, 2})}, {B(), S, F(4), F(2)})},
              {B(), F(4), S, F(2)}, perm({0, 2, 1, 3}));
    kh = b.op("Transpose", {b.op("Reshape", {k, b.ints("ks", {0, 3, 2, 2})}, {B(), S, F(2), F(2)})},
              {B(), F(2), S, F(2)}, perm({0, 2, 1, 3}));
    ValueId vh = b.op("Transpose", {b.op("Reshape", {v, b.ints("vs", {0, 3, 2, 2})}, {B(), S, F(2), F(2)})},
                      {B(), F(2), S, F(2)}, perm({0, 2, 1, 3}));
    // repeat_kv: [B,2,S,2] -> [B,2,1,S,2] -> [B,2,2,S,2] -> [B,4,S,2]
    auto repeat = [&](ValueId t) {
      ValueId u = b.op("Unsqueeze", {t, b.ints("ax" + std::to_string(b.g.nodes.size()), {2})}, {B(), F(2), F(1), S, F(2)});
      ke = b.op("Expand", {u, b.ints("es" + std::to_string(b.g.nodes.size()), {1, 2, 2, 3, 2})}, {B(), F(2), F(2), S, F(2)});
      return b.op("Reshape", {ke, b.ints("rs" + std::to_string(b.g.nodes.size()), {-1, 4, 3, 2})}, {B(), F(4), S, F(2)});
    };
    kr = repeat(kh);
    ValueId vr = repeat(vh);
    ValueId kt = b.op("Transpose", {kr}, {B(), F(4), F(2), S}, perm({0, 1, 3, 2}));
    scores = b.op("Mul", {b.matmul(qh, kt, {B(), F(4), S, S}), b.ints("scale", {1})}, {B(), F(4), S, S});
    probs = b.op("Softmax", {scores}, {B(), F(4), S, S}, {{"axis", int64_t{-1}}});
    ctx = b.matmul(probs, vr, {B(), F(4), S, F(2)});
    ValueId ct = b.op("Transpose", {ctx}, {B(), S, F(4), F(2)}, perm({0, 2, 1, 3}));
    merged = b.op("Reshape", {ct, b.ints("ms", {0, 3, 8})}, {B(), S, F(8)});
    out = b.matmul(merged, wo, {B(), S, F(8)});
    b.loss(out);
  }
};

TEST(Sharding, AttentionIsCutByHeadsWithGroupedKeyValueHeads) {
  Attention t;
  Analysis a = analyzed(t.b.g);
  EXPECT_EQ(a.values[t.wq].axis, 1);
  EXPECT_EQ(a.values[t.wk].axis, 1);
  EXPECT_EQ(a.values[t.wv].axis, 1);
  EXPECT_EQ(a.values[t.wo].axis, 0);
  EXPECT_EQ(a.values[t.qh].axis, 1);    // query heads
  EXPECT_EQ(a.values[t.kh].axis, 1);    // key/value heads
  EXPECT_EQ(a.values[t.ke].axis, 1);    // repeated key heads keep the key head cut
  EXPECT_EQ(a.values[t.kr].axis, 1);
  EXPECT_EQ(a.values[t.probs].axis, 1); // softmax over keys, batched over heads
  EXPECT_EQ(a.values[t.merged].axis, 2);
  EXPECT_TRUE(a.values[t.out].partial);
  EXPECT_EQ(a.cut_sizes, (std::vector<int64_t>{2, 4, 8}));
  EXPECT_EQ(a.degrees(8), (std::vector<int>{1, 2}));
  EXPECT_EQ(count(a, CollectiveKind::CopyToGroup), 1);
  EXPECT_EQ(find(a, CollectiveKind::CopyToGroup, t.xs)->readers.size(), 3u);
  EXPECT_EQ(count(a, CollectiveKind::SumOverGroup), 1);
  EXPECT_EQ(count(a, CollectiveKind::GatherAxis), 0);

  auto local = localGraph(t.b.g, a, 2);
  ASSERT_TRUE(local.ok()) << local.error().message;
  const ir::Graph &l = *local;
  EXPECT_EQ(ir::shapeString(l.values[t.wk].shape), "[8,2]");
  EXPECT_EQ(ir::shapeString(l.values[t.qh].shape), "[B,2,3,2]");
  EXPECT_EQ(ir::shapeString(l.values[t.kr].shape), "[B,2,3,2]");
  // Target shapes naming a cut size are rewritten to local constants.
  EXPECT_EQ(constantTarget(l, t.merged), (std::vector<int64_t>{-1, 3, 4}));
  EXPECT_EQ(constantTarget(l, t.ke), (std::vector<int64_t>{1, 1, 2, 1, 1}));
  EXPECT_EQ(constantTarget(l, t.kr), (std::vector<int64_t>{-1, 2, 3, 2}));
  EXPECT_EQ(l.verify(), "");
}

/// The weights of an nn.Linear pair ([out, in] as PyTorch holds them) and a scaled input.
struct LinearPair {
  Builder b;
  ValueId w1, b1, w2, b2, xs;
  LinearPair() {
    ValueId x = b.input("x", {B(), F(8)});
    ValueId s = b.param("s", {F(8)});
    w1 = b.param("w1", {F(16), F(8)}), b1 = b.param("b1", {F(16)});
    w2 = b.param("w2", {F(8), F(16)}), b2 = b.param("b2", {F(8)});
    xs = b.aten("mul", {x, s}, {B(), F(8)}, {"tensor", "tensor"});
  }
  /// Megatron's pair: the first cut by output rows, the second by input columns, its output partial.
  void expectMegatron(const Analysis &a, ValueId y) const {
    EXPECT_EQ(a.values[w1].axis, 0);
    EXPECT_EQ(a.values[b1].axis, 0);
    EXPECT_EQ(a.values[w2].axis, 1);
    EXPECT_TRUE(a.values[b2].replicated());
    EXPECT_TRUE(a.values[y].partial);
  }
};

/// TorchScript's nn.Linear pair: the row-parallel bias moves after the sum (Note [row-parallel bias]).
TEST(Sharding, AtenLinearPairAddsTheRowParallelBiasOnce) {
  LinearPair pair;
  Builder &b = pair.b;
  const ValueId xs = pair.xs, w1 = pair.w1, b1 = pair.b1, w2 = pair.w2, b2 = pair.b2;
  ValueId h = b.aten("linear", {xs, w1, b1}, {B(), F(16)}, {"tensor", "tensor", "tensor"});
  // [B,16] -> 4 groups of 4, a softmax within each group, and back
  ValueId v = b.aten("view", {h}, {B(), F(4), F(4)}, {"tensor", "c:ints"}, {{"v1", std::vector<int64_t>{-1, 4, 4}}});
  ValueId p = b.aten("softmax", {v}, {B(), F(4), F(4)}, {"tensor", "c:int", "c:none"}, {{"v1", int64_t{-1}}});
  ValueId back = b.aten("reshape", {p, b.ints("target", {-1, 16})}, {B(), F(16)}, {"tensor", "ints"});
  ValueId y = b.aten("linear", {back, w2, b2}, {B(), F(8)}, {"tensor", "tensor", "tensor"});
  b.loss(y);
  Analysis a = analyzed(b.g);
  pair.expectMegatron(a, y);
  EXPECT_EQ(a.values[v].axis, 1);
  EXPECT_EQ(count(a, CollectiveKind::CopyToGroup), 1); // xs only: b2 is added after the sum
  EXPECT_EQ(a.cut_sizes, (std::vector<int64_t>{4, 16}));

  auto local = localGraph(b.g, a, 2);
  ASSERT_TRUE(local.ok()) << local.error().message;
  const ir::Graph &l = *local;
  EXPECT_EQ(l.verify(), "");
  const ir::Node &view = l.nodes[l.values[v].producer];
  EXPECT_EQ(std::get<std::vector<int64_t>>(view.attrs.at("v1")), (std::vector<int64_t>{-1, 2, 4}));
  const ir::Node &reshape = l.nodes[l.values[back].producer];
  EXPECT_EQ(l.constant_data.at(reshape.inputs[1]).numel(), 2);
  const ir::Node &row = l.nodes[l.values[y].producer];
  EXPECT_EQ(row.inputs.size(), 2u);
  EXPECT_EQ(std::get<std::string>(row.attrs.at("t2")), "c:none");
  // linear, sum, add(bias), ReduceMean
  const ir::Node &sum = l.nodes[l.values[y].producer + 1];
  const ir::Node &add = l.nodes[l.values[y].producer + 2];
  EXPECT_EQ(sum.op_type, ir::kTensorParallelSum);
  EXPECT_EQ(add.op_type, "aten::add");
  EXPECT_EQ(add.inputs, (std::vector<ValueId>{sum.outputs[0], b2}));
  EXPECT_EQ(l.nodes.back().inputs[0], add.outputs[0]);
}

/// A slice along the cut axis keeps the cut only when it takes all of it (exporters' no-op slices).
TEST(Sharding, SliceAlongTheCutAxisMustTakeAllOfIt) {
  for (int64_t start : {0, 2}) {
    SCOPED_TRACE(start);
    Builder b;
    ValueId x = b.input("x", {B(), F(8)});
    ValueId w1 = b.param("w1", {F(8), F(16)}), w2 = b.param("w2", {F(16 - start), F(8)});
    ValueId h = b.matmul(x, w1, {B(), F(16)});
    ValueId cut = b.op("Slice", {h, b.ints("st", {start}), b.ints("en", {INT64_MAX}), b.ints("ax", {1})},
                       {B(), F(16 - start)});
    b.loss(b.matmul(cut, w2, {B(), F(8)}));
    Analysis a = analyzed(b.g);
    EXPECT_EQ(a.values[w1].axis, start == 0 ? 1 : -1);
    EXPECT_EQ(a.values[cut].axis, start == 0 ? 1 : -1);
  }
}

/// torch.export's nn.Linear pair: addmm(b, x, t(W)); the row-parallel one becomes mm and its bias follows the sum.
TEST(Sharding, AtenAddmmPairAddsTheRowParallelBiasOnce) {
  LinearPair pair;
  Builder &b = pair.b;
  const ValueId xs = pair.xs, w1 = pair.w1, b1 = pair.b1, w2 = pair.w2, b2 = pair.b2;
  ValueId w1t = b.aten("t", {w1}, {F(8), F(16)}, {"tensor"});
  ValueId h = b.aten("addmm", {b1, xs, w1t}, {B(), F(16)}, {"tensor", "tensor", "tensor"});
  ValueId r = b.aten("relu", {h}, {B(), F(16)}, {"tensor"});
  ValueId w2t = b.aten("t", {w2}, {F(16), F(8)}, {"tensor"});
  ValueId y = b.aten("addmm", {b2, r, w2t}, {B(), F(8)}, {"tensor", "tensor", "tensor"});
  b.loss(y);
  Analysis a = analyzed(b.g);
  pair.expectMegatron(a, y);
  auto local = localGraph(b.g, a, 4);
  ASSERT_TRUE(local.ok()) << local.error().message;
  const ir::Node &row = local->nodes[local->values[y].producer];
  EXPECT_EQ(row.op_type, "aten::mm");
  EXPECT_EQ(row.inputs, (std::vector<ValueId>{r, w2t}));
  const ir::Node &add = local->nodes[local->values[y].producer + 2];
  EXPECT_EQ(add.op_type, "aten::add");
  EXPECT_EQ(add.inputs[1], b2);
  EXPECT_EQ(ir::shapeString(local->values[w2t].shape), "[4,8]");
}

/// A size read from a cut value is local; where the cut axis's size flows into
/// data (here a scale), the region stays whole; the batch size may flow freely.
TEST(Sharding, ACutSizeFlowingIntoDataKeepsTheRegionWhole) {
  for (int64_t axis : {0, 1}) {
    SCOPED_TRACE(axis);
    Builder b;
    ValueId x = b.input("x", {B(), F(8)});
    ValueId w1 = b.param("w1", {F(8), F(16)}), w2 = b.param("w2", {F(16), F(8)});
    ValueId h = b.matmul(x, w1, {B(), F(16)});
    ValueId size = b.op("Shape", {h}, {F(2)}, {}, DType::I64);
    ValueId n = b.op("Gather", {size, b.ints("i", {axis})}, {F(1)}, {{"axis", int64_t{0}}}, DType::I64);
    ValueId scale = b.op("Cast", {n}, {F(1)}, {{"to", int64_t{1}}});
    ValueId y = b.op("Mul", {h, scale}, {B(), F(16)});
    b.loss(b.matmul(y, w2, {B(), F(8)}));
    Analysis a = analyzed(b.g);
    EXPECT_EQ(a.values[w1].axis, axis == 1 ? -1 : 1);
    EXPECT_EQ(a.values[y].axis, axis == 1 ? -1 : 1);
  }
}

/// A deep residual stack of MLP blocks: every block is its own column/row pair,
/// and one pass finds them all (the analysis stays linear in the graph).
TEST(Sharding, DeepStackIsOnePairPerBlock) {
  Builder b;
  const int layers = 300;
  ValueId h = b.input("x", {B(), F(8)});
  for (int l = 0; l < layers; ++l) {
    const std::string i = std::to_string(l);
    ValueId s = b.param("s" + i, {F(8)});
    ValueId w1 = b.param("w1_" + i, {F(8), F(32)}), w2 = b.param("w2_" + i, {F(32), F(8)});
    ValueId n = b.op("Mul", {h, s}, {B(), F(8)});
    ValueId y = b.matmul(b.op("Relu", {b.matmul(n, w1, {B(), F(32)})}, {B(), F(32)}), w2, {B(), F(8)});
    h = b.op("Add", {h, y}, {B(), F(8)});
  }
  b.loss(h);
  Analysis a = analyzed(b.g);
  EXPECT_EQ(count(a, CollectiveKind::CopyToGroup), layers);
  EXPECT_EQ(count(a, CollectiveKind::SumOverGroup), layers);
  EXPECT_EQ(a.cut_sizes, (std::vector<int64_t>{32}));
  auto local = localGraph(b.g, a, 8);
  ASSERT_TRUE(local.ok()) << local.error().message;
  EXPECT_EQ(local->nodes.size(), b.g.nodes.size() + 2 * layers);
}

/// The dynamo ONNX exporter's Llama layer (optimize=True), as small as it
/// goes: every target shape computed from Shape/Slice/Concat, repeat_kv as
/// Unsqueeze/Expand/Reshape, and scaled_dot_product_attention's key folded
/// into the batch ([B,4,S,2] -> [4*B,S,2] -> transpose -> [B,4,2,S]); the
/// first residual add reads the vocabulary-parallel lookup and the
/// attention's row-parallel product, both partial.
struct DynamoAttention {
  Builder b;
  ValueId ids, table, emb, wq, wk, wv, wo, xs, qv, qh, kr, kfold, kt, probs, out, h;
  /// `dynamic`: the sequence is dynamic, ids [B,?], as the exporter's defaults leave it.
  explicit DynamoAttention(bool dynamic = false) {
    const Dim S = F(3);
    auto perm = [](std::vector<int64_t> p) { return ir::AttrMap{{"perm", p}}; };
    auto dims = [&](ValueId from, int64_t start, int64_t end) {
      return b.op("Shape", {from}, {F(end - start)}, {{"start", start}, {"end", end}}, DType::I64);
    };
    auto concat = [&](std::vector<ValueId> parts, int64_t n) {
      return b.op("Concat", std::move(parts), {F(n)}, {{"axis", int64_t{0}}}, DType::I64);
    };
    auto slice = [&](ValueId x, int64_t start, int64_t end, int64_t n) {
      const std::string i = std::to_string(b.g.nodes.size());
      return b.op("Slice", {x, b.ints("st" + i, {start}), b.ints("en" + i, {end}), b.ints("ax" + i, {0})}, {F(n)}, {},
                  DType::I64);
    };
    ids = b.input("ids", {B(), dynamic ? Dim::unknown() : S}, DType::I64);
    ValueId mask = b.input("mask", {B(), F(1), S, S});
    table = b.param("table", {F(16), F(8)});
    ValueId s = b.param("s", {F(8)});
    wq = b.param("wq", {F(8), F(8)});
    wk = b.param("wk", {F(8), F(4)});
    wv = b.param("wv", {F(8), F(4)});
    wo = b.param("wo", {F(8), F(8)});
    ValueId batch = dims(ids, 0, 1), seq = dims(ids, 1, 2);
    emb = b.op("Gather", {table, ids}, {B(), S, F(8)}, {{"axis", int64_t{0}}});
    xs = b.op("Mul", {emb, s}, {B(), S, F(8)});
    ValueId heads = concat({batch, seq, b.ints("minus1", {-1}), b.ints("hd", {2})}, 4);
    auto project = [&](ValueId w, int64_t n) {
      ValueId y = b.matmul(xs, w, {B(), S, F(2 * n)});
      ValueId r = b.op("Reshape", {y, heads}, {B(), S, F(n), F(2)}, {{"allowzero", int64_t{1}}});
      if (n == 4) qv = r;
      return b.op("Transpose", {r}, {B(), F(n), S, F(2)}, perm({0, 2, 1, 3}));
    };
    qh = project(wq, 4);
    ValueId kh = project(wk, 2), vh = project(wv, 2);
    auto repeat = [&](ValueId t) { // [B,2,S,2] -> [B,2,1,S,2] -> [B,2,2,S,2] -> [B,4,S,2]
      const std::string i = std::to_string(b.g.nodes.size());
      ValueId u = b.op("Unsqueeze", {t, b.ints("u" + i, {2})}, {B(), F(2), F(1), S, F(2)});
      ValueId to = concat({batch, b.ints("two" + i, {2}), b.ints("rep" + i, {2}), seq, b.ints("d" + i, {2})}, 5);
      ValueId e = b.op("Expand", {u, to}, {B(), F(2), F(2), S, F(2)});
      ValueId back = concat({batch, b.ints("h" + i, {4}), seq, b.ints("d2" + i, {2})}, 4);
      return b.op("Reshape", {e, back}, {B(), F(4), S, F(2)}, {{"allowzero", int64_t{1}}});
    };
    kr = repeat(kh);
    ValueId vr = repeat(vh);
    // The key's transpose through the batch, its shapes read from the key itself.
    ValueId ks = b.op("Shape", {kr}, {F(4)}, {}, DType::I64);
    ValueId last = slice(ks, -1, INT64_MAX, 1), rows = slice(ks, -2, -1, 1), lead = slice(ks, 0, -2, 2);
    kfold = b.op("Reshape", {kr, concat({b.ints("fold", {-1}), rows, last}, 3)}, {Dim::batch(4), S, F(2)});
    ValueId kft = b.op("Transpose", {kfold}, {Dim::batch(4), F(2), S}, perm({0, 2, 1}));
    kt = b.op("Reshape", {kft, concat({lead, last, rows}, 4)}, {B(), F(4), F(2), S});
    ValueId scores = b.op("Add", {b.matmul(qh, kt, {B(), F(4), S, S}), mask}, {B(), F(4), S, S});
    probs = b.op("Softmax", {scores}, {B(), F(4), S, S}, {{"axis", int64_t{-1}}});
    ValueId ctx = b.op("Transpose", {b.matmul(probs, vr, {B(), F(4), S, F(2)})}, {B(), S, F(4), F(2)},
                       perm({0, 2, 1, 3}));
    ValueId merged = b.op("Reshape", {ctx, concat({batch, seq, b.ints("m1", {-1})}, 3)}, {B(), S, F(8)});
    out = b.matmul(merged, wo, {B(), S, F(8)});
    h = b.op("Add", {emb, out}, {B(), S, F(8)});
    b.loss(h);
  }
};

TEST(Sharding, DynamoAttentionIsCutByHeadsThroughTheBatchFold) {
  DynamoAttention t;
  Analysis a = analyzed(t.b.g);
  EXPECT_EQ(a.values[t.table].axis, 0); // the lookup's region stays apart from attention's
  EXPECT_TRUE(a.values[t.emb].partial);
  EXPECT_EQ(a.values[t.wq].axis, 1);
  EXPECT_EQ(a.values[t.wk].axis, 1);
  EXPECT_EQ(a.values[t.wv].axis, 1);
  EXPECT_EQ(a.values[t.wo].axis, 0);
  EXPECT_EQ(a.values[t.qh].axis, 1);
  EXPECT_EQ(a.values[t.kr].axis, 1);
  EXPECT_EQ(a.values[t.kfold].axis, 0); // 4 heads per batch row (Note [batch-folded cuts])
  EXPECT_EQ(a.values[t.kt].axis, 1);
  EXPECT_EQ(a.values[t.probs].axis, 1);
  EXPECT_TRUE(a.values[t.out].partial);
  EXPECT_TRUE(a.values[t.h].replicated());
  EXPECT_EQ(a.cut_sizes, (std::vector<int64_t>{2, 4, 8, 16}));
  EXPECT_EQ(a.degrees(8), (std::vector<int>{1, 2}));
  EXPECT_EQ(count(a, CollectiveKind::CopyToGroup), 1);
  EXPECT_EQ(find(a, CollectiveKind::CopyToGroup, t.xs)->readers.size(), 3u);
  EXPECT_EQ(count(a, CollectiveKind::SumOverGroup), 2); // the lookup's and the attention's
  EXPECT_EQ(count(a, CollectiveKind::GatherAxis), 0);

  auto local = localGraph(t.b.g, a, 2);
  ASSERT_TRUE(local.ok()) << local.error().message;
  const ir::Graph &l = *local;
  EXPECT_EQ(l.verify(), "");
  EXPECT_EQ(ir::shapeString(l.values[t.kfold].shape), ir::shapeString({Dim::batch(2), F(3), F(2)}));
  EXPECT_EQ(ir::shapeString(l.values[t.kt].shape), "[B,2,2,3]");
  EXPECT_EQ(ir::shapeString(l.values[t.wk].shape), "[8,2]");
  EXPECT_EQ(ir::shapeString(l.values[t.table].shape), "[8,8]");
  // Targets computed from the cut key's shape become local constants.
  EXPECT_EQ(constantTarget(l, t.kfold), (std::vector<int64_t>{-1, 3, 2}));
  EXPECT_EQ(constantTarget(l, t.kt), (std::vector<int64_t>{-1, 2, 2, 3}));
  EXPECT_EQ(constantTarget(l, t.kr), (std::vector<int64_t>{-1, 2, 3, 2}));
}

/// With a dynamic sequence the shapes were found at a stand-in size, so a
/// target computed at run time stays computed, only its entry at the cut
/// axis replaced (Note [target shapes of unknown inputs]).
TEST(Sharding, DynamicSequenceKeepsTargetsComputedAtRunTime) {
  DynamoAttention t(/*dynamic=*/true);
  Analysis a = analyzed(t.b.g);
  EXPECT_EQ(a.values[t.wq].axis, 1);
  EXPECT_EQ(a.values[t.kfold].axis, 0);
  EXPECT_EQ(a.cut_sizes, (std::vector<int64_t>{2, 4, 8, 16}));
  auto local = localGraph(t.b.g, a, 2);
  ASSERT_TRUE(local.ok()) << local.error().message;
  const ir::Graph &l = *local;
  EXPECT_EQ(l.verify(), "");
  auto targetOf = [&](ValueId v) { return l.nodes[l.values[v].producer].inputs[1]; };
  auto patched = [&](ValueId v, int64_t entry) { // Concat(Slice(T, 0, p), [entry], Slice(T, p+1, rank))
    const ir::Value &target = l.values[targetOf(v)];
    ASSERT_GE(target.producer, 0);
    const ir::Node &c = l.nodes[target.producer];
    EXPECT_EQ(c.op_type, "Concat");
    int64_t found = -100;
    for (ValueId in : c.inputs)
      if (l.values[in].kind == ValueKind::Constant) std::memcpy(&found, l.constant_data.at(in).data.data(), 8);
    EXPECT_EQ(found, entry);
  };
  patched(t.kr, 2); // [B,4,S,2] from Concat(batch, 4, seq, 2): the 4 heads become 2
  // The query's target holds -1 at the heads, the folded key's -1 at the fold, and the key's
  // transpose back reads the heads from the cut key itself: all kept as the model computes them.
  EXPECT_EQ(targetOf(t.qv), t.b.g.nodes[t.b.g.values[t.qv].producer].inputs[1]);
  EXPECT_EQ(targetOf(t.kfold), t.b.g.nodes[t.b.g.values[t.kfold].producer].inputs[1]);
  EXPECT_EQ(targetOf(t.kt), t.b.g.nodes[t.b.g.values[t.kt].producer].inputs[1]);
}

/// A batch-folded cut must never be all-gathered: concatenating the devices'
/// slices would interleave the batch rows wrongly, so the region stays whole.
TEST(Sharding, BatchFoldedCutIsNeverGathered) {
  Builder b;
  ValueId x = b.input("x", {B(), F(8)});
  ValueId s = b.param("s", {F(8)}), w = b.param("w", {F(8), F(8)});
  ValueId y = b.matmul(b.op("Mul", {x, s}, {B(), F(8)}), w, {B(), F(8)});
  ValueId folded = b.op("Reshape", {y, b.ints("t", {-1})}, {Dim::batch(8)});
  b.loss(b.op("Softmax", {folded}, {Dim::batch(8)}, {{"axis", int64_t{0}}})); // over the cut axis: no rule
  Analysis a = analyzed(b.g);
  EXPECT_TRUE(a.values[w].replicated());
  EXPECT_FALSE(a.any());
}

/// A reshape that would split heads (the cut lands inside a head) is refused.
TEST(Sharding, ReshapeThatSplitsAHeadIsNotCut) {
  EXPECT_EQ(detail::reshapeAxis({B(), F(8)}, {B(), F(2), F(4)}, 1), std::optional<int>(1));
  EXPECT_EQ(detail::reshapeAxis({B(), F(2), F(4)}, {B(), F(8)}, 1), std::optional<int>(1));
  EXPECT_EQ(detail::reshapeAxis({B(), F(2), F(4)}, {B(), F(8)}, 2), std::nullopt); // inner axis merged
  EXPECT_EQ(detail::reshapeAxis({B(), F(8)}, {B(), F(1), F(8)}, 1), std::optional<int>(2));
  EXPECT_EQ(detail::reshapeAxis({B(), F(6)}, {B(), F(4), F(3)}, 1), std::nullopt);
  EXPECT_EQ(detail::reshapeAxis({B(), F(3), F(8)}, {Dim::batch(3), F(8)}, 2), std::optional<int>(1));
  // Heads folded into the batch and back (Note [batch-folded cuts]).
  EXPECT_EQ(detail::reshapeAxis({B(), F(4), F(3), F(2)}, {Dim::batch(4), F(3), F(2)}, 1), std::optional<int>(0));
  EXPECT_EQ(detail::reshapeAxis({Dim::batch(4), F(2), F(3)}, {B(), F(4), F(2), F(3)}, 0), std::optional<int>(1));
  EXPECT_EQ(detail::reshapeAxis({B(), F(4), F(3), F(2)}, {Dim::batch(12), F(2)}, 1), std::optional<int>(0));
  EXPECT_EQ(detail::reshapeAxis({B(), F(3), F(4), F(2)}, {Dim::batch(12), F(2)}, 2), std::nullopt); // seq above heads
  EXPECT_EQ(detail::reshapeAxis({B(), F(8)}, {B(), F(2), F(4)}, 0), std::nullopt); // the batch is never cut
}

} // namespace
} // namespace rannc::sharding
