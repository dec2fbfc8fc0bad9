// Human and machine summaries of a plan (rannc-plan show), and the derived
// figures (busy time, utilisation, pipeline bubble) other verbs print too.
#pragma once

#include <ostream>
#include <string>

#include "plan.pb.h"

namespace rannc::plan {

/// The per-stage tables (work and memory) and totals, for people.
void printPlanTable(const proto::Plan &plan, std::ostream &os);
/// One JSON object with the keys SPEC.md promises scripts (and more).
void printPlanJson(const proto::Plan &plan, std::ostream &os);
/// `v` with `decimals` digits after the point.
std::string formatFixed(double v, int decimals);
/// The plan's schedule by pipeline::scheduleName ("gpipe", "1f1b"); "unspecified" when it names none.
const char *scheduleName(proto::Schedule s);

/// Device time stage `s` spends computing and receiving in one step:
/// M x (forward slot + backward slot) + its gradient all-reduce.
double stageBusyTime(const proto::Plan &plan, int s);
/// Pipeline bubble: the fraction of the pipeline phase (Note [pipeline
/// bubble] in show.cpp) that a stage's devices sit idle, averaged over stages.
double pipelineBubbleFraction(const proto::Plan &plan);

/// "1.2 MiB", "162.0 KiB", "512 B".
std::string bytesText(double bytes);
/// A duration with its unit, precise enough for small models on fast devices:
/// "2.878 ms", "421 us", "0.421 us", "1.250 s".
std::string timeText(double seconds);

/// The unit a table of durations is printed in: ms, or us when the step is
/// shorter than a millisecond.
struct TimeUnit {
  double per_second = 1e3;
  const char *name = "ms";
};
TimeUnit timeUnitFor(double step_seconds);
/// `seconds` in `unit`, three decimals, no unit: "0.159".
std::string timeIn(double seconds, TimeUnit unit);

} // namespace rannc::plan
