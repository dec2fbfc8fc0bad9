// The numbers of one candidate stage of the stage DP (planner/partition/dp.cpp)
// at one micro-batch count, from prefix sums and range-maximum tables: its
// time, all-reduce and memory choice for any block range, replica count,
// tensor-parallel degree and placement, each in O(log n).
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "planner/partition/evaluate.h"
#include "planner/partition/problem.h"

namespace rannc::partition::detail {

/// Per-stage numbers of one candidate stage (placement included).
struct StageVals {
  double a;    // F + G
  double c[2]; // the maxima's arguments, see Note [exact stage DP]
  double ar;
  bool recompute;
  bool zero;
  int16_t tp;
  /// Of a, the backward slot G (ZB-H2's credit, Note [split backward DP]);
  /// infinite in the relaxation, which pairs no G with its least a.
  double g = std::numeric_limits<double>::infinity();
};

/// The per-stage numbers the stage DP asks for (see the file comment).
class StageTable {
protected:
  /// `quantum` > 1: stage widths in multiples of it, d counted in quanta;
  /// `relaxed`: the relaxation of Note [device quantum] in dp.cpp instead.
  StageTable(const Problem &p, int microbatches, Schedule schedule, int quantum, bool relaxed)
      : p_(p), n_(p.numBlocks()), D_(p.devices.count), M_(microbatches), sched_(schedule),
        R_(replicaCandidates(p, microbatches)),
        T_(tpCandidates(p)), cap_(p.devices.capacity()), q_(std::max(1, quantum)), Dq_(D_ / q_),
        relaxed_(relaxed && q_ > 1), split_(pipeline::splitsBackward(schedule)), S_(p.constraints.stages) {
    nc_ = sched_ == Schedule::GPipe ? 2 : 1;
    per_microbatch_ = (p.batch_size + M_ - 1) / M_;
    for (int r : R_) samples_.push_back(static_cast<double>(replicaSamples(p.batch_size, M_, r)));

    // Prefix sums of the whole numbers and of their tensor-parallel parts
    // (Note [tensor parallel stages]); a stage of degree t takes whole - (1 -
    // 1/t) split.
    f0_.assign(n_ + 1, 0), f1_ = g0_ = g1_ = params_ = bufs_ = f0_;
    tf0_ = tf1_ = tg0_ = tg1_ = tparams_ = tlowp_ = coll_ = ncoll_ = sync_ = nsync_ = f0_;
    w0_ = w1_ = tw0_ = tw1_ = wbytes_ = wparams_ = f0_;
    for (int i = 0; i < n_; ++i) {
      const Block &b = p.blocks[i];
      w0_[i + 1] = w0_[i] + b.wgrad.fixed_s;
      w1_[i + 1] = w1_[i] + b.wgrad.per_sample_s;
      const Affine wsplit = b.wgradSplit(); // Note [split backward of a tensor-parallel stage]
      tw0_[i + 1] = tw0_[i] + wsplit.fixed_s;
      tw1_[i + 1] = tw1_[i] + wsplit.per_sample_s;
      wbytes_[i + 1] = wbytes_[i] + b.wgrad_bytes_per_sample;
      wparams_[i + 1] = wparams_[i] + b.wgrad_param_bytes;
      f0_[i + 1] = f0_[i] + b.fwd.fixed_s;
      f1_[i + 1] = f1_[i] + b.fwd.per_sample_s;
      g0_[i + 1] = g0_[i] + b.bwd.fixed_s;
      g1_[i + 1] = g1_[i] + b.bwd.per_sample_s;
      params_[i + 1] = params_[i] + b.param_bytes;
      bufs_[i + 1] = bufs_[i] + b.buffer_bytes + b.lowp_weight_bytes; // both fixed per stage
      tf0_[i + 1] = tf0_[i] + b.tp.fwd.fixed_s;
      tf1_[i + 1] = tf1_[i] + b.tp.fwd.per_sample_s;
      tg0_[i + 1] = tg0_[i] + b.tp.bwd.fixed_s;
      tg1_[i + 1] = tg1_[i] + b.tp.bwd.per_sample_s;
      tparams_[i + 1] = tparams_[i] + b.tp.param_bytes;
      tlowp_[i + 1] = tlowp_[i] + b.tp.lowp_weight_bytes;
      coll_[i + 1] = coll_[i] + b.tp.collective_bytes_per_sample;
      ncoll_[i + 1] = ncoll_[i] + b.tp.collectives;
      sync_[i + 1] = sync_[i] + b.stat_sync_bytes;
      nsync_[i + 1] = nsync_[i] + b.stat_sync_collectives;
    }
    // stageWorking from range maxima, one pair of sparse tables per
    // micro-batch size and degree: of w_u, and of w_u + b kept_[u+1], where
    // S_u = act_[e] - kept_[u+1] and kept_[k] = act_[k] - X_k.
    act_.resize(T_.size()), kept_.resize(T_.size());
    for (size_t ti = 0; ti < T_.size(); ++ti) {
      std::vector<double> &act = act_[ti], &kept = kept_[ti];
      act.assign(n_ + 1, 0);
      for (int i = 0; i < n_; ++i) // Note [unsaved values]
        act[i + 1] = act[i] + p.blocks[i].activationAt(T_[ti]) - p.blocks[i].unsaved_freed_bytes_per_sample;
      for (int k = 0; k <= n_; ++k) kept.push_back(act[k] - p.unsavedCutAt(k));
    }
    auto sparse = [this](std::vector<double> row) {
      std::vector<std::vector<double>> table{std::move(row)};
      for (int len = 2; len <= n_; len *= 2) {
        const std::vector<double> &prev = table.back();
        std::vector<double> next(n_ - len + 1);
        for (int i = 0; i + len <= n_; ++i) next[i] = std::max(prev[i], prev[i + len / 2]);
        table.push_back(std::move(next));
      }
      return table;
    };
    work_.resize(T_.size()), keyed_work_.resize(T_.size());
    for (size_t ti = 0; ti < T_.size(); ++ti)
      for (double b : samples_) {
        std::vector<double> work, keyed;
        for (int u = 0; u < n_; ++u) {
          work.push_back(p.blocks[u].workingAt(b, T_[ti]));
          keyed.push_back(work.back() + b * kept_[ti][u + 1]);
        }
        work_[ti].push_back(sparse(std::move(work)));
        keyed_work_[ti].push_back(sparse(std::move(keyed)));
      }
    lparam_.resize(T_.size()); // an unsharded Adam step's temporaries (Note [partition cost model])
    for (size_t ti = 0; ti < T_.size(); ++ti) {
      std::vector<double> largest;
      for (int u = 0; u < n_; ++u) largest.push_back(p.blocks[u].largestParamAt(T_[ti]));
      lparam_[ti] = sparse(std::move(largest));
    }
    if (split_) { // Note [what a queued W keeps]: B's part of each working line, and W's
      bwork_.resize(T_.size()), wwork_.resize(T_.size());
      for (size_t ti = 0; ti < T_.size(); ++ti) {
        std::vector<double> fixed;
        for (int u = 0; u < n_; ++u) fixed.push_back(p.blocks[u].workingAt(0, T_[ti]));
        for (double b : samples_) {
          std::vector<double> per;
          for (int u = 0; u < n_; ++u) per.push_back(p.blocks[u].workingAt(b, T_[ti]) - fixed[u]);
          bwork_[ti].push_back(sparse(std::move(per)));
        }
        wwork_[ti] = sparse(std::move(fixed));
      }
    }
    if (!p.pass_over.empty()) { // Note [values passing over]: pass_[a][e] = sum over from < a, to >= e
      pass_.assign(static_cast<size_t>(n_ + 1) * (n_ + 1), 0.0);
      auto at = [this](int a, int e) -> double & { return pass_[static_cast<size_t>(a) * (n_ + 1) + e]; };
      for (const Problem::PassOver &s : p.pass_over) at(s.from + 1, s.to) += s.bytes_per_sample;
      for (int a = 1; a <= n_; ++a) // from < a: a running sum over a
        for (int e = 0; e <= n_; ++e) at(a, e) += at(a - 1, e);
      for (int a = 0; a <= n_; ++a) // to >= e: a running sum from the right
        for (int e = n_ - 1; e >= 0; --e) at(a, e) += at(a, e + 1);
    }
  }

