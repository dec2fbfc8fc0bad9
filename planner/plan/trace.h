// Chrome trace / Perfetto JSON (the "Trace Event Format" that
// chrome://tracing and ui.perfetto.dev open) for predicted timelines.
#pragma once

#include <cstdint>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "planner/support/status.h"

namespace rannc::plan {

/// One complete ("ph": "X") event, or a counter ("ph": "C", `counter` set:
/// `numbers` are its series, `duration_s` unused).
struct TraceEvent {
  int pid = 0; ///< the rank
  int tid = 0;
  std::string name;     ///< "forward 3", "all-reduce", ...
  std::string category; ///< "forward", "backward", "recv", "all-reduce", ...
  double start_s = 0;
  double duration_s = 0;
  std::map<std::string, int64_t> numbers; ///< args shown in the viewer's detail pane
  std::map<std::string, std::string> args;
  bool counter = false;
};

/// Note [trace lanes]
/// The predicted timeline (`rannc-plan simulate --trace`) and the measured
/// one (`rannc-exec --trace`) draw alike, so that one can be held beside the
/// other: one process per rank (pid = rank, named by traceProcessName), one
/// lane (tid 0) in it, and one event per action named by its category and
/// micro-batch ("forward 3", "recv 2" with what = activations, "all-reduce").
/// Both build their events with traceEvent() from a TraceKind; a new kind of
/// action (a backward split into input and weight gradients) is a new
/// TraceKind and a row of kTraceKinds in trace.cpp, and both tools draw it.
/// Memory is a counter ("memory", in bytes) in the same process.
enum class TraceKind {
  Forward,
  Backward,
  BackwardWeight, ///< W: the weight gradients of a split backward (Note [zero bubble H1])
  Recompute,
  RecvActivations,
  RecvGradients,
  SendActivations,
  SendGradients,
  AllReduce,
  Optimizer,
  Idle, ///< nothing recorded: between actions, or waiting outside them
};

/// The category of `k`: "forward", "backward", "recompute", "recv", "send",
/// "all-reduce", "optimizer", "idle".
const char *traceCategory(TraceKind k);

/// The event of `k` on `rank` (running `stage`), of micro-batch `microbatch`
/// (-1: none), over [start_s, start_s + duration_s) (Note [trace lanes]).
TraceEvent traceEvent(TraceKind k, int rank, int stage, int microbatch, double start_s, double duration_s);

/// The counter event of a rank's tensor memory, `bytes` at `at_s`.
TraceEvent memoryCounter(int rank, int stage, double at_s, int64_t bytes);

/// "rank 3 (stage 1)": the process name of a rank's lane.
std::string traceProcessName(int rank, int stage);

/// Writes {"traceEvents": [...], "displayTimeUnit": "ms"}: a process_name
/// metadata event per entry of `process_names` (pid -> name), then the events
/// with ts and dur in microseconds. Deterministic for the same input.
void writeChromeTrace(const std::vector<TraceEvent> &events, const std::map<int, std::string> &process_names,
                      std::ostream &os);

/// A trace as writeChromeTrace writes it, read back: its events (complete
/// and counter events; metadata left out) and process names.
struct Trace {
  std::vector<TraceEvent> events;
  std::map<int, std::string> process_names;
};

/// Reads a Chrome-trace JSON file; `what` names it in errors.
Expected<Trace> readChromeTrace(const std::string &text, const std::string &what);

} // namespace rannc::plan
