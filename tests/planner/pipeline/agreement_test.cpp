// The four readers of the pipeline model agree, for every schedule, stage
// count S <= 6 and micro-batch count M <= 8 (Note [adding a schedule]):
// - the executor's action lists (executor/schedule) run each stage's forwards
//   and backwards in the order the simulator's timeline shows them;
// - the simulated step time equals evaluate()'s closed form wherever the
//   closed form claims to be exact (Note [partition cost model]): GPipe with
//   any per-stage costs, 1F1B with equal stages or one micro-batch, ZB-H1
//   with equal stages and M >= S (Note [zero bubble H1]), ZB-H2 with equal
//   stages and M >= 2S-1 (Note [zero bubble H2]);
// - the micro-batches a stage holds at once in the action list and in the
//   timeline are the count evaluate()'s memory model charges;
// - `rannc-plan show`'s bubble fraction comes from the same pipeline time.
// Changing any one of them alone breaks one of these. Interleaved 1F1B (v
// chunks on each of p ranks) is checked the same way rank by rank, against
// the executor's per-rank action lists (schedule::buildRank), with its closed
// form exact on equal stages (Note [interleaved 1F1B]); rannc-exec does not
// run them yet.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "executor/schedule/schedule.h"
#include "planner/partition/evaluate.h"
#include "planner/partition/simulate.h"
#include "planner/plan/show.h"
#include "planner/plan/plan.h"

