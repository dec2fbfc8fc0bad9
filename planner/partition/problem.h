// The partitioner's numeric problem: everything the solvers see instead of the
// graph (XLA auto-sharding style). The driver lowers Graph + costs + cluster
// into a Problem; every solver (DP, exhaustive, baselines) returns a Solution;
// `evaluate` (evaluate.h) is the one place that turns a Solution back into time
// and memory. The cost model is written out in docs/partitioner.md and in
// Note [partition cost model] in evaluate.cpp.
//
// Units: seconds, bytes (double, so per-sample averages may be fractional;
// integer byte counts below 2^53 stay exact), samples.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "planner/pipeline/schedule.h"
#include "planner/support/status.h"

namespace rannc::partition {

/// time(b) = fixed_s + per_sample_s * b for a per-replica micro-batch of b samples.
struct Affine {
  double fixed_s = 0;
  double per_sample_s = 0;

  double at(double samples) const { return fixed_s + per_sample_s * samples; }
};

/// A contiguous run of ops; stage boundaries fall only between blocks.
struct Block {
  Affine fwd;                              ///< forward time
  Affine bwd;                              ///< backward time, without recomputation
  double param_bytes = 0;                  ///< trainable parameters the block owns
  /// Its largest parameter tensor that tensor parallelism does not split (of
  /// those it splits: tp.largest_param_bytes); an unsharded Adam step's
  /// temporaries are two of the largest (Note [partition cost model]).
  double largest_param_bytes = 0;
  double buffer_bytes = 0;                 ///< model buffers (BatchNorm statistics): no gradient, no optimizer state
  double lowp_weight_bytes = 0;            ///< bf16/fp16 weight copies autocast keeps (Note [autocast dtypes])
  double activation_bytes_per_sample = 0;  ///< kept from forward until backward, the block measured alone
  /// Made by earlier blocks, saved nowhere, read last here (Note [unsaved values]).
  double unsaved_freed_bytes_per_sample = 0;
  double working_bytes_per_sample = 0;     ///< transient peak while the block's largest op runs, per sample,
  double working_fixed_bytes = 0;          ///< plus this at any batch size (parameter gradients being made)
  /// Of bwd, the weight gradients: a split backward's W (Note [zero bubble H1]).
  Affine wgrad;
  /// The gradients a split backward's B keeps for W, per sample: those of the
  /// outputs of the block's ops that read weights (ir::weightGradientRoots).
  double wgrad_bytes_per_sample = 0;
  /// And at any batch size: the gradients of the parameters whose ops'
  /// weight gradients B computes (a bias, a norm's scale), which B hands the
  /// micro-batch's W (Note [weight gradients in B] in planner/ir/weight_gradients.h).
  double wgrad_param_bytes = 0;
  /// Synchronised BatchNorm statistics (Note [batch statistics] in
  /// planner/plan/batch_statistics.cpp): the bytes a stage's replicas
  /// all-reduce in one forward (the backward the same) and in how many
  /// all-reduces; 0 unless planned with --batchnorm exact.
  double stat_sync_bytes = 0;
  double stat_sync_collectives = 0;

  /// Of the numbers above, the parts that divide by a stage's tensor-parallel
  /// degree t (Note [tensor parallel stages] in evaluate.cpp); all 0 when
  /// nothing in the block can be split.
  struct Split {
    Affine fwd, bwd;                         ///< compute of the split ops
    double param_bytes = 0;                  ///< sharded parameters (axis >= 0)
    double largest_param_bytes = 0;          ///< the largest of them, whole
    double lowp_weight_bytes = 0;            ///< their low-precision copies
    double activation_bytes_per_sample = 0;  ///< saved values cut along an axis (never unsaved ones)
    double working_bytes_per_sample = 0;
    double working_fixed_bytes = 0;
    /// Bytes per sample the group all-reduces in one forward (backward the same), and how many collectives.
    double collective_bytes_per_sample = 0;
    double collectives = 0;
  } tp;

