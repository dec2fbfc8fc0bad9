// Unit tests for the ONNX kernels: expected values follow the ONNX operator
// specification, with the arithmetic in a comment next to each; and for the
// conformance runner's verdicts.
#include "executor/runtime/ops.h"

#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "executor/runtime/conformance.h"
#include "planner/ir/aten_args.h"
#include "planner/ir/op_set.h"

namespace rannc::runtime {
namespace {

using torch::Tensor;

Tensor i64(std::vector<int64_t> v) { return torch::tensor(v, torch::kLong); }
Tensor f32(std::vector<float> v) { return torch::tensor(v, torch::kFloat); }

/// A node whose inputs are values 0..n-1 (kNoValue for undefined tensors) and
/// whose outputs are values 100.. (kNoValue where `skip_outputs` says so).
ir::Node makeNode(const std::string &op, const std::vector<Tensor> &inputs, ir::AttrMap attrs,
                  size_t num_outputs, std::vector<size_t> skip_outputs = {}) {
  ir::Node n;
  n.name = "n_" + op;
  n.op_type = op;
  n.attrs = std::move(attrs);
  for (size_t i = 0; i < inputs.size(); ++i)
    n.inputs.push_back(inputs[i].defined() ? ir::ValueId(i) : ir::kNoValue);
  for (size_t i = 0; i < num_outputs; ++i) n.outputs.push_back(ir::ValueId(100 + i));
  for (size_t i : skip_outputs) n.outputs[i] = ir::kNoValue;
  return n;
}

std::vector<Tensor> runAll(const std::string &op, const std::vector<Tensor> &inputs,
                           ir::AttrMap attrs = {}, size_t num_outputs = 1, int64_t opset = 17) {
  return runOp(makeNode(op, inputs, std::move(attrs), num_outputs), inputs, opset);
}

Tensor run1(const std::string &op, const std::vector<Tensor> &inputs, ir::AttrMap attrs = {},
            int64_t opset = 17) {
  return runAll(op, inputs, std::move(attrs), 1, opset)[0];
}

std::vector<int64_t> longs(const Tensor &t) {
  Tensor c = t.to(torch::kLong).contiguous().reshape({-1});
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}
std::vector<int64_t> sizes(const Tensor &t) { return t.sizes().vec(); }

/// Message of the runtime_error `f` throws ("" when it does not throw).
template <typename F> std::string errorOf(F f) {
  try {
    f();
  } catch (const std::runtime_error &e) {
    return e.what();
  }
  return "";
}

TEST(OpsTest, ReshapeZeroAndMinusOne) {
  // [2,3,4] with shape [0,-1]: 0 copies dim 0 (2), -1 takes 24/2 = 12.
  Tensor y = run1("Reshape", {torch::zeros({2, 3, 4}), i64({0, -1})});
  EXPECT_EQ(sizes(y), (std::vector<int64_t>{2, 12}));
  // allowzero=1 makes 0 literal: [0,3] -> [3,0].
  y = run1("Reshape", {torch::zeros({0, 3}), i64({3, 0})}, {{"allowzero", int64_t(1)}});
  EXPECT_EQ(sizes(y), (std::vector<int64_t>{3, 0}));
  // Without it the 0 copies dim 1 (3): [3,3] cannot hold 0 elements.
  EXPECT_NE(errorOf([&] { run1("Reshape", {torch::zeros({0, 3}), i64({3, 0})}); }), "");
}

TEST(OpsTest, SliceNegativeStepsAndClamping) {
  Tensor x = torch::arange(10);
  // start -1 -> 9; end -100 clamps to -1 (before index 0); step -3: 9,6,3,0.
  EXPECT_EQ(longs(run1("Slice", {x, i64({-1}), i64({-100}), i64({0}), i64({-3})})),
            (std::vector<int64_t>{9, 6, 3, 0}));
  // end 1000 clamps to 10; step 2 from 2: 2,4,6,8.
  EXPECT_EQ(longs(run1("Slice", {x, i64({2}), i64({1000}), Tensor(), i64({2})})),
            (std::vector<int64_t>{2, 4, 6, 8}));
  // Negative axis on [3,4] (values 0..11): rows all, columns 3 down to (not) 0: 3,2,1.
  Tensor m = torch::arange(12).reshape({3, 4});
  Tensor y = run1("Slice", {m, i64({3}), i64({0}), i64({-1}), i64({-1})});
  EXPECT_EQ(longs(y), (std::vector<int64_t>{3, 2, 1, 7, 6, 5, 11, 10, 9}));
  // Opset 9 takes starts/ends/axes as attributes: rows 1..2 -> 4..11.
  y = run1("Slice", {m}, {{"starts", std::vector<int64_t>{1}}, {"ends", std::vector<int64_t>{3}}},
           9);
  EXPECT_EQ(sizes(y), (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(longs(y)[0], 4);
}

TEST(OpsTest, GatherNegativeIndices) {
  Tensor x = torch::tensor({1, 2, 3, 4, 5, 6}).reshape({3, 2});
  // Rows -1 (= 2) and 0: [[5,6],[1,2]].
  EXPECT_EQ(longs(run1("Gather", {x, i64({-1, 0})})), (std::vector<int64_t>{5, 6, 1, 2}));
  // A scalar index drops the axis: column -1 (= 1) of each row: [2,4,6].
  Tensor y = run1("Gather", {x, torch::scalar_tensor(-1, torch::kLong)}, {{"axis", int64_t(1)}});
  EXPECT_EQ(sizes(y), (std::vector<int64_t>{3}));
  EXPECT_EQ(longs(y), (std::vector<int64_t>{2, 4, 6}));
  // GatherElements: out[i][j] = x[i][idx[i][j]] -> [[2,1],[3,3],[6,5]] with -1 = 1.
  Tensor idx = i64({1, 0, 0, 0, -1, 0}).reshape({3, 2});
  EXPECT_EQ(longs(run1("GatherElements", {x, idx}, {{"axis", int64_t(1)}})),
            (std::vector<int64_t>{2, 1, 3, 3, 6, 5}));
}

TEST(OpsTest, IntegerArithmeticStaysInteger) {
  // ONNX integer Div truncates: 7/2 = 3, -7/2 = -3 (floor would give -4).
  Tensor q = run1("Div", {i64({7, -7}), i64({2, 2})});
  EXPECT_EQ(q.scalar_type(), torch::kLong);
  EXPECT_EQ(longs(q), (std::vector<int64_t>{3, -3}));
  // ReduceSum of int32 stays int32: 1+2+3 = 6.
  Tensor s = run1("ReduceSum", {torch::tensor({1, 2, 3}, torch::kInt)}, {{"keepdims", int64_t(0)}});
  EXPECT_EQ(s.scalar_type(), torch::kInt);
  EXPECT_EQ(longs(s), (std::vector<int64_t>{6}));
  // Pow keeps the base's type: 3^2.0 = 9 (int64); 2.0^3 (int exponent) = 8.0.
  Tensor p = run1("Pow", {i64({3}), f32({2})});
  EXPECT_EQ(p.scalar_type(), torch::kLong);
  EXPECT_EQ(longs(p), (std::vector<int64_t>{9}));
  EXPECT_FLOAT_EQ(run1("Pow", {f32({2}), i64({3})}).item<float>(), 8.0f);
}

TEST(OpsTest, ShapeStartEnd) {
  Tensor x = torch::zeros({2, 3, 4, 5});
  EXPECT_EQ(longs(run1("Shape", {x})), (std::vector<int64_t>{2, 3, 4, 5}));
  // start 1, end -1 (= 3): dims 1..2 -> [3,4].
  EXPECT_EQ(longs(run1("Shape", {x}, {{"start", int64_t(1)}, {"end", int64_t(-1)}})),
            (std::vector<int64_t>{3, 4}));
  // start -10 clamps to 0, end 10 clamps to 4.
  EXPECT_EQ(longs(run1("Shape", {x}, {{"start", int64_t(-10)}, {"end", int64_t(10)}})),
            (std::vector<int64_t>{2, 3, 4, 5}));
  EXPECT_EQ(run1("Size", {x}).item<int64_t>(), 120); // 2*3*4*5
}

TEST(OpsTest, ShapeChainFollowsBatchSize) {
  // Reshape x [B,6] to [B,2,3] through Shape -> Gather -> Unsqueeze -> Concat,
  // the chain torch.onnx emits for x.view(x.size(0), 2, 3).
  for (int64_t batch : {2, 5}) {
    Tensor x = torch::randn({batch, 6});
    Tensor shape = run1("Shape", {x});
    Tensor b = run1("Gather", {shape, torch::scalar_tensor(0, torch::kLong)});
    Tensor b1 = run1("Unsqueeze", {b, i64({0})}, {}, 13);
    Tensor target = run1("Concat", {b1, i64({2}), i64({3})}, {{"axis", int64_t(0)}});
    Tensor y = run1("Reshape", {x, target});
    EXPECT_EQ(sizes(y), (std::vector<int64_t>{batch, 2, 3}));
  }
}

TEST(OpsTest, UnsqueezeSqueezeBothForms) {
  Tensor x = torch::zeros({3, 4});
  // Output rank 4; axes 0 and -1 (= 3): [1,3,4,1].
  EXPECT_EQ(sizes(run1("Unsqueeze", {x, i64({0, -1})}, {}, 13)),
            (std::vector<int64_t>{1, 3, 4, 1}));
  EXPECT_EQ(sizes(run1("Unsqueeze", {x}, {{"axes", std::vector<int64_t>{0, -1}}}, 11)),
            (std::vector<int64_t>{1, 3, 4, 1}));
  Tensor y = torch::zeros({1, 3, 1, 4});
  EXPECT_EQ(sizes(run1("Squeeze", {y, i64({2})}, {}, 13)), (std::vector<int64_t>{1, 3, 4}));
  EXPECT_EQ(sizes(run1("Squeeze", {y}, {{"axes", std::vector<int64_t>{0}}}, 11)),
            (std::vector<int64_t>{3, 1, 4}));
  EXPECT_EQ(sizes(run1("Squeeze", {y})), (std::vector<int64_t>{3, 4}));
  std::string err = errorOf([&] { run1("Squeeze", {y, i64({1})}); });
  EXPECT_NE(err.find("n_Squeeze"), std::string::npos) << err;
}

TEST(OpsTest, SoftmaxAxisSemanticsByOpset) {
  Tensor x = torch::tensor({1.0, 2.0, 3.0, 4.0, 5.0, 6.0}, torch::kDouble).reshape({2, 3});
  // Opset 11, axis 0: coerced to [1,6], so all six entries sum to 1.
  Tensor y11 = run1("Softmax", {x}, {{"axis", int64_t(0)}}, 11);
  EXPECT_NEAR(y11.sum().item<double>(), 1.0, 1e-6);
  // Opset 13, axis 0: each column sums to 1, so the total is 3.
  Tensor y13 = run1("Softmax", {x}, {{"axis", int64_t(0)}}, 13);
  EXPECT_NEAR(y13.sum().item<double>(), 3.0, 1e-6);
  // LogSoftmax default axis at 13 is -1: exp of each row sums to 1.
  Tensor l = run1("LogSoftmax", {x}, {}, 13);
  EXPECT_TRUE(torch::allclose(l.exp().sum(1), torch::ones({2}, torch::kDouble)));
}

TEST(OpsTest, SoftmaxCrossEntropyLossMatchesManualLogSoftmax) {
  Tensor scores =
      torch::tensor({0.5, -1.0, 2.0, 0.0, 1.5, 0.3, -0.2, 0.7, 0.0, 0.0, 3.0, 1.0}, torch::kDouble)
          .reshape({3, 4});
  Tensor labels = i64({1, 3, -1});
  // logp[n][k] = s[n][k] - log(sum_j exp(s[n][j])).
  auto logp = [&](int n, int k) {
    double z = 0;
    for (int j = 0; j < 4; ++j) z += std::exp(scores[n][j].item<double>());
    return scores[n][k].item<double>() - std::log(z);
  };
  // ignore_index -1 drops sample 2: mean = -(logp[0][1] + logp[1][3]) / 2.
  auto out =
      runAll("SoftmaxCrossEntropyLoss", {scores, labels}, {{"ignore_index", int64_t(-1)}}, 2);
  EXPECT_NEAR(out[0].item<double>(), -(logp(0, 1) + logp(1, 3)) / 2, 1e-9);
  EXPECT_NEAR(out[1][2][0].item<double>(), logp(2, 0), 1e-9);
  // Weights w = [1,2,3,4], labels [1,3,0]: mean = -(2*lp01 + 4*lp13 + 1*lp20) / (2+4+1).
  Tensor w = torch::tensor({1.0, 2.0, 3.0, 4.0}, torch::kDouble);
  Tensor mean = run1("SoftmaxCrossEntropyLoss", {scores, i64({1, 3, 0}), w});
  EXPECT_NEAR(mean.item<double>(), -(2 * logp(0, 1) + 4 * logp(1, 3) + logp(2, 0)) / 7, 1e-9);
  // reduction none: per-sample -w[t] * logp.
  Tensor none = run1("SoftmaxCrossEntropyLoss", {scores, i64({1, 3, 0}), w},
                     {{"reduction", std::string("none")}});
  EXPECT_EQ(sizes(none), (std::vector<int64_t>{3}));
  EXPECT_NEAR(none[1].item<double>(), -4 * logp(1, 3), 1e-9);
  // NegativeLogLikelihoodLoss on log-probabilities, sum: -(lp01 + lp13 + lp20).
  Tensor lp = torch::log_softmax(scores, 1);
  Tensor nll =
      run1("NegativeLogLikelihoodLoss", {lp, i64({1, 3, 0})}, {{"reduction", std::string("sum")}});
  EXPECT_NEAR(nll.item<double>(), -(logp(0, 1) + logp(1, 3) + logp(2, 0)), 1e-9);
}

TEST(OpsTest, SplitAndConcat) {
  Tensor x = torch::arange(6);
  // No split given: 6 / 3 outputs = 2 each.
  auto parts = runAll("Split", {x}, {}, 3);
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(longs(parts[2]), (std::vector<int64_t>{4, 5}));
  // Opset 13 split input [1,5]; opset 11 split attribute [4,2].
  parts = runAll("Split", {x, i64({1, 5})}, {}, 2, 13);
  EXPECT_EQ(longs(parts[0]), (std::vector<int64_t>{0}));
  parts = runAll("Split", {x}, {{"split", std::vector<int64_t>{4, 2}}}, 2, 11);
  EXPECT_EQ(longs(parts[1]), (std::vector<int64_t>{4, 5}));
  EXPECT_NE(errorOf([&] { runAll("Split", {x, i64({1, 2})}, {}, 2); }), ""); // 1+2 != 6
  EXPECT_EQ(longs(run1("Concat", {i64({1}), i64({2, 3})}, {{"axis", int64_t(-1)}})),
            (std::vector<int64_t>{1, 2, 3}));
}

TEST(OpsTest, CreationOps) {
  Tensor c = run1("Constant", {}, {{"value_ints", std::vector<int64_t>{4, 5}}});
  EXPECT_EQ(longs(c), (std::vector<int64_t>{4, 5}));
  EXPECT_EQ(run1("Constant", {}, {{"value_float", 2.5}}).scalar_type(), torch::kFloat);
  ir::Tensor seven{ir::DType::I32, {1}, std::string("\x07\0\0\0", 4)};
  Tensor filled = run1("ConstantOfShape", {i64({2, 3})}, {{"value", seven}});
  EXPECT_EQ(filled.scalar_type(), torch::kInt);
  EXPECT_EQ(longs(filled), std::vector<int64_t>(6, 7));
  // Range 10, 4, -3: ceil((4-10)/-3) = 2 elements: 10, 7.
  EXPECT_EQ(longs(run1("Range", {torch::scalar_tensor(10, torch::kLong),
                                 torch::scalar_tensor(4, torch::kLong),
                                 torch::scalar_tensor(-3, torch::kLong)})),
            (std::vector<int64_t>{10, 7}));
  // Trilu upper with k=1 on 2x2 ones: [[0,1],[0,0]].
  EXPECT_EQ(longs(run1("Trilu", {torch::ones({2, 2}), torch::scalar_tensor(1, torch::kLong)})),
            (std::vector<int64_t>{0, 1, 0, 0}));
}

TEST(OpsTest, ExpandTileWhere) {
  // [3,1] expanded with shape [2,1,4] -> [2,3,4]; a 1 in shape keeps the input's 3.
  EXPECT_EQ(sizes(run1("Expand", {torch::zeros({3, 1}), i64({2, 1, 4})})),
            (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(longs(run1("Tile", {i64({1, 2}), i64({2})})), (std::vector<int64_t>{1, 2, 1, 2}));
  Tensor cond = torch::tensor({true, false});
  EXPECT_EQ(longs(run1("Where", {cond, i64({1, 2}), i64({9})})), (std::vector<int64_t>{1, 9}));
}

TEST(OpsTest, ReductionsKeepdimsAndNoop) {
  Tensor x = torch::arange(1, 7, torch::kFloat).reshape({2, 3}); // [[1,2,3],[4,5,6]]
  // ReduceProd over both axes: 720, keepdims -> [1,1].
  Tensor p = run1("ReduceProd", {x}, {{"axes", std::vector<int64_t>{0, 1}}});
  EXPECT_EQ(sizes(p), (std::vector<int64_t>{1, 1}));
  EXPECT_FLOAT_EQ(p.item<float>(), 720.0f);
  // ReduceMean axis -1 without keepdims: [2, 5].
  Tensor m =
      run1("ReduceMean", {x}, {{"axes", std::vector<int64_t>{-1}}, {"keepdims", int64_t(0)}});
  EXPECT_TRUE(torch::allclose(m, f32({2, 5})));
  // ReduceSum with empty axes and noop_with_empty_axes is the identity.
  EXPECT_EQ(sizes(run1("ReduceSum", {x, torch::zeros({0}, torch::kLong)},
                       {{"noop_with_empty_axes", int64_t(1)}})),
            (std::vector<int64_t>{2, 3}));
  // ArgMax with select_last_index: [1,3,3] -> 2 (first would be 1).
  Tensor a = run1("ArgMax", {f32({1, 3, 3})},
                  {{"keepdims", int64_t(0)}, {"select_last_index", int64_t(1)}});
  EXPECT_EQ(a.item<int64_t>(), 2);
}

TEST(OpsTest, DropoutModes) {
  Tensor x = torch::ones({1000});
  // training_mode false: identity, mask all true.
  auto out = runAll("Dropout", {x, f32({0.5}).reshape({}), torch::scalar_tensor(false)}, {}, 2);
  EXPECT_TRUE(torch::equal(out[0], x));
  EXPECT_TRUE(out[1].all().item<bool>());
  // Training with ratio 0.5: kept elements are scaled by 1/(1-0.5) = 2.
  out = runAll("Dropout", {x, f32({0.5}).reshape({}), torch::scalar_tensor(true)}, {}, 2);
  Tensor kept = out[0].masked_select(out[1]);
  EXPECT_TRUE(torch::all(kept == 2).item<bool>());
  EXPECT_GT(kept.numel(), 0);
  EXPECT_LT(kept.numel(), 1000);
}

TEST(OpsTest, ErrorsNameNodeAndProblem) {
  std::string err = errorOf([] { run1("Add", {f32({1})}); });
  EXPECT_NE(err.find("n_Add"), std::string::npos) << err;
  EXPECT_NE(err.find("(Add)"), std::string::npos) << err;
  err = errorOf([] {
    run1("SoftmaxCrossEntropyLoss", {torch::zeros({2, 3}), i64({0, 1})},
         {{"reduction", std::string("avg")}});
  });
  EXPECT_NE(err.find("'avg'"), std::string::npos) << err;
  // An op below the opset that defines it (LayerNormalization no longer is:
  // the import's fusion writes it at any opset, Note [pattern fusion]).
  err = errorOf([] { run1("Trilu", {torch::zeros({2, 3})}, {}, 13); });
  EXPECT_NE(err.find("opset 13"), std::string::npos) << err;
  err = errorOf([] { run1("Frobnicate", {torch::zeros({1})}); });
  EXPECT_NE(err.find("unsupported op type"), std::string::npos) << err;
  err = errorOf([] { run1("Conv", {torch::zeros({1, 1, 3}), torch::ones({1, 1, 2, 2})}); });
  EXPECT_NE(err.find("does not fit a 2-D kernel"), std::string::npos) << err;
  err = errorOf([] { run1("Cast", {f32({1})}, {{"to", int64_t(8)}}); }); // STRING
  EXPECT_NE(err.find("element type"), std::string::npos) << err;
}

TEST(OpsTest, LegacyBroadcastOpset6) {
  // Add-6 with broadcast=1, axis=0: B [2] lines up with A's dim 0.
  Tensor y = run1("Add", {torch::zeros({2, 3}), f32({1, 2})},
                  {{"broadcast", int64_t(1)}, {"axis", int64_t(0)}}, 6);
  EXPECT_TRUE(torch::equal(y, torch::tensor({{1.f, 1.f, 1.f}, {2.f, 2.f, 2.f}})));
  // Opset 7 broadcasts numpy-style: [2] would align with the last dim (3).
  EXPECT_NE(errorOf([] { run1("Add", {torch::zeros({2, 3}), f32({1, 2})}, {}, 7); }), "");
}

TEST(OpsTest, ConvPadsStridesGroups) {
  Tensor x = f32({1, 2, 3, 4}).reshape({1, 1, 1, 4}), w = torch::ones({1, 1, 1, 2});
  // pads [H0, W1, H0, W0]: [0,1,2,3,4] summed in pairs = [1,3,5,7].
  Tensor y = run1("Conv", {x, w}, {{"pads", std::vector<int64_t>{0, 1, 0, 0}}});
  EXPECT_EQ(longs(y), (std::vector<int64_t>{1, 3, 5, 7}));
  // Stride 2 keeps windows 0 and 2: [1, 5].
  y = run1("Conv", {x, w},
           {{"pads", std::vector<int64_t>{0, 1, 0, 0}}, {"strides", std::vector<int64_t>{1, 2}}});
  EXPECT_EQ(longs(y), (std::vector<int64_t>{1, 5}));
  // SAME_UPPER, kernel 2: total pad 1 goes at the end: [1,2,3,4,0] -> [3,5,7,4].
  y = run1("Conv", {x, w}, {{"auto_pad", std::string("SAME_UPPER")}});
  EXPECT_EQ(longs(y), (std::vector<int64_t>{3, 5, 7, 4}));
  y = run1("Conv", {x, w}, {{"auto_pad", std::string("SAME_LOWER")}});
  EXPECT_EQ(longs(y), (std::vector<int64_t>{1, 3, 5, 7}));
  // group 2: each channel with its own 1x1 filter: [1*3, 2*4] = [3, 8], bias +1.
  y = run1("Conv", {f32({1, 2}).reshape({1, 2, 1, 1}), f32({3, 4}).reshape({2, 1, 1, 1}), f32({1, 1})},
           {{"group", int64_t(2)}});
  EXPECT_EQ(longs(y), (std::vector<int64_t>{4, 9}));
}

TEST(OpsTest, ConvTransposeOutputShapeAndPadding) {
  // 1-D, stride 2, kernel 2 of ones: each input spreads over 2 outputs:
  // [1,2] -> [1,1,2,2]; output_padding 1 appends a 0; bias +1 everywhere.
  Tensor x = f32({1, 2}).reshape({1, 1, 2}), w = torch::ones({1, 1, 2});
  Tensor y = run1("ConvTranspose", {x, w, f32({1})},
                  {{"strides", std::vector<int64_t>{2}}, {"output_padding", std::vector<int64_t>{1}}});
  EXPECT_EQ(longs(y), (std::vector<int64_t>{2, 2, 3, 3, 1}));
  // pads [1, 0] crop the first element.
  y = run1("ConvTranspose", {x, w},
           {{"strides", std::vector<int64_t>{2}}, {"pads", std::vector<int64_t>{1, 0}}});
  EXPECT_EQ(longs(y), (std::vector<int64_t>{1, 2, 2}));
}

TEST(OpsTest, MaxPoolIndicesAreOnnxFlat) {
  // Channel 0 [[1,4],[3,2]] max 4 at (0,1); channel 1 [[5,6],[8,7]] max 8 at (1,0).
  Tensor x = f32({1, 4, 3, 2, 5, 6, 8, 7}).reshape({1, 2, 2, 2});
  auto out = runAll("MaxPool", {x}, {{"kernel_shape", std::vector<int64_t>{2, 2}}}, 2);
  EXPECT_EQ(longs(out[0]), (std::vector<int64_t>{4, 8}));
  // Row-major over the whole input: 1, and 4 (channel 1's plane) + 2 = 6.
  EXPECT_EQ(longs(out[1]), (std::vector<int64_t>{1, 6}));
  // storage_order 1 (column-major): (0,1) -> 0 + 1*2 = 2; (1,0) -> 4 + 1 = 5.
  out = runAll("MaxPool", {x}, {{"kernel_shape", std::vector<int64_t>{2, 2}}, {"storage_order", int64_t(1)}},
               2);
  EXPECT_EQ(longs(out[1]), (std::vector<int64_t>{2, 5}));
  // Pads torch cannot apply (begin only): windows over [-inf row/col] + x.
  // Outputs max(x00)=1, max(x00,x01)=4, max(x00,x10)=3, max(all)=4.
  out = runAll("MaxPool", {x.narrow(1, 0, 1)},
               {{"kernel_shape", std::vector<int64_t>{2, 2}}, {"pads", std::vector<int64_t>{1, 1, 0, 0}}}, 2);
  EXPECT_EQ(longs(out[0]), (std::vector<int64_t>{1, 4, 3, 4}));
  EXPECT_EQ(longs(out[1]), (std::vector<int64_t>{0, 1, 2, 1}));
  // MaxUnpool puts them back.
  Tensor back =
      run1("MaxUnpool", {out[0], out[1], i64({1, 1, 2, 2})},
           {{"kernel_shape", std::vector<int64_t>{2, 2}}, {"pads", std::vector<int64_t>{1, 1, 0, 0}}});
  EXPECT_EQ(longs(back), (std::vector<int64_t>{1, 4, 3, 0}));
  // Integer inputs pool exactly.
  Tensor xi = torch::tensor({7, 200, 3, 9}, torch::kByte).reshape({1, 1, 2, 2});
  Tensor yi = run1("MaxPool", {xi}, {{"kernel_shape", std::vector<int64_t>{2, 2}}});
  EXPECT_EQ(yi.scalar_type(), torch::kByte);
  EXPECT_EQ(longs(yi), (std::vector<int64_t>{200}));
}

TEST(OpsTest, AveragePoolAsymmetricPads) {
  // [1,2,3] with one pad at the beginning: windows [0,1], [1,2], [2,3].
  Tensor x = f32({1, 2, 3}).reshape({1, 1, 3});
  ir::AttrMap a = {{"kernel_shape", std::vector<int64_t>{2}}, {"pads", std::vector<int64_t>{1, 0}}};
  // Without count_include_pad the pad is not counted: 1/1, 3/2, 5/2.
  Tensor y = run1("AveragePool", {x}, a);
  EXPECT_TRUE(torch::allclose(y.reshape({-1}), f32({1, 1.5, 2.5})));
  a["count_include_pad"] = int64_t(1); // 1/2, 3/2, 5/2
  y = run1("AveragePool", {x}, a);
  EXPECT_TRUE(torch::allclose(y.reshape({-1}), f32({0.5, 1.5, 2.5})));
  // Global pools keep [N, C, 1].
  EXPECT_EQ(sizes(run1("GlobalAveragePool", {x})), (std::vector<int64_t>{1, 1, 1}));
  EXPECT_EQ(run1("GlobalMaxPool", {x}).item<float>(), 3);
}

TEST(OpsTest, BatchNormalizationTrainingUpdatesRunningStats) {
  // One channel holding 1,2,3,4: batch mean 2.5, biased variance
  // (1.5^2 + 0.5^2 + 0.5^2 + 1.5^2) / 4 = 1.25.
  Tensor x = f32({1, 2, 3, 4}).reshape({2, 1, 2});
  Tensor scale = f32({1}), bias = f32({0}), mean = f32({0}), var = f32({1});
  ir::AttrMap a = {{"epsilon", 0.0}, {"momentum", 0.9}, {"training_mode", int64_t(1)}};
  auto out = runAll("BatchNormalization", {x, scale, bias, mean, var}, a, 3, 15);
  Tensor want = (x - 2.5) / std::sqrt(1.25);
  EXPECT_TRUE(torch::allclose(out[0], want, 1e-5, 1e-6));
  // running = input * 0.9 + batch * 0.1: 0*0.9 + 2.5*0.1 = 0.25; 1*0.9 + 1.25*0.1 = 1.025.
  EXPECT_NEAR(out[1].item<float>(), 0.25, 1e-6);
  EXPECT_NEAR(out[2].item<float>(), 1.025, 1e-6);
  // Opset 12 has no training_mode: asking for the running stats means training.
  out = runAll("BatchNormalization", {x, scale, bias, mean, var}, {{"epsilon", 0.0}}, 3, 12);
  EXPECT_NEAR(out[1].item<float>(), 0.25, 1e-6);
  // Inference with those statistics gives the same Y.
  Tensor y = run1("BatchNormalization", {x, scale, bias, f32({2.5}), f32({1.25})}, {{"epsilon", 0.0}}, 15);
  EXPECT_TRUE(torch::allclose(y, want, 1e-5, 1e-6));
}

TEST(OpsTest, ResizeModes) {
  Tensor x = f32({1, 2}).reshape({1, 1, 1, 2});
  Tensor none;
  // nearest, half_pixel, round_prefer_floor, scale 2: source coordinates
  // -0.25, 0.25, 0.75, 1.25 -> 0, 0, 1, 1.
  Tensor y = run1("Resize", {x, none, f32({1, 1, 1, 2})}, {{"mode", std::string("nearest")}}, 13);
  EXPECT_EQ(longs(y), (std::vector<int64_t>{1, 1, 2, 2}));
  // linear, align_corners, size 3: coordinates 0, 0.5, 1 -> 1, 1.5, 2.
  y = run1(
      "Resize", {x, none, none, i64({1, 1, 1, 3})},
      {{"mode", std::string("linear")}, {"coordinate_transformation_mode", std::string("align_corners")}},
      13);
  EXPECT_TRUE(torch::allclose(y.reshape({-1}), f32({1, 1.5, 2})));
  // Upsample-9 (asymmetric, floor): [1,2] x3 -> [1,1,1,2,2,2].
  y = run1("Upsample", {x, f32({1, 1, 1, 3})}, {}, 9);
  EXPECT_EQ(longs(y), (std::vector<int64_t>{1, 1, 1, 2, 2, 2}));
}

TEST(OpsTest, PadModes) {
  Tensor x = f32({1, 2, 3});
  ir::AttrMap reflect = {{"mode", std::string("reflect")}}, edge = {{"mode", std::string("edge")}};
  EXPECT_EQ(longs(run1("Pad", {x, i64({2, 1})}, reflect)), (std::vector<int64_t>{3, 2, 1, 2, 3, 2}));
  EXPECT_EQ(longs(run1("Pad", {x, i64({2, 1})}, edge)), (std::vector<int64_t>{1, 1, 1, 2, 3, 3}));
  EXPECT_EQ(longs(run1("Pad", {x, i64({2, 1}), f32({9}).reshape({})})),
            (std::vector<int64_t>{9, 9, 1, 2, 3, 9}));
  // Negative pads crop; opset 2 takes pads and value as attributes.
  EXPECT_EQ(longs(run1("Pad", {x, i64({-1, 0})})), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(longs(run1("Pad", {x}, {{"pads", std::vector<int64_t>{1, 0}}, {"value", 7.0}}, 10)),
            (std::vector<int64_t>{7, 1, 2, 3}));
}

TEST(OpsTest, TopKOneHotScatterGatherND) {
  // Ties keep index order: the two largest of [1,3,3,2] are 3 (index 1), 3 (2).
  auto out = runAll("TopK", {f32({1, 3, 3, 2}), i64({2})}, {}, 2);
  EXPECT_EQ(longs(out[0]), (std::vector<int64_t>{3, 3}));
  EXPECT_EQ(longs(out[1]), (std::vector<int64_t>{1, 2}));
  out = runAll("TopK", {f32({1, 3, 3, 2}), i64({2})}, {{"largest", int64_t(0)}}, 2);
  EXPECT_EQ(longs(out[1]), (std::vector<int64_t>{0, 3}));
  // OneHot: index -1 counts from depth (3): row 1 is hot at 2.
  Tensor y = run1("OneHot", {i64({0, -1}), i64({3}), f32({0, 5})});
  EXPECT_EQ(longs(y), (std::vector<int64_t>{5, 0, 0, 0, 0, 5}));
  // GatherND picks row 1 column 0 = 3; ScatterND writes 9 there.
  Tensor data = f32({1, 2, 3, 4}).reshape({2, 2});
  EXPECT_EQ(longs(run1("GatherND", {data, i64({1, 0}).reshape({1, 2})})), (std::vector<int64_t>{3}));
  EXPECT_EQ(longs(run1("ScatterND", {data, i64({1, 0}).reshape({1, 2}), f32({9})})),
            (std::vector<int64_t>{1, 2, 9, 4}));
  // ScatterElements with reduction add along axis 1: row 0 col 1 += 10.
  EXPECT_EQ(longs(run1("ScatterElements", {data, i64({1}).reshape({1, 1}), f32({10}).reshape({1, 1})},
                       {{"axis", int64_t(1)}, {"reduction", std::string("add")}})),
            (std::vector<int64_t>{1, 12, 3, 4}));
}

TEST(ConformanceTest, PassSkipFailAndExitStatus) {
  namespace fs = std::filesystem;
  const fs::path node = "/usr/share/libonnx-testdata/data/node";
  if (!fs::exists(node / "test_relu")) GTEST_SKIP() << "libonnx-testdata is not installed";
  EXPECT_EQ(runConformanceCase((node / "test_relu").string()).outcome, CaseOutcome::Pass);
  CaseResult skip = runConformanceCase((node / "test_cast_FLOAT_to_STRING").string());
  EXPECT_EQ(skip.outcome, CaseOutcome::Skip);
  EXPECT_EQ(skip.reason, "string tensors");

  // test_relu with a wrong reference: element 0 becomes relu(x0) + 1.
  fs::path dir = fs::temp_directory_path() / "rannc_conformance_test" / "wrong_relu";
  fs::remove_all(dir.parent_path());
  fs::create_directories(dir);
  fs::copy(node / "test_relu", dir, fs::copy_options::recursive);
  fs::path out = dir / "test_data_set_0" / "output_0.pb";
  onnx::TensorProto t;
  {
    std::ifstream in(out, std::ios::binary);
    ASSERT_TRUE(t.ParseFromIstream(&in));
  }
  std::string raw = t.raw_data();
  float v;
  std::memcpy(&v, raw.data(), 4);
  float wrong = v + 1;
  std::memcpy(raw.data(), &wrong, 4);
  t.set_raw_data(raw);
  {
    std::ofstream o(out, std::ios::binary | std::ios::trunc);
    ASSERT_TRUE(t.SerializeToOstream(&o));
  }
  CaseResult fail = runConformanceCase(dir.string());
  EXPECT_EQ(fail.outcome, CaseOutcome::Fail);
  EXPECT_EQ(fail.reason.rfind("output 0 differs at index 0: ", 0), 0u) << fail.reason;

  // The summary and the exit status, with and without --min-pass-rate.
  ConformanceOptions o;
  o.dirs = {dir.parent_path().string()};
  o.quiet = true;
  std::ostringstream os, es;
  EXPECT_EQ(runConformance(o, os, es), 1);
  EXPECT_NE(os.str().find("FAIL rannc_conformance_test/wrong_relu: output 0 differs"), std::string::npos)
      << os.str();
  EXPECT_NE(os.str().find("\n0 passed, 1 failed, 0 skipped\n"), std::string::npos) << os.str();
  o.min_pass_rate = 0.0;
  EXPECT_EQ(runConformance(o, os, es), 0);
  fs::remove_all(dir.parent_path());
}

TEST(OpsTest, TensorConversionRoundTrip) {
  Tensor x = torch::tensor({1.5, -2.0, 3.25}, torch::kFloat).reshape({3, 1});
  ir::Tensor t = fromTorch(x);
  EXPECT_EQ(t.dtype, ir::DType::F32);
  EXPECT_EQ(t.dims, (std::vector<int64_t>{3, 1}));
  EXPECT_EQ(t.data.size(), 12u);
  EXPECT_TRUE(torch::equal(toTorch(t), x));
  EXPECT_EQ(toScalarType(ir::DType::BF16), torch::kBFloat16);
  EXPECT_EQ(fromScalarType(torch::kChar), ir::DType::I8);
}

// Gradients: each check builds loss = sum(y * r) with a random r (a plain sum
// would be constant for Softmax) and asks autograd for d loss / d x.
TEST(OpsTest, BitwiseOpsOfOpset18) {
  // 5 = 0b101, 3 = 0b011, broadcast over [2]: 5|3 = 7, 5&3 = 1, 5^3 = 6; 12|3 = 15, 12&3 = 0, 12^3 = 15.
  Tensor a = i64({5, 12}), b = i64({3});
  EXPECT_EQ(longs(run1("BitwiseOr", {a, b})), (std::vector<int64_t>{7, 15}));
  EXPECT_EQ(longs(run1("BitwiseAnd", {a, b})), (std::vector<int64_t>{1, 0}));
  EXPECT_EQ(longs(run1("BitwiseXor", {a, b})), (std::vector<int64_t>{6, 15}));
  // Two's complement: ~5 = -6; int32 stays int32.
  Tensor n = run1("BitwiseNot", {torch::tensor({5, 0}, torch::kInt)});
  EXPECT_EQ(n.scalar_type(), torch::kInt);
  EXPECT_EQ(longs(n), (std::vector<int64_t>{-6, -1}));
}

/// transformers::grouped_mm_fallback(input, weight, offs) as the torch.export
/// front end encodes it (Note [aten argument encoding]).
ir::Node groupedMmNode() {
  namespace aa = ir::aten_args;
  ir::Node n = makeNode("transformers::grouped_mm_fallback", {f32({0}), f32({0}), i64({0})}, {}, 1);
  n.domain = std::string(ir::kAtenDomain);
  n.attrs[aa::kOverload] = std::string();
  n.attrs[aa::kNargs] = int64_t(3);
  for (size_t i = 0; i < 3; ++i) n.attrs[aa::kindKey(i)] = aa::kTensor;
  return n;
}

// Note [library custom ops]: the expert matmul against transformers' Python
// definition (integrations/moe.py), forward and the gradients of its own
// backward op, written out here the way it writes them.
TEST(OpsTest, TransformersGroupedMmFallbackMatchesItsDefinition) {
  torch::manual_seed(0);
  // 7 rows, 4 experts: rows 0-1 expert 0, none for expert 1, rows 2-4 expert 2,
  // row 5 expert 3; row 6 lies past offs[3] = 6 and stays zero.
  Tensor x = torch::randn({7, 3}, torch::requires_grad());
  Tensor w = torch::randn({4, 3, 5}, torch::requires_grad());
  Tensor offs = torch::tensor({2, 2, 5, 6}, torch::kInt);
  const std::vector<int64_t> ends = {2, 2, 5, 6};
  Tensor y = runOp(groupedMmNode(), {x, w, offs}, 17)[0];
  ASSERT_EQ(sizes(y), (std::vector<int64_t>{7, 5}));
  Tensor want = torch::zeros({7, 5});
  Tensor g = torch::randn({7, 5});
  Tensor want_gx = torch::zeros_like(x), want_gw = torch::zeros_like(w);
  int64_t start = 0;
  for (int64_t i = 0; i < 4; ++i) {
    const int64_t end = ends[size_t(i)];
    if (start == end) continue;
    torch::NoGradGuard no_grad;
    want.slice(0, start, end).copy_(torch::mm(x.slice(0, start, end), w[i]));
    want_gx.slice(0, start, end).copy_(torch::mm(g.slice(0, start, end), w[i].t()));
    want_gw[i].copy_(torch::mm(x.slice(0, start, end).t(), g.slice(0, start, end)));
    start = end;
  }
  EXPECT_TRUE(torch::equal(y.detach(), want));
  EXPECT_TRUE(torch::equal(y.detach()[6], torch::zeros({5})));
  auto grads = torch::autograd::grad({(y * g).sum()}, {x, w});
  EXPECT_TRUE(torch::allclose(grads[0], want_gx, 1e-6, 1e-6));
  EXPECT_TRUE(torch::allclose(grads[1], want_gw, 1e-6, 1e-6));
  EXPECT_TRUE(torch::equal(grads[1][1], torch::zeros({3, 5}))); // expert 1 saw no rows
  // Offsets that go back, or past the rows, are refused with the node named.
  const std::string err = errorOf([&] { runOp(groupedMmNode(), {x, w, torch::tensor({2, 1, 5, 6})}, 17); });
  EXPECT_NE(err.find("n_transformers::grouped_mm_fallback"), std::string::npos) << err;
  EXPECT_NE(err.find("non-decreasing"), std::string::npos) << err;
  EXPECT_NE(errorOf([&] { runOp(groupedMmNode(), {x, w, torch::tensor({2, 2, 5, 8})}, 17); }), "");
}

// Note [view of a relaid tensor]: aten::view of a tensor laid out otherwise
// than at export (transposed here) gives the values view gives on the
// contiguous one, and stays an alias where view works.
TEST(OpsTest, AtenViewOfATransposedTensor) {
  namespace aa = ir::aten_args;
  Tensor x = torch::arange(24, torch::kFloat).reshape({2, 3, 4});
  ir::Node n = makeNode("aten::view", {x}, {}, 1);
  n.domain = std::string(ir::kAtenDomain);
  n.attrs[aa::kOverload] = std::string();
  n.attrs[aa::kNargs] = int64_t(2);
  n.attrs[aa::kindKey(0)] = aa::kTensor;
  n.attrs[aa::kindKey(1)] = aa::kConstInts;
  n.attrs[aa::valueKey(1)] = std::vector<int64_t>{3, 8};
  Tensor t = x.transpose(0, 1); // [3, 2, 4], not viewable as [3, 8]
  EXPECT_TRUE(torch::equal(runOp(n, {t}, 17)[0], t.contiguous().view({3, 8})));
  Tensor y = torch::arange(24, torch::kFloat).reshape({3, 2, 4});
  EXPECT_EQ(runOp(n, {y}, 17)[0].data_ptr(), y.data_ptr()); // an alias where view works
}

Tensor gradOf(const Tensor &y, const Tensor &x) {
  torch::manual_seed(1);
  Tensor loss = (y * torch::randn(y.sizes(), y.options())).sum();
  return torch::autograd::grad({loss}, {x}, {}, /*retain_graph=*/true)[0];
}
void expectNonZero(const Tensor &g) {
  ASSERT_TRUE(g.defined());
  EXPECT_GT(g.abs().sum().item<double>(), 0.0);
}

TEST(OpsGradTest, MatMulGemm) {
  Tensor a = torch::randn({4, 3}, torch::requires_grad());
  Tensor b = torch::randn({3, 5}, torch::requires_grad());
  Tensor bias = torch::randn({5}, torch::requires_grad());
  expectNonZero(gradOf(run1("MatMul", {a, b}), a));
  Tensor bt = torch::randn({5, 3}, torch::requires_grad());
  Tensor y = run1("Gemm", {a, bt, bias}, {{"transB", int64_t(1)}, {"alpha", 0.5}});
  // Gemm = 0.5 * a @ bt^T + bias.
  EXPECT_TRUE(torch::allclose(y, 0.5 * a.matmul(bt.t()) + bias, 1e-5, 1e-6));
  expectNonZero(gradOf(y, a));
  expectNonZero(gradOf(y, bt));
  expectNonZero(gradOf(y, bias));
}

TEST(OpsGradTest, LayerNormalizationBothPaths) {
  Tensor x = torch::randn({2, 3, 4}, torch::requires_grad());
  Tensor scale = torch::randn({4}, torch::requires_grad());
  Tensor bias = torch::randn({4});
  // Only Y wanted: the fused kernel. Y, Mean, InvStdDev wanted: the explicit formula.
  auto fused =
      runOp(makeNode("LayerNormalization", {x, scale, bias}, {}, 3, {1, 2}), {x, scale, bias}, 17);
  auto full = runAll("LayerNormalization", {x, scale, bias}, {}, 3);
  EXPECT_FALSE(fused[1].defined());
  EXPECT_TRUE(torch::allclose(fused[0], full[0], 1e-5, 1e-5));
  EXPECT_EQ(sizes(full[1]), (std::vector<int64_t>{2, 3, 1}));
  // The two paths agree on the gradient too.
  Tensor g_fused = gradOf(fused[0], x), g_full = gradOf(full[0], x);
  expectNonZero(g_full);
  EXPECT_TRUE(torch::allclose(g_fused, g_full, 1e-4, 1e-5));
  expectNonZero(gradOf(full[0], scale));
}

TEST(OpsGradTest, ConvNetOps) {
  // A small torchvision-style block: Conv (asymmetric pads) -> BatchNorm
  // (training) -> HardSwish -> MaxPool -> Resize (linear) -> mean.
  torch::manual_seed(0);
  Tensor x = torch::randn({2, 3, 6, 6}, torch::requires_grad());
  Tensor w = torch::randn({4, 3, 3, 3}, torch::requires_grad());
  Tensor scale = torch::ones({4}, torch::requires_grad()), bias = torch::zeros({4}, torch::requires_grad());
  Tensor y = run1("Conv", {x, w}, {{"pads", std::vector<int64_t>{0, 1, 1, 0}}});
  // The same as torch's conv on the explicitly padded input.
  Tensor ref = torch::conv2d(torch::constant_pad_nd(x, {1, 0, 0, 1}), w);
  EXPECT_TRUE(torch::allclose(y, ref, 1e-4, 1e-5));
  y = runAll("BatchNormalization", {y, scale, bias, torch::zeros({4}), torch::ones({4})},
             {{"training_mode", int64_t(1)}}, 3)[0];
  y = run1("HardSwish", {y});
  y = run1("MaxPool", {y},
           {{"kernel_shape", std::vector<int64_t>{2, 2}}, {"strides", std::vector<int64_t>{2, 2}}});
  y = run1("Resize", {y, Tensor(), f32({1, 1, 2, 2})}, {{"mode", std::string("linear")}}, 13);
  expectNonZero(gradOf(y, x));
  expectNonZero(gradOf(y, w));
  expectNonZero(gradOf(y, scale));
  expectNonZero(gradOf(y, bias));
}

TEST(OpsGradTest, SoftmaxAndCrossEntropy) {
  Tensor x = torch::randn({3, 5}, torch::requires_grad());
  expectNonZero(gradOf(run1("Softmax", {x}), x));
  expectNonZero(gradOf(run1("Softmax", {x}, {{"axis", int64_t(1)}}, 11), x));
  Tensor loss = run1("SoftmaxCrossEntropyLoss", {x, i64({0, 4, 2})});
  expectNonZero(torch::autograd::grad({loss}, {x})[0]);
}

} // namespace
} // namespace rannc::runtime
