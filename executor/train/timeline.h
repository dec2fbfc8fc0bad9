// rannc-exec --trace: what each rank did, action by action, measured, and
// every rank's timeline merged into one Chrome trace / Perfetto file on rank 0,
// in the lanes and names of `rannc-plan simulate --trace` (Note [trace lanes]
// in planner/plan/trace.h).
#pragma once

#include <chrono>
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "executor/comm/comm.h"
#include "executor/schedule/schedule.h"
#include "planner/plan/trace.h"
#include "planner/support/status.h"

namespace rannc::train {

/// The trace kind an action of the schedule is drawn as.
plan::TraceKind traceKindOf(schedule::ActionKind k);

/// Records this rank's actions with their start and end; off (every call
/// returns at once) when no trace file was asked for.
///
/// Note [measured timeline]
/// Recording is a clock read and an append of 32 bytes per action (on a CPU
/// device a read of the thread's CPU clock too, Note [CPU time on a shared
/// machine] in executor/runtime/cpu_clock.h: each action's event carries
/// `cpu_us`); what that costs is measured by tools/bench/trace_cost.py. Each rank's
/// clock starts at a barrier, so the ranks' timelines line up to within the
/// barrier's skew (microseconds on one machine) without synchronized clocks.
/// A receive lasts until the message is in, so time spent waiting for a peer
/// shows inside "recv"; "idle" is only the time between actions (the
/// interpreter's own work, the step's end: waiting for sends, the device).
/// The memory counter is the peak tensor memory so far, after each step.
class TimelineRecorder {
public:
  using Clock = std::chrono::steady_clock;
  /// Collective when `path` is not empty (the barrier of the common origin).
  TimelineRecorder(std::string path, comm::Communicator &comm, int stage, int gpu);
  bool on() const { return !path_.empty(); }
  void beginStep(int64_t step, Clock::time_point start);
  /// An action that ran from `start` to now.
  void action(const schedule::Action &a, Clock::time_point start);
  void endStep();
  /// This rank's events so far, idle gaps included (Note [measured timeline]).
  std::vector<plan::TraceEvent> events() const;
  /// Collective: gathers every rank's events; rank 0 writes the file.
  Status write(std::ostream &log);

private:
  struct Record {
    plan::TraceKind kind;
    int stage; ///< the action's (an interleaved rank runs several)
    int microbatch;
    double start_s, end_s;
    double cpu_s; ///< this thread's CPU time since the previous record (CPU devices; else 0)
  };
  struct StepSpan {
    int64_t step;
    double start_s, end_s;
    int64_t peak_bytes;
    size_t first, last; ///< its records [first, last)
  };
  double since(Clock::time_point t) const { return std::chrono::duration<double>(t - origin_).count(); }

  std::string path_;
  comm::Communicator &comm_;
  int stage_, gpu_;
  Clock::time_point origin_;
  std::vector<Record> records_;
  std::vector<StepSpan> steps_;
  double cpu_mark_s_ = 0; ///< the thread's CPU clock at the last record or step start
};

} // namespace rannc::train