  /// The largest parameter tensor on one device of a `degree`-way group.
  double largestParamAt(int degree) const { return std::max(largest_param_bytes, tp.largest_param_bytes / degree); }
  /// The block's working bytes at `samples` per micro-batch.
  double workingAt(double samples) const { return working_fixed_bytes + working_bytes_per_sample * samples; }
  /// The same on one device of a `degree`-way tensor-parallel group.
  double workingAt(double samples, int degree) const {
    const double keep = 1 - 1.0 / degree;
    return workingAt(samples) - keep * (tp.working_fixed_bytes + tp.working_bytes_per_sample * samples);
  }
  /// Of the weight gradients (wgrad), the part a tensor-parallel degree
  /// divides: W keeps the share of the backward it has in each term, so it
  /// divides as the backward does, wgrad * tp.bwd / bwd (Note [split backward
  /// of a tensor-parallel stage] in evaluate.cpp).
  Affine wgradSplit() const {
    auto share = [](double w, double split, double whole) { return whole > 0 ? w * split / whole : 0.0; };
    return {share(wgrad.fixed_s, tp.bwd.fixed_s, bwd.fixed_s),
            share(wgrad.per_sample_s, tp.bwd.per_sample_s, bwd.per_sample_s)};
  }
  /// The weight gradients' time on one device of a `degree`-way group at `samples` per micro-batch.
  double wgradAt(double samples, int degree) const {
    return wgrad.at(samples) - (1 - 1.0 / degree) * wgradSplit().at(samples);
  }
  /// Activation bytes per sample on one device of a `degree`-way group.
  double activationAt(int degree) const {
    return activation_bytes_per_sample - (1 - 1.0 / degree) * tp.activation_bytes_per_sample;
  }
};

/// One direction of a device-to-device link, as seen by one device.
struct Link {
  double bandwidth = 0; ///< bytes/s
  double latency_s = 0;
};

/// A homogeneous cluster: `count` devices, `per_node` to a node, ranks in node order.
struct Devices {
  int count = 1;            ///< D
  int per_node = 1;         ///< ranks r and r' share a node when r / per_node == r' / per_node
  double memory_bytes = 0;  ///< per device
  double memory_margin = 0; ///< fraction of memory kept free, in [0, 1)
  double reserve_bytes = 0; ///< per device, held by the runtime outside tensors (CUDA context, workspaces)
  Link intra_node;          ///< between devices of one node (NVLink)
  Link inter_node;          ///< between nodes (per device's share of the network)
  /// Tensor-parallel stages receive across nodes by scatter/gather (Note [scatter/gather transfers] in evaluate.cpp).
  bool scatter_gather = false;

