// rannc-plan compare PLAN TRACE: the plan's predictions beside what
// rannc-exec --trace measured, per stage and in total (docs/figures.md).
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "plan.pb.h"
#include "planner/plan/trace.h"
#include "planner/support/status.h"

namespace rannc::planner {

/// What a measured trace says of one stage: medians over its ranks and the
/// steps kept (Note [measured figures]). Forwards and backwards are the
/// stage's own actions; the per-step figures and the peak are its ranks',
/// which an interleaved rank's chunks share (Note [comparing an interleaved
/// run] in compare.cpp).
struct MeasuredStage {
  int stage = 0;
  int ranks = 0;
  double forward_s = 0;   ///< per micro-batch
  double backward_s = 0;  ///< per micro-batch, recomputation included
  double allreduce_s = 0; ///< per step
  double optimizer_s = 0; ///< per step
  double recv_s = 0;      ///< per step: receiving, waiting for the peer included
  double send_s = 0;      ///< per step
  double idle_s = 0;      ///< per step
  double compute_s = 0;   ///< per step: forward, backward (recomputation included) and all-reduce
  double compute_cpu_s = 0; ///< the same in the thread's CPU time (0: not recorded, a GPU run or an older trace)
  int64_t peak_bytes = 0; ///< max over the stage's ranks
};

/// A measured run, reduced.
struct MeasuredRun {
  int ranks = 0;
  int64_t first_step = 0, last_step = 0; ///< the steps kept
  int64_t steps_in_trace = 0;
  double step_s = 0; ///< median over the kept steps of the span over all ranks
  /// CPU time over wall time of every rank's forwards, backwards and
  /// optimizer steps (0: not recorded; Note [load-normalised step]).
  double cpu_share = 0;
  std::vector<MeasuredStage> stages;
};

/// Note [load-normalised step]
/// A CPU plan from a measured profile predicts ranks that have a core each
/// (Note [CPU time on a shared machine] in executor/runtime/cpu_clock.h). On
/// a machine where other work holds cores, each rank computes only part of
/// the wall time; its compute actions record both clocks, and their CPU time
/// over their wall time is the share of a core the run got. Where every
/// rank got about the same share, everything in the step stretches by its
/// inverse (a receive waits for a peer that computes as slowly), so the
/// measured step times the share is the step the ranks would have taken on
/// cores of their own: the "step time on own cores" row, which is held
/// against the prediction where the plain step time cannot be. Where the
/// ranks' shares differ much, it is an estimate; the share is printed. Where
/// the share is small, each hand-over of a micro-batch likely also waits for
/// the receiving rank's next time slice, which the share does not scale away:
/// the estimate comes out long (ratios 0.87-0.91 at shares 0.09-0.14, while
/// each stage's compute in CPU time agreed within 6%; docs/figures.md).
/// Reduces a trace of rannc-exec --trace.
///
/// Note [measured figures]
/// The first step is left out when there are others: it allocates what later
/// steps reuse, and fills caches. A step's time is its span over all ranks,
/// from the first action's start to the last one's end (what a user waits);
/// per-stage figures are medians over the stage's ranks and the kept steps,
/// so one slow step on a shared machine does not move them.
Expected<MeasuredRun> measureTrace(const plan::Trace &trace, const std::string &what);

/// Reads `trace_path` and reduces it, refusing a run of another layout than
/// `plan`'s (`plan_path` names it in errors).
Expected<MeasuredRun> measurePlanRun(const proto::Plan &plan, const std::string &plan_path,
                                     const std::string &trace_path);

/// One line of the comparison.
struct CompareRow {
  std::string stage; ///< "0", "1", ... or "all"
  std::string what;  ///< "forward per micro-batch", "peak memory", "step time", ...
  double predicted = 0, measured = 0;
  bool bytes = false; ///< else seconds
  /// predicted / measured (as tools/cost_accuracy.py); 0 when either is 0.
  double ratio() const { return predicted > 0 && measured > 0 ? predicted / measured : 0.0; }
};
/// The plan's estimates beside the run's figures, per stage and in total.
std::vector<CompareRow> compareRows(const proto::Plan &plan, const MeasuredRun &run);

struct CompareOptions {
  std::string plan;
  std::string trace; ///< from rannc-exec --trace
  bool json = false;
};
/// rannc-plan compare PLAN TRACE: predicted, measured and their ratio
/// (predicted / measured, as tools/cost_accuracy.py) per stage and in total.
Status runCompare(const CompareOptions &opts, std::ostream &out, std::ostream &log);

} // namespace rannc::planner
