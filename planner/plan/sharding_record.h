// The sharding analysis in the plan's graph (proto Graph.sharding, Value and
// OpOutput shard_axis): written for plans with a tensor-parallel stage, read
// back by check and the re-estimating verbs (docs/plan-format.md).
#pragma once

#include "plan.pb.h"
#include "planner/ir/ir.h"
#include "planner/sharding/sharding.h"
#include "planner/support/status.h"

namespace rannc::plan {

/// Records `a`, the analysis of `g` (whose graphToProto is `out`), in `out`.
void recordSharding(const ir::Graph &g, const sharding::Analysis &a, proto::Graph &out);

/// Whether the plan's graph records a sharding.
bool hasSharding(const proto::Graph &graph);

/// The recorded sharding as an Analysis of `g` (graphFromProto of `graph`,
/// so value ids are `g`'s); errors name the graph.sharding field at fault.
Expected<sharding::Analysis> shardingFromProto(const proto::Graph &graph, const ir::Graph &g);

} // namespace rannc::plan