  /// Problem::passOverAt(a, e), tabled.
  double passOver(int a, int e) const { return pass_.empty() ? 0.0 : pass_[static_cast<size_t>(a) * (n_ + 1) + e]; }

  /// The quanta a stage of `devices` devices advances d by (rounded down in the relaxation).
  int quanta(int devices) const { return devices / q_; }
  /// Whether a stage may be `devices` wide: a multiple of the quantum (any width in the relaxation).
  bool widthAllowed(int devices) const { return relaxed_ || devices % q_ == 0; }
  /// Where a stage of R_[ri] groups of T_[ti] ranks from quantum d sits: bits
  /// 0-2 of placement() for a stage with neighbours on both sides, kGroupsFit
  /// when each group stays inside a node (Note [tensor parallel stages]; the
  /// relaxation does not know the rank, so it allows every placement), and
  /// its all-reduce's ring bandwidth. Tabled once per width: computed per
  /// state and transition, these tests took 40% of GPT 18.4B's planning.
  struct Seat {
    uint8_t bits;
    double bw;
  };
  static constexpr uint8_t kGroupsFit = 8;

  /// Fills seats_ (once; not in the constructor, which solveDP also uses to count states).
  void placeSeats() {
    if (!seats_.empty()) return;
    seats_.assign(T_.size(), std::vector<std::vector<Seat>>(R_.size()));
    for (size_t ti = 0; ti < T_.size(); ++ti)
      for (size_t ri = 0; ri < R_.size(); ++ri) {
        const int r = R_[ri], tp = T_[ti], devices = r * tp;
        if (!widthAllowed(devices) || quanta(devices) > Dq_) continue;
        for (int d = 0; d + quanta(devices) <= Dq_; ++d) {
          const int rank = d * q_;
          const bool fit = relaxed_ || p_.devices.groupsInsideNodes(rank, r, tp);
          const int bits = (relaxed_ ? 0 : placement(1, 0, devices, rank)) | (fit ? kGroupsFit : 0);
          seats_[ti][ri].push_back({static_cast<uint8_t>(bits), p_.devices.allReduceBandwidth(rank, r, tp)});
        }
      }
  }

