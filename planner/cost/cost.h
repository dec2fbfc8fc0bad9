// Per-op cost estimates for the planner. For now one analytic source: FLOPs
// and bytes moved per op against the device's peak compute and bandwidth (a
// roofline). Measured and file-backed sources arrive with the cost-model work.
#pragma once

#include <cstdint>
#include <vector>

#include "planner/cluster/cluster.h"
#include "planner/ir/ir.h"

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

/// Bytes of optimizer state per parameter byte (SGD 0, momentum 1, Adam 2).
double optimizerStateFactor(const std::string &optimizer);

} // namespace rannc::cost