namespace rannc {
namespace {

using pipeline::Schedule;

constexpr int kMaxStages = 6;
constexpr int kMaxMicrobatches = 8;

/// S one-block stages on one device each. Equal stages move nothing between
/// them (the slots are then equal too); varied ones differ in compute, cut
/// sizes and links, and stage 1 has two replicas (an all-reduce). An equal
/// stage's W is `w_share` of its backward (0.4: B > W; above 0.5, W > B).
/// `recompute_tp`: every stage recomputes and is 2-way tensor-parallel, its
/// compute all split and one collective a pass (the slots stay equal).
std::pair<partition::Problem, partition::Solution> pipelineCase(Schedule schedule, int S, int M, bool equal,
                                                                int virtual_stages = 1, double w_share = 0.4,
                                                                bool recompute_tp = false) {
  const int P = S / virtual_stages; // pipeline ranks: stage s runs on those of s % P
  partition::Problem p;
  for (int s = 0; s < S; ++s) {
    partition::Block b;
    b.fwd = equal ? partition::Affine{0.5, 0.01} : partition::Affine{0.1 * (s % 3 + 1), 0.01 * (s + 1)};
    b.bwd = equal ? partition::Affine{1.0, 0.02} : partition::Affine{0.3 * ((s + 2) % 4 + 1), 0.015 * (S - s)};
    // The weight gradients' part of it (a split backward's W).
    b.wgrad = equal ? partition::Affine{w_share, 0.02 * w_share} : partition::Affine{0.1 * ((s + 1) % 3 + 1), 0.005 * (S - s)};
    b.param_bytes = 1000;
    b.activation_bytes_per_sample = 10;
    if (recompute_tp) b.tp.fwd = b.fwd, b.tp.bwd = b.bwd, b.tp.collective_bytes_per_sample = 5, b.tp.collectives = 1;
    p.blocks.push_back(b);
  }
  if (recompute_tp) p.tp_degrees = {1, 2};
  for (int i = 0; i <= S; ++i) p.cut_bytes_per_sample.push_back(equal || i == 0 || i == S ? 0 : 40.0 * (i % 2 + 1));
  p.batch_size = 840; // every M <= 8 divides it
  p.devices.count = recompute_tp ? 2 * S : S + 1;
  p.devices.per_node = 2;
  p.devices.memory_bytes = 1e15;
  p.devices.intra_node = {1000, equal ? 0 : 0.002};
  p.devices.inter_node = {200, equal ? 0 : 0.01};
  partition::Solution sol;
  sol.microbatches = M;
  sol.schedule = schedule;
  sol.virtual_stages = virtual_stages;
  for (int s = 0; s < S; ++s)
    sol.stages.push_back({s, s + 1, !equal && s % P == 1 ? 2 : 1, recompute_tp, false, recompute_tp ? 2 : 1});
  return {p, sol};
}

/// "F0 F1 B1 B0 ": the forwards, backwards (B) and weight passes (W) of one rank's timeline.
std::string timelinePasses(const partition::Simulation &sim, int rank) {
  std::string out;
  for (const partition::TimelineEvent &e : sim.timeline)
    if (e.rank == rank && (e.kind == partition::EventKind::Forward || e.kind == partition::EventKind::Backward ||
                           e.kind == partition::EventKind::BackwardWeight))
      out += (e.kind == partition::EventKind::Forward    ? "F"
              : e.kind == partition::EventKind::Backward ? "B"
                                                         : "W") +
             std::to_string(e.microbatch) + " ";
  return out;
}

/// The same for an action list.
std::string actionPasses(const std::vector<schedule::Action> &actions) {
  std::string out;
  for (const schedule::Action &a : actions)
    if (a.kind == schedule::ActionKind::Forward || a.kind == schedule::ActionKind::Backward ||
        a.kind == schedule::ActionKind::BackwardWeight)
      out += (a.kind == schedule::ActionKind::Forward    ? "F"
              : a.kind == schedule::ActionKind::Backward ? "B"
                                                         : "W") +
             std::to_string(a.microbatch) + " ";
  return out;
}

/// The most micro-batches between their forward and backward (a split one's W) at once on one rank's timeline.
int timelineInFlight(const partition::Simulation &sim, int rank, bool split) {
  const partition::EventKind ends = split ? partition::EventKind::BackwardWeight : partition::EventKind::Backward;
  int alive = 0, peak = 0;
  for (const partition::TimelineEvent &e : sim.timeline) {
    if (e.rank != rank) continue;
    if (e.kind == partition::EventKind::Forward) peak = std::max(peak, ++alive);
    if (e.kind == ends) --alive;
  }
  return peak;
}

/// The plan `show` reads: the evaluation's slots, M and the schedule.
proto::Plan planOf(const partition::Solution &sol, const partition::Evaluation &ev) {
  proto::Plan plan;
  plan.set_microbatches(sol.microbatches);
  plan.set_schedule(plan::scheduleToProto(sol.schedule));
  for (const partition::StageCost &c : ev.stages) {
    auto *e = plan.add_stages()->mutable_estimates();
    e->set_fwd_time_s(c.forwardSlot());
    e->set_bwd_time_s(c.backwardSlot());
    e->set_weight_time_s(c.weightSlot());
  }
  return plan;
}

TEST(PipelineAgreement, ActionListsSimulatorClosedFormAndMemoryModel) {
  int exact_cases = 0, w_heavy_cases = 0, recompute_tp_cases = 0;
  for (Schedule schedule : pipeline::kSchedules)
    for (int S = 1; S <= kMaxStages && !pipeline::interleaves(schedule); ++S) // interleaved: below
      for (int M = 1; M <= kMaxMicrobatches; ++M)
        for (bool equal : {true, false}) {
          const std::string where = std::string(pipeline::scheduleName(schedule)) + " S=" + std::to_string(S) +
                                    " M=" + std::to_string(M) + (equal ? " equal" : " varied") + " stages";
          auto [p, sol] = pipelineCase(schedule, S, M, equal);
          const partition::Evaluation ev = partition::evaluate(p, sol);
          ASSERT_TRUE(ev.feasible()) << where << ": " << ev.violations.front();
          auto sim = partition::simulate(p, sol);
          ASSERT_TRUE(sim.ok()) << where << ": " << sim.error().message;

          for (int s = 0; s < S; ++s) {
            const int rank = sol.firstRank(s);
            const std::vector<schedule::Action> actions = schedule::build(schedule, s, S, M);
            EXPECT_EQ(actionPasses(actions), timelinePasses(*sim, rank)) << where << ", stage " << s;
            EXPECT_EQ(schedule::peakMicrobatchesInFlight(actions), ev.stages[s].inflight) << where << ", stage " << s;
            EXPECT_EQ(timelineInFlight(*sim, rank, pipeline::splitsBackward(schedule)), ev.stages[s].inflight)
                << where << ", stage " << s;
          }

          const bool exact = schedule == Schedule::ZBH1   ? equal && M >= S
                             : schedule == Schedule::ZBH2 ? equal && M >= 2 * S - 1
                                                          : schedule == Schedule::GPipe || equal || M == 1;
          if (exact) {
            EXPECT_NEAR(sim->step_time_s, ev.step_time_s, 1e-9 * ev.step_time_s) << where;
            ++exact_cases;
          }
          // A split backward whose W outweighs its B (W = 0.7 of the backward):
          // the stages but the last add max(F, F+B-W) under ZB-H1, max(F,
          // F+B-2W) under ZB-H2, so both replay to M(F+B+W) + (S-1)F.
          if (exact && equal && pipeline::splitsBackward(schedule)) {
            auto [ph, solh] = pipelineCase(schedule, S, M, equal, 1, 0.7);
            auto simh = partition::simulate(ph, solh);
            ASSERT_TRUE(simh.ok()) << where << ", W > B: " << simh.error().message;
            const partition::Evaluation evh = partition::evaluate(ph, solh);
            EXPECT_NEAR(simh->step_time_s, evh.step_time_s, 1e-9 * evh.step_time_s) << where << ", W > B";
            ++w_heavy_cases;
            // Recomputing, tensor-parallel stages (Note [recomputing split
            // backward], Note [split backward of a tensor-parallel stage]):
            // B holds the rebuilt forward and the collective, W halves.
            auto [pr, solr] = pipelineCase(schedule, S, M, equal, 1, 0.4, true);
            const partition::Evaluation evr = partition::evaluate(pr, solr);
            ASSERT_TRUE(evr.feasible()) << where << ", recomputing: " << evr.violations.front();
            EXPECT_DOUBLE_EQ(evr.stages[0].weightSlot(), ev.stages[0].weightSlot() / 2) << where;
            EXPECT_GT(evr.stages[0].recompute_s, 0) << where;
            auto simr = partition::simulate(pr, solr);
            ASSERT_TRUE(simr.ok()) << where << ", recomputing: " << simr.error().message;
            EXPECT_NEAR(simr->step_time_s, evr.step_time_s, 1e-9 * evr.step_time_s) << where << ", recomputing";
            ++recompute_tp_cases;
          }

          // show: the idle share of the pipeline phase, from the same closed form.
          double busy = 0;
          for (const partition::StageCost &c : ev.stages) busy += M * (c.forwardSlot() + c.backwardSlot());
          const double pipe = ev.fill_drain_s + ev.steady_s;
          EXPECT_NEAR(plan::pipelineBubbleFraction(planOf(sol, ev)), 1 - busy / (S * pipe), 1e-12) << where;
        }
  // GPipe and 1F1B x 6 x 8 equal cases, GPipe's 48 varied ones, 1F1B's 6
  // varied ones with M = 1, ZB-H1's equal ones with M >= S: 8+7+6+5+4+3 = 33,
  // ZB-H2's with M >= 2S-1: 8+6+4+2 = 20.
  EXPECT_EQ(exact_cases, 2 * 48 + 48 + 6 + 33 + 20);
  EXPECT_EQ(w_heavy_cases, 33 + 20);
  EXPECT_EQ(recompute_tp_cases, 33 + 20);
}

/// "F0@2 B1@0 ": one rank's forwards and backwards with their stages, on the timeline.
std::string timelineStagePasses(const partition::Simulation &sim, int rank) {
  std::string out;
  for (const partition::TimelineEvent &e : sim.timeline)
    if (e.rank == rank && (e.kind == partition::EventKind::Forward || e.kind == partition::EventKind::Backward))
      out += (e.kind == partition::EventKind::Forward ? "F" : "B") + std::to_string(e.microbatch) + "@" +
             std::to_string(e.stage) + " ";
  return out;
}

/// The most micro-batches of stage `stage` between forward and backward at once on the timeline.
int timelineStageInFlight(const partition::Simulation &sim, int rank, int stage) {
  int alive = 0, peak = 0;
  for (const partition::TimelineEvent &e : sim.timeline) {
    if (e.rank != rank || e.stage != stage) continue;
    if (e.kind == partition::EventKind::Forward) peak = std::max(peak, ++alive);
    if (e.kind == partition::EventKind::Backward) --alive;
  }
  return peak;
}

TEST(PipelineAgreement, InterleavedRankOrderSimulatorClosedFormAndMemoryModel) {
  int exact_cases = 0, cases = 0;
  for (int P = 1; P <= 4; ++P)
    for (int v = 2; v <= 3; ++v)
      for (int M = P; M <= kMaxMicrobatches; M += P)
        for (bool equal : {true, false}) {
          const int S = P * v;
          const std::string where = "interleaved-1f1b p=" + std::to_string(P) + " v=" + std::to_string(v) +
                                    " M=" + std::to_string(M) + (equal ? " equal" : " varied") + " stages";
          auto [p, sol] = pipelineCase(Schedule::Interleaved1F1B, S, M, equal, v);
          p.devices.count = S + 1;
          const partition::Evaluation ev = partition::evaluate(p, sol);
          ASSERT_TRUE(ev.feasible()) << where << ": " << ev.violations.front();
          auto sim = partition::simulate(p, sol);
          ASSERT_TRUE(sim.ok()) << where << ": " << sim.error().message;
          ++cases;
          for (int u = 0; u < P; ++u) {
            const int rank = sol.firstRank(u);
            // The executor's action list for the rank runs the timeline's passes, stage by stage.
            std::string order;
            const std::vector<schedule::Action> actions = schedule::buildRank(Schedule::Interleaved1F1B, u, P, v, M);
            for (const schedule::Action &act : actions)
              if (act.kind == schedule::ActionKind::Forward || act.kind == schedule::ActionKind::Backward)
                order += (act.kind == schedule::ActionKind::Forward ? "F" : "B") + std::to_string(act.microbatch) +
                         "@" + std::to_string(act.stage) + " ";
            EXPECT_EQ(order, timelineStagePasses(*sim, rank)) << where << ", rank " << u;
            EXPECT_EQ(schedule::peakMicrobatchesInFlight(actions),
                      pipeline::rankMicrobatchesInFlight(Schedule::Interleaved1F1B, u, P, v, M))
                << where << ", rank " << u;
            // The rank's peak over its chunks, in closed form, and each chunk's, as evaluate() charges it.
            EXPECT_EQ(timelineInFlight(*sim, rank, false),
                      pipeline::rankMicrobatchesInFlight(Schedule::Interleaved1F1B, u, P, v, M))
                << where << ", rank " << u;
            for (int s = u; s < S; s += P) {
              EXPECT_EQ(sol.firstRank(s), rank) << where << ", stage " << s;
              EXPECT_EQ(timelineStageInFlight(*sim, rank, s), ev.stages[s].inflight) << where << ", stage " << s;
            }
          }
          if (equal) { // v M (f+b) + (p-1)(f+b), the replay exactly
            const double fb = ev.stages[0].forwardSlot() + ev.stages[0].backwardSlot();
            EXPECT_NEAR(ev.step_time_s, (v * M + P - 1) * fb, 1e-9 * ev.step_time_s) << where;
            EXPECT_NEAR(sim->step_time_s, ev.step_time_s, 1e-9 * ev.step_time_s) << where;
            ++exact_cases;
          }
          double busy = 0;
          for (const partition::StageCost &c : ev.stages) busy += M * (c.forwardSlot() + c.backwardSlot());
          proto::Plan plan = planOf(sol, ev);
          plan.set_virtual_stages(v);
          const double pipe = ev.fill_drain_s + ev.steady_s;
          EXPECT_NEAR(plan::pipelineBubbleFraction(plan), 1 - busy / (P * pipe), 1e-12) << where;
          if (equal) {
            EXPECT_NEAR(plan::pipelineBubbleFraction(plan), (P - 1.0) / (v * M + P - 1), 1e-9) << where;
          }
        }
  // p = 1: M 1..8, p = 2: 2,4,6,8, p = 3: 3,6, p = 4: 4,8: 16 per v and kind, v = 2, 3.
  EXPECT_EQ(cases, 2 * 2 * 16);
  EXPECT_EQ(exact_cases, 2 * 16);
}

TEST(PipelineAgreement, InterleavedChunksShareTheirRanksMemoryAndGroups) {
  auto [p, sol] = pipelineCase(Schedule::Interleaved1F1B, 4, 4, true, 2);
  partition::Evaluation ev = partition::evaluate(p, sol);
  ASSERT_TRUE(ev.feasible());
  EXPECT_EQ(sol.devicesUsed(), 2);
  // A rank holds both its chunks: the peak is a rank's (Note [a rank's
  // chunks' memory]: along its order), above either chunk's and at most their sum.
  ASSERT_EQ(ev.rank_peak_memory_bytes.size(), 2u);
  EXPECT_DOUBLE_EQ(ev.peak_memory_bytes, std::max(ev.rank_peak_memory_bytes[0], ev.rank_peak_memory_bytes[1]));
  for (int r = 0; r < 2; ++r) {
    EXPECT_GE(ev.rank_peak_memory_bytes[r],
              std::max(ev.stages[r].memory.total(), ev.stages[r + 2].memory.total()) - 1e-9);
    EXPECT_LE(ev.rank_peak_memory_bytes[r], ev.stages[r].memory.total() + ev.stages[r + 2].memory.total() + 1e-9);
  }
  p.devices.memory_bytes = ev.peak_memory_bytes * 0.99;
  ev = partition::evaluate(p, sol);
  ASSERT_FALSE(ev.feasible());
  EXPECT_NE(ev.violations.front().find("pipeline rank 0 (stages 0, 2) needs"), std::string::npos)
      << ev.violations.front();
  p.devices.memory_bytes = 1e15;
  sol.stages[1].recompute = true; // chunks recompute (rannc-exec runs them, recompute_interleaved_*)
  ev = partition::evaluate(p, sol);
  EXPECT_TRUE(ev.feasible()) << (ev.violations.empty() ? "" : ev.violations.front());
  sol.stages[1].recompute = false;
  // Rank 1's two devices as 2 replicas of stage 1 but one 2-way group of
  // stage 3: a chunk runs in its rank's groups (tp_interleaved_* run them).
  sol.stages[1].replicas = 2;
  sol.stages[3].tensor_parallel = 2;
  ev = partition::evaluate(p, sol);
  ASSERT_FALSE(ev.well_formed);
  EXPECT_TRUE(std::any_of(ev.violations.begin(), ev.violations.end(), [](const std::string &v) {
    return v.find("stage 3 is 2-way tensor-parallel, but it runs in the groups of stage 1, 1-way") !=
           std::string::npos;
  })) << ev.violations.front();
  sol.stages[1].replicas = 1;
  sol.stages[3].tensor_parallel = 1;
  sol.microbatches = 3; // not a multiple of the 2 ranks
  EXPECT_FALSE(partition::evaluate(p, sol).well_formed);
  sol.microbatches = 4;
  sol.stages[3].replicas = 2; // stage 3 runs on stage 1's one device
  EXPECT_FALSE(partition::evaluate(p, sol).well_formed);
}

} // namespace
} // namespace rannc
