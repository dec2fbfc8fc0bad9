#include "executor/train/shared_parameters.h"

#include <algorithm>
#include <map>
#include <stdexcept>

#include "executor/schedule/schedule.h"
#include "executor/train/transport.h"

namespace rannc::train {
namespace {

/// Sums the gradients of `params` over `group` (one flat buffer); a rank
/// that does not `contribute` adds zeros and still receives the sum.
void allReduceGradients(comm::Communicator &group, const std::vector<torch::Tensor> &params, bool contribute) {
  std::vector<torch::Tensor> flat;
  for (const auto &p : params) {
    if (p.scalar_type() != params.front().scalar_type() ||
        (p.scalar_type() != torch::kFloat && p.scalar_type() != torch::kDouble)) // Note [float64 collectives]
      throw std::runtime_error("gradient all-reduce supports float32 and float64 parameters only, not " +
                               std::string(c10::toString(p.scalar_type())) + " beside " +
                               std::string(c10::toString(params.front().scalar_type())));
    flat.push_back(contribute && p.grad().defined() ? p.grad().reshape({-1}) : torch::zeros({p.numel()}, p.options()));
  }
  if (flat.empty()) return;
  torch::Tensor buffer = torch::cat(flat);
  group.allReduce(floatBuffer(group, buffer), comm::ReduceOp::Sum);
  int64_t offset = 0;
  for (const auto &p : params) {
    torch::Tensor g = buffer.narrow(0, offset, p.numel()).view(p.sizes());
    if (p.grad().defined()) p.mutable_grad().copy_(g);
    else p.mutable_grad() = g.clone();
    offset += p.numel();
  }
}

} // namespace

SharedParameters::SharedParameters(const ir::Graph &g, const std::vector<std::pair<int, int>> &ranges, int stage,
                                   int position, const runtime::StageRunner &runner, comm::Communicator &comm,
                                   const GroupMaker &on_device) {
  std::map<std::vector<int>, std::vector<ir::ValueId>> by_stages; // ordered: the same on every rank
  for (int t = 0; t < int(ranges.size()); ++t)
    for (const auto &[v, stages] : schedule::buildStageProgram(g, ranges, t).shared_parameters)
      if (stages.front() == t) by_stages[stages].push_back(v); // listed once, by its first reader
  for (const auto &[stages, values] : by_stages) {
    const bool mine = std::binary_search(stages.begin(), stages.end(), stage);
    auto c = comm.split(mine ? 1 + position : 0, comm.rank());
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

void SharedParameters::allReduce(int replica) {
  for (auto &grp : groups) allReduceGradients(*grp.comm, grp.params, replica == 0);
}

} // namespace rannc::train
