#include "executor/train/trainer.h"

#include <sys/resource.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <mutex>
#include <numeric>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "executor/comm/device_comm.h"
#include "executor/runtime/device.h"
#include "executor/runtime/grads.h"
#include "executor/runtime/memory.h"
#include "executor/runtime/ops.h"
#include "executor/runtime/stage.h"
#include "executor/runtime/weights.h"
#include "executor/schedule/schedule.h"
#include "executor/train/buckets.h"
#include "executor/train/checkpoint.h"
#include "executor/train/loss_scale.h"
#include "executor/data/npy.h"
#include "executor/train/optim.h"
#include "executor/train/transport.h"
#include "executor/train/zero.h"
#include "planner/import/onnx_import.h"
#include "planner/plan/plan.h"
#include "planner/plan/model_ref.h"

namespace rannc::train {
namespace {

using data::NpyArray; // the training data (executor/data)

/// Everything a rank needs before the first step.
struct Setup {
  proto::Plan plan;
  ir::Graph graph;
  int stage = -1;
  std::vector<std::pair<int, int>> ranges;
  std::vector<std::vector<int>> stage_ranks; ///< the ranks (replicas) of each stage, in replica order
  int replica = 0;                           ///< this rank's index among its stage's ranks
  std::map<ir::ValueId, NpyArray> data; ///< every data input (validated on every rank)
  int64_t samples = 0;
  std::map<ir::ValueId, torch::Tensor> params, constants, buffers;
  torch::Device device = torch::kCPU; ///< where the stage's tensors live
  std::string gpu_why;                ///< why that GPU (Note [choosing a GPU])
  /// The CUDA device index of `device` (-1: CPU).
  int gpu() const { return device.is_cuda() ? int(device.index()) : -1; }
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
  if (Status st = checkOptimizationOptions(opts); !st) return Error{st.message()};
  auto plan = plan::readPlan(opts.plan);
  if (!plan) return plan.error();
  s.plan = std::move(*plan);
  auto problems = plan::structuralProblems(s.plan);
  if (!problems.empty()) {
    std::string msg = opts.plan + ": invalid plan:";
    for (const auto &p : problems) msg += "\n  " + p;
    return Error{msg};
  }
  const std::string device = opts.device.empty() ? s.plan.cluster().device().type() : opts.device;
  if (device == "cuda") {
    const std::string what = opts.device.empty() ? "the plan is for CUDA devices (" + s.plan.cluster().device().name() + ")"
                                                 : "--device cuda";
    if (const std::string why = runtime::gpuUnavailableReason(0); !why.empty())
      return Error{opts.plan + ": " + what + ", but " + why + "; pass --device cpu to run it on CPU"};
    const runtime::GpuChoice gpu =
        runtime::chooseGpu(comm.rank(), s.plan.cluster().devices_per_node(), runtime::visibleGpus());
    s.gpu_why = gpu.why;
    s.device = torch::Device(torch::kCUDA, c10::DeviceIndex(gpu.device));
    runtime::useGpu(gpu.device); // before anything is allocated there
  }
  if (opts.loss_scale && s.plan.precision() != "fp16")
    return Error{"--loss-scale: only fp16 plans scale the loss (" + opts.plan + " is " +
                 (s.plan.precision().empty() ? "fp32" : s.plan.precision()) + ")"};
  const int world = plan::worldSize(s.plan);
  if (world != comm.size())
    return Error{opts.plan + ": the plan is for " + std::to_string(world) + " ranks, but this job has " +
                 std::to_string(comm.size()) + " (run mpirun -np " + std::to_string(world) + ")"};
  std::string model = opts.model.empty() ? s.plan.model().path() : opts.model;
  // One rank reads the whole model to check its identity (Note [model
  // identity]); the others only need the file to be there.
  if (comm.rank() == 0) {
    if (Status st = plan::verifyModelFiles(model, s.plan.model()); !st) return Error{st.message()};
  } else if (std::ifstream in(model, std::ios::binary); !in) {
    return Error{model + ": cannot open the model the plan names (pass --model PATH if it moved)"};
  }
  auto graph = plan::graphFromProto(s.plan.graph());
  if (!graph) return Error{opts.plan + ": " + graph.error().message};
  s.graph = std::move(*graph);
  for (const auto &st : s.plan.stages()) {
    s.ranges.emplace_back(st.op_begin(), st.op_end());
    s.stage_ranks.emplace_back(st.ranks().begin(), st.ranks().end());
    for (int j = 0; j < st.ranks_size(); ++j)
      if (st.ranks(j) == comm.rank()) {
        s.stage = st.id();
        s.replica = j;
      }
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
  // Parameters and buffers; a weightless model's made up with --init-weights.
  auto weights = runtime::loadStageWeights(s.graph, program, model, opts.init_weights);
  if (!weights) return weights.error();
  s.params = std::move(weights->params);
  s.buffers = std::move(weights->buffers);
  for (ir::ValueId c : program.constants) s.constants[c] = runtime::toTorch(s.graph.constant_data.at(c));
  if (s.device.is_cuda()) {
    for (auto &[id, p] : s.params) p = p.detach().to(s.device).set_requires_grad(true);
    for (auto *m : {&s.buffers, &s.constants})
      for (auto &[id, t] : *m) t = t.to(s.device);
  }
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

/// Samples [first, first + count) in `order`, on `device`: gathered in host
/// memory (pinned for a GPU, so the copy to it does not block).
torch::Tensor gatherSamples(const NpyArray &a, SampleOrder &order, int64_t first, int64_t count,
                            const torch::Device &device) {
  std::vector<int64_t> dims = a.shape();
  dims[0] = count;
  auto opts = torch::TensorOptions().dtype(runtime::toScalarType(a.dtype())).pinned_memory(device.is_cuda());
  torch::Tensor t = torch::empty(dims, opts);
  char *dst = static_cast<char *>(t.data_ptr());
  for (int64_t i = 0; i < count; ++i)
    std::memcpy(dst + i * a.sampleBytes(), a.sample(order.at(first + i)), size_t(a.sampleBytes()));
  return device.is_cuda() ? t.to(device, /*non_blocking=*/true) : t;
}

constexpr int kActTag = 0, kGradTag = 1;
int tagFor(int mb, int kind) { return 2 * mb + kind; }

/// Where a value's samples lie: its batch axis, the first dimension affine in
/// the batch size (-1: none, Note [batch-free values]; 0 when the shape is
/// unknown), and their order along it (Value::batch_blocks, Note [batch layout]
/// in executor/frontend/common.cpp).
struct BatchLayout {
  int64_t axis = 0;
  int64_t blocks = 1;
};

BatchLayout batchLayout(const ir::Value &v) {
  if (!v.shape_known) return {0, 1};
  for (size_t i = 0; i < v.shape.size(); ++i) {
    if (!v.shape[i].known) return {0, 1};
    if (v.shape[i].batch_coeff != 0) return {int64_t(i), v.batch_blocks};
  }
  return {-1, 1};
}

/// `t`'s sizes with its batch axis, of `rows` rows for `n` samples, viewed as
/// [blocks, n, rows / (n * blocks)] (Note [batch layout]).
std::vector<int64_t> blockView(const torch::Tensor &t, const BatchLayout &l, int64_t n) {
  std::vector<int64_t> sizes(t.sizes().begin(), t.sizes().end());
  const int64_t per_sample = sizes[size_t(l.axis)] / n;
  sizes[size_t(l.axis)] = per_sample / l.blocks;
  sizes.insert(sizes.begin() + l.axis, {l.blocks, n});
  return sizes;
}

/// Samples [part.begin, part.end) of `t`, which holds samples [whole.begin,
/// whole.end) laid out as `l` says.
torch::Tensor sliceSamples(const torch::Tensor &t, const BatchLayout &l, const schedule::SampleRange &whole,
                           const schedule::SampleRange &part, const std::string &what) {
  if (part.begin == whole.begin && part.end == whole.end) return t;
  if (l.blocks == 0)
    throw std::runtime_error(what + ": its samples are mixed along its batch axis (an op such as BatchNorm "
                             "couples them), so it cannot be split between replicas; cut the model elsewhere");
  if (t.dim() <= l.axis || t.size(l.axis) % (whole.size() * l.blocks) != 0)
    throw std::runtime_error(what + ": dimension " + std::to_string(l.axis) + " of shape " +
                             c10::str(t.sizes()) + " is not a multiple of the " + std::to_string(whole.size()) +
                             " samples it holds, so it cannot be split between replicas");
  const int64_t k = t.size(l.axis) / whole.size();
  if (l.blocks == 1) return t.narrow(l.axis, (part.begin - whole.begin) * k, part.size() * k);
  std::vector<int64_t> sizes(t.sizes().begin(), t.sizes().end());
  sizes[size_t(l.axis)] = part.size() * k;
  return t.reshape(blockView(t, l, whole.size())).narrow(l.axis + 1, part.begin - whole.begin, part.size())
      .reshape(sizes);
}

/// Joins pieces holding consecutive sample ranges of `counts[i]` samples each.
torch::Tensor joinSamples(const std::vector<torch::Tensor> &pieces, const std::vector<int64_t> &counts,
                          const BatchLayout &l) {
  if (pieces.size() == 1 || pieces[0].numel() == 0) return pieces[0];
  if (l.blocks <= 1) return torch::cat(pieces, l.axis);
  std::vector<torch::Tensor> views;
  int64_t rows = 0;
  for (size_t i = 0; i < pieces.size(); ++i) {
    views.push_back(pieces[i].reshape(blockView(pieces[i], l, counts[i])));
    rows += pieces[i].size(l.axis);
  }
  std::vector<int64_t> sizes(pieces[0].sizes().begin(), pieces[0].sizes().end());
  sizes[size_t(l.axis)] = rows;
  return torch::cat(views, l.axis + 1).reshape(sizes);
}

// Note [batch-free values]
// A value whose shape holds no samples (position ids [1, T], a causal mask
// [T, T], a size) is the same for every sample, so it is never split between
// replicas: receiver replica i gets it whole from producer replica
// i % (producer replicas), and sends its gradient back to that replica alone.
// A producer replica sums the gradients of the receivers it served (none: no
// gradient). Backward is linear in those gradients, and each receiver's is
// already weighted by its share of the batch, so once the producer's
// parameter gradients are all-reduced over its replicas they hold the whole
// batch's, exactly as one device computes them.

/// How this rank exchanges one value with the replicas of a peer stage.
struct Link {
  const std::vector<int> &peer_ranks;
  const std::vector<schedule::SampleRange> &peer_ranges;
  schedule::SampleRange mine;
  int replica = 0;       ///< this rank's replica index in its stage
  int replicas = 1;      ///< its stage's replica count
  bool producer = false; ///< this stage computes the value (sends it, receives its gradient)

  /// The peer replicas a batch-free value goes to or comes from.
  std::vector<size_t> batchFreePeers() const {
    std::vector<size_t> peers;
    if (producer) {
      for (size_t i = 0; i < peer_ranks.size(); ++i)
        if (int(i) % replicas == replica) peers.push_back(i);
    } else {
      peers.push_back(size_t(replica) % peer_ranks.size());
    }
    return peers;
  }
};

/// Sends `t` (a value or its gradient) to the peer replicas: exactly the
/// intersection of sample ranges (SPEC), or whole when the value holds no
/// samples.
void sendValue(Transport &transport, const torch::Tensor &t, const BatchLayout &layout, const Link &link, int tag,
               const std::string &what) {
  std::vector<std::pair<torch::Tensor, int>> pieces;
  if (layout.axis < 0) {
    for (size_t k : link.batchFreePeers()) pieces.emplace_back(t, link.peer_ranks[k]);
  } else {
    for (size_t k = 0; k < link.peer_ranks.size(); ++k) {
      schedule::SampleRange part = schedule::intersect(link.mine, link.peer_ranges[k]);
      if (part.size() <= 0) continue;
      pieces.emplace_back(t.numel() == 0 ? t : sliceSamples(t, layout, link.mine, part, what), link.peer_ranks[k]);
    }
  }
  transport.send(pieces, tag);
}

/// Receives what sendValue sent this rank: the overlapping pieces joined in
/// sample order, or a batch-free value whole (its gradients summed; empty
/// when no receiver sent one).
torch::Tensor recvValue(Transport &transport, const BatchLayout &layout, const Link &link, int tag) {
  std::vector<int> srcs;
  if (layout.axis < 0) {
    for (size_t k : link.batchFreePeers()) srcs.push_back(link.peer_ranks[k]);
    torch::Tensor sum;
    for (const torch::Tensor &t : transport.recv(srcs, tag)) {
      if (t.numel() == 0 && t.dim() == 1) continue; // "no gradient"
      sum = sum.defined() ? sum + t : t;
    }
    return sum.defined() ? sum : torch::empty({0});
  }
  std::vector<int64_t> counts;
  for (size_t k = 0; k < link.peer_ranks.size(); ++k)
    if (const int64_t n = schedule::intersect(link.mine, link.peer_ranges[k]).size(); n > 0) {
      srcs.push_back(link.peer_ranks[k]);
      counts.push_back(n);
    }
  return joinSamples(transport.recv(srcs, tag), counts, layout);
}

/// Sums the gradients of `params` over `group` (one flat buffer); a rank
/// that does not `contribute` adds zeros and still receives the sum.
void allReduceGradients(comm::Communicator &group, const std::vector<torch::Tensor> &params, bool contribute = true) {
  std::vector<torch::Tensor> flat;
  for (const auto &p : params) {
    if (p.scalar_type() != torch::kFloat)
      throw std::runtime_error("gradient all-reduce supports float32 parameters only");
    flat.push_back(contribute && p.grad().defined() ? p.grad().reshape({-1}) : torch::zeros({p.numel()}, p.options()));
  }
  if (flat.empty()) return;
  torch::Tensor buffer = torch::cat(flat);
  group.allReduce(buffer.data_ptr<float>(), buffer.numel(), comm::ReduceOp::Sum);
  int64_t offset = 0;
  for (const auto &p : params) {
    torch::Tensor g = buffer.narrow(0, offset, p.numel()).view(p.sizes());
    if (p.grad().defined()) p.mutable_grad().copy_(g);
    else p.mutable_grad() = g.clone();
    offset += p.numel();
  }
}

/// Stops the whole job when this rank makes no progress for `timeout_s`
/// (a peer that died without MPI noticing, a lost message): never a hang.
class Watchdog {
public:
  Watchdog(double timeout_s, comm::Communicator &comm) : timeout_s_(timeout_s), comm_(comm) {
    if (timeout_s_ > 0) thread_ = std::thread([this] { watch(); });
  }
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  /// Records progress and what the rank is about to wait for.
  void progress(std::string what) {
    std::lock_guard<std::mutex> lock(mu_);
    last_ = std::chrono::steady_clock::now();
    what_ = std::move(what);
  }

private:
  void watch() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!done_) {
      cv_.wait_for(lock, std::chrono::milliseconds(200));
      double idle = std::chrono::duration<double>(std::chrono::steady_clock::now() - last_).count();
      if (!done_ && idle > timeout_s_) {
        std::cerr << "rannc-exec: rank " << comm_.rank() << ": error: no progress for " << int(idle)
                  << " s while " << what_ << " (--timeout " << timeout_s_ << "); stopping all ranks" << std::endl;
        comm_.abort(1);
      }
    }
  }

