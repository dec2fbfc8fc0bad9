// Graphviz view of a plan (rannc-plan dot): ops grouped by stage, the edges
// that cross stages labelled with what they carry per micro-batch.
#pragma once

#include <ostream>
#include <utility>
#include <vector>

#include "plan.pb.h"
#include "planner/ir/ir.h"

namespace rannc::plan {

struct DotOptions {
  /// Op ranges [begin, end) drawn as one node each (the planner's units, split
  /// at the stage boundaries), for graphs too large to draw op by op; empty:
  /// one node per op. Every range must lie inside one stage.
  std::vector<std::pair<int, int>> groups;
};

/// Writes a `digraph` with one `subgraph cluster_N` per stage (labelled with
/// its ranks); edges between stages carry the bytes of the values sent per
/// micro-batch (shapes at B / microbatches samples), or "recomputed" for
/// values the receiving stage rebuilds itself. `g` is the plan's graph
/// (graphFromProto) and `plan` must be structurally sound.
void printPlanDot(const proto::Plan &plan, const ir::Graph &g, const DotOptions &opts, std::ostream &os);

} // namespace rannc::plan