  /// The placement() bits that apply to a stage [a, e): an input link only
  /// after the first block, an output link only before the last.
  int placementMask(int a, int e) const { return (a > 0 ? 1 : 0) | (e < n_ ? 2 : 0) | 4; }
  int node(int rank) const { return rank / p_.devices.per_node; }
  const Link &link(bool intra) const { return intra ? p_.devices.intra_node : p_.devices.inter_node; }

  /// The largest entry of a sparse table over blocks [a, e), a < e.
  static double rangeMax(const std::vector<std::vector<double>> &table, int a, int e) {
    int level = 0;
    while ((2 << level) <= e - a) ++level;
    return std::max(table[level][a], table[level][e - (1 << level)]);
  }

  /// stageWorking(p, a, e, b, T_[ti]) for b = samples_[ri]: block u < e-1
  /// counts w_u - b max(0, S_u - cut[e]). kept_ never decreases (Note
  /// [unsaved values]; partition::validate holds it at every degree), so
  /// S_u >= cut[e] holds for a prefix [a, m) of the blocks, found by bisection.
  double maxWork(int a, int e, size_t ri, size_t ti) const {
    const double b = samples_[ri];
    double w = p_.blocks[e - 1].workingAt(b, T_[ti]);
    if (e - a < 2) return w;
    const std::vector<double> &kept = kept_[ti];
    const double total = act_[ti][e], cut = p_.cut_bytes_per_sample[e]; // S_u = total - kept[u+1]
    const int m = static_cast<int>(std::upper_bound(kept.begin() + a + 1, kept.begin() + e, total - cut) -
                                   (kept.begin() + 1));
    if (m > a) w = std::max(w, rangeMax(keyed_work_[ti][ri], a, m) - b * (total - cut));
    if (m < e - 1) w = std::max(w, rangeMax(work_[ti][ri], m, e - 1));
    return w;
  }

