// The tensor-parallel collectives (Note [tensor parallel collectives] in
// executor/runtime/kernels/tensor_parallel.cpp) on a hand-built local graph:
// a column- then row-parallel MLP followed by a vocabulary-parallel output
// layer, as sharding::localGraph would write it. Run under mpirun with t
// ranks (any t dividing 12 and 6), each rank also runs the unsharded graph
// alone; the group's loss and every parameter gradient (sharded ones as the
// rank's slice) must match it. Nothing is typed in: the expected values come
// from the unsharded run.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "executor/comm/comm.h"
#include "executor/comm/device_comm.h"
#include "executor/runtime/device.h"
#include "executor/runtime/collectives.h"
#include "executor/runtime/stage.h"
#include "executor/schedule/schedule.h"
#include "tests/executor/tp_mlp.h"

namespace rannc::runtime {
namespace {

using ir::Dim;
using tptest::kD;
using tptest::kH;
using tptest::kV;
using tptest::Mlp;

using tptest::world;

/// Trains nothing: two micro-batches forward and backward, gradients
/// accumulated, on the unsharded graph and on this rank's shard; compares.
void checkAgainstUnsharded(int64_t gather_axis, comm::Communicator &group = world(),
                           torch::Device device = torch::kCPU) {
  const int t = group.size(), me = group.rank();
  ASSERT_TRUE(kH % t == 0 && kV % t == 0) << "run with a number of ranks that divides " << kH << " and " << kV;
  Mlp whole(0, 0), local(t, gather_axis);
  std::map<ir::ValueId, torch::Tensor> full, mine;
  tptest::mlpParameters(whole, me, t, full, mine); // the same weights and data on every rank
  for (auto &[p, w] : mine) w = w.detach().to(device).requires_grad_(true);
  const std::vector<torch::Tensor> xs{torch::randn({5, kD}), torch::randn({3, kD})};
  StageRunner ref = whole.runner(full);
  StageRunner run = local.runner(mine);
  run.setDevice(device);
  run.setTensorParallel(&group);
  for (int mb = 0; mb < 2; ++mb) {
    ref.forward(mb, {{whole.x, xs[size_t(mb)]}});
    run.forward(mb, {{local.x, xs[size_t(mb)].to(device)}});
    EXPECT_TRUE(torch::allclose(run.loss(mb).cpu(), ref.loss(mb), 1e-5, 1e-6))
        << "micro-batch " << mb << ": " << run.loss(mb).item<double>() << " vs " << ref.loss(mb).item<double>();
    ref.backward(mb, {}, 0.5);
    run.backward(mb, {}, 0.5);
  }
  for (ir::ValueId p : whole.g.parameters) {
    const int64_t axis = tptest::cutAxis(whole, p);
    torch::Tensor want = axis < 0 ? full[p].grad() : shardOf(full[p].grad(), axis, me, t);
    ASSERT_TRUE(run.parameter(p).grad().defined()) << whole.g.values[p].name;
    const torch::Tensor got = run.parameter(p).grad().cpu();
    EXPECT_TRUE(torch::allclose(got, want, 1e-5, 1e-6))
        << whole.g.values[p].name << " on rank " << me << ": max diff " << (got - want).abs().max().item<double>();
  }
}

TEST(TensorParallel, ColumnRowMlpMatchesTheUnshardedGraph) { checkAgainstUnsharded(1); }

TEST(TensorParallel, GatherAlongTheFirstAxis) { checkAgainstUnsharded(0); }

// On GPUs the group is a device communicator: NCCL where every rank has a
// GPU of its own, else staged through host memory (ranks sharing a GPU).
// Labelled `gpu` in ctest; skipped where no GPU is visible.
TEST(TensorParallelGpu, ColumnRowMlpOnTheGpu) {
  if (!comm::ncclCompiled()) GTEST_SKIP() << "built without the CUDA toolkit";
  const int gpus = comm::visibleCudaDevices();
  if (gpus == 0) GTEST_SKIP() << "no GPU visible";
  comm::Communicator &w = world();
  const int gpu = w.rank() % gpus;
  useGpu(gpu);
  auto group = comm::createDeviceCommunicator(w.split(0, w.rank()), gpu, currentGpuStream(gpu), gpus >= w.size());
  checkAgainstUnsharded(1, *group, torch::Device(torch::kCUDA, c10::DeviceIndex(gpu)));
}

/// Note [vocabulary parallelism]: TensorParallelEmbedding -> sum -> copy ->
/// MatMul (classes cut) -> TensorParallelCrossEntropy, against LibTorch's
/// embedding and cross_entropy on the whole tables, ignored targets included.
void checkVocabParallel(const std::string &reduction) {
  comm::Communicator &group = world();
  const int t = group.size(), me = group.rank();
  const int64_t V = 6, D = 4, N = 7;
  ASSERT_EQ(V % t, 0);
  ir::Graph g;
  g.opset = 17;
  auto value = [&](const std::string &name, ir::Shape shape, ir::ValueKind k, ir::DType dt = ir::DType::F32) {
    const ir::ValueId id = g.addValue({name, dt, std::move(shape), true, k});
    if (k == ir::ValueKind::Input) g.inputs.push_back(id);
    if (k == ir::ValueKind::Parameter) g.parameters.push_back(id);
    return id;
  };
  const ir::ValueId ids = value("ids", {Dim::batch()}, ir::ValueKind::Input, ir::DType::I64);
  const ir::ValueId target = value("target", {Dim::batch()}, ir::ValueKind::Input, ir::DType::I64);
  const ir::ValueId table = value("table", {Dim::fixed(V / t), Dim::fixed(D)}, ir::ValueKind::Parameter);
  const ir::ValueId w = value("w", {Dim::fixed(D), Dim::fixed(V / t)}, ir::ValueKind::Parameter);
  auto op = [&](const std::string &type, std::vector<ir::ValueId> in, const std::string &domain, ir::AttrMap attrs = {}) {
    const ir::ValueId out = value(type + "_out", {}, ir::ValueKind::Intermediate);
    g.addNode({type, type, domain, std::move(in), {out}, std::move(attrs)});
    return out;
  };
  const ir::ValueId e = op("TensorParallelSum", {op("TensorParallelEmbedding", {table, ids}, "rannc")}, "rannc");
  const ir::ValueId logits = op("MatMul", {op("TensorParallelCopy", {e}, "rannc"), w}, "");
  g.loss = op("TensorParallelCrossEntropy", {logits, target}, "rannc",
              {{"reduction", reduction}, {"ignore_index", int64_t{-1}}});
  torch::manual_seed(11);
  const torch::Tensor full_table = torch::randn({V, D}).requires_grad_(true);
  const torch::Tensor full_w = torch::randn({D, V}).requires_grad_(true);
  const torch::Tensor x = torch::tensor({0, 5, 3, -1, 2, 4, 1}, torch::kLong); // -1: the last row (ONNX Gather)
  const torch::Tensor y = torch::tensor({5, 0, -1, 2, 3, -1, 1}, torch::kLong); // -1 ignored
  ASSERT_EQ(x.size(0), N);
  const int64_t red = reduction == "none" ? 0 : reduction == "mean" ? 1 : 2;
  torch::Tensor want = torch::nn::functional::cross_entropy(
      torch::embedding(full_table, x.remainder(V)).matmul(full_w), y,
      torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-1).reduction(
          red == 0 ? torch::nn::functional::CrossEntropyFuncOptions::reduction_t(torch::kNone)
                   : red == 1 ? torch::nn::functional::CrossEntropyFuncOptions::reduction_t(torch::kMean)
                              : torch::nn::functional::CrossEntropyFuncOptions::reduction_t(torch::kSum)));
  (red == 0 ? want.sum() : want).backward();
  std::map<ir::ValueId, torch::Tensor> mine{{table, shardOf(full_table.detach(), 0, me, t).requires_grad_(true)},
                                            {w, shardOf(full_w.detach(), 1, me, t).requires_grad_(true)}};
  StageRunner run(g, schedule::buildStageProgram(g, {{0, int(g.nodes.size())}}, 0), mine, {});
  run.setTensorParallel(&group);
  run.forward(0, {{ids, x}, {target, y}});
  const torch::Tensor got = run.loss(0);
  EXPECT_TRUE(torch::allclose(got, want.detach(), 1e-5, 1e-6)) << got << " vs " << want;
  if (red != 0) {
    run.backward(0, {}, 1.0);
    const torch::Tensor gt = run.parameter(table).grad(), gw = run.parameter(w).grad();
    ASSERT_TRUE(gt.defined() && gw.defined());
    EXPECT_TRUE(torch::allclose(gt, shardOf(full_table.grad(), 0, me, t), 1e-5, 1e-6)) << gt;
    EXPECT_TRUE(torch::allclose(gw, shardOf(full_w.grad(), 1, me, t), 1e-5, 1e-6)) << gw;
  }
}

TEST(TensorParallel, VocabParallelLookupAndLossMeanMatchLibTorch) { checkVocabParallel("mean"); }
TEST(TensorParallel, VocabParallelLookupAndLossSumMatchLibTorch) { checkVocabParallel("sum"); }
TEST(TensorParallel, VocabParallelLossNoneMatchesLibTorch) { checkVocabParallel("none"); }

TEST(TensorParallel, CollectivesOfTheGroup) {
  comm::Communicator &group = world();
  const int t = group.size(), me = group.rank();
  torch::Tensor mine = torch::full({2, 3}, double(me + 1));
  EXPECT_TRUE(torch::equal(allReduceSum(group, mine), torch::full({2, 3}, t * (t + 1) / 2.0)));
  torch::Tensor joined = allGather(group, mine, 1);
  ASSERT_EQ(joined.sizes(), (std::vector<int64_t>{2, 3 * t}));
  for (int r = 0; r < t; ++r) EXPECT_EQ(joined[1][3 * r + 2].item<float>(), float(r + 1));
  EXPECT_TRUE(torch::equal(shardOf(joined, 1, me, t), mine));
  // A double keeps its dtype through the float32 collective.
  EXPECT_EQ(allReduceSum(group, mine.to(torch::kDouble)).scalar_type(), torch::kDouble);
}

TEST(TensorParallel, ACollectiveOutsideAGroupIsAnError) {
  Mlp local(2, 1);
  std::map<ir::ValueId, torch::Tensor> params;
  for (ir::ValueId p : local.g.parameters) {
    std::vector<int64_t> dims;
    for (const Dim &d : local.g.values[p].shape) dims.push_back(d.offset);
    params[p] = torch::zeros(dims).set_requires_grad(true);
  }
  StageRunner run = local.runner(params);
  try {
    run.forward(0, {{local.x, torch::zeros({2, kD})}});
    FAIL() << "ran a collective without a group";
  } catch (const std::exception &e) {
    EXPECT_NE(std::string(e.what()).find("outside a tensor-parallel stage"), std::string::npos) << e.what();
  }
}

} // namespace
} // namespace rannc::runtime
