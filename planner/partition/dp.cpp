// The exact stage DP. See Note [exact stage DP] below and docs/partitioner.md.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <numeric>
#include <optional>
#include <vector>

#include "planner/partition/evaluate.h"
#include "planner/partition/solve.h"
#include "planner/partition/solver_common.h"
#include "planner/partition/stage_table.h"

namespace rannc::partition {
namespace {

// Note [exact stage DP]
// For one micro-batch count M and schedule, the step time of a plan is
//   T = V + Psi,  V = A + w . C
//     A   = sum_s (F_s + G_s)                        (additive over stages)
//     C   = 1F1B: (max (F+G)),        w = (M-1)
//           GPipe: (max F, max G),    w = (M-1, M-1)
//     Psi = max_s AR_s                               (all-reduce after the drain)
// (Note [partition cost model]). Every per-stage number depends only on the
// stage's own blocks, replicas, tensor-parallel degree t, recomputation,
// first rank (link placement, and whether its t-device groups lie inside
// nodes: Note [tensor parallel stages]) and number of stages after it (1F1B
// memory), so the state
//   (k = stages still to place, a = blocks placed, d = devices used)
// holds everything a later stage needs. Because V mixes a sum with maxima it
// is not a shortest path; each state keeps the Pareto front of its partial
// plans over (A, C). A partial plan y can be swapped for x in any completion
// without increasing V when x.A + w sum_i max(0, x.C_i - y.C_i) <= y.A (a
// completion adds the same A' to both and takes max(C_i, C'_i): the C_i
// where x is worse cost at most w times the excess, at small C'). This is
// stronger than dominance in every coordinate (which it implies): with w =
// M-1 large, a plan a little slower at its bottleneck stays only if it saves
// w times as much in the sum (GPT 18.4B on 256 devices, 256 blocks: 79 M
// front points inserted before, 64 M after); the fronts lose nothing.
//
// Psi is handled by thresholds instead, because keeping it on the fronts
// multiplies their size (replica counts trade all-reduce time against compute
// everywhere): run the DP with every stage's AR < tau, starting at tau = inf;
// take the plan X with the least V (ties: least Psi); every plan with Psi in
// [Psi_X, tau) has V >= V_X and so T >= V_X + Psi_X; record X and continue
// with tau = Psi_X. Plans are only dropped when they cannot beat the best T
// found (below), so the loop is exact over the search space (contiguous
// ranges, replica counts from replicaCandidates, tensor-parallel degrees from
// tpCandidates (a stage of r replicas and degree t taking r t devices),
// recomputation per stage,
// every stage count and micro-batch count) and stops when no plan is left.
//
// Exact reductions that keep it fast:
// - A backward pass computes, per state, lower bounds on what any completion
//   adds: LB_A (min sum), LB_C (min of each maximum), LB_Psi. A partial
//   plan's maxima are clamped up to LB_C of its state (the final maximum is at
//   least that anyway), merging plans that differ only below the unavoidable
//   bottleneck; a partial plan with A + LB_A + w . max(C, LB_C) + LB_Psi >= the
//   best T found is dropped (every plan it stands for is at least as bad).
// - Recomputation is tried for a stage only when the stage does not fit
//   without it (it only adds time), and GPipe only when pinned: for the same
//   stages and M, 1F1B's closed form is never slower (max(F+G) <= max F +
//   max G) and it keeps no more micro-batches in flight.
// - The best baseline plan (inside the search space up to recomputation it
//   does not need, which only makes it slower) seeds the best T; micro-batch
//   counts are visited in order of their lower bound and skipped whole when
//   that bound cannot beat the best T.

// Note [split backward DP]
// Under a schedule that splits the backward (ZB-H1, Note [zero bubble H1] in
// planner/pipeline/schedule.h) a stage's memory depends on its index s and
// the stage count S, not on the stages after it alone: min(M, S) micro-batches
// in flight on every stage, and the W queue min(M-1, s). So solveDP runs the
// search once per stage count with S pinned, where k (stages still to place)
// is exact and s = S - k; the best plan over the counts wins. The closed form
// (pipeline::pipelineTime) stays additive: with M >= S every stage but the
// last (k = 1) takes min(G, 2W) off the sum A (it adds max(F, F+G-2W), not
// F+G), G its backward slot as placed, and the bottleneck term C is 1F1B's.
// ZB-H2 (Note [zero bubble H2]) is searched the same way: min(M, 2S-1) in
// flight, the W queue min(M-1, 2s), and with M >= 2S-1 every stage but the
// last takes min(G, 3W) off A (it adds max(F, F+G-3W) in place of F+G), G
// its backward slot as placed (StageVals::g); the bound passes, which know
// no G, credit 2W or 3W, which is never less. With M < 2S-1 the credit is
// ZB-H1's.
// Two of the exact reductions change with it:
//   - a stage that does not fit at k may fit at another k (its W queue is
//     another length, and a queued micro-batch holds less or more than a
//     waiting one: Note [what a queued W keeps] in evaluate.cpp), so the
//     lower-bound pass does not stop at the first misfit, and where the
//     stage count is open (the bound per stage count) a stage fits if it
//     fits at some queue length (queueFor, memoryChoice);
//   - a stage's floor (Note [stage floor]) is (M-1) times its slot, since
//     the fill and drain may take less than a stage's slot (each stage adds
//     at least its F, the last its F + G).
// Recomputation and tensor-parallel degrees are searched as under 1F1B. A
// recomputing stage's G holds its rebuilt forward (B = recomputation + input
// gradients, W unchanged: Note [recomputing split backward] in evaluate.cpp),
// and it adds F + max(0, G - cW) to A, which never falls as G grows, so
// recomputation still only costs time and is tried only where a stage does
// not fit without it. A tensor-parallel stage's collectives are in F and B,
// and its W divides by the degree as its backward does (Note [split backward
// of a tensor-parallel stage]), so the credit's W is the placed stage's
// (StageTable::weightTime at its degree). The DP against exhaustive search
// under ZB-H1 and ZB-H2, recomputation and degrees drawn:
// tests/planner/partition/solver_test.cpp.
//
// Note [device quantum]
// The states grow with the devices: (kmax+1)(n+1)(D+1), e.g. 129 x 257 x 1025
// = 34 M for 256 blocks on 1024 devices at M = 128, about 2 GB and minutes
// of bound passes. Above a budget of states (DPOptions::max_states), a
// micro-batch count's search is restricted to stage widths in multiples of a
// quantum q, and d counts quanta: (D/q + 1) instead of (D + 1). q is the
// finest of 1, 2, 4, ... per_node, 2 per_node, 4 per_node ... that fits the
// budget (detail::deviceQuanta; where replicas are pinned, one that divides
// every pinned width, replicas times the pinned degree), so small problems
// stay exact; a quantum of
// a node or more also starts every stage on a node boundary. The replica
// counts are those of replicaCandidates whose stage width (replicas times
// the tensor-parallel degree) is a multiple of q, so the restricted plans
// are a subset of the exact space: never better than its optimum (with
// Note [ring all-reduce bandwidth] a wider ring can beat a narrower one at the
// same micro-batch size, so widths outside the exact space must stay out).
// Filtering the width rather than the replicas keeps Megatron's shapes, such
// as 6 replicas of 8-way groups, when q is a node.
//
// The loss is bounded, not guessed: a relaxation on the same states (d in
// quanta) lets every stage take any replica count of replicaCandidates,
// advance d by floor(r / q) quanta only, later stages need no quantum, and
// each of a stage's numbers is its least over the eight placements. Every
// plan of the exact space maps onto a path of the relaxation (its d stays
// at most floor(devices used / q), every number at most the real one), so
// the relaxation's optimum is a lower bound on the exact one. It is solved
// with the same machinery, pruned by the plan found: whatever it finds below
// that plan lowers the bound, and when it finds nothing the plan found is
// optimal over every stage width. SolveStats::lower_bound_s holds it; the
// driver prints the gap and stores it in the plan's planner string. The
// bound is loose where plans of many narrow stages matter (a stage of fewer
// than q replicas is free in the relaxation): it states at most the loss.
//
// Speed (solveDP): a micro-batch count with at most min(kWarmStates,
// max_states) states at every width is bounded and searched exactly as
// before. A larger one is bounded on the relaxation at the finest quantum
// within max_states / 8 states (cheap, and a bound over every width, so a
// count it prunes needs no relaxation pass later), searched there first (a
// good plan early prunes the finer search: GPT 18.4B on 256 devices, 106 s
// for M=64 at quantum 2 from the baseline's step, 9 s after a pass at 8),
// then at its quantum, and last bounded by the relaxation at its quantum.

// Note [work bound]
// The backward pass bounds A, each maximum and Psi apart, each by its own
// best completion, and the relaxation of Note [device quantum] lets stages
// narrower than a quantum take no devices: both bounds miss that the same D
// devices do all the work. With x_s = w . C_s + AR_s >= 0 and the stage
// widths summing to at most D,
//   w . max_s C_s + max_s AR_s >= max_s x_s >= sum_s x_s width_s / D,
// so T >= sum_s (A_s + x_s width_s / D): additive over stages, a shortest
// path over (stage-count class, blocks placed) with no device axis (dropping
// the devices' limit only admits more paths). The limit comes back as a
// price: for any mu >= 0, sum_s width_s <= D gives
//   T >= sum_s (A_s + x_s width_s / D + mu width_s) - mu D,
// a shortest path again; workBound() takes the best of a few prices (GPT
// 18.4B at M=1: 5.60 s unpriced, 52.9 s priced). It pays where the device
// axis is long; on a few devices the backward pass is as cheap, so solveDP
// takes it only from kWorkBoundDevices devices (GPT 1.7B on 32, a search of
// 3 s of CPU without it, took 47 s of wall clock under load with it). Each stage is costed at its
// least over placements and ring bandwidths, its memory choice as in the DP.
// It trades a stage's own slot against its device-seconds, which the
// separate bounds cannot: on GPT 18.4B (256 devices, the best plan 6.22 s)
// the bound of M=64 rose from 3.16 s to 5.71 s. workBound() costs
// O(K n E |T| |R|), without the factor D of the backward pass, so it is
// taken first, at every all-reduce threshold; the backward pass also keeps
// the same sum per state on its device axis (lb_w_), used at the source.
// Being a bound only, it changes no plan, only what is searched.

// Note [stage floor]
// Whatever the schedule, a stage's devices run the forward and backward of
// all M micro-batches one after another, and the step ends with the largest
// all-reduce: in the closed forms of Note [exact stage DP],
// T = A + w . C + Psi >= a_s + w . c_s + AR_s = M (F_s + G_s) + AR_s for each
// stage s. StageTable::stageFloor bounds that from below per (range,
// replicas, degree), wherever the stage sits: no receives, no recomputation,
// the ring on the intra-node link (no ring is faster). Once a plan of step
// T* is known, a stage whose floor is not below T* cannot be in a better
// plan, so every pass (the backward bounds, the work bound, the forward
// search and the relaxation of Note [device quantum], whose paths use the
// same stages) leaves it out: their bounds then hold for every plan below
// T*, which is all the pruning against T* asks of them. The floor never
// falls as a range grows, so a range whose least floor over degrees and
// replicas reaches T* ends the scan of longer ones. This is what prunes
// (range, degree, replicas) before the DP sees them: with M large, w = M-1
// makes a narrow or long stage hopeless at once (GPT 18.4B: a stage's slot
// must stay under T*/M, 0.1 s at M=64 for T* = 6.2 s). Exact: only plans no
// better than T* lose stages.

using detail::StageVals;

constexpr double kInf = std::numeric_limits<double>::infinity();
// About 70 bytes a state (bounds and an empty front): 2^25 states ~ 2.3 GB.
constexpr int64_t kMaxStates = int64_t{1} << 25;
// Counts above this many states are bounded on the relaxation and searched
// at a coarser quantum first (Note [device quantum]).
constexpr int64_t kWarmStates = int64_t{1} << 20;
// Problems on fewer devices skip MicrobatchDP::workBound (Note [work bound]).
constexpr int kWorkBoundDevices = 128;

struct Point {
  double a;
  double c[2];
  double psi; // the partial plan's largest all-reduce (not a front coordinate)
  int32_t prev_state;
  int32_t prev_point;
  bool recompute;
  bool zero;
  int16_t tp; // the stage's tensor-parallel degree
};

class MicrobatchDP : private detail::StageTable {
public:
  /// `quantum` > 1: stage widths in multiples of it, d counted in quanta;
  /// `relaxed`: the relaxation of Note [device quantum] instead.
  MicrobatchDP(const Problem &p, int microbatches, Schedule schedule, const std::vector<int> &stage_counts,
               int quantum = 1, bool relaxed = false)
      : StageTable(p, microbatches, schedule, quantum, relaxed) {
    w_[0] = w_[1] = M_ - 1;
    if (p.constraints.replicas.size() > 1) per_stage_ = &p.constraints.replicas;
    if (p.constraints.tensor_parallel.size() > 1) per_stage_tp_ = &p.constraints.tensor_parallel;
    // Note [stage count classes]: k counts the stages still to place only as
    // far as a stage's cost depends on it. 1F1B keeps min(M, k) micro-batches
    // in flight, GPipe M, so unless the stage count is pinned the states with
    // k >= M (1F1B) or k >= 1 (GPipe) behave alike and share one open class
    // "at least kmax_ left", which may stay in itself; pinned counts stay exact.
    // Each stage takes at least one quantum, except in the relaxation.
    int smax = 0;
    for (int s : stage_counts)
      if (relaxed_ || s <= Dq_) smax = std::max(smax, s);
    const bool exact = per_stage_ || per_stage_tp_ || p.constraints.stages > 0;
    kmax_ = exact ? smax : std::min(smax, sched_ == Schedule::GPipe ? 1 : M_);
    top_open_ = kmax_ < smax;
    source_.assign(kmax_ + 1, false);
    for (int s : stage_counts)
      if (relaxed_ || s <= Dq_) source_[std::min(s, kmax_)] = true;
    num_states_ = static_cast<int64_t>(kmax_ + 1) * (n_ + 1) * (Dq_ + 1);
  }

