#include "planner/cost/flops.h"

#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "planner/ir/fused_ops.h"
#include "planner/ir/op_set.h"

namespace rannc::cost {
namespace {

// Note [flop counts]
// One table for both vocabularies: an ONNX op_type or an ATen schema name
// (front ends keep "aten::<name>"; an in-place "relu_" counts as "relu") maps
// to a rule. A multiply-add counts as 2 FLOPs, as PyTorch's FlopCounterMode,
// torchvision's model table (its "GFLOPS" are multiply-adds, x2 here) and the
// 6 x parameters x tokens rule of thumb do:
//   matrix product   2 * numel(out) * K, K the contracted size;
//   convolution      2 * numel(out) * (C_in / groups) * prod(kernel), i.e.
//                    numel(weight[0]) per output element; transposed: the
//                    same per *input* element;
//   attention        2 * L * S * (E + Ev) per batch-head, plus the softmax
//                    (5 per score); causal masking is not discounted;
//   einsum           2 * the product of every index's size;
//   normalisation    5 per element (mean, variance, normalise, scale, shift);
//   softmax, cross-entropy   5 per input element;
//   pooling, reductions      1 per input element;
//   other arithmetic 1 per output element;
//   copies and re-indexing (transpose, gather, concat, cast) 0: they cost
//   bytes, not arithmetic; shape and constant ops 0 and no kernel at all.
// Backward: a matrix product, convolution or two-operand einsum computes both
// input gradients, each as costly as the forward (2x, in two kernels);
// attention and normalisations 2x in one kernel; everything else 1x. The
// element-wise counts barely matter for time: those ops are bandwidth-bound
// and the roofline (Note [roofline efficiency]) takes their time from bytes.

enum class Rule {
  kMatMul,    // K = last dim of the first matrix operand
  kGemm,      // ONNX Gemm: K honours transA
  kConv,
  kConvT,
  kConvAny,   // aten::convolution/_convolution: "transposed" is argument 6
  kAttention, // q, k, v are inputs 0, 1, 2
  kEinsum,
  kNorm,
  kSoftmax,   // also cross-entropy: per input element
  kPerInput,  // pooling, reductions
  kMovement,
  kHost,
};

struct Entry {
  Rule rule;
  int operand = 0; ///< kMatMul: the input holding the first matrix
};

const std::map<std::string, Entry, std::less<>> &onnxRules() {
  static const std::map<std::string, Entry, std::less<>> rules = [] {
    std::map<std::string, Entry, std::less<>> r{
        {"MatMul", {Rule::kMatMul}}, {"Gemm", {Rule::kGemm}}, {"Conv", {Rule::kConv}},
        {"ConvTranspose", {Rule::kConvT}}, {"Einsum", {Rule::kEinsum}}};
    // The fused kernels (domain "rannc.fused", Note [pattern fusion]) count as the ATen ops they run.
    r[std::string(ir::kScaledDotProductAttention)] = {Rule::kAttention};
    for (const char *op : {"BatchNormalization", "LayerNormalization", "InstanceNormalization",
                           "MeanVarianceNormalization", "RMSNormalization"})
      r[op] = {Rule::kNorm};
    for (const char *op : {"Softmax", "LogSoftmax", "Hardmax", "SoftmaxCrossEntropyLoss"}) r[op] = {Rule::kSoftmax};
    for (const char *op : {"MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "ReduceSum",
                           "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
                           "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp", "ArgMax", "ArgMin", "CumSum",
                           "NegativeLogLikelihoodLoss"})
      r[op] = {Rule::kPerInput};
    for (const char *op : {"Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Slice", "Gather",
                           "GatherElements", "GatherND", "Concat", "Split", "Expand", "Identity",
                           "Cast", "CastLike", "Tile", "Pad", "ScatterElements", "ScatterND", "Where", "Dropout",
                           "Trilu", "OneHot", "DepthToSpace", "SpaceToDepth", "EyeLike", "ConstantOfShape", "Range",
                           "ReverseSequence", "Compress", "NonZero"})
      r[op] = {Rule::kMovement};
    for (const char *op : {"Constant", "Shape", "Size"}) r[op] = {Rule::kHost};
    return r;
  }();
  return rules;
}

const std::map<std::string, Entry, std::less<>> &atenRules() {
  static const std::map<std::string, Entry, std::less<>> rules = [] {
    std::map<std::string, Entry, std::less<>> r;
    for (const char *op : {"linear", "matmul", "mm", "bmm", "mv", "dot", "vdot"}) r[op] = {Rule::kMatMul, 0};
    for (const char *op : {"addmm", "baddbmm", "addbmm", "addmv", "_addmm_activation"}) r[op] = {Rule::kMatMul, 1};
    for (const char *op : {"conv1d", "conv2d", "conv3d", "cudnn_convolution", "mkldnn_convolution",
                           "_convolution_mode", "_nnpack_spatial_convolution"})
      r[op] = {Rule::kConv};
    for (const char *op : {"conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "cudnn_convolution_transpose"})
      r[op] = {Rule::kConvT};
    for (const char *op : {"convolution", "_convolution"}) r[op] = {Rule::kConvAny};
    for (const char *op : {"scaled_dot_product_attention", "_scaled_dot_product_attention_math",
                           "_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_for_cpu",
                           "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
                           "_scaled_dot_product_fused_attention_overrideable"})
      r[op] = {Rule::kAttention};
    r["einsum"] = {Rule::kEinsum};
    for (const char *op : {"batch_norm", "native_batch_norm", "_native_batch_norm_legit",
                           "_native_batch_norm_legit_functional", "_native_batch_norm_legit_no_training",
                           "cudnn_batch_norm", "_batch_norm_impl_index", "_batch_norm_with_update",
                           "_batch_norm_with_update_functional", "_batch_norm_no_update", "layer_norm",
                           "native_layer_norm", "group_norm", "native_group_norm", "instance_norm", "rms_norm",
                           "_fused_rms_norm"})
      r[op] = {Rule::kNorm};
    for (const char *op : {"softmax", "_softmax", "log_softmax", "_log_softmax", "cross_entropy_loss",
                           "_safe_softmax"})
      r[op] = {Rule::kSoftmax};
    for (const char *op : {"max_pool1d", "max_pool2d", "max_pool3d", "max_pool2d_with_indices",
                           "max_pool3d_with_indices", "avg_pool1d", "avg_pool2d", "avg_pool3d", "adaptive_avg_pool1d",
                           "adaptive_avg_pool2d", "adaptive_avg_pool3d", "_adaptive_avg_pool2d",
                           "_adaptive_avg_pool3d", "adaptive_max_pool1d", "adaptive_max_pool2d", "sum", "mean",
                           "amax", "amin", "max", "min", "prod", "norm", "linalg_vector_norm", "var", "std",
                           "var_mean", "std_mean", "logsumexp", "cumsum", "argmax", "argmin", "nll_loss",
                           "nll_loss_nd", "nll_loss2d", "nll_loss_forward", "mse_loss", "l1_loss",
                           "binary_cross_entropy_with_logits"})
      r[op] = {Rule::kPerInput};
    for (const char *op :
         {"view", "reshape", "_unsafe_view", "_reshape_alias", "permute", "transpose", "t", "contiguous", "expand",
          "expand_as", "slice", "select", "index", "index_select", "embedding", "gather", "cat", "concat", "stack",
          "split", "split_with_sizes", "chunk", "unbind", "squeeze", "unsqueeze", "flatten", "unflatten", "to",
          "_to_copy", "type_as", "clone", "detach", "alias", "dropout", "native_dropout", "feature_dropout",
          "narrow", "repeat", "roll", "pad", "constant_pad_nd", "where", "tril", "triu", "zeros_like", "ones_like",
          "full_like", "empty_like", "new_zeros", "new_ones", "new_full", "new_empty", "lift_fresh_copy", "copy",
          "as_strided", "unfold", "movedim", "numpy_T", "mT", "view_as", "reshape_as", "masked_select", "zeros",
          "ones", "full", "empty", "arange", "scalar_tensor", "tensor", "one_hot", "repeat_interleave", "flip",
          "scatter", "index_put", "diagonal", "_unsafe_index", "squeeze_copy", "view_copy", "permute_copy",
          "slice_copy", "expand_copy", "t_copy", "transpose_copy", "unsqueeze_copy", "split_copy", "select_copy"})
      r[op] = {Rule::kMovement};
    for (const char *op : {"size", "numel", "dim", "Int", "Float", "Bool", "ScalarImplicit", "__getitem__", "len",
                           "sym_size", "sym_numel", "sym_stride", "item", "_local_scalar_dense"})
      r[op] = {Rule::kHost};
    return r;
  }();
  return rules;
}

/// The rule for `n`, or nullopt for plain element-wise arithmetic.
std::optional<Entry> ruleFor(const ir::Node &n) {
  std::string_view op = n.op_type;
  if (ir::isRannc(n)) return Entry{Rule::kHost}; // collectives: communication, no arithmetic
  if (ir::isAten(n)) {
    if (op.rfind("prim::", 0) == 0) return Entry{Rule::kHost};
    // transformers' expert matmul (Note [library custom ops]): every row of
    // input [S, K] times one expert's [K, N], the product of input and output.
    if (op == "transformers::grouped_mm_fallback") return Entry{Rule::kMatMul, 0};
    if (op.rfind("aten::", 0) != 0) return std::nullopt;
    // aten::add.int and friends compute sizes on the host (torch.export's sym ints).
    if (auto it = n.attrs.find("overload"); it != n.attrs.end())
      if (const auto *s = std::get_if<std::string>(&it->second); s && *s == "int") return Entry{Rule::kHost};
    op = atenBaseName(op);
    const auto &rules = atenRules();
    if (auto it = rules.find(op); it != rules.end()) return it->second;
    return std::nullopt;
  }
  const auto &rules = onnxRules();
  if (auto it = rules.find(op); it != rules.end()) return it->second;
  return std::nullopt;
}

const ir::Value *input(const ir::Graph &g, const ir::Node &n, size_t i) {
  if (i >= n.inputs.size() || n.inputs[i] == ir::kNoValue) return nullptr;
  const ir::Value &v = g.values[n.inputs[i]];
  return v.shape_known ? &v : nullptr;
}

double numel(const ir::Value *v, int64_t b) { return v ? double(ir::numelAt(v->shape, b)) : 0.0; }

double outputNumel(const ir::Graph &g, const ir::Node &n, int64_t b) {
  double total = 0;
  for (ir::ValueId v : n.outputs)
    if (v != ir::kNoValue && g.values[v].shape_known) total += double(ir::numelAt(g.values[v].shape, b));
  return total;
}

/// The first output's element count (ops whose other outputs are statistics or indices).
double firstOutputNumel(const ir::Graph &g, const ir::Node &n, int64_t b) {
  if (n.outputs.empty() || n.outputs[0] == ir::kNoValue || !g.values[n.outputs[0]].shape_known) return 0;
  return double(ir::numelAt(g.values[n.outputs[0]].shape, b));
}

int64_t intAttr(const ir::Node &n, const std::string &name, int64_t fallback) {
  auto it = n.attrs.find(name);
  if (it == n.attrs.end()) return fallback;
  const auto *v = std::get_if<int64_t>(&it->second);
  return v ? *v : fallback;
}

/// Elements of one slice weight[0] of a convolution weight: (C_in/groups) * prod(kernel)
/// for a convolution, (C_out/groups) * prod(kernel) for a transposed one.
double perElementMacs(const ir::Value *w, int64_t b) {
  if (!w || w->shape.size() < 2) return 0;
  double m = 1;
  for (size_t i = 1; i < w->shape.size(); ++i) m *= double(w->shape[i].at(b));
  return m;
}

/// 2 * the product of every index's size; 0 when the equation is not a plain
/// contraction of two or more operands whose ranks match it.
double einsumFlops(const ir::Graph &g, const ir::Node &n, int64_t b) {
  std::string eq;
  for (const char *key : {"equation", "v0"})
    if (auto it = n.attrs.find(key); it != n.attrs.end())
      if (const auto *s = std::get_if<std::string>(&it->second)) eq = *s;
  eq.erase(std::remove(eq.begin(), eq.end(), ' '), eq.end());
  if (eq.empty() || eq.find("...") != std::string::npos) return 0;
  const std::string lhs = eq.substr(0, eq.find("->"));
  std::map<char, int64_t> size;
  size_t operand = 0, start = 0;
  for (;; ++operand) {
    const size_t end = lhs.find(',', start);
    const std::string term = lhs.substr(start, end == std::string::npos ? std::string::npos : end - start);
    const ir::Value *v = input(g, n, operand);
    if (!v || v->shape.size() != term.size()) return 0;
    for (size_t i = 0; i < term.size(); ++i) size[term[i]] = std::max(size[term[i]], v->shape[i].at(b));
    if (end == std::string::npos) break;
    start = end + 1;
  }
  if (operand < 1) return 0; // one operand: a transposition or a reduction
  double product = 1;
  for (const auto &[letter, s] : size) product *= double(s);
  return 2 * product;
}

bool isSoftmax(const ir::Node &n) {
  const std::string_view op = atenBaseName(n.op_type);
  return op == "Softmax" || op == "LogSoftmax" || op == "softmax" || op == "_softmax" || op == "log_softmax" ||
         op == "_log_softmax" || op == "_safe_softmax";
}

/// Element-wise ops the table counts as movement (no arithmetic) that a fused
/// element-wise kernel still runs (Note [fused element-wise chains], cost.cpp).
bool isPointwiseMovement(const ir::Node &n) {
  const std::string_view op = atenBaseName(n.op_type);
  return op == "Dropout" || op == "dropout" || op == "native_dropout" || op == "feature_dropout" || op == "Where" ||
         op == "where" || op == "masked_fill";
}

/// Reshapes that never copy a contiguous tensor: they rewrite its shape and strides only.
bool isView(const ir::Node &n) {
  static const std::string_view views[] = {"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "view",
                                           "reshape", "_unsafe_view", "_reshape_alias", "flatten", "unflatten",
                                           "squeeze", "unsqueeze", "alias", "detach", "view_as", "reshape_as"};
  const std::string_view op = atenBaseName(n.op_type);
  return std::find(std::begin(views), std::end(views), op) != std::end(views);
}

} // namespace

std::string_view atenBaseName(std::string_view op) {
  if (op.rfind("aten::", 0) != 0) return op;
  op.remove_prefix(6);
  if (op.size() > 1 && op.back() == '_' && op[op.size() - 2] != '_') op.remove_suffix(1); // relu_ -> relu
  return op;
}

std::vector<std::string> onnxOpsWithFlopRules() {
  std::vector<std::string> ops;
  for (const auto &[op, entry] : onnxRules()) ops.push_back(op);
  return ops;
}

OpFlops opFlops(const ir::Graph &g, const ir::Node &n, int64_t b) {
  OpFlops f;
  const auto entry = ruleFor(n);
  if (!entry) { // element-wise arithmetic
    f.fwd = f.bwd = outputNumel(g, n, b);
    f.pointwise = true;
    return f;
  }
  switch (entry->rule) {
  case Rule::kMatMul:
  case Rule::kGemm: {
    const ir::Value *a = input(g, n, entry->operand);
    int64_t k = 0;
    if (a && !a->shape.empty()) {
      const bool trans_a = entry->rule == Rule::kGemm && intAttr(n, "transA", 0) != 0 && a->shape.size() >= 2;
      k = (trans_a ? a->shape[a->shape.size() - 2] : a->shape.back()).at(b);
    }
    f.fwd = 2.0 * firstOutputNumel(g, n, b) * double(k);
    f.bwd = 2 * f.fwd;
    f.cls = OpClass::kMatrix;
    f.bwd_kernels = 2;
    return f;
  }
  case Rule::kConv:
  case Rule::kConvT:
  case Rule::kConvAny: {
    bool transposed = entry->rule == Rule::kConvT;
    if (entry->rule == Rule::kConvAny) transposed = intAttr(n, "v6", 0) != 0;
    const double per = perElementMacs(input(g, n, 1), b);
    f.fwd = 2.0 * per * (transposed ? numel(input(g, n, 0), b) : firstOutputNumel(g, n, b));
    f.bwd = 2 * f.fwd;
    f.cls = OpClass::kMatrix;
    f.convolution = true;
    f.bwd_kernels = 2;
    return f;
  }
  case Rule::kAttention: {
    const ir::Value *q = input(g, n, 0), *k = input(g, n, 1), *v = input(g, n, 2);
    if (q && k && v && q->shape.size() >= 2 && k->shape.size() >= 2 && v->shape.size() >= 2) {
      double batch_heads = 1;
      for (size_t i = 0; i + 2 < q->shape.size(); ++i) batch_heads *= double(q->shape[i].at(b));
      const double L = double(q->shape[q->shape.size() - 2].at(b)), E = double(q->shape.back().at(b));
      // A fused attention's key may arrive transposed, [..., E, S] (Note [pattern fusion]).
      const bool key_t = ir::isFused(n) && n.attrs.count("key_transposed") &&
                         std::get_if<int64_t>(&n.attrs.at("key_transposed")) &&
                         std::get<int64_t>(n.attrs.at("key_transposed")) != 0;
      const double S = double((key_t ? k->shape.back() : k->shape[k->shape.size() - 2]).at(b));
      const double Ev = double(v->shape.back().at(b));
      f.fwd = batch_heads * L * S * (2 * E + 2 * Ev + 5);
    }
    f.bwd = 2 * f.fwd;
    f.cls = OpClass::kMatrix;
    return f;
  }
  case Rule::kEinsum: {
    const double flops = einsumFlops(g, n, b);
    if (flops == 0) { // not a contraction rannc can size: count it as element-wise
      f.fwd = f.bwd = outputNumel(g, n, b);
      return f;
    }
    f.fwd = flops;
    f.bwd = 2 * flops;
    f.cls = OpClass::kMatrix;
    f.bwd_kernels = 2;
    return f;
  }
  case Rule::kNorm:
    f.fwd = 5 * numel(input(g, n, 0), b);
    f.bwd = 2 * f.fwd;
    return f;
  case Rule::kSoftmax:
    f.fwd = f.bwd = 5 * numel(input(g, n, 0), b);
    f.softmax = isSoftmax(n);
    return f;
  case Rule::kPerInput:
    f.fwd = f.bwd = numel(input(g, n, 0), b);
    return f;
  case Rule::kMovement:
    f.cls = OpClass::kMovement;
    f.pointwise = isPointwiseMovement(n);
    f.view = isView(n);
    return f;
  case Rule::kHost:
    f.cls = OpClass::kHost;
    f.bwd_kernels = 0;
    return f;
  }
  return f;
}

GraphFlops graphFlops(const ir::Graph &g, int64_t b) {
  GraphFlops total;
  for (const ir::Node &n : g.nodes) {
    const OpFlops f = opFlops(g, n, b);
    total.fwd += f.fwd;
    total.bwd += f.bwd;
  }
  return total;
}

} // namespace rannc::cost
