// A discrete-event simulation of one training step of a Solution: every stage
// runs its passes in the schedule's order (pipeline::stageOrder), each as soon
// as its device is free and its input has arrived, with the durations
// evaluate() computes; then the replica groups all-reduce. It checks the
// closed form in evaluate.cpp against an event-by-event replay and yields the
// per-rank timeline for traces.
#pragma once

#include <ostream>
#include <vector>

#include "planner/partition/problem.h"
#include "planner/support/status.h"

namespace rannc::partition {

/// What a device is doing during one timeline interval.
enum class EventKind { RecvActivations, Forward, RecvGradients, Recompute, Backward, BackwardWeight, AllReduce };

/// "recv_act", "fwd", "recv_grad", "recompute", "bwd", "bwd_w" (a split backward's W), "allreduce".
const char *eventKindName(EventKind k);

/// One interval of one rank's timeline.
struct TimelineEvent {
  int rank = 0;
  int stage = 0;
  EventKind kind = EventKind::Forward;
  int microbatch = -1; ///< -1 for AllReduce
  double start_s = 0;
  double end_s = 0;
};

/// Knobs of the replay.
struct SimulateOptions {
  /// false (the model evaluate() uses): all groups all-reduce after the whole
  /// pipeline has drained. true: each group starts as soon as its own stage
  /// has finished its last backward (what an asynchronous executor could do).
  bool overlap_allreduce = false;
};

/// The replayed step.
struct Simulation {
  double step_time_s = 0; ///< the last event's end
  std::vector<TimelineEvent> timeline; ///< sorted by (rank, start)

  /// One line per event: "rank 0 stage 0 fwd mb 3 [0.012000, 0.019000)".
  void print(std::ostream &os) const;
};

/// Replays one step of `s`. Errors only when the solution is malformed
/// (memory overflows do not stop a simulation).
Expected<Simulation> simulate(const Problem &p, const Solution &s, const SimulateOptions &opts = {});

} // namespace rannc::partition
