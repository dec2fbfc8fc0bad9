// Internal helpers shared by the solvers (not part of the library's API).
#pragma once

#include <vector>

#include "planner/partition/problem.h"
#include "planner/support/status.h"

namespace rannc::partition::detail {

/// The schedules a solver must search: the pinned one, or both.
std::vector<Schedule> schedulesToSearch(const Problem &p);

/// The stage counts a solver must search, ascending: the pinned one, the
/// length of a per-stage replica list, or 1..min(blocks, devices).
std::vector<int> stageCountsToSearch(const Problem &p);

/// Stage widths a quantized search may use (Note [device quantum] in dp.cpp),
/// ascending: 1, the powers of two below devices.per_node, then per_node
/// times 1, 2, 4, ... up to the device count; only those dividing every
/// pinned replica count, and only powers of two when the replicas must be.
/// `only` > 0: that one if it qualifies, else 1.
std::vector<int> deviceQuanta(const Problem &p, int only = 0);

/// The error for a problem with no feasible solution: the memory the smallest
/// stage holding the hardest block would need versus a device's capacity.
Error noFeasiblePlan(const Problem &p);

} // namespace rannc::partition::detail
