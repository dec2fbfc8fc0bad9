// The rannc-plan verbs that look at a plan beside its run: compare and
// report (kept apart from main.cpp's verbs: they only declare flags and call
// planner/driver's compare.h and report.h).
#pragma once

#include <CLI/CLI.hpp>

#include <functional>

#include "planner/support/status.h"

namespace rannc::tools {

/// A verb's subcommand and what runs when it was given.
struct StatusVerb {
  CLI::App *cmd;
  std::function<Status()> run;
};

/// rannc-plan compare PLAN TRACE [--json]
StatusVerb addCompare(CLI::App &app);
/// rannc-plan report PLAN -o plan.html [--trace TRACE]
StatusVerb addReport(CLI::App &app);

} // namespace rannc::tools