  /// States of the DP (each holds bounds and a front).
  int64_t numStates() const { return num_states_; }
  /// The device quantum (Note [device quantum]).
  int quantum() const { return q_; }

  /// Only stages whose all-reduce takes less than `tau` are allowed from now on.
  void setAllReduceLimit(double tau) { ar_limit_ = tau; }
  /// From now on only plans faster than `best` matter: stages whose floor is
  /// not below it are left out (Note [stage floor]).
  void setIncumbent(double best) { prune_ = best; }

  /// Backward pass: lower bounds for every state; returns the bound on T.
  double lowerBound() {
    lb_a_.assign(num_states_, kInf);
    lb_psi_.assign(num_states_, kInf);
    lb_w_.assign(num_states_, kInf);
    for (int i = 0; i < nc_; ++i) lb_c_[i].assign(num_states_, kInf);
    for (int d = 0; d <= Dq_; ++d) {
      const int64_t t = sid(0, n_, d);
      lb_a_[t] = lb_psi_[t] = lb_w_[t] = 0;
      for (int i = 0; i < nc_; ++i) lb_c_[i][t] = 0;
    }
    // Same transitions as forEachStage, looped so that the innermost loop runs
    // over devices used: source and target states are then contiguous, and a
    // stage's numbers depend on d only through three same-node tests and the
    // all-reduce's bandwidth, so they are computed once per combination.
    placeSeats();
    forEachRange([&](int a, int e, size_t ti, int mask) {
      const int tp = T_[ti];
      const bool grows = memoryGrowsWithInflight(a, e, ti);
      for (size_t ri = 0; ri < R_.size(); ++ri) {
        const int r = R_[ri], devices = r * tp, rq = quanta(devices);
        if (r > per_microbatch_) break;
        if (!widthAllowed(devices) || hopeless(a, e, ri, ti)) continue;
        const std::vector<Seat> &seat = seats_[ti][ri];
        const double share = static_cast<double>(devices) / D_; // Note [work bound]
        // Across nodes the all-reduce also depends on d through the ring's
        // bandwidth (Note [ring all-reduce bandwidth]): a few values per flags.
        struct Cached {
          double bw;
          StageVals v;
        };
        Cached cache[4][kAnyPlacement + 1][4];
        int cached[4][kAnyPlacement + 1] = {};
        int last_inflight = -1, last_queue = -1, choice = -1;
        for (int k = 1; k <= std::min(kmax_, n_ - a) && e <= n_ - (k - 1); ++k) {
          if (per_stage_ && (*per_stage_)[per_stage_->size() - k] != r) continue;
          if (per_stage_tp_ && (*per_stage_tp_)[per_stage_tp_->size() - k] != tp) continue;
          // k only enters through the micro-batches in flight, which never
          // fall as k grows: a stage that does not fit fits at no larger k
          // (under a split backward the W queue falls as k grows: no such rule).
          if (inflightFor(k) != last_inflight || queueFor(k) != last_queue)
            choice = memoryChoice(a, e, ri, ti, last_inflight = inflightFor(k), last_queue = queueFor(k));
          if (choice < 0 && grows && !split_) break;
          if (choice < 0) continue;
          int next[2];
          const int num_next = nextClasses(k, e, next);
          for (int j = 0; j < num_next; ++j) {
            const int64_t s0 = sid(k, a, 0), t0 = sid(next[j], e, rq);
            for (int d = 0; d + rq <= Dq_ - later_ * (k - 1); ++d) {
              const int64_t s = s0 + d, t = t0 + d;
              if (lb_a_[t] == kInf || !(seat[d].bits & kGroupsFit)) continue;
              const int flags = relaxed_ ? kAnyPlacement : seat[d].bits & mask;
              const double bw = flags == kAnyPlacement || (flags & 4) ? 0.0 : seat[d].bw;
              int &count = cached[choice][flags];
              Cached *hit = nullptr;
              for (int i = 0; i < count && !hit; ++i)
                if (cache[choice][flags][i].bw == bw) hit = &cache[choice][flags][i];
              StageVals uncached;
              if (!hit && count < 4)
                hit = &cache[choice][flags][count++], *hit = {bw, placedValues(a, e, ri, ti, choice, flags, seat[d].bw)};
              if (!hit) uncached = placedValues(a, e, ri, ti, choice, flags, seat[d].bw);
              const StageVals &v = hit ? hit->v : uncached;
              if (!(v.ar < ar_limit_)) continue;
              const double credit = splitCredit(k, a, e, ri, ti, v.g); // Note [split backward DP]
              lb_a_[s] = std::min(lb_a_[s], v.a - credit + lb_a_[t]);
              lb_psi_[s] = std::min(lb_psi_[s], std::max(v.ar, lb_psi_[t]));
              double x = v.ar;
              for (int i = 0; i < nc_; ++i) {
                lb_c_[i][s] = std::min(lb_c_[i][s], std::max(v.c[i], lb_c_[i][t]));
                x += w_[i] * v.c[i];
              }
              lb_w_[s] = std::min(lb_w_[s], v.a - credit + x * share + lb_w_[t]);
            }
          }
        }
      }
    });
    double best = kInf;
    for (int k = 1; k <= kmax_; ++k)
      if (source_[k]) best = std::min(best, std::max(boundAt(sid(k, 0, 0), 0, nullptr), lb_w_[sid(k, 0, 0)]));
    return best;
  }

