// The one pipeline model: which schedules exist, in what order each stage runs
// its forwards and backwards, how many micro-batches a stage holds at once,
// and the closed-form time of the pipeline phase. The partitioner's evaluator
// and simulator, `rannc-plan show` and the executor's action lists all read
// the schedule from here, so they cannot disagree (tests/planner/pipeline/
// agreement_test.cpp checks that they do not). Torch-free and IR-free: the
// partitioner (numbers only) and the executor's schedule library both link it.
//
// Note [adding a schedule]
// A schedule is added here, in one place:
//   1. a value of `Schedule`, listed in kSchedules (the order searches try
//      them in, and ties go to the first);
//   2. its case in schedule.cpp: scheduleName (the flag and text name),
//      stageOrder (what each stage runs, in order; rankOrder for one that
//      runs several chunks per rank), microbatchesInFlight (the
//      peak of that order: what activation memory scales with) and
//      pipelineTime (the closed-form time of that order);
//   3. at the plan boundary, a value of proto::Schedule (proto/plan.proto)
//      and its case in plan::scheduleToProto (planner/plan/plan.cpp); the rest
//      of the plan code converts through it.
// Everything else follows: the simulator replays stageOrder, the executor's
// action lists (executor/schedule) expand it, evaluate() and show use
// pipelineTime and microbatchesInFlight, option parsing uses parseSchedule.
// The exact DP (planner/partition/dp.cpp, Note [exact stage DP]) splits the
// closed form into its additive and max parts per schedule and needs its own
// case; the DP-vs-exhaustive tests catch a mismatch there. Then extend
// tests/planner/pipeline/agreement_test.cpp's claims of exactness if the new
// closed form is exact on other cases than GPipe's and 1F1B's.
#pragma once

#include <array>
#include <string>
#include <string_view>
#include <vector>

#include "planner/support/status.h"