  /// 1 - 1/t for T_[ti]: the share of a split number one device does not hold.
  double keep(size_t ti) const { return 1 - 1.0 / T_[ti]; }

  /// The parameter bytes of blocks [a, e) on one device at degree T_[ti], a
  /// tied parameter once (Note [tied parameters] in evaluate.cpp).
  double stageParams(int a, int e, size_t ti) const {
    const double params = params_[e] - params_[a] - keep(ti) * (tparams_[e] - tparams_[a]);
    return p_.tied.empty() ? params : params - p_.tiedExcess(a, e, T_[ti]);
  }

  /// Parameters, gradients, optimizer state and buffers of blocks [a, e) fit
  /// at all at degree T_[ti] (false for every longer range too), the state
  /// sharded as far as it can be; memoryChoice's memory is at least this. The
  /// largest degree (the default) holds the least: false there, false at every degree.
  bool paramsFit(int a, int e, size_t ti) const {
    const double params = stageParams(a, e, ti);
    const double opt = p_.optimizer_bytes_per_param_byte * params;
    const int max_r = R_.empty() ? 1 : R_.back();
    const double buffers = bufs_[e] - bufs_[a] - keep(ti) * (tlowp_[e] - tlowp_[a]);
    return params + params + (p_.allow_zero && max_r > 1 ? opt / max_r : opt) + buffers <= cap_;
  }
  bool paramsFit(int a, int e) const { return paramsFit(a, e, T_.size() - 1); }

  /// Whether the memory of blocks [a, e) at degree T_[ti] never falls as more
  /// micro-batches are in flight (stageMemory: inputs and saved values, or
  /// the inputs alone when recomputing, times the count in flight).
  bool memoryGrowsWithInflight(int a, int e, size_t ti) const {
    const double cut_in = p_.cut_bytes_per_sample[a] - passOver(a, e);
    return cut_in >= 0 && cut_in + act_[ti][e] - act_[ti][a] + p_.unsavedCutAt(a) + p_.receivedLayoutAt(a) >= 0;
  }

  static constexpr int kRecompute = 1, kZero = 2; ///< bits of a memory choice

  /// How blocks [a, e) on R_[ri] replicas fit with `inflight` micro-batches
  /// in flight: the fastest allowed choice that fits, as kRecompute | kZero
  /// bits, or -1 when none does. Sharding costs no time (Note [partition cost
  /// model]), so it is taken only where memory needs it; recomputation costs
  /// a forward, so it comes last. evaluateStage's formula (stageMemory) on
  /// the same sums, from prefix sums.
  int memoryChoice(int a, int e, size_t ri, size_t ti, int inflight, int weight_queue = 0) const {
    StageMemoryInputs in;
    in.param_bytes = stageParams(a, e, ti);
    in.largest_param = rangeMax(lparam_[ti], a, e);
    in.optimizer_bytes = p_.optimizer_bytes_per_param_byte * in.param_bytes;
    in.model_buffers = bufs_[e] - bufs_[a] - keep(ti) * (tlowp_[e] - tlowp_[a]);
    // K (Note [unsaved values]), with what the stage keeps for receiving views contiguous (Note [received layout])
    in.act_per_sample = act_[ti][e] - act_[ti][a] + p_.unsavedCutAt(a) + p_.receivedLayoutAt(a);
    in.working = maxWork(a, e, ri, ti);
    in.cut_in = p_.cut_bytes_per_sample[a] - passOver(a, e); // Note [values passing over]
    in.samples = samples_[ri];
    in.inflight = inflight;
    in.replicas = R_[ri];
    if (split_) { // B keeps autograd's graph for W: nothing is freed early (Note [zero bubble H1])
      in.working = rangeMax(bwork_[ti][ri], a, e);
      in.weight_working = rangeMax(wwork_[ti], a, e);
      in.weight_queue = std::max(0, weight_queue);
      in.wgrad_per_sample = wbytes_[e] - wbytes_[a] + p_.wgradReadCutAt(a); // Note [what a queued W keeps]
      in.wgrad_fixed = wparams_[e] - wparams_[a];
    }
    if (T_[ti] == 1) in.working -= in.samples * passOver(a, e); // nor their gradients
    // weight_queue < 0: the stage index is open (a bound pass): the least
    // over every queue length, which is at one end, the memory being linear
    // in it (a queued micro-batch holds w where a waiting one holds cut + K).
    StageMemoryInputs longest = in;
    longest.weight_queue = std::max(0, inflight - 1);
    for (bool rec : {false, true}) {
      if (!p_.recomputeAllowed(rec)) continue;
      for (bool zero : {false, true}) {
        if (!p_.zeroAllowed(zero, in.replicas)) continue;
        double total = stageMemory(in, rec, zero).total();
        if (weight_queue < 0) total = std::min(total, stageMemory(longest, rec, zero).total());
        if (total <= cap_) return (rec ? kRecompute : 0) | (zero ? kZero : 0);
      }
    }
    return -1;
  }