  /// After lowerBound: the bound on T over plans of `stages` stages (of
  /// every count from kmax_ up, in the open class; Note [stage count classes]).
  double boundFrom(int stages) const {
    const int k = std::min(stages, kmax_);
    if (k < 1 || !source_[k] || (stages > kmax_ && !top_open_)) return kInf;
    return std::max(boundAt(sid(k, 0, 0), 0, nullptr), lb_w_[sid(k, 0, 0)]);
  }

  /// A lower bound on T over every plan, from the devices' work (Note [work
  /// bound]): the best over a few prices mu >= 0 of the least over
  /// block-range paths of sum_s (A_s + (w . C_s + AR_s + mu D) width_s / D) - mu D,
  /// on (stage-count class, blocks placed) alone.
  double workBound() {
    // Prices per device in units of the ideal step over D (every block's
    // time for the whole batch spread over every device); the first is 0.
    constexpr double kPrices[] = {0, 0.125, 0.25, 0.5, 1};
    constexpr int kNumPrices = sizeof(kPrices) / sizeof(kPrices[0]);
    const double ideal = ((f0_[n_] + g0_[n_]) * M_ + (f1_[n_] + g1_[n_]) * p_.batch_size) / D_;
    double mu[kNumPrices];
    for (int j = 0; j < kNumPrices; ++j) mu[j] = kPrices[j] * ideal / D_;
    const int64_t per_k = n_ + 1;
    // lb[(k * (n + 1) + a) * kNumPrices + j]: the least priced sum from (k, a).
    std::vector<double> lb(static_cast<size_t>((kmax_ + 1) * per_k * kNumPrices), kInf);
    for (int j = 0; j < kNumPrices; ++j) lb[n_ * kNumPrices + j] = 0; // class 0, every block placed
    forEachRange([&](int a, int e, size_t ti, int mask) {
      const int tp = T_[ti];
      for (size_t ri = 0; ri < R_.size(); ++ri) {
        const int r = R_[ri], devices = r * tp;
        if (r > per_microbatch_) break;
        if (devices > D_ || !widthAllowed(devices) || hopeless(a, e, ri, ti)) continue;
        double cost[4][kNumPrices];
        bool have[4] = {};
        int last_inflight = -1, last_queue = -1, choice = -1;
        for (int k = 1; k <= std::min(kmax_, n_ - a) && e <= n_ - (k - 1); ++k) {
          if (per_stage_ && (*per_stage_)[per_stage_->size() - k] != r) continue;
          if (per_stage_tp_ && (*per_stage_tp_)[per_stage_tp_->size() - k] != tp) continue;
          if (inflightFor(k) != last_inflight || queueFor(k) != last_queue)
            choice = memoryChoice(a, e, ri, ti, last_inflight = inflightFor(k), last_queue = queueFor(k));
          if (choice < 0) continue;
          if (!have[choice] || split_) { // a split backward's credit depends on k (Note [split backward DP])
            const double least = leastWork(a, e, ri, ti, choice, mask) - splitCredit(k, a, e, ri, ti);
            for (int j = 0; j < kNumPrices; ++j) cost[choice][j] = least + mu[j] * devices;
            have[choice] = true;
          }
          double *from = &lb[(k * per_k + a) * kNumPrices];
          int next[2];
          const int num_next = nextClasses(k, e, next);
          for (int x = 0; x < num_next; ++x) {
            const double *to = &lb[(next[x] * per_k + e) * kNumPrices];
            for (int j = 0; j < kNumPrices; ++j) from[j] = std::min(from[j], cost[choice][j] + to[j]);
          }
        }
      }
    });
    double best = 0;
    for (int j = 0; j < kNumPrices; ++j) {
      double least = kInf; // over the stage counts searched, at this price
      for (int k = 1; k <= kmax_; ++k)
        if (source_[k]) least = std::min(least, lb[(k * per_k) * kNumPrices + j]);
      if (least == kInf) return kInf; // no plan at all
      best = std::max(best, least - mu[j] * D_);
    }
    return best;
  }

  /// Calls fn(a, e, ti, placementMask(a, e)) for every block range [a, e)
  /// and degree T_[ti] a stage may take, by decreasing a (the backward passes).
  template <typename Fn> void forEachRange(Fn &&fn) const {
    for (int a = n_ - 1; a >= 0; --a)
      for (int e = a + 1; e <= n_; ++e) {
        if (!paramsFit(a, e)) break; // more blocks only add parameters
        if (!(rangeFloor(a, e) < prune_)) break; // Note [stage floor]: nor does any longer range
        const bool whole = p_.cutWhole(a) && p_.cutWhole(e); // tensor-parallel stages need both
        for (size_t ti = 0; ti < T_.size(); ++ti)
          if ((T_[ti] == 1 || whole) && paramsFit(a, e, ti)) fn(a, e, ti, placementMask(a, e));
      }
  }

  /// A stage's A + (w . C + AR) width / D at its best placement: links, ring
  /// and groups depend on the first rank only through its offset in a node.
  double leastWork(int a, int e, size_t ri, size_t ti, int choice, int mask) const {
    const int r = R_[ri], tp = T_[ti], devices = r * tp;
    double least = kInf;
    for (int off = 0; off < p_.devices.per_node; ++off) {
      const int rank = p_.devices.per_node + off;
      if (!p_.devices.groupsInsideNodes(rank, r, tp)) continue;
      const StageVals v = values(a, e, ri, ti, choice, placement(1, 0, devices, rank) & mask,
                                 p_.devices.allReduceBandwidth(rank, r, tp));
      if (!(v.ar < ar_limit_)) continue;
      double x = v.ar;
      for (int i = 0; i < nc_; ++i) x += w_[i] * v.c[i];
      least = std::min(least, v.a + x * devices / D_);
    }
    return least;
  }

  /// Forward pass (after lowerBound). Every complete plan it meets that beats
  /// `incumbent` lowers it and is stored in `best`. Returns the largest
  /// all-reduce of the plan with the least V (ties: least all-reduce), the
  /// next threshold; or -1 when no plan is left under the current one.
  double solve(double &incumbent, Solution &best, SolveStats &stats) {
    placeSeats();
    prune_ = std::min(prune_, incumbent);
    floors_a_ = -1;
    fronts_.assign(num_states_, {});
    for (int k = 1; k <= kmax_; ++k) {
      const int64_t s = sid(k, 0, 0);
      if (!source_[k] || lb_a_[s] == kInf) continue;
      Point root{0, {0, 0}, 0, -1, -1, false, false, 1};
      for (int i = 0; i < nc_; ++i) root.c[i] = lb_c_[i][s];
      fronts_[s].push_back(root);
    }
    for (int a = 0; a < n_; ++a)
      for (int k = 1; k <= std::min(kmax_, n_ - a); ++k)
        for (int d = 0; d + later_ * k <= Dq_; ++d) {
          const int64_t s = sid(k, a, d);
          if (fronts_[s].empty()) continue;
          ++stats.states;
          forEachStage(k, a, d, [&](int64_t t, const StageVals &v) {
            ++stats.transitions;
            const std::vector<Point> &from = fronts_[s];
            for (size_t pi = 0; pi < from.size(); ++pi) {
              const Point &pt = from[pi];
              Point q{pt.a + v.a, {0, 0}, std::max(pt.psi, v.ar), static_cast<int32_t>(s), static_cast<int32_t>(pi),
                      v.recompute, v.zero, v.tp};
              for (int i = 0; i < nc_; ++i) q.c[i] = std::max(std::max(pt.c[i], v.c[i]), lb_c_[i][t]);
              if (boundAt(t, q.a, q.c) >= incumbent) continue;
              if (insert(fronts_[t], q)) ++stats.points;
            }
          });
        }
    // Complete plans sit in the sink states (no stage left, all blocks placed).
    int64_t least_v_state = -1, best_state = -1;
    int best_point = -1;
    double least_v = kInf, least_v_psi = kInf;
    for (int d = 0; d <= Dq_; ++d) {
      const int64_t t = sid(0, n_, d);
      for (size_t pi = 0; pi < fronts_[t].size(); ++pi) {
        const Point &q = fronts_[t][pi];
        const double v = valueOf(q);
        if (v < least_v || (v == least_v && q.psi < least_v_psi))
          least_v = v, least_v_psi = q.psi, least_v_state = t;
        if (v + q.psi < incumbent) incumbent = v + q.psi, best_state = t, best_point = static_cast<int>(pi);
      }
    }
    if (best_state >= 0 && !relaxed_) best = reconstruct(best_state, best_point);
    return least_v_state >= 0 ? least_v_psi : -1;
  }

private:
  int64_t sid(int k, int a, int d) const { return (static_cast<int64_t>(k) * (n_ + 1) + a) * (Dq_ + 1) + d; }
  int aOf(int64_t s) const { return static_cast<int>((s / (Dq_ + 1)) % (n_ + 1)); }
  int dOf(int64_t s) const { return static_cast<int>(s % (Dq_ + 1)); }
  double valueOf(const Point &q) const {
    double v = q.a;
    for (int i = 0; i < nc_; ++i) v += w_[i] * q.c[i];
    return v;
  }

