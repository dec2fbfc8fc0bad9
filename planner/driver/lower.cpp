#include "planner/driver/lower.h"

#include <algorithm>

#include "planner/cluster/transfers.h"
#include "planner/cost/flops.h"
#include "planner/cost/precision.h"
#include "planner/ir/batch_norm.h"
#include "planner/ir/weight_gradients.h"
#include "planner/sharding/propagate.h"

namespace rannc::planner {
namespace {

// Note [tensor parallel lowering]
// The sharding analysis (planner/sharding) says which nodes run on slices and
// how each value lies over a group; lowering turns that into each block's
// Block::Split (Note [tensor parallel stages] in planner/partition/evaluate.cpp):
// - compute: the per-sample slope of the unit's fitted fwd/bwd lines, scaled
//   by the split nodes' share of the unit's analytic time above the kernel
//   launch overheads (estimateOpCosts: FLOPs and bytes on the device's
//   roofline, at the largest costed micro-batch), so a measured profile keeps
//   its own totals; the fixed part (launches) does not divide;
// - parameters: those whose sharding has an axis (each device holds 1/t);
//   their low-precision copies in the same proportion;
// - activations and working bytes: the share of the unit's output bytes that
//   its nodes write cut along an axis (a partial sum is full-sized);
//   activations never below what the unit makes unsaved (never split);
// - collectives: a SumOverGroup (forward) or CopyToGroup (backward) all-reduces
//   its value, a GatherAxis all-gathers it, half an all-reduce's traffic; the
//   total over a step, charged half to each pass, goes to the unit of the
//   collective's first reader; a vocabulary-parallel loss all-reduces three
//   float32 values per row of its logits in its forward (the maximum, the sum
//   of exponentials and the target's logit, Note [vocabulary parallelism] in
//   planner/sharding/vocab.cpp), charged the same way to its own unit;
// - cut i is whole unless a float value crossing it is cut or partial.
// A degree is allowed when it divides every cut size and fits a node.

/// Bytes per sample of a value (its size at 8 samples / 8); 0 when unknown.
double perSample(const ir::Value &val) {
  constexpr int64_t kProbe = 8;
  return val.shape_known ? double(ir::numelAt(val.shape, kProbe) * ir::dtypeSize(val.runtimeDType())) / kProbe : 0.0;
}


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

/// Per unit, the sum (or with `largest`, the largest) of `size(v)` over the
/// distinct values of `kind` its ops read.
template <typename SizeFn>
std::vector<int64_t> perUnitSum(const ir::Graph &g, const std::vector<cost::Unit> &units, ir::ValueKind kind,
                                SizeFn size, bool largest = false) {
  std::vector<int> unit_of = cost::unitOfNode(g, units);
  std::vector<int64_t> sums(units.size(), 0);
  std::vector<int> counted_in(g.values.size(), -1); // the last unit that counted the value
  for (ir::NodeId n = 0; n < ir::NodeId(g.nodes.size()); ++n)
    for (ir::ValueId in : g.nodes[n].inputs)
      if (in != ir::kNoValue && g.values[in].kind == kind && counted_in[in] != unit_of[n]) {
        counted_in[in] = unit_of[n];
        int64_t &at = sums[unit_of[n]];
        at = largest ? std::max(at, size(g.values[in])) : at + size(g.values[in]);
      }
  return sums;
}

/// Fills p's tensor-parallel numbers from `a` (Note [tensor parallel
/// lowering]) and checks the pinned degrees; `made` is each unit's unsaved
/// bytes per sample, `crosses` whether a value crosses cuts, `tied_values` the
/// parameter of each of p.tied.
template <typename Crosses>
Status lowerTensorParallel(const ir::Graph &g, const cost::CostTable &costs, const cluster::ClusterSpec &cluster,
                           const PlanOptions &opts, const sharding::Analysis *a, const std::vector<double> &made,
                           Crosses crosses, const std::vector<ir::ValueId> &tied_values, partition::Problem &p) {
  const std::vector<int> degrees = a ? a->degrees(cluster.devices_per_node) : std::vector<int>{1};
  for (int t : opts.tensor_parallel)
    if (std::find(degrees.begin(), degrees.end(), t) == degrees.end()) {
      std::string allowed;
      for (int d : degrees) allowed += (allowed.empty() ? "" : ", ") + std::to_string(d);
      return Error{"--tensor-parallel " + std::to_string(t) + ": " +
                   (!a || !a->any() ? std::string("nothing in the model can be split across devices")
                    : t > cluster.devices_per_node
                        ? "a node has only " + std::to_string(cluster.devices_per_node) + " devices"
                        : "it does not divide the model's split sizes") +
                   " (allowed: " + allowed + ")"};
    }
  p.constraints.tensor_parallel = opts.tensor_parallel;
  if (degrees.size() < 2) return Status::success(); // nothing to split: the problem stays as it was
  p.tp_degrees = degrees;

  const auto &units = costs.units;
  const int n = int(units.size());
  const std::vector<int> unit_of = cost::unitOfNode(g, units);
  const int64_t largest = costs.batch_sizes.back();
  const std::vector<cost::OpCost> ops = cost::estimateOpCosts(g, cluster.device, largest);
  std::vector<double> fwd(n, 0), fwd_split(n, 0), bwd(n, 0), bwd_split(n, 0), out(n, 0), out_split(n, 0);
  for (ir::NodeId v = 0; v < ir::NodeId(g.nodes.size()); ++v) {
    const int u = unit_of[v];
    const bool split = v < ir::NodeId(a->node_split.size()) && a->node_split[v];
    const cost::OpFlops f = cost::opFlops(g, g.nodes[v], largest);
    const double launch = f.cls == cost::OpClass::kHost ? 0.0 : cluster.device.op_overhead_s;
    const double fv = std::max(0.0, ops[v].fwd_time_s - launch), bv = std::max(0.0, ops[v].bwd_time_s - f.bwd_kernels * launch);
    fwd[u] += fv, bwd[u] += bv, out[u] += double(ops[v].output_bytes);
    if (split) fwd_split[u] += fv, bwd_split[u] += bv;
    for (ir::ValueId o : g.nodes[v].outputs)
      if (o != ir::kNoValue && o < ir::ValueId(a->values.size()) && a->values[o].axis >= 0) {
        out_split[u] += double(ops[v].output_bytes);
        break;
      }
  }
  auto share = [](double part, double whole) { return whole > 0 ? std::min(1.0, part / whole) : 0.0; };
  for (size_t i = 0; i < p.tied.size(); ++i) // Note [tied parameters]: a sharded one's bytes divide
    if (tied_values[i] < ir::ValueId(a->values.size()) && a->values[tied_values[i]].axis >= 0)
      p.tied[i].split_bytes = p.tied[i].bytes;
  auto isSplit = [&](const ir::Value &val) {
    const ir::ValueId id = ir::ValueId(&val - g.values.data());
    return id < ir::ValueId(a->values.size()) && a->values[id].axis >= 0;
  };
  const std::vector<int64_t> split_params = perUnitSum(g, units, ir::ValueKind::Parameter, [&](const ir::Value &val) {
    return isSplit(val) ? ir::numelAt(val.shape, 1) : int64_t{0};
  });
  // An unsharded Adam step's temporaries (Note [partition cost model]): the largest of each kind.
  const auto largest_of = [&](bool split) {
    return perUnitSum(g, units, ir::ValueKind::Parameter, [&](const ir::Value &val) {
      return isSplit(val) == split ? ir::numelAt(val.shape, 1) * 4 : int64_t{0};
    }, /*largest=*/true);
  };
  const std::vector<int64_t> largest_kept = largest_of(false), largest_split = largest_of(true);
  for (int u = 0; u < n; ++u) {
    partition::Block &b = p.blocks[u];
    partition::Block::Split &t = b.tp;
    const double f = share(fwd_split[u], fwd[u]), w = share(bwd_split[u], bwd[u]), o = share(out_split[u], out[u]);
    t.fwd = {0, b.fwd.per_sample_s * f};
    t.bwd = {0, b.bwd.per_sample_s * w};
    t.param_bytes = std::min(b.param_bytes, double(split_params[u]) * 4); // float32 parameters
    b.largest_param_bytes = double(largest_kept[u]);
    t.largest_param_bytes = double(largest_split[u]);
    t.lowp_weight_bytes = b.lowp_weight_bytes * share(t.param_bytes, b.param_bytes);
    t.activation_bytes_per_sample = std::max(0.0, std::min(b.activation_bytes_per_sample * o,
                                                           b.activation_bytes_per_sample - made[u]));
    t.working_bytes_per_sample = b.working_bytes_per_sample * o;
    t.working_fixed_bytes = b.working_fixed_bytes * o;
  }
  for (const sharding::Collective &c : a->collectives) {
    if (c.value < 0 || c.value >= ir::ValueId(g.values.size())) continue;
    const ir::Value &val = g.values[c.value];
    const int u = !c.readers.empty() ? unit_of[c.readers.front()] : val.producer >= 0 ? unit_of[val.producer] : -1;
    if (u < 0) continue;
    const double weight = c.kind == sharding::CollectiveKind::GatherAxis ? 0.5 : 1.0;
    p.blocks[u].tp.collective_bytes_per_sample += weight * perSample(val) / 2; // half to each pass
    p.blocks[u].tp.collectives += 0.5;
  }
  for (ir::NodeId v = 0; v < ir::NodeId(g.nodes.size()); ++v) {
    if (sharding::detail::vocabRole(g, a->values, v) != sharding::detail::VocabRole::Loss) continue;
    for (ir::ValueId in : g.nodes[v].inputs) // the logits: the input cut along its class axis 1
      if (in != ir::kNoValue && in < ir::ValueId(a->values.size()) && a->values[in].axis == 1 &&
          g.values[in].shape.size() > 1 && g.values[in].shape[1].isFixed() && g.values[in].shape[1].offset > 0) {
        const ir::Value &logits = g.values[in];
        const double rows = perSample(logits) / double(ir::dtypeSize(logits.runtimeDType()) * logits.shape[1].offset);
        p.blocks[unit_of[v]].tp.collective_bytes_per_sample += 3 * rows * 4 / 2; // half to each pass
        p.blocks[unit_of[v]].tp.collectives += 1.5;
        break;
      }
  }
  const std::vector<int> last_reader = cost::lastReaderUnit(g, units);
  p.cut_whole.assign(n + 1, true);
  for (ir::ValueId v = 0; v < ir::ValueId(g.values.size()); ++v)
    if (crosses(v) && v < ir::ValueId(a->values.size()) && !a->values[v].replicated())
      for (int i = unit_of[g.values[v].producer] + 1; i <= last_reader[v]; ++i) p.cut_whole[i] = false;
  return Status::success();
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
                                            const cluster::ClusterSpec &cluster, const PlanOptions &opts,
                                            const sharding::Analysis *analysis) {
  const auto &units = costs.units;
  const int n = int(units.size());
  partition::Problem p;
  p.batch_size = opts.batch_size;
  std::vector<int64_t> param_counts = unitParameterCounts(g, units);
  const std::vector<int64_t> largest_params = perUnitSum(g, units, ir::ValueKind::Parameter, [](const ir::Value &v) {
    return ir::numelAt(v.shape, 1) * 4; // float32 parameters
  }, /*largest=*/true);
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
    blk.largest_param_bytes = double(largest_params[u]); // lowerTensorParallel keeps the unsplit ones
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
  // Note [zero bubble H1]: a split backward's W in each unit, the weight
  // share of its weight-gradient roots' analytic backward applied to the
  // unit's own, and the gradients of the roots' outputs B keeps for W (a
  // bias Add's own W is B's, Note [weight gradients in B], so a MatMul keeps
  // its output's gradient).
  {
    const std::vector<double> roots = ir::weightGradientRoots(g);
    const std::vector<cost::OpCost> ops = cost::estimateOpCosts(g, cluster.device, largest);
    // Note [what a queued W keeps]: and the inputs the roots' W reads.
    const std::vector<std::vector<ir::ValueId>> reads = ir::weightGradientReads(g);
    std::vector<int> read_in(g.values.size(), -1); // the last unit of a root that read the value
    std::vector<int> root_readers(g.values.size(), 0);
    for (ir::NodeId v = 0; v < ir::NodeId(g.nodes.size()); ++v)
      if (roots[v] > 0)
        for (ir::ValueId in : reads[v]) ++root_readers[in];
    std::vector<double> read_cut(n + 1, 0.0);
    std::vector<double> wgrad(n, 0.0), bwd(n, 0.0);
    for (ir::NodeId v = 0; v < ir::NodeId(g.nodes.size()); ++v) {
      const int u = unit_of[v];
      if (u < 0) continue;
      bwd[u] += ops[v].bwd_time_s;
      if (roots[v] <= 0) continue;
      wgrad[u] += roots[v] * ops[v].bwd_time_s;
      for (ir::ValueId o : g.nodes[v].outputs)
        if (o != ir::kNoValue && ir::isFloating(g.values[o].dtype))
          p.blocks[u].wgrad_bytes_per_sample += perSample(g.values[o]);
      for (ir::ValueId in : reads[v]) { // at its first root reader, and across the cuts to its last
        const ir::Value &val = g.values[in];
        if (read_in[in] < 0) {
          p.blocks[u].wgrad_bytes_per_sample += perSample(val);
          // A float that an earlier unit made and this root alone reads: a
          // stage beginning at this unit holds it once, as the input it
          // received (cut[a]), not again for W (Note [what a queued W keeps]).
          if (root_readers[in] == 1 && val.producer >= 0 && unit_of[val.producer] >= 0 &&
              unit_of[val.producer] < u && ir::isFloating(val.dtype))
            read_cut[u] -= perSample(val);
        } else {
          for (int i = read_in[in] + 1; i <= u; ++i) read_cut[i] += perSample(val);
        }
        read_in[in] = u;
      }
    }
    // And the parameter gradients B makes for W (Note [weight gradients in B]), each in its first reader's unit.
    const std::vector<std::vector<ir::ValueId>> in_b = ir::weightGradientsInB(g);
    std::vector<char> counted(g.values.size(), 0);
    for (ir::NodeId v = 0; v < ir::NodeId(g.nodes.size()); ++v)
      for (ir::ValueId param : in_b[v])
        if (unit_of[v] >= 0 && !counted[param]) {
          counted[param] = 1;
          p.blocks[unit_of[v]].wgrad_param_bytes += double(ir::numelAt(g.values[param].shape, 1)) * 4;
        }
    if (std::any_of(read_cut.begin(), read_cut.end(), [](double x) { return x != 0; }))
      p.wgrad_read_cut_bytes_per_sample = std::move(read_cut);
    for (int u = 0; u < n; ++u) {
      const double share = bwd[u] > 0 ? std::min(1.0, wgrad[u] / bwd[u]) : 0.0;
      p.blocks[u].wgrad = {p.blocks[u].bwd.fixed_s * share, p.blocks[u].bwd.per_sample_s * share};
    }
  }
  std::vector<double> own_out(n, 0.0); // of cut[u+1], what unit u made itself
  auto crosses = [&](ir::ValueId v) {
    const ir::Value &val = g.values[v];
    return val.kind == ir::ValueKind::Intermediate && ir::isFloating(val.dtype) && last_reader[v] >= 0 &&
           !g.nodes[val.producer].inputs.empty(); // not a Constant: those are recomputed
  };
  for (ir::ValueId v = 0; v < ir::ValueId(g.values.size()); ++v) {
    if (!crosses(v)) continue;
    const int a = unit_of[g.values[v].producer];
    const double per_sample = perSample(g.values[v]);
    for (int i = a + 1; i <= last_reader[v]; ++i) p.cut_bytes_per_sample[i] += per_sample;
    if (last_reader[v] > a) own_out[a] += per_sample;
  }
  // Note [values passing over] in planner/partition/evaluate.cpp: each
  // crossing value's stretches between its maker's unit and its readers'
  // that hold a unit reading it nowhere.
  {
    std::vector<std::vector<int>> reader_units(g.values.size());
    for (ir::NodeId v = 0; v < ir::NodeId(g.nodes.size()); ++v)
      for (ir::ValueId in : g.nodes[v].inputs)
        if (in != ir::kNoValue && unit_of[v] >= 0) reader_units[in].push_back(unit_of[v]);
    for (ir::ValueId v = 0; v < ir::ValueId(g.values.size()); ++v) {
      if (!crosses(v)) continue;
      std::vector<int> &rs = reader_units[v];
      std::sort(rs.begin(), rs.end());
      int prev = unit_of[g.values[v].producer];
      for (int r : rs) {
        if (r >= prev + 2) p.pass_over.push_back({prev, r, perSample(g.values[v])});
        prev = std::max(prev, r);
      }
    }
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
  // Note [received layout] in planner/partition/evaluate.cpp: what unit u
  // keeps more when its strided inputs arrive contiguous, at every cut from
  // just after the earliest maker of one of them to u.
  {
    std::vector<int> earliest(n, n);
    for (ir::ValueId v : costs.strided_values) {
      if (v < 0 || v >= ir::ValueId(g.values.size()) || g.values[v].producer < 0)
        return Error{"the profile names value " + std::to_string(v) +
                     ", which this model does not have; re-run rannc-plan profile"};
      const int a = unit_of[g.values[v].producer];
      for (ir::NodeId r = 0; r < ir::NodeId(g.nodes.size()); ++r)
        if (unit_of[r] > a &&
            std::find(g.nodes[r].inputs.begin(), g.nodes[r].inputs.end(), v) != g.nodes[r].inputs.end())
          earliest[unit_of[r]] = std::min(earliest[unit_of[r]], a);
    }
    std::vector<double> layout_cut(n + 1, 0.0);
    bool any = false;
    for (int u = 0; u < n; ++u) {
      const double extra = double(costs.costs.back()[u].received_extra_bytes) / double(largest);
      if (extra <= 0 || earliest[u] >= u) continue;
      for (int i = earliest[u] + 1; i <= u; ++i) layout_cut[i] += extra;
      any = true;
    }
    if (any) p.received_layout_cut_bytes_per_sample = std::move(layout_cut);
  }
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
  // Note [scatter/gather transfers] in evaluate.cpp; rannc-exec reads the same rule from the plan.
  p.devices.scatter_gather = cluster::scatterGatherTransfers(cluster.device.type);
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
  // Note [batch statistics]: exact statistics leave one micro-batch to search,
  // and each BatchNorm's all-reduces over a stage's replicas cost time
  // (Note [partition cost model]): the sums of its C channels and their count
  // (C + 1 floats), then the squared deviations (C), and their gradients back.
  if (opts.exact_batchnorm && ir::hasBatchStatistics(g)) {
    if (opts.microbatches > 1)
      return Error{"--batchnorm exact plans BatchNorm models in one micro-batch; drop --microbatches " +
                   std::to_string(opts.microbatches) + " (or plan with --batchnorm local)"};
    p.constraints.microbatches = 1;
    for (ir::NodeId v = 0; v < ir::NodeId(g.nodes.size()); ++v)
      if (ir::computesBatchStatistics(g.nodes[v]) && unit_of[v] >= 0) {
        partition::Block &b = p.blocks[unit_of[v]];
        b.stat_sync_bytes += double(2 * ir::batchNormChannels(g, g.nodes[v]) + 1) * 4; // float32 sums
        b.stat_sync_collectives += 2;
      }
  }
  p.constraints.power_of_two_replicas = opts.power_of_two_replicas;
  p.constraints.schedule = opts.schedule;
  p.constraints.virtual_stages = opts.virtual_stages;
  // Note [tied parameters] in planner/partition/evaluate.cpp: a parameter
  // several units read, each counting it.
  std::vector<ir::ValueId> tied_values;
  std::vector<std::vector<int>> readers(g.values.size());
  for (ir::NodeId v = 0; v < ir::NodeId(g.nodes.size()); ++v)
    for (ir::ValueId in : g.nodes[v].inputs)
      if (in != ir::kNoValue && g.values[in].kind == ir::ValueKind::Parameter &&
          (readers[in].empty() || readers[in].back() != unit_of[v]))
        readers[in].push_back(unit_of[v]);
  for (ir::ValueId v = 0; v < ir::ValueId(g.values.size()); ++v) {
    std::sort(readers[v].begin(), readers[v].end());
    readers[v].erase(std::unique(readers[v].begin(), readers[v].end()), readers[v].end());
    if (readers[v].size() < 2) continue;
    p.tied.push_back({readers[v], double(ir::numelAt(g.values[v].shape, 1)) * 4, 0.0}); // float32 parameters
    tied_values.push_back(v);
  }
  if (Status st = lowerTensorParallel(g, costs, cluster, opts, analysis, made, crosses, tied_values, p); !st)
    return Error{st.message()};
  // Note [automatic schedule] in planner/partition/dp.cpp: what chunks do not
  // run and the numeric problem does not show (tied weights it does: Problem::tied).
  if (!opts.schedule && opts.exact_batchnorm && ir::hasBatchStatistics(g))
    p.no_interleave = "--batchnorm exact is not run in chunks yet";
  // Note [schedule default]
  // Without --schedule (or with `--schedule auto`) rannc-plan weighs ZB-H1,
  // ZB-H2 and interleaved 1F1B against the 1F1B plan (Note [automatic
  // schedule]); `--schedule 1f1b` searches 1F1B alone, as rannc-plan did
  // by default before. It was opt-in for a while (ba1e5b7): as the default
  // it failed 12 tests, because rannc-exec refused checkpoints of
  // interleaved plans (now saved and resumed: Note [interleaved
  // checkpoints]) and the chosen chunks of three Hugging Face MoE and
  // complex-rotary models cut before a gradient-free value that the receiver
  // made need a gradient (Note [gradient-free values]); the rest were tests
  // of a plan file of one stage per rank, which now pin 1F1B. What still
  // holds: --batchnorm exact never interleaves (no_interleave above), and
  // ZB-H2's measured peak on the memory_split case is up to 1.086x its
  // plan's, its unawaited sends holding what timing allows (docs/
  // partitioner.md, "Memory per schedule, measured").
  p.auto_schedule = opts.auto_schedule;
  if (Status st = partition::validate(p); !st) return Error{st.message()};
  return p;
}

} // namespace rannc::planner
