// Coarsening: many small units (ops, or runs of ops that must stay together)
// become at most K contiguous blocks for the stage DP, which is exact over
// blocks and whose cost grows with K^2. RaNNC used K <= 32.
#pragma once

#include <vector>

#include "planner/partition/problem.h"
#include "planner/support/status.h"

namespace rannc::partition {

/// Knobs of coarsen().
struct CoarsenOptions {
  int max_blocks = 32;     ///< K
  double samples = 1;      ///< per-replica micro-batch size at which unit times are weighed
  double imbalance = 1.5;  ///< a block may cost up to this times the average (or its largest unit run)
};

/// Blocks made of units, and where each block came from.
struct Coarsening {
  Problem problem;            ///< the units' problem with blocks in place of units (same devices, batch, constraints)
  std::vector<int> unit_begin; ///< blocks+1 entries: block i = units [unit_begin[i], unit_begin[i+1])
};

/// Merges the blocks of `units` (its "blocks" are the units) into
/// min(K, number of allowed pieces) contiguous blocks. Cost of a unit = its
/// share of the total time (at opts.samples) + its share of the parameter
/// bytes; every block costs at most imbalance x the average, and among such
/// splits the one minimising  sum over cuts of cut bytes / largest cut bytes
/// + sum over blocks of (cost / average - 1)^2  is chosen, so cuts land where
/// little data crosses. An infinite cut_bytes_per_sample[i] (0 < i < n) forbids
/// a cut before unit i (e.g. after an op that only transforms a weight), and
/// so does a cut that is not whole when every searched tensor-parallel degree
/// is above 1 (Note [whole cuts in coarsening]).
/// Block numbers: times and bytes add up, working bytes take the maximum.
Expected<Coarsening> coarsen(const Problem &units, const CoarsenOptions &opts = {});

/// The same plan over the units: each stage's block range becomes the unit
/// range it covers (evaluate() gives the same numbers on the units' problem).
Solution expandToUnits(const Coarsening &c, const Solution &blocks);

} // namespace rannc::partition
