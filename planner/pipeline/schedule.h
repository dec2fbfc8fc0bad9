// The one pipeline model: which schedules exist, in what order each stage runs
// its forwards and backwards, how many micro-batches a stage holds at once,
// and the closed-form time of the pipeline phase. The partitioner's evaluator
// and simulator, `rannc-plan show` and the executor's action lists all read
// the schedule from here, so they cannot disagree (tests/planner/pipeline/
// agreement_test.cpp checks that they do not). Torch-free and IR-free: the
// partitioner (numbers only) and the executor's schedule library both link it.
//
// Note [adding a schedule]
// A schedule is added here, in one place:
//   1. a value of `Schedule`, listed in kSchedules (the order searches try
//      them in, and ties go to the first);
//   2. its case in schedule.cpp: scheduleName (the flag and text name),
//      stageOrder (what each stage runs, in order), microbatchesInFlight (the
//      peak of that order: what activation memory scales with) and
//      pipelineTime (the closed-form time of that order);
//   3. at the plan boundary, a value of proto::Schedule (proto/plan.proto)
//      and its case in plan::scheduleToProto (planner/plan/plan.cpp); the rest
//      of the plan code converts through it.
// Everything else follows: the simulator replays stageOrder, the executor's
// action lists (executor/schedule) expand it, evaluate() and show use
// pipelineTime and microbatchesInFlight, option parsing uses parseSchedule.
// The exact DP (planner/partition/dp.cpp, Note [exact stage DP]) splits the
// closed form into its additive and max parts per schedule and needs its own
// case; the DP-vs-exhaustive tests catch a mismatch there. Then extend
// tests/planner/pipeline/agreement_test.cpp's claims of exactness if the new
// closed form is exact on other cases than GPipe's and 1F1B's.
#pragma once

#include <array>
#include <string>
#include <string_view>
#include <vector>

#include "planner/support/status.h"

namespace rannc::pipeline {

/// A pipeline schedule: GPipe fill-drain or PipeDream-flush 1F1B (Note [adding a schedule]).
enum class Schedule { GPipe, OneFOneB };

/// Every schedule, in the order searches try them.
inline constexpr std::array<Schedule, 2> kSchedules = {Schedule::GPipe, Schedule::OneFOneB};

/// "gpipe" / "1f1b": the name flags, plan text, logs and messages use.
const char *scheduleName(Schedule s);

/// The schedules' names as `name` gives them, joined for a message: "gpipe or 1f1b".
std::string scheduleChoices(const char *(*name)(Schedule) = scheduleName);

/// The schedule called `name` (scheduleName's inverse). The error names the
/// choices but not the flag: "must be gpipe or 1f1b (got 'x')"; prefix it.
Expected<Schedule> parseSchedule(std::string_view name);

/// One pass a stage runs: the forward or the backward of one micro-batch.
struct Pass {
  bool forward = true;
  int microbatch = 0;
  bool operator==(const Pass &o) const { return forward == o.forward && microbatch == o.microbatch; }
};

/// The passes stage `stage` of `num_stages` runs in one step of
/// `microbatches` micro-batches, in order: the one order generator.
std::vector<Pass> stageOrder(Schedule s, int stage, int num_stages, int microbatches);

/// The most micro-batches whose forward stage `stage` has run and whose
/// backward it has not, at once: the peak of stageOrder, in closed form (the
/// memory model's in-flight count).
int microbatchesInFlight(Schedule s, int stage, int num_stages, int microbatches);

/// One stage's device time per micro-batch, in pipeline order.
struct StageSlots {
  double forward_s = 0;  ///< receive the inputs, then compute the forward
  double backward_s = 0; ///< receive the output gradients, recompute, compute the backward
};

/// The pipeline phase of a step (before the all-reduce) in closed form.
struct PipelineTime {
  double fill_drain_s = 0;   ///< the sum of every slot: one micro-batch's way through
  double steady_s = 0;       ///< (M-1) x the bottleneck period
  int bottleneck_stage = -1; ///< the first stage with the largest forward + backward slot
  /// fill_drain + steady.
  double total() const { return fill_drain_s + steady_s; }
};

/// The closed-form time of `microbatches` micro-batches through `stages`
/// under `s` (Note [partition cost model] in planner/partition/evaluate.cpp).
PipelineTime pipelineTime(Schedule s, const std::vector<StageSlots> &stages, int microbatches);

} // namespace rannc::pipeline