  double timeout_s_;
  comm::Communicator &comm_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::chrono::steady_clock::time_point last_ = std::chrono::steady_clock::now();
  std::string what_ = "starting";
  std::thread thread_;
};

/// Makes a communicator over a group's ranks one for the device the stage's
/// tensors are on (collective over the group).
using GroupMaker = std::function<std::unique_ptr<comm::Communicator>(std::unique_ptr<comm::Communicator>)>;

/// Parameters read by several stages (Note [shared parameters] in
/// executor/schedule/schedule.h), grouped by the set of stages that read them.
/// Each group has a communicator over the ranks of those stages; after the
/// replica all-reduce, the first replica of each reader stage contributes its
/// part of the gradient and every rank of the group receives the sum, so every
/// copy of the parameter takes the same optimizer step.
struct SharedParameters {
  struct Group {
    std::vector<torch::Tensor> params; ///< this stage's copies, in value-id order
    std::unique_ptr<comm::Communicator> comm;
  };
  std::vector<Group> groups;            ///< the groups this rank's stage belongs to
  std::set<ir::ValueId> counted_elsewhere; ///< shared ones an earlier stage counts in the gradient norm

  /// Collective over `comm`: every rank splits once per group of the graph,
  /// in the same order; `on_device` makes a group's communicator one for the
  /// tensors' device (collective over the group).
  SharedParameters(const ir::Graph &g, const std::vector<std::pair<int, int>> &ranges, int stage,
                   const runtime::StageRunner &runner, comm::Communicator &comm, const GroupMaker &on_device) {
    std::map<std::vector<int>, std::vector<ir::ValueId>> by_stages; // ordered: the same on every rank
    for (int t = 0; t < int(ranges.size()); ++t)
      for (const auto &[v, stages] : schedule::buildStageProgram(g, ranges, t).shared_parameters)
        if (stages.front() == t) by_stages[stages].push_back(v); // listed once, by its first reader
    for (const auto &[stages, values] : by_stages) {
      const bool mine = std::binary_search(stages.begin(), stages.end(), stage);
      auto c = comm.split(mine ? 1 : 0, comm.rank());
      if (!mine) continue;
      Group grp;
      for (ir::ValueId v : values) {
        grp.params.push_back(runner.parameter(v));
        if (stages.front() != stage) counted_elsewhere.insert(v);
      }
      grp.comm = on_device(std::move(c));
      groups.push_back(std::move(grp));
    }
  }

