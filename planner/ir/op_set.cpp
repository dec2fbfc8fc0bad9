#include "planner/ir/op_set.h"

#include <algorithm>

namespace rannc::ir {

// min_opset is the first opset whose semantics the executor implements; where
// an op moved an attribute to an input (Unsqueeze/Squeeze/ReduceSum axes,
// Split split, Slice starts/ends, Clip min/max) both forms are handled, so the
// range reaches back past the change. max_opset 17: opset 18 moves the other
// reductions' axes to inputs and adds Split num_outputs, neither implemented.
const std::vector<OpInfo> &supportedOps() {
  static const std::vector<OpInfo> kOps = {
      {"Abs", 6, 17},
      {"Add", 7, 17}, // 7: multidirectional broadcasting (no `broadcast` attr)
      {"And", 7, 17},
      {"ArgMax", 1, 17},
      {"Cast", 6, 17}, // 6: `to` is an int
      {"Clip", 6, 17}, // 6-10: min/max attrs; 11+: min/max inputs
      {"Concat", 4, 17},
      {"Constant", 1, 17},
      {"ConstantOfShape", 9, 17},
      {"Div", 7, 17},
      {"Dropout", 12, 17}, // 12: ratio and training_mode inputs
      {"Equal", 7, 17},
      {"Erf", 9, 17},
      {"Exp", 6, 17},
      {"Expand", 8, 17},
      {"Flatten", 1, 17},
      {"Gather", 1, 17},
      {"GatherElements", 11, 17},
      {"Gemm", 7, 17},
      {"Greater", 7, 17},
      {"GreaterOrEqual", 12, 17},
      {"Identity", 1, 17},
      {"LayerNormalization", 17, 17},
      {"Less", 7, 17},
      {"LessOrEqual", 12, 17},
      {"Log", 6, 17},
      {"LogSoftmax", 1, 17}, // 1-12: coerced to 2-D; 13+: one axis
      {"MatMul", 1, 17},
      {"Max", 8, 17},
      {"Mean", 8, 17},
      {"Min", 8, 17},
      {"Mul", 7, 17},
      {"Neg", 6, 17},
      {"NegativeLogLikelihoodLoss", 12, 17},
      {"Not", 1, 17},
      {"Or", 7, 17},
      {"Pow", 7, 17},
      {"Range", 11, 17},
      {"Reciprocal", 6, 17},
      {"ReduceMax", 1, 17},
      {"ReduceMean", 1, 17},
      {"ReduceMin", 1, 17},
      {"ReduceProd", 1, 17},
      {"ReduceSum", 1, 17}, // 1-12: axes attr; 13+: axes input
      {"Relu", 6, 17},
      {"Reshape", 5, 17}, // 5: shape input; 14: allowzero
      {"Shape", 1, 17},   // 15: start/end
      {"Sigmoid", 6, 17},
      {"Size", 1, 17},
      {"Slice", 1, 17}, // 1-9: attrs; 10+: inputs with steps
      {"Softmax", 1, 17},
      {"SoftmaxCrossEntropyLoss", 12, 17},
      {"Split", 1, 17}, // split as attr (1-12) or input (1, 13+)
      {"Sqrt", 6, 17},
      {"Squeeze", 1, 17},
      {"Sub", 7, 17},
      {"Sum", 8, 17},
      {"Tanh", 6, 17},
      {"Tile", 6, 17},
      {"Transpose", 1, 17},
      {"Trilu", 14, 17},
      {"Unsqueeze", 1, 17},
      {"Where", 9, 17},
  };
  return kOps;
}

const OpInfo *findOp(std::string_view type) {
  const auto &ops = supportedOps();
  auto it = std::lower_bound(ops.begin(), ops.end(), type,
                             [](const OpInfo &op, std::string_view t) { return op.type < t; });
  return it != ops.end() && it->type == type ? &*it : nullptr;
}

} // namespace rannc::ir
