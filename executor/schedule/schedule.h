// Decide, then execute: what each rank does in a training step is data — a
// list of actions built here, printable and testable without MPI — and the
// runtime only interprets it.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "planner/ir/ir.h"
#include "planner/pipeline/schedule.h"

namespace rannc::schedule {

enum class ActionKind {
  RecvActivations, ///< receive this micro-batch's inputs from earlier stages
  Forward,
  SendActivations, ///< send this micro-batch's outputs to later stages
  RecvGradients,   ///< receive the gradients of the sent outputs
  Backward,        ///< the whole backward, or under a split one (ZB-H1) its B: the inputs' gradients
  SendGradients,   ///< send the gradients of the received inputs back
  BackwardWeight,  ///< a split backward's W: the weight gradients (Note [zero bubble H1])
  /// Wait until the gradients this stage sent for this micro-batch have been
  /// taken in (Note [awaited gradient sends] in planner/pipeline/gradient_waits.h)
  AwaitGradients,
  AllReduce,       ///< sum the gradients over the stage's replicas
  OptimizerStep,
};

struct Action {
  ActionKind kind;
  int microbatch = -1; ///< -1 for AllReduce and OptimizerStep
  /// Which of the rank's stages it is for: that stage's index in the pipeline
  /// under an interleaved schedule (Note [interleaved 1F1B]); -1: the rank's
  /// only stage (every other schedule, and AllReduce and OptimizerStep).
  int stage = -1;
  bool operator==(const Action &o) const {
    return kind == o.kind && microbatch == o.microbatch && stage == o.stage;
  }
};

std::string toString(const Action &a);
void print(const std::vector<Action> &actions, std::ostream &os);

/// The actions of `stage` of `num_stages` for one step of `microbatches`
/// micro-batches under `schedule`: the pipeline model's order of passes
/// (pipeline::stageOrder), each forward wrapped in its receive and send of
/// activations, each backward in those of gradients (the first stage receives
/// nothing and the last sends nothing forward), then the all-reduce and the
/// optimizer step. A schedule is never written here (Note [adding a schedule]).
std::vector<Action> build(pipeline::Schedule schedule, int stage, int num_stages, int microbatches);

/// The actions of pipeline rank `rank` of `ranks`, each running
/// `virtual_stages` stages (pipeline::rankOrder): as build(), each pass
/// wrapped in the transfers of its stage (chunk c is stage c * ranks + rank,
/// named in Action::stage), then one all-reduce and optimizer step. With one
/// chunk per rank it is build(schedule, rank, ranks, microbatches).
std::vector<Action> buildRank(pipeline::Schedule schedule, int rank, int ranks, int virtual_stages, int microbatches);

/// `lists[rank]` (every pipeline rank's actions, from buildRank and
/// accumulate, in rank order) with an AwaitGradients before a backward for
/// each gradient send pipeline::awaitedGradients has the rank await there
/// (Note [awaited gradient sends]). `producers[s]`: the stages stage s
/// receives values from, to which its gradients go (empty: stage s - 1).
Expected<std::vector<Action>> awaitingGradients(const std::vector<std::vector<Action>> &lists, int rank,
                                                const std::vector<std::vector<int>> &producers = {});

/// Gradient accumulation: `one_batch` (a schedule of `microbatches`
/// micro-batches) run `batches` times back to back with a single all-reduce
/// and optimizer step at the end; micro-batch m of run j is renumbered
/// j * microbatches + m, so every micro-batch of the optimizer step has its
/// own id (and message tags). Each run drains before the next starts, so
/// activation memory is that of one batch.
std::vector<Action> accumulate(const std::vector<Action> &one_batch, int batches, int microbatches);

/// The largest number of micro-batches whose forward ran and whose backward
/// has not (under a split backward: whose W has not), over the action list
/// (what the stage's activation memory scales with).
int peakMicrobatchesInFlight(const std::vector<Action> &actions);

/// Which values cross stage boundaries, and what each stage runs.
struct Transfer {
  ir::ValueId value;
  int peer_stage; ///< the producer (for receives) or the consumer (for sends)
  /// Whether the value may carry a gradient (Note [gradient-free values]) to
  /// or from this stage: a receiver makes only those a leaf that requires
  /// one, and keeps only those past their last use (Note [shape-only receives]).
  bool gradient = true;
};

struct StageProgram {
  int stage = 0;
  std::vector<ir::NodeId> nodes;         ///< in graph order, recomputed ones included
  std::vector<ir::ValueId> data_inputs;  ///< graph inputs this stage reads
  std::vector<ir::ValueId> parameters;   ///< parameters this stage reads
  std::vector<ir::ValueId> constants;    ///< constants this stage reads
  std::vector<ir::ValueId> buffers;      ///< buffers this stage reads and updates (Note [buffers] in ir.h)
  /// The parameters of `parameters` that other stages read too (tied weights,
  /// Note [shared parameters]), each with every stage that reads it, ascending.
  std::vector<std::pair<ir::ValueId, std::vector<int>>> shared_parameters;
  std::vector<Transfer> recvs;           ///< sorted by (peer stage, value id)
  std::vector<Transfer> sends;           ///< sorted by (peer stage, value id)
  bool computes_loss = false;
};

/// The program of `stage` given every stage's op range [begin, end).
///
/// Note [recomputed values]
/// A value another stage produced is recomputed locally instead of received
/// when it is cheap: ops without inputs (Constant) and non-floating values
/// (Shape -> Gather -> Concat chains, causal masks from Range, reshaped
/// labels); their inputs are then needed by the stage in turn (data read
/// locally, activations received). Integer values carry no gradient and are
/// often shape arithmetic: recomputing them from the local shard keeps them
/// right when stages have different replica counts (a Shape of a 4-sample
/// shard must say 4, not the sender's 8), and every received value is then a
/// floating-point activation whose batch dimension can be sliced.
///
/// Note [gradient-free values]
/// A floating-point value crosses a stage boundary as it is, but not every
/// one has a gradient in PyTorch: a MoE router's expert counts are a float
/// histc of integer expert ids (Granite-MoE, MiniMax), and their cumsum
/// with an integer dtype is legal only because no gradient reaches them.
/// Had the receiver made every float value a leaf that requires a gradient,
/// that cumsum would fail in autograd ("Autograd not support dtype: Int")
/// on a stage that begins between them, which interleaved plans' narrow
/// chunks do. A value may carry a gradient when it is a floating (or
/// complex) parameter, or the result of an op one of whose inputs may; an
/// in-place op's result makes its first input one too (they alias). That
/// over-approximates PyTorch's requires_grad (it treats every op as
/// differentiable), so no gradient PyTorch computes is lost.
///
/// Note [shared parameters]
/// One initializer read by ops of several stages (tied input/output
/// embeddings: a Gather in the first stage, the LM head's MatMul in the last)
/// is one parameter of the graph, listed in `parameters` of every stage that
/// reads it; each such stage holds its own copy and computes its own part of
/// the gradient. `shared_parameters` names them with the stages involved: the
/// trainer sums the parts across those stages (after the replica all-reduce,
/// SharedParameters in executor/train/shared_parameters.h) before the optimizer step,
/// so every copy takes the same update and stays identical; the gradient norm
/// counts such a parameter once.
StageProgram buildStageProgram(const ir::Graph &g, const std::vector<std::pair<int, int>> &ranges, int stage);

/// Samples [begin, end) of a micro-batch held by one replica.
struct SampleRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};

/// Splits `count` samples over `replicas` contiguous ranges, the first
/// `count % replicas` one larger.
std::vector<SampleRange> splitSamples(int64_t count, int replicas);
/// The overlap of two ranges (empty: begin >= end).
SampleRange intersect(const SampleRange &a, const SampleRange &b);

} // namespace rannc::schedule