  /// Lower bound on T for a partial plan (A, C) at state t (C == nullptr: none yet).
  double boundAt(int64_t t, double a, const double *c) const {
    double bound = a + lb_a_[t] + lb_psi_[t];
    for (int i = 0; i < nc_; ++i) bound += w_[i] * std::max(c ? c[i] : 0.0, lb_c_[i][t]);
    return bound;
  }

  Solution reconstruct(int64_t t, int64_t pi) const {
    Solution sol;
    sol.microbatches = M_;
    sol.schedule = sched_;
    while (fronts_[t][pi].prev_state >= 0) {
      const Point &q = fronts_[t][pi];
      const int64_t s = q.prev_state;
      sol.stages.push_back(Stage{aOf(s), aOf(t), (dOf(t) - dOf(s)) * q_ / q.tp, q.recompute, q.zero, q.tp});
      pi = q.prev_point;
      t = s;
    }
    std::reverse(sol.stages.begin(), sol.stages.end());
    return sol;
  }

  /// The classes a state of class k moves to after placing a stage ending at
  /// block e (Note [stage count classes]); returns how many.
  int nextClasses(int k, int e, int next[2]) const {
    next[0] = k - 1;
    if (k == kmax_ && top_open_ && e < n_) {
      next[1] = k;
      return 2;
    }
    return 1;
  }

  /// Whether no plan with this stage can beat prune_ (Note [stage floor]).
  bool hopeless(int a, int e, size_t ri, size_t ti) const { return !(stageFloor(a, e, ri, ti) < prune_); }

  /// stageFloor of [a, e) per (ti, ri), tabled per first block (the forward
  /// pass visits every state of one a in a row), or null when no stage of
  /// [a, e) or any longer range gets below prune_ (Note [stage floor]).
  const double *floorsAt(int a, int e) const {
    const size_t per_range = T_.size() * R_.size();
    if (a != floors_a_) floors_a_ = a, floors_.clear(), floors_ranges_ = 0, floors_dead_ = n_ + 1;
    if (e - a >= floors_dead_) return nullptr;
    while (floors_ranges_ < e - a) { // prune_ only falls: a range tabled stays tabled
      const int end = a + floors_ranges_ + 1;
      double least = kInf;
      for (size_t ti = 0; ti < T_.size(); ++ti)
        for (size_t ri = 0; ri < R_.size(); ++ri) {
          floors_.push_back(R_[ri] <= per_microbatch_ ? stageFloor(a, end, ri, ti) : kInf);
          least = std::min(least, floors_.back());
        }
      if (!(least < prune_)) {
        floors_.resize(floors_.size() - per_range);
        floors_dead_ = floors_ranges_ + 1;
        return nullptr;
      }
      ++floors_ranges_;
    }
    return &floors_[(e - a - 1) * per_range];
  }

  int inflightFor(int k) const {
    return pipeline::microbatchesInFlight(sched_, S_ > 0 ? S_ - k : 0, S_ > 0 ? S_ : k, M_);
  }
  /// The W queue beside a backward of a stage with k stages still to place
  /// (Note [split backward DP]); -1 where the stage count is open (a bound
  /// pass): memoryChoice then takes the least over every queue length.
  int queueFor(int k) const {
    return !split_ ? 0 : S_ > 0 ? pipeline::weightQueuePeak(sched_, S_ - k, S_, M_) : -1;
  }

  /// Calls fn(target state, stage numbers) for every stage that can follow state (k, a, d).
  template <typename Fn> void forEachStage(int k, int a, int d, Fn &&fn) const {
    const int inflight = inflightFor(k), queue = queueFor(k);
    const int num_pinned = per_stage_ ? static_cast<int>(per_stage_->size())
                           : per_stage_tp_ ? static_cast<int>(per_stage_tp_->size())
                                           : 0;
    const int stage_index = num_pinned - k; // with per-stage counts pinned, k is exact
    for (int e = a + 1; e <= n_ - (k - 1); ++e) {
      if (!paramsFit(a, e)) break; // more blocks only add parameters
      const double *floor = floorsAt(a, e); // Note [stage floor]
      if (!floor) break;
      const int mask = placementMask(a, e);
      for (size_t ti = 0; ti < T_.size(); ++ti) {
        const int tp = T_[ti];
        if (tp > 1 && !(p_.cutWhole(a) && p_.cutWhole(e))) continue;
        if (per_stage_tp_ && (*per_stage_tp_)[stage_index] != tp) continue;
        if (!paramsFit(a, e, ti)) continue;
        for (size_t ri = 0; ri < R_.size(); ++ri) {
          const int r = R_[ri], devices = r * tp, rq = quanta(devices);
          if (!widthAllowed(devices)) continue;
          if (d + rq > Dq_ - later_ * (k - 1)) break; // the later stages need a device (quantum) each
          if (r > per_microbatch_) break;               // a replica without samples (only pinned counts get here)
          if (per_stage_ && (*per_stage_)[stage_index] != r) continue;
          if (!(floor[ti * R_.size() + ri] < prune_)) continue;
          const Seat &seat = seats_[ti][ri][d];
          if (!(seat.bits & kGroupsFit)) continue;
          const int choice = memoryChoice(a, e, ri, ti, inflight, queue);
          if (choice < 0) continue;
          StageVals v = placedValues(a, e, ri, ti, choice, relaxed_ ? kAnyPlacement : seat.bits & mask, seat.bw);
          v.a -= splitCredit(k, a, e, ri, ti, v.g); // Note [split backward DP]
          if (!(v.ar < ar_limit_)) continue;
          int next[2];
          const int num_next = nextClasses(k, e, next);
          for (int j = 0; j < num_next; ++j) {
            const int64_t t = sid(next[j], e, d + rq);
            if (lb_a_[t] != kInf) fn(t, v);
          }
        }
      }
    }
  }

  /// Adds q to a front unless a kept point is at least as good in every
  /// completion (Note [exact stage DP]; on a tie in A and C the smaller
  /// all-reduce stays), and drops the kept points q is as good as.
  bool insert(std::vector<Point> &front, const Point &q) const {
    auto covers = [&](const Point &x, const Point &y) { // x at least as good as y
      double excess = 0;
      bool eq = x.a == y.a;
      for (int i = 0; i < nc_; ++i) excess += std::max(0.0, x.c[i] - y.c[i]), eq = eq && x.c[i] == y.c[i];
      return eq ? x.psi <= y.psi : x.a + w_[0] * excess <= y.a;
    };
    for (const Point &o : front)
      if (covers(o, q)) return false;
    front.erase(std::remove_if(front.begin(), front.end(), [&](const Point &o) { return covers(q, o); }),
                front.end());
    front.push_back(q);
    return true;
  }

