// The ONNX backend conformance runner behind `rannc-conformance`: every test
// case (a folder with model.onnx and test_data_set_*/{input,output}_*.pb) goes
// through the same import path and kernels as training, and its outputs are
// compared with the reference outputs stored next to it.
#pragma once

#include <optional>
#include <ostream>
#include <string>
#include <vector>

namespace rannc::runtime {

struct ConformanceOptions {
  std::vector<std::string> dirs; ///< searched recursively for test cases
  std::string filter;            ///< run only cases whose name contains this
  bool quiet = false;            ///< print only failures and the summary
  /// Exit 0 when passed / (passed + failed) reaches this; unset: every case must pass.
  std::optional<double> min_pass_rate;
};

enum class CaseOutcome { Pass, Fail, Skip };

struct CaseResult {
  CaseOutcome outcome = CaseOutcome::Fail;
  std::string reason; ///< why it failed or was skipped; empty for a pass
};

/// Runs the test case in folder `dir` (every test_data_set_* in it).
CaseResult runConformanceCase(const std::string &dir);

/// Finds the cases under opts.dirs, runs them in name order and prints one line
/// per case ("PASS node/test_abs", "FAIL node/test_x: why", "SKIP node/test_y:
/// why") and then "N passed, M failed, K skipped" to `out`. Returns the exit
/// status: 0 when the pass rate is met, 1 when not, 2 on a usage error
/// (reported on `err`).
int runConformance(const ConformanceOptions &opts, std::ostream &out, std::ostream &err);

} // namespace rannc::runtime
