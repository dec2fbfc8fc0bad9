#include "executor/train/setup.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "executor/runtime/device.h"
#include "executor/runtime/ops.h"
#include "executor/runtime/weights.h"
#include "executor/schedule/schedule.h"
#include "executor/train/optim.h"
#include "planner/cost/precision.h"
#include "planner/plan/model_ref.h"
#include "planner/support/files.h"
#include "planner/ir/op_set.h"
#include "planner/plan/plan.h"
#include "planner/plan/sharding_record.h"
#include "planner/sharding/sharding.h"

namespace rannc::train {

Status checkDataShape(const ir::Graph &g, ir::ValueId id, const data::NpyArray &a, const std::string &path) {
  const ir::Value &v = g.values[id];
  if (a.dtype() != v.dtype)
    return Error{path + ": dtype " + std::string(ir::dtypeName(a.dtype())) + " does not match graph input '" + v.name +
                 "' (" + std::string(ir::dtypeName(v.dtype)) + ")"};
  if (!v.shape_known) return Status::success();
  if (a.shape().size() != v.shape.size())
    return Error{path + ": shape has " + std::to_string(a.shape().size()) + " dimensions, graph input '" + v.name +
                 "' " + ir::shapeString(v.shape) + " has " + std::to_string(v.shape.size())};
  for (size_t i = 1; i < v.shape.size(); ++i)
    if (v.shape[i].isFixed() && v.shape[i].offset != a.shape()[i])
      return Error{path + ": dimension " + std::to_string(i) + " is " + std::to_string(a.shape()[i]) +
                   ", graph input '" + v.name + "' " + ir::shapeString(v.shape) + " needs " +
                   std::to_string(v.shape[i].offset)};
  return Status::success();
}

Expected<std::string> trainModelPath(const TrainOptions &opts, const proto::Plan &plan) {
  if (!opts.model.empty()) return opts.model;
  auto path = plan::resolveRecordedModelPath(plan.model().path(), opts.plan, opts.allow_model_outside_plan);
  if (!path) return Error{opts.plan + ": " + path.error().message};
  return path;
}

namespace {

/// Replaces s.graph with the local graph of this rank's stage (the sharding
/// the plan records, else the analysis of its graph: Note [tensor parallel
/// sharding]), s.ranges with the stages' ranges in it, and fills s.param_axes.
Status localizeStage(Setup &s) {
  auto analysis = plan::hasSharding(s.plan.graph()) ? plan::shardingFromProto(s.plan.graph(), s.graph)
                                                    : sharding::analyze(s.graph);
  if (!analysis) return Error{analysis.error().message};
  auto local = sharding::localGraph(s.graph, *analysis, s.tp.degree);
  if (!local) return Error{local.error().message};
  std::vector<std::pair<int, int>> ranges;
  try {
    ranges = localRanges(s.graph, *local, s.ranges);
  } catch (const std::exception &e) {
    return Error{firstLine(e.what())};
  }
  // Note [tensor parallel ranks]: a collective runs in the stage of its
  // readers (a copy's backward must see every device's part of its gradient).
  const auto readers = local->users();
  for (int st = 0; st < int(ranges.size()); ++st)
    for (int n = ranges[size_t(st)].first; n < ranges[size_t(st)].second; ++n) {
      if (!ir::isRannc(local->nodes[size_t(n)])) continue;
      for (ir::ValueId out : local->nodes[size_t(n)].outputs)
        for (ir::NodeId r : out == ir::kNoValue ? std::vector<ir::NodeId>{} : readers[size_t(out)])
          if (r < ranges[size_t(st)].first || r >= ranges[size_t(st)].second)
            return Error{"collective '" + local->nodes[size_t(n)].name + "' of stage " + std::to_string(st) +
                         " has a reader in another stage; move the stage boundary"};
    }
  // Values crossing into or out of the stage are whole on every device of
  // the group (Note [tensor parallel ranks]): a cut or partial one cannot cross.
  const schedule::StageProgram program = schedule::buildStageProgram(*local, ranges, s.stage);
  std::vector<ir::ValueId> crossing;
  for (const auto &r : program.recvs) crossing.push_back(r.value);
  for (const auto &snd : program.sends) crossing.push_back(snd.value);
  for (ir::ValueId v : crossing)
    if (size_t(v) < analysis->values.size() && !analysis->values[size_t(v)].replicated())
      return Error{"value '" + s.graph.values[size_t(v)].name + "' crosses the boundary of tensor-parallel stage " +
                   std::to_string(s.stage) + " cut or as a partial sum; move the stage boundary"};
  for (ir::ValueId p : s.graph.parameters)
    if (analysis->values[size_t(p)].axis >= 0) s.param_axes[p] = analysis->values[size_t(p)].axis;
  s.graph = std::move(*local);
  s.ranges = std::move(ranges);
  return Status::success();
}

/// Whether writeFileAtomic can write `path` after training: not a folder, and
/// its folder takes a new file (the temporary one it makes, made and removed).
Status canWriteLater(const std::string &path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) return Error{path + ": is a folder, not a file"};
  const std::string probe = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(probe, std::ios::binary | std::ios::trunc);
    if (!out) return Error{path + ": cannot write there: " + std::strerror(errno)};
  }
  std::remove(probe.c_str());
  return Status::success();
}

