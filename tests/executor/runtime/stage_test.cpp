// StageRunner's buffers (Note [buffers] in planner/ir/ir.h), the initial
// weights of weightless models (Note [initial weights]) and the split
// backward against the whole one (Note [one W pass]). Expected values are
// computed here with LibTorch from the same inputs, following the ONNX
// BatchNormalization formula; nothing is typed in.
#include <gtest/gtest.h>

#include "executor/runtime/stage.h"
#include "executor/runtime/weights.h"
#include "executor/schedule/schedule.h"

namespace rannc::runtime {
namespace {

using ir::Dim;
using ir::DType;
using ir::ValueKind;

/// x [B,3,4,4] -> BatchNormalization (running stats as buffers) -> mean(y*y) = loss.
struct BnGraph {
  ir::Graph g;
  ir::ValueId x, scale, bias, mean, var, y;

  explicit BnGraph(bool training) {
    g.opset = 17;
    auto value = [&](const char *name, ir::Shape s, ValueKind k) {
      ir::ValueId id = g.addValue({name, DType::F32, std::move(s), true, k});
      if (k == ValueKind::Input) g.inputs.push_back(id);
      if (k == ValueKind::Parameter) g.parameters.push_back(id);
      if (k == ValueKind::Buffer) g.buffers.push_back(id);
      return id;
    };
    x = value("x", {Dim::batch(), Dim::fixed(3), Dim::fixed(4), Dim::fixed(4)}, ValueKind::Input);
    scale = value("bn.weight", {Dim::fixed(3)}, ValueKind::Parameter);
    bias = value("bn.bias", {Dim::fixed(3)}, ValueKind::Parameter);
    mean = value("bn.running_mean", {Dim::fixed(3)}, ValueKind::Buffer);
    var = value("bn.running_var", {Dim::fixed(3)}, ValueKind::Buffer);
    y = value("y", {}, ValueKind::Intermediate);
    ir::Node bn{"bn", "BatchNormalization", "", {x, scale, bias, mean, var}, {y}, {}};
    bn.attrs["momentum"] = 0.9;
    bn.attrs["epsilon"] = 1e-5;
    bn.attrs["training_mode"] = int64_t(training);
    if (training) {
      bn.outputs.push_back(value("new_mean", {}, ValueKind::Intermediate));
      bn.outputs.push_back(value("new_var", {}, ValueKind::Intermediate));
    }
    g.addNode(bn);
    ir::ValueId sq = value("sq", {}, ValueKind::Intermediate);
    g.addNode({"sq", "Mul", "", {y, y}, {sq}, {}});
    g.loss = value("loss", {}, ValueKind::Intermediate);
    ir::Node mean_node{"loss", "ReduceMean", "", {sq}, {g.loss}, {}};
    mean_node.attrs["keepdims"] = int64_t(0);
    g.addNode(mean_node);
  }

