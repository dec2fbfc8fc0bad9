#include "planner/driver/lower.h"

#include <algorithm>

#include "planner/cost/precision.h"

namespace rannc::planner {
namespace {

/// Least-squares line through (b_i, y_i), clamped to non-negative terms.
partition::Affine fit(const std::vector<int64_t> &bs, const std::vector<double> &ys) {
  const size_t n = bs.size();
  if (n == 1) return {0, ys[0] / double(std::max<int64_t>(1, bs[0]))};
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (size_t i = 0; i < n; ++i) {
    sx += double(bs[i]);
    sy += ys[i];
    sxx += double(bs[i]) * double(bs[i]);
    sxy += double(bs[i]) * ys[i];
  }
  double slope = (double(n) * sxy - sx * sy) / (double(n) * sxx - sx * sx);
  slope = std::max(0.0, slope);
  double fixed = std::max(0.0, (sy - slope * sx) / double(n));
  return {fixed, slope};
}

/// An affine bound on measured bytes: the secant from the smallest to the
/// largest size, raised until no measured point lies above it. Working bytes
/// are not proportional to the batch: a parameter's gradient is made whole
/// before it is added to .grad, at any batch size.
partition::Affine upperFit(const std::vector<int64_t> &bs, const std::vector<double> &ys) {
  const size_t n = bs.size();
  if (n == 1) return {0, ys[0] / double(std::max<int64_t>(1, bs[0]))};
  const double slope = std::max(0.0, (ys[n - 1] - ys[0]) / double(bs[n - 1] - bs[0]));
  double fixed = 0;
  for (size_t i = 0; i < n; ++i) fixed = std::max(fixed, ys[i] - slope * double(bs[i]));
  return {fixed, slope};
}

/// Per unit, the sum of `size(v)` over the distinct values of `kind` its ops read.
template <typename SizeFn>
std::vector<int64_t> perUnitSum(const ir::Graph &g, const std::vector<cost::Unit> &units, ir::ValueKind kind,
                                SizeFn size) {
  std::vector<int> unit_of = cost::unitOfNode(g, units);
  std::vector<int64_t> sums(units.size(), 0);
  std::vector<int> counted_in(g.values.size(), -1); // the last unit that counted the value
  for (ir::NodeId n = 0; n < ir::NodeId(g.nodes.size()); ++n)
    for (ir::ValueId in : g.nodes[n].inputs)
      if (in != ir::kNoValue && g.values[in].kind == kind && counted_in[in] != unit_of[n]) {
        counted_in[in] = unit_of[n];
        sums[unit_of[n]] += size(g.values[in]);
      }
  return sums;
}

} // namespace

std::vector<int64_t> unitParameterCounts(const ir::Graph &g, const std::vector<cost::Unit> &units) {
  return perUnitSum(g, units, ir::ValueKind::Parameter, [](const ir::Value &v) { return ir::numelAt(v.shape, 1); });
}

std::vector<int64_t> unitBufferBytes(const ir::Graph &g, const std::vector<cost::Unit> &units) {
  return perUnitSum(g, units, ir::ValueKind::Buffer,
                    [](const ir::Value &v) { return ir::numelAt(v.shape, 1) * ir::dtypeSize(v.dtype); });
}

int64_t rangeParameterCount(const ir::Graph &g, int op_begin, int op_end) {
  std::vector<bool> seen(g.values.size(), false);
  int64_t count = 0;
  for (int n = std::max(0, op_begin); n < op_end && n < int(g.nodes.size()); ++n)
    for (ir::ValueId in : g.nodes[n].inputs)
      if (in != ir::kNoValue && g.values[in].kind == ir::ValueKind::Parameter && !seen[in]) {
        seen[in] = true;
        count += ir::numelAt(g.values[in].shape, 1);
      }
  return count;
}

Expected<partition::Problem> lowerToProblem(const ir::Graph &g, const cost::CostTable &costs,
                                            const cluster::ClusterSpec &cluster, const PlanOptions &opts) {
  const auto &units = costs.units;
  const int n = int(units.size());
  partition::Problem p;
  p.batch_size = opts.batch_size;
  std::vector<int64_t> param_counts = unitParameterCounts(g, units);
  std::vector<int64_t> buffer_bytes = unitBufferBytes(g, units);
  const int64_t largest = costs.batch_sizes.back();
  for (int u = 0; u < n; ++u) {
    std::vector<double> fwd, bwd, work;
    for (size_t k = 0; k < costs.batch_sizes.size(); ++k) {
      fwd.push_back(costs.costs[k][u].fwd_s);
      bwd.push_back(costs.costs[k][u].bwd_s);
      work.push_back(double(costs.costs[k][u].work_bytes));
    }
    partition::Block blk;
    blk.fwd = fit(costs.batch_sizes, fwd);
    blk.bwd = fit(costs.batch_sizes, bwd);
    blk.param_bytes = double(param_counts[u]) * 4; // float32 parameters
    blk.buffer_bytes = double(buffer_bytes[u]);
    if (opts.precision != cost::Precision::FP32) // Note [autocast dtypes]
      blk.lowp_weight_bytes = double(cost::lowPrecisionWeightBytes(g, units[u].op_begin, units[u].op_end));
    const cost::UnitCost &at_largest = costs.costs.back()[u];
    blk.activation_bytes_per_sample = double(at_largest.kept_bytes) / double(largest);
    const partition::Affine working = upperFit(costs.batch_sizes, work);
    blk.working_fixed_bytes = working.fixed_s;
    blk.working_bytes_per_sample = working.per_sample_s;
    p.blocks.push_back(blk);
  }
  // Cuts: a float activation made in unit a and last read in unit z crosses
  // every cut a+1 .. z (it is sent straight to each consumer stage).
  const std::vector<int> unit_of = cost::unitOfNode(g, units);
  const std::vector<int> last_reader = cost::lastReaderUnit(g, units);
  p.cut_bytes_per_sample.assign(n + 1, 0.0);
  std::vector<double> own_out(n, 0.0); // of cut[u+1], what unit u made itself
  auto crosses = [&](ir::ValueId v) {
    const ir::Value &val = g.values[v];
    return val.kind == ir::ValueKind::Intermediate && ir::isFloating(val.dtype) && last_reader[v] >= 0 &&
           !g.nodes[val.producer].inputs.empty(); // not a Constant: those are recomputed
  };
  constexpr int64_t kProbe = 8; // bytes per sample from the size at 8 samples
  auto perSample = [&](const ir::Value &val) {
    return val.shape_known ? double(ir::numelAt(val.shape, kProbe) * ir::dtypeSize(val.runtimeDType())) / kProbe : 0.0;
  };
  for (ir::ValueId v = 0; v < ir::ValueId(g.values.size()); ++v) {
    if (!crosses(v)) continue;
    const int a = unit_of[g.values[v].producer];
    const double per_sample = perSample(g.values[v]);
    for (int i = a + 1; i <= last_reader[v]; ++i) p.cut_bytes_per_sample[i] += per_sample;
    if (last_reader[v] > a) own_out[a] += per_sample;
  }
  // Values that autograd saves nowhere go at their last use inside a stage,
  // though each unit, measured alone, kept its own (Note [unsaved values] in
  // planner/partition/evaluate.cpp): X_i and fr_i from the profile's list. A
  // value its maker's kept bytes cannot hold (a view of what it received) is
  // left counted, as partition::validate asks.
  std::vector<double> unsaved_cut(n + 1, 0.0), made(n, 0.0);
  for (ir::ValueId v : costs.unsaved_values) {
    if (v < 0 || v >= ir::ValueId(g.values.size()))
      return Error{"the profile names value " + std::to_string(v) +
                   ", which this model does not have; re-run rannc-plan profile"};
    if (!crosses(v)) continue;
    const int a = unit_of[g.values[v].producer];
    const double per_sample = perSample(g.values[v]);
    if (last_reader[v] <= a || made[a] + per_sample > p.blocks[a].activation_bytes_per_sample) continue;
    made[a] += per_sample;
    for (int i = a + 1; i <= last_reader[v]; ++i) unsaved_cut[i] += per_sample;
    p.blocks[last_reader[v]].unsaved_freed_bytes_per_sample += per_sample;
  }
  if (!costs.unsaved_values.empty()) p.unsaved_cut_bytes_per_sample = std::move(unsaved_cut);
  // A unit's working bytes include the gradients of its own outputs (the
  // profiler hands them over as a stage does). The gradients of the values
  // that pass over it, made by a later unit for an earlier one, wait in
  // autograd for their producer all through its backward: add them
  // (Note [partition cost model] in planner/partition/evaluate.cpp).
  for (int u = 0; u < n; ++u)
    p.blocks[u].working_bytes_per_sample += std::max(0.0, p.cut_bytes_per_sample[u + 1] - own_out[u]);

  p.devices.count = cluster.worldSize();
  p.devices.per_node = cluster.devices_per_node;
  p.devices.memory_bytes = double(cluster.device.memory_bytes);
  p.devices.memory_margin = opts.memory_margin;
  p.devices.reserve_bytes = double(cluster.device.runtime_reserve_bytes);
  p.devices.intra_node = {cluster.intra_node.bandwidth, cluster.intra_node.latency_s};
  p.devices.inter_node = {cluster.inter_node.bandwidth, cluster.inter_node.latency_s};
  p.optimizer_bytes_per_param_byte = cost::optimizerStateFactor(opts.optimizer);
  // Activation recomputation (Note [recomputation] in executor/runtime/stage.h):
  // auto lets the DP choose it per stage where activations would not fit.
  p.allow_recompute = opts.recompute != Recompute::Off;
  p.force_recompute = opts.recompute == Recompute::On;
  p.allow_zero = opts.zero != Zero::Off;
  p.force_zero = opts.zero == Zero::On;
  p.constraints.stages = opts.stages;
  p.constraints.replicas = opts.replicas;
  p.constraints.microbatches = opts.microbatches;
  p.constraints.power_of_two_replicas = opts.power_of_two_replicas;
  p.constraints.schedule = opts.schedule;
  if (Status st = partition::validate(p); !st) return Error{st.message()};
  return p;
}

} // namespace rannc::planner