/// Loads stage s.stage's parameters, buffers and constants into `s`: whole
/// (by name, from the model's graph `whole`; a weightless model's made up
/// with --init-weights), then this rank's slices, on its device.
Status loadWeights(Setup &s, const ir::Graph &whole, const std::string &model, const TrainOptions &opts) {
  auto program = schedule::buildStageProgram(s.graph, s.ranges, s.stage);
  auto weights = runtime::loadStageWeights(whole, program, model, opts.init_weights);
  if (!weights) return weights.error();
  s.params = std::move(weights->params);
  shardParameters(s.params, s.param_axes, s.tp);
  s.buffers = std::move(weights->buffers);
  for (ir::ValueId c : program.constants) s.constants[c] = runtime::toTorch(s.graph.constant_data.at(c));
  if (s.device.is_cuda()) {
    for (auto &[id, p] : s.params) p = p.detach().to(s.device).set_requires_grad(true);
    for (auto *m : {&s.buffers, &s.constants})
      for (auto &[id, t] : *m) t = t.to(s.device);
  }
  return Status::success();
}

/// Note [interleaved 1F1B]: what a rank running several stages does not do
/// yet is refused here, never run differently. Each chunk keeps its own
/// replica all-reduce and optimizer; what needs one view of the rank's whole
/// gradient (clipping, a skipped step, fp16's loss scale) is decided once
/// over all chunks (Note [one step over a rank's chunks]); its checkpoints
/// hold all its chunks (Note [interleaved checkpoints]). Not yet: one
/// batch-statistics group.
Status interleavedRefusals(const proto::Plan &plan) {
  if (plan::virtualStages(plan) <= 1) return Status::success();
  const std::string what = "virtual_stages " + std::to_string(plan::virtualStages(plan)) + " (interleaved-1f1b)";
  if (plan.batchnorm() == "exact") return Error{what + " does not yet train with --batchnorm exact"};
  return Status::success();
}

} // namespace

