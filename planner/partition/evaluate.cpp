#include "planner/partition/evaluate.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "planner/pipeline/gradient_waits.h"

namespace rannc::partition {

// Note [partition cost model]
// One device of stage s (blocks [a, e), r replicas, first rank o, M
// micro-batches) processes b = ceil(B / (M r)) samples per micro-batch.
//
// Time per micro-batch:
//   fwd = sum fwd_i(b); bwd = sum bwd_i(b); recompute adds one more fwd.
//   Receiving is charged to the receiver, which blocks on it (rendezvous: a
//   large message moves only once the receive is posted; sends are
//   non-blocking and cost the sender nothing):
//     recv_act  = lat + cut[a] * b / bw   (s > 0)  over the link between ranks o-1 .. o+r-1
//     recv_grad = lat + cut[e] * b / bw   (s < S-1) over the link between ranks o .. o+r
//   a link being intra-node when all those ranks sit in one node. Each device
//   moves its own share at the full per-device bandwidth (a sender feeding
//   several receivers is assumed not to be the bottleneck).
//   A stage whose BatchNorms synchronise their statistics over its r > 1
//   replicas (--batchnorm exact, Note [batch statistics] in
//   planner/plan/batch_statistics.cpp) all-reduces, in each forward, each
//   BatchNorm's per-channel sums (C + 1 floats) and squared deviations (C),
//   and their gradients in each backward: n_s = 2 per BatchNorm small
//   all-reduces of y_s = sum (2 C + 1) 4 bytes, over the gradient ring:
//     SYNC = 2 (r-1)/r * y_s / bw + n_s 2 (r-1) lat, in both slots (and in a recomputed forward);
//   latency-bound, so it weighs against replicating many-BatchNorm stages.
//   Forward slot F_s = recv_act + fwd + SYNC; backward slot G_s = recv_grad + recompute + bwd + SYNC.
//
// Step time (M micro-batches), in closed form by pipeline::pipelineTime
// (planner/pipeline/schedule.cpp), which `rannc-plan show` uses too:
//   GPipe: every device runs all forwards, then all backwards. Each phase is a
//     flow shop of identical jobs, whose makespan is exactly
//     sum(slot) + (M-1) * max(slot):
//       T = sum F + (M-1) max F + sum G + (M-1) max G.
//   1F1B: the classic closed form  T = sum (F+G) + (M-1) max (F+G).
//     It never exceeds the GPipe form, so with the schedule searched 1F1B
//     always wins (it also holds fewer activations). An event-by-event replay
//     (simulate.h) gives exactly the GPipe form, and for 1F1B the same value
//     when stages are uniform or M = 1; otherwise the replay is usually a little
//     faster, because strict alternation overlaps part of the fill and drain
//     (docs/partitioner.md gives measured gaps).
//   Then every replica group all-reduces its gradients, after the pipeline has
//   drained (a synchronous optimizer step):
//     AR_s = 2 (r-1)/r * param_bytes / bw + 2 (r-1) lat (ringAllReduce), bw intra-node when the
//     group's ranks share a node, else the ring's devices per node times one
//     device's network share (Note [ring all-reduce bandwidth] in
//     problem.cpp); the step pays max_s AR_s. A sharded stage
//     (ZeRO-1) reduce-scatters the gradients and all-gathers the updated
//     parameters instead: (r-1)/r * param_bytes each way, the same bytes and
//     the same formula, so sharding costs no time in this model.
//
// Memory of one device:
//   params P, grads P, optimizer state opt * P, or opt * P / r when the stage
//   shards it over its r replicas (Note [sharded optimizer state] in
//   executor/train/zero.h; the executor pads each bucket to a multiple of r,
//   at most r-1 elements a bucket, which the model leaves out);
//   in flight k = M (GPipe) or min(M, S - s) (1F1B): pipeline::
//     microbatchesInFlight, the peak of the order the stage runs;
//   activations = k b (cut[a] + sum act)   without recomputation: every
//                                          micro-batch in flight keeps its
//                                          inputs and its blocks' values;
//               = b sum act                with: one micro-batch rebuilt in
//                                          backward, plus
//   stash       = k b cut[a]               the inputs it keeps per micro-batch
//                                          in flight (Note [recomputation]);
//                                          its sent values are in sum act
//                                          (Note [recomputing stage's peak]);
//   step        = 2 min(P, bucket) / r     a sharded stage's Adam step: its
//                                          temporaries (sqrt(v), then that over
//                                          sqrt(1 - beta2^t)) are two tensors of
//                                          the block it updates at once, one
//                                          bucket's 1/r (bucket: rannc-exec's
//                                          25 MiB default);
//               = 2 max_i P_i              an unsharded one updates one
//                                          parameter at a time, the largest
//                                          on the device (Block::largestParamAt;
//                                          uncharged until 2026-11-30: a last
//                                          stage of a GPT's 25,600 B lm_head
//                                          and its loss measured 1.105x its
//                                          plan under 1F1B);
//                                          either runs after the backward, so the
//                                          peak holds the larger of it and
//                                          activations + stash + working
//                                          (measured: GPT 1 x 2 fused, 456,080
//                                          bytes above the parameters, gradients
//                                          and state, 2 x 228,040);
//   where sum act stands for K = sum act_i - sum fr_i + X_a + L_a over the stage's
//     blocks (Note [unsaved values], Note [received layout]): what one
//     micro-batch keeps besides its inputs;
//   working = max over the stage's blocks u of w_u = fixed_u + b work_u, a
//     block's forward transients and backward, with the gradients it receives
//     (freed once consumed: Note [handing gradients over] in
//     executor/runtime/stage.cpp) and those of the values passing over it,
//     which wait for their producer; fixed_u covers what does not grow with
//     the batch, a parameter's gradient made whole before it is added to
//     .grad (planner/driver/lower.cpp fits both). By the time block u runs
//     its backward, the blocks after it in the stage have run theirs and
//     autograd has freed what they kept, b S_u of the micro-batch, with
//     S_u = sum_{u<j<e} (act_j - fr_j) + X_{u+1}, except the values the stage
//     sends, at most b cut[e]; their forwards have not run yet when block u
//     runs its own. So working = max(w_{e-1}, max_{u<e-1} (w_u - b max(0,
//     S_u - cut[e]))) (stageWorking);
//   transfers hold nothing of their own at the peak: a sent value is the
//     stage's own tensor, kept for backward anyway, a received one is
//     allocated as the tensor the stage keeps, and every transfer a stage
//     started is over before its next backward (Note [send buffers] in
//     executor/train/transport.cpp);
//   buffers = sum buf_i, the model buffers (Note [buffers] in ir.h);
//   lowp_weights = sum lowp_i, the bf16/fp16 weight copies of a
//   mixed-precision plan (Note [autocast dtypes] in
//   planner/cost/precision.cpp), held once per stage.
//   Feasible when the total <= memory * (1 - margin) - reserve, the reserve
//   being what a GPU's runtime holds outside tensors (Note [runtime reserve]
//   in planner/cluster/cluster.cpp; 0 on cpu).

// Note [recomputing stage's peak]
// A recomputing stage has two kinds of peak. In backward: its stash, one
// micro-batch rebuilt with autograd on (b K, the values it sends among them,
// since the block that makes them keeps them) and one block's working bytes.
// In forward: its stash, the newest sent values, which the transfer holds
// once the runner has dropped them (Note [send buffers] in
// executor/train/transport.cpp), and the next micro-batch's forward without
// autograd. The model counts the backward's, which covers the forward's:
//   - a forward without autograd holds, at any block u, no more than the
//     rebuilt forward holds there, which K's prefix to u and w_u's forward
//     transients bound;
//   - the sent values in transit, b cut[e], are matched by bytes the backward
//     term holds and that forward does not: for u < e-1 the sent values
//     stageWorking leaves uncredited, for u = e-1 the gradients of the sent
//     values, which w_{e-1} includes (the profiler hands them over).
// And no transfer is in flight at a backward: the trainer waits for its sends
// before each (Note [send buffers]). Until 2026-11-28 the stash also counted
// b cut[e], so a stage that sends was over-stated by one micro-batch's sent
// values, counted twice at its backward peak (in K and in the stash). Measured
// (GPT, 2 stages, 4 micro-batches of 16, fused, per-action peaks of rank 0):
// every forward phase peaked 0.6-0.7 MiB below every backward, and each
// backward's peak held the 128 KiB the stash added only once.

// Note [tensor parallel stages]
// A stage of degree t and r replicas runs on r t consecutive ranks; replica g
// is the tensor-parallel group of ranks o + g t .. o + g t + t-1, which must
// lie inside one node (t <= devices per node, no group across a node
// boundary): its collectives take the intra-node link. Every device of a group
// runs the same local graph on the replica's b samples (Note [tensor parallel
// sharding] in planner/sharding/sharding.h). Each block says which part of its
// numbers divides by t (Block::Split, filled by planner/driver/lower.cpp from
// the sharding analysis); with keep = 1 - 1/t, one device has
//   fwd_i(b) - keep split_fwd_i(b), and the same for bwd, working bytes, the
//   parameters (so gradients and optimizer state too) and their low-precision
//   copies, and the saved activations (values cut along an axis). Unsaved
//   values (Note [unsaved values]) are never counted split, so K keeps its
//   prefix form and stays >= 0.
// The group all-reduces coll_i bytes per sample in n_i collectives a forward
// (Megatron's g; the backward's f the same bytes), each a ring on the
// intra-node link, one latency each:
//   TP = sum_i n_i lat_intra + 2 (t-1)/t * b sum_i coll_i / bw_intra
// added to the forward and to the backward slot (and to a recomputed forward).
// Values crossing into or out of the stage are whole on every device of a
// group (each device receives and sends the replica's whole values, as a
// replica of a t = 1 stage does): a cut whose crossing values are not whole
// (Problem::cut_whole) may not border a stage with t > 1. The data-parallel
// all-reduce runs over the r devices holding the same shard: its bytes are the
// stage's per-device parameter bytes, over the link that joins ranks o .. o +
// r t - 1. Transfers between stages use the links of the first rank before
// and after the stage's r t ranks, as for t = 1.

// Note [unsaved values]
// A block's activation bytes act_i are measured with the block alone
// (executor/profile/profiler.cpp): what autograd saves in it, plus its outputs
// for later blocks, which it must keep because it sends them. Inside a stage
// each value goes at its last use (Note [last use] in
// executor/runtime/stage.h), so an output that autograd saves nowhere and that
// a later block of the same stage reads last is freed during forward: a GPT's
// attention inputs, which the matrix product copies before it saves them. With
// fr_i the bytes of such values made before block i that block i reads last,
// and X_i those of them crossing boundary i (the unsaved part of cut[i]), a
// micro-batch of stage [a, e) keeps, besides its inputs cut[a],
//   K = sum_{a<=i<e} (act_i - fr_i) + X_a.
// Each unsaved value made inside and freed inside counts +1 in its maker's
// act and -1 in its last reader's fr; made inside and read after e, +1: it is
// sent; received and freed inside, -1 in fr and +1 in X_a, as it is counted in
// cut[a]; received and passed on, +1 in X_a: the one over-count, bounded by
// cut[a], and only in stages shorter than the value's life. The DP takes K
// from prefix sums. X_{i+1} - X_i + fr_i is what block i makes that is saved
// nowhere, at most act_i, so the prefix act - fr - X never decreases.

// Note [received layout]
// A value a stage receives is contiguous (the transport sends and receives
// dense buffers), where its maker may have made it a view: a GPT's key,
// transposed for its MatMul, or the query, whose layout the attention output
// takes. An op that wants another layout then copies what it would have read
// as a view: the fused attention copies a received transposed key (the CPU
// kernels want a dense last axis, executor/runtime/kernels/fused.cpp) and
// returns its output laid out as the received query, which the output
// projection's reshape then copies; autograd saves both copies. A unit is
// measured alone with its inputs laid out as the whole graph made them
// (executor/profile/profiler.cpp), so its kept bytes are what it keeps inside
// a stage; the profiler measures it again with its strided inputs
// (CostTable::strided_values) made contiguous, and lowering charges the
// difference, d_u, at every cut i from just after the earliest maker of one
// of them to u (Problem::received_layout_cut_bytes_per_sample): a stage
// [a, e) adds L_a to K beside X_a. It over-counts where the stage ends
// before u, or receives only some of them. Measured (GPT, 4 stages of 1F1B,
// M = 8, b = 1): the stage from block 0's attention to block 1's ln1 kept
// 8,192 B per micro-batch more than its units measured alone, a key and an
// output of 4,096 B each; d_u of the attention unit is that.

// Note [values passing over]
// cut[a] counts every value made before block a and read at or after it, but
// the executor sends a value straight from its maker to each stage that
// reads it (Note [partition cost model]): a stage [a, e) that reads it
// nowhere, lying wholly between its maker (or one reader) and its next
// reader, neither receives it nor, in backward, its gradient. A GPT's
// residual stream passes over a stage holding only attention so. Lowering
// lists each such stretch (Problem::PassOver: from < a and e <= to), and a
// stage holds cut[a] - pass(a, e) of its inputs per micro-batch in flight
// (the stash of a recomputing stage the same), and at degree 1 working bytes
// b pass(a, e) lower: every block's working line counts the gradients of the
// values passing over it, these among them (planner/driver/lower.cpp); at
// degree t > 1 that part may be split, and no credit is taken. The receive
// time still counts the whole cut[a]; stageWorking's credit of the values
// the stage sends, cut[e], still counts them too (both over-counts). The DP
// tables pass(a, e) (StageTable::passOver). Measured (GPT, 1F1B, 4 stages,
// M = 8, b = 1): the attention-only stage held its input, 4,096 B a
// micro-batch, and not the residual's 4,096 the plan had charged it, nor
// its gradient.

std::string describe(const StageMemory &m, std::string (*bytes)(double)) {
  return "params " + bytes(m.params) + ", grads " + bytes(m.grads) + ", optimizer " + bytes(m.optimizer) +
         ", activations " + bytes(m.activations) + (m.stash > 0 ? ", recompute stash " + bytes(m.stash) : "") +
         ", working " + bytes(m.working) + (m.step > 0 ? ", optimizer step " + bytes(m.step) : "") +
         ", buffers " + bytes(m.buffers) +
         (m.lowp_weights > 0 ? ", low-precision weights " + bytes(m.lowp_weights) : "") +
         (m.weight_queue > 0 ? ", weight-gradient queue " + bytes(m.weight_queue) : "");
}

StageMemory stageMemory(const StageMemoryInputs &in, bool recompute, bool zero) {
  const double b = in.samples, k = in.inflight;
  StageMemory m;
  m.params = m.grads = in.param_bytes;
  m.optimizer = zero ? in.optimizer_bytes / in.replicas : in.optimizer_bytes;
  // Note [what a queued W keeps]: of the k, the q queued hold only what their W reads.
  const double queued = std::min(in.weight_queue, std::max(0.0, k - 1));
  if (recompute) {
    m.activations = b * in.act_per_sample;
    m.stash = (k - queued) * b * in.cut_in; // Note [recomputing stage's peak]; Note [recomputing split backward]
  } else {
    m.activations = (k - queued) * b * (in.cut_in + in.act_per_sample);
  }
  m.working = in.working;
  m.buffers = in.model_buffers;
  m.lowp_weights = in.lowp_weights;
  // Note [partition cost model]: an Adam step's two temporaries, of a sharded
  // bucket or of the largest parameter.
  const bool adam = in.param_bytes > 0 && in.optimizer_bytes >= 2 * in.param_bytes;
  if (adam && zero && in.replicas > 1)
    m.step = 2 * std::min(in.param_bytes, kGradientBucketBytes) / in.replicas;
  else if (adam)
    m.step = 2 * in.largest_param;
  // Note [zero bubble H1]: the queue beside a B's working bytes, or one
  // micro-batch more right after it, when no backward works and the one
  // just done has let go of what its W does not read (Note [what a queued
  // W keeps]). A recomputing stage's micro-batch in B holds its input and
  // its rebuilt values, cut[a] + K, as a stored one does (Note [recomputing
  // split backward]), so the same formula holds with or without recomputation.
  // A queued micro-batch holds its received inputs too, which W's graph
  // holds (Note [what a queued W keeps]).
  if (in.wgrad_per_sample > 0 || in.wgrad_fixed > 0) {
    const double held = b * (in.wgrad_per_sample + in.cut_in) + in.wgrad_fixed;
    m.weight_queue = std::max(queued * held, (queued + 1) * held - b * (in.cut_in + in.act_per_sample) +
                                                 std::max(0.0, in.weight_working - in.working));
  }
  return m;
}

double stageWorking(const Problem &p, int a, int e, double b, int degree) {
  double working = p.blocks[static_cast<size_t>(e - 1)].workingAt(b, degree);
  const double sent = p.cut_bytes_per_sample[static_cast<size_t>(e)];
  double after = 0; // sum_{u<j<e} (act_j - fr_j)
  for (int u = e - 2; u >= a; --u) {
    const Block &next = p.blocks[static_cast<size_t>(u + 1)];
    after += next.activationAt(degree) - next.unsaved_freed_bytes_per_sample;
    const double freed = std::max(0.0, after + p.unsavedCutAt(u + 1) - sent); // S_u - cut[e]
    working = std::max(working, p.blocks[static_cast<size_t>(u)].workingAt(b, degree) - b * freed);
  }
  return working;
}

// Note [what a queued W keeps]
// Under a split backward a micro-batch whose B has run waits for its W
// (Note [split backward] in executor/runtime/stage.cpp). By then the runner
// has let go of its values (sent, or their gradients sent), and right after
// B it releases what autograd saved in every node of the micro-batch's graph
// that W does not run (StageRunner::backward). What stays for W is, per
// root, the gradient of its outputs and the data-side inputs its weight
// gradient reads (x of x W, an embedding's ids; the roots are products and
// lookups, Note [weight gradients in B] in planner/ir/weight_gradients.h):
// Block::wgrad_bytes_per_sample counts both (planner/driver/lower.cpp,
// ir::weightGradientReads). An input several roots read, as a GPT's q, k
// and v projections read one, counts once: in its first reader's unit, and
// in Problem::wgrad_read_cut_bytes_per_sample at every cut between its first
// and its last reader, which a stage beginning there adds (over only where
// the stage lies wholly between two of its readers).
// The values the stage received stay too: their leaves hang off the graph W
// runs (autograd's AccumulateGrad nodes hold them) until W has run, though
// B has sent their gradients. So of the k micro-batches in flight the q
// queued hold b w + P each, w = cut[a] + sum wgrad_bytes, where P, the sum of
// Block::wgrad_param_bytes, is the parameter-sized gradients B made for W
// (Note [weight gradients in B] in planner/ir/weight_gradients.h), and the
// others b (cut[a] + K). An input W reads that the stage receives is one tensor, held
// once, in cut[a]: wgrad_read_cut_bytes_per_sample takes off a stage
// beginning at cut a what one root of its first block alone reads and an
// earlier unit made (until 2026-11-29 it counted twice: the 4-stage
// memory_split plan beginning its last stage at block 1's fc2, whose input
// is the 16,384 B GELU output a micro-batch, measured 0.928x its plan under
// ZB-H1, 3 queued, and 0.886x under ZB-H2, 6 queued: 16,384 B too many per
// queued micro-batch; 1.028x and 1.023x now). An input several roots read
// (the q, k and v projections' LayerNorm output) stays counted twice when
// received: taking it off left the stage beginning at block 1's q
// projection at 1.064x (ZB-H1) and 1.070x (ZB-H2), where twice gives 1.021x
// and 1.009x, so something of its size is held there that the model does
// not name. An input a later block of the stage reads first counts twice
// too. B makes no weight
// gradient: its working bytes are the per-sample part of the blocks' working
// lines, b work_u; W's are their fixed part, fixed_u, a parameter's gradient
// made whole (Note [partition cost model]); each the largest block's. The
// peak is a B's, (k - q) b (cut[a] + K) + q (b w + P) + working_B, or a W's,
// once the micro-batch whose B has just run has joined the queue,
// (k - q - 1) b (cut[a] + K) + (q + 1) (b w + P) + working_W:
//   activations  = (k - q) b (cut[a] + K),  working = working_B,
//   weight_queue = max(q (b w + P), (q + 1) (b w + P) - b (cut[a] + K) + max(0, working_W - working_B)).
// Until 2026-11-29 every queued micro-batch was charged
// whole and the graph kept whole: on the memory_split case the
// attention-only stage (its q, k, v projections first) kept 6,144 of the
// 21,760 B a micro-batch holds there, its roots' input, and the plan said
// 0.833x of the measured peak. Until 2026-11-29 13:30 UTC a queued
// micro-batch was charged without its received inputs: on the same case
// with 4 stages, M = 8, stage 1 (from block 0's attention to block 1's
// ln1) held 86,272 B per queued micro-batch where w said 65,536, the 20,480
// B it had received among the difference.

// Note [recomputing split backward]
// A recomputing stage under a split backward (ZB-H1, ZB-H2) runs its
// forwards without autograd and keeps each micro-batch's inputs, as under
// 1F1B (Note [recomputation] in executor/runtime/stage.h). Its B rebuilds
// the micro-batch's forward with autograd on, recording the weight-gradient
// roots, and runs the input-gradient backward keeping the graph; right after
// it every node W does not run lets go of what it saved, so the queued
// micro-batch holds what its W reads, w, as without recomputation. W is
// unchanged. In time, B's slot is the recomputed forward plus the input
// gradients (StageCost::backwardSlot less weightSlot: the recomputation is
// in the backward slot, as a recomputing 1F1B stage's is) and W's is the
// weight gradients. In memory, of the k micro-batches in flight the q queued
// hold w each, the others their inputs (the stash), and the one in B also its
// rebuilt values, b K, and B's working bytes:
//   activations = b K,  stash = (k - q) b cut[a],  working = working_B,
// and weight_queue as in Note [what a queued W keeps]: the micro-batch in B
// holds b (cut[a] + K) as a stored one does, so the peak right after a B,
// (k - q - 1) b cut[a] + (q + 1) b w + working_W, takes the same term. The
// forward's peak (stash, the queue, one forward without autograd) stays
// under the backward's as in Note [recomputing stage's peak]. Recomputation
// only adds time here too: B grows by F, and a stage adds F + max(0, G - cW)
// (Note [split backward DP] in dp.cpp), which never falls as G grows.

// Note [split backward of a tensor-parallel stage]
// A tensor-parallel stage's collectives (Megatron's f and g) lie on the data
// path: the forward runs g's all-reduce, B runs f's, and W is local, each
// device making the weight gradients of its own shard. So the stage's slots
// are the 1F1B stage's (Note [tensor parallel stages]), its backward split
// into B and W as a degree-1 stage's: W on one device is the blocks' W less
// keep times its split part, which Block::wgradSplit takes as W's share of
// the backward in each term times the backward's split part (the split ops'
// weight gradients divide by t as their input gradients do), and the
// collectives stay in B. What a queued W keeps, Block::wgrad_bytes_per_sample,
// is the whole value: a shard's roots read no more than that (a
// column-parallel root's output gradient is 1/t of it), so the queue is
// over-stated rather than under.

double ringAllReduce(double bytes, int n, const Link &link, double latencies) {
  return 2.0 * (n - 1) / n * bytes / link.bandwidth + latencies * link.latency_s;
}

// Note [tied parameters]
// A parameter read by several blocks (a word embedding tied to the output
// layer) is in each reader's Block::param_bytes, since every stage holding a
// reader holds a copy (the executor sums the copies' gradients,
// executor/train/shared_parameters.cpp). A stage holding c > 1 of its readers
// holds it once: Problem::tiedExcess takes the c - 1 extra copies off the
// stage's parameter bytes (its split part divided by the stage's degree as
// the rest), so gradients, optimizer state and the data-parallel all-reduce
// follow. The stage DP's per-range numbers (stage_table.h) take the same off.

// Note [scatter/gather transfers]
// The values crossing into a tensor-parallel stage are whole on every device
// of the sending group and needed whole on every device of the receiving one
// (Note [tensor parallel stages]). Sent as they are, each of the t devices
// moves the whole value over its own network share. Megatron-LM sends each
// device's 1/t of it instead and all-gathers the pieces over NVLink inside the
// receiving node (Narayanan et al., SC'21, section 4.1, "scatter/gather
// communication optimization"; its end-to-end runs, Table 1, use it, section
// 5.1). Across nodes, with Devices::scatter_gather, a stage of degree t so
// receives in
//   lat_inter + bytes / (t bw_inter) + lat_intra + (t-1)/t bytes / bw_intra
// (a ring all-gather moves (t-1)/t of the value over every link). Only the
// receiving stage's degree enters, as the sender's never does here (Note
// [partition cost model]: a sender is assumed not to be the bottleneck), so a
// degree-1 stage feeding a degree-t one is charged as if it scattered too.
// Inside a node scattering saves nothing (the all-gather takes the same
// link), so intra-node transfers stay whole. Lowering sets scatter_gather for
// `cuda` devices (cluster::scatterGatherTransfers, planner/cluster/transfers.h):
// it is how GPU tensor parallelism moves stage boundaries. rannc-exec applies
// the same rule to the plan's device type and the same node test at the same
// ranks (Note [scatter/gather in the executor] in
// executor/train/scatter_gather.h), between stages of equal degree; a stage
// fed by one of another degree is charged here as if scattered, but gets the
// value whole.
double receiveTime(const Devices &d, const Link &link, bool intra, double bytes, int t) {
  if (intra || t <= 1 || !d.scatter_gather) return link.latency_s + bytes / link.bandwidth;
  return link.latency_s + bytes / (t * link.bandwidth) + d.intra_node.latency_s +
         (t - 1.0) / t * bytes / d.intra_node.bandwidth;
}

namespace {

int nodeOf(const Problem &p, int rank) { return rank / p.devices.per_node; }

// Note [scatter/gather in the executor] applies the same test at the same ranks.
bool sameNode(const Problem &p, int first, int last) { return nodeOf(p, first) == nodeOf(p, last); }

const Link &linkFor(const Problem &p, bool intra) { return intra ? p.devices.intra_node : p.devices.inter_node; }

std::string stageName(int s) { return "stage " + std::to_string(s); }

} // namespace

std::string tensorParallelProblem(const Problem &p, const Stage &stage, int first_rank) {
  const int t = stage.tensor_parallel;
  if (t == 1) return "";
  if (!p.tpDegreeAllowed(t)) {
    std::string allowed;
    for (int d : p.tp_degrees.empty() ? std::vector<int>{1} : p.tp_degrees)
      allowed += (allowed.empty() ? "" : ", ") + std::to_string(d);
    return "has tensor-parallel degree " + std::to_string(t) + ", not one the model allows (" + allowed + ")";
  }
  if (t > p.devices.per_node)
    return "has tensor-parallel degree " + std::to_string(t) + ", more than the " +
           std::to_string(p.devices.per_node) + " devices of a node";
  if (!p.devices.groupsInsideNodes(first_rank, stage.replicas, t))
    for (int g = 0; g < stage.replicas; ++g)
      if (!sameNode(p, first_rank + g * t, first_rank + g * t + t - 1))
        return "has tensor-parallel group " + std::to_string(g) + " (ranks " + std::to_string(first_rank + g * t) +
               ".." + std::to_string(first_rank + g * t + t - 1) + ") across a node boundary";
  for (int cut : {stage.block_begin, stage.block_end})
    if (!p.cutWhole(cut))
      return "has tensor-parallel degree " + std::to_string(t) + " but values crossing its boundary at block " +
             std::to_string(cut) + " are split or partial there";
  return "";
}

StageCost evaluateStage(const Problem &p, const Stage &stage, int index, int num_stages, int first_rank,
                        int microbatches, Schedule schedule, int virtual_stages, int prev_last_rank,
                        int next_first_rank) {
  StageCost c;
  c.block_begin = stage.block_begin;
  c.block_end = stage.block_end;
  c.first_rank = first_rank;
  c.replicas = stage.replicas;
  c.tensor_parallel = stage.tensor_parallel;
  c.recompute = stage.recompute;
  c.zero = stage.zero && stage.replicas > 1;
  c.samples = replicaSamples(p.batch_size, microbatches, stage.replicas);
  const double b = static_cast<double>(c.samples);
  const int t = stage.tensor_parallel;
  const double keep = 1 - 1.0 / t; // Note [tensor parallel stages]

  StageMemoryInputs mem;
  double collective_bytes = 0, collectives = 0, whole_params = 0, stat_bytes = 0, stat_collectives = 0;
  for (int i = stage.block_begin; i < stage.block_end; ++i) {
    const Block &blk = p.blocks[i];
    c.fwd_s += blk.fwd.at(b) - keep * blk.tp.fwd.at(b);
    c.bwd_s += blk.bwd.at(b) - keep * blk.tp.bwd.at(b);
    c.wgrad_s += blk.wgradAt(b, t); // Note [split backward of a tensor-parallel stage]
    if (pipeline::splitsBackward(schedule)) {
      mem.wgrad_per_sample += blk.wgrad_bytes_per_sample;
      mem.wgrad_fixed += blk.wgrad_param_bytes;
    }
    c.param_bytes += blk.param_bytes - keep * blk.tp.param_bytes;
    mem.largest_param = std::max(mem.largest_param, blk.largestParamAt(t));
    whole_params += blk.param_bytes;
    mem.model_buffers += blk.buffer_bytes;
    mem.lowp_weights += blk.lowp_weight_bytes - keep * blk.tp.lowp_weight_bytes;
    mem.act_per_sample += blk.activationAt(t) - blk.unsaved_freed_bytes_per_sample;
    collective_bytes += blk.tp.collective_bytes_per_sample;
    collectives += blk.tp.collectives;
    stat_bytes += blk.stat_sync_bytes;
    stat_collectives += blk.stat_sync_collectives;
  }
  c.param_bytes -= p.tiedExcess(stage.block_begin, stage.block_end, t); // Note [tied parameters]
  whole_params -= p.tiedExcess(stage.block_begin, stage.block_end, 1);
  mem.act_per_sample += p.unsavedCutAt(stage.block_begin); // Note [unsaved values]
  mem.act_per_sample += p.receivedLayoutAt(stage.block_begin); // Note [received layout]
  if (pipeline::splitsBackward(schedule)) mem.wgrad_per_sample += p.wgradReadCutAt(stage.block_begin);
  mem.working = stageWorking(p, stage.block_begin, stage.block_end, b, t);
  if (pipeline::splitsBackward(schedule)) { // the working lines split between B and W (Note [zero bubble H1])
    mem.working = 0; // B makes no weight gradient, W makes them (Note [what a queued W keeps])
    for (int i = stage.block_begin; i < stage.block_end; ++i) {
      const double fixed = p.blocks[i].workingAt(0, t);
      mem.working = std::max(mem.working, p.blocks[i].workingAt(b, t) - fixed);
      mem.weight_working = std::max(mem.weight_working, fixed);
    }
  }
  // Note [values passing over]: neither they nor their gradients come here.
  const double passing = p.passOverAt(stage.block_begin, stage.block_end);
  if (t == 1) mem.working -= b * passing;
  if (t > 1) c.tp_collective_s = ringAllReduce(collective_bytes * b, t, p.devices.intra_node, collectives);
  if (t > 1 && whole_params > 0) c.param_share = c.param_bytes / whole_params;

  const double cut_in = p.cut_bytes_per_sample[stage.block_begin];
  const double cut_out = p.cut_bytes_per_sample[stage.block_end];
  const int last_rank = first_rank + stage.devices() - 1;
  if (index > 0) {
    c.recv_intra_node = sameNode(p, prev_last_rank >= 0 ? prev_last_rank : first_rank - 1, last_rank);
    const Link &l = linkFor(p, c.recv_intra_node);
    c.recv_activations_s = receiveTime(p.devices, l, c.recv_intra_node, cut_in * b, t);
  }
  if (index < num_stages - 1) {
    c.send_intra_node = sameNode(p, first_rank, next_first_rank >= 0 ? next_first_rank : last_rank + 1);
    const Link &l = linkFor(p, c.send_intra_node);
    c.recv_gradients_s = receiveTime(p.devices, l, c.send_intra_node, cut_out * b, t);
  }
  c.allreduce_intra_node = sameNode(p, first_rank, last_rank);
  if (stage.replicas > 1) { // over the replicas holding the same shard: every t-th rank
    Link ring = linkFor(p, c.allreduce_intra_node);
    ring.bandwidth = p.devices.allReduceBandwidth(first_rank, stage.replicas, t);
    c.allreduce_s = ringAllReduce(c.param_bytes, stage.replicas, ring, 2.0 * (stage.replicas - 1));
    c.stat_sync_s = ringAllReduce(stat_bytes, stage.replicas, ring, stat_collectives * 2.0 * (stage.replicas - 1));
  }
  if (stage.recompute) c.recompute_s = c.fwd_s + c.tp_collective_s + c.stat_sync_s;

  c.inflight = pipeline::microbatchesInFlight(schedule, index, num_stages, microbatches, virtual_stages);
  mem.param_bytes = c.param_bytes;
  mem.optimizer_bytes = p.optimizer_bytes_per_param_byte * c.param_bytes;
  mem.cut_in = cut_in - passing;
  if (index > 0) c.sent_gradient_bytes = mem.cut_in * b;
  mem.samples = b;
  mem.inflight = c.inflight;
  mem.weight_queue = pipeline::weightQueuePeak(schedule, index, num_stages, microbatches);
  mem.replicas = stage.replicas;
  c.memory = stageMemory(mem, stage.recompute, c.zero);
  // What sharding takes off the peak: the state's share, less where the
  // sharded step's temporaries become the peak (stageMemory).
  c.zero_saves_bytes = c.zero ? stageMemory(mem, stage.recompute, false).total() - c.memory.total() : 0;
  if (stage.recompute) c.recompute_saves_bytes = stageMemory(mem, false, c.zero).total() - c.memory.total();
  return c;
}

// Note [a rank's chunks' memory]
// Under interleaved 1F1B a rank holds its v chunks (Note [interleaved 1F1B]
// in planner/pipeline/schedule.h). Their parameters, gradients, optimizer
// state and buffers are held all along; the rest comes and goes with the
// rank's order (pipeline::rankOrder), which runs one pass at a time. So the
// rank's peak is at most the fixed parts' sum plus the largest, over the
// passes of its order, of what the micro-batches in flight of every chunk
// keep (a chunk's b (cut[a] + K) each, a recomputing chunk's inputs b cut[a])
// and the running chunk's own transient bytes: its working bytes, and its
// rebuilt micro-batch b K when it recomputes; the forward pass counts the
// micro-batch it starts, the backward the one it ends. A sharded step's
// temporaries come after the order, each chunk's in turn. Each chunk's own
// figure (StageCost::memory, its in-flight count its peak on this order)
// stays what evaluateStage says. Until 2026-11-29 the rank's figure was the
// chunks' sum, which counts every chunk's working bytes and each chunk at its
// own peak, which need not coincide: measured over planned 0.817-0.922 on the
// memory_split case (docs/partitioner.md). Beside them, the gradients each
// chunk has sent and the rank has not yet awaited while the pass runs, each
// the chunk's inputs' bytes (Note [awaited gradient sends] in
// planner/pipeline/gradient_waits.h: the executor holds no more).
double rankMemory(const std::vector<StageCost> &stages, int rank, int ranks, int virtual_stages, int microbatches,
                  Schedule schedule, const std::vector<std::vector<int>> *sent) {
  std::vector<double> per_microbatch, transient;
  double fixed = 0, step = 0;
  for (int c = 0; c < virtual_stages; ++c) {
    const StageCost &sc = stages[static_cast<size_t>(c * ranks + rank)];
    const StageMemory &m = sc.memory;
    fixed += m.params + m.grads + m.optimizer + m.buffers + m.lowp_weights;
    step = std::max(step, m.step);
    const double k = std::max(1, sc.inflight);
    per_microbatch.push_back(sc.recompute ? m.stash / k : m.activations / k);
    transient.push_back(m.working + (sc.recompute ? m.activations : 0.0));
  }
  std::vector<int> alive(static_cast<size_t>(virtual_stages), 0);
  const std::vector<pipeline::Pass> order = pipeline::rankOrder(schedule, rank, ranks, virtual_stages, microbatches);
  std::vector<std::vector<int>> replayed;
  if (!sent) {
    replayed = pipeline::inFlightGradients(schedule, ranks, virtual_stages, microbatches)[static_cast<size_t>(rank)];
    sent = &replayed;
  }
  double peak = 0;
  for (size_t at = 0; at < order.size(); ++at) {
    const pipeline::Pass &pass = order[at];
    const size_t c = static_cast<size_t>(pass.chunk);
    if (pass.forward) ++alive[c];
    double held = transient[c];
    for (size_t i = 0; i < alive.size(); ++i)
      held += alive[i] * per_microbatch[i] + (*sent)[at][i] * stages[i * ranks + rank].sent_gradient_bytes;
    peak = std::max(peak, held);
    if (!pass.forward) --alive[c];
  }
  return fixed + std::max(peak, step);
}

Evaluation evaluate(const Problem &p, const Solution &sol) {
  Evaluation ev;
  ev.capacity_bytes = p.devices.capacity();
  auto malformed = [&](std::string why) {
    ev.well_formed = false;
    ev.violations.push_back(std::move(why));
  };
  const int n = p.numBlocks();
  const int S = sol.numStages();
  if (p.cut_bytes_per_sample.size() != static_cast<size_t>(n) + 1)
    malformed("problem: cut_bytes_per_sample needs blocks+1 entries");
  if (S == 0) malformed("no stages");
  if (sol.microbatches < 1 || sol.microbatches > p.batch_size)
    malformed("micro-batches " + std::to_string(sol.microbatches) + " not in [1, batch size " +
              std::to_string(p.batch_size) + "]");
  int expect_begin = 0;
  for (int s = 0; s < S; ++s) {
    const Stage &st = sol.stages[s];
    if (st.block_begin != expect_begin)
      malformed(stageName(s) + " starts at block " + std::to_string(st.block_begin) + ", expected " +
                std::to_string(expect_begin));
    if (st.block_end <= st.block_begin || st.block_end > n)
      malformed(stageName(s) + " has block range [" + std::to_string(st.block_begin) + ", " +
                std::to_string(st.block_end) + ") outside [0, " + std::to_string(n) + ") or empty");
    if (st.replicas < 1) malformed(stageName(s) + " has " + std::to_string(st.replicas) + " replicas");
    if (st.tensor_parallel < 1)
      malformed(stageName(s) + " has tensor-parallel degree " + std::to_string(st.tensor_parallel));
    expect_begin = st.block_end;
  }
  if (S > 0 && expect_begin != n)
    malformed("stages end at block " + std::to_string(expect_begin) + ", expected " + std::to_string(n));
  const int v = sol.virtual_stages, ranks = S / std::max(1, v);
  if (std::string why = pipeline::interleavingProblem(sol.schedule, ranks, v, sol.microbatches); !why.empty())
    malformed(why);
  else if (v > 1 && S % v != 0)
    malformed(std::to_string(S) + " stages are not " + std::to_string(v) + " chunks on each pipeline rank");
  for (int s = ranks; s < S && v > 1 && S % v == 0; ++s) // Note [interleaved 1F1B]: chunks share their rank's devices
    if (sol.stages[s].devices() != sol.stages[s % ranks].devices())
      malformed(stageName(s) + " has " + std::to_string(sol.stages[s].devices()) + " devices, but it runs on those of " +
                stageName(s % ranks) + ", " + std::to_string(sol.stages[s % ranks].devices()));
    else if (sol.stages[s].tensor_parallel != sol.stages[s % ranks].tensor_parallel) // and in its groups
      malformed(stageName(s) + " is " + std::to_string(sol.stages[s].tensor_parallel) +
                "-way tensor-parallel, but it runs in the groups of " + stageName(s % ranks) + ", " +
                std::to_string(sol.stages[s % ranks].tensor_parallel) + "-way");
  if (sol.devicesUsed() > p.devices.count)
    malformed("plan uses " + std::to_string(sol.devicesUsed()) + " devices, the cluster has " +
              std::to_string(p.devices.count));
  if (!ev.well_formed) {
    ev.step_time_s = std::numeric_limits<double>::infinity();
    return ev;
  }

  const int64_t per_microbatch = (p.batch_size + sol.microbatches - 1) / sol.microbatches;
  std::vector<pipeline::StageSlots> slots;
  for (int s = 0; s < S; ++s) {
    const Stage &st = sol.stages[s];
    StageCost c = evaluateStage(p, st, s, S, sol.firstRank(s), sol.microbatches, sol.schedule, v,
                                s > 0 ? sol.firstRank(s - 1) + sol.stages[s - 1].devices() - 1 : -1,
                                s + 1 < S ? sol.firstRank(s + 1) : -1);
    if (st.replicas > per_microbatch)
      ev.violations.push_back(stageName(s) + " has " + std::to_string(st.replicas) +
                              " replicas but a micro-batch has only " + std::to_string(per_microbatch) + " samples");
    if (!p.zeroAllowed(st.zero, st.replicas))
      ev.violations.push_back(stageName(s) + (st.zero ? " shards its optimizer state but sharding is not allowed or it "
                                                         "has a single replica"
                                                       : " does not shard its optimizer state but every replicated "
                                                         "stage must"));
    if (std::string why = tensorParallelProblem(p, st, c.first_rank); !why.empty())
      ev.violations.push_back(stageName(s) + " " + why);
    if (!p.recomputeAllowed(st.recompute))
      ev.violations.push_back(stageName(s) + (st.recompute ? " recomputes but recomputation is not allowed"
                                                            : " does not recompute but every stage must"));
    const double mem = c.memory.total();
    if (v == 1 && mem > ev.capacity_bytes)
      ev.violations.push_back(stageName(s) + " needs " + formatBytes(mem) + " (" + describe(c.memory) +
                              ") but a device holds " + formatBytes(ev.capacity_bytes));
    if (v == 1) ev.peak_memory_bytes = std::max(ev.peak_memory_bytes, mem);
    slots.push_back({c.forwardSlot(), c.backwardSlot(), c.weightSlot()});
    ev.allreduce_s = std::max(ev.allreduce_s, c.allreduce_s);
    ev.stages.push_back(c);
  }
  // Note [a rank's chunks' memory]: along the rank's order.
  const std::vector<std::vector<std::vector<int>>> sent =
      v > 1 ? pipeline::inFlightGradients(sol.schedule, ranks, v, sol.microbatches)
            : std::vector<std::vector<std::vector<int>>>();
  for (int r = 0; r < ranks && v > 1; ++r) {
    double allreduce = 0; // its chunks' groups all-reduce one after the other
    std::string chunks;
    for (int s = r; s < S; s += ranks) {
      allreduce += ev.stages[s].allreduce_s;
      chunks += (chunks.empty() ? "" : " + ") + formatBytes(ev.stages[s].memory.total());
    }
    const double mem = rankMemory(ev.stages, r, ranks, v, sol.microbatches, sol.schedule, &sent[r]);
    if (mem > ev.capacity_bytes)
      ev.violations.push_back("pipeline rank " + std::to_string(r) + " (stages " + std::to_string(r) + ", " +
                              std::to_string(r + ranks) + (v > 2 ? ", ..." : "") + ") needs " + formatBytes(mem) +
                              " (its chunks alone: " + chunks + ") but a device holds " +
                              formatBytes(ev.capacity_bytes));
    ev.rank_peak_memory_bytes.push_back(mem);
    ev.peak_memory_bytes = std::max(ev.peak_memory_bytes, mem);
    ev.allreduce_s = std::max(ev.allreduce_s, allreduce);
  }
  const pipeline::PipelineTime pipe = pipeline::pipelineTime(sol.schedule, slots, sol.microbatches, v);
  ev.fill_drain_s = pipe.fill_drain_s;
  ev.steady_s = pipe.steady_s;
  ev.bottleneck_stage = pipe.bottleneck_stage;
  ev.step_time_s = pipe.total() + ev.allreduce_s;
  return ev;
}

void Evaluation::print(std::ostream &os) const {
  char buf[512];
  os << "stage  blocks     ranks      b  k  fwd_ms   bwd_ms   recv_ms  ar_ms    memory      (capacity "
     << formatBytes(capacity_bytes) << ")\n";
  for (size_t s = 0; s < stages.size(); ++s) {
    const StageCost &c = stages[s];
    std::snprintf(buf, sizeof buf, "%-6zu [%d,%d)%*s %d..%d%*s %-3lld %-2d %-8.3f %-8.3f %-8.3f %-8.3f %s%s%s\n", s,
                  c.block_begin, c.block_end, 1, "", c.first_rank, c.first_rank + c.devices() - 1, 1, "",
                  static_cast<long long>(c.samples), c.inflight, c.fwd_s * 1e3,
                  (c.bwd_s + c.recompute_s) * 1e3, (c.recv_activations_s + c.recv_gradients_s) * 1e3,
                  c.allreduce_s * 1e3, formatBytes(c.memory.total()).c_str(), c.recompute ? " recompute" : "",
                  c.zero ? " zero" : "");
    os << buf;
    if (c.tensor_parallel > 1)
      os << "       tensor-parallel " << c.tensor_parallel << ", collectives " << c.tp_collective_s * 1e3
         << " ms a pass\n";
  }
  std::snprintf(buf, sizeof buf, "step %.6f s = fill/drain %.6f + steady %.6f + all-reduce %.6f\n", step_time_s,
                fill_drain_s, steady_s, allreduce_s);
  os << buf;
  for (const std::string &v : violations) os << "violation: " << v << "\n";
}

} // namespace rannc::partition
