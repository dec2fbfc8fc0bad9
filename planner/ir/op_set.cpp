#include "planner/ir/op_set.h"

#include <algorithm>

namespace rannc::ir {

// min_opset is the first opset whose semantics the executor implements; where
// an op moved an attribute to an input (Unsqueeze/Squeeze/ReduceSum axes,
// Split split, Slice starts/ends, Clip min/max, Pad pads, TopK k) both forms
// are handled, so the range reaches back past the change. Ops deprecated
// before 17 (Upsample, Scatter) stop at their last opset. max_opset 17: models of opsets 18-22
// reach the IR rewritten into opset-17 forms (Note [newer opsets] in planner/import/onnx_opset.cpp).
const std::vector<OpInfo> &supportedOps() {
  static const std::vector<OpInfo> kOps = {
      {"Abs", 6, 17},
      {"Acos", 7, 17},
      {"Acosh", 9, 17},
      {"Add", 6, 17}, // 6: `broadcast`/`axis` attrs; 7: multidirectional broadcasting
      {"And", 7, 17},
      {"ArgMax", 1, 17},
      {"ArgMin", 1, 17},
      {"Asin", 7, 17},
      {"Asinh", 9, 17},
      {"Atan", 7, 17},
      {"Atanh", 9, 17},
      {"AveragePool", 1, 17}, // 7: count_include_pad (default 0 before); 10: ceil_mode (19's dilations: no)
      {"BatchNormalization", 6, 17}, // 6-8: spatial; 14: training_mode (kernels/normalization.cpp)
      {"Bernoulli", 15, 17},
      {"BitShift", 11, 17},
      // ONNX's Bitwise* are opset 18: they arrive rewritten to opset 17 (Note [newer opsets])
      {"BitwiseAnd", 1, 17},
      {"BitwiseNot", 1, 17},
      {"BitwiseOr", 1, 17},
      {"BitwiseXor", 1, 17},
      {"BlackmanWindow", 17, 17},
      {"Cast", 6, 17}, // 6: `to` is an int
      {"CastLike", 15, 17},
      {"Ceil", 6, 17},
      {"Celu", 12, 17},
      {"Clip", 6, 17}, // 6-10: min/max attrs; 11+: min/max inputs
      {"Compress", 9, 17},
      {"Concat", 4, 17},
      {"Constant", 1, 17},
      {"ConstantOfShape", 9, 17},
      {"Conv", 1, 17},
      {"ConvTranspose", 1, 17},
      {"Cos", 7, 17},
      {"Cosh", 9, 17},
      {"CumSum", 11, 17},
      {"DFT", 17, 17},
      {"DepthToSpace", 1, 17}, // 11: mode (DCR before)
      {"Det", 11, 17},
      {"Div", 6, 17},
      {"Dropout", 7, 17}, // 7-11: ratio attr, inference only; 12: ratio and training_mode inputs
      {"Einsum", 12, 17},
      {"Elu", 6, 17},
      {"Equal", 7, 17},
      {"Erf", 9, 17},
      {"Exp", 6, 17},
      {"Expand", 8, 17},
      {"EyeLike", 9, 17},
      {"Flatten", 1, 17},
      {"Floor", 6, 17},
      {"GRU", 7, 17}, // 14: layout (Note [recurrent layers])
      {"Gather", 1, 17},
      {"GatherElements", 11, 17},
      {"GatherND", 11, 17}, // 12: batch_dims
      {"Gelu", 1, 17}, // ONNX's is opset 20: it arrives rewritten to opset 17 (Note [newer opsets])
      {"Gemm", 6, 17},
      {"GlobalAveragePool", 1, 17},
      {"GlobalMaxPool", 1, 17},
      {"Greater", 7, 17},
      {"GreaterOrEqual", 12, 17},
      {"GridSample", 16, 17},
      {"HammingWindow", 17, 17},
      {"HannWindow", 17, 17},
      {"HardSigmoid", 6, 17},
      {"HardSwish", 14, 17},
      {"Hardmax", 1, 17}, // 1-12: coerced to 2-D; 13+: one axis
      {"Identity", 1, 17},
      {"InstanceNormalization", 6, 17},
      {"IsInf", 10, 17},
      {"IsNaN", 9, 17},
      {"LRN", 1, 17},
      {"LSTM", 7, 17},
      // 17 is the opset that defines it; the import's fusion (Note [pattern
      // fusion] in planner/import/fuse.cpp) writes it into graphs of any opset.
      {"LayerNormalization", 1, 17},
      {"LeakyRelu", 6, 17},
      {"Less", 7, 17},
      {"LessOrEqual", 12, 17},
      {"Log", 6, 17},
      {"LogSoftmax", 1, 17}, // 1-12: coerced to 2-D; 13+: one axis
      {"MatMul", 1, 17},
      {"Max", 6, 17}, // 6-7: equal shapes; 8: broadcasting
      {"MaxPool", 1, 17}, // 8: Indices, storage_order; 10: dilations, ceil_mode
      {"MaxUnpool", 9, 17},
      {"Mean", 6, 17},
      {"MeanVarianceNormalization", 9, 17},
      {"Min", 6, 17},
      {"Mod", 10, 17},
      {"Mul", 6, 17},
      {"Neg", 6, 17},
      {"NegativeLogLikelihoodLoss", 12, 17},
      {"NonMaxSuppression", 10, 17},
      {"NonZero", 9, 17},
      {"Not", 1, 17},
      {"OneHot", 9, 17},
      {"Or", 7, 17},
      {"PRelu", 6, 17}, // 6: per-channel [C] slope; 7: unidirectional broadcasting
      {"Pad", 2, 17},   // 2-10: pads/value attrs; 11+: inputs (18's axes: no)
      {"Pow", 6, 17},
      {"RMSNormalization", 1, 17}, // domain "rannc.fused" (Note [pattern fusion])
      {"RNN", 7, 17},
      {"RandomNormal", 1, 17},
      {"RandomNormalLike", 1, 17},
      {"RandomUniform", 1, 17},
      {"RandomUniformLike", 1, 17},
      {"Range", 11, 17},
      {"Reciprocal", 6, 17},
      {"ReduceL1", 1, 17},
      {"ReduceL2", 1, 17},
      {"ReduceLogSum", 1, 17},
      {"ReduceLogSumExp", 1, 17},
      {"ReduceMax", 1, 17},
      {"ReduceMean", 1, 17},
      {"ReduceMin", 1, 17},
      {"ReduceProd", 1, 17},
      {"ReduceSum", 1, 17}, // 1-12: axes attr; 13+: axes input
      {"ReduceSumSquare", 1, 17},
      {"Relu", 6, 17},
      {"Reshape", 5, 17}, // 5: shape input; 14: allowzero
      {"Resize", 10, 17}, // 10: asymmetric; 11: roi, sizes, coordinate modes (Note [Resize])
      {"ReverseSequence", 10, 17},
      {"Round", 11, 17},
      {"STFT", 17, 17},
      {"ScaledDotProductAttention", 1, 17}, // domain "rannc.fused"
      {"Scatter", 9, 10}, // deprecated in 11 for ScatterElements
      {"ScatterElements", 11, 17}, // 16: reduction
      {"ScatterND", 11, 17},       // 16: reduction
      {"Selu", 6, 17},
      {"Shape", 1, 17},   // 15: start/end
      {"Shrink", 9, 17},
      {"SiLU", 1, 17}, // domain "rannc.fused"
      {"Sigmoid", 6, 17},
      {"Sign", 9, 17},
      {"Sin", 7, 17},
      {"Sinh", 9, 17},
      {"Size", 1, 17},
      {"Slice", 1, 17}, // 1-9: attrs; 10+: inputs with steps
      {"Softmax", 1, 17},
      {"SoftmaxCrossEntropyLoss", 12, 17},
      {"Softplus", 1, 17},
      {"Softsign", 1, 17},
      {"SpaceToDepth", 1, 17},
      {"Split", 1, 17}, // split as attr (1-12) or input (1, 13+)
      {"Sqrt", 6, 17},
      {"Squeeze", 1, 17},
      {"Sub", 6, 17},
      {"Sum", 6, 17},
      {"Tan", 7, 17},
      {"Tanh", 6, 17},
      // Domain "rannc": the collectives sharding::localGraph inserts (Note
      // [tensor parallel sharding] in planner/sharding/sharding.h); never in a model file.
      {"TensorParallelCopy", 1, 17},
      {"TensorParallelCrossEntropy", 1, 17},
      {"TensorParallelEmbedding", 1, 17},
      {"TensorParallelGather", 1, 17},
      {"TensorParallelSum", 1, 17},
      {"ThresholdedRelu", 10, 17},
      {"Tile", 6, 17},
      {"TopK", 1, 17}, // 1-9: k attr; 10+: K input; 11: largest, sorted
      {"Transpose", 1, 17},
      {"Trilu", 14, 17},
      {"Unique", 11, 17},
      {"Unsqueeze", 1, 17},
      {"Upsample", 7, 9}, // deprecated in 10 for Resize
      {"Where", 9, 17},
      {"Xor", 7, 17},
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
