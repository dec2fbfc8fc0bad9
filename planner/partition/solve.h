// Solvers over the numeric Problem. All return a Solution together with the
// step time they claim for it, which `evaluate` reproduces; infeasible problems
// are an Error naming the memory the smallest stage would need.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "planner/partition/problem.h"
#include "planner/support/status.h"

namespace rannc::partition {

/// How to partition: the exact DP, or a baseline rule for the stage boundaries.
enum class Strategy {
  Auto,       ///< solveDP
  Uniform,    ///< equal block counts per stage
  Parameters, ///< balance parameter bytes (DeepSpeed's "parameters" method)
  Time,       ///< balance forward+backward time (torchgpipe's balance_by_time)
};

/// "auto", "uniform", "parameters", "time".
const char *strategyName(Strategy s);
/// Parses a strategy name; the error lists the valid names.
Expected<Strategy> parseStrategy(const std::string &name);

/// One schedule the automatic search weighed (Note [automatic schedule] in dp.cpp).
struct ScheduleTried {
  enum class Outcome {
    Chosen,   ///< its plan is the answer
    Slower,   ///< searched; its best plan was slower than the answer
    Bounded,  ///< not searched: a lower bound on its plans could not beat the answer
    Refused,  ///< not legal for this problem (interleaving per-stage degrees or tied weights, splitting a
              ///< parameter two ops read...)
    TooLarge, ///< not searched: the search would exceed the automatic search's budget (pin it to search it)
    NoPlan,   ///< searched; nothing fits
  };
  Schedule schedule = Schedule::OneFOneB;
  int virtual_stages = 1;
  Outcome outcome = Outcome::Chosen;
  double step_time_s = 0; ///< Chosen, Slower: its best plan's step; Bounded: the bound; else 0
  /// For every outcome but Chosen: one line; Chosen: empty, or how far it
  /// was searched (a split schedule at one stage count, Note [automatic schedule]).
  std::string why;
};

/// "chosen", "slower", "bounded", "refused", "too-large", "no-plan".
const char *outcomeName(ScheduleTried::Outcome o);

/// What a solver did, for logs and benchmarks (not part of the answer).
struct SolveStats {
  int microbatch_counts = 0;        ///< candidates considered
  int microbatch_counts_pruned = 0; ///< skipped by a lower bound without a full DP
  int64_t states = 0;               ///< DP states that held at least one partial plan
  int64_t transitions = 0;          ///< (state, stage) pairs examined
  int64_t points = 0;               ///< partial plans kept on Pareto fronts
  int64_t allreduce_thresholds = 0; ///< DP passes: one per all-reduce threshold per micro-batch count
  int64_t solutions = 0;            ///< exhaustive: complete solutions evaluated
  double bound_seconds = 0;         ///< DP: backward (lower-bound) passes
  double seconds = 0;               ///< all of it
  int device_quantum = 1;           ///< DP: the coarsest stage-width quantum of a micro-batch count (1: every width)
  double lower_bound_s = 0;         ///< DP: no plan over every stage width beats this (the step time when exact)
  /// DP with the schedule searched: every schedule weighed, in kSchedules
  /// order (interleaved by chunk count), and what became of it.
  std::vector<ScheduleTried> schedules;
};

/// Knobs of solveDP (Note [device quantum] in dp.cpp).
struct DPOptions {
  /// States a micro-batch count may use; above it stage widths go in
  /// multiples of a quantum (a power of two, or of whole nodes).
  int64_t max_states = int64_t{1} << 25;
  int device_quantum = 0; ///< 0: the finest within max_states; else this one
  /// DP states the automatic schedule search may spend on each schedule it
  /// weighs after 1F1B (Note [automatic schedule] in dp.cpp).
  int64_t auto_states = int64_t{1} << 24;
  std::function<void(const std::string &)> progress; ///< one line per phase of a search, or none
  /// What the search is about to do, for a heartbeat (Note [progress lines] in planner/driver/progress.h), or none.
  std::function<void(const std::string &)> doing;
};

/// A solver's answer: the plan and the step time it predicts for it.
struct SolveResult {
  Solution solution;
  double step_time_s = 0; ///< the solver's own figure; evaluate() reproduces it
  SolveStats stats;
};

/// The exact DP: over (blocks placed, stages left, devices used) it picks each
/// stage's block range, replica count and recomputation, for every searched
/// micro-batch count and schedule, minimising evaluate()'s step time.
/// Where `opts` restricts stage widths, stats.lower_bound_s bounds what the
/// unrestricted search could find.
Expected<SolveResult> solveDP(const Problem &p, const DPOptions &opts = {});

/// Enumerates every solution in the DP's search space and keeps the best by
/// evaluate(). For small problems (tests); refuses when more than
/// `max_solutions` complete plans would be scored.
Expected<SolveResult> solveExhaustive(const Problem &p, int64_t max_solutions = 50'000'000);

/// A baseline rule for the boundaries; stages and replicas from the
/// constraints, else S = min(blocks, devices) stages of floor(devices / S)
/// replicas (trimmed to the fewest giving the same per-replica micro-batch);
/// the micro-batch count chosen by evaluate(), 1F1B unless pinned;
/// recomputation on every stage only if nothing fits without it.
Expected<SolveResult> solveBaseline(const Problem &p, Strategy strategy);

/// solveDP for Auto, solveBaseline otherwise.
Expected<SolveResult> solve(const Problem &p, Strategy strategy);

} // namespace rannc::partition
