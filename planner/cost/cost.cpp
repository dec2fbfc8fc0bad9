#include "planner/cost/cost.h"

#include "planner/cost/flops.h"
#include "planner/cost/precision.h"

#include <algorithm>

namespace rannc::cost {
namespace {

int64_t valueBytes(const ir::Graph &g, ir::ValueId v, int64_t b) {
  if (v == ir::kNoValue) return 0;
  const ir::Value &val = g.values[v];
  if (!val.shape_known) return 0;
  return ir::numelAt(val.shape, b) * ir::dtypeSize(val.runtimeDType()); // Note [autocast dtypes]
}

} // namespace

double optimizerStateFactor(const std::string &optimizer) {
  if (optimizer == "adam" || optimizer == "adamw") return 2;
  if (optimizer == "momentum") return 1;
  return 0;
}

/// Note [roofline efficiency]
/// A roofline at datasheet peaks predicts what no kernel reaches. Each op's
/// time is its launch overhead plus the larger of compute and memory time at
/// the *achieved* rates:
///   time = op_overhead + max(flops / (peak_flops * compute_efficiency),
///                            bytes / (memory_bandwidth * memory_efficiency))
/// FLOPs per op, and the kernels backward issues, come from one table for
/// ONNX and ATen ops (Note [flop counts], flops.cpp). The defaults
/// (DeviceSpec) are 0.5 of peak compute — Megatron-LM's large-GEMM training reaches about half the A100's peak —,
/// 0.8 of peak bandwidth (what streaming kernels reach on HBM and DRAM) and
/// 5 us per op (a CUDA kernel launch; LibTorch's CPU dispatch is of the same
/// order). A cluster file may set all three per device.
std::vector<OpCost> estimateOpCosts(const ir::Graph &g, const cluster::DeviceSpec &device,
                                    int64_t micro_batch) {
  std::vector<OpCost> costs(g.nodes.size());
  const double bw = std::max(device.memory_bandwidth * device.memory_efficiency, 1.0);
  const double fp32_peak = std::max(device.peak_flops * device.compute_efficiency, 1.0);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const ir::Node &n = g.nodes[i];
    OpCost &c = costs[i];
    for (ir::ValueId v : n.outputs) c.output_bytes += valueBytes(g, v, micro_batch);
    c.bytes_moved = c.output_bytes;
    for (ir::ValueId v : n.inputs) c.bytes_moved += valueBytes(g, v, micro_batch);

    const OpFlops f = opFlops(g, n, micro_batch);
    c.fwd_flops = f.fwd;
    c.bwd_flops = f.bwd;
    double overhead = device.op_overhead_s;
    if (f.cls == OpClass::kHost) { // shapes, constants, lists: no kernel, no bytes
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
        : f.convolution && device.type == "cuda"
            ? std::max(device.peakFlops(cluster::Precision::kTF32) * device.compute_efficiency, 1.0)
            : fp32_peak;
    const double bwd_kernels = f.bwd_kernels;
    c.fwd_time_s = overhead + std::max(c.fwd_flops / peak, double(c.bytes_moved) / bw);
    c.bwd_time_s = bwd_kernels * overhead + std::max(c.bwd_flops / peak, 2.0 * double(c.bytes_moved) / bw);
  }
  return costs;
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
  for (int64_t b : batch_sizes) {
    auto ops = estimateOpCosts(g, device, b);
    std::vector<UnitCost> row;
    for (const Unit &u : units) {
      UnitCost c;
      int64_t largest = 0, handed = 0;
      for (int i = u.op_begin; i < u.op_end; ++i) {
        c.fwd_s += ops[i].fwd_time_s;
        c.bwd_s += ops[i].bwd_time_s;
        c.kept_bytes += ops[i].output_bytes;
        largest = std::max(largest, ops[i].output_bytes);
        for (ir::ValueId v : g.nodes[i].outputs)
          if (v != ir::kNoValue && last_reader[v] >= u.op_end && ir::isFloating(g.values[v].dtype))
            handed += valueBytes(g, v, b);
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