Expected<Setup> prepare(const TrainOptions &opts, const comm::Communicator &comm) {
  Setup s;
  if (Status st = checkOptimizationOptions(opts); !st) return Error{st.message()};
  // The trace is written after the last step: a folder it cannot go to must
  // stop the run before training, not after it. Rank 0 writes it.
  if (comm.rank() == 0 && !opts.trace.empty())
    if (Status st = canWriteLater(opts.trace); !st) return Error{"--trace " + st.message()};
  auto plan = plan::readPlan(opts.plan);
  if (!plan) return plan.error();
  s.plan = std::move(*plan);
  auto problems = plan::structuralProblems(s.plan);
  if (!problems.empty()) {
    std::string msg = opts.plan + ": invalid plan:";
    for (const auto &p : problems) msg += "\n  " + p;
    return Error{msg};
  }
  if (Status st = interleavedRefusals(s.plan); !st) return Error{opts.plan + ": " + st.message()};
  const bool cuda = opts.device ? *opts.device == cluster::DeviceKind::Cuda : s.plan.cluster().device().type() == "cuda";
  if (cuda) {
    const std::string what = opts.device ? "--device cuda"
                                         : "the plan is for CUDA devices (" + s.plan.cluster().device().name() + ")";
    if (const std::string why = runtime::gpuUnavailableReason(0); !why.empty())
      return Error{opts.plan + ": " + what + ", but " + why + "; pass --device cpu to run it on CPU"};
    const runtime::GpuChoice gpu =
        runtime::chooseGpu(comm.rank(), s.plan.cluster().devices_per_node(), runtime::visibleGpus());
    s.gpu_why = gpu.why;
    s.device = torch::Device(torch::kCUDA, c10::DeviceIndex(gpu.device));
    runtime::useGpu(gpu.device); // before anything is allocated there
  }
  const cost::Precision precision = cost::planPrecision(s.plan).value(); // structuralProblems refused others
  if (opts.loss_scale && precision != cost::Precision::FP16)
    return Error{"--loss-scale: only fp16 plans scale the loss (" + opts.plan + " is " + cost::precisionName(precision) +
                 ")"};
  const int world = plan::worldSize(s.plan);
  if (world != comm.size())
    return Error{opts.plan + ": the plan is for " + std::to_string(world) + " ranks, but this job has " +
                 std::to_string(comm.size()) + " (run mpirun -np " + std::to_string(world) + ")"};
  auto resolved = trainModelPath(opts, s.plan);
  if (!resolved) return resolved.error();
  const std::string model = *resolved;
  // One rank reads the whole model to check its identity (Note [model
  // identity]); the others only need the file to be there.
  if (comm.rank() == 0) {
    if (Status st = plan::verifyModelFiles(model, s.plan.model()); !st) return Error{st.message()};
  } else if (!openInput(model)) {
    return Error{model + ": cannot open the model the plan names (pass --model PATH if it moved)"};
  }
  auto graph = plan::graphFromProto(s.plan.graph());
  if (!graph) return Error{opts.plan + ": " + graph.error().message};
  s.graph = std::move(*graph);
  for (const auto &st : s.plan.stages()) {
    s.ranges.emplace_back(st.op_begin(), st.op_end());
    const std::vector<int> ranks(st.ranks().begin(), st.ranks().end());
    const int degree = plan::tensorParallel(st);
    if (degree < 1 || ranks.size() % size_t(degree) != 0)
      return Error{opts.plan + ": stage " + std::to_string(st.id()) + " has " + std::to_string(ranks.size()) +
                   " rank(s), not a multiple of its tensor-parallel degree " + std::to_string(degree)};
    s.tensor_parallel.push_back(degree);
    s.stage_ranks.push_back(groupLeaders(ranks, degree)); // Note [tensor parallel ranks]
    // Interleaved: a rank's first chunk (Note [interleaved 1F1B]; chunkSetup makes the others).
    if (s.stage < 0 && std::find(ranks.begin(), ranks.end(), comm.rank()) != ranks.end()) {
      s.stage = st.id();
      s.tp = placeOf(ranks, degree, comm.rank());
      s.replica = s.tp.replica;
    }
  }
  // Note [interleaved 1F1B]: each chunk has its own parameter update, so no parameter shared between stages.
  for (int t = 0; plan::virtualStages(s.plan) > 1 && t < int(s.ranges.size()); ++t)
    if (const auto shared = schedule::buildStageProgram(s.graph, s.ranges, t).shared_parameters; !shared.empty())
      return Error{opts.plan + ": stage " + std::to_string(t) + " shares parameter '" +
                   s.graph.values[size_t(shared.front().first)].name +
                   "' with other stages (tied weights), which interleaved-1f1b does not train yet; re-plan with 1f1b"};
  // The model's graph, for the weights; a tensor-parallel stage runs its local graph.
  const ir::Graph whole = s.graph;
  if (s.tp.degree > 1)
    if (Status st = localizeStage(s); !st) return Error{opts.plan + ": " + st.message()};

  if (!opts.synthetic) {
    if (opts.data_dir.empty()) return Error{"no training data: pass --data DIR or --synthetic"};
    for (ir::ValueId in : s.graph.inputs) {
      std::string path = opts.data_dir + "/" + s.graph.values[in].name + ".npy";
      auto a = data::NpyArray::open(path);
      if (!a) return Error{a.error().message + " (graph input '" + s.graph.values[in].name + "')"};
      if (Status st = checkDataShape(s.graph, in, *a, path); !st) return Error{st.message()};
      if (s.samples != 0 && a->samples() != s.samples)
        return Error{path + ": has " + std::to_string(a->samples()) + " samples, other inputs have " +
                     std::to_string(s.samples)};
      s.samples = a->samples();
      s.data.emplace(in, std::move(*a));
    }
    // Fewer samples than one step reads would put a sample twice in the step
    // (the stream of epochs wraps around): a mistake unless asked for.
    const int64_t per_step = s.plan.global_batch_size() * opts.accumulation_steps;
    if (s.samples < per_step && !opts.wrap_data)
      return Error{opts.data_dir + ": holds " + std::to_string(s.samples) + " samples, fewer than the " +
                   std::to_string(per_step) + " one step reads (global batch " +
                   std::to_string(s.plan.global_batch_size()) + " x " + std::to_string(opts.accumulation_steps) +
                   " accumulated); pass --wrap-data to reuse samples within a step"};
  }

  if (Status st = loadWeights(s, whole, model, opts); !st) return Error{st.message()};
  return s;
}

Expected<Setup> chunkSetup(const TrainOptions &opts, const Setup &first, int stage) {
  Setup s;
  s.plan = first.plan;
  auto whole = plan::graphFromProto(s.plan.graph());
  if (!whole) return Error{opts.plan + ": " + whole.error().message};
  s.graph = *whole;
  s.stage = stage;
  for (const auto &st : s.plan.stages()) s.ranges.emplace_back(st.op_begin(), st.op_end());
  s.stage_ranks = first.stage_ranks;
  s.replica = first.replica;
  s.tensor_parallel = first.tensor_parallel;
  s.tp = first.tp;
  s.samples = first.samples;
  s.device = first.device;
  s.gpu_why = first.gpu_why;
  // Note [interleaved 1F1B]: a chunk runs on its rank's devices, listed alike
  // and with the first chunk's tensor-parallel degree (plan::check), so its
  // place in the group is the first chunk's; it runs its own stage of the
  // same local graph.
  if (s.tp.degree > 1)
    if (Status st = localizeStage(s); !st) return Error{opts.plan + ": " + st.message()};
  auto model = trainModelPath(opts, s.plan);
  if (!model) return model.error();
  if (Status st = loadWeights(s, *whole, *model, opts); !st) return Error{st.message()};
  return s;
}

} // namespace rannc::train
