// The calling thread's CPU time, which the profiler and rannc-exec --trace
// read on CPU devices (Note [CPU time on a shared machine]).
#pragma once

#include <ctime>

namespace rannc::runtime {

/// Note [CPU time on a shared machine]
/// On a CPU device with one intra-op thread (what rannc-exec runs, and what
/// profiles assume by default), all of a unit's work runs on the calling
/// thread. Its wall time then counts the time other processes held the core:
/// at load 12 on 2 cores a loop measured 1.0 s of wall time and 0.13 s of CPU
/// time, the latter steady to 5% from run to run, the former not. So the
/// profiler measures such units in the thread's CPU time: a profile, and the
/// plan made from it, predict a rank that has its core to itself, whatever
/// else ran while profiling. rannc-exec --trace records the same clock beside
/// the wall clock for each compute action, so that `rannc-plan compare` can
/// tell how much of the core the run got (its CPU share) and hold the
/// prediction against the step that share implies (Note [load-normalised step]
/// in planner/driver/compare.h).
/// Seconds of CPU the calling thread has used so far.
inline double threadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

} // namespace rannc::runtime
