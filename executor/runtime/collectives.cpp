#include "executor/runtime/collectives.h"

#include <stdexcept>
#include <string>

namespace rannc::runtime {

comm::Buffer floatBuffer(const comm::Communicator &group, const torch::Tensor &t) {
  const comm::Memory memory = comm::tensorMemory(group, t.is_cuda());
  if (t.scalar_type() == torch::kDouble) // Note [float64 collectives]
    return comm::Buffer{t.data_ptr<double>(), t.numel(), comm::DType::Float64, memory};
  return comm::Buffer{t.data_ptr<float>(), t.numel(), comm::DType::Float32, memory};
}

torch::ScalarType collectiveType(torch::ScalarType t) { return t == torch::kDouble ? t : torch::kFloat; }

namespace {
torch::Tensor allReduce(comm::Communicator &group, const torch::Tensor &t, comm::ReduceOp op) {
  torch::NoGradGuard no_grad;
  // A fresh buffer: the collective overwrites it in place.
  torch::Tensor res = t.to(collectiveType(t.scalar_type())).contiguous().clone();
  group.allReduce(floatBuffer(group, res), op);
  return res.to(t.scalar_type());
}
} // namespace

torch::Tensor allReduceSum(comm::Communicator &group, const torch::Tensor &t) {
  return allReduce(group, t, comm::ReduceOp::Sum);
}

torch::Tensor allReduceMax(comm::Communicator &group, const torch::Tensor &t) {
  return allReduce(group, t, comm::ReduceOp::Max);
}

torch::Tensor allGather(comm::Communicator &group, const torch::Tensor &t, int64_t axis) {
  torch::NoGradGuard no_grad;
  const int n = group.size();
  torch::Tensor blocks = torch::empty({n, t.numel()}, t.options().dtype(collectiveType(t.scalar_type())));
  blocks[group.rank()].copy_(t.reshape({-1}));
  group.startAllGather(floatBuffer(group, blocks))->wait();
  std::vector<int64_t> shape{n};
  shape.insert(shape.end(), t.sizes().begin(), t.sizes().end());
  return torch::cat(blocks.view(shape).unbind(0), axis).to(t.scalar_type());
}

torch::Tensor shardOf(const torch::Tensor &t, int64_t axis, int64_t index, int64_t count) {
  if (axis < 0) axis += t.dim();
  if (axis < 0 || axis >= t.dim() || t.size(axis) % count != 0)
    throw std::runtime_error("cannot cut a tensor of shape " + std::string(c10::str(t.sizes())) + " into " +
                             std::to_string(count) + " slices along axis " + std::to_string(axis));
  const int64_t size = t.size(axis) / count;
  return t.narrow(axis, index * size, size).contiguous().clone();
}

} // namespace rannc::runtime