  /// Which links a stage [a, e) on ranks d .. d+r-1 (r: its devices) uses:
  /// bit 0 its inputs arrive inside a node, bit 1 its output gradients do,
  /// bit 2 its all-reduce stays inside a node (Note [partition cost model]).
  int placement(int a, int e, int r, int d) const {
    int flags = 0;
    if (a > 0 && node(d - 1) == node(d + r - 1)) flags |= 1;
    if (e < n_ && node(d) == node(d + r)) flags |= 2;
    if (node(d) == node(d + r - 1)) flags |= 4;
    return flags;
  }

  static constexpr int kAnyPlacement = 8; ///< the relaxation's placement: the least of every number

  /// values() at a placement (kAnyPlacement in the relaxation): for
  /// kAnyPlacement each number's least over the placements, a lower bound on
  /// the stage wherever it sits. The relaxation's least all-reduce is the one
  /// inside a node (flag 4), which no ring across nodes beats, so `bw` does
  /// not matter there.
  StageVals placedValues(int a, int e, size_t ri, size_t ti, int choice, int flags, double bw) const {
    if (flags != kAnyPlacement) return values(a, e, ri, ti, choice, flags, bw);
    StageVals least = values(a, e, ri, ti, choice, 0, bw);
    for (int f = 1; f < kAnyPlacement; ++f) {
      const StageVals v = values(a, e, ri, ti, choice, f, bw);
      least.a = std::min(least.a, v.a), least.ar = std::min(least.ar, v.ar);
      for (int i = 0; i < nc_; ++i) least.c[i] = std::min(least.c[i], v.c[i]);
    }
    least.g = std::numeric_limits<double>::infinity(); // no G goes with the least a: ZB-H2's credit at its most
    return least;
  }

  /// A lower bound on the step time of every plan with the stage [a, e) on
  /// R_[ri] groups of T_[ti], wherever it sits and whatever its memory
  /// choice: M times its slot without transfers or recomputation, plus its
  /// all-reduce on the fastest ring (Note [stage floor] in dp.cpp).
  double stageFloor(int a, int e, size_t ri, size_t ti) const {
    const int r = R_[ri], tp = T_[ti];
    const double b = samples_[ri], k = keep(ti);
    double slot = (f0_[e] - f0_[a]) + (f1_[e] - f1_[a]) * b - k * ((tf0_[e] - tf0_[a]) + (tf1_[e] - tf1_[a]) * b) +
                  (g0_[e] - g0_[a]) + (g1_[e] - g1_[a]) * b - k * ((tg0_[e] - tg0_[a]) + (tg1_[e] - tg1_[a]) * b);
    if (tp > 1)
      slot += 2 * ringAllReduce((coll_[e] - coll_[a]) * b, tp, p_.devices.intra_node, ncoll_[e] - ncoll_[a]);
    double ar = 0;
    if (r > 1) { // no ring is faster than the intra-node link (Devices::allReduceBandwidth)
      const Link fastest{p_.devices.intra_node.bandwidth,
                         std::min(p_.devices.intra_node.latency_s, p_.devices.inter_node.latency_s)};
      ar = ringAllReduce(stageParams(a, e, ti), r, fastest, 2.0 * (r - 1));
    }
    // Note [split backward DP]: under a split backward the stages' fill and
    // drain may sum to less than this stage's slot, but each adds at least its F.
    if (split_ && M_ >= S_) return (M_ - 1) * slot + ar;
    return M_ * slot + ar;
  }