  /// Sums each shared parameter's gradient over the stages that read it.
  void allReduce(int replica) {
    for (auto &grp : groups) allReduceGradients(*grp.comm, grp.params, replica == 0);
  }
};

/// Where a rank's step time goes (logged per stage as `stage_times_s`).
enum Phase { kForward, kBackward, kComm, kUpdate, kPhases };
const char *const kPhaseNames[kPhases] = {"forward_s", "backward_s", "comm_s", "update_s"};

Phase phaseOf(schedule::ActionKind k) {
  switch (k) {
  case schedule::ActionKind::Forward: return kForward;
  case schedule::ActionKind::Backward: return kBackward;
  case schedule::ActionKind::OptimizerStep: return kUpdate;
  default: return kComm;
  }
}

double secondsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

/// Tokens per sample of a sequence model: the non-batch size of the first
/// integer data input of rank >= 2 (token ids [B, S]); 0 when there is none.
int64_t tokensPerSample(const ir::Graph &g) {
  for (ir::ValueId in : g.inputs) {
    const ir::Value &v = g.values[in];
    if (ir::isFloating(v.dtype) || v.shape.size() < 2) continue;
    int64_t n = 1;
    for (size_t d = 1; d < v.shape.size(); ++d) n *= v.shape[d].isFixed() ? v.shape[d].offset : 0;
    if (n > 0) return n;
  }
  return 0;
}

/// "1h02m", "3m05s", "42s": an ETA for people.
std::string formatEta(double seconds) {
  const int64_t t = int64_t(seconds + 0.5);
  char buf[32];
  if (t >= 3600) std::snprintf(buf, sizeof buf, "%lldh%02lldm", (long long)(t / 3600), (long long)(t % 3600 / 60));
  else if (t >= 60) std::snprintf(buf, sizeof buf, "%lldm%02llds", (long long)(t / 60), (long long)(t % 60));
  else std::snprintf(buf, sizeof buf, "%llds", (long long)t);
  return buf;
}

/// One step as this rank's schedule interpreter saw it.
struct StepRecord {
  int64_t step = 0;
  double loss_sum = 0;              ///< this rank's share of the step's mean loss (the loss stage only)
  std::vector<double> batch_losses; ///< each accumulated batch's loss share
  std::array<double, kPhases> phase_s{};
  double step_time_s = 0;
  double lr = 0;
  double grad_norm = 0;
  bool skipped = false;
};

/// A step's reductions over all ranks and rank 0's reporting of them: the
/// JSON line (SPEC's log keys and more), the progress line, the run's summary.
class StepReporter {
public:
  struct Context {
    const TrainOptions &opts;
    comm::Communicator &comm;
    const std::vector<std::vector<int>> &ranks_of; ///< every stage's ranks
    int64_t samples_per_step = 0;                  ///< K x B
    int64_t tokens_per_sample = 0;
    bool computes_loss = false;                    ///< this rank's stage computes the loss
    int64_t first_step = 0, steps = 0;
    int gpu = -1;                                  ///< this rank's CUDA device (-1: CPU)
  };

