#include "planner/cost/cost.h"

#include "planner/cost/flops.h"
#include "planner/cost/precision.h"
#include "planner/ir/fused_ops.h"
#include "planner/support/words.h"

#include <algorithm>
#include <initializer_list>
#include <string_view>

namespace rannc::cost {
namespace {

int64_t valueBytes(const ir::Graph &g, ir::ValueId v, int64_t b) {
  if (v == ir::kNoValue) return 0;
  const ir::Value &val = g.values[v];
  if (!val.shape_known) return 0;
  return ir::numelAt(val.shape, b) * ir::dtypeSize(val.runtimeDType()); // Note [autocast dtypes]
}

/// Note [what autograd saves]
/// rannc-exec drops each value after its last use (Note [last use] in
/// executor/runtime/stage.h), so what a unit keeps for backward is what
/// autograd saves, plus its outputs for later units. The analytic source
/// estimates the first from the ops' autograd formulas (PyTorch's
/// derivatives.yaml) for the common ops, and nothing less than the old
/// "every input and output" for the rest:
///  - a product (MatMul, Gemm, Conv, Einsum, Mul, Div) saves an operand when
///    another operand requires grad (Div also saves its divisor for itself);
///  - Softmax, LogSoftmax, Relu, Sigmoid, Tanh, Exp, Sqrt and Reciprocal save
///    their output (and SoftmaxCrossEntropyLoss a log-softmax of its input's
///    size, counted as that input); Erf, Gelu, SiLU, Pow, the other
///    activations and the normalizations their inputs;
///  - sums, differences, negation, reductions to a sum or mean, casts and
///    movement ops (views and copies: Reshape, Transpose, Slice, Concat, ...)
///    save nothing of their float operands, Gather and Where only the indices
///    and the condition;
///  - any other op saves all its inputs and its outputs.
/// Only values that require grad (made from a parameter) are saved at all,
/// but for attention's mask. Some kernels also save tensors of their own,
/// which no graph value holds (savedExtraBytes):
///  - Dropout a one-byte mask per element;
///  - LayerNorm a float32 mean and inverse deviation per row;
///  - RMSNorm a float32 inverse RMS per row and, on `cpu`, where ATen runs
///    it as its composite (x * rsqrt(mean(x^2) + eps)) * w, the normalised
///    x * rsqrt(...) too, a tensor of the input's size, which the product
///    with w saves; CUDA's fused kernel keeps the row statistic only;
///  - scaled_dot_product_attention (the fused attention of Note [pattern
///    fusion], or ATen's) its query, key, value, mask and output and a
///    float32 log-sum-exp per query row, never the score matrix (CPU's
///    flash kernel, and CUDA's flash, memory-efficient and cuDNN ones); a
///    masked fill becomes an additive mask of the condition's shape, which
///    it saves as well.
/// These were measured on CPU with torch.autograd.graph.saved_tensors_hooks
/// (PyTorch 2.14.1), and for CUDA read from the saved fields of the autograd
/// nodes (FusedRmsNormBackward0, ScaledDotProduct*AttentionBackward0 in
/// torch/csrc/autograd/generated/Functions.h); docs/figures.md lists them.

bool anyOf(std::initializer_list<std::string_view> names, std::string_view op) {
  return std::find(names.begin(), names.end(), op) != names.end();
}

struct Saved {
  std::vector<bool> value;    ///< by value id
  std::vector<bool> recorded; ///< by node: autograd records it (an input requires grad)
};

bool isAttention(std::string_view op) {
  return op == ir::kScaledDotProductAttention || op == "scaled_dot_product_attention";
}

/// The bytes node `n`, recorded by autograd, saves besides graph values, at
/// micro-batch `b` (Note [what autograd saves]).
int64_t savedExtraBytes(const ir::Graph &g, const ir::Node &n, int64_t b, bool gpu) {
  if (n.outputs.empty() || n.outputs[0] == ir::kNoValue || !g.values[n.outputs[0]].shape_known) return 0;
  const ir::Value &out = g.values[n.outputs[0]];
  const int64_t elems = ir::numelAt(out.shape, b);
  const int64_t last = out.shape.empty() ? 1 : std::max<int64_t>(1, out.shape.back().at(b));
  const int64_t rows = elems / last;
  const std::string_view op = atenBaseName(n.op_type);
  if (anyOf({"Dropout", "dropout", "native_dropout"}, op)) return elems; // one byte per element
  if (anyOf({"LayerNormalization", "layer_norm", "native_layer_norm"}, op)) return 2 * rows * 4;
  if (anyOf({"RMSNormalization", "rms_norm"}, op))
    return rows * 4 + (gpu ? 0 : elems * ir::dtypeSize(out.runtimeDType()));
  if (isAttention(op)) {
    int64_t bytes = rows * 4; // the log-sum-exp
    if (ir::isFused(n) && n.attrs.count("mask_fill") && n.inputs.size() > 3 && n.inputs[3] != ir::kNoValue &&
        g.values[n.inputs[3]].shape_known)
      bytes += ir::numelAt(g.values[n.inputs[3]].shape, b) * ir::dtypeSize(out.runtimeDType());
    return bytes;
  }
  return 0;
}

Saved savedForBackward(const ir::Graph &g) {
  std::vector<bool> grad(g.values.size(), false), saved(g.values.size(), false), recorded(g.nodes.size(), false);
  for (ir::ValueId p : g.parameters) grad[p] = ir::isFloating(g.values[p].dtype);
  auto requiresGrad = [&](const ir::Node &n, size_t i) {
    return i < n.inputs.size() && n.inputs[i] != ir::kNoValue && grad[n.inputs[i]];
  };
  auto save = [&](ir::ValueId v) {
    if (v != ir::kNoValue && grad[v]) saved[v] = true;
  };
  for (size_t id = 0; id < g.nodes.size(); ++id) {
    const ir::Node &n = g.nodes[id];
    bool out_grad = false;
    for (size_t i = 0; i < n.inputs.size(); ++i) out_grad |= requiresGrad(n, i);
    for (ir::ValueId o : n.outputs)
      if (o != ir::kNoValue) grad[o] = out_grad && ir::isFloating(g.values[o].dtype);
    if (!out_grad) continue;
    recorded[id] = true;
    const std::string_view op = atenBaseName(n.op_type);
    if (isAttention(op)) { // q, k, v and the mask, gradient or not, and the output
      const bool filled = ir::isFused(n) && n.attrs.count("mask_fill"); // its mask is made inside: extra bytes
      for (size_t i = 0; i < n.inputs.size() && i < (filled ? 3u : 4u); ++i)
        if (n.inputs[i] != ir::kNoValue) saved[n.inputs[i]] = true;
      for (ir::ValueId o : n.outputs) save(o);
      continue;
    }
    const bool product = anyOf({"MatMul", "Gemm", "Conv", "ConvTranspose", "Einsum", "Mul", "matmul", "mm", "bmm",
                                "linear", "addmm", "conv1d", "conv2d", "conv3d", "convolution", "_convolution",
                                "einsum", "mul"},
                               op);
    if (product || op == "Div" || op == "div") {
      // The two operands: addmm's are its inputs 1 and 2 (input 0 is the bias).
      const size_t a = op == "addmm" ? 1 : 0, b = a + 1;
      if (b >= n.inputs.size()) continue;
      if (requiresGrad(n, b)) save(n.inputs[a]);
      if (requiresGrad(n, a) || op == "Div" || op == "div") save(n.inputs[b]);
      continue;
    }
    if (anyOf({"Softmax", "LogSoftmax", "Relu", "Sigmoid", "Tanh", "Exp", "Sqrt", "Reciprocal", "softmax",
               "_softmax", "log_softmax", "_log_softmax", "relu", "sigmoid", "tanh", "exp", "sqrt", "reciprocal"},
              op)) {
      for (ir::ValueId o : n.outputs) save(o);
      continue;
    }
    if (anyOf({"Erf", "Gelu", "Sin", "Cos", "Log", "Abs", "Pow", "LeakyRelu", "Elu", "Selu", "Softplus",
               "HardSigmoid", "HardSwish", "Clip", "Mish", "LayerNormalization", "BatchNormalization",
               "GroupNormalization", "InstanceNormalization", "RMSNormalization", "erf", "gelu", "sin", "cos", "log",
               "abs", "pow", "leaky_relu", "elu", "silu", "SiLU", "hardswish", "hardsigmoid", "clamp", "layer_norm",
               "native_layer_norm", "batch_norm", "native_batch_norm", "group_norm", "rms_norm"},
              op)) {
      for (ir::ValueId in : n.inputs) save(in); // and statistics (savedExtraBytes)
      continue;
    }
    if (anyOf({"SoftmaxCrossEntropyLoss", "cross_entropy_loss"}, op)) {
      save(n.inputs.empty() ? ir::kNoValue : n.inputs[0]); // its log-softmax, the input's size
      continue;
    }
    if (anyOf({"Add", "Sub", "Neg", "Sum", "ReduceSum", "ReduceMean", "Cast", "CastLike", "Reshape", "Transpose",
               "Flatten", "Squeeze", "Unsqueeze", "Slice", "Concat", "Split", "Expand", "Identity", "Tile", "Pad",
               "Gather", "Where", "Dropout", "add", "sub", "rsub", "neg", "sum", "mean", "view", "reshape",
               "_unsafe_view", "permute", "transpose", "t", "contiguous", "expand", "slice", "select", "cat",
               "split", "chunk", "unbind", "squeeze", "unsqueeze", "flatten", "to", "_to_copy", "clone", "embedding",
               "index_select", "where", "dropout", "native_dropout", "masked_fill"},
              op))
      continue; // the indices, conditions and masks they keep are counted below or small
    for (ir::ValueId in : n.inputs) save(in);
    for (ir::ValueId o : n.outputs) save(o);
  }
  return {std::move(saved), std::move(recorded)};
}

} // namespace

namespace {
const char *const kOptimizers[] = {"sgd", "momentum", "adam", "adamw"}; // Optimizer order
} // namespace

const char *optimizerName(Optimizer o) { return kOptimizers[int(o)]; }

std::vector<std::string> optimizerNames() { return wordList(kOptimizers); }

Expected<Optimizer> parseOptimizer(std::string_view text) {
  if (auto o = enumFromWord<Optimizer>(text, kOptimizers)) return *o;
  return Error{"must be sgd, momentum, adam or adamw (got '" + std::string(text) + "')"};
}

double optimizerStateFactor(Optimizer optimizer) {
  switch (optimizer) {
  case Optimizer::Adam:
  case Optimizer::AdamW: return 2;
  case Optimizer::Momentum: return 1;
  case Optimizer::Sgd: return 0;
  }
  return 0;
}

/// Note [roofline efficiency]
/// A roofline at datasheet peaks predicts what no kernel reaches. Each op's
/// time is its launch overhead plus the larger of compute and memory time at
/// the *achieved* rates:
///   time = op_overhead + max(flops / (peak_flops * compute_efficiency),
///                            bytes / (memory_bandwidth * memory_efficiency))
/// FLOPs per op, and the kernels backward issues, come from one table for
/// ONNX and ATen ops (Note [flop counts], flops.cpp). A matrix product's
/// efficiency thus depends on its size through the roofline: a product
/// whose operands and result outweigh its arithmetic (attention's
/// per-head products, K = 64-128) runs at the bandwidth's pace. The
/// defaults (DeviceSpec) are 0.5 of peak compute, 0.8 of peak bandwidth
/// and 5 us per op; the GPU presets carry published figures instead (Note
/// [GPU calibration] in planner/cluster/cluster.cpp). A cluster file may
/// set all three per device. On GPUs two more facts of how the kernels run
/// apply (Note [fused element-wise chains]).

/// Note [fused element-wise chains]
/// On a GPU, element-wise arithmetic is bandwidth-bound, so what it costs is
/// the tensors it reads and writes. Training code fuses chains of it into
/// one kernel: Megatron-LM's bias+GeLU and bias+dropout+add (PyTorch JIT)
/// and its scale+mask+softmax kernel, which reads the S x S scores once and
/// writes the probabilities once (Narayanan et al., SC'21, section 4.2;
/// issue 29 brings such kernels to rannc-exec). The analytic model charges
/// on `cuda` devices:
///  - a value made by a point-wise op (arithmetic per element, Dropout, Where)
///    whose every reader is point-wise or a softmax producing as many
///    elements is internal to one fused kernel: neither written by its maker
///    nor read by its readers, and a maker all of whose outputs are internal
///    launches no kernel of its own;
///  - reshapes that only rewrite a shape (Reshape, Flatten, Squeeze, view,
///    ...) move no bytes and launch nothing: PyTorch returns a view.
/// A softmax ends a chain (its output is written: Megatron drops out the
/// probabilities in a kernel of its own); a chain never runs through a
/// matrix product or a normalisation. A fused softmax of 16-bit scores
/// writes 16-bit probabilities (it computes in fp32 in registers, as
/// Megatron's does), where LibTorch's autocast would write fp32: its output,
/// and the point-wise ops reading only such values (the dropout after it),
/// move 2 bytes an element. `cpu` devices keep the op-by-op
/// charges, which the CPU profiles and plans were made with.
namespace {

/// Values (by id) that a fused element-wise kernel keeps in registers (Note [fused element-wise chains]).
std::vector<bool> fusedValues(const ir::Graph &g, const std::vector<OpFlops> &flops, int64_t b) {
  std::vector<int> maker(g.values.size(), -1);
  std::vector<std::vector<int>> readers(g.values.size());
  for (int i = 0; i < int(g.nodes.size()); ++i) {
    for (ir::ValueId v : g.nodes[i].outputs)
      if (v != ir::kNoValue) maker[v] = i;
    for (ir::ValueId v : g.nodes[i].inputs)
      if (v != ir::kNoValue) readers[v].push_back(i);
  }
  auto firstNumel = [&](const ir::Node &n) -> int64_t {
    if (n.outputs.empty() || n.outputs[0] == ir::kNoValue || !g.values[n.outputs[0]].shape_known) return -1;
    return ir::numelAt(g.values[n.outputs[0]].shape, b);
  };
  std::vector<bool> fused(g.values.size(), false);
  for (ir::ValueId v = 0; v < ir::ValueId(g.values.size()); ++v) {
    if (maker[v] < 0 || readers[v].empty() || v == g.loss || !flops[size_t(maker[v])].pointwise) continue;
    if (!g.values[v].shape_known) continue;
    const int64_t elems = ir::numelAt(g.values[v].shape, b);
    bool all = true;
    for (int r : readers[v]) {
      const OpFlops &f = flops[size_t(r)];
      all = all && (f.pointwise || f.softmax) && firstNumel(g.nodes[size_t(r)]) == elems;
    }
    fused[v] = all;
  }
  return fused;
}

/// Note [transposed operands]
/// cuBLAS multiplies a matrix or its transpose alike: each operand of a GEMM
/// carries a transpose flag (cuBLAS's `transa`/`transb`), and PyTorch hands a
/// transposed 2-D view to cuBLAS with the flag instead of copying it (its
/// matmul keeps a transposed contiguous operand as it is). rannc-exec runs an
/// ONNX Transpose as a permuted view (executor/runtime/kernels/tensor_shape.cpp),
/// so on `cuda` devices a transpose of a 2-D value whose every reader is a
/// matrix product moves nothing and launches nothing: the tied output layer's
/// Transpose(word embedding) of a GPT. Higher-rank permutes stay copies: a
/// batched product folds the leading axes with a reshape, which copies a
/// permuted tensor (attention's heads).
std::vector<bool> transposedOperands(const ir::Graph &g, const std::vector<OpFlops> &flops) {
  std::vector<std::vector<int>> readers(g.values.size());
  for (int i = 0; i < int(g.nodes.size()); ++i)
    for (ir::ValueId v : g.nodes[size_t(i)].inputs)
      if (v != ir::kNoValue) readers[size_t(v)].push_back(i);
  auto rank2 = [&](ir::ValueId v) {
    return v != ir::kNoValue && g.values[v].shape_known && g.values[v].shape.size() == 2;
  };
  std::vector<bool> free(g.nodes.size(), false);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const ir::Node &n = g.nodes[i];
    const std::string_view op = atenBaseName(n.op_type);
    if ((op != "Transpose" && op != "t") || n.inputs.empty() || n.outputs.size() != 1 || !rank2(n.inputs[0]) ||
        !rank2(n.outputs[0]) || n.outputs[0] == g.loss || readers[size_t(n.outputs[0])].empty())
      continue;
    bool all = true;
    for (int r : readers[size_t(n.outputs[0])])
      all = all && flops[size_t(r)].cls == OpClass::kMatrix && !flops[size_t(r)].convolution;
    free[i] = all;
  }
  return free;
}

/// Bytes per element each value moves at on a GPU: a fused softmax of 16-bit
/// scores writes 16-bit probabilities, and point-wise ops reading only such
/// values keep that width (Note [fused element-wise chains]); 0: the value's
/// own runtime dtype.
std::vector<int> fusedWidths(const ir::Graph &g, const std::vector<OpFlops> &flops, int64_t b) {
  std::vector<int> width(g.values.size(), 0);
  auto is16 = [&](ir::ValueId v) {
    if (v == ir::kNoValue) return false;
    if (width[v] == 2) return true;
    const ir::DType d = g.values[v].runtimeDType();
    return d == ir::DType::F16 || d == ir::DType::BF16;
  };
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const ir::Node &n = g.nodes[i];
    if (n.inputs.empty() || n.outputs.empty() || n.outputs[0] == ir::kNoValue) continue;
    bool narrow = flops[i].softmax && is16(n.inputs[0]);
    if (flops[i].pointwise && !flops[i].softmax && g.values[n.outputs[0]].shape_known) {
      // The tensor operands (as many elements as the output), not scalars such as Dropout's ratio.
      const int64_t elems = ir::numelAt(g.values[n.outputs[0]].shape, b);
      bool any = false, all = true;
      for (ir::ValueId v : n.inputs) {
        if (v == ir::kNoValue || !ir::isFloating(g.values[v].dtype) || !g.values[v].shape_known ||
            ir::numelAt(g.values[v].shape, b) != elems)
          continue;
        any = true;
        all = all && width[v] == 2;
      }
      narrow = any && all;
    }
    if (narrow && ir::isFloating(g.values[n.outputs[0]].dtype)) width[n.outputs[0]] = 2;
  }
  return width;
}

} // namespace