  /// What a stage's tensors may use: memory_bytes * (1 - memory_margin) - reserve_bytes.
  double capacity() const { return memory_bytes * (1 - memory_margin) - reserve_bytes; }
  /// The bandwidth a ring all-reduce over `count` ranks first, first+stride, ... moves at (Note [ring
  /// all-reduce bandwidth]).
  double allReduceBandwidth(int first, int count, int stride = 1) const;
  /// Whether `groups` runs of `size` consecutive ranks from `first` each lie inside one node.
  bool groupsInsideNodes(int first, int groups, int size) const;
};

// The pipeline schedule is the one of the pipeline model (planner/pipeline).
using pipeline::Schedule;
using pipeline::scheduleName;

/// Parts of the search the user pinned; a default-constructed value pins nothing.
struct Constraints {
  int stages = 0;                  ///< 0: searched
  std::vector<int> replicas;       ///< empty: searched; {r}: every stage r; {r0, r1, ...}: per stage (fixes stages)
  int microbatches = 0;            ///< 0: searched among the divisors of the batch size
  int max_microbatches = 0;        ///< 0: no cap on the searched micro-batch counts
  bool power_of_two_replicas = false;
  std::optional<Schedule> schedule; ///< unset: searched
  int virtual_stages = 1;          ///< chunks per pipeline rank, >1 only under interleaved 1F1B (Note [interleaved 1F1B])
  /// Tensor-parallel degrees, like replicas: empty: searched among
  /// Problem::tp_degrees; {t}: every stage t; {t0, t1, ...}: per stage (fixes stages).
  std::vector<int> tensor_parallel;
};

/// The whole numeric problem. Blocks are in topological order.
struct Problem {
  std::vector<Block> blocks; ///< in topological order
  /// blocks.size()+1 entries: [i] = bytes per sample of every value produced
  /// before block i and read at or after it (for i = 0: the graph's data
  /// inputs; for i = n: the outputs, 0 when the graph ends in the loss). A
  /// stage [a, e) receives cut[a] per sample and sends cut[e]; gradients of the
  /// same size flow back.
  std::vector<double> cut_bytes_per_sample;
  /// Empty (none), or blocks.size()+1 entries: [i] = the part of cut[i]
  /// that autograd saves nowhere (Note [unsaved values] in evaluate.cpp).
  std::vector<double> unsaved_cut_bytes_per_sample;
  /// unsaved_cut_bytes_per_sample[i], 0 where it is empty.
  double unsavedCutAt(int i) const {
    return unsaved_cut_bytes_per_sample.empty() ? 0.0 : unsaved_cut_bytes_per_sample[static_cast<size_t>(i)];
  }
  /// Empty (none), or blocks.size()+1 entries: [i] = what a stage beginning
  /// at cut i adds to its blocks' Block::wgrad_bytes_per_sample (which count
  /// each input weight-gradient roots read at its first reader): the inputs
  /// read before cut i that a root after it reads too, less those one root
  /// of its first block alone reads and it receives, held once as its input
  /// (Note [what a queued W keeps] in evaluate.cpp). May be negative.
  std::vector<double> wgrad_read_cut_bytes_per_sample;
  /// wgrad_read_cut_bytes_per_sample[i], 0 where it is empty.
  double wgradReadCutAt(int i) const {
    return wgrad_read_cut_bytes_per_sample.empty() ? 0.0 : wgrad_read_cut_bytes_per_sample[static_cast<size_t>(i)];
  }
  /// Empty (none), or blocks.size()+1 entries: [i] = the bytes per sample a
  /// stage beginning at cut i keeps more because it receives contiguous
  /// what its blocks read as views (Note [received layout] in evaluate.cpp).
  std::vector<double> received_layout_cut_bytes_per_sample;
  /// received_layout_cut_bytes_per_sample[i], 0 where it is empty.
  double receivedLayoutAt(int i) const {
    return received_layout_cut_bytes_per_sample.empty() ? 0.0
                                                        : received_layout_cut_bytes_per_sample[static_cast<size_t>(i)];
  }
  /// A value's stretch from its maker's block (or a reader's) to its next
  /// reader's, reading it nowhere between: a stage [a, e) with from < a and
  /// e <= to neither receives it nor its gradient, though cut[a] counts it
  /// (Note [values passing over] in evaluate.cpp).
  struct PassOver {
    int from = 0, to = 0;
    double bytes_per_sample = 0;
  };
  std::vector<PassOver> pass_over;
  /// Of cut[a], the bytes per sample that pass over stage [a, e).
  double passOverAt(int a, int e) const {
    double bytes = 0;
    for (const PassOver &s : pass_over)
      if (s.from < a && e <= s.to) bytes += s.bytes_per_sample;
    return bytes;
  }
  int64_t batch_size = 1;                   ///< global batch size B
  Devices devices;
  double optimizer_bytes_per_param_byte = 0; ///< SGD 0, momentum 1, Adam/AdamW 2 (gradients are always 1x)
  bool allow_recompute = true;               ///< may a stage recompute its activations in backward
  bool force_recompute = false;              ///< must every stage recompute (--recompute on); needs allow_recompute
  bool allow_zero = true;                    ///< may a replicated stage shard its optimizer state (ZeRO-1)
  bool force_zero = false;                   ///< must every replicated stage shard it (--zero 1); needs allow_zero
  /// Why the automatic schedule search may not split the backward (ZB-H1,
  /// ZB-H2) or interleave chunks, for what the problem does not see (a
  /// parameter two ops read); empty: it may (Note [automatic schedule] in dp.cpp).
  std::string no_split_backward, no_interleave;
  /// With the schedule unset: weigh ZB-H1, ZB-H2 and interleaved 1F1B
  /// against the 1F1B plan (Note [automatic schedule]; rannc-plan's default,
  /// Note [schedule default]), or search 1F1B alone.
  bool auto_schedule = true;
  /// The tensor-parallel degrees a stage may take, ascending, 1 first (the
  /// sharding analysis's valid degrees up to devices per node); empty: {1}.
  std::vector<int> tp_degrees;
  /// Empty (every cut whole), or blocks.size()+1 entries: [i] = every value
  /// crossing cut i is whole on each device of a group, so a stage with
  /// tensor-parallel degree > 1 may start or end there.
  std::vector<bool> cut_whole;
  /// A parameter read by several blocks (tied weights) counts in each one's
  /// param_bytes; a stage holding several of them holds it once (Note [tied
  /// parameters] in evaluate.cpp).
  struct Tied {
    std::vector<int> blocks; ///< the blocks reading it, ascending (a block twice when two of its units do)
    double bytes = 0;        ///< its parameter bytes
    double split_bytes = 0;  ///< of those, the part a tensor-parallel degree divides (Block::Split::param_bytes)
  };
  std::vector<Tied> tied;
  Constraints constraints;

