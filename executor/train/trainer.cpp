#include "executor/train/trainer.h"

#include <algorithm>
#include <chrono>
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
  GpuComms gpu(comm, s, opts.host_staged, opts.rehearsal); // collective
  // Note [tensor parallel ranks]: the replicas of this rank's shard, and
  // (only in a job with tensor parallelism: every rank splits alike) its group.
  auto group = gpu.onDevice(comm.split(s.stage * comm.size() + s.tp.position, rank));
  std::unique_ptr<comm::Communicator> tp_group;
  if (*std::max_element(s.tensor_parallel.begin(), s.tensor_parallel.end()) > 1)
    tp_group = gpu.onDevice(comm.split(s.stage * comm.size() + s.tp.replica, rank));

  runtime::StageRunner runner(s.graph, schedule::buildStageProgram(s.graph, s.ranges, s.stage), std::move(s.params),
                              std::move(s.constants), std::move(s.buffers));
  runner.setDevice(s.device);
  runner.setRecompute(s.plan.stages(s.stage).recompute()); // Note [recomputation]
  if (s.tp.degree > 1) runner.setTensorParallel(tp_group.get()); // Note [tensor parallel collectives]
  // Note [batch statistics]: exact plans sum BatchNorm's statistics over the
  // replicas, on a communicator of their own (the gradient buckets' run beside them).
  std::unique_ptr<comm::Communicator> stats_group;
  if (s.plan.batchnorm() == "exact") stats_group = gpu.onDevice(comm.split(s.stage * comm.size() + s.tp.position, rank));
  runtime::BatchStatisticsScope stats_scope(stats_group.get()); // Note [batch statistics scope]
  const cost::Precision precision = cost::planPrecision(s.plan).value(); // structuralProblems refused others
  // Mixed precision: forward under autocast; values cross stages in the
  // dtype autocast gave them (their header carries it), and their gradients
  // come back in it (Note [autocast dtypes] in planner/cost/precision.cpp).
  if (precision != cost::Precision::FP32) runner.setAutocast(runtime::scalarTypeFor(precision));
  std::optional<LossScaler> scaler; // fp16 only (Note [loss scaling])
  if (precision == cost::Precision::FP16) scaler.emplace(LossScaler::Options{opts.loss_scale.value_or(65536.0)});
  ParameterUpdate update(opts, comm, *group, s, runner, std::move(scaler),
                         [&gpu](std::unique_ptr<comm::Communicator> c) { return gpu.onDevice(std::move(c)); });
  const auto &prog = runner.program();
  const auto kind = *plan::scheduleFromProto(s.plan.schedule()); // prepare() refused a plan naming none
  // Gradient accumulation: K global batches (K*M micro-batches) per optimizer
  // step, each batch's loss weighted 1/K (docs/training.md).
  const int64_t K = opts.accumulation_steps;
  const int64_t steps = opts.epochs > 0 ? stepsForEpochs(opts.epochs, s.samples, K * B) : opts.steps;
  auto actions = schedule::accumulate(schedule::build(kind, s.stage, num_stages, M), int(K), M);
  // Note [split backward]: B and W apart; prepare() refused what cannot split.
  runner.setSplitBackward(pipeline::splitsBackward(kind));
  // The replica all-reduce overlaps the step's last pass that makes weight
  // gradients: the last backward, or a split one's last W (Note [gradient buckets]).
  const auto weights_kind =
      runner.splitsBackward() ? schedule::ActionKind::BackwardWeight : schedule::ActionKind::Backward;
  size_t last_backward = 0;
  for (size_t i = 0; i < actions.size(); ++i)
    if (actions[i].kind == weights_kind) last_backward = i;
  // Checkpoints (executor/train/checkpoint.h): --resume loads the newest one here.
  std::map<std::string, int> axes; // Note [tensor parallel ranks]: checkpoints hold whole tensors
  for (const auto &[v, axis] : s.param_axes) axes[s.graph.values[v].name] = axis;
  Checkpointer checkpoints({opts, comm, s.plan, s.graph, runner, s.stage, s.replica, update.optimizer(),
                            update.factory(), s.samples, K * B, update.lossScaler(),
                            s.tp.degree > 1 ? tp_group.get() : nullptr, s.tp, std::move(axes)});
  auto first_step = checkpoints.start(log);
  if (!first_step) return first_step.error();
  update.afterLoad();
  SampleOrder order(std::max<int64_t>(s.samples, 1), opts.shuffle == Shuffle::On, opts.seed);
  StepReporter reporter({opts, comm, ranks_of, K * B, tokensPerSample(s.graph), prog.computes_loss, *first_step,
                         steps, s.gpu()},
                        log);
  std::unique_ptr<Transport> transport = gpu.transport();
  StageTransfers transfers(*transport, s, prog, shards, s.tp.degree > 1 ? tp_group.get() : nullptr);
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
    runner.newStep(); // autocast's weight copies are of the previous step's weights
    rec.batch_losses.assign(size_t(K), 0.0); // each global batch's loss; their mean is the step's
    rec.lr = opts.lr * lrFactor(opts, step, steps);
    std::map<int, std::vector<torch::Tensor>> send_grads; // per micro-batch, in prog.sends order
    std::map<int, std::unordered_map<ir::ValueId, torch::Tensor>> received; // RecvActivations -> Forward
    // The loss of each micro-batch, read once the step is done: reading it
    // at once would make the host wait for the device every micro-batch.
    std::vector<torch::Tensor> losses;
    std::vector<int> loss_mbs; // the micro-batch of each
    if (prog.computes_loss) // the data's loss denominators of the step (Note [loss denominators])
      shares.newStep(checkpoints.samplesBefore(step), int(K) * M, [&](int64_t first, int64_t count) {
        return feedSamples(s.graph.inputs, first, count, torch::kCPU);
      });
    for (size_t ai = 0; ai < actions.size(); ++ai) {
      const schedule::Action &a = actions[ai];
      const int mb = a.microbatch;
      auto a0 = std::chrono::steady_clock::now();
      if (ai == last_backward) update.armBuckets();
      watchdog.progress("at step " + std::to_string(step) + ", stage " + std::to_string(s.stage) + ": " +
                        schedule::toString(a));
      switch (a.kind) {
      case schedule::ActionKind::RecvActivations:
        received[mb] = transfers.recvActivations(mb);
        break;
      case schedule::ActionKind::Forward: {
        std::unordered_map<ir::ValueId, torch::Tensor> feeds = std::move(received[mb]);
        received.erase(mb);
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
        send_grads[mb] = transfers.recvGradients(mb);
        break;
      case schedule::ActionKind::Backward:
        // Note [send buffers]: every transfer this stage started is over
        // before a backward, whose peak the plan counts without them. This
        // hardly waits: the stage after receives our newest activations
        // right after sending the gradients we have just received, and the
        // stage before posts the receive of our last gradients right after
        // sending activations we have received since (1F1B), or waits in it
        // already (GPipe's backward phase, the drain).
        transport->waitSends();
        if (prog.computes_loss) {
          const auto [part, whole] = shares.share(mb);
          runner.backward(mb, std::move(send_grads[mb]), part / (whole * double(K)) * update.lossScale());
        } else {
          runner.backward(mb, std::move(send_grads[mb]), 0.0); // no loss here to weigh
        }
        send_grads.erase(mb);
        if (prog.recvs.empty()) runner.release(mb);
        break;
      case schedule::ActionKind::SendGradients:
        transfers.sendGradients(runner, mb);
        runner.release(mb);
        break;
      case schedule::ActionKind::BackwardWeight:
        runner.backwardWeights(mb);
        break;
      case schedule::ActionKind::AllReduce:
        update.reduce();
        break;
      case schedule::ActionKind::OptimizerStep:
        if (Status st = update.step(rec, log); !st) return st;
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
      update.beforeSave(); // the state per parameter
      checkpoints.save(step + 1, log);
      update.afterSave();
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