std::vector<OpCost> estimateOpCosts(const ir::Graph &g, const cluster::DeviceSpec &device,
                                    int64_t micro_batch) {
  std::vector<OpCost> costs(g.nodes.size());
  const double bw = std::max(device.memory_bandwidth * device.memory_efficiency, 1.0);
  const double fp32_peak = std::max(device.peak_flops * device.compute_efficiency, 1.0);
  const bool gpu = device.type == "cuda";
  std::vector<OpFlops> flops(g.nodes.size());
  for (size_t i = 0; i < g.nodes.size(); ++i) flops[i] = opFlops(g, g.nodes[i], micro_batch);
  const std::vector<bool> fused = gpu ? fusedValues(g, flops, micro_batch) : std::vector<bool>(g.values.size());
  const std::vector<int> width = gpu ? fusedWidths(g, flops, micro_batch) : std::vector<int>(g.values.size());
  const std::vector<bool> transposed = gpu ? transposedOperands(g, flops) : std::vector<bool>(g.nodes.size());
  auto movedBytes = [&](ir::ValueId v) {
    if (v == ir::kNoValue || width[v] == 0 || !g.values[v].shape_known) return valueBytes(g, v, micro_batch);
    return ir::numelAt(g.values[v].shape, micro_batch) * width[v];
  };
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const ir::Node &n = g.nodes[i];
    OpCost &c = costs[i];
    bool launches = !gpu; // Note [fused element-wise chains]: a kernel of its own unless every output is fused
    int64_t moved = 0;
    for (ir::ValueId v : n.outputs) {
      c.output_bytes += valueBytes(g, v, micro_batch);
      if (v != ir::kNoValue && fused[v]) continue;
      moved += movedBytes(v);
      launches = true;
    }
    for (ir::ValueId v : n.inputs)
      if (v == ir::kNoValue || !fused[v]) moved += movedBytes(v);
    c.bytes_moved = moved;

    const OpFlops &f = flops[i];
    c.fwd_flops = f.fwd;
    c.bwd_flops = f.bwd;
    double overhead = launches ? device.op_overhead_s : 0.0;
    if (f.cls == OpClass::kHost || (gpu && (f.view || transposed[i]))) { // no kernel, no bytes
      c.bytes_moved = 0;
      overhead = 0;
    }
    // Matrix work runs at the device's fp32 rate, convolutions on CUDA at its
    // TF32 rate: PyTorch lets cuDNN use TF32 by default and keeps cuBLAS at
    // fp32 (torch.backends.cudnn.allow_tf32 / cuda.matmul.allow_tf32).
    // Under autocast (Note [autocast dtypes]) the low-precision ops run at the
    // device's bf16/fp16 rate.
    const ir::DType out = n.outputs.empty() || n.outputs[0] == ir::kNoValue ? ir::DType::Undefined
                                                                            : g.values[n.outputs[0]].runtimeDType();
    const bool lowp = runsInLowPrecision(n) && (out == ir::DType::BF16 || out == ir::DType::F16);
    const double peak =
        lowp ? std::max(device.peakFlops(out == ir::DType::BF16 ? cluster::Precision::kBF16 : cluster::Precision::kFP16) *
                            device.compute_efficiency,
                        1.0)
        : f.convolution && gpu
            ? std::max(device.peakFlops(cluster::Precision::kTF32) * device.compute_efficiency, 1.0)
            : fp32_peak;
    const double bwd_kernels = f.bwd_kernels;
    c.fwd_time_s = overhead + std::max(c.fwd_flops / peak, double(c.bytes_moved) / bw);
    c.bwd_time_s = bwd_kernels * overhead + std::max(c.bwd_flops / peak, 2.0 * double(c.bytes_moved) / bw);
  }
  return costs;
}