  StageRunner runner(torch::Tensor m0, torch::Tensor v0) const {
    auto prog = schedule::buildStageProgram(g, {{0, int(g.nodes.size())}}, 0);
    std::map<ir::ValueId, torch::Tensor> params{{scale, torch::ones({3}).set_requires_grad(true)},
                                                {bias, torch::zeros({3}).set_requires_grad(true)}};
    return StageRunner(g, prog, params, {}, {{mean, m0}, {var, v0}});
  }
};

TEST(StageBuffers, ProgramListsBuffersApartFromParameters) {
  BnGraph bn(true);
  auto prog = schedule::buildStageProgram(bn.g, {{0, int(bn.g.nodes.size())}}, 0);
  EXPECT_EQ(prog.parameters, (std::vector<ir::ValueId>{bn.scale, bn.bias}));
  EXPECT_EQ(prog.buffers, (std::vector<ir::ValueId>{bn.mean, bn.var}));
  auto updates = ir::bufferUpdates(bn.g);
  ASSERT_EQ(updates.size(), 2u);
  EXPECT_EQ(updates[0].buffer, bn.mean);
  EXPECT_EQ(updates[1].buffer, bn.var);
  EXPECT_TRUE(ir::bufferUpdates(BnGraph(false).g).empty()) << "inference mode updates nothing";
}

TEST(StageBuffers, EveryMicroBatchUpdatesTheRunningStatistics) {
  BnGraph bn(true);
  torch::Tensor m0 = torch::randn({3}), v0 = torch::rand({3}) + 0.5;
  StageRunner r = bn.runner(m0.clone(), v0.clone());
  torch::Tensor x0 = torch::randn({5, 3, 4, 4}) * 2 + 1, x1 = torch::randn({3, 3, 4, 4}) - 0.5;
  r.forward(0, {{bn.x, x0}});
  r.forward(1, {{bn.x, x1}});
  r.backward(1, {}, 0.5);
  r.backward(0, {}, 0.5);
  // ONNX: running = running * momentum + batch * (1 - momentum), biased variance.
  torch::Tensor want_m = m0, want_v = v0;
  for (const auto &x : {x0, x1}) {
    want_m = want_m * 0.9 + x.mean({0, 2, 3}) * 0.1;
    want_v = want_v * 0.9 + x.var({0, 2, 3}, /*unbiased=*/false) * 0.1;
  }
  const torch::Tensor &got_m = r.buffers().at(bn.mean), &got_v = r.buffers().at(bn.var);
  EXPECT_TRUE(torch::allclose(got_m, want_m, 1e-5, 1e-6)) << got_m << want_m;
  EXPECT_TRUE(torch::allclose(got_v, want_v, 1e-5, 1e-6)) << got_v << want_v;
  EXPECT_FALSE(got_m.requires_grad());
  EXPECT_FALSE(got_m.grad().defined());
  // Only the parameters train, and the buffers are not among them.
  EXPECT_EQ(r.parameters().size(), 2u);
  for (const auto &p : r.parameters()) EXPECT_TRUE(p.grad().defined());
}

TEST(StageBuffers, InferenceModeLeavesThemAlone) {
  BnGraph bn(false);
  torch::Tensor m0 = torch::randn({3}), v0 = torch::rand({3}) + 0.5;
  StageRunner r = bn.runner(m0.clone(), v0.clone());
  r.forward(0, {{bn.x, torch::randn({4, 3, 4, 4})}});
  EXPECT_TRUE(torch::equal(r.buffers().at(bn.mean), m0));
  EXPECT_TRUE(torch::equal(r.buffers().at(bn.var), v0));
}

TEST(InitialWeights, DependOnSeedAndNameOnlyAndFollowTheRoles) {
  BnGraph bn(true);
  ir::ValueId w = bn.g.addValue({"fc.weight", DType::F32, {Dim::fixed(64), Dim::fixed(32)}, true,
                                 ValueKind::Parameter});
  std::vector<ir::ValueId> all{bn.scale, bn.bias, bn.mean, bn.var, w};
  auto a = initialTensors(bn.g, all, 7), b = initialTensors(bn.g, all, 7), c = initialTensors(bn.g, all, 8);
  EXPECT_TRUE(torch::equal(a.at(w), b.at(w)));
  EXPECT_FALSE(torch::equal(a.at(w), c.at(w)));
  // Asking for one value alone gives it the same contents (no shared stream).
  EXPECT_TRUE(torch::equal(initialTensors(bn.g, {w}, 7).at(w), a.at(w)));
  EXPECT_NEAR(a.at(w).std().item<double>(), 0.02, 0.002);
  EXPECT_TRUE(torch::equal(a.at(bn.scale), torch::ones({3})));
  EXPECT_TRUE(torch::equal(a.at(bn.bias), torch::zeros({3})));
  EXPECT_TRUE(torch::equal(a.at(bn.mean), torch::zeros({3})));
  EXPECT_TRUE(torch::equal(a.at(bn.var), torch::ones({3})));
}


/// x [B,8] -> MatMul w1 -> Add b1 -> Relu -> MatMul w2 -> Add b2 -> mean(z*z):
/// two weight-gradient roots, mm1 below mm2's data side, and two bias Adds
/// whose gradients B computes (Note [weight gradients in B]).
struct MlpGraph {
  ir::Graph g;
  ir::ValueId x, w1, b1, w2, b2;