  double w_[2] = {0, 0};
  double ar_limit_ = kInf;
  double prune_ = kInf; // the best step known (Note [stage floor])
  // floorsAt's table: its first block, the ranges tabled, the shortest range known hopeless
  mutable int floors_a_ = -1, floors_ranges_ = 0, floors_dead_ = 0;
  mutable std::vector<double> floors_;
  int kmax_ = 0;         // stage-count classes 1..kmax_ (Note [stage count classes])
  bool top_open_ = false; // class kmax_ means "at least kmax_ stages left"
  std::vector<bool> source_;
  const std::vector<int> *per_stage_ = nullptr;
  const std::vector<int> *per_stage_tp_ = nullptr;
  int64_t num_states_ = 0;
  std::vector<double> lb_a_, lb_psi_, lb_c_[2];
  std::vector<double> lb_w_; // Note [work bound], at the source only
  std::vector<std::vector<Point>> fronts_;
};

} // namespace

/// The search of Note [exact stage DP] for one schedule (or 1F1B and GPipe
/// searched); under a split backward, with the stage count pinned. Only
/// plans faster than `bound` are looked for: none found, the best baseline
/// (which may be slower) or an error comes back; `too_large`, when given, is
/// set when the error is that the search would need too many states.
static Expected<SolveResult> searchStages(const Problem &p, const DPOptions &opts, double bound = kInf,
                                          bool *too_large = nullptr);

namespace {

// Note [interleaved layouts]
// The DP's states hold one stage per device group, not v chunks sharing one
// (Note [interleaved 1F1B]); a pinned interleaved-1f1b with v chunks on p
// pipeline ranks is solved as the 1F1B plan of p v stages, each with the
// replicas its rank has, on v times the devices and 1/v of each one's memory
// (a rank holds v such stages), then folded: stage s onto the ranks of
// stage s % p and evaluated under the interleaved schedule. Every replica
// count up to devices / p and every micro-batch count that p divides is
// tried, the fastest folded plan that fits kept: a plan that fits, not the
// best one (docs/partitioner.md). Recomputation and ZeRO-1 are the 1F1B
// search's choice per stage (auto) or every stage's (on, 1): a stage takes
// them where the 1F1B layout needs them on 1/v of a device, and the fold is
// then evaluated with each chunk's own in-flight count. Tensor parallelism
// only where pinned (--tensor-parallel t, or one degree per pipeline rank): a
// rank's chunks share its devices and its groups, so each of its chunks gets
// the rank's degree; unpinned, chunks are not split (the 1F1B search would
// choose a degree per stage, which chunks of one rank could not share). The
// fold's chunks
// hold other counts than the 1F1B stages they were (more on late stages,
// fewer on early ones), so a fold that does not fit is searched again on
// 90%, 80%, 70%, 60% of 1/v of a device.
/// `only`, when given, restricts the (micro-batch count, replicas per rank) pairs tried.
Expected<SolveResult> solveInterleaved(const Problem &p, const DPOptions &opts,
                                       const std::vector<std::pair<int, int>> *only = nullptr) {
  const Constraints &c = p.constraints;
  const int v = c.virtual_stages, P = c.stages;
  const char *name = pipeline::scheduleName(*c.schedule);
  if (P < 1) return Error{std::string(name) + " needs the pipeline ranks pinned (--stages N)"};
  if (c.replicas.size() > 1 && static_cast<int>(c.replicas.size()) != P)
    return Error{std::string(name) + ": " + std::to_string(c.replicas.size()) + " replica counts for " +
                 std::to_string(P) + " pipeline ranks"};
  if (c.tensor_parallel.size() > 1 && static_cast<int>(c.tensor_parallel.size()) != P)
    return Error{std::string(name) + ": " + std::to_string(c.tensor_parallel.size()) +
                 " tensor-parallel degrees for " + std::to_string(P) + " pipeline ranks"};
  // A rank's chunks share its devices and its tensor-parallel group: one
  // degree per pipeline rank, pinned (unpinned: none), each chunk of it alike.
  const std::vector<int> tp = c.tensor_parallel.empty()  ? std::vector<int>(P, 1)
                              : c.tensor_parallel.size() == 1 ? std::vector<int>(P, c.tensor_parallel[0])
                                                              : c.tensor_parallel;
  const int tp_devices = std::accumulate(tp.begin(), tp.end(), 0);
  std::vector<std::vector<int>> replica_choices; // per pipeline rank
  if (!c.replicas.empty()) {
    replica_choices.push_back(c.replicas.size() == 1 ? std::vector<int>(P, c.replicas[0]) : c.replicas);
  } else {
    for (int r = p.devices.count / tp_devices; r >= 1; --r) replica_choices.push_back(std::vector<int>(P, r));
  }
  std::optional<SolveResult> best;
  std::string why = "no micro-batch count is a multiple of the " + std::to_string(P) + " pipeline ranks";
  for (int m : microbatchCandidates(p)) {
    if (m % P != 0) continue;
    for (const std::vector<int> &replicas : replica_choices) {
      if (only && std::find(only->begin(), only->end(), std::make_pair(m, replicas[0])) == only->end()) continue;
      Problem q = p;
      q.constraints = {};
      q.constraints.stages = P * v;
      q.constraints.microbatches = m;
      q.constraints.schedule = Schedule::OneFOneB;
      for (int k = 0; k < v; ++k) {
        q.constraints.replicas.insert(q.constraints.replicas.end(), replicas.begin(), replicas.end());
        q.constraints.tensor_parallel.insert(q.constraints.tensor_parallel.end(), tp.begin(), tp.end());
      }
      if (c.tensor_parallel.empty()) q.tp_degrees = {1};
      q.devices.count = p.devices.count * v;
      q.devices.reserve_bytes = p.devices.reserve_bytes / v;
      // A 1F1B stage's in-flight count is not its chunk's: a late stage
      // holds more micro-batches as a chunk (103.6B BERT, 32 ranks x 2, M =
      // 128: rank 12's second chunk, 43.65 GiB against its 35.79). Where
      // the fold does not fit, the layout is searched again on less of a
      // device, down to 60%, and the first that folds is kept.
      for (double share : {1.0, 0.9, 0.8, 0.7, 0.6}) {
        q.devices.memory_bytes = p.devices.memory_bytes * share / v;
        auto solved = solveDP(q, opts);
        if (!solved) {
          why = solved.error().message;
          break; // less memory finds nothing either
        }
        solved->solution.schedule = *c.schedule;
        solved->solution.virtual_stages = v;
        Evaluation ev = evaluate(p, solved->solution);
        if (!ev.feasible()) {
          why = ev.violations.front();
          continue;
        }
        // What the layout needed on 1/v of a device the rank's own order may
        // not (Note [a rank's chunks' memory] in evaluate.cpp): each stage in
        // turn takes the fastest of its memory choices that still fits, no
        // recomputation before recomputation, unsharded before sharded. A
        // later stage's choice only adds memory, so an earlier one stays needed.
        for (Stage &st : solved->solution.stages) {
          const Stage was = st;
          for (const auto &[rec, zero] : {std::pair{false, false}, {false, true}, {true, false}, {true, true}}) {
            if ((rec && !was.recompute) || (rec == was.recompute && zero && !was.zero)) break;
            if (!p.recomputeAllowed(rec) || !p.zeroAllowed(zero, st.replicas)) continue;
            st.recompute = rec;
            st.zero = zero;
            Evaluation tried = evaluate(p, solved->solution);
            if (tried.feasible()) {
              ev = std::move(tried);
              break;
            }
            st = was;
          }
        }
        solved->step_time_s = ev.step_time_s;
        if (!best || ev.step_time_s < best->step_time_s) best = std::move(*solved);
        break;
      }
    }
  }
  if (!best) return Error{"no " + std::to_string(P * v) + "-stage 1F1B layout folds onto " + std::to_string(P) +
                          " pipeline ranks under " + name + ": " + why};
  return *best;
}

} // namespace

namespace {

// Note [automatic schedule]
// With no schedule pinned (--schedule auto), solveDP searches 1F1B first
// (GPipe never wins, Note [exact stage DP]), then weighs the others against
// that plan, T1, each only as far as it could beat it:
// - ZB-H1 and ZB-H2: refused where the driver says the executor could not
//   split a backward (Problem::no_split_backward: a parameter two ops read).
//   Otherwise the best plan so far's layout (1F1B's, or ZB-H1's for ZB-H2),
//   recomputing, sharding or tensor-parallel as it may be, is a plan of it
//   with each stage's memory choice taken again for the schedule
//   (refitMemoryChoices), where that fits; then a
//   bound per stage count S: the DP of Note [split backward DP] with S left
//   open (StageTable::S_ = 0) charges each stage the in-flight count of a
//   pipeline of k stages, the k still to place (min(M, k) or min(M, 2k-1),
//   never more than S's), no W queue, and the largest credit any S gives it
//   (2W; ZB-H2 max(min(G, 3W), 2W)) wherever it is not the last stage. Every
//   plan of S stages is a path of that DP at no more than its own cost, so
//   its bound from the source of S is a bound on every such plan. A count
//   whose bound over every micro-batch count does not beat the best plan
//   known is not searched; the others are, by increasing bound, each pruned
//   by the best plan so far. The bound passes run at the finest quantum within
//   kWarmStates (the quantum relaxation is a bound too).
// - Where the remaining searches would visit more than DPOptions::auto_states (2^24) DP
//   states (the sum over the counts and micro-batch counts left, at every
//   width), the schedule is not searched whole and says so: the 103.6B
//   BERT's ZB-H1 search took 52 minutes pinned (docs/partitioner.md). If
//   the stage count of the plan weighed against is among those left and its
//   search alone stays within DPOptions::auto_states, that count is searched (a
//   plan found so says in ScheduleTried::why, a search that found none is
//   too-large): the pipeline depth a 1F1B plan found best is where a split
//   backward's layout is most likely to be (the 103.6B BERT: 17 stages,
//   1F1B 150.9 samples/s, ZB-H1 at 17 stages 156.3). Not exact: other
//   counts are not searched. Pinned, the whole search runs whatever it costs.
// - Interleaved 1F1B with v in kAutoChunks: the fold of Note [interleaved
//   layouts] onto the 1F1B plan's stage count p (or the pinned --stages),
//   where p >= 2, p v <= the blocks, and the problem allows chunks (no
//   degrees pinned per stage, Problem::no_interleave empty; one pinned
//   degree t is every chunk's, and divides the bound below by t, as a
//   t-way stage runs at least 1/t of a block's time). A rank runs
//   its chunks' M forwards and backwards one after another, so with r
//   replicas a rank the step is at least M (sum over blocks of F + G at
//   ceil(B / (M r)) samples) / p (the closed form's M T_r* of Note
//   [interleaved 1F1B], T_r* at least the ranks' mean); the fold tries only
//   the (M, r) whose bound beats the best plan known, and only when their
//   DP states stay within DPOptions::auto_states.
// The schedule whose plan is fastest wins; ties go to the earlier in
// kSchedules (1F1B before the others). Over ZB-H1, ZB-H2 and 1F1B this is
// exact: the answer is the best of the three pinned searches, whenever no
// schedule is skipped for its size (partition_solver_test,
// AutoScheduleMatchesBestPinnedSearch). The interleaved fold is not exact
// pinned either (a plan that fits, not the best one).
constexpr int kAutoChunks[] = {2, 4};
// A schedule must beat the plan before it by more than rounding: with one
// stage or one micro-batch ZB-H1's sums equal 1F1B's up to the last bits,
// and 1F1B plans must stay what they were.
constexpr double kTieTolerance = 1e-9;

/// Gives each stage of `sol` the fastest memory choice that fits under its
/// schedule, as the DP would (StageTable::memoryChoice: no recomputation
/// before recomputation, sharding before recomputation); a stage where none
/// fits keeps its own (evaluate() then says it does not fit).
void refitMemoryChoices(const Problem &p, Solution &sol) {
  const int S = sol.numStages();
  for (int s = 0; s < S; ++s) {
    Stage &st = sol.stages[static_cast<size_t>(s)];
    const int first = sol.firstRank(s);
    const int prev_last = s > 0 ? sol.firstRank(s - 1) + sol.stages[s - 1].devices() - 1 : -1;
    const int next_first = s + 1 < S ? sol.firstRank(s + 1) : -1;
    bool fitted = false;
    for (bool rec : {false, true})
      for (bool zero : {false, true}) {
        if (fitted || !p.recomputeAllowed(rec) || !p.zeroAllowed(zero, st.replicas)) continue;
        Stage trial = st;
        trial.recompute = rec, trial.zero = zero;
        const StageCost c = evaluateStage(p, trial, s, S, first, sol.microbatches, sol.schedule, sol.virtual_stages,
                                          prev_last, next_first);
        if (c.memory.total() <= p.devices.capacity()) st = trial, fitted = true;
      }
  }
}

/// The split-backward search of Note [split backward DP] under `schedule`.
/// Alone (`rival` null) it searches every stage count, seeded with the best
/// 1F1B layout that fits; weighed against `rival` (Note [automatic
/// schedule]) it looks only for plans faster than it, seeded with its layout,
/// and `tried` says what it did. No plan faster than the rival is an Error.
Expected<SolveResult> searchSplit(const Problem &p, Schedule schedule, const DPOptions &opts,
                                  const SolveResult *rival = nullptr, ScheduleTried *tried = nullptr) {
  const auto start = std::chrono::steady_clock::now();
  const char *name = pipeline::scheduleName(schedule);
  Problem q = p;
  // Degrees pinned per stage also pin the stage count, which the searches
  // below pin one by one (a one-stage plan of a problem pinned to two stages
  // is no plan of it).
  if (q.constraints.tensor_parallel.size() > 1)
    q.constraints.stages = static_cast<int>(q.constraints.tensor_parallel.size());
  q.constraints.schedule = schedule;
  std::optional<SolveResult> best;
  // Only plans faster than this matter: the rival's (by more than rounding), or the seed's.
  double beat = rival ? rival->step_time_s * (1 - kTieTolerance) : kInf;
  {
    // The seed: a 1F1B layout in the same space, where it fits under this
    // schedule, prunes every count's search from the start (on BERT 4.9B on
    // 32 devices it is the optimum, and the searches still cost their
    // lower-bound passes: docs/partitioner.md).
    std::optional<SolveResult> layout;
    if (rival) {
      layout = *rival;
    } else {
      Problem one = q;
      one.constraints.schedule = Schedule::OneFOneB;
      if (auto solved = searchStages(one, opts); solved.ok()) layout = std::move(*solved);
    }
    // Recomputing and tensor-parallel stages run under a split backward too
    // (Note [recomputing split backward], Note [split backward of a
    // tensor-parallel stage] in evaluate.cpp): any one-chunk layout is a plan
    // of it, each stage taking the memory choice that fits under this
    // schedule (it holds more micro-batches than under 1F1B).
    if (layout && layout->solution.virtual_stages == 1) {
      layout->solution.schedule = schedule;
      refitMemoryChoices(q, layout->solution);
      if (const Evaluation ev = evaluate(q, layout->solution); ev.feasible() && ev.step_time_s < beat) {
        layout->step_time_s = ev.step_time_s;
        beat = ev.step_time_s;
        best = std::move(*layout);
      }
    }
  }
  // Note [automatic schedule]: a bound per stage count, with the count left open.
  std::vector<int> counts = detail::stageCountsToSearch(q);
  const int64_t warm = std::min({kWarmStates, opts.max_states, kMaxStates});
  // What searching stage count s would visit, at every width and micro-batch count.
  auto countStates = [&](int s) {
    return double(s + 1) * (q.numBlocks() + 1) * (q.devices.count + 1) * double(microbatchCandidates(q).size());
  };
  // Note [automatic schedule]: where the whole search is too large, the stage
  // count of the plan weighed against is searched alone if that fits the budget.
  const int rival_stages = rival && rival->solution.virtual_stages == 1 ? rival->solution.numStages() : 0;
  const bool can_narrow = rival_stages > 0 && std::find(counts.begin(), counts.end(), rival_stages) != counts.end() &&
                          countStates(rival_stages) <= double(opts.auto_states);
  std::string narrowed; // why only rival_stages was searched, or empty
  auto narrow = [&](const char *text) {
    narrowed = std::string(text) + "; searched at the " + std::to_string(rival_stages) +
               " stages of the plan weighed against alone";
  };
  // Before the bounds: a search that would stay too large even if they
  // pruned nine of ten micro-batch counts and stage counts is not bounded
  // either (the bound passes alone took 35 s of GPT 145.6B's planning).
  if (rival) {
    double most = 0;
    for (int s : counts) most += countStates(s);
    if (most > 100.0 * double(opts.auto_states)) {
      char text[400];
      std::snprintf(text, sizeof text, "its search would visit up to %.3g DP states over %zu stage counts, more "
                    "than 100 times what the automatic search allows (%.3g), so it was not bounded either; pin "
                    "--schedule %s to search it", most, counts.size(), double(opts.auto_states), name);
      if (can_narrow) {
        narrow(text);
        counts = {rival_stages};
      } else {
        if (tried && !best) tried->outcome = ScheduleTried::Outcome::TooLarge, tried->why = text;
        if (!best) return Error{std::string(name) + ": " + text};
        if (tried) tried->step_time_s = best->step_time_s; // the seed stands
        return std::move(*best);
      }
    }
  }
  std::vector<double> bound(counts.size(), 0.0); // 0: not bounded, searched
  std::vector<double> states(counts.size(), 0.0); // what searching it would visit, at every width
  if (q.constraints.stages == 0 && counts.size() > 1 && beat < kInf) {
    if (opts.doing) opts.doing("stage DP: bounding " + std::string(name) + " per stage count");
    bound.assign(counts.size(), kInf);
    const std::vector<int> quanta = detail::deviceQuanta(q, opts.device_quantum);
    for (int m : microbatchCandidates(q)) {
      std::optional<MicrobatchDP> dp;
      for (int quantum : quanta) {
        dp.emplace(q, m, schedule, counts, quantum, /*relaxed=*/quantum > 1);
        if (dp->numStates() <= warm) break;
      }
      if (dp->numStates() > kMaxStates) { // cannot bound this count: every stage count stays open
        for (size_t i = 0; i < counts.size(); ++i)
          bound[i] = 0, states[i] += double(counts[i] + 1) * (q.numBlocks() + 1) * (q.devices.count + 1);
        continue;
      }
      dp->setIncumbent(beat); // Note [stage floor]
      if (q.devices.count >= kWorkBoundDevices && !(dp->workBound() < beat)) continue;
      if (!(dp->lowerBound() < beat)) continue;
      for (size_t i = 0; i < counts.size(); ++i) {
        const double b = dp->boundFrom(counts[i]);
        bound[i] = std::min(bound[i], b);
        if (b < beat) states[i] += double(counts[i] + 1) * (q.numBlocks() + 1) * (q.devices.count + 1);
      }
    }
  } else {
    for (size_t i = 0; i < counts.size(); ++i) states[i] = countStates(counts[i]);
  }
  std::vector<size_t> order;
  double total = 0, least = kInf;
  for (size_t i = 0; i < counts.size(); ++i) {
    least = std::min(least, bound[i]);
    if (bound[i] < beat) order.push_back(i), total += states[i];
  }
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) { return bound[x] < bound[y]; });
  if (rival && total > double(opts.auto_states)) {
    char text[400];
    std::snprintf(text, sizeof text, "its search would visit about %.3g DP states over %zu stage counts (the "
                  "automatic search stops at %.3g); pin --schedule %s to search it", total, order.size(),
                  double(opts.auto_states), name);
    const auto at = std::find_if(order.begin(), order.end(), [&](size_t i) { return counts[i] == rival_stages; });
    if (can_narrow && at != order.end()) {
      narrow(text);
      order = {*at};
    } else {
      if (tried) tried->outcome = ScheduleTried::Outcome::TooLarge, tried->why = text;
      order.clear(); // the seed, if it beat the rival, still stands
    }
  }
  std::optional<Error> refused; // a search that could not run (too many states), not one without a plan
  SolveStats total_stats;
  double lower = kInf;
  for (size_t i : order) {
    if (!(bound[i] < beat)) continue; // the plans found since beat it
    q.constraints.stages = counts[i];
    if (opts.doing) opts.doing("stage DP: " + std::string(name) + " on " + std::to_string(counts[i]) + " stage(s)");
    bool too_large = false;
    auto solved = searchStages(q, opts, beat, &too_large); // pruned by the best so far
    if (!solved) {
      if (!refused && too_large) refused = solved.error();
      continue;
    }
    total_stats.states += solved->stats.states;
    total_stats.transitions += solved->stats.transitions;
    total_stats.points += solved->stats.points;
    lower = std::min(lower, solved->stats.lower_bound_s);
    if (solved->step_time_s < beat) beat = solved->step_time_s, best = std::move(*solved);
  }
  if (!best) {
    if (rival) {
      if (tried && !narrowed.empty()) {
        char text[120];
        std::snprintf(text, sizeof text, ", where no plan beats %.6g s", rival->step_time_s);
        tried->outcome = ScheduleTried::Outcome::TooLarge, tried->why = narrowed + text;
      } else if (tried && tried->outcome == ScheduleTried::Outcome::Chosen) { // not marked too large
        char text[240];
        if (least < kInf)
          std::snprintf(text, sizeof text, "no plan beats %.6g s (its bound over every stage count: %.6g s)",
                        rival->step_time_s, least);
        else
          std::snprintf(text, sizeof text, "no plan beats %.6g s (every micro-batch count's bound reaches it)",
                        rival->step_time_s);
        tried->outcome = order.empty() ? ScheduleTried::Outcome::Bounded : ScheduleTried::Outcome::Slower;
        tried->step_time_s = order.empty() && least < kInf ? least : 0;
        tried->why = text;
      }
      return Error{std::string(name) + ": no plan faster than " + scheduleName(rival->solution.schedule)};
    }
    if (refused) return *refused;
    return detail::noFeasiblePlan(p);
  }
  best->stats.states = total_stats.states;
  best->stats.transitions = total_stats.transitions;
  best->stats.points = total_stats.points;
  // Over every stage count searched; the others could not beat the plan.
  best->stats.lower_bound_s = std::min(lower, best->step_time_s);
  best->stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (tried && tried->outcome == ScheduleTried::Outcome::Chosen) {
    tried->step_time_s = best->step_time_s;
    tried->why = narrowed; // a plan found by part of the search says so
  }
  return std::move(*best);
}