  StepReporter(Context c, std::ostream &log) : c_(std::move(c)), log_(log) {}

  /// Opens the --log file on rank 0: appended to when resuming.
  Status open() {
    if (c_.comm.rank() != 0 || c_.opts.log.empty()) return Status::success();
    jsonl_.open(c_.opts.log, c_.first_step > 0 ? std::ios::app : std::ios::trunc);
    if (!jsonl_) return Error{c_.opts.log + ": cannot write the log"};
    return Status::success();
  }

  /// Reduces `r` over the ranks and reports it; an error (said by rank 0) for a
  /// non-finite loss under --on-nonfinite stop.
  Status report(StepRecord r, const GradientBuckets *buckets) {
    comm::Communicator &comm = c_.comm;
    const int world = comm.size(), rank = comm.rank();
    const int64_t K = int64_t(r.batch_losses.size());
    // Loss from the stage that computes it; memory per rank; slowest rank's time.
    std::vector<double> sums(1 + (2 + kPhases) * world, 0.0);
    sums[0] = c_.computes_loss ? r.loss_sum : 0.0;
    // Tensor memory: the counting allocator's on CPU, the caching allocator's on a GPU.
    sums[1 + rank] = double(c_.gpu >= 0 ? runtime::gpuPeakAllocatedBytes(c_.gpu) : runtime::peakTensorBytes());
    sums[1 + world + rank] = double(peakRssBytes());
    for (int k = 0; k < kPhases; ++k) sums[1 + (2 + k) * world + rank] = r.phase_s[size_t(k)];
    comm.allReduce(sums.data(), int(sums.size()), comm::ReduceOp::Sum);
    comm.allReduce(&r.step_time_s, 1, comm::ReduceOp::Max);
    if (K > 1) comm.allReduce(r.batch_losses.data(), int(K), comm::ReduceOp::Sum);
    const double loss = sums[0];
    if (!std::isfinite(loss) && c_.opts.on_nonfinite == "stop")
      return Error{rank == 0 ? "non-finite loss (" + std::to_string(loss) + ") at step " + std::to_string(r.step) : ""};
    if (rank != 0) return Status::success();
    std::vector<int64_t> mem(sums.begin() + 1, sums.begin() + 1 + world);
    std::vector<int64_t> rss(sums.begin() + 1 + world, sums.begin() + 1 + 2 * world);
    nlohmann::ordered_json j;
    j["step"] = r.step;
    j["loss"] = loss;
    j["samples_per_s"] = double(c_.samples_per_step) / r.step_time_s;
    if (c_.tokens_per_sample > 0) j["tokens_per_s"] = double(c_.samples_per_step * c_.tokens_per_sample) / r.step_time_s;
    j["step_time_s"] = r.step_time_s;
    j["peak_memory_bytes"] = *std::max_element(mem.begin(), mem.end());
    j["peak_memory_bytes_per_rank"] = mem;
    j["peak_rss_bytes"] = *std::max_element(rss.begin(), rss.end());
    j["lr"] = r.lr;
    j["grad_norm"] = r.grad_norm;
    if (K > 1) j["batch_losses"] = r.batch_losses;
    // Per stage, the slowest of its ranks in each phase: compute, waiting
    // for and sending to other stages and replicas, the optimizer update.
    nlohmann::ordered_json stage_times = nlohmann::ordered_json::array();
    for (size_t st = 0; st < c_.ranks_of.size(); ++st) {
      nlohmann::ordered_json t;
      t["stage"] = st;
      for (int k = 0; k < kPhases; ++k) {
        double worst = 0;
        for (int rk : c_.ranks_of[st]) worst = std::max(worst, sums[size_t(1 + (2 + k) * world + rk)]);
        t[kPhaseNames[k]] = worst;
      }
      stage_times.push_back(t);
    }
    j["stage_times_s"] = stage_times;
    // Rank 0's replica all-reduce: buckets started during backward, of all.
    if (buckets) j["allreduce_buckets_overlapped"] = {buckets->startedEarly(), buckets->size()};
    if (r.skipped) j["skipped"] = true;
    if (jsonl_) jsonl_ << j.dump() << "\n" << std::flush;
    run_time_ += r.step_time_s;
    samples_done_ += c_.samples_per_step;
    last_loss_ = loss;
    peak_memory_ = std::max(peak_memory_, j["peak_memory_bytes"].get<int64_t>());
    if (c_.opts.progress) {
      // On a terminal one line rewritten in place; otherwise a line per step.
      const bool tty = &log_ == &std::cerr && ::isatty(STDERR_FILENO);
      const double eta = run_time_ / double(r.step + 1 - c_.first_step) * double(c_.steps - r.step - 1);
      char line[160];
      std::snprintf(line, sizeof line, "step %lld/%lld  loss %.6g  %.1f samples/s  ETA %s", (long long)(r.step + 1),
                    (long long)c_.steps, loss, double(c_.samples_per_step) / r.step_time_s, formatEta(eta).c_str());
      log_ << line << (tty ? (r.step + 1 == c_.steps ? "\n" : "\r") : "\n") << std::flush;
    }
    return Status::success();
  }

