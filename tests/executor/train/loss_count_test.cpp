// Note [loss denominators] without MPI: which losses have a data-decided
// denominator, and each micro-batch's share of it.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <vector>

#include "executor/train/loss_count.h"

namespace rannc::train {
namespace {

ir::ValueId value(ir::Graph &g, const std::string &name, ir::ValueKind kind, ir::DType dt, ir::Shape shape) {
  ir::Value v;
  v.name = name;
  v.kind = kind;
  v.dtype = dt;
  v.shape = std::move(shape);
  v.shape_known = true;
  return g.addValue(v);
}

ir::ValueId node(ir::Graph &g, const std::string &op, std::vector<ir::ValueId> ins, ir::DType dt, ir::Shape shape,
                 ir::AttrMap attrs = {}) {
  ir::ValueId out = value(g, op + "_out" + std::to_string(g.nodes.size()), ir::ValueKind::Intermediate, dt, shape);
  ir::Node n;
  n.name = op + std::to_string(g.nodes.size());
  n.op_type = op;
  n.inputs = std::move(ins);
  n.outputs = {out};
  n.attrs = std::move(attrs);
  g.addNode(n);
  return out;
}

/// logits [B, 5] from x @ w, labels [B]; the loss as `make_loss` builds it.
template <class F> ir::Graph lossGraph(F make_loss) {
  using ir::Dim;
  ir::Graph g;
  g.opset = 17;
  auto x = value(g, "x", ir::ValueKind::Input, ir::DType::F32, {Dim::batch(), Dim::fixed(3)});
  auto y = value(g, "y", ir::ValueKind::Input, ir::DType::I64, {Dim::batch()});
  auto w = value(g, "w", ir::ValueKind::Parameter, ir::DType::F32, {Dim::fixed(3), Dim::fixed(5)});
  g.inputs = {x, y};
  g.parameters = {w};
  auto logits = node(g, "MatMul", {x, w}, ir::DType::F32, {Dim::batch(), Dim::fixed(5)});
  g.loss = make_loss(g, logits, y, w);
  return g;
}

TEST(LossDenominator, CrossEntropyWithIgnoreIndexCountsTheTargetsNotIgnored) {
  auto g = lossGraph([](ir::Graph &g, ir::ValueId logits, ir::ValueId y, ir::ValueId) {
    return node(g, "SoftmaxCrossEntropyLoss", {logits, y}, ir::DType::F32, {},
                {{"ignore_index", int64_t(-100)}, {"reduction", std::string("mean")}});
  });
  auto d = findLossDenominator(g);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->kind, LossDenominator::Kind::Targets);
  EXPECT_EQ(d->value, g.findValue("y"));
  EXPECT_EQ(d->ignore_index, -100);
  EXPECT_TRUE(d->nodes.empty()); // the labels themselves
}

TEST(LossDenominator, AMeanOverSamplesOrASumHasNone) {
  // No ignore_index: every element counts, a mean over samples.
  auto plain = lossGraph([](ir::Graph &g, ir::ValueId logits, ir::ValueId y, ir::ValueId) {
    return node(g, "SoftmaxCrossEntropyLoss", {logits, y}, ir::DType::F32, {});
  });
  EXPECT_FALSE(findLossDenominator(plain));
  auto sum = lossGraph([](ir::Graph &g, ir::ValueId logits, ir::ValueId y, ir::ValueId) {
    return node(g, "SoftmaxCrossEntropyLoss", {logits, y}, ir::DType::F32, {},
                {{"ignore_index", int64_t(-100)}, {"reduction", std::string("sum")}});
  });
  EXPECT_FALSE(findLossDenominator(sum));
}

TEST(LossDenominator, ADivisionByAParameterIsNotACount) {
  auto g = lossGraph([](ir::Graph &g, ir::ValueId logits, ir::ValueId, ir::ValueId w) {
    auto s = node(g, "ReduceSum", {logits}, ir::DType::F32, {});
    auto ws = node(g, "ReduceSum", {w}, ir::DType::F32, {});
    return node(g, "Div", {s, ws}, ir::DType::F32, {});
  });
  EXPECT_FALSE(findLossDenominator(g));
}

/// The exporters' decomposition: sum(masked losses) / sum(labels != -100), then a Cast.
ir::Graph decomposed() {
  return lossGraph([](ir::Graph &g, ir::ValueId logits, ir::ValueId y, ir::ValueId) {
    auto s = node(g, "ReduceSum", {logits}, ir::DType::F32, {});
    auto ignore = value(g, "ignore", ir::ValueKind::Constant, ir::DType::I64, {});
    g.constants.push_back(ignore);
    g.constant_data[ignore] = ir::Tensor{ir::DType::I64, {}, std::string("\x9c\xff\xff\xff\xff\xff\xff\xff", 8)};
    auto eq = node(g, "Equal", {y, ignore}, ir::DType::Bool, {ir::Dim::batch()});
    auto keep = node(g, "Not", {eq}, ir::DType::Bool, {ir::Dim::batch()});
    auto f = node(g, "Cast", {keep}, ir::DType::F32, {ir::Dim::batch()}, {{"to", int64_t(1)}});
    auto count = node(g, "ReduceSum", {f}, ir::DType::F32, {}, {{"keepdims", int64_t(0)}});
    auto div = node(g, "Div", {s, count}, ir::DType::F32, {});
    return node(g, "Cast", {div}, ir::DType::F32, {}, {{"to", int64_t(1)}});
  });
}

TEST(LossDenominator, ADivisionByACountOfTheDataIsFoundThroughACast) {
  auto g = decomposed();
  auto d = findLossDenominator(g);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->kind, LossDenominator::Kind::Value);
  EXPECT_EQ(d->nodes.size(), 4u); // Equal, Not, Cast, ReduceSum: not the loss's own nodes
}