/// Note [automatic schedule]: the interleaved fold with `v` chunks, where it
/// could beat `rival`.
Expected<SolveResult> searchInterleavedAuto(const Problem &p, int v, const DPOptions &opts,
                                            const SolveResult &rival, const SolveResult &one_f_one_b,
                                            ScheduleTried &tried) {
  const char *name = pipeline::scheduleName(Schedule::Interleaved1F1B);
  auto refuse = [&](ScheduleTried::Outcome outcome, const std::string &why) -> Error {
    tried.outcome = outcome, tried.why = why;
    return Error{std::string(name) + ": " + why};
  };
  if (!p.no_interleave.empty()) return refuse(ScheduleTried::Outcome::Refused, p.no_interleave);
  if (!p.tied.empty()) return refuse(ScheduleTried::Outcome::Refused, "tied weights across chunks are not trained yet");
  if (p.constraints.replicas.size() > 1)
    return refuse(ScheduleTried::Outcome::Refused, "per-stage replica counts are pinned");
  if (p.constraints.tensor_parallel.size() > 1)
    return refuse(ScheduleTried::Outcome::Refused, "per-stage tensor-parallel degrees are pinned");
  // Note [interleaved layouts]: a pinned degree t is every chunk's; a device
  // then runs at least 1/t of a block's unsplit F + G.
  const int t = p.constraints.tensor_parallel.empty() ? 1 : p.constraints.tensor_parallel[0];
  const int P = p.constraints.stages > 0 ? p.constraints.stages : one_f_one_b.solution.numStages();
  if (P < 2) return refuse(ScheduleTried::Outcome::Refused, "the 1F1B plan has one stage: no pipeline to interleave");
  if (P * v > p.numBlocks())
    return refuse(ScheduleTried::Outcome::Refused, std::to_string(P * v) + " chunks for " +
                                                       std::to_string(p.numBlocks()) + " blocks");
  // Per (M, r) the bound M (sum of F + G) / P; only pairs under the rival stay.
  double least = kInf, states = 0;
  std::vector<std::pair<int, int>> pairs;
  bool any_count = false;
  for (int m : microbatchCandidates(p)) {
    if (m % P != 0) continue;
    any_count = true;
    for (int r = p.devices.count / (P * t); r >= 1; --r) {
      if (!p.constraints.replicas.empty() && r != p.constraints.replicas[0]) continue;
      const double b = static_cast<double>(replicaSamples(p.batch_size, m, r));
      double work = 0;
      for (const Block &blk : p.blocks) work += blk.fwd.at(b) + blk.bwd.at(b);
      const double lb = m * work / (P * t);
      least = std::min(least, lb);
      if (lb < rival.step_time_s * (1 - kTieTolerance)) {
        pairs.emplace_back(m, r);
        states += double(P * v + 1) * (p.numBlocks() + 1) * (double(v) * p.devices.count + 1);
      }
    }
  }
  if (!any_count)
    return refuse(ScheduleTried::Outcome::Refused,
                  "no micro-batch count is a multiple of the " + std::to_string(P) + " pipeline ranks");
  char text[400];
  if (pairs.empty()) {
    std::snprintf(text, sizeof text, "%d ranks: no plan beats %.6g s (its bound: %.6g s)", P, rival.step_time_s, least);
    tried.step_time_s = least;
    return refuse(ScheduleTried::Outcome::Bounded, text);
  }
  if (states > double(opts.auto_states)) {
    std::snprintf(text, sizeof text, "%d ranks: its fold would visit about %.3g DP states over %zu (micro-batch, "
                  "replica) pairs (the automatic search stops at %.3g); pin --schedule %s --stages %d "
                  "--virtual-stages %d to search it", P, states, pairs.size(), double(opts.auto_states), name, P, v);
    return refuse(ScheduleTried::Outcome::TooLarge, text);
  }
  Problem q = p;
  q.constraints.schedule = Schedule::Interleaved1F1B;
  q.constraints.virtual_stages = v;
  q.constraints.stages = P;
  auto solved = solveInterleaved(q, opts, &pairs);
  if (!solved) return refuse(ScheduleTried::Outcome::NoPlan, std::to_string(P) + " ranks: " + solved.error().message);
  if (!(solved->step_time_s < rival.step_time_s * (1 - kTieTolerance))) {
    std::snprintf(text, sizeof text, "%d ranks: its plan takes %.6g s", P, solved->step_time_s);
    tried.step_time_s = solved->step_time_s;
    return refuse(ScheduleTried::Outcome::Slower, text);
  }
  tried.step_time_s = solved->step_time_s;
  return solved;
}

