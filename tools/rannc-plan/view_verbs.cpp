#include "tools/rannc-plan/view_verbs.h"

#include <cstdio>
#include <iostream>
#include <memory>
#include <string>

#include "planner/driver/compare.h"
#include "planner/driver/report.h"
#include "planner/support/files.h"

namespace rannc::tools {
namespace {

/// Graphviz's dot as the report's renderer: DOT in a temporary file, SVG on
/// its stdout.
Expected<std::string> renderWithDot(const std::string &dot) {
  char path[] = "/tmp/rannc-report-XXXXXX";
  const int fd = mkstemp(path);
  if (fd < 0) return Error{"no temporary file for the graph"};
  FILE *f = fdopen(fd, "w");
  fwrite(dot.data(), 1, dot.size(), f);
  fclose(f);
  std::string svg;
  if (FILE *p = popen(("dot -Tsvg " + std::string(path) + " 2>/dev/null").c_str(), "r")) {
    char buf[65536];
    for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) svg.append(buf, n);
    const int rc = pclose(p);
    std::remove(path);
    if (rc != 0) return Error{"graphviz's dot failed or is not installed (Debian's graphviz)"};
    return svg;
  }
  std::remove(path);
  return Error{"cannot run graphviz's dot"};
}

} // namespace

StatusVerb addCompare(CLI::App &app) {
  auto *cmd = app.add_subcommand(
      "compare", "Holds a plan's predictions beside a run's measurements (rannc-exec --trace): per stage and in total, "
                 "time and memory, predicted, measured and their ratio");
  auto o = std::make_shared<planner::CompareOptions>();
  cmd->add_option("plan", o->plan, "plan file (.pb, .pbtxt or .json)")->required();
  cmd->add_option("trace", o->trace, "the trace rannc-exec --trace wrote for a run of the plan")->required();
  cmd->add_flag("--json", o->json, "one JSON object instead of the table");
  return {cmd, [o] { return planner::runCompare(*o, std::cout, std::cerr); }};
}

StatusVerb addReport(CLI::App &app) {
  auto *cmd = app.add_subcommand(
      "report", "Writes one self-contained HTML page of a plan: summary, stages, memory by kind, the predicted "
                "timeline (and the measured one with --trace) and the stage graph");
  auto o = std::make_shared<planner::ReportOptions>();
  cmd->add_option("plan", o->plan, "plan file (.pb, .pbtxt or .json)")->required();
  cmd->add_option("-o,--output", o->output, "the HTML file to write")->required();
  cmd->add_option("--trace", o->trace, "a trace of a run of the plan (rannc-exec --trace): adds the measured timeline "
                                       "and the comparison");
  return {cmd, [o] { return planner::runReport(*o, renderWithDot, std::cerr); }};
}

} // namespace rannc::tools