std::vector<int> unitOfNode(const ir::Graph &g, const std::vector<Unit> &units) {
  std::vector<int> unit_of(g.nodes.size(), 0);
  for (int u = 0; u < int(units.size()); ++u)
    for (int n = units[u].op_begin; n < units[u].op_end; ++n) unit_of[size_t(n)] = u;
  return unit_of;
}

std::vector<int> lastReaderUnit(const ir::Graph &g, const std::vector<Unit> &units) {
  const std::vector<int> unit_of = unitOfNode(g, units);
  std::vector<int> last(g.values.size(), -1);
  for (size_t n = 0; n < g.nodes.size(); ++n)
    for (ir::ValueId in : g.nodes[n].inputs)
      if (in != ir::kNoValue) last[size_t(in)] = std::max(last[size_t(in)], unit_of[n]);
  return last;
}

std::vector<Unit> formUnits(const ir::Graph &g, int max_ops) {
  // Matrix products, convolutions and attention, in either vocabulary.
  auto heavy = [&g](const ir::Node &node) { return opFlops(g, node, 1).cls == OpClass::kMatrix; };
  const int n = static_cast<int>(g.nodes.size());
  const std::vector<bool> glued = ir::parameterOnlyNodes(g);
  std::vector<Unit> units;
  int begin = 0;
  for (int i = 1; i < n; ++i) {
    if (glued[i - 1]) continue; // never separate a weight-only op from its consumer
    int j = i;                  // the op the glued run starting at i leads into
    while (j < n && glued[j]) ++j;
    if ((j < n && heavy(g.nodes[j])) || i - begin >= max_ops) {
      units.push_back({begin, i});
      begin = i;
    }
  }
  if (n > 0) units.push_back({begin, n});
  return units;
}

