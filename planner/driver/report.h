// rannc-plan report PLAN -o plan.html: one self-contained page (inline CSS,
// SVG and a few lines of script; nothing fetched) with the plan's summary,
// per-stage table, memory by kind, predicted (and measured) timeline and the
// stage graph (docs/plan-format.md "The plan report").
#pragma once

#include <functional>
#include <ostream>
#include <string>

#include "planner/driver/tooling.h"
#include "planner/support/status.h"

namespace rannc::planner {

struct ReportOptions {
  std::string plan;
  std::string trace;  ///< rannc-exec --trace of a run of the plan; empty: predicted only
  std::string output; ///< the HTML file
  ReestimateOptions reestimate; ///< for the predicted timeline (as simulate's)
};

/// Graphviz DOT text to an SVG document; an error when it cannot (the page
/// then shows the DOT text instead).
using SvgRenderer = std::function<Expected<std::string>(const std::string &dot)>;

/// rannc-plan report PLAN -o plan.html [--trace T.json]
Status runReport(const ReportOptions &opts, const SvgRenderer &render, std::ostream &log);

} // namespace rannc::planner
