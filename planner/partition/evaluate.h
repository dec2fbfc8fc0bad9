// The one independent evaluator: recomputes time and memory of any Solution
// from the Problem's numbers. Solvers optimise exactly the step time reported
// here; the simulator (simulate.h) replays the same numbers event by event.
// The model is Note [partition cost model] in evaluate.cpp and docs/partitioner.md.
#pragma once

#include <algorithm>
#include <ostream>
#include <string>
#include <vector>

#include "planner/partition/problem.h"

namespace rannc::partition {

/// Peak memory of one device of a stage, by kind.
struct StageMemory {
  double params = 0;
  double grads = 0;
  double optimizer = 0;
  double activations = 0; ///< kept for backward: the micro-batches in flight, or one rebuilt one when recomputing
  double stash = 0;       ///< a recomputing stage's inputs per micro-batch in flight
  double working = 0;     ///< transient in backward, one micro-batch
  double buffers = 0;     ///< model buffers (BatchNorm statistics)
  double lowp_weights = 0; ///< bf16/fp16 weight copies under autocast (Note [autocast dtypes])
  double step = 0;         ///< a sharded optimizer step's temporaries, after backward (Note [partition cost model])
  double weight_queue = 0; ///< a split backward's gradients B hands W (Note [zero bubble H1]); empty by the step

  double total() const {
    return params + grads + optimizer + std::max(activations + stash + working + weight_queue, step) + buffers +
           lowp_weights;
  }
};

/// "params X, grads Y, ...": each kind with its bytes as `bytes` writes them
/// (the optional kinds only when present).
std::string describe(const StageMemory &m, std::string (*bytes)(double) = formatBytes);

/// rannc-exec's default gradient bucket (--bucket-mib, executor/train/trainer.h):
/// a sharded step updates one bucket's block at a time (Note [partition cost model]).
inline constexpr double kGradientBucketBytes = 25 << 20;

/// The sums over a stage's blocks and the rest that its memory depends on.
struct StageMemoryInputs {
  double param_bytes = 0;
  double largest_param = 0;       ///< the largest parameter tensor on one device (Block::largestParamAt)
  double optimizer_bytes = 0;     ///< the whole state, before any sharding
  double model_buffers = 0;
  double lowp_weights = 0;
  double act_per_sample = 0;      ///< K of Note [unsaved values]: what a micro-batch keeps besides cut_in, per sample
  double working = 0;             ///< stageWorking at `samples`
  double cut_in = 0;              ///< per sample, received
  double samples = 0;             ///< b, per replica and micro-batch
  double inflight = 0;            ///< k
  double weight_queue = 0;        ///< micro-batches whose B ran and W has not while a B runs (Note [zero bubble H1])
  double wgrad_per_sample = 0;    ///< what each of them holds for its W, per sample
  double wgrad_fixed = 0;         ///< and at any batch size: the parameter gradients B made for it
  /// Split backward: `working` is B's (the per-sample part of the working
  /// lines) and this W's, their fixed part, the weight gradients being made
  /// (Note [what a queued W keeps]).
  double weight_working = 0;
  int replicas = 1;
};

/// The working bytes of blocks [a, e) at micro-batch size b on one device of
/// a `degree`-way tensor-parallel group: the largest block's, less what the
/// blocks after it have freed by its backward (Note [partition cost model]).
double stageWorking(const Problem &p, int a, int e, double b, int degree = 1);

/// Ring all-reduce of `bytes` over `n` devices: 2 (n-1)/n bytes / bw, plus
/// `latencies` link latencies (Note [partition cost model]).
double ringAllReduce(double bytes, int n, const Link &link, double latencies);

/// Receiving `bytes` over `link` (`intra`: inside a node) by a stage of
/// tensor-parallel degree `t`: latency + bytes / bandwidth, or with
/// Devices::scatter_gather across nodes 1/t of them per device and an
/// all-gather inside the node (Note [scatter/gather transfers]).
double receiveTime(const Devices &d, const Link &link, bool intra, double bytes, int t);

/// What is wrong with the tensor-parallel degree of `stage` placed from
/// `first_rank` (Note [tensor parallel stages]): "" when nothing.
std::string tensorParallelProblem(const Problem &p, const Stage &stage, int first_rank);

/// One device's memory with these choices (Note [partition cost model]): the
/// one formula the evaluator and the DP share.
StageMemory stageMemory(const StageMemoryInputs &in, bool recompute, bool zero);

/// Everything the model says about one stage (per device, per micro-batch).
struct StageCost {
  int block_begin = 0;          ///< the stage's blocks [block_begin, block_end)
  int block_end = 0;
  int first_rank = 0;           ///< its ranks are first_rank .. first_rank + replicas x tensor_parallel - 1
  int replicas = 1;
  int tensor_parallel = 1;      ///< devices per replica
  bool recompute = false;
  bool zero = false;            ///< optimizer state sharded over the replicas
  int64_t samples = 0;          ///< per-replica micro-batch b = ceil(B / (M r))
  int inflight = 0;             ///< micro-batches whose activations are alive at once
  double fwd_s = 0;             ///< forward compute (one device's share under tensor parallelism)
  double bwd_s = 0;             ///< backward compute, without the recomputation
  double wgrad_s = 0;           ///< of bwd_s, the weight gradients (a W pass under a split backward)
  double tp_collective_s = 0;   ///< the tensor-parallel all-reduces of one forward (and of one backward); 0 for t = 1
  double stat_sync_s = 0;       ///< BatchNorm statistics' all-reduces of one forward (and one backward); 0 for r = 1
  double recompute_s = 0;       ///< the extra forward (with its collectives) when recomputing, else 0
  double recv_activations_s = 0; ///< receiving the stage inputs (0 for stage 0)
  double recv_gradients_s = 0;   ///< receiving the gradients of the outputs (0 for the last stage)
  double sent_gradient_bytes = 0; ///< the gradients of its inputs it sends back, per micro-batch (0 for stage 0)
  double allreduce_s = 0;        ///< ring all-reduce of the gradients over the replicas (0 if 1 replica)
  bool recv_intra_node = true;   ///< link used for the stage's input transfers
  bool send_intra_node = true;   ///< link used for the stage's output transfers
  bool allreduce_intra_node = true;
  double param_bytes = 0;        ///< parameters of the stage's blocks one device holds (its shards)
  double param_share = 1;        ///< param_bytes over the blocks' whole parameters (1 without tensor parallelism)
  StageMemory memory;            ///< one device's peak, by kind
  double recompute_saves_bytes = 0; ///< activation bytes recomputation saves (0 when the stage keeps them)
  double zero_saves_bytes = 0;      ///< peak bytes sharding saves: the state's share, less a larger step (0 when not sharded)