  /// Rank 0's final line: steps, time, throughput, loss, peak memory.
  void summary() const {
    if (c_.comm.rank() != 0 || c_.steps <= c_.first_step) return;
    char line[200];
    std::snprintf(line, sizeof line,
                  "rannc-exec: done: %lld step(s) in %.3g s, %.1f samples/s, final loss %.6g, peak tensor memory "
                  "%.1f MiB per rank",
                  (long long)(c_.steps - c_.first_step), run_time_, double(samples_done_) / std::max(run_time_, 1e-12),
                  last_loss_, double(peak_memory_) / (1 << 20));
    log_ << line << "\n";
  }

private:
  Context c_;
  std::ostream &log_;
  std::ofstream jsonl_;
  double run_time_ = 0, last_loss_ = 0;
  int64_t samples_done_ = 0, peak_memory_ = 0;
};

} // namespace

/// The step's reductions and the update, one object per rank: the replica
/// sums (Note [gradient buckets]) and the shared-parameter sums, then the
/// agreement on finite gradients, the global norm, clipping, fp16 loss
/// scaling (Note [loss scaling]) and the optimizer step, sharded where the
/// plan says so (Note [sharded optimizer state]).
class ParameterUpdate {
public:
  /// Collective: splits the communicators of the shared-parameter groups.
  ParameterUpdate(const TrainOptions &opts, comm::Communicator &comm, comm::Communicator &group, const Setup &s,
                  runtime::StageRunner &runner, std::optional<LossScaler> scaler, const GroupMaker &on_device)
      : opts_(opts), comm_(comm), stage_(s.stage), replica_(s.replica), runner_(runner), scaler_(std::move(scaler)),
        make_([&opts](std::vector<torch::Tensor> ps) { return makeOptimizer(opts, std::move(ps)); }),
        optimizer_(make_(runner.parameters())), shared_(s.graph, s.ranges, s.stage, runner, comm, on_device) {
    if (group.size() > 1) {
      using Mode = GradientBuckets::Mode;
      const bool shard = s.plan.stages(s.stage).zero() > 0;
      const Mode mode = !shard ? Mode::AllReduce : shared_.groups.empty() ? Mode::ReduceScatter : Mode::ShardedUpdate;
      buckets_ = std::make_unique<GradientBuckets>(group, runner.parameters(), opts.bucket_bytes, mode);
      if (shard) sharded_ = std::make_unique<ShardedOptimizer>(*buckets_, make_);
    }
    // Reduce-scattered, a replica holds the sums of its own blocks only.
    blocks_only_ = buckets_ && buckets_->mode() == GradientBuckets::Mode::ReduceScatter;
    // The gradient norm counts a shared parameter once: in its first reader stage.
    for (ir::ValueId v : runner.program().parameters)
      if (!shared_.counted_elsewhere.count(v)) norm_params_.push_back(runner.parameter(v));
  }

