// Chrome trace / Perfetto JSON (the "Trace Event Format" that
// chrome://tracing and ui.perfetto.dev open) for predicted timelines.
#pragma once

#include <cstdint>
#include <map>
#include <ostream>
#include <string>
#include <vector>

namespace rannc::plan {

/// One complete ("ph": "X") event.
struct TraceEvent {
  int pid = 0; ///< the rank
  int tid = 0;
  std::string name;     ///< "forward 3", "all-reduce", ...
  std::string category; ///< "forward", "backward", "recv", "all-reduce", ...
  double start_s = 0;
  double duration_s = 0;
  std::map<std::string, int64_t> numbers; ///< args shown in the viewer's detail pane
  std::map<std::string, std::string> args;
};

/// Writes {"traceEvents": [...], "displayTimeUnit": "ms"}: a process_name
/// metadata event per entry of `process_names` (pid -> name), then the events
/// with ts and dur in microseconds. Deterministic for the same input.
void writeChromeTrace(const std::vector<TraceEvent> &events, const std::map<int, std::string> &process_names,
                      std::ostream &os);

} // namespace rannc::plan
