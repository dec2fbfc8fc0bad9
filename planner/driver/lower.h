// Lowering for the partitioner: Graph + unit costs + cluster + options become
// the plain numeric partition::Problem the solvers see (they never see the IR).
#pragma once

#include "planner/cluster/cluster.h"
#include "planner/cost/cost.h"
#include "planner/driver/planner.h"
#include "planner/ir/ir.h"
#include "planner/partition/problem.h"
#include "planner/sharding/sharding.h"
#include "planner/support/status.h"

namespace rannc::planner {

/// One block per unit: forward/backward time fitted as fixed + per-sample
/// (least squares over the cost table's batch sizes), the parameters the unit
/// reads first, kept and working bytes per sample; the cut between units i-1
/// and i carries every floating-point activation made before unit i and read
/// at or after it (integer values and constants are recomputed, Note
/// [recomputed values], and data inputs are read locally, so they cost nothing).
/// With the sharding `analysis` of `g`, each block also gets its
/// tensor-parallel parts and the problem the degrees it may take (Note
/// [tensor parallel lowering]); without it, or when nothing can be cut, every
/// stage keeps degree 1 and a pinned degree above 1 is an error.
Expected<partition::Problem> lowerToProblem(const ir::Graph &g, const cost::CostTable &costs,
                                            const cluster::ClusterSpec &cluster, const PlanOptions &opts,
                                            const sharding::Analysis *analysis = nullptr);

/// Parameter elements each unit reads, a parameter counted once in every unit
/// that reads it: a shared (tied) parameter is held, with its gradient and
/// optimizer state, by every stage that reads it. (Conservative when one stage
/// holds several of its readers; rangeParameterCount is exact for a stage.)
std::vector<int64_t> unitParameterCounts(const ir::Graph &g, const std::vector<cost::Unit> &units);

/// Bytes of the buffers (Note [buffers] in ir.h) each unit reads, counted like parameters.
std::vector<int64_t> unitBufferBytes(const ir::Graph &g, const std::vector<cost::Unit> &units);

/// Distinct parameter elements the ops [op_begin, op_end) read.
int64_t rangeParameterCount(const ir::Graph &g, int op_begin, int op_end);

} // namespace rannc::planner