TEST(LossShares, EachMicroBatchWeighsItsShareOfTheBatchCount) {
  auto g = decomposed();
  // One label per sample; 2 micro-batches of 4 samples, 2 replicas of 2:
  // [-100, 1 | 2, 3] then [-100, -100 | 4, -100] count 1 | 2 then 0 | 1: 4 in all.
  const std::vector<int64_t> labels = {-100, 1, 2, 3, -100, -100, 4, -100};
  const ir::ValueId y = g.findValue("y"), x = g.findValue("x");
  FeedSamples feed = [&](int64_t first, int64_t count) {
    runtime::ValueMap m;
    m[y] = torch::tensor(std::vector<int64_t>(labels.begin() + first, labels.begin() + first + count));
    m[x] = torch::zeros({count, 3});
    return m;
  };
  // Replica 1 holds samples 2-3 of each micro-batch.
  LossShares shares(g, {{0, 2}, {2, 4}}, /*replica=*/1, /*b=*/4, /*M=*/2);
  shares.newStep(0, 2, feed);
  // mb 0, replica 1: labels 2, 3 -> 2 of 1+2+0+1 = 4; mb 1, replica 1: 4, -100 -> 1 of 4.
  EXPECT_EQ(shares.share(0), std::make_pair(2.0, 4.0));
  EXPECT_EQ(shares.share(1), std::make_pair(1.0, 4.0));
  // A mean over samples: 2 of the batch's 8 samples, whatever the labels.
  auto plain = lossGraph([](ir::Graph &g, ir::ValueId logits, ir::ValueId y, ir::ValueId) {
    return node(g, "SoftmaxCrossEntropyLoss", {logits, y}, ir::DType::F32, {});
  });
  LossShares by_samples(plain, {{0, 2}, {2, 4}}, 1, 4, 2);
  by_samples.newStep(0, 2, feed);
  EXPECT_EQ(by_samples.share(1), std::make_pair(2.0, 8.0));
}

} // namespace
} // namespace rannc::train