/// Note [automatic schedule].
Expected<SolveResult> solveAuto(const Problem &p, const DPOptions &opts) {
  const auto start = std::chrono::steady_clock::now();
  auto first = searchStages(p, opts);
  if (!first) return first; // under 1F1B nothing fits (the others hold more), or the search is too large
  const SolveResult one_f_one_b = *first;
  SolveResult best = std::move(*first);
  std::vector<ScheduleTried> tried(1);
  tried[0].schedule = best.solution.schedule;
  tried[0].step_time_s = best.step_time_s;
  size_t chosen = 0;
  auto take = [&](Expected<SolveResult> &found) { // ties, up to rounding, stay with the earlier schedule
    if (!found || !(found->step_time_s < best.step_time_s * (1 - kTieTolerance))) return;
    best = std::move(*found);
    chosen = tried.size() - 1;
  };
  for (Schedule s : {Schedule::ZBH1, Schedule::ZBH2}) {
    tried.emplace_back();
    tried.back().schedule = s;
    if (!p.no_split_backward.empty()) {
      tried.back().outcome = ScheduleTried::Outcome::Refused, tried.back().why = p.no_split_backward;
      continue;
    }
    SolveResult rival = best;
    auto found = searchSplit(p, s, opts, &rival, &tried.back());
    take(found);
  }
  for (int v : kAutoChunks) {
    tried.emplace_back();
    tried.back().schedule = Schedule::Interleaved1F1B;
    tried.back().virtual_stages = v;
    SolveResult rival = best;
    auto found = searchInterleavedAuto(p, v, opts, rival, one_f_one_b, tried.back());
    take(found);
  }
  for (size_t i = 0; i < tried.size(); ++i) {
    ScheduleTried &t = tried[i];
    if (i == chosen) {
      if (t.outcome != ScheduleTried::Outcome::Chosen) t.why.clear(); // a seed that stood: no longer what it was
      t.outcome = ScheduleTried::Outcome::Chosen;
    } else if (t.outcome == ScheduleTried::Outcome::Chosen) { // found a plan that a later schedule beat
      char text[200];
      std::snprintf(text, sizeof text, "its plan takes %.6g s against %.6g s", t.step_time_s, best.step_time_s);
      t.outcome = ScheduleTried::Outcome::Slower, t.why = text;
    }
  }
  best.stats.schedules = std::move(tried);
  best.stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return best;
}

} // namespace

const char *outcomeName(ScheduleTried::Outcome o) {
  switch (o) {
  case ScheduleTried::Outcome::Chosen: return "chosen";
  case ScheduleTried::Outcome::Slower: return "slower";
  case ScheduleTried::Outcome::Bounded: return "bounded";
  case ScheduleTried::Outcome::Refused: return "refused";
  case ScheduleTried::Outcome::TooLarge: return "too-large";
  case ScheduleTried::Outcome::NoPlan: return "no-plan";
  }
  return "?";
}

