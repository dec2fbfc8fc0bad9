// Contiguous balanced partitioning: the skeleton's stage splitter. A pure
// function over numbers; it never sees the graph.
#pragma once

#include <vector>

#include "planner/support/status.h"

namespace rannc::partition {

/// Splits `costs` into `k` contiguous, non-empty ranges minimising the largest
/// range sum. Returns k+1 boundaries b with range i = [b[i], b[i+1]).
Expected<std::vector<int>> balancedSplit(const std::vector<double> &costs, int k);

} // namespace rannc::partition
