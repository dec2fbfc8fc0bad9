#include "executor/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <unordered_map>
#include <vector>

#include "executor/runtime/autocast.h"
#include "executor/runtime/batch_statistics.h"
#include "executor/runtime/device.h"
#include "executor/runtime/memory.h"
#include "executor/runtime/stage.h"
#include "executor/schedule/schedule.h"
#include "executor/train/checkpoint.h"
#include "executor/train/gpu_comms.h"
#include "executor/train/loss_count.h"
#include "executor/train/loss_scale.h"
#include "executor/train/optim.h"
#include "executor/train/parameter_update.h"
#include "executor/train/sample_order.h"
#include "executor/train/setup.h"
#include "executor/train/stage_transfers.h"
#include "executor/train/step_report.h"
#include "executor/train/timeline.h"
#include "executor/train/transport.h"
#include "executor/train/watchdog.h"
#include "planner/pipeline/schedule.h"
#include "planner/plan/plan.h"

// train() interprets the schedule's actions; each concept it drives has a
// file of its own (docs/architecture.md): setup.h, sample_order.h,
// batch_layout.h, links.h, stage_transfers.h, parameter_update.h (with
// shared_parameters.h), step_report.h, watchdog.h, gpu_comms.h.
namespace rannc::train {
namespace {

/// Rank 0's start-up line: layout, schedule, steps and the memory techniques.
std::string startupLine(const proto::Plan &plan, int world, int64_t steps, int64_t K, const TrainOptions &opts,
                        const std::string &precision, const std::vector<int> &tensor_parallel) {
  std::string recomputing, sharding, tp;
  for (const auto &st : plan.stages()) {
    if (st.recompute()) recomputing += (recomputing.empty() ? "" : ",") + std::to_string(st.id());
    if (st.zero() > 0) sharding += (sharding.empty() ? "" : ",") + std::to_string(st.id());
    if (const int t = tensor_parallel[size_t(st.id())]; t > 1)
      tp += (tp.empty() ? "" : ",") + std::to_string(st.id()) + " (x" + std::to_string(t) + ")";
  }
  std::ostringstream os;
  os << "rannc-exec: " << world << " rank(s), " << plan.stages_size() << " stage(s), batch "
     << plan.global_batch_size() << " in " << plan.microbatches() << " micro-batch(es), "
     << pipeline::scheduleName(*plan::scheduleFromProto(plan.schedule())) /* prepare() refused none */ << ", " << steps
     << " step(s)"
     << (K > 1 ? " of " + std::to_string(K) + " accumulated batches" : "") << ", " << optimizerName(opts.optimizer)
     << (recomputing.empty() ? "" : ", recomputing stage(s) " + recomputing)
     << (sharding.empty() ? "" : ", optimizer state sharded in stage(s) " + sharding)
     << (tp.empty() ? "" : ", tensor-parallel stage(s) " + tp) << ", precision " << precision
     << "\n";
  return os.str();
}

/// One stage a rank runs, with its own runner, replica group, parameter
/// update and transfers: one per rank, or under an interleaved plan one per
/// chunk (Note [interleaved 1F1B] in planner/pipeline/schedule.h).
struct Chunk {
  Setup *setup = nullptr; ///< the rank's Setup (the first chunk) or one of chunkSetup's
  std::unique_ptr<comm::Communicator> group;
  std::unique_ptr<runtime::StageRunner> runner;
  std::unique_ptr<ParameterUpdate> update;
  std::unique_ptr<StageTransfers> transfers;
  size_t last_backward = 0; ///< the action after which its gradients are final
};

} // namespace

Status train(const TrainOptions &opts, comm::Communicator &comm, std::ostream &log) {
  const int rank = comm.rank();
  // Count tensor memory from the start, so the logged peak covers weights,
  // gradients, optimizer state and activations (not LibTorch's own code).
  runtime::installCountingAllocator();
  // Start-up: all ranks agree whether it worked; the first failing rank speaks.
  auto setup = prepare(opts, comm);
  double failed = setup.ok() ? 0 : double(comm.size() - rank);
  comm.allReduce(&failed, 1, comm::ReduceOp::Max);
  if (failed > 0) {
    int first_failing = comm.size() - int(failed);
    return Error{rank == first_failing ? setup.error().message : ""};
  }
  Setup &s = *setup;
  torch::set_num_threads(1);
  const int num_stages = s.plan.stages_size();
  const int M = s.plan.microbatches();
  const int64_t B = s.plan.global_batch_size(), b = B / M;
  const auto &ranks_of = s.stage_ranks;
  // Sample ranges of every stage's replicas within a micro-batch.
  std::vector<std::vector<schedule::SampleRange>> shards;
  for (const auto &r : ranks_of) shards.push_back(schedule::splitSamples(b, int(r.size())));
  const schedule::SampleRange mine = shards[s.stage][s.replica];
  // Note [interleaved 1F1B]: the rank's stages (chunks) v pipeline ranks apart;
  // the Setup of the first is `s`, the others' are made here (all agree it worked).
  const int v = plan::virtualStages(s.plan), ranks = plan::pipelineRanks(s.plan);
  std::deque<Setup> more;
  Status chunks_ok = Status::success();
  for (int c = 1; c < v && chunks_ok.ok(); ++c) {
    auto other = chunkSetup(opts, s, s.stage + c * ranks);
    if (other) more.push_back(std::move(*other));
    else chunks_ok = Error{other.error().message};
  }
  failed = chunks_ok.ok() ? 0 : double(comm.size() - rank);
  comm.allReduce(&failed, 1, comm::ReduceOp::Max);
  if (failed > 0) return Error{rank == comm.size() - int(failed) ? chunks_ok.message() : ""};
  std::vector<Chunk> chunks(static_cast<size_t>(v));
  chunks[0].setup = &s;
  for (int c = 1; c < v; ++c) chunks[size_t(c)].setup = &more[size_t(c - 1)];
  GpuComms gpu(comm, s, opts.host_staged, opts.rehearsal); // collective
  // Note [tensor parallel ranks]: the replicas of this rank's shard, and
  // (only in a job with tensor parallelism: every rank splits alike) its group.
  for (Chunk &ch : chunks) // every rank has v chunks: the splits pair up
    ch.group = gpu.onDevice(comm.split(ch.setup->stage * comm.size() + s.tp.position, rank));
  std::unique_ptr<comm::Communicator> tp_group;
  if (*std::max_element(s.tensor_parallel.begin(), s.tensor_parallel.end()) > 1)
    tp_group = gpu.onDevice(comm.split(s.stage * comm.size() + s.tp.replica, rank));

  for (Chunk &ch : chunks) {
    Setup &cs = *ch.setup;
    ch.runner = std::make_unique<runtime::StageRunner>(cs.graph, schedule::buildStageProgram(cs.graph, cs.ranges, cs.stage),
                                                       std::move(cs.params), std::move(cs.constants),
                                                       std::move(cs.buffers));
    ch.runner->setDevice(cs.device);
    ch.runner->setRecompute(cs.plan.stages(cs.stage).recompute()); // Note [recomputation]
  }
  runtime::StageRunner &runner = *chunks[0].runner;
  // Note [tensor parallel collectives]; a rank's chunks share its group (chunkSetup).
  if (s.tp.degree > 1)
    for (Chunk &ch : chunks) ch.runner->setTensorParallel(tp_group.get());
  // Note [batch statistics]: exact plans sum BatchNorm's statistics over the
  // replicas, on a communicator of their own (the gradient buckets' run beside them).
  std::unique_ptr<comm::Communicator> stats_group;
  if (s.plan.batchnorm() == "exact") stats_group = gpu.onDevice(comm.split(s.stage * comm.size() + s.tp.position, rank));
  runtime::BatchStatisticsScope stats_scope(stats_group.get()); // Note [batch statistics scope]
  const cost::Precision precision = cost::planPrecision(s.plan).value(); // structuralProblems refused others
  // Mixed precision: forward under autocast; values cross stages in the
  // dtype autocast gave them (their header carries it), and their gradients
  // come back in it (Note [autocast dtypes] in planner/cost/precision.cpp).
  // fp16 only (Note [loss scaling]): one scaler, the first chunk's update's,
  // for all of a rank's chunks (Note [one step over a rank's chunks]).
  std::optional<LossScaler> scaler;
  if (precision == cost::Precision::FP16) scaler.emplace(LossScaler::Options{opts.loss_scale.value_or(65536.0)});
  const auto kind = *plan::scheduleFromProto(s.plan.schedule()); // prepare() refused a plan naming none
  std::vector<ParameterUpdate *> updates;
  for (Chunk &ch : chunks) {
    if (precision != cost::Precision::FP32) ch.runner->setAutocast(runtime::scalarTypeFor(precision));
    ch.update = std::make_unique<ParameterUpdate>(
        opts, comm, *ch.group, *ch.setup, *ch.runner, updates.empty() ? std::move(scaler) : std::optional<LossScaler>(),
        [&gpu](std::unique_ptr<comm::Communicator> c) { return gpu.onDevice(std::move(c)); });
    updates.push_back(ch.update.get());
    // Note [split backward]: B and W apart; prepare() refused what cannot split.
    ch.runner->setSplitBackward(pipeline::splitsBackward(kind));
  }
  ParameterUpdate &update = *chunks[0].update;
  // Whether one of the rank's stages computes the loss, and which.
  size_t loss_chunk = 0;
  for (size_t c = 0; c < chunks.size(); ++c)
    if (chunks[c].runner->program().computes_loss) loss_chunk = c;
  const bool computes_loss = chunks[loss_chunk].runner->program().computes_loss;
  // Gradient accumulation: K global batches (K*M micro-batches) per optimizer
  // step, each batch's loss weighted 1/K (docs/training.md).
  const int64_t K = opts.accumulation_steps;
  const int64_t steps = opts.epochs > 0 ? stepsForEpochs(opts.epochs, s.samples, K * B) : opts.steps;
  // Interleaved: this rank's passes over its chunks, each naming its stage (schedule::buildRank).
  auto actions = schedule::accumulate(
      v > 1 ? schedule::buildRank(kind, s.stage, ranks, v, M) : schedule::build(kind, s.stage, num_stages, M), int(K), M);
  if (v > 1 || kind == pipeline::Schedule::ZBH2) { // Note [awaited gradient sends]: on every rank's list alike
    std::vector<std::vector<schedule::Action>> lists;
    for (int r = 0; r < ranks; ++r)
      lists.push_back(schedule::accumulate(schedule::buildRank(kind, r, ranks, v, M), int(K), M));
    std::vector<std::vector<int>> producers(static_cast<size_t>(num_stages));
    for (int t = 0; t < num_stages; ++t)
      for (const schedule::Transfer &in : schedule::buildStageProgram(s.graph, s.ranges, t).recvs)
        if (producers[t].empty() || producers[t].back() != in.peer_stage) producers[t].push_back(in.peer_stage);
    auto awaiting = schedule::awaitingGradients(lists, s.stage, producers);
    if (!awaiting) return awaiting.error();
    actions = std::move(*awaiting);
  }
  auto chunkOf = [&](const schedule::Action &a) { return a.stage < 0 ? size_t(0) : size_t(a.stage / ranks); };
  // The replica all-reduce overlaps the step's last pass that makes weight
  // gradients: the last backward, or a split one's last W (Note [gradient buckets]).
  const auto weights_kind =
      runner.splitsBackward() ? schedule::ActionKind::BackwardWeight : schedule::ActionKind::Backward;
  for (size_t i = 0; i < actions.size(); ++i)
    if (actions[i].kind == weights_kind) chunks[chunkOf(actions[i])].last_backward = i;
  // Checkpoints (executor/train/checkpoint.h): --resume loads the newest one here.
  std::map<std::string, int> axes; // Note [tensor parallel ranks]: checkpoints hold whole tensors
  for (const Chunk &ch : chunks)
    for (const auto &[v, axis] : ch.setup->param_axes) axes[ch.setup->graph.values[v].name] = axis;
  Checkpointer checkpoints({opts, comm, s.plan, s.graph, runner, s.stage, s.replica, update.optimizer(),
                            update.factory(), s.samples, K * B, update.lossScaler(),
                            s.tp.degree > 1 ? tp_group.get() : nullptr, s.tp, std::move(axes)});
  for (size_t c = 1; c < chunks.size(); ++c) // Note [interleaved checkpoints]
    checkpoints.addStage(*chunks[c].runner, chunks[c].setup->graph, chunks[c].update->optimizer());
  auto first_step = checkpoints.start(log);
  if (!first_step) return first_step.error();
  for (Chunk &ch : chunks) ch.update->afterLoad();
  SampleOrder order(std::max<int64_t>(s.samples, 1), opts.shuffle == Shuffle::On, opts.seed);
  StepReporter reporter({opts, comm, ranks_of, K * B, tokensPerSample(s.graph), computes_loss, *first_step,
                         steps, s.gpu()},
                        log);
  std::unique_ptr<Transport> transport = gpu.transport();
  for (Chunk &ch : chunks)
    ch.transfers = std::make_unique<StageTransfers>(*transport, *ch.setup, ch.runner->program(), shards,
                                                    s.tp.degree > 1 ? tp_group.get() : nullptr);
  Watchdog watchdog(opts.timeout_s, comm);
  TimelineRecorder timeline(opts.trace, comm, s.stage, s.gpu()); // --trace (Note [measured timeline])
  // Data inputs `ins` of samples [first, first + count) of the stream, as forward reads them.
  auto feedSamples = [&](const std::vector<ir::ValueId> &ins, int64_t first, int64_t count,
                         const torch::Device &device) {
    runtime::ValueMap feeds;
    for (ir::ValueId in : ins)
      feeds[in] = opts.synthetic
                      ? runtime::syntheticInput(s.graph.values[in], count, opts.seed * 1000003 + uint64_t(first))
                            .to(device)
                      : gatherSamples(s.data.at(in), order, first, count, device);
    return feeds;
  };
  // Each micro-batch's share of the loss (Note [loss denominators]).
  LossShares shares(s.graph, shards[s.stage], s.replica, b, M);

  if (Status st = reporter.open(); !st) return st; // resumed: the log was trimmed, then appended to
  if (rank == 0)
    log << startupLine(s.plan, comm.size(), steps, K, opts, cost::precisionName(precision), s.tensor_parallel)
        << (shares.denominator() ? "rannc-exec: the loss is a mean over " + shares.denominator()->what +
                                       ": each micro-batch weighs its share of the batch's count\n"
                                 : "")
        << scatterGatherLine(s) << gpu.describe();

  for (int64_t step = *first_step; step < steps; ++step) {
    auto t0 = std::chrono::steady_clock::now();
    timeline.beginStep(step, t0);
    StepRecord rec;
    rec.step = step;
    for (Chunk &ch : chunks) ch.runner->newStep(); // autocast's weight copies are of the previous step's weights
    rec.batch_losses.assign(size_t(K), 0.0); // each global batch's loss; their mean is the step's
    rec.lr = opts.lr * lrFactor(opts, step, steps);
    // Per (chunk, micro-batch): the gradients received, in its prog.sends
    // order, and the values received, RecvActivations -> Forward.
    std::map<std::pair<size_t, int>, std::vector<torch::Tensor>> send_grads;
    std::map<std::pair<size_t, int>, std::unordered_map<ir::ValueId, torch::Tensor>> received;
    // The loss of each micro-batch, read once the step is done: reading it
    // at once would make the host wait for the device every micro-batch.
    std::vector<torch::Tensor> losses;
    std::vector<int> loss_mbs; // the micro-batch of each
    if (computes_loss) // the data's loss denominators of the step (Note [loss denominators])
      shares.newStep(checkpoints.samplesBefore(step), int(K) * M, [&](int64_t first, int64_t count) {
        return feedSamples(s.graph.inputs, first, count, torch::kCPU);
      });
    for (size_t ai = 0; ai < actions.size(); ++ai) {
      const schedule::Action &a = actions[ai];
      const int mb = a.microbatch;
      const size_t ci = chunkOf(a);
      Chunk &ch = chunks[ci];
      runtime::StageRunner &runner = *ch.runner;
      const schedule::StageProgram &prog = runner.program();
      StageTransfers &transfers = *ch.transfers;
      const std::pair<size_t, int> at{ci, mb};
      auto a0 = std::chrono::steady_clock::now();
      for (Chunk &other : chunks)
        if (ai == other.last_backward) other.update->armBuckets();
      watchdog.progress("at step " + std::to_string(step) + ", stage " + std::to_string(ch.setup->stage) + ": " +
                        schedule::toString(a));
      switch (a.kind) {
      case schedule::ActionKind::RecvActivations:
        received[at] = transfers.recvActivations(mb);
        break;
      case schedule::ActionKind::Forward: {
        std::unordered_map<ir::ValueId, torch::Tensor> feeds = std::move(received[at]);
        received.erase(at);
        const int64_t first = checkpoints.samplesBefore(step) + int64_t(mb) * b + mine.begin;
        for (auto &[in, t] : feedSamples(prog.data_inputs, first, mine.size(), s.device)) feeds[in] = std::move(t);
        runner.forward(mb, std::move(feeds));
        if (prog.computes_loss && s.tp.leader()) { // a group's loss counts once
          losses.push_back(runner.loss(mb).detach());
          loss_mbs.push_back(mb);
        }
        break;
      }
      case schedule::ActionKind::SendActivations:
        transfers.sendActivations(runner, mb);
        if (runner.recomputes()) runner.dropSent(mb); // backward recomputes them (Note [recomputation])
        break;
      case schedule::ActionKind::RecvGradients:
        send_grads[at] = transfers.recvGradients(mb);
        break;
      case schedule::ActionKind::Backward:
        // Note [send buffers]: every transfer this stage started is over
        // before a backward, whose peak the plan counts without them. This
        // hardly waits: the stage after receives our newest activations
        // right after sending the gradients we have just received, and the
        // stage before posts the receive of our last gradients right after
        // sending activations we have received since (1F1B), or waits in it
        // already (GPipe's backward phase, the drain). Not under an
        // interleaved plan: a rank's sends may go to its own later chunk
        // (stage 1 -> 3 on rank 1 of 2), whose receive comes after this
        // backward, or to a rank that receives them only after its next
        // backward; nor under ZB-H2, whose warm-up sends forwards the next
        // stage takes in only after its first backwards (Note [zero bubble
        // H2]): waiting would deadlock (the step's end waits for them).
        // Both wait for the gradients their lists say (AwaitGradients, Note
        // [awaited gradient sends] in planner/pipeline/gradient_waits.h):
        // under ZB-H2 all of them (Note [zero bubble H2]).
        if (pipeline::waitsForSendsBeforeBackward(kind, v)) transport->waitSends();
        if (prog.computes_loss) {
          const auto [part, whole] = shares.share(mb);
          runner.backward(mb, std::move(send_grads[at]), part / (whole * double(K)) * update.lossScale());
        } else {
          runner.backward(mb, std::move(send_grads[at]), 0.0); // no loss here to weigh
        }
        send_grads.erase(at);
        if (prog.recvs.empty()) runner.release(mb);
        break;
      case schedule::ActionKind::SendGradients:
        transfers.sendGradients(runner, mb);
        runner.release(mb);
        break;
      case schedule::ActionKind::BackwardWeight:
        runner.backwardWeights(mb);
        break;
      case schedule::ActionKind::AwaitGradients:
        transfers.awaitGradientSends(mb);
        break;
      case schedule::ActionKind::AllReduce:
        for (Chunk &c : chunks) c.update->reduce();
        break;
      case schedule::ActionKind::OptimizerStep:
        if (Status st = ParameterUpdate::step(updates, rec, log); !st) return st; // Note [one step over a rank's chunks]
        break;
      }
      rec.phase_s[phaseOf(a.kind)] += secondsSince(a0);
      timeline.action(a, a0);
    }
    transport->waitSends();
    runtime::synchronizeGpu(s.gpu()); // the step's time is the device's
    if (!losses.empty()) {
      const torch::Tensor host = torch::stack(losses).to(torch::kCPU, torch::kDouble); // one copy off the device
      const double *value = host.data_ptr<double>();
      for (size_t i = 0; i < losses.size(); ++i) {
        const auto [part, whole] = shares.share(loss_mbs[i]);
        const double weighted = part == 0 ? 0.0 : value[i] * part / whole; // 0/0 where nothing counted
        rec.batch_losses[size_t(loss_mbs[i] / M)] += weighted;
        rec.loss_sum += weighted / double(K);
      }
    }
    rec.step_time_s = secondsSince(t0);
    timeline.endStep();
    if (Status st = reporter.report(std::move(rec), update.buckets()); !st) return st;
    const int stop = stopRequested(comm); // Note [graceful stop]
    if (checkpoints.due(step + 1, steps) || (stop && !opts.checkpoint_dir.empty())) {
      watchdog.progress("writing the checkpoint of step " + std::to_string(step + 1));
      for (Chunk &ch : chunks) ch.update->beforeSave(); // the state per parameter
      checkpoints.save(step + 1, log);
      for (Chunk &ch : chunks) ch.update->afterSave();
    }
    if (stop)
      return Error{rank != 0 ? "" : "stopped by signal " + std::to_string(stop) + " after step " + std::to_string(step + 1) +
                                        (opts.checkpoint_dir.empty() ? " (no --checkpoint-dir: nothing saved)"
                                                                     : " (checkpoint written; --resume continues)")};
  }
  if (Status st = checkpoints.exportTrained(log); !st) return st;
  if (Status st = timeline.write(log); !st) return st;
  reporter.summary();
  comm.barrier();
  return Status::success();
}

} // namespace rannc::train
