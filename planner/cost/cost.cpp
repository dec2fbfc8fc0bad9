#include "planner/cost/cost.h"

#include <algorithm>

namespace rannc::cost {
namespace {

int64_t valueBytes(const ir::Graph &g, ir::ValueId v, int64_t b) {
  if (v == ir::kNoValue) return 0;
  const ir::Value &val = g.values[v];
  if (!val.shape_known) return 0;
  return ir::numelAt(val.shape, b) * ir::dtypeSize(val.dtype);
}

int64_t valueNumel(const ir::Graph &g, ir::ValueId v, int64_t b) {
  if (v == ir::kNoValue || !g.values[v].shape_known) return 0;
  return ir::numelAt(g.values[v].shape, b);
}

/// The contracted dimension of a matrix product: the last dim of input A.
int64_t contractedDim(const ir::Graph &g, const ir::Node &n, int64_t b, bool trans_a) {
  if (n.inputs.empty() || n.inputs[0] == ir::kNoValue) return 0;
  const ir::Value &a = g.values[n.inputs[0]];
  if (!a.shape_known || a.shape.empty()) return 0;
  const ir::Dim &d = trans_a && a.shape.size() >= 2 ? a.shape[a.shape.size() - 2] : a.shape.back();
  return d.at(b);
}

} // namespace

double optimizerStateFactor(const std::string &optimizer) {
  if (optimizer == "adam" || optimizer == "adamw") return 2;
  if (optimizer == "momentum") return 1;
  return 0;
}

std::vector<OpCost> estimateOpCosts(const ir::Graph &g, const cluster::DeviceSpec &device,
                                    int64_t micro_batch) {
  std::vector<OpCost> costs(g.nodes.size());
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const ir::Node &n = g.nodes[i];
    OpCost &c = costs[i];
    int64_t out_numel = 0;
    for (ir::ValueId v : n.outputs) {
      out_numel += valueNumel(g, v, micro_batch);
      c.output_bytes += valueBytes(g, v, micro_batch);
    }
    c.bytes_moved = c.output_bytes;
    for (ir::ValueId v : n.inputs) c.bytes_moved += valueBytes(g, v, micro_batch);

    if (n.op_type == "MatMul" || n.op_type == "Gemm") {
      bool trans_a = false;
      if (auto it = n.attrs.find("transA"); it != n.attrs.end())
        if (const auto *v = std::get_if<int64_t>(&it->second)) trans_a = *v != 0;
      // Each output element is a K-long dot product: 2K FLOPs; backward computes
      // the two input gradients, each as costly as the forward.
      c.fwd_flops = 2.0 * double(out_numel) * double(contractedDim(g, n, micro_batch, trans_a));
      c.bwd_flops = 2 * c.fwd_flops;
    } else if (n.op_type == "Constant" || n.op_type == "Shape" || n.op_type == "Size") {
      c.fwd_flops = 0;
      c.bytes_moved = 0;
    } else {
      // Elementwise-like: a few FLOPs per output element, the same again backward.
      c.fwd_flops = 4.0 * double(out_numel);
      c.bwd_flops = c.fwd_flops;
    }
    double bw = std::max(device.memory_bandwidth, 1.0);
    double peak = std::max(device.peak_flops, 1.0);
    c.fwd_time_s = std::max(c.fwd_flops / peak, double(c.bytes_moved) / bw);
    c.bwd_time_s = std::max(c.bwd_flops / peak, 2.0 * double(c.bytes_moved) / bw);
  }
  return costs;
}

} // namespace rannc::cost
