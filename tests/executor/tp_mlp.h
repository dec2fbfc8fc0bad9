// The MPI job and a hand-built tensor-parallel local graph for the tests of the runtime's
// collectives and the trainer's tensor-parallel parts: a column- then
// row-parallel MLP followed by a vocabulary-parallel output layer, as
// sharding::localGraph writes one, beside its unsharded graph.
#pragma once

#include <torch/torch.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "executor/comm/comm.h"
#include "executor/runtime/collectives.h"
#include "executor/runtime/stage.h"
#include "executor/schedule/schedule.h"
#include "planner/ir/ir.h"

namespace rannc::tptest {

using ir::Dim;
using ir::DType;
using ir::ValueKind;

/// The MPI job the test runs in (one rank without mpirun), initialized once
/// per process and finalized at exit: one tensor-parallel group.
inline comm::Communicator &world() {
  static std::unique_ptr<comm::Communicator> c = [] {
    int argc = 0;
    char **argv = nullptr;
    return comm::createMpiCommunicator(&argc, &argv);
  }();
  return *c;
}

inline constexpr int64_t kD = 8, kH = 12, kV = 6;

/// x [B,D] -> copy -> MatMul W1 [D,H/t] -> Add b1 -> Tanh -> MatMul W2 [H/t,D]
/// -> sum -> Add b2 -> copy -> MatMul W3 [D,V/t] -> gather(axis) -> mean(z*z).
/// With t = 0 the unsharded graph, without collectives.
struct Mlp {
  ir::Graph g;
  ir::ValueId x, w1, b1, w2, b2, w3;

  Mlp(int t, int64_t gather_axis) {
    const int64_t cut = t == 0 ? 1 : t;
    g.opset = 17;
    auto value = [&](const std::string &name, ir::Shape s, ValueKind k) {
      ir::ValueId id = g.addValue({name, DType::F32, std::move(s), true, k});
      if (k == ValueKind::Input) g.inputs.push_back(id);
      if (k == ValueKind::Parameter) g.parameters.push_back(id);
      return id;
    };
    auto tmp = [&](const std::string &name) { return value(name, {}, ValueKind::Intermediate); };
    auto op = [&](const std::string &type, std::vector<ir::ValueId> in, const std::string &out,
                  const std::string &domain = "") {
      ir::ValueId o = tmp(out);
      g.addNode({out, type, domain, std::move(in), {o}, {}});
      return o;
    };
    // A collective, or (unsharded) the value itself.
    auto collective = [&](const std::string &type, ir::ValueId in, const std::string &out) {
      return t == 0 ? in : op(type, {in}, out, "rannc");
    };
    x = value("x", {Dim::batch(), Dim::fixed(kD)}, ValueKind::Input);
    w1 = value("w1", {Dim::fixed(kD), Dim::fixed(kH / cut)}, ValueKind::Parameter);
    b1 = value("b1", {Dim::fixed(kH / cut)}, ValueKind::Parameter);
    w2 = value("w2", {Dim::fixed(kH / cut), Dim::fixed(kD)}, ValueKind::Parameter);
    b2 = value("b2", {Dim::fixed(kD)}, ValueKind::Parameter);
    w3 = value("w3", {Dim::fixed(kD), Dim::fixed(kV / cut)}, ValueKind::Parameter);
    ir::ValueId h = op("MatMul", {collective("TensorParallelCopy", x, "x_copy"), w1}, "h");
    ir::ValueId a = op("Tanh", {op("Add", {h, b1}, "h_bias")}, "a");
    ir::ValueId y = op("Add", {collective("TensorParallelSum", op("MatMul", {a, w2}, "o"), "o_sum"), b2}, "y");
    ir::ValueId z = op("MatMul", {collective("TensorParallelCopy", y, "y_copy"), w3}, "z");
    if (t != 0) {
      ir::ValueId zt = gather_axis == 0 ? op("Transpose", {z}, "z_t") : z;
      z = tmp("z_whole");
      ir::Node gather{"z_whole", "TensorParallelGather", "rannc", {zt}, {z}, {}};
      gather.attrs["axis"] = gather_axis;
      g.addNode(gather);
      if (gather_axis == 0) z = op("Transpose", {z}, "z_back");
    }
    g.loss = tmp("loss");
    ir::Node mean{"loss", "ReduceMean", "", {op("Mul", {z, z}, "sq")}, {g.loss}, {}};
    mean.attrs["keepdims"] = int64_t(0);
    g.addNode(mean);
  }

  runtime::StageRunner runner(std::map<ir::ValueId, torch::Tensor> params) const {
    return runtime::StageRunner(g, schedule::buildStageProgram(g, {{0, int(g.nodes.size())}}, 0), std::move(params),
                                {});
  }
};

/// The axis each parameter of Mlp is cut along (-1: replicated).
inline int64_t cutAxis(const Mlp &m, ir::ValueId p) {
  if (p == m.w1 || p == m.w3) return 1; // column-parallel
  if (p == m.b1 || p == m.w2) return 0; // the column cut's bias; row-parallel
  return -1;
}

/// Random whole parameters of `m` (seeded: the same on every rank) and this
/// rank's slices of them (slice `position` of `degree`).
inline void mlpParameters(const Mlp &m, int position, int degree, std::map<ir::ValueId, torch::Tensor> &full,
                          std::map<ir::ValueId, torch::Tensor> &mine) {
  torch::manual_seed(7);
  for (ir::ValueId p : m.g.parameters) {
    std::vector<int64_t> dims;
    for (const Dim &d : m.g.values[p].shape) dims.push_back(d.offset);
    full[p] = torch::randn(dims).set_requires_grad(true);
    const int64_t axis = cutAxis(m, p);
    mine[p] = (axis < 0 ? full[p].detach().clone() : runtime::shardOf(full[p].detach(), axis, position, degree))
                  .set_requires_grad(true);
  }
}

} // namespace rannc::tptest