  /// The W of blocks [a, e) on R_[ri] replicas of degree T_[ti]: a split
  /// backward's weight pass (Note [split backward of a tensor-parallel stage]).
  double weightTime(int a, int e, size_t ri, size_t ti) const {
    const double b = samples_[ri];
    return (w0_[e] - w0_[a]) + (w1_[e] - w1_[a]) * b - keep(ti) * ((tw0_[e] - tw0_[a]) + (tw1_[e] - tw1_[a]) * b);
  }

  /// What a stage with k stages still to place, itself included, and
  /// backward slot `g` takes off the step under a split backward
  /// (pipeline::pipelineTime), nothing if it is the last stage: ZB-H1's
  /// min(G, 2W) where M >= S (it adds max(F, F+G-2W), not F+G); ZB-H2's
  /// min(G, 3W) where M >= 2S-1; at most 2W or 3W for an unknown G (the
  /// bound passes: F + G less the credit never falls as G does).
  double splitCredit(int k, int a, int e, size_t ri, size_t ti,
                     double g = std::numeric_limits<double>::infinity()) const {
    if (!split_ || k <= 1) return 0.0;
    const double w = weightTime(a, e, ri, ti);
    // S_ = 0: the stage count is not known (the bound of Note [automatic
    // schedule] in dp.cpp), so the most any count would take off.
    if (sched_ == Schedule::ZBH2 && M_ >= 2 * S_ - 1) return S_ > 0 ? std::min(g, 3 * w) : std::max(std::min(g, 3 * w), 2 * w);
    return M_ >= S_ ? std::min(g, 2 * w) : 0.0;
  }

  /// The least stageFloor of [a, e) over the degrees and replica counts a
  /// stage may take; it never falls as e grows (every term is a sum over blocks).
  double rangeFloor(int a, int e) const {
    double least = std::numeric_limits<double>::infinity();
    for (size_t ti = 0; ti < T_.size(); ++ti)
      for (size_t ri = 0; ri < R_.size() && R_[ri] <= per_microbatch_; ++ri)
        least = std::min(least, stageFloor(a, e, ri, ti));
    return least;
  }

