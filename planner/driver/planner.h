// The planner's entry points, one per rannc-plan verb. The tool only parses
// flags into these option structs; tests call the same functions in-process.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>

#include "plan.pb.h"
#include "planner/cluster/cluster.h"
#include "planner/ir/ir.h"
#include "planner/support/status.h"

namespace rannc::planner {

struct PlanOptions {
  std::string model;
  std::string output;
  int gpus = 1;
  std::string device_type = "cpu";
  std::optional<int64_t> device_memory;
  int64_t batch_size = 32;
  int microbatches = 1;
  std::string optimizer = "adam"; ///< what the memory estimate assumes
};

/// Imports the model, splits it into one pipeline stage per device, balanced
/// by estimated op cost, and returns the plan (without writing it).
Expected<proto::Plan> makePlan(const PlanOptions &opts, std::ostream &log);

/// Builds a plan for an imported graph: the pure part of makePlan.
Expected<proto::Plan> planGraph(const ir::Graph &g, const cluster::ClusterSpec &cluster,
                                const PlanOptions &opts, const std::string &model_sha256);

/// rannc-plan MODEL ... -o PLAN
Status runPlan(const PlanOptions &opts, std::ostream &out, std::ostream &log);
/// rannc-plan show PLAN [--json]
Status runShow(const std::string &plan_path, bool json, std::ostream &out);
/// rannc-plan import MODEL
Status runImport(const std::string &model_path, std::ostream &out);

} // namespace rannc::planner