  /// Device time of one forward slot: receive inputs, then compute.
  double forwardSlot() const { return recv_activations_s + fwd_s + tp_collective_s + stat_sync_s; }
  /// Device time of one backward slot: receive output gradients, recompute, compute.
  double backwardSlot() const { return recv_gradients_s + recompute_s + bwd_s + tp_collective_s + stat_sync_s; }
  /// Device time of a split backward's W pass: its weight gradients.
  double weightSlot() const { return wgrad_s; }
  /// Devices of the stage.
  int devices() const { return replicas * tensor_parallel; }
};

/// Time and memory of a Solution, with every reason it does not fit or is malformed.
struct Evaluation {
  std::vector<StageCost> stages; ///< in pipeline order (empty when malformed)
  double capacity_bytes = 0;   ///< memory a device may use
  double fill_drain_s = 0;     ///< 1F1B: sum of slots; GPipe: sum of forward + sum of backward slots
  double steady_s = 0;         ///< (M-1) x the bottleneck period
  double allreduce_s = 0;      ///< the slowest replica group's all-reduce, after the pipeline drains
  double step_time_s = 0;      ///< fill_drain + steady + allreduce; +inf when malformed
  int bottleneck_stage = -1;   ///< the stage setting the steady-state period (1F1B) / forward period (GPipe)
  double peak_memory_bytes = 0; ///< the largest stage total (interleaved: the largest rank's, rankMemory)
  /// Interleaved: each pipeline rank's peak (rankMemory); else empty.
  std::vector<double> rank_peak_memory_bytes;
  bool well_formed = true;     ///< ranges cover the blocks, replicas and M in range
  std::vector<std::string> violations; ///< malformed parts and memory overflows, by stage

  bool feasible() const { return violations.empty(); }
  /// A table: one line per stage, then the totals.
  void print(std::ostream &os) const;
};

/// Cost of `stage` as stage `index` of `num_stages`, starting at rank `first_rank`.
/// The stage must be well formed (non-empty range inside the blocks, replicas >= 1, M >= 1).
/// With `virtual_stages` > 1 (interleaved 1F1B) its neighbours are the stages
/// around it whose ranks start at `prev_last_rank`'s and `next_first_rank`
/// (-1: the ranks next to its own).
StageCost evaluateStage(const Problem &p, const Stage &stage, int index, int num_stages, int first_rank,
                        int microbatches, Schedule schedule, int virtual_stages = 1, int prev_last_rank = -1,
                        int next_first_rank = -1);

/// Under interleaved 1F1B, the peak of pipeline rank `rank` holding the chunks
/// rank, rank + ranks, ... of `stages` (Note [a rank's chunks' memory]).
/// `sent`: the rank's pipeline::inFlightGradients, replayed here when null.
double rankMemory(const std::vector<StageCost> &stages, int rank, int ranks, int virtual_stages, int microbatches,
                  Schedule schedule, const std::vector<std::vector<int>> *sent = nullptr);

/// Evaluates `s` against `p`. Never fails: problems are listed in violations.
Evaluation evaluate(const Problem &p, const Solution &s);

} // namespace rannc::partition