Expected<SolveResult> solveDP(const Problem &p, const DPOptions &opts) {
  if (Status st = validate(p); !st) return Error{st.message()};
  if (p.constraints.schedule && pipeline::interleaves(*p.constraints.schedule) && p.constraints.virtual_stages > 1)
    return solveInterleaved(p, opts); // Note [interleaved layouts]
  if (!p.constraints.schedule && p.auto_schedule) return solveAuto(p, opts); // Note [automatic schedule]
  if (!pipeline::splitsBackward(*p.constraints.schedule)) return searchStages(p, opts);
  return searchSplit(p, *p.constraints.schedule, opts); // Note [split backward DP]
}

static Expected<SolveResult> searchStages(const Problem &p, const DPOptions &opts, double bound, bool *too_large) {
  const auto start = std::chrono::steady_clock::now();
  const std::vector<int> stage_counts = detail::stageCountsToSearch(p);
  // With the schedule searched only 1F1B can win (Note [exact stage DP]).
  const Schedule schedule = p.constraints.schedule.value_or(Schedule::OneFOneB);
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  auto progress = [&](const std::string &line) { // only for searches long enough to wait on
    if (opts.progress && elapsed() >= 1) opts.progress(line + " (" + std::to_string(static_cast<int>(elapsed())) + " s)");
  };

  SolveResult result;
  SolveStats &stats = result.stats;
  // Seed: the best baseline, a little above its step time so that the DP still
  // produces a plan of its own (one at least as good lies in its space).
  double incumbent = kInf;
  std::optional<SolveResult> seed;
  for (Strategy s : {Strategy::Uniform, Strategy::Parameters, Strategy::Time})
    if (auto base = solveBaseline(p, s); base.ok() && base->solution.schedule == schedule)
      if (!seed || base->step_time_s < seed->step_time_s) seed = *base;
  if (seed) incumbent = seed->step_time_s * (1 + 1e-9);
  incumbent = std::min(incumbent, bound);
  const double seeded = incumbent;

  struct Candidate {
    double bound;
    int microbatches;
    int quantum; // the search's (Note [device quantum])
    int warm;    // a coarser quantum to search first, or 0
    bool every_width; // the bound holds over every stage width (not only the quantum's)
    bool warmed = false; // searched at `warm` already
  };
  std::vector<Candidate> order;
  auto timed = [&](MicrobatchDP &dp) {
    const auto t0 = std::chrono::steady_clock::now();
    const double bound = dp.lowerBound();
    stats.bound_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return bound;
  };
  // Note [device quantum]: a count with few states is bounded and searched at
  // every width. Otherwise it is searched at the finest quantum within the
  // budget, after a search at the finest within kWarmStates, whose plan prunes
  // the finer one; its bound comes from the relaxation at that coarse quantum
  // (a bound on every width, cheap).
  const std::vector<int> quanta = detail::deviceQuanta(p, opts.device_quantum);
  const bool use_work = p.devices.count >= kWorkBoundDevices;
  const int64_t budget = std::min(opts.max_states, kMaxStates), warm_budget = std::min(kWarmStates, budget / 8);
  // One micro-batch count's search at a quantum: the all-reduce thresholds of
  // Note [exact stage DP], each pass pruned by (and lowering) `best`.
  auto search = [&](const Candidate &c, int quantum, bool relaxed, double &best, Solution &plan, SolveStats &st) {
    MicrobatchDP dp(p, c.microbatches, schedule, stage_counts, quantum, relaxed);
    if (opts.doing)
      opts.doing("stage DP: searching M=" + std::to_string(c.microbatches) + " on " + std::to_string(dp.numStates()) +
                 " states");
    for (double tau = kInf; tau > 0;) {
      // The backward pass runs once, at tau = inf: its bounds stay lower
      // bounds under every smaller threshold (fewer stages allowed), and
      // the work bound, cheap, is taken again at each (Note [work bound]).
      dp.setAllReduceLimit(tau);
      dp.setIncumbent(best); // Note [stage floor]
      if ((use_work && !(dp.workBound() < best)) || (tau == kInf && !(timed(dp) < best))) break;
      tau = dp.solve(best, plan, st);
      ++st.allreduce_thresholds;
    }
    progress("stage DP: M=" + std::to_string(c.microbatches) + (relaxed ? " bounded" : " searched") +
             " at stage widths in multiples of " + std::to_string(quantum) + " on " +
             std::to_string(dp.numStates()) + " states (bound " + std::to_string(c.bound) + " s): " +
             std::to_string(best) + " s");
  };
  std::vector<std::pair<int, bool>> bound_on; // per candidate: the quantum and relaxation its bound is taken on
  for (int m : microbatchCandidates(p)) {
    std::optional<MicrobatchDP> dp;
    int fine = 0, warm = 0;
    for (int q : quanta) {
      dp.emplace(p, m, schedule, stage_counts, q);
      if (q == quanta.front() && dp->numStates() <= std::min(kWarmStates, budget)) break;
      if (!fine && dp->numStates() <= budget) fine = q;
      if (dp->numStates() <= warm_budget) {
        warm = q;
        dp.emplace(p, m, schedule, stage_counts, q, /*relaxed=*/true);
        break;
      }
    }
    if (!fine) fine = dp->quantum();
    if (dp->numStates() > kMaxStates) {
      if (too_large) *too_large = true;
      return Error{"the stage DP would need " + std::to_string(dp->numStates()) + " states for " +
                   std::to_string(p.numBlocks()) + " blocks on " + std::to_string(p.devices.count) +
                   " devices at stage widths in multiples of " + std::to_string(dp->quantum()) +
                   "; coarsen the problem to fewer blocks first (coarsen())"};
    }
    dp->setIncumbent(incumbent); // the seed (Note [stage floor])
    const double work = use_work ? dp->workBound() : 0; // Note [work bound]
    order.push_back({work, m, fine, warm, dp->quantum() == 1 || warm > 0});
    bound_on.emplace_back(dp->quantum(), warm > 0);
    stats.device_quantum = std::max(stats.device_quantum, fine);
  }
  stats.microbatch_counts = static_cast<int>(order.size());
  // Note [stage floor]: the floors prune by the best plan known, so before the
  // backward bounds, a coarse search of the count with the least work bound
  // replaces the baseline's step by a plan near the optimum (GPT 18.4B on
  // 256 devices: 16.5 s of CPU before, 9.3 s after, the same plan).
  int early = -1;
  for (size_t i = 0; i < order.size() && use_work; ++i)
    if (order[i].warm > order[i].quantum && order[i].bound < incumbent &&
        (early < 0 || order[i].bound < order[size_t(early)].bound))
      early = static_cast<int>(i);
  if (early >= 0) search(order[size_t(early)], order[size_t(early)].warm, false, incumbent, result.solution, stats);
  for (size_t i = 0; i < order.size(); ++i) {
    MicrobatchDP dp(p, order[i].microbatches, schedule, stage_counts, bound_on[i].first, bound_on[i].second);
    dp.setIncumbent(incumbent);
    if (order[i].bound < incumbent) order[i].bound = std::max(order[i].bound, timed(dp)); // else pruned already
    order[i].warmed = static_cast<int>(i) == early;
  }
  std::stable_sort(order.begin(), order.end(),
                   [](const Candidate &x, const Candidate &y) { return x.bound < y.bound; });
  progress("stage DP: bounded " + std::to_string(order.size()) + " micro-batch counts");
  for (const Candidate &c : order)
    if (c.warm > c.quantum && !c.warmed && c.bound < incumbent) search(c, c.warm, false, incumbent, result.solution, stats);
  for (const Candidate &c : order) {
    if (!(c.bound < incumbent)) {
      ++stats.microbatch_counts_pruned;
      continue;
    }
    search(c, c.quantum, false, incumbent, result.solution, stats);
  }
  bool found = incumbent < seeded;
  if (!found && seed) {
    // Unreachable while the baselines stay inside the search space; a valid
    // plan is still the better answer than none.
    result.solution = seed->solution;
    incumbent = seed->step_time_s;
    found = true;
  }
  if (!found) {
    stats.seconds = elapsed();
    return detail::noFeasiblePlan(p);
  }
  result.step_time_s = incumbent;
  // Note [device quantum]: where widths were restricted, the relaxation bounds
  // what the unrestricted search could have found; it only has to look below
  // the plan found, and every micro-batch count is bounded again. (Solved at
  // a coarser quantum, also a bound on every width, it is far looser and its
  // search no faster: GPT 145.6B at quantum 32 instead of 8, 11.3 s against
  // 18.1 s, after 380 s of forward pass.)
  double lower = incumbent;
  for (const Candidate &c : order) {
    if (c.quantum <= 1 || (c.every_width && !(c.bound < lower))) continue; // every width searched, or no better plan
    if (MicrobatchDP(p, c.microbatches, schedule, stage_counts, c.quantum, true).numStates() > kMaxStates) {
      lower = std::min(lower, c.every_width ? c.bound : 0.0); // too large to relax at this quantum
      continue;
    }
    Solution unused;
    SolveStats relaxed_stats;
    search(c, c.quantum, true, lower, unused, relaxed_stats);
  }
  stats.lower_bound_s = lower;
  stats.seconds = elapsed();
  return result;
}

} // namespace rannc::partition