  /// The whole stage's optimizer; with sharded state it holds the state only
  /// while a checkpoint is loaded or saved (see the hooks below).
  torch::optim::Optimizer &optimizer() { return *optimizer_; }
  const OptimizerFactory &factory() const { return make_; }
  const GradientBuckets *buckets() const { return buckets_.get(); }
  /// What the loss is multiplied by before backward (1 but under fp16).
  double lossScale() const { return scaler_ ? scaler_->scale() : 1.0; }
  /// The fp16 loss scaler (checkpoints save and restore it); null otherwise.
  LossScaler *lossScaler() { return scaler_ ? &*scaler_ : nullptr; }

  /// Before the step's last backward: its gradients are final.
  void armBuckets() {
    if (buckets_) buckets_->arm();
  }
  /// The AllReduce action: the replica sums, then the shared-parameter sums.
  void reduce() {
    if (buckets_) buckets_->finish();
    shared_.allReduce(replica_);
  }

  /// The OptimizerStep action: fills rec.grad_norm and rec.skipped.
  Status step(StepRecord &rec, std::ostream &log) {
    const int rank = comm_.rank();
    // All ranks agree on finiteness first, so no stage steps alone. One pass
    // over the gradients gives both the stage's squared norm and its
    // finiteness (runtime::gradSquaredNorm).
    if (scaler_) scaler_->unscale(blocks_only_ ? sharded_->parameters() : runner_.parameters());
    const double squared = runtime::gradSquaredNorm(blocks_only_ ? sharded_->parameters() : norm_params_);
    double bad = std::isfinite(squared) ? 0.0 : double(stage_ + 1);
    comm_.allReduce(&bad, 1, comm::ReduceOp::Max);
    if (scaler_) {
      const double was = scaler_->scale();
      scaler_->update(bad > 0);
      if (bad > 0 && rank == 0)
        log << "rannc-exec: step " << rec.step << ": fp16 gradients overflowed at loss scale " << was
            << "; step skipped, scale now " << scaler_->scale() << "\n";
    }
    if (bad > 0 && opts_.on_nonfinite == "stop" && !scaler_)
      return Error{rank == 0 ? "non-finite gradients at step " + std::to_string(rec.step) + " in stage " +
                                   std::to_string(int(bad) - 1) + " (pass --on-nonfinite skip to skip such steps)"
                             : ""};
    rec.skipped = bad > 0;
    // The global gradient norm: each stage's (replica-reduced, so equal on
    // every replica) squared norm, counted once per stage via replica 0, and
    // a shared parameter once, in its first reader stage; reduce-scattered,
    // every replica's blocks.
    rec.grad_norm = blocks_only_ || replica_ == 0 ? squared : 0.0;
    comm_.allReduce(&rec.grad_norm, 1, comm::ReduceOp::Sum);
    rec.grad_norm = std::sqrt(rec.grad_norm);
    if (!rec.skipped && opts_.clip_grad_norm > 0)
      scaleGradients(sharded_ ? sharded_->parameters() : runner_.parameters(),
                     clipFactor(rec.grad_norm, opts_.clip_grad_norm));
    setLearningRate(*optimizer_, rec.lr); // a checkpoint saves its options
    if (sharded_) setLearningRate(sharded_->inner(), rec.lr);
    if (!rec.skipped && sharded_) sharded_->step();
    else if (!rec.skipped) optimizer_->step();
    runtime::zeroGradients(runner_.parameters());
    return Status::success();
  }

  /// After a checkpoint was loaded into optimizer(): keep this replica's share.
  void afterLoad() {
    if (sharded_) sharded_->scatterState(*optimizer_);
  }
  /// Collective, around a checkpoint save: optimizer() holds the whole state
  /// per parameter while it is written.
  void beforeSave() {
    if (sharded_) sharded_->gatherState(*optimizer_);
  }
  void afterSave() {
    if (sharded_) optimizer_->state().clear();
  }

private:
  const TrainOptions &opts_;
  comm::Communicator &comm_;
  int stage_, replica_;
  runtime::StageRunner &runner_;
  std::optional<LossScaler> scaler_;
  OptimizerFactory make_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  SharedParameters shared_;
  std::unique_ptr<GradientBuckets> buckets_;
  std::unique_ptr<ShardedOptimizer> sharded_;
  bool blocks_only_ = false;
  std::vector<torch::Tensor> norm_params_;
};

/// The schedule's four transfer actions for one rank: its stage's received
/// values and sent values, each split, sent and joined by samples along its
/// own batch axis between the replicas of the two stages (Note [batch-free
/// values]), and their gradients the other way.
class StageTransfers {
public:
  StageTransfers(Transport &transport, const Setup &s, const schedule::StageProgram &prog,
                 std::vector<std::vector<schedule::SampleRange>> shards)
      : transport_(transport), s_(s), prog_(prog), shards_(std::move(shards)) {}

  /// RecvActivations: the values the stage receives for micro-batch `mb`.
  std::unordered_map<ir::ValueId, torch::Tensor> recvActivations(int mb) {
    std::unordered_map<ir::ValueId, torch::Tensor> feeds;
    for (const auto &r : prog_.recvs) feeds[r.value] = recv(r.value, r.peer_stage, false, tagFor(mb, kActTag));
    return feeds;
  }
  /// SendActivations: the values the stage computed for later stages.
  void sendActivations(const runtime::StageRunner &runner, int mb) {
    for (const auto &snd : prog_.sends)
      send(runner.value(mb, snd.value), snd.value, snd.peer_stage, true, tagFor(mb, kActTag));
  }
  /// RecvGradients: the gradients of the sent values, in prog.sends order
  /// (undefined where a value has none: an empty message).
  std::vector<torch::Tensor> recvGradients(int mb) {
    std::vector<torch::Tensor> grads;
    for (const auto &snd : prog_.sends) {
      torch::Tensor g = recv(snd.value, snd.peer_stage, true, tagFor(mb, kGradTag));
      grads.push_back(g.numel() == 0 ? torch::Tensor() : g);
    }
    return grads;
  }
  /// SendGradients: the gradients of the received values, back to their producers.
  void sendGradients(const runtime::StageRunner &runner, int mb) {
    for (const auto &r : prog_.recvs) {
      torch::Tensor g = runner.inputGrad(mb, r.value);
      send(g.defined() ? g : torch::empty({0}), r.value, r.peer_stage, false, tagFor(mb, kGradTag));
    }
  }

private:
  Link link(int peer_stage, bool producer) const {
    return Link{s_.stage_ranks[size_t(peer_stage)], shards_[size_t(peer_stage)], shards_[s_.stage][s_.replica],
                s_.replica, int(s_.stage_ranks[size_t(s_.stage)].size()), producer};
  }
  torch::Tensor recv(ir::ValueId v, int peer_stage, bool producer, int tag) {
    return recvValue(transport_, batchLayout(s_.graph.values[v]), link(peer_stage, producer), tag);
  }
  void send(const torch::Tensor &t, ir::ValueId v, int peer_stage, bool producer, int tag) {
    sendValue(transport_, t, batchLayout(s_.graph.values[v]), link(peer_stage, producer), tag,
              "value '" + s_.graph.values[v].name + "'");
  }