namespace rannc::pipeline {

/// A pipeline schedule: GPipe fill-drain, PipeDream-flush 1F1B, ZB-H1
/// (Note [zero bubble H1]), ZB-H2 (Note [zero bubble H2]) or interleaved
/// 1F1B (Note [interleaved 1F1B]) (Note [adding a schedule]).
enum class Schedule { GPipe, OneFOneB, ZBH1, ZBH2, Interleaved1F1B };

/// Every schedule, in the order searches try them.
inline constexpr std::array<Schedule, 5> kSchedules = {Schedule::GPipe, Schedule::OneFOneB, Schedule::ZBH1,
                                                       Schedule::ZBH2, Schedule::Interleaved1F1B};

/// "gpipe" / "1f1b" / "zb-h1" / "zb-h2" / "interleaved-1f1b": the name flags, plan text, logs and messages use.
const char *scheduleName(Schedule s);

/// The schedules' names as `name` gives them, joined for a message: "gpipe, 1f1b or zb-h1".
std::string scheduleChoices(const char *(*name)(Schedule) = scheduleName);

/// The schedule called `name` (scheduleName's inverse). The error names the
/// choices but not the flag: "must be gpipe, 1f1b or zb-h1 (got 'x')"; prefix it.
Expected<Schedule> parseSchedule(std::string_view name);

/// One pass a stage runs: the forward or the backward of one micro-batch, or,
/// under a schedule that splits the backward (splitsBackward), its input part
/// B (`forward` false) or its weight part W (`weight` true).
/// Under an interleaved schedule a rank runs several stages (its chunks):
/// `chunk` c of rank r is stage c * ranks + r (Note [interleaved 1F1B]).
struct Pass {
  bool forward = true;
  int microbatch = 0;
  bool weight = false; ///< W: the weight gradients of a micro-batch whose B has run
  int chunk = 0;       ///< which of the rank's chunks runs it (0 unless interleaved)
  bool operator==(const Pass &o) const {
    return forward == o.forward && microbatch == o.microbatch && weight == o.weight && chunk == o.chunk;
  }
};

/// Note [interleaved 1F1B]
/// Interleaved 1F1B (Narayanan et al., "Efficient Large-Scale Language Model
/// Training on GPU Clusters Using Megatron-LM", SC'21): the model is cut into
/// S = p v stages and pipeline rank r of p holds the v chunks r, r+p, ...,
/// r+(v-1)p (non-adjacent stages), so a micro-batch passes every rank v
/// times. Rank r runs its v M chunk-passes in Megatron's order: virtual
/// micro-batch k (of v M) is micro-batch (k / pv) p + k % p of chunk
/// (k % pv) / p forwards and of chunk v-1 - (k % pv) / p backwards, i.e.
/// groups of p micro-batches go through chunk 0, then chunk 1, ...; after a
/// warm-up of W_r = min(vM, 2(p-r-1) + (v-1)p) forwards it alternates one
/// forward and one backward, then drains. The groups of p are why Megatron
/// needs M % p == 0 (interleavingProblem refuses other M). With v = 1 the
/// order is 1F1B's (Megatron's non-interleaved schedule).
/// With every chunk's forward f and backward b alike, the step is
/// v M (f+b) + (p-1)(f+b): the bubble (p-1)(f+b) is 1F1B's (p-1)(F+B) over v
/// (F = v f is a rank's whole forward), Megatron's (p-1)/v of the ideal time
/// per micro-batch; the simulator's replay gives exactly that (agreement
/// test). Every chunk boundary is a message, so v times 1F1B's messages.
/// Memory: rank r holds at most min(vM, W_r + 1) chunk-micro-batches at once
/// (rankMicrobatchesInFlight), Megatron's warm-up plus one. Each chunk's own
/// peak (microbatchesInFlight, counted on the order) is what evaluate()
/// charges that stage; a rank's memory is counted along this order, each
/// chunk's micro-batches in flight at every pass with the running chunk's
/// working bytes alone (Note [a rank's chunks' memory] in
/// planner/partition/evaluate.cpp; the chunks' sum until 2026-11-29). A
/// recomputing chunk keeps its inputs for each of its micro-batches in
/// flight and rebuilds one in its backward (Note [recomputing stage's peak]),
/// counted only while it runs.
/// Clipping, a skipped step and fp16's loss scale are decided once over a
/// rank's chunks (Note [one step over a rank's chunks] in
/// executor/train/parameter_update.cpp). What chunks do not do yet is
/// refused (rannc-plan, check, rannc-exec's interleavedRefusals):
/// tensor-parallel chunks, checkpoints, --batchnorm exact, tied weights
/// across stages. A chunk may recompute and shard its optimizer state over
/// its own replica group.

/// Note [zero bubble H1]
/// ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR'24) splits a
/// backward into B, the gradients of the stage's inputs, sent upstream at
/// once, and W, the gradients of its weights, run later. Stage s of S runs
/// 1F1B's warm-up (S-s-1 forwards), then F and B alternately, each B followed
/// by the W of the micro-batch s B's back, and the W's left at the end: W
/// lags B by s passes on stage s. The upstream stage's B then waits for B
/// alone, not B+W, and the late W's fill the drain. With F, B, W the same on
/// every stage and M >= S, the step is M (F+B+W) + (S-1) max(F, F+B-W)
/// (1F1B's: M (F+B+W) + (S-1)(F+B+W)); the paper writes the bubble
/// (p-1)(F+B-W), the same where B >= W. Where W > B the last stage still
/// waits (S-1) F for its first forward, and the replay says so.
/// A micro-batch is held from its F to its W: min(M, S) micro-batches on
/// every stage, where 1F1B holds min(M, S-s). Of them the W queue, those
/// whose B has run, min(M-1, s) while a B runs and one more right after it,
/// keep only what W reads: the gradients W starts from and the inputs the
/// weight gradients need (Note [split backward] in
/// executor/runtime/stage.cpp; Note [what a queued W keeps] in
/// planner/partition/evaluate.cpp, which counts the larger).

/// Note [zero bubble H2]
/// ZB-H2 (same paper, Fig. 3) trades memory for the rest of ZB-H1's bubble.
/// It is ZB-H1's order with a longer warm-up and a longer W lag: stage s of
/// S runs 2(S-s-1) forwards first (the first stage 2S-2, where ZB-H1 runs
/// S-1: every slot before its first B arrives holds a forward), then F and
/// B alternately, each B followed by the W 2s B's back, and the W's left at
/// the end. The growing lag is the paper's W's "reordered at the tail": the
/// last stages hold their W's back so that the B's of the last micro-batches
/// reach the first stages without waiting, and every stage ends on a run of
/// W's. With F, B, W the same on every stage and M >= 2S-1, the simulator's
/// replay gives M (F+B+W) + (S-1) max(F, F+B-2W) (derived by replaying the
/// order for S <= 7, M <= 24; the agreement test checks it). The paper
/// writes the bubble (p-1)(F+B-2W), zero for F = B = W: it drops the
/// optimizer step's synchronization (its post-validation), so the next
/// step's forwards fill the (S-1)F that the last stage waits before its
/// first forward. rannc synchronizes every step (all-reduce, then the
/// optimizer), so that (S-1)F stays: with F = B = W, ZB-H2's step is
/// ZB-H1's, and ZB-H2 gains where B > W (by (S-1) min(B-W, W)).
/// Memory: a micro-batch is held from F to W, min(M, 2S-1) of them on every
/// stage (the paper's 2p-1 on the first), and the W queue holds min(M-1, 2s)
/// while a B runs (weightQueuePeak), one more right after it. Its sends are
/// not all awaited before a backward (waitsForSendsBeforeBackward): stage s
/// has sent two more forwards than stage s+1 takes in before its first B, so
/// a transfer too large to leave at once (MPI's rendezvous) to a stage that
/// first waits for this one's gradients deadlocked the 4-stage, 8-micro-
/// batch GPT run. It waits for the gradients it has sent alone
/// (executor/train/trainer.cpp): stage s-1 takes gradient j in just before
/// its B j, and reaches it needing only earlier gradients from s and what
/// stages before it send, so no wait closes a cycle (by induction from
/// stage 0, which sends none). Without that wait a sent gradient lived into
/// the next backward as timing allowed: stage 1 of the 4-stage memory_split
/// case measured 1.020-1.031x its plan in five runs, 1.017-1.020x in four
/// with it. The
/// activations it sends stay in flight, at no cost of their own: the stage
/// keeps them for its backward, dense (Note [dense sent values] in
/// executor/runtime/stage.cpp).

/// Whether `s` runs a backward as B and W passes (Note [zero bubble H1]).
bool splitsBackward(Schedule s);

/// Whether the executor may wait, before each backward, for every transfer its
/// stage started (Note [send buffers] in executor/train/trainer.cpp): not
/// when `s` sends further ahead than the receivers' order takes in before
/// they need this stage's gradients (interleaved chunks, ZB-H2's warm-up).
bool waitsForSendsBeforeBackward(Schedule s, int virtual_stages);

/// Whether `s` runs several chunks (stages) per rank (Note [interleaved 1F1B]).
bool interleaves(Schedule s);

/// Why `s` cannot run `virtual_stages` chunks on each of `ranks` pipeline
/// ranks with `microbatches` micro-batches, or "" (Note [interleaved 1F1B]).
std::string interleavingProblem(Schedule s, int ranks, int virtual_stages, int microbatches);

/// The passes pipeline rank `rank` of `ranks` runs in one step of
/// `microbatches` micro-batches with `virtual_stages` chunks each, in order:
/// the one order generator (virtual_stages > 1 only under interleaves()).
std::vector<Pass> rankOrder(Schedule s, int rank, int ranks, int virtual_stages, int microbatches);

/// rankOrder with one chunk per rank: stage `stage` of `num_stages`.
std::vector<Pass> stageOrder(Schedule s, int stage, int num_stages, int microbatches);

/// The most micro-batches whose forward stage `stage` has run and whose
/// backward it has not, at once: the peak of its passes in rankOrder (the
/// memory model's in-flight count), in closed form for one chunk per rank;
/// with `virtual_stages` > 1 counted on the order (Note [interleaved 1F1B]).
int microbatchesInFlight(Schedule s, int stage, int num_stages, int microbatches, int virtual_stages = 1);

/// The most chunk-micro-batches pipeline rank `rank` of `ranks` holds at once
/// over all its chunks, in closed form (Note [interleaved 1F1B]).
int rankMicrobatchesInFlight(Schedule s, int rank, int ranks, int virtual_stages, int microbatches);

/// The most micro-batches whose B has run and whose W has not while a B runs
/// (0 unless splitsBackward): what the W queue holds beside a backward's
/// working memory. Right after a B one more is queued, but no backward runs.
int weightQueuePeak(Schedule s, int stage, int num_stages, int microbatches);

/// One stage's device time per micro-batch, in pipeline order.
struct StageSlots {
  double forward_s = 0;  ///< receive the inputs, then compute the forward
  double backward_s = 0; ///< receive the output gradients, recompute, compute the backward
  /// Of backward_s, the weight gradients: a W pass under a schedule that
  /// splits the backward (the rest, backward_s - weight_s, is its B pass).
  double weight_s = 0;
};

/// The pipeline phase of a step (before the all-reduce) in closed form.
struct PipelineTime {
  double fill_drain_s = 0;   ///< the sum of every slot: one micro-batch's way through
  double steady_s = 0;       ///< (M-1) x the bottleneck period (ZB-H1: less the W that fills the drain)
  int bottleneck_stage = -1; ///< the first stage with the largest forward + backward slot (interleaved: of a rank's chunks)
  /// fill_drain + steady.
  double total() const { return fill_drain_s + steady_s; }
};

/// The closed-form time of `microbatches` micro-batches through `stages`
/// under `s` (Note [partition cost model] in planner/partition/evaluate.cpp),
/// stage i on pipeline rank i % (stages / virtual_stages).
PipelineTime pipelineTime(Schedule s, const std::vector<StageSlots> &stages, int microbatches,
                          int virtual_stages = 1);

} // namespace rannc::pipeline