  /// The stage's numbers (see StageVals) for a placement from placement().
  /// `bw`: the all-reduce ring's bandwidth from the stage's first rank (its
  /// shard's replicas are every tp-th rank from there).
  StageVals values(int a, int e, size_t ri, size_t ti, int choice, int flags, double bw) const {
    const bool rec = choice & kRecompute;
    const int r = R_[ri], tp = T_[ti];
    const double b = samples_[ri], k = keep(ti);
    const double params = stageParams(a, e, ti);
    double fwd = (f0_[e] - f0_[a]) + (f1_[e] - f1_[a]) * b - k * ((tf0_[e] - tf0_[a]) + (tf1_[e] - tf1_[a]) * b);
    double bwd = (g0_[e] - g0_[a]) + (g1_[e] - g1_[a]) * b - k * ((tg0_[e] - tg0_[a]) + (tg1_[e] - tg1_[a]) * b);
    if (tp > 1) { // the group's collectives, in both passes (Note [tensor parallel stages])
      const double coll = ringAllReduce((coll_[e] - coll_[a]) * b, tp, p_.devices.intra_node, ncoll_[e] - ncoll_[a]);
      fwd += coll, bwd += coll;
    }
    double recv_act = 0, recv_grad = 0, ar = 0;
    if (r > 1 && nsync_[e] > nsync_[a]) { // synchronised batch statistics, in both passes (Note [partition cost model])
      Link ring = link(flags & 4);
      ring.bandwidth = bw;
      const double sync = ringAllReduce(sync_[e] - sync_[a], r, ring, (nsync_[e] - nsync_[a]) * 2.0 * (r - 1));
      fwd += sync, bwd += sync;
    }
    if (a > 0) {
      recv_act = receiveTime(p_.devices, link(flags & 1), flags & 1, p_.cut_bytes_per_sample[a] * b, tp);
    }
    if (e < n_) {
      recv_grad = receiveTime(p_.devices, link(flags & 2), flags & 2, p_.cut_bytes_per_sample[e] * b, tp);
    }
    if (r > 1) {
      Link ring = link(flags & 4);
      ring.bandwidth = bw;
      ar = ringAllReduce(params, r, ring, 2.0 * (r - 1));
    }
    const double f = recv_act + fwd, g = recv_grad + (rec ? fwd : 0) + bwd;
    StageVals v{f + g, {0, 0}, ar, rec, (choice & kZero) != 0, static_cast<int16_t>(tp), g};
    if (sched_ == Schedule::GPipe) {
      v.c[0] = f, v.c[1] = g;
    } else {
      v.c[0] = f + g;
    }
    return v;
  }

  const Problem &p_;
  const int n_, D_, M_;
  const Schedule sched_;
  const std::vector<int> R_;
  const std::vector<int> T_; // tensor-parallel degrees, ascending
  const double cap_;
  const int q_, Dq_;    // device quantum and the quanta on the devices (Note [device quantum])
  const bool relaxed_;  // the relaxation: widths rounded down to quanta, any placement
  const bool split_;    // a schedule that splits the backward (Note [split backward DP])
  const int S_;         // its stage count, pinned by solveDP (0 otherwise: a bound over every count)
  const int later_ = relaxed_ ? 0 : 1; // quanta each later stage needs at least
  int nc_ = 1; // the maxima in a plan's value: 2 for GPipe (F, G), else 1
  int64_t per_microbatch_ = 0;
  std::vector<double> samples_;
  std::vector<double> f0_, f1_, g0_, g1_, params_, bufs_;
  std::vector<double> tf0_, tf1_, tg0_, tg1_, tparams_, tlowp_, coll_, ncoll_; // tensor-parallel parts
  std::vector<double> sync_, nsync_; // synchronised batch statistics: bytes and all-reduces a pass
  std::vector<double> pass_; // Note [values passing over]: [(n+1) a + e], empty when nothing passes over
  std::vector<double> w0_, w1_, wbytes_, wparams_; // a split backward's W: time (fixed, per sample), queued bytes a sample and a micro-batch
  std::vector<double> tw0_, tw1_;        // of W's time, the part a tensor-parallel degree divides
  std::vector<std::vector<double>> act_;  ///< per degree: of act_i - fr_i at that degree
  std::vector<std::vector<double>> kept_; ///< per degree: act_[k] - X_k (Note [unsaved values])
  std::vector<std::vector<std::vector<std::vector<double>>>> work_; // work_[ti][ri][j][i] = max over blocks [i, i + 2^j)
  std::vector<std::vector<std::vector<std::vector<double>>>> keyed_work_; // the same of w_u + b kept_[u+1]
  std::vector<std::vector<std::vector<std::vector<double>>>> bwork_; // split backward: of w_u - fixed_u (B's)
  std::vector<std::vector<std::vector<double>>> wwork_;             // and of fixed_u (W's), per degree
  std::vector<std::vector<std::vector<double>>> lparam_;            // of Block::largestParamAt, per degree
  std::vector<std::vector<std::vector<Seat>>> seats_; // [ti][ri][d], see Seat
};

} // namespace rannc::partition::detail