  Transport &transport_;
  const Setup &s_;
  const schedule::StageProgram &prog_;
  std::vector<std::vector<schedule::SampleRange>> shards_; ///< every stage's replicas' samples of a micro-batch
};

/// Whether two ranks of `comm` drive the same GPU, which NCCL refuses
/// (collective): each rank's GPU UUID hashed, the hashes all-gathered as
/// 32-bit halves in doubles (exact).
bool gpuShared(comm::Communicator &comm, int gpu) {
  const uint64_t h = std::hash<std::string>{}(runtime::gpuUuid(gpu));
  std::vector<double> all(2 * size_t(comm.size()), 0.0);
  all[2 * size_t(comm.rank())] = double(h >> 32);
  all[2 * size_t(comm.rank()) + 1] = double(h & 0xffffffffu);
  comm.allReduce(all.data(), int(all.size()), comm::ReduceOp::Sum);
  std::set<std::pair<double, double>> seen;
  for (size_t r = 0; r < all.size(); r += 2)
    if (!seen.insert({all[r], all[r + 1]}).second) return true;
  return false;
}

/// How a rank's tensors travel: on CPU, everything over MPI as before; on
/// GPUs, the pipeline's values over NCCL (Note [NCCL transport]) and the
/// replica and shared-parameter sums over NCCL too, on streams of their own
/// (Note [device streams]), unless two ranks share a GPU: then everything is
/// staged through host memory over MPI (slower, but it runs, e.g. a 2-stage
/// pipeline on one GPU).
class GpuComms {
public:
  /// Collective over `comm`.
  GpuComms(comm::Communicator &comm, const Setup &s, bool host_staged) : comm_(comm), s_(s) {
    const int gpu = s_.gpu();
    if (gpu < 0) return;
    stream_ = runtime::currentGpuStream(gpu);
    shared_ = gpuShared(comm, gpu);
    nccl_ = !shared_ && !host_staged;
    if (nccl_)
      for (int k = 0; k < 2; ++k) channels_.push_back(comm::createNcclCommunicator(comm, gpu)); // activations, gradients
  }

  /// `c` (over some ranks of the job) made fit for the device's tensors:
  /// collective over its ranks.
  std::unique_ptr<comm::Communicator> onDevice(std::unique_ptr<comm::Communicator> c) const {
    if (s_.gpu() < 0) return c;
    std::unique_ptr<comm::DeviceCommunicator> nccl;
    if (nccl_ && c->size() > 1) nccl = comm::createNcclCommunicator(*c, s_.gpu());
    return comm::deviceCollectives(std::move(c), std::move(nccl), stream_);
  }

  /// The transport of the pipeline's values (once: it takes the channels).
  std::unique_ptr<Transport> transport() {
    if (nccl_) return ncclTransport(comm_, s_.device, std::move(channels_), stream_);
    return hostTransport(comm_, s_.device);
  }

  /// Rank 0's line about its GPU and the transport ("" on CPU).
  std::string describe() const {
    if (s_.gpu() < 0) return "";
    return "rannc-exec: rank 0 on GPU " + std::to_string(s_.gpu()) + " (" + runtime::gpuName(s_.gpu()) + ", " +
           s_.gpu_why +
           "); transfers and sums " +
           (nccl_ ? "over NCCL " + comm::ncclVersion()
                  : std::string("staged through host memory over MPI (") +
                        (shared_ ? "ranks share a GPU" : "--gpu-transport host") + ")") +
           "\n";
  }

private:
  comm::Communicator &comm_;
  const Setup &s_; ///< the rank's device and why it was chosen
  void *stream_ = nullptr;
  bool shared_ = false; ///< two ranks drive one GPU
  bool nccl_ = false;
  std::vector<std::unique_ptr<comm::DeviceCommunicator>> channels_;
};

/// Rank 0's start-up line: layout, schedule, steps and the memory techniques.
std::string startupLine(const proto::Plan &plan, int world, int64_t steps, int64_t K, const TrainOptions &opts,
                        const std::string &precision) {
  std::string recomputing, sharding;
  for (const auto &st : plan.stages()) {
    if (st.recompute()) recomputing += (recomputing.empty() ? "" : ",") + std::to_string(st.id());
    if (st.zero() > 0) sharding += (sharding.empty() ? "" : ",") + std::to_string(st.id());
  }
  std::ostringstream os;
  os << "rannc-exec: " << world << " rank(s), " << plan.stages_size() << " stage(s), batch "
     << plan.global_batch_size() << " in " << plan.microbatches() << " micro-batch(es), "
     << (plan.schedule() == proto::GPIPE ? "gpipe" : "1f1b") << ", " << steps << " step(s)"
     << (K > 1 ? " of " + std::to_string(K) + " accumulated batches" : "") << ", " << opts.optimizer
     << (recomputing.empty() ? "" : ", recomputing stage(s) " + recomputing)
     << (sharding.empty() ? "" : ", optimizer state sharded in stage(s) " + sharding) << ", precision " << precision
     << "\n";
  return os.str();
}

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
  GpuComms gpu(comm, s, opts.host_staged); // collective
  auto group = gpu.onDevice(comm.split(s.stage, rank)); // this stage's replicas