  MlpGraph() {
    g.opset = 17;
    auto value = [&](const char *name, ir::Shape s, ValueKind k) {
      ir::ValueId id = g.addValue({name, DType::F32, std::move(s), true, k});
      if (k == ValueKind::Input) g.inputs.push_back(id);
      if (k == ValueKind::Parameter) g.parameters.push_back(id);
      return id;
    };
    auto mid = [&](const char *name) { return value(name, {}, ValueKind::Intermediate); };
    x = value("x", {Dim::batch(), Dim::fixed(8)}, ValueKind::Input);
    w1 = value("w1", {Dim::fixed(8), Dim::fixed(16)}, ValueKind::Parameter);
    b1 = value("b1", {Dim::fixed(16)}, ValueKind::Parameter);
    w2 = value("w2", {Dim::fixed(16), Dim::fixed(8)}, ValueKind::Parameter);
    b2 = value("b2", {Dim::fixed(8)}, ValueKind::Parameter);
    ir::ValueId h = mid("h"), hb = mid("hb"), r = mid("r"), z = mid("z"), zb = mid("zb"), sq = mid("sq");
    g.addNode({"mm1", "MatMul", "", {x, w1}, {h}, {}});
    g.addNode({"add1", "Add", "", {h, b1}, {hb}, {}});
    g.addNode({"relu", "Relu", "", {hb}, {r}, {}});
    g.addNode({"mm2", "MatMul", "", {r, w2}, {z}, {}});
    g.addNode({"add2", "Add", "", {z, b2}, {zb}, {}});
    g.addNode({"sq", "Mul", "", {zb, zb}, {sq}, {}});
    g.loss = mid("loss");
    ir::Node mean_node{"loss", "ReduceMean", "", {sq}, {g.loss}, {}};
    mean_node.attrs["keepdims"] = int64_t(0);
    g.addNode(mean_node);
  }

  StageRunner runner(const std::map<ir::ValueId, torch::Tensor> &init) const {
    auto prog = schedule::buildStageProgram(g, {{0, int(g.nodes.size())}}, 0);
    std::map<ir::ValueId, torch::Tensor> params;
    for (const auto &[v, t] : init) params[v] = t.clone().set_requires_grad(true);
    return StageRunner(g, prog, params, {});
  }
};

// Note [one W pass]: the two roots' W and B's bias gradients run as one
// engine pass on a graph cut below each root. Had a cut been missed, w1
// would also take, through mm2's data side, a second share of the gradient;
// the split grads equal the whole backward's bit for bit.
TEST(SplitBackward, WeightGradientsEqualTheWholeBackwards) {
  MlpGraph mlp;
  torch::manual_seed(3);
  std::map<ir::ValueId, torch::Tensor> init{{mlp.w1, torch::randn({8, 16})},
                                            {mlp.b1, torch::randn({16})},
                                            {mlp.w2, torch::randn({16, 8})},
                                            {mlp.b2, torch::randn({8})}};
  std::vector<torch::Tensor> xs{torch::randn({5, 8}), torch::randn({3, 8}), torch::randn({4, 8})};
  StageRunner whole = mlp.runner(init), split = mlp.runner(init);
  split.setSplitBackward(true);
  ASSERT_TRUE(split.splitsBackward());
  for (int mb = 0; mb < 3; ++mb) {
    whole.forward(mb, {{mlp.x, xs[mb]}});
    split.forward(mb, {{mlp.x, xs[mb]}});
  }
  for (int mb : {2, 0, 1}) {
    whole.backward(mb, {}, 1.0 / 3);
    split.backward(mb, {}, 1.0 / 3);
    split.release(mb);
  }
  for (const auto &p : split.parameters()) EXPECT_FALSE(p.grad().defined()) << "B alone reaches no weight";
  for (int mb : {2, 0, 1}) split.backwardWeights(mb); // B's order: the same sums as the whole backward's
  const std::vector<torch::Tensor> want = whole.parameters(), got = split.parameters();
  ASSERT_EQ(want.size(), 4u);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_TRUE(got[i].grad().defined());
    EXPECT_TRUE(torch::equal(got[i].grad(), want[i].grad())) << i << got[i].grad() << want[i].grad();
  }
}

} // namespace
} // namespace rannc::runtime
