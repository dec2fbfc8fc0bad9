#include "planner/partition/simulate.h"

#include <algorithm>
#include <cstdio>
#include <queue>
#include <tuple>

#include "planner/partition/evaluate.h"

namespace rannc::partition {

const char *eventKindName(EventKind k) {
  switch (k) {
  case EventKind::RecvActivations: return "recv_act";
  case EventKind::Forward: return "fwd";
  case EventKind::RecvGradients: return "recv_grad";
  case EventKind::Recompute: return "recompute";
  case EventKind::Backward: return "bwd";
  case EventKind::BackwardWeight: return "bwd_w";
  case EventKind::AllReduce: return "allreduce";
  }
  return "?";
}

void Simulation::print(std::ostream &os) const {
  char buf[160];
  for (const TimelineEvent &e : timeline) {
    std::snprintf(buf, sizeof buf, "rank %d stage %d %s mb %d [%.6f, %.6f)\n", e.rank, e.stage,
                  eventKindName(e.kind), e.microbatch, e.start_s, e.end_s);
    os << buf;
  }
  std::snprintf(buf, sizeof buf, "step %.6f s\n", step_time_s);
  os << buf;
}

Expected<Simulation> simulate(const Problem &p, const Solution &sol, const SimulateOptions &opts) {
  const Evaluation ev = evaluate(p, sol);
  if (!ev.well_formed) return Error{"cannot simulate a malformed plan: " + ev.violations.front()};
  const int S = sol.numStages(), M = sol.microbatches;
  // Pipeline rank u runs the passes of its stages u, u + P, ... in one order
  // (Note [interleaved 1F1B]); with one chunk per rank, P = S and u is the stage.
  const int v = sol.virtual_stages, P = S / v;

  // Per pipeline rank: its action list, a cursor into it, whether its device
  // is busy; per stage, when each micro-batch's forward / backward finished
  // (-1: not yet).
  std::vector<std::vector<pipeline::Pass>> actions(P);
  std::vector<size_t> cursor(P, 0);
  std::vector<bool> busy(P, false);
  std::vector<std::vector<double>> fwd_done(S, std::vector<double>(M, -1)), bwd_done = fwd_done;
  for (int u = 0; u < P; ++u) actions[u] = pipeline::rankOrder(sol.schedule, u, P, v, M);
  const bool split = pipeline::splitsBackward(sol.schedule);

  Simulation sim;
  auto record = [&](int s, EventKind kind, int mb, double start, double end) {
    if (end <= start) return; // a zero-length phase (nothing to receive) is not an event
    for (int r = 0; r < ev.stages[s].devices(); ++r)
      sim.timeline.push_back({ev.stages[s].first_rank + r, s, kind, mb, start, end});
  };

  // Completion events ordered by (time, sequence number): deterministic ties.
  using Event = std::tuple<double, long, int>; // time, seq, pipeline rank
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> queue;
  long seq = 0;

  // Starts the next action of pipeline rank u at `now` if its input is there.
  auto tryStart = [&](int u, double now) {
    if (busy[u] || cursor[u] == actions[u].size()) return;
    const auto [forward, mb, weight, chunk] = actions[u][cursor[u]];
    const int s = chunk * P + u;
    const StageCost &c = ev.stages[s];
    if (weight) { // W: its B ran on this stage before it, nothing to wait for
      const double t1 = now + c.weightSlot();
      record(s, EventKind::BackwardWeight, mb, now, t1);
      busy[u] = true;
      queue.emplace(t1, seq++, u);
    } else if (forward) {
      if (s > 0 && fwd_done[s - 1][mb] < 0) return;
      // A tensor-parallel stage's collectives are part of its passes (Note [tensor parallel stages]).
      const double t1 = now + c.recv_activations_s, t2 = t1 + c.fwd_s + c.tp_collective_s + c.stat_sync_s;
      record(s, EventKind::RecvActivations, mb, now, t1);
      record(s, EventKind::Forward, mb, t1, t2);
      busy[u] = true;
      queue.emplace(t2, seq++, u);
    } else {
      const double ready = s < S - 1 ? bwd_done[s + 1][mb] : fwd_done[s][mb];
      if (ready < 0) return;
      // Under a split backward this is B: the backward less its W.
      const double t1 = now + c.recv_gradients_s, t2 = t1 + c.recompute_s,
                   t3 = t2 + c.bwd_s + c.tp_collective_s + c.stat_sync_s - (split ? c.weightSlot() : 0);
      record(s, EventKind::RecvGradients, mb, now, t1);
      record(s, EventKind::Recompute, mb, t1, t2);
      record(s, EventKind::Backward, mb, t2, t3);
      busy[u] = true;
      queue.emplace(t3, seq++, u);
    }
  };

  for (int u = 0; u < P; ++u) tryStart(u, 0);
  double drained = 0;
  std::vector<double> stage_end(S, 0);
  while (!queue.empty()) {
    const auto [t, unused_seq, u] = queue.top();
    queue.pop();
    const auto [forward, mb, weight, chunk] = actions[u][cursor[u]];
    const int s = chunk * P + u;
    if (!weight) (forward ? fwd_done : bwd_done)[s][mb] = t;
    busy[u] = false;
    ++cursor[u];
    stage_end[s] = t;
    drained = std::max(drained, t);
    // Whoever may have waited for this: the rank itself, and the one that
    // consumes the result (next stage's forward, previous one's backward).
    tryStart(u, t);
    if (forward && s + 1 < S) tryStart((s + 1) % P, t);
    if (!forward && !weight && s > 0) tryStart((s - 1) % P, t);
  }
  for (int u = 0; u < P; ++u)
    if (cursor[u] != actions[u].size()) return Error{"simulation deadlocked at stage " + std::to_string(u)};

  sim.step_time_s = drained;
  std::vector<double> rank_free(P, 0); // a rank's chunks all-reduce one after the other
  for (int s = 0; s < S; ++s) {
    const double start = std::max(opts.overlap_allreduce ? stage_end[s] : drained, rank_free[s % P]);
    record(s, EventKind::AllReduce, -1, start, start + ev.stages[s].allreduce_s);
    rank_free[s % P] = start + ev.stages[s].allreduce_s;
    sim.step_time_s = std::max(sim.step_time_s, rank_free[s % P]);
  }
  std::stable_sort(sim.timeline.begin(), sim.timeline.end(), [](const TimelineEvent &a, const TimelineEvent &b) {
    return std::tie(a.rank, a.start_s) < std::tie(b.rank, b.start_s);
  });
  return sim;
}

} // namespace rannc::partition
