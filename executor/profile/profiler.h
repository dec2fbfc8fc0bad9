// The measured cost source: runs every unit's forward and backward with the
// executor's own StageRunner on this machine's device, at several micro-batch
// sizes, and measures time (median of repetitions after warm-up) and tensor
// memory: on cpu with the thread's CPU clock (one thread) and the counting allocator, on cuda with
// CUDA events and the caching allocator's statistics (Note [profiling a GPU]).
#pragma once

#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "planner/cluster/device_kind.h"
#include "planner/cost/cost.h"
#include "planner/cost/precision.h"
#include "planner/ir/ir.h"
#include "planner/support/status.h"

namespace rannc::profile {

struct ProfileOptions {
  std::vector<int64_t> batch_sizes{1, 2, 4, 8};
  int warmup = 1;
  int repetitions = 3;           ///< timed runs per unit and size; the median is kept
  double single_run_s = 0.2;     ///< a unit whose warm-up took longer is timed once
  int threads = 1;               ///< intra-op threads, as rannc-exec uses per rank
  cost::Optimizer optimizer = cost::Optimizer::Adam; ///< whose step time to measure (Adam, else SGD)
  cost::Precision precision = cost::Precision::FP32; ///< bf16/fp16: measure under autocast (Note [autocast dtypes])
  cluster::DeviceKind device = cluster::DeviceKind::Cpu; ///< cuda: this process's CUDA device `gpu`
  int gpu = 0;
};

/// Measures `units` of `g` with seeded random parameters (time and memory do
/// not depend on the values, so the model's weights are never read).
/// Progress goes to `progress`: a bar on a terminal, plain lines otherwise.
/// On cuda the table's device_name is the GPU's name; without a usable GPU
/// it is an error saying why.
Expected<cost::CostTable> measureUnits(const ir::Graph &g, const std::vector<cost::Unit> &units,
                                       const ProfileOptions &opts, std::ostream &progress);

} // namespace rannc::profile
