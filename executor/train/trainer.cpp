#include "executor/train/trainer.h"

#include <sys/resource.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <numeric>
#include <random>

#include "executor/runtime/ops.h"
#include "executor/runtime/stage.h"
#include "executor/schedule/schedule.h"
#include "executor/train/npy.h"
#include "planner/import/onnx_import.h"
#include "planner/plan/plan.h"
#include "planner/support/sha256.h"

namespace rannc::train {
namespace {

/// Everything a rank needs before the first step.
struct Setup {
  proto::Plan plan;
  ir::Graph graph;
  int stage = -1;
  std::vector<std::pair<int, int>> ranges;
  std::vector<int> stage_rank; ///< the one rank of each stage
  std::map<ir::ValueId, NpyArray> data; ///< every data input (validated on every rank)
  int64_t samples = 0;
  std::map<ir::ValueId, torch::Tensor> params, constants;
};

int64_t peakRssBytes() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return int64_t(ru.ru_maxrss) * 1024; // Linux reports KiB
}

Status checkDataShape(const ir::Graph &g, ir::ValueId id, const NpyArray &a, const std::string &path) {
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

Expected<Setup> prepare(const TrainOptions &opts, const comm::Communicator &comm) {
  Setup s;
  auto plan = plan::readPlan(opts.plan);
  if (!plan) return plan.error();
  s.plan = std::move(*plan);
  auto problems = plan::structuralProblems(s.plan);
  if (!problems.empty()) {
    std::string msg = opts.plan + ": invalid plan:";
    for (const auto &p : problems) msg += "\n  " + p;
    return Error{msg};
  }
  const int world = plan::worldSize(s.plan);
  if (world != comm.size())
    return Error{opts.plan + ": the plan is for " + std::to_string(world) + " ranks, but this job has " +
                 std::to_string(comm.size()) + " (run mpirun -np " + std::to_string(world) + ")"};
  std::string model = opts.model.empty() ? s.plan.model().path() : opts.model;
  {
    std::ifstream in(model, std::ios::binary);
    if (!in) return Error{model + ": cannot open the model the plan names (pass --model PATH if it moved)"};
    if (sha256Hex(in) != s.plan.model().sha256())
      return Error{model + ": the model file changed since planning (SHA-256 differs from the plan's " +
                   s.plan.model().sha256().substr(0, 12) + "...); re-run rannc-plan"};
  }
  auto graph = plan::graphFromProto(s.plan.graph());
  if (!graph) return Error{opts.plan + ": " + graph.error().message};
  s.graph = std::move(*graph);
  for (const auto &st : s.plan.stages()) {
    s.ranges.emplace_back(st.op_begin(), st.op_end());
    s.stage_rank.push_back(st.ranks(0));
    if (st.ranks(0) == comm.rank()) s.stage = st.id();
  }

  if (!opts.synthetic) {
    if (opts.data_dir.empty()) return Error{"no training data: pass --data DIR or --synthetic"};
    for (ir::ValueId in : s.graph.inputs) {
      std::string path = opts.data_dir + "/" + s.graph.values[in].name + ".npy";
      auto a = NpyArray::open(path);
      if (!a) return Error{a.error().message + " (graph input '" + s.graph.values[in].name + "')"};
      if (Status st = checkDataShape(s.graph, in, *a, path); !st) return Error{st.message()};
      if (s.samples != 0 && a->samples() != s.samples)
        return Error{path + ": has " + std::to_string(a->samples()) + " samples, other inputs have " +
                     std::to_string(s.samples)};
      s.samples = a->samples();
      s.data.emplace(in, std::move(*a));
    }
  }

  auto program = schedule::buildStageProgram(s.graph, s.ranges, s.stage);
  std::vector<std::string> names;
  for (ir::ValueId p : program.parameters) names.push_back(s.graph.values[p].name);
  auto weights = import::loadModelWeights(model, names);
  if (!weights) return weights.error();
  for (ir::ValueId p : program.parameters)
    s.params[p] = runtime::toTorch(weights->at(s.graph.values[p].name)).set_requires_grad(true);
  for (ir::ValueId c : program.constants) s.constants[c] = runtime::toTorch(s.graph.constant_data.at(c));
  return s;
}

/// Sample order: identity, or a fresh permutation per epoch from the seed.
class SampleOrder {
public:
  SampleOrder(int64_t samples, bool shuffle, uint64_t seed) : n_(samples), shuffle_(shuffle), seed_(seed) {}
  int64_t at(int64_t position) {
    int64_t epoch = position / n_, offset = position % n_;
    if (!shuffle_) return offset;
    if (epoch != epoch_) {
      perm_.resize(n_);
      std::iota(perm_.begin(), perm_.end(), 0);
      std::mt19937_64 rng(seed_ + static_cast<uint64_t>(epoch));
      for (int64_t i = n_ - 1; i > 0; --i) std::swap(perm_[i], perm_[std::uniform_int_distribution<int64_t>(0, i)(rng)]);
      epoch_ = epoch;
    }
    return perm_[offset];
  }

private:
  int64_t n_;
  bool shuffle_;
  uint64_t seed_;
  int64_t epoch_ = -1;
  std::vector<int64_t> perm_;
};

torch::Tensor gatherSamples(const NpyArray &a, SampleOrder &order, int64_t first, int64_t count) {
  std::vector<int64_t> dims = a.shape();
  dims[0] = count;
  torch::Tensor t = torch::empty(dims, torch::TensorOptions().dtype(runtime::toScalarType(a.dtype())));
  char *dst = static_cast<char *>(t.data_ptr());
  for (int64_t i = 0; i < count; ++i)
    std::memcpy(dst + i * a.sampleBytes(), a.sample(order.at(first + i)), size_t(a.sampleBytes()));
  return t;
}

torch::Tensor syntheticInput(const ir::Value &v, int64_t count, uint64_t seed) {
  std::vector<int64_t> dims;
  for (const ir::Dim &d : v.shape) dims.push_back(d.known ? d.at(count) : 1);
  auto opts = torch::TensorOptions().dtype(runtime::toScalarType(v.dtype));
  if (!ir::isFloating(v.dtype)) return torch::zeros(dims, opts); // index 0 is valid for every lookup
  auto gen = at::detail::createCPUGenerator(seed);
  return torch::randn(dims, gen, opts);
}

std::unique_ptr<torch::optim::Optimizer> makeOptimizer(const TrainOptions &opts, std::vector<torch::Tensor> params) {
  if (opts.optimizer == "adam")
    return std::make_unique<torch::optim::Adam>(std::move(params), torch::optim::AdamOptions(opts.lr));
  return std::make_unique<torch::optim::SGD>(std::move(params), torch::optim::SGDOptions(opts.lr));
}

constexpr int kActTag = 0, kGradTag = 1;
int tagFor(int mb, int kind) { return 2 * mb + kind; }

} // namespace

Status train(const TrainOptions &opts, comm::Communicator &comm, std::ostream &log) {
  const int rank = comm.rank();
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
  runtime::StageRunner runner(s.graph, schedule::buildStageProgram(s.graph, s.ranges, s.stage), std::move(s.params),
                              std::move(s.constants));
  const auto &prog = runner.program();
  auto actions = schedule::gpipe(s.stage, num_stages, M);
  auto optimizer = makeOptimizer(opts, runner.parameters());
  SampleOrder order(std::max<int64_t>(s.samples, 1), opts.shuffle == "on", opts.seed);

  std::ofstream jsonl;
  if (rank == 0 && !opts.log.empty()) {
    jsonl.open(opts.log, std::ios::trunc);
    if (!jsonl) return Error{opts.log + ": cannot write the log"};
  }
  if (rank == 0)
    log << "rannc-exec: " << comm.size() << " rank(s), " << num_stages << " stage(s), batch " << B << " in " << M
        << " micro-batch(es), " << opts.steps << " step(s)\n";

  for (int64_t step = 0; step < opts.steps; ++step) {
    auto t0 = std::chrono::steady_clock::now();
    double loss_sum = 0;
    for (const auto &a : actions) {
      const int mb = a.microbatch;
      switch (a.kind) {
      case schedule::ActionKind::RecvActivations:
      case schedule::ActionKind::Forward: {
        if (a.kind == schedule::ActionKind::RecvActivations) break; // received together with the forward below
        std::unordered_map<ir::ValueId, torch::Tensor> feeds;
        for (const auto &r : prog.recvs)
          feeds[r.value] = runtime::unpackTensor(comm.recv(s.stage_rank[r.peer_stage], tagFor(mb, kActTag)));
        for (ir::ValueId in : prog.data_inputs) {
          int64_t first = step * B + int64_t(mb) * b;
          feeds[in] = opts.synthetic ? syntheticInput(s.graph.values[in], b, opts.seed * 1000003 + uint64_t(first))
                                     : gatherSamples(s.data.at(in), order, first, b);
        }
        runner.forward(mb, std::move(feeds));
        if (prog.computes_loss) loss_sum += runner.loss(mb).item<double>() * double(b) / double(B);
        break;
      }
      case schedule::ActionKind::SendActivations:
        for (const auto &snd : prog.sends)
          comm.send(std::make_shared<std::string>(runtime::packTensor(runner.value(mb, snd.value))),
                    s.stage_rank[snd.peer_stage], tagFor(mb, kActTag));
        break;
      case schedule::ActionKind::RecvGradients:
        break; // received together with the backward below
      case schedule::ActionKind::Backward: {
        std::vector<torch::Tensor> grads;
        for (const auto &snd : prog.sends) {
          torch::Tensor g = runtime::unpackTensor(comm.recv(s.stage_rank[snd.peer_stage], tagFor(mb, kGradTag)));
          grads.push_back(g.numel() == 0 && runner.value(mb, snd.value).numel() != 0 ? torch::Tensor() : g);
        }
        runner.backward(mb, grads, double(b) / double(B));
        break;
      }
      case schedule::ActionKind::SendGradients:
        for (const auto &r : prog.recvs) {
          torch::Tensor g = runner.inputGrad(mb, r.value);
          // Non-floating values carry no gradient: an empty tensor keeps the
          // message sequence of both sides identical.
          comm.send(std::make_shared<std::string>(runtime::packTensor(g.defined() ? g : torch::empty({0}))),
                    s.stage_rank[r.peer_stage], tagFor(mb, kGradTag));
        }
        runner.release(mb);
        break;
      case schedule::ActionKind::OptimizerStep:
        optimizer->step();
        optimizer->zero_grad();
        break;
      }
      if (a.kind == schedule::ActionKind::Backward && prog.recvs.empty()) runner.release(mb);
    }
    comm.waitSends();
    double step_time = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

    // Loss from the stage that computes it; memory per rank; slowest rank's time.
    std::vector<double> sums(1 + comm.size(), 0.0);
    sums[0] = prog.computes_loss ? loss_sum : 0.0;
    sums[1 + rank] = double(peakRssBytes());
    comm.allReduce(sums.data(), int(sums.size()), comm::ReduceOp::Sum);
    comm.allReduce(&step_time, 1, comm::ReduceOp::Max);
    const double loss = sums[0];
    if (!std::isfinite(loss))
      return Error{rank == 0 ? "non-finite loss (" + std::to_string(loss) + ") at step " + std::to_string(step) : ""};
    if (rank == 0) {
      std::vector<int64_t> mem(sums.begin() + 1, sums.end());
      nlohmann::ordered_json j;
      j["step"] = step;
      j["loss"] = loss;
      j["samples_per_s"] = double(B) / step_time;
      j["step_time_s"] = step_time;
      j["peak_memory_bytes"] = *std::max_element(mem.begin(), mem.end());
      j["peak_memory_bytes_per_rank"] = mem;
      j["lr"] = opts.lr;
      if (jsonl) jsonl << j.dump() << "\n" << std::flush;
      if (opts.progress)
        log << "step " << step + 1 << "/" << opts.steps << "  loss " << loss << "  " << double(B) / step_time
            << " samples/s\n";
    }
  }
  comm.barrier();
  return Status::success();
}

} // namespace rannc::train