  runtime::StageRunner runner(s.graph, schedule::buildStageProgram(s.graph, s.ranges, s.stage), std::move(s.params),
                              std::move(s.constants), std::move(s.buffers));
  runner.setDevice(s.device);
  runner.setRecompute(s.plan.stages(s.stage).recompute()); // Note [recomputation]
  const std::string precision = s.plan.precision().empty() ? "fp32" : s.plan.precision();
  // Mixed precision: forward under autocast; values cross stages in the
  // dtype autocast gave them (their header carries it), and their gradients
  // come back in it (Note [autocast dtypes] in planner/cost/precision.cpp).
  if (precision != "fp32") runner.setAutocast(precision == "bf16" ? torch::kBFloat16 : torch::kHalf);
  std::optional<LossScaler> scaler; // fp16 only (Note [loss scaling])
  if (precision == "fp16") scaler.emplace(LossScaler::Options{opts.loss_scale.value_or(65536.0)});
  ParameterUpdate update(opts, comm, *group, s, runner, std::move(scaler),
                         [&gpu](std::unique_ptr<comm::Communicator> c) { return gpu.onDevice(std::move(c)); });
  const auto &prog = runner.program();
  const auto kind = *plan::scheduleFromProto(s.plan.schedule()); // prepare() refused a plan naming none
  // Gradient accumulation: K global batches (K*M micro-batches) per optimizer
  // step, each batch's loss weighted 1/K (docs/training.md).
  const int64_t K = opts.accumulation_steps;
  const int64_t steps = opts.epochs > 0 ? stepsForEpochs(opts.epochs, s.samples, K * B) : opts.steps;
  auto actions = schedule::accumulate(schedule::build(kind, s.stage, num_stages, M), int(K), M);
  // The replica all-reduce overlaps the step's last backward (Note [gradient buckets]).
  size_t last_backward = 0;
  for (size_t i = 0; i < actions.size(); ++i)
    if (actions[i].kind == schedule::ActionKind::Backward) last_backward = i;
  // Checkpoints (executor/train/checkpoint.h): --resume loads the newest one here.
  Checkpointer checkpoints({opts, comm, s.plan, s.graph, runner, s.stage, s.replica, update.optimizer(),
                            update.factory(), s.samples, K * B, update.lossScaler()});
  auto first_step = checkpoints.start(log);
  if (!first_step) return first_step.error();
  update.afterLoad();
  SampleOrder order(std::max<int64_t>(s.samples, 1), opts.shuffle == "on", opts.seed);
  StepReporter reporter({opts, comm, ranks_of, K * B, tokensPerSample(s.graph), prog.computes_loss, *first_step,
                         steps, s.gpu()},
                        log);
  std::unique_ptr<Transport> transport = gpu.transport();
  StageTransfers transfers(*transport, s, prog, shards);
  Watchdog watchdog(opts.timeout_s, comm);

  if (Status st = reporter.open(); !st) return st; // resumed: the log was trimmed, then appended to
  if (rank == 0) log << startupLine(s.plan, comm.size(), steps, K, opts, precision) << gpu.describe();

  for (int64_t step = *first_step; step < steps; ++step) {
    auto t0 = std::chrono::steady_clock::now();
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
        for (ir::ValueId in : prog.data_inputs)
          feeds[in] = opts.synthetic
                          ? runtime::syntheticInput(s.graph.values[in], mine.size(), opts.seed * 1000003 + uint64_t(first))
                                .to(s.device)
                          : gatherSamples(s.data.at(in), order, first, mine.size(), s.device);
        runner.forward(mb, std::move(feeds));
        if (prog.computes_loss) {
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
        runner.backward(mb, std::move(send_grads[mb]), double(mine.size()) / double(B * K) * update.lossScale());
        send_grads.erase(mb);
        if (prog.recvs.empty()) runner.release(mb);
        break;
      case schedule::ActionKind::SendGradients:
        transfers.sendGradients(runner, mb);
        runner.release(mb);
        break;
      case schedule::ActionKind::AllReduce:
        update.reduce();
        break;
      case schedule::ActionKind::OptimizerStep:
        if (Status st = update.step(rec, log); !st) return st;
        break;
      }
      rec.phase_s[phaseOf(a.kind)] += secondsSince(a0);
    }
    transport->waitSends();
    runtime::synchronizeGpu(s.gpu()); // the step's time is the device's
    if (!losses.empty()) {
      const torch::Tensor host = torch::stack(losses).to(torch::kCPU, torch::kDouble); // one copy off the device
      const double *value = host.data_ptr<double>();
      for (size_t i = 0; i < losses.size(); ++i) {
        const double weighted = value[i] * double(mine.size()) / double(B);
        rec.batch_losses[size_t(loss_mbs[i] / M)] += weighted;
        rec.loss_sum += weighted / double(K);
      }
    }
    rec.step_time_s = secondsSince(t0);
    if (Status st = reporter.report(std::move(rec), update.buckets()); !st) return st;
    if (checkpoints.due(step + 1, steps)) {
      watchdog.progress("writing the checkpoint of step " + std::to_string(step + 1));
      update.beforeSave(); // the state per parameter
      checkpoints.save(step + 1, log);
      update.afterSave();
    }
  }
  if (Status st = checkpoints.exportTrained(log); !st) return st;
  reporter.summary();
  comm.barrier();
  return Status::success();
}

} // namespace rannc::train
