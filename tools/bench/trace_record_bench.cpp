// What rannc-exec --trace adds to each action, measured in one process: the
// trainer's calls of TimelineRecorder (beginStep, action, endStep) with the
// recorder on and off, alternately, in the thread's CPU time (steady on a
// shared machine, Note [CPU time on a shared machine]). Prints one JSON
// line; tools/bench/trace_cost.py turns it into the cost per step of a run.
//
//   trace_record_bench [--actions-per-step 66] [--steps 5000] [--rounds 5]
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "executor/comm/comm.h"
#include "executor/runtime/cpu_clock.h"
#include "executor/train/timeline.h"

namespace {

/// CPU seconds for `steps` steps of `per_step` actions through `rec`.
double runSteps(rannc::train::TimelineRecorder &rec, int steps, int per_step) {
  using Clock = rannc::train::TimelineRecorder::Clock;
  rannc::schedule::Action a{};
  a.kind = rannc::schedule::ActionKind::Forward;
  const double begin = rannc::runtime::threadCpuSeconds();
  for (int s = 0; s < steps; ++s) {
    rec.beginStep(s, Clock::now());
    for (int i = 0; i < per_step; ++i) {
      a.microbatch = i;
      rec.action(a, Clock::now()); // the trainer reads the clock at each action's start
    }
    rec.endStep();
  }
  return rannc::runtime::threadCpuSeconds() - begin;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

} // namespace

int main(int argc, char **argv) {
  CLI::App app{"The cost of rannc-exec --trace's recording per action (tools/bench/trace_cost.py)"};
  int per_step = 66, steps = 5000, rounds = 5;
  app.add_option("--actions-per-step", per_step);
  app.add_option("--steps", steps);
  app.add_option("--rounds", rounds);
  CLI11_PARSE(app, argc, argv);
  auto comm = rannc::comm::createMpiCommunicator(&argc, &argv);
  std::vector<double> on, off;
  for (int r = 0; r < rounds; ++r) {
    // A fresh recorder each round, as each run has one: its vectors grow from empty.
    rannc::train::TimelineRecorder traced("unused.json", *comm, 0, -1), untraced("", *comm, 0, -1);
    off.push_back(runSteps(untraced, steps, per_step));
    on.push_back(runSteps(traced, steps, per_step));
  }
  const double actions = double(steps) * per_step;
  std::printf("{\"actions_per_step\": %d, \"ns_per_action_traced\": %.2f, \"ns_per_action_untraced\": %.2f}\n",
              per_step, median(on) / actions * 1e9, median(off) / actions * 1e9);
  return 0;
}
