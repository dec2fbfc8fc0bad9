// Per-op cost estimates for the planner. The analytic source: FLOPs
// (flops.h) and bytes moved per op against the device's achieved compute and
// bandwidth (a roofline); measured and file-backed tables share CostTable.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "planner/cluster/cluster.h"
#include "planner/ir/ir.h"
#include "planner/support/status.h"

namespace rannc::cost {

struct OpCost {
  double fwd_flops = 0;
  double bwd_flops = 0;
  int64_t bytes_moved = 0;      ///< inputs read + outputs written, forward
  int64_t output_bytes = 0;     ///< activations this op writes (kept for backward)
  double fwd_time_s = 0;
  double bwd_time_s = 0;
};

/// Costs of every node of `g` at micro-batch size `micro_batch` on `device`.
std::vector<OpCost> estimateOpCosts(const ir::Graph &g, const cluster::DeviceSpec &device,
                                    int64_t micro_batch);

/// The optimizer a plan's memory estimate is for: each keeps its own state per parameter.
enum class Optimizer { Sgd, Momentum, Adam, AdamW };
/// "sgd", "momentum", "adam" or "adamw": the word flags, plans and profiles use.
const char *optimizerName(Optimizer o);
/// Every optimizer's word, in enum order (what --help lists).
std::vector<std::string> optimizerNames();
/// The optimizer called `text`; the error names the choices, not the flag: callers prefix it.
Expected<Optimizer> parseOptimizer(std::string_view text);
/// Bytes of optimizer state per parameter byte (SGD 0, momentum 1, Adam 2).
double optimizerStateFactor(Optimizer optimizer);

/// A unit of work: a contiguous (hence convex) op range of the graph's
/// topological order holding one compute-heavy op and the cheap ops after it.
/// Costs are measured per unit and the partitioner cuts only between units.
struct Unit {
  int op_begin = 0;
  int op_end = 0;
};

/// Groups the graph's ops into units. A unit starts at each compute-heavy op
/// (a matrix product, convolution or attention, Note [flop counts]) together
/// with the weight-only ops glued before it (see ir::sinkParameterOps); cheap
/// runs longer than `max_ops` are split.
std::vector<Unit> formUnits(const ir::Graph &g, int max_ops = 64);

/// The unit of each node of `g` (`units` cover its nodes in order).
std::vector<int> unitOfNode(const ir::Graph &g, const std::vector<Unit> &units);
/// For each value of `g`, the last unit that reads it; -1 where none does.
std::vector<int> lastReaderUnit(const ir::Graph &g, const std::vector<Unit> &units);

/// The cost of one unit at one micro-batch size.
struct UnitCost {
  double fwd_s = 0;
  double bwd_s = 0;
  /// Alive after forward until backward: what autograd saved and the unit's
  /// outputs read later (Note [last use]).
  int64_t kept_bytes = 0;
  int64_t work_bytes = 0; ///< transient peak above the kept bytes during forward + backward
  /// Kept bytes more when its strided inputs (CostTable::strided_values)
  /// arrive contiguous over a cut (Note [received layout] in planner/partition/evaluate.cpp).
  int64_t received_extra_bytes = 0;
};

/// Per-unit costs at several micro-batch sizes, from one source.
struct CostTable {
  std::string source;                   ///< "measured", "analytic" or the profile file
  std::vector<Unit> units;
  std::vector<int64_t> batch_sizes;     ///< ascending
  std::vector<std::vector<UnitCost>> costs; ///< [batch size index][unit]
  double optimizer_s_per_param = 0;     ///< optimizer step time per parameter element
  std::string optimizer;                ///< the optimizer that figure is for
  std::string device_name;              ///< measured tables: the hardware ("NVIDIA H100 80GB HBM3"); else empty
  /// Values that autograd saves nowhere, so a stage holding their maker and
  /// their last reader frees them during forward (Note [last use] in
  /// executor/runtime/stage.h): measured by the profiler for values read in a
  /// later unit, estimated by the analytic source (Note [what autograd saves]).
  std::vector<ir::ValueId> unsaved_values;
  /// Values read in a later unit that the whole graph makes as non-contiguous
  /// views; a stage receives them contiguous (Note [received layout]). Measured only.
  std::vector<ir::ValueId> strided_values;

  /// Cost of `unit` at micro-batch size b: linear between the measured sizes,
  /// extrapolated linearly from the nearest two outside them.
  UnitCost at(int unit, double b) const;
};

/// The analytic source: estimateOpCosts summed per unit at each batch size.
CostTable analyticCosts(const ir::Graph &g, const std::vector<Unit> &units, const cluster::DeviceSpec &device,
                        const std::vector<int64_t> &batch_sizes);

} // namespace rannc::cost
