// rannc-conformance: runs ONNX backend test cases through rannc's importer and
// kernels. Parses flags and calls runtime::runConformance.
#include <CLI/CLI.hpp>

#include <iostream>

#include "executor/runtime/conformance.h"

int main(int argc, char **argv) {
  CLI::App app{"Runs every ONNX backend test case (a folder with model.onnx and test_data_set_*) found\n"
               "under DIR... through rannc's importer and kernels and compares the outputs.\n"
               "Prints PASS/FAIL/SKIP per case and 'N passed, M failed, K skipped'.",
               "rannc-conformance"};
  rannc::runtime::ConformanceOptions o;
  double rate = -1;
  app.add_option("dirs", o.dirs, "folders searched recursively for test cases")->required();
  app.add_option("--filter", o.filter, "run only cases whose name (e.g. node/test_abs) contains this");
  app.add_flag("--quiet", o.quiet, "print only failures and the summary line");
  app.add_option("--min-pass-rate", rate,
                 "exit 0 when passed/(passed+failed) reaches this fraction (default: all must pass)")
      ->check(CLI::Range(0.0, 1.0));
  CLI11_PARSE(app, argc, argv);
  if (rate >= 0) o.min_pass_rate = rate;
  return rannc::runtime::runConformance(o, std::cout, std::cerr);
}