UnitCost CostTable::at(int unit, double b) const {
  const size_t k = batch_sizes.size();
  if (k == 1) {
    // One measured size: scale time and activations with the batch.
    UnitCost c = costs[0][unit];
    double f = b / double(batch_sizes[0]);
    return {c.fwd_s * f, c.bwd_s * f, int64_t(double(c.kept_bytes) * f), int64_t(double(c.work_bytes) * f)};
  }
  size_t hi = 1;
  while (hi + 1 < k && double(batch_sizes[hi]) < b) ++hi;
  size_t lo = hi - 1;
  const UnitCost &a = costs[lo][unit], &c = costs[hi][unit];
  double t = (b - double(batch_sizes[lo])) / double(batch_sizes[hi] - batch_sizes[lo]);
  auto lerp = [t](double x, double y) { return std::max(0.0, x + (y - x) * t); };
  return {lerp(a.fwd_s, c.fwd_s), lerp(a.bwd_s, c.bwd_s), int64_t(lerp(double(a.kept_bytes), double(c.kept_bytes))),
          int64_t(lerp(double(a.work_bytes), double(c.work_bytes)))};
}

CostTable analyticCosts(const ir::Graph &g, const std::vector<Unit> &units, const cluster::DeviceSpec &device,
                        const std::vector<int64_t> &batch_sizes) {
  CostTable t;
  t.source = "analytic";
  t.units = units;
  t.batch_sizes = batch_sizes;
  std::vector<int> last_reader(g.values.size(), -1); // node index
  for (int n = 0; n < int(g.nodes.size()); ++n)
    for (ir::ValueId in : g.nodes[n].inputs)
      if (in != ir::kNoValue) last_reader[in] = n;
  const Saved saved = savedForBackward(g);
  // What a stage frees of the outputs a unit keeps for later units (Note
  // [unsaved values] in planner/partition/evaluate.cpp), as the profiler lists it.
  for (ir::ValueId v = 0; v < ir::ValueId(g.values.size()); ++v)
    if (g.values[v].kind == ir::ValueKind::Intermediate && last_reader[v] >= 0 && !saved.value[v])
      t.unsaved_values.push_back(v);
  for (int64_t b : batch_sizes) {
    auto ops = estimateOpCosts(g, device, b);
    std::vector<UnitCost> row;
    for (const Unit &u : units) {
      UnitCost c;
      int64_t largest = 0, handed = 0;
      for (int i = u.op_begin; i < u.op_end; ++i) {
        c.fwd_s += ops[i].fwd_time_s;
        c.bwd_s += ops[i].bwd_time_s;
        largest = std::max(largest, ops[i].output_bytes);
        // Note [what autograd saves]: saved, or kept for a later unit.
        const auto &outs = g.nodes[i].outputs;
        for (ir::ValueId v : outs) {
          if (v == ir::kNoValue) continue;
          if (saved.value[v] || last_reader[v] >= u.op_end) c.kept_bytes += valueBytes(g, v, b);
          if (last_reader[v] >= u.op_end && ir::isFloating(g.values[v].dtype)) handed += valueBytes(g, v, b);
        }
        if (saved.recorded[i]) c.kept_bytes += savedExtraBytes(g, g.nodes[i], b, device.type == "cuda");
      }
      // Backward materialises roughly one gradient per kept activation, the
      // largest of them at a time, while the gradients of the unit's outputs
      // that later units read are alive (as the profiler measures them).
      c.work_bytes = largest + handed;
      row.push_back(c);
    }
    t.costs.push_back(std::move(row));
  }
  // Optimizer: an elementwise pass over parameters, gradients and state.
  t.optimizer_s_per_param = 4.0 * 4 / std::max(device.memory_bandwidth * device.memory_efficiency, 1.0);
  return t;
}

} // namespace rannc::cost
