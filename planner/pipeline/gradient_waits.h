// Which gradient sends a rank awaits before each backward, decided on a
// replay of every rank's order (Note [awaited gradient sends]). Torch-free:
// the executor's trainer and the memory model (planner/partition/evaluate.cpp)
// both read it, so what the executor holds in flight is what the plan counts.
#pragma once

#include <vector>

#include "planner/pipeline/schedule.h"

namespace rannc::pipeline {

/// Note [awaited gradient sends]
/// A stage's B sends the gradients of its inputs to their producers at once;
/// the transport holds each until the producer has taken it in. Under 1F1B
/// and its kin the executor waits for every send before each backward (Note
/// [send buffers] in executor/train/trainer.cpp), so no gradient outlives the
/// next backward. Under interleaved 1F1B it cannot wait for its activations
/// (a chunk's may go to the rank's own later chunk, received after this
/// backward), and waiting for each gradient at the next backward stalls
/// where the producer is behind by design: rank 0 of 4 sends stage 4's
/// gradients to stage 3 on rank 3, which runs its group's stage-7 backwards
/// first. Not waiting at all left the gradients in flight to the machine's
/// load: memory_split's interleaved run measured 1.010-1.059x its plan.
///
/// So the waits are decided on a replay: every rank runs its order (one
/// step, or the K runs of gradient accumulation back to back) with a forward
/// taking 1, a backward 2 (a split one's B and W 1 each), a forward starting
/// once the stage before has finished it, a backward once the stage after has
/// (the last stage: once its own forward has), and messages taking no time.
/// Before backward `a` a rank awaits each gradient it has sent and not yet
/// awaited whose every producer had started that micro-batch's backward (so
/// had taken the gradient in) by the time `a` starts in the replay.
///
/// No wait so chosen closes a cycle, whatever the real durations: every edge
/// of the real run (a rank's own order, a value's send before its receive, a
/// producer's receive before an awaited send's wait) goes, in the replay,
/// from something that ends to something that starts no earlier: the replay
/// orders the stages as a chain, which covers every message between them,
/// and the waits were chosen so. Around a cycle those times could not
/// increase, so every step of it would take no time, but a cycle through a
/// wait passes the backward it precedes, which takes some.
///
/// What stays unawaited is what the replay itself has in flight: the memory
/// model charges exactly that (inFlightGradients), and the executor holds no
/// more (it may hold less: a completed send is dropped at the transport's
/// next call). The rule asks nothing of the schedule: on 1F1B, ZB-H1 and
/// ZB-H2 it awaits every gradient before the next backward, as Notes [send
/// buffers] and [zero bubble H2] argue by hand (gradient_waits_test), and
/// ZB-H2 runs its waits from here too.

/// A B pass's gradients, named by the stage that sent them and its micro-batch.
struct SentGradient {
  int stage = 0;
  int microbatch = 0;
  bool operator==(const SentGradient &o) const { return stage == o.stage && microbatch == o.microbatch; }
};

/// For each pass of each rank's order (`orders[r]`, pipeline rank r's passes,
/// a pass of chunk c being stage c * orders.size() + r): the gradients that
/// rank awaits right before it, empty but before backwards (Note [awaited
/// gradient sends]). `producers[s]`: every stage stage s receives values from
/// (empty: stage s - 1 alone). Fails when the orders deadlock on their own.
Expected<std::vector<std::vector<std::vector<SentGradient>>>>
awaitedGradients(const std::vector<std::vector<Pass>> &orders, const std::vector<std::vector<int>> &producers = {});

/// For every pipeline rank r of `ranks`, for each pass of rankOrder(s, r,
/// ranks, virtual_stages, microbatches): how many of each chunk's sent
/// gradients are held unawaited while it runs (Note [awaited gradient
/// sends]), producers being the stage before. One replay serves every rank.
std::vector<std::vector<std::vector<int>>> inFlightGradients(Schedule s, int ranks, int virtual_stages,
                                                             int microbatches);

} // namespace rannc::pipeline