  /// n, the number of blocks.
  int numBlocks() const { return static_cast<int>(blocks.size()); }
  /// Whether a stage may take this recomputation choice (allow_recompute, force_recompute).
  bool recomputeAllowed(bool recompute) const { return recompute ? allow_recompute : !force_recompute; }
  /// Whether a stage of `replicas` may take this sharding choice: sharding
  /// needs 2 replicas or more, and forcing it binds only such stages.
  bool zeroAllowed(bool zero, int replicas) const {
    return zero ? allow_zero && replicas > 1 : !(force_zero && replicas > 1);
  }
  /// Whether a stage with tensor-parallel degree > 1 may start or end at cut i.
  bool cutWhole(int i) const { return cut_whole.empty() || cut_whole[static_cast<size_t>(i)]; }
  /// The parameter bytes blocks [a, e) at degree t count more than once (Note [tied parameters]).
  double tiedExcess(int a, int e, int t) const;
  /// Whether `degree` is one of tp_degrees (1 always is).
  bool tpDegreeAllowed(int degree) const;
  /// Deterministic text form, one block per line.
  void print(std::ostream &os) const;
};

/// All that is wrong with the Problem, in one error: sizes, signs, finiteness, constraints.
Status validate(const Problem &p);

/// One pipeline stage: blocks [block_begin, block_end) on `replicas`
/// data-parallel groups of `tensor_parallel` devices each.
struct Stage {
  int block_begin = 0; ///< first block
  int block_end = 0;   ///< one past the last block
  int replicas = 1;    ///< data-parallel replicas running this stage
  bool recompute = false; ///< keep only the stage inputs per micro-batch, recompute the rest in backward
  bool zero = false;      ///< shard the optimizer state over the replicas (ZeRO-1)
  int tensor_parallel = 1; ///< devices per replica, splitting the stage's layers (a group inside one node)

  /// Devices the stage runs on: replicas x tensor_parallel.
  int devices() const { return replicas * tensor_parallel; }
  /// Same range, replicas, recomputation, sharding and tensor-parallel degree.
  bool operator==(const Stage &o) const {
    return block_begin == o.block_begin && block_end == o.block_end && replicas == o.replicas &&
           recompute == o.recompute && zero == o.zero && tensor_parallel == o.tensor_parallel;
  }
};

/// A plan: stages in pipeline order. Stage s owns ranks [sum of earlier
/// stages' devices, + replicas_s x tensor_parallel_s): ranks are handed out in
/// stage order from rank 0, a replica's tensor-parallel group being t
/// consecutive ranks, and the devices after the last stage's ranks stay idle
/// (a plan may use fewer than Devices::count devices; run it on devicesUsed() ranks).
/// With virtual_stages v > 1 (interleaved 1F1B) the S = p v stages are v
/// chunks on each of p pipeline ranks: stage s runs on the ranks of stage
/// s % p, which the first p stages hand out as above (Note [interleaved 1F1B]).
struct Solution {
  std::vector<Stage> stages;  ///< in pipeline order, covering the blocks
  int microbatches = 1;       ///< M
  Schedule schedule = Schedule::OneFOneB;
  int virtual_stages = 1;     ///< v: chunks per pipeline rank

  /// S, the number of stages.
  int numStages() const { return static_cast<int>(stages.size()); }
  /// p, the pipeline ranks: S / v.
  int pipelineRanks() const;
  /// Ranks the plan runs on: the sum of the first p stages' devices.
  int devicesUsed() const;
  /// First rank of stage s (the sum of the devices of the stages before s % p).
  int firstRank(int s) const;
  /// One line: "1f1b M=8 [0,3)x2z [3,5)x1r [5,6)x2t4 ...", an `r` marking
  /// recomputation, a `z` sharding, `tN` a tensor-parallel degree N > 1; "interleaved-1f1b v=2 M=8 ...".
  void print(std::ostream &os) const;
  /// Same stages, micro-batches, schedule and chunks.
  bool operator==(const Solution &o) const {
    return stages == o.stages && microbatches == o.microbatches && schedule == o.schedule &&
           virtual_stages == o.virtual_stages;
  }
};

/// Samples on the busiest replica of a stage: ceil(ceil(B / M) / r), i.e. ceil(B / (M r)).
int64_t replicaSamples(int64_t batch_size, int microbatches, int replicas);

/// The micro-batch counts the solvers search: the pinned one, or every divisor
/// of B up to max_microbatches (the executor splits the batch into equal micro-batches).
std::vector<int> microbatchCandidates(const Problem &p);

/// The replica counts the solvers search for `microbatches`: the pinned ones,
/// or every r <= min(devices, samples per micro-batch) that shrinks the
/// per-replica micro-batch compared with r-1 (more replicas at the same size
/// would only add all-reduce traffic), powers of two only if asked. Ascending.
std::vector<int> replicaCandidates(const Problem &p, int microbatches);

/// The tensor-parallel degrees the solvers search: the pinned ones, or
/// tp_degrees ({1} when empty). Ascending.
std::vector<int> tpCandidates(const Problem &p);

/// "12.0 GiB", for messages.
std::string formatBytes(double bytes);

} // namespace rannc::partition
