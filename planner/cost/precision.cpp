#include "planner/cost/precision.h"

#include <algorithm>
#include <set>
#include <string>

#include "planner/ir/fused_ops.h"
#include "planner/ir/op_set.h"
#include "planner/support/words.h"

namespace rannc::cost {

/// Note [autocast dtypes]
/// Under --precision bf16|fp16 every stage's forward runs under LibTorch's
/// autocast (executor/runtime/stage.cpp), so the policy PyTorch users know
/// decides each op's dtype; the planner mirrors it to size activations, cuts
/// and weight copies:
///  - ops on autocast's lower-precision list (matrix products, convolutions,
///    attention: aten::linear, matmul, mm, bmm, addmm, baddbmm, conv*, einsum,
///    scaled_dot_product_attention, prelu; ONNX MatMul, Gemm, Conv,
///    ConvTranspose, Einsum, which the executor runs as those ATen ops) cast
///    their floating inputs down and output bf16/fp16;
///  - ops on its fp32 list (the losses, prod; on CUDA also softmax,
///    log_softmax, layer_norm, group_norm, exp, log, pow, rsqrt, ...) output
///    fp32;
///  - every other op runs in the dtype of its inputs: ops combining tensors
///    (add, mul, where, concat, ...) promote, so any fp32 input of rank > 0
///    makes them fp32 (0-dim tensors do not promote, as in PyTorch); the rest
///    (unary ops, norms on CPU, gathers, reshapes) follow their first floating
///    input.
/// The lists are LibTorch 2.14's (aten/src/ATen/autocast_mode.cpp), checked
/// against PyTorch by running each op under torch.autocast('cpu'); an op the
/// planner misjudges only skews the memory estimate, never the numerics.
/// Autocast caches the low-precision copy of each fp32 weight (a leaf that
/// requires grad) it casts; the executor keeps that cache for a whole step
/// (all micro-batches reuse one copy) and clears it before the optimizer's
/// update becomes visible, so a stage holds one 2-byte copy of every weight
/// its low-precision ops read: lowPrecisionWeightBytes.
namespace {

const std::set<std::string> kLowerOnnx = {"MatMul", "Gemm", "Conv", "ConvTranspose", "Einsum"};
const std::set<std::string> kLowerAten = {
    "linear", "matmul", "mm", "bmm", "addmm", "addbmm", "baddbmm", "conv1d", "conv2d", "conv3d", "conv_tbc",
    "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "_convolution", "einsum", "prelu", "linalg_vecdot",
    "scaled_dot_product_attention", "_native_multi_head_attention"};
const std::set<std::string> kFp32Onnx = {"SoftmaxCrossEntropyLoss", "NegativeLogLikelihoodLoss", "ReduceProd"};
const std::set<std::string> kFp32Aten = {
    "cross_entropy_loss", "nll_loss", "nll_loss2d", "nll_loss_nd", "mse_loss", "l1_loss", "smooth_l1_loss",
    "huber_loss", "binary_cross_entropy", "binary_cross_entropy_with_logits", "kl_div", "prod", "cdist",
    "cosine_embedding_loss", "hinge_embedding_loss", "poisson_nll_loss", "margin_ranking_loss", "soft_margin_loss",
    "triplet_margin_loss", "multi_margin_loss", "multilabel_margin_loss", "ctc_loss", "polar", "quantile"};
// CUDA's fp32 list adds these (AT_FORALL_FP32, AT_FORALL_FP32_SET_OPT_DTYPE).
const std::set<std::string> kFp32CudaOnnx = {"Softmax", "LogSoftmax", "LayerNormalization", "Exp", "Log", "Pow",
                                             "Reciprocal", "Softplus", "ReduceSum", "CumSum", "Acos", "Asin",
                                             "Cosh", "Sinh", "Tan"};
const std::set<std::string> kFp32CudaAten = {
    "softmax", "log_softmax", "_softmax", "_log_softmax", "layer_norm", "native_layer_norm", "group_norm", "rms_norm",
    "exp", "expm1", "log", "log10", "log2", "log1p", "pow", "reciprocal", "rsqrt", "softplus", "acos", "asin", "cosh",
    "sinh", "tan", "erfinv", "sum", "cumsum", "cumprod", "frobenius_norm", "nuclear_norm", "cosine_similarity",
    "linalg_vector_norm", "linalg_matrix_norm"};
// Ops that combine tensors with type promotion.
const std::set<std::string> kPromoteOnnx = {"Add", "Sub", "Mul", "Div", "Pow", "Where", "Max", "Min", "Sum",
                                            "Mean", "Concat", "PRelu"};
const std::set<std::string> kPromoteAten = {"add", "add_", "sub", "sub_", "mul", "mul_", "div", "div_", "rsub",
                                            "where", "cat", "concat", "stack", "maximum", "minimum", "pow",
                                            "addcmul", "addcdiv", "lerp"};

/// An ATen op's schema name ("aten::linear" -> "linear"; in-place "add_"
/// stays "add_"), a fused node's kernel's, empty for other ops.
std::string atenName(const ir::Node &n) {
  std::string_view op = n.op_type;
  // A fused node runs its ATen kernel (Note [pattern fusion]), under that kernel's autocast class.
  if (ir::isFused(n))
    return op == ir::kScaledDotProductAttention ? "scaled_dot_product_attention"
           : op == ir::kRMSNormalization        ? "rms_norm"
                                                 : "silu";
  if (!ir::isAten(n) || op.rfind("aten::", 0) != 0) return {};
  op.remove_prefix(6);
  return std::string(op);
}
bool isOnnx(const ir::Node &n) { return !ir::isAten(n) && (n.domain.empty() || n.domain == "ai.onnx"); }
bool in(const std::set<std::string> &set, const std::string &name) { return !name.empty() && set.count(name) > 0; }

} // namespace

const char *const kPrecisionWords[] = {"fp32", "bf16", "fp16"}; // in Precision's order

Expected<Precision> parsePrecision(std::string_view text) {
  if (auto p = enumFromWord<Precision>(text, kPrecisionWords)) return *p;
  return Error{"precision must be fp32, bf16 or fp16 (got '" + std::string(text) + "')"};
}

std::string precisionName(Precision p) { return kPrecisionWords[size_t(p)]; }

std::vector<std::string> precisionNames() { return wordList(kPrecisionWords); }

Expected<Precision> planPrecision(const proto::Plan &plan) {
  return parsePrecision(plan.precision().empty() ? "fp32" : plan.precision());
}

ir::DType lowPrecisionDType(Precision precision) {
  if (precision == Precision::BF16) return ir::DType::BF16;
  if (precision == Precision::FP16) return ir::DType::F16;
  return ir::DType::Undefined;
}

bool runsInLowPrecision(const ir::Node &n) {
  return (isOnnx(n) && kLowerOnnx.count(n.op_type)) || in(kLowerAten, atenName(n));
}

void assignComputeDTypes(ir::Graph &g, Precision precision, std::string_view device_type) {
  const ir::DType low = lowPrecisionDType(precision);
  const bool cuda = device_type == "cuda";
  for (ir::Value &v : g.values) v.compute_dtype = ir::DType::Undefined;
  if (low == ir::DType::Undefined) return;
  for (const ir::Node &n : g.nodes) {
    const std::string aten = atenName(n);
    const bool fp32 = (isOnnx(n) && (kFp32Onnx.count(n.op_type) || (cuda && kFp32CudaOnnx.count(n.op_type)))) ||
                      in(kFp32Aten, aten) || (cuda && in(kFp32CudaAten, aten));
    const bool promote = (isOnnx(n) && kPromoteOnnx.count(n.op_type)) || in(kPromoteAten, aten);
    // The run-time dtypes of the floating inputs.
    ir::DType first = ir::DType::Undefined, widest = ir::DType::Undefined, widest0d = ir::DType::Undefined;
    for (ir::ValueId in : n.inputs) {
      if (in == ir::kNoValue || !ir::isFloating(g.values[in].dtype)) continue;
      const ir::Value &v = g.values[in];
      const ir::DType d = v.runtimeDType();
      if (first == ir::DType::Undefined) first = d;
      ir::DType &w = v.shape_known && v.shape.empty() ? widest0d : widest;
      if (w == ir::DType::Undefined || ir::dtypeSize(d) > ir::dtypeSize(w)) w = d;
    }
    if (widest == ir::DType::Undefined) widest = widest0d;
    ir::DType out = ir::DType::Undefined; // Undefined: as declared
    if (runsInLowPrecision(n)) out = first == ir::DType::Undefined ? ir::DType::Undefined : low;
    else if (fp32) out = ir::DType::F32;
    else out = promote ? widest : first;
    for (ir::ValueId o : n.outputs) {
      if (o == ir::kNoValue) continue;
      ir::Value &v = g.values[o];
      // Autocast changes float32 only; float64 and integers stay as they are.
      if (v.dtype == ir::DType::F32 && out != ir::DType::Undefined && out != ir::DType::F32 && ir::isFloating(out))
        v.compute_dtype = out;
    }
  }
}

int64_t lowPrecisionWeightBytes(const ir::Graph &g, int op_begin, int op_end) {
  std::set<ir::ValueId> seen;
  int64_t bytes = 0;
  for (int i = std::max(0, op_begin); i < op_end && i < int(g.nodes.size()); ++i) {
    const ir::Node &n = g.nodes[size_t(i)];
    if (!runsInLowPrecision(n)) continue;
    for (ir::ValueId in : n.inputs)
      if (in != ir::kNoValue && g.values[in].kind == ir::ValueKind::Parameter &&
          g.values[in].dtype == ir::DType::F32 && seen.insert(in).second)
        bytes += ir::numelAt(g.values[in].shape, 1) * 2;
  }
  return bytes;
}

std::vector<std::string> onnxOpsWithAutocastClass() {
  std::set<std::string> all;
  for (const auto *set : {&kLowerOnnx, &kFp32Onnx, &kFp32CudaOnnx, &kPromoteOnnx}) all.insert(set->begin(), set->end());
  return {all.begin(), all.end()};
}

} // namespace rannc::cost
